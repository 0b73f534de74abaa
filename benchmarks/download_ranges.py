"""How close the level-0 downloads come to their ceiling on real text:
``python -m veil.benchmarks.download_ranges [--model M] [--k 2] [--tokens 4096] [--chunk 512]``.

The scores and MLP downloads leave at level 0 of ``ckks-n16384-l7-v2``: q0 has 57 bits and the
scale is 2^36, so a slot decrypts correctly only while |value| < 2^20; past it the value wraps
and the client reads garbage without any sign of it. The server never sees the values, so the
bound is a property of the model, measured here in plaintext with ``transformers`` on the same
computation the protected layers ``[k, L)`` run (docs/PROTOCOL.md, notation): the unnormalized
scores ŝ/sqrt(hd) (after RoPE, causal pairs only), σ/d, the SwiGLU inputs û_g, û_u and σ'/d.
Each is divided as its download divides it (``layouts.SCORES_DIV``, ``SIGMA_DIV``), and
``scores_slots`` / ``mlp_slots`` are what the downloads' slots hold (the scores, or û, on top of
the norm statistic both carry in every slot). The report gives the largest magnitude per
quantity and layer and the headroom ``20 - log2(max)`` in bits, plus the smallest σ/d (the
client divides the scores' absolute error by r_t·r_j, so the smallest norms are where that
error weighs most). Text: this repository's
sources and README (``extraction_attack.text_chunks``), in sessions of ``--chunk`` tokens, and
three chat prompts. Prints ``figure download_ranges.<metric>`` lines; ``--out`` writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from veil.benchmarks.extraction_attack import text_chunks
from veil.engine.loader import load_checkpoint
from veil.engine.reference import build_reference
from veil.protected.layouts import SCORES_DIV, SIGMA_DIV

LEVEL0_LOG2 = 20.0  # |value| < 2^(57 - 36 - 1)
CHATS = ("Write a poem about the sea.", "What is 2+2?", "Explain quantum computing in one paragraph.")


def layer_maxima(model, ids: list[int], k: int) -> dict[str, dict[int, float]]:
    """Per protected layer: the largest download values of one session and its smallest σ/d."""
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = cfg.hidden_size // heads
    x = torch.tensor([ids])
    h_prime: dict[int, torch.Tensor] = {}  # each layer's h' = h + attention output, as the model computes it
    hooks = [model.model.layers[i].post_attention_layernorm.register_forward_pre_hook(
        lambda _m, args, i=i: h_prime.__setitem__(i, args[0][0])) for i in range(k, cfg.num_hidden_layers)]
    try:
        out = model(x, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    t = x.shape[1]
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    res: dict[str, dict[int, float]] = {k_: {} for k_ in ("scores_slots", "mlp_slots", "scores", "sigma", "u",
                                                           "sigma2", "min_sigma")}
    for layer in range(k, cfg.num_hidden_layers):
        blk = model.model.layers[layer]
        h = out.hidden_states[layer][0]
        sigma = (h * h).mean(-1)
        xn = blk.input_layernorm.weight * h  # γ1 h: the server leaves 1/rms to the client
        q = blk.self_attn.q_proj(xn).view(1, t, heads, hd).transpose(1, 2)
        kk = blk.self_attn.k_proj(xn).view(1, t, kv_heads, hd).transpose(1, 2)
        q, kk = apply_rotary_pos_emb(q, kk, *model.model.rotary_emb(xn[None], torch.arange(t)[None]))
        kk = kk.repeat_interleave(heads // kv_heads, 1)  # query head h reads KV head h // group
        scores = (q @ kk.transpose(-1, -2))[0][:, causal] / (math.sqrt(hd) * SCORES_DIV)  # [heads, pairs]
        hp = h_prime[layer]
        sigma2 = (hp * hp).mean(-1)
        xn2 = blk.post_attention_layernorm.weight * hp
        u = torch.cat((blk.mlp.gate_proj(xn2), blk.mlp.up_proj(xn2)), -1)
        # what the slots hold: each query position's scores on top of its σ/(8d), û on σ'/(8d)
        row = torch.nonzero(causal)[:, 0]
        res["scores_slots"][layer] = float((scores + sigma[row] / SIGMA_DIV).abs().max())
        res["mlp_slots"][layer] = float((u + (sigma2 / SIGMA_DIV)[:, None]).abs().max())
        res["scores"][layer] = float(scores.abs().max())
        res["sigma"][layer] = float(sigma.max()) / SIGMA_DIV
        res["u"][layer] = float(u.abs().max())
        res["sigma2"][layer] = float(sigma2.max()) / SIGMA_DIV
        res["min_sigma"][layer] = float(sigma.min())
    return res


def run(model_path: str | None, k: int, tokens: int, chunk: int) -> dict:
    ckpt = load_checkpoint(model_path)
    model = build_reference(ckpt)
    sessions = text_chunks(ckpt.tokenizer, tokens, chunk)
    for msg in CHATS:
        text = ckpt.tokenizer.apply_chat_template([{"role": "user", "content": msg}], add_generation_prompt=True,
                                                  tokenize=False)
        sessions.append(ckpt.tokenizer(text)["input_ids"])
    acc: dict[str, dict[int, float]] = {}
    with torch.no_grad():
        for ids in sessions:
            for name, per_layer in layer_maxima(model, ids, k).items():
                pick = min if name == "min_sigma" else max
                slot = acc.setdefault(name, {})
                for layer, v in per_layer.items():
                    slot[layer] = pick(slot.get(layer, v), v)
    worst = {name: max(v.values()) for name, v in acc.items() if name != "min_sigma"}
    return {
        "model": ckpt.source, "k": k, "tokens": sum(len(s) for s in sessions), "sessions": len(sessions),
        "scores_div": SCORES_DIV, "sigma_div": SIGMA_DIV, "level0_log2": LEVEL0_LOG2,
        "per_layer": {name: {str(layer): v for layer, v in sorted(per.items())} for name, per in acc.items()},
        "max": worst,
        "headroom_bits": {name: LEVEL0_LOG2 - math.log2(v) for name, v in worst.items()},
        "min_sigma_over_d": min(acc["min_sigma"].values()),
    }


def figure_lines(res: dict) -> list[str]:
    lines = [f"figure download_ranges.{name}.max_log2 {math.log2(v):.2f}" for name, v in res["max"].items()]
    lines += [f"figure download_ranges.{name}.headroom_bits {v:.2f}" for name, v in res["headroom_bits"].items()]
    lines.append(f"figure download_ranges.min_sigma_over_d {res['min_sigma_over_d']:.3g}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a .gguf file or HF directory (default: the shipped SmolLM2)")
    ap.add_argument("--k", type=int, default=2, help="the first protected layer")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=512, help="tokens per session")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    res = run(args.model, args.k, args.tokens, args.chunk)
    for line in figure_lines(res):
        print(line)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps({"max": res["max"], "headroom_bits": res["headroom_bits"]}))
    return 0 if min(res["headroom_bits"].values()) > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

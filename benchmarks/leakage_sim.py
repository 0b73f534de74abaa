"""How the first protected layer's W_gate leak depends on the split point, on a PLAINTEXT
SIMULATION of the client's transcript (seconds per split; `extraction_attack.py` is the real
HE run, about an hour per split):

    python -m veil.benchmarks.leakage_sim [--k 2,15,29]

The first protected layer ``k`` takes ``h_k``, which the client computed itself. The client
decrypts ``û_g = W_gate γ2 h'_k``, where ``h'_k = h_k + o_k`` and ``o_k`` is the attention output
it never sees. This script computes exactly those values with the plaintext model over ``2d``
tokens of real text, adds Gaussian noise of the flooding size (2^-11.5 per slot), and fits
``W_gate γ2`` by least squares and by oracle-tuned ridge regression of ``û_g`` on ``h_k``
(``extraction_attack``'s fits), next to the linear-only attack (regress ``û_g`` on ``h'_k``).
The smaller ``|o_k|/|h_k|``, the better the fit: the leak grows with depth.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from veil.benchmarks.extraction_attack import best_ridge, errors, lstsq, text_chunks


def simulate(model, ckpt, k: int, n: int) -> dict[str, float]:
    layer = model.layers[str(k)]
    w = (layer.mlp.gate_proj.weight * layer.post_attention_layernorm.weight[None, :]).double().numpy()
    xs, xps = [], []
    with torch.no_grad():
        for ids in text_chunks(ckpt.tokenizer, n, 256):
            h = model.run_layers(model.embed(torch.tensor(ids)), 0, k)
            pos = torch.arange(len(ids))
            cos, sin = model.rotary.cos_sin(pos, h.dtype)
            a, _ = layer.self_attn(layer.input_layernorm(h), cos, sin, pos, None)
            xs.append(h.double().numpy())
            xps.append((h + a).double().numpy())
    x, xp = np.concatenate(xs), np.concatenate(xps)
    u = xp @ w.T
    u_seen = u + np.random.default_rng(0).normal(scale=2**-11.5, size=u.shape)
    return {"o_over_h": float(np.linalg.norm(xp - x) / np.linalg.norm(x)),
            "linear_only": errors(lstsq(xp, u), w, xp)["rel_err"],
            "veil_lstsq": errors(lstsq(x, u_seen), w, x)["rel_err"],
            "veil_ridge": best_ridge(x, u_seen, w)[0]["rel_err"]}


def main(argv: list[str] | None = None) -> int:
    from veil.engine.loader import build_model, load_checkpoint

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", default="2,15,29", help="first protected layers to simulate")
    args = p.parse_args(argv)
    ckpt = load_checkpoint()
    model = build_model(ckpt)
    n = 2 * ckpt.config.hidden_size
    for k in (int(x) for x in args.k.split(",")):
        r = simulate(model, ckpt, k, n)
        print(f"# layer {k}, {n} tokens, |o|/|h| = {r.pop('o_over_h'):.3f}", file=sys.stderr)
        for name, v in r.items():
            print(f"figure leakage_sim.k{k}.{name}.rel_err {v:.6g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

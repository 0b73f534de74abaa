"""Accuracy of Veil's model against `transformers`' reference on the shipped weights.

    python -m veil.benchmarks.accuracy [--tokens 32]

For each prompt: mean KL(reference ‖ veil) of the next-token distributions over every prompt
position and over a greedy continuation, and the agreement of the two greedy continuations.
Prints `figure accuracy.kl_mean …` and `figure accuracy.greedy_agreement …`, then JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "Explain in one sentence what a transformer model is."]


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    lp, lq = torch.log_softmax(p_logits.double(), -1), torch.log_softmax(q_logits.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


@torch.inference_mode()
def main(argv: list[str] | None = None) -> int:
    from veil.engine.generate import generate_local
    from veil.engine.loader import build_model, load_checkpoint
    from veil.engine.reference import build_reference, reference_greedy

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    ckpt = load_checkpoint()
    load_s = time.perf_counter() - t0
    ours, ref = build_model(ckpt), build_reference(ckpt)
    kls, agree, total = [], 0, 0
    for text in PROMPTS:
        ids = list(ckpt.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                      tokenize=True, return_dict=True)["input_ids"])
        cont = reference_greedy(ref, ids, args.tokens)
        mine = generate_local(ours, ids, args.tokens)
        agree += sum(a == b for a, b in zip(cont, mine, strict=True))
        total += args.tokens
        full = torch.tensor(ids + cont)
        h, _ = ours.forward_layers(ours.embed(full), torch.arange(len(full)), [None] * ckpt.config.num_layers)
        kls.append(kl(ref(input_ids=full[None]).logits[0], ours.logits(h)))
    res = {"model": ckpt.config.name, "dtype": "float32", "prompts": len(PROMPTS), "tokens": args.tokens,
           "positions": int(sum(len(k) for k in kls)), "kl_mean": torch.cat(kls).mean().item(),
           "kl_max": torch.cat(kls).max().item(), "greedy_agreement": agree / total, "model_load_s": load_s}
    for key in ("kl_mean", "kl_max", "greedy_agreement", "model_load_s"):
        print(f"figure accuracy.{key} {res[key]:.6g}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

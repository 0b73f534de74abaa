"""Accuracy of Veil's model against `transformers`' reference on the shipped weights.

    python -m veil.benchmarks.accuracy [--tokens 32] [--engine-dtypes float32,bfloat16]

For each prompt: mean KL(reference ‖ veil) of the next-token distributions over every prompt
position and over a greedy continuation, and the agreement of the two greedy continuations.
Prints `figure accuracy.kl_mean …` and `figure accuracy.greedy_agreement …`, then JSON.

`--engine-dtypes` also runs the serving engine (paged cache, batched steps, the kernels `ops`
picks for the device: the C kernels on a CPU where they are built, the twins with
`VEIL_CPU_KERNELS=0`) on the same prompts, all at once, in each dtype, and prints the agreement
of its greedy continuations with `transformers`' in that dtype:
`figure accuracy.engine_<dtype>.greedy_agreement`.
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
    p.add_argument("--engine-dtypes", default="", help="comma-separated, e.g. float32,bfloat16")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    ckpt = load_checkpoint()
    load_s = time.perf_counter() - t0
    ours, ref = build_model(ckpt), build_reference(ckpt)
    prompts = [list(ckpt.tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                       tokenize=True, return_dict=True)["input_ids"]) for t in PROMPTS]
    kls, agree, total, conts = [], 0, 0, []
    for ids in prompts:
        cont = reference_greedy(ref, ids, args.tokens)
        conts.append(cont)
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
    for name in filter(None, args.engine_dtypes.split(",")):
        dtype = getattr(torch, name)
        res[f"engine_{name}"] = engine_agreement(ckpt, prompts, args.tokens, dtype,
                                                 conts if dtype == torch.float32 else None)
        print(f"figure accuracy.engine_{name}.greedy_agreement {res[f'engine_{name}']['greedy_agreement']:.6g}")
    print(json.dumps(res))
    return 0


def engine_agreement(ckpt, prompts: list[list[int]], tokens: int, dtype: torch.dtype,
                     conts: list[list[int]] | None = None) -> dict:
    """The engine's greedy continuations (all prompts in one batch) against transformers' in
    `dtype` (`conts`, when the caller has them already): the share of positions where they
    agree, and the first position where each differs."""
    import threading

    from veil.engine.api import EngineConfig
    from veil.engine.engine import Engine
    from veil.engine.loader import build_model
    from veil.engine.reference import build_reference, reference_greedy
    from veil.engine.sampling import SamplingParams

    if conts is None:
        ref = build_reference(ckpt, dtype)
        conts = [reference_greedy(ref, ids, tokens) for ids in prompts]
    with torch.inference_mode(False):  # the engine's loop thread updates its tensors outside inference mode
        engine = Engine(build_model(ckpt, dtype=dtype), 0, EngineConfig(kv_cache_bytes=256 << 20)).start()
    outs, done = [[] for _ in prompts], threading.Semaphore(0)
    try:
        for out, ids in zip(outs, prompts, strict=True):
            engine.add_request("t", ids, tokens, SamplingParams(), on_token=out.append,
                               on_finish=lambda r: done.release())
        for _ in prompts:
            if not done.acquire(timeout=600):
                raise TimeoutError("the engine did not finish")
    finally:
        engine.stop()
    agree = sum(a == b for out, cont in zip(outs, conts, strict=True) for a, b in zip(out, cont, strict=True))
    first = [next((i for i, (a, b) in enumerate(zip(out, cont, strict=True)) if a != b), None)
             for out, cont in zip(outs, conts, strict=True)]
    return {"dtype": str(dtype).removeprefix("torch."), "greedy_agreement": agree / (tokens * len(prompts)),
            "first_difference": first}


if __name__ == "__main__":
    sys.exit(main())

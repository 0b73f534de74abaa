"""The `transformers` baseline: what a user without a server gets from `model.generate`.

The workload's requests are run in static batches of `batch_size`, in request order. Each batch
is left-padded (with an attention mask), decoded greedily for max(max_new_tokens of the batch)
steps with EOS disabled, so every sequence runs to the end; only each request's own
max_new_tokens count as useful output (the rest of a short request's row is wasted work, as it
would be for such a user).

Timing. All requests arrive at t=0 (offline run), so every time below is from the run start:
* e2el of a request   = end of its batch's `generate` call (a static batch returns as one);
* ttft of a request   = when its batch produced its first token. It is measured inside the same
  `generate` call with a streamer: `generate` hands the prompt to `streamer.put` first, then each
  step's new tokens right after they are picked (on CPU the stop check is not deferred, see
  `transformers.generation.utils.StopCheck`), so the time of the second `put` is the end of the
  prefill plus the first argmax — no extra forward pass, nothing approximated;
* tpot of a request   = (e2el - ttft) / (max_new_tokens - 1), as in vLLM's benchmark (a static
  batch delivers a request's tokens at the end of the batch; this is the user-visible figure);
* itl                 = the gaps between the batch's decode steps (streamer timestamps);
* output_tok_s        = useful output tokens / total wall time (sum of the batches' times).
A small untimed warm-up `generate` runs first (one-time allocation and kernel selection), as
vLLM's start-up does its own profiling run outside its measured time.

Run: `.venv/bin/python -m veil.benchmarks.reference_hf [--dtype bfloat16] [--batch-size 16]
[--workload W.json] [--json-out R.json]` (or `.venv/bin/python benchmarks/reference_hf.py ...`). Prints `figure reference.<metric>... <v>`
lines, then one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
import time
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


class _StepClock:
    """A `generate` streamer that only records when each `put` happens."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class _NoEos:
    """Clears EOS from the model's own generation config for the duration of the run.

    Passing `eos_token_id=None` to `generate` (as a kwarg or in a GenerationConfig) is not enough
    in transformers 5.x: `None` fields are read as "unset" and refilled from
    `model.generation_config`, so generation would still stop at EOS. Clearing the model's
    default as well makes the `None` stick (checked: every batch's length is verified below)."""

    def __init__(self, model) -> None:
        self.model = model

    def __enter__(self):
        self.saved = self.model.generation_config
        cfg = copy.deepcopy(self.saved)
        cfg.eos_token_id = None
        self.model.generation_config = cfg
        return self

    def __exit__(self, *exc) -> None:
        self.model.generation_config = self.saved


def _generation_config(model, max_new_tokens: int, pad_id: int):
    """Greedy, exactly max_new_tokens, no EOS anywhere (so no stopping and no EOS padding)."""
    cfg = copy.deepcopy(model.generation_config)
    cfg.eos_token_id = None
    cfg.do_sample = False
    cfg.num_beams = 1
    cfg.temperature = None
    cfg.top_p = None
    cfg.top_k = None
    cfg.max_length = None
    cfg.max_new_tokens = max_new_tokens
    cfg.min_new_tokens = None
    cfg.pad_token_id = pad_id
    cfg.use_cache = True
    return cfg


def _left_pad(prompts: list[list[int]], pad_id: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def _stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    s = sorted(xs)

    def pct(q: float) -> float:  # linear interpolation, as numpy.percentile's default
        k = (len(s) - 1) * q
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"mean": statistics.fmean(s), "p50": pct(0.50), "p95": pct(0.95), "p99": pct(0.99)}


def run_reference(workload, batch_size: int = 16, dtype: torch.dtype = torch.float32, model=None,
                  ckpt=None, pad_id: int | None = None, warmup: bool = True, check_lengths: bool = True,
                  device: str = "cpu") -> dict:
    """Run `workload` through transformers `generate` in static batches; see the module doc.

    Loads the default checkpoint unless `model` (a transformers causal LM) or `ckpt` is given.
    Raises RuntimeError if any batch does not generate exactly max(max_new_tokens) tokens."""
    if model is None:
        from veil.engine.loader import load_checkpoint
        from veil.engine.reference import build_reference

        ckpt = ckpt or load_checkpoint()
        model = build_reference(ckpt, dtype=dtype)
    model = model.to(device=device, dtype=dtype)
    if pad_id is None:
        tok = getattr(ckpt, "tokenizer", None)
        pad_id = getattr(tok, "pad_token_id", None)
        if pad_id is None:
            pad_id = getattr(tok, "eos_token_id", None)
        if pad_id is None:
            pad_id = 0
    with _NoEos(model), torch.inference_mode():
        return _run(model, workload, batch_size, dtype, pad_id, warmup, check_lengths)


def _run(model, workload, batch_size, dtype, pad_id, warmup, check_lengths) -> dict:
    reqs = workload.requests

    if warmup:
        ids, mask = _left_pad([reqs[0].prompt_ids[:16]] * 2, pad_id, model.device)
        model.generate(input_ids=ids, attention_mask=mask, generation_config=_generation_config(model, 4, pad_id))

    ttft, e2el, tpot, itl, batches = [], [], [], [], []
    useful = generated = 0
    t_run = time.perf_counter()
    for b in range(0, len(reqs), batch_size):
        batch = reqs[b:b + batch_size]
        steps = max(r.max_new_tokens for r in batch)
        ids, mask = _left_pad([r.prompt_ids for r in batch], pad_id, model.device)
        clock = _StepClock()
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, streamer=clock,
                             generation_config=_generation_config(model, steps, pad_id))
        t1 = time.perf_counter()
        new = out.shape[1] - ids.shape[1]
        if check_lengths and (new != steps or len(clock.times) != steps + 1):
            raise RuntimeError(f"batch {b // batch_size}: generated {new} tokens ({len(clock.times) - 1} steps), "
                               f"expected {steps}: EOS stopping is not disabled")
        first = clock.times[1]  # times[0] is the prompt's put
        itl.extend(y - x for x, y in itertools.pairwise(clock.times[1:]))
        for r in batch:
            ttft.append(first - t_run)
            e2el.append(t1 - t_run)
            if r.max_new_tokens > 1:
                tpot.append((t1 - first) / (r.max_new_tokens - 1))
        useful += sum(r.max_new_tokens for r in batch)
        generated += steps * len(batch)
        batches.append({"size": len(batch), "prompt_width": int(ids.shape[1]), "steps": steps,
                        "wall_s": t1 - t0, "prefill_s": first - t0})
    wall = time.perf_counter() - t_run

    return {
        "path": "reference", "engine": "transformers generate (static batches)",
        "dtype": str(dtype).removeprefix("torch."), "batch_size": batch_size,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "threads": torch.get_num_threads(), "device": str(model.device), "requests": len(reqs),
        "description": getattr(workload, "description", ""),
        "output_tokens": useful, "generated_tokens": generated, "wall_s": wall, "duration_s": wall,
        "output_tok_s": useful / wall, "requests_s": len(reqs) / wall,
        "ttft_s": _stats(ttft), "tpot_s": _stats(tpot), "itl_s": _stats(itl), "e2el_s": _stats(e2el),
        "per_request": {"ttft_s": ttft, "e2el_s": e2el}, "batches": batches,
    }


def figure_lines(res: dict, path: str = "reference") -> list[str]:
    c = f".c{res['batch_size']}"
    lines = [f"figure {path}.output_tok_s{c} {res['output_tok_s']:.2f}",
             f"figure {path}.requests_s{c} {res['requests_s']:.4f}"]
    for metric in ("ttft_s", "tpot_s", "itl_s", "e2el_s"):
        for stat, v in res[metric].items():
            lines.append(f"figure {path}.{metric}.{stat}{c} {v:.4f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    from veil.benchmarks.workload import Workload, random_workload
    from veil.engine.loader import load_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, help="workload JSON (default: random_workload())")
    ap.add_argument("--model", help="checkpoint (default: the shipped SmolLM2-135M-Instruct)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--n", type=int, default=64, help="requests in the default workload")
    ap.add_argument("--json-out", type=Path, help="also write the JSON result here")
    ap.add_argument("--per-request", action="store_true", help="keep per-request lists in the JSON line")
    args = ap.parse_args(argv)

    wl = Workload.from_json(args.workload) if args.workload else random_workload(n=args.n)
    ckpt = load_checkpoint(args.model)
    res = run_reference(wl, batch_size=args.batch_size, dtype=DTYPES[args.dtype], ckpt=ckpt)
    res["model"] = ckpt.config.name if hasattr(ckpt.config, "name") else ckpt.source
    for line in figure_lines(res):
        print(line)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(res, indent=1))
    if not args.per_request:
        res = {k: v for k, v in res.items() if k != "per_request"}
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

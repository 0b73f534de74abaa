"""Where one engine step's time goes: a steady decode step of B sequences at context C.

    python -m veil.benchmarks.step_profile [--batch 16] [--context 300] [--threads 2]
        [--dtype float32] [--device cpu] [--steps 10]

Builds an engine (not started: the steps are driven here, one at a time), prefills B prompts of
C tokens, then times `--steps` decode steps split into host preparation (`ModelRunner.prepare`),
the forward pass and sampling (`ModelRunner.run`) and postprocessing, and profiles them with the
torch profiler: the op table, and the shares of matmuls, attention (KV gather and the attention
itself), sampling and everything else. The engine's C kernels (`veil.kernels.llama_cpu`) are not
torch ops, so during the profiled steps each call is wrapped in a profiler range named
`veil_cpu::<kernel>` to be counted. Prints `figure step.<metric> <value>` lines.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

CATEGORIES = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "mkldnn::_linear_pointwise"),
    "attention": ("aten::_scaled_dot_product", "aten::index_select", "aten::_softmax",
                  "veil_cpu::paged_attention", "veil_cpu::prefill_attention"),
    "sampling": ("aten::argmax", "aten::sort", "aten::searchsorted", "aten::cumsum"),
}


def category(name: str) -> str:
    for cat, prefixes in CATEGORIES.items():
        if name.startswith(prefixes):
            return cat
    return "other"


def _ranged(name: str, f):
    def call(*args, **kwargs):
        with torch.profiler.record_function(f"veil_cpu::{name}"):
            return f(*args, **kwargs)
    return call


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--model", help="a .gguf file or a Hugging Face directory (default: the shipped SmolLM2)")
    args = p.parse_args(argv)

    from torch.profiler import ProfilerActivity, profile

    from veil.engine.api import EngineConfig
    from veil.engine.engine import Engine
    from veil.engine.loader import build_model, load_checkpoint
    from veil.engine.sampling import SamplingParams
    from veil.engine.sequence import SeqKind, Sequence

    torch.set_num_threads(args.threads)
    model = build_model(load_checkpoint(args.model), dtype=getattr(torch, args.dtype))
    cuda = args.device.startswith("cuda")
    cfg = EngineConfig(kv_cache_bytes=1 << 30, max_tokens_per_step=args.batch * args.context,
                       max_seqs_per_step=args.batch, device=args.device)
    e = Engine(model, 0, cfg)
    for i in range(args.batch):
        prompt = [100 + (i * 7919 + j * 104729) % 40000 for j in range(args.context)]
        e.scheduler.add(Sequence.tokens("t", prompt, 10**6, SamplingParams()))

    def step() -> tuple[float, float, float]:
        chunks = e.scheduler.schedule()
        chunks.sort(key=lambda c: (c.seq.kind is not SeqKind.TOKENS, c.length != 1))
        t0 = time.perf_counter()
        st = e._prepare(chunks, None)
        t1 = time.perf_counter()
        tokens, hidden = e.runner.run(st.batch)
        t2 = time.perf_counter()
        e.scheduler.postprocess(st.chunks, st.epochs, tokens, hidden, e._finish)
        return t1 - t0, t2 - t1, time.perf_counter() - t2  # run() ends in the sampled ids' host copy

    step()  # the prefill
    for _ in range(3):
        step()
    times = [step() for _ in range(args.steps)]
    prep, run, post = (sum(t[i] for t in times) / len(times) for i in range(3))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    from veil.kernels import llama_cpu

    for name in ("paged_attention", "prefill_attention", "add_rms_norm", "rope", "silu_and_mul", "store_kv"):
        setattr(llama_cpu, name, _ranged(name, getattr(llama_cpu, name)))
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
    rows = prof.key_averages()
    if cuda:  # the GPU's own time per kernel, beside the host's op table below
        print(rows.table(sort_by="self_device_time_total", row_limit=15), file=sys.stderr)
        gpu = sum(r.self_device_time_total for r in rows) / args.steps
        print(f"figure step.gpu_busy_ms {gpu / 1e3:.3f}")
    total = sum(r.self_cpu_time_total for r in rows)
    shares: dict[str, float] = {}
    for r in rows:
        shares[category(r.key)] = shares.get(category(r.key), 0.0) + r.self_cpu_time_total / total
    print(rows.table(sort_by="self_cpu_time_total", row_limit=20), file=sys.stderr)
    print(f"# {args.batch} sequences at context {args.context}, {args.dtype} on {args.device}, "
          f"{args.threads} threads: mean step {1e3 * (prep + run + post):.2f} ms", file=sys.stderr)
    lines = [f"figure step.prepare_ms {1e3 * prep:.3f}", f"figure step.run_ms {1e3 * run:.3f}",
             f"figure step.postprocess_ms {1e3 * post:.3f}",
             f"figure step.tok_s {args.batch / (prep + run + post):.2f}"]
    lines += [f"figure step.share.{cat} {v:.4f}" for cat, v in sorted(shares.items())]
    lines.append(f"figure step.ops_per_step {sum(r.count for r in rows) / args.steps:.0f}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

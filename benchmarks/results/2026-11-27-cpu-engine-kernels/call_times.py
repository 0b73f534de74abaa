"""Where the C kernels' time goes inside the engine: per decode step (16 sequences at context 300,
bf16, 2 threads, 10 steady steps), the time of each `ops` call, of its `llama_cpu` wrapper, and
of the library call alone. A one-off measurement for the README here, not a benchmark:

    .venv/bin/python benchmarks/results/2026-11-27-cpu-engine-kernels/call_times.py
"""
import collections
import time

import torch

from veil.engine.engine import Engine, EngineConfig
from veil.engine.loader import build_model, load_checkpoint
from veil.engine.sampling import SamplingParams
from veil.engine.sequence import SeqKind, Sequence
from veil.kernels import llama_cpu, ops
from veil.kernels.linear import Linear

torch.set_num_threads(2)
spent = collections.defaultdict(float)


def timed(owner, name, label):
    f = getattr(owner, name)

    def call(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[label] += time.perf_counter() - t
    setattr(owner, name, call)


lib = llama_cpu._library()


class TimedLibrary:  # the library calls alone, through the same wrappers
    def __getattr__(self, name):
        f = getattr(lib, name)

        def call(*a):
            t = time.perf_counter()
            try:
                return f(*a)
            finally:
                spent["C " + name] += time.perf_counter() - t
        return call


llama_cpu._library = lambda: TimedLibrary()
llama_cpu.available = lambda: True
for n in ("paged_attention", "add_rms_norm", "rope", "silu_and_mul", "store_kv"):
    timed(llama_cpu, n, "wrapper " + n)
for n in ("paged_decode_attention", "add_rms_norm", "apply_rope", "silu_and_mul", "store_kv"):
    timed(ops, n, "ops " + n)
timed(Linear, "__call__", "GEMMs")

model = build_model(load_checkpoint(None), dtype=torch.bfloat16)
B, C = 16, 300
e = Engine(model, 0, EngineConfig(kv_cache_bytes=1 << 30, max_tokens_per_step=B * C, max_seqs_per_step=B))
for i in range(B):
    e.scheduler.add(Sequence.tokens("t", [100 + (i * 7919 + j * 104729) % 40000 for j in range(C)], 10**6,
                                    SamplingParams()))


def step():
    chunks = e.scheduler.schedule()
    chunks.sort(key=lambda c: (c.seq.kind is not SeqKind.TOKENS, c.length != 1))
    batch = e.runner.prepare(chunks)
    tokens, hidden = e.runner.run(batch)
    e._postprocess(chunks, tokens, hidden)


for _ in range(4):
    step()
spent.clear()
n = 10
t0 = time.perf_counter()
for _ in range(n):
    step()
print(f"step {(time.perf_counter() - t0) / n * 1e3:.2f} ms")
for k, v in sorted(spent.items()):
    print(f"{k:32s} {v / n * 1e3:6.2f} ms per step")

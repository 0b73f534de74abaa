"""The C paged attention alone, fp32, built three ways in one process: -mavx2 -mfma from this
checkout (the 8-lane row kernel), -mavx2 -mfma from the source before it (argv[1]: the generic
loop) and -march=native (the 16-lane row kernel). 16 rows at context 300, SmolLM2-135M heads
(9 q, 3 kv, d 64), blocks of 16, random caches, 2 threads; microseconds per call, the builds
alternated over rounds."""
import sys
import time
from pathlib import Path

import torch

from veil.kernels import cbuild, llama_cpu

torch.set_num_threads(2)
flags = llama_cpu._FLAGS
builds = {"avx2 row": cbuild.load(llama_cpu._SOURCE, (*flags, "-mavx2", "-mfma")),
          "avx2 generic": cbuild.load(Path(sys.argv[1]), (*flags, "-mavx2", "-mfma")),
          "native row": cbuild.load(llama_cpu._SOURCE, flags, native=True)}
B, L, hq, hkv, d, bs = 16, 300, 9, 3, 64, 16
nb = B * (-(-L // bs))
g = torch.Generator().manual_seed(0)
q = torch.randn(B, hq, d, generator=g); kc = torch.randn(nb, bs, hkv, d, generator=g)
vc = torch.randn(nb, bs, hkv, d, generator=g)
tables = torch.arange(nb, dtype=torch.int32).view(B, -1); lens = torch.full((B,), L, dtype=torch.int32)
want = None
for rnd in range(3):
    for name, raw in builds.items():
        lib = llama_cpu._declare(raw)
        llama_cpu._library = lambda lib=lib: lib
        out = llama_cpu.paged_attention(q, kc, vc, tables, lens, 0.125)
        want = out if want is None else want
        for _ in range(5): llama_cpu.paged_attention(q, kc, vc, tables, lens, 0.125)
        n, t = 200, time.perf_counter()
        for _ in range(n): llama_cpu.paged_attention(q, kc, vc, tables, lens, 0.125)
        us = (time.perf_counter() - t) / n * 1e6
        print(f"round {rnd} {name}: {us:.0f} us per call, max |out - avx2 row| {(out - want).abs().max():.1e}")

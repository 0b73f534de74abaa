"""The attention kernels alone against their twins (bf16, 2 threads), a one-off for the README:

    .venv/bin/python benchmarks/results/2026-11-27-cpu-engine-kernels/attention_micro.py

Decode: 16 sequences at contexts 16 and 300, contiguous block tables, the same cache reused by
every repeat (so it sits in L2: the kernel's time without the engine's memory traffic).
Prefill: chunks of new tokens over their contexts, random block tables.
"""
import time

import torch

from veil.kernels import llama_cpu
from veil.kernels.paged_attention import paged_decode_attention_torch
from veil.kernels.prefill_attention import paged_prefill_attention_torch

torch.set_num_threads(2)
HQ, HKV, D, BS, DT = 9, 3, 64, 16, torch.bfloat16


def ms(f, n=20):
    f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e3


for ctx in (16, 300):
    width = -(-ctx // BS)
    kc = torch.randn(400, BS, HKV, D).to(DT)
    vc = torch.randn_like(kc)
    tables = torch.arange(16 * width).view(16, width).int()
    lens = torch.full((16,), ctx, dtype=torch.int32)
    q = torch.randn(16, HQ, D).to(DT)
    print(f"decode 16 x ctx {ctx}: kernel {ms(lambda: llama_cpu.paged_attention(q, kc, vc, tables, lens, .125)):.3f} ms, "
          f"twin {ms(lambda: paged_decode_attention_torch(q, kc, vc, tables, lens, .125)):.3f} ms")
for chunks, ctxs in [([256], [256]), ([128] * 4, [128] * 4), ([32] * 8, [200] * 8), ([64, 16, 200], [64, 300, 200])]:
    width = max(-(-c // BS) for c in ctxs)
    kc = torch.randn(2000, BS, HKV, D).to(DT)
    vc = torch.randn_like(kc)
    tables = torch.randperm(2000)[: len(chunks) * width].view(len(chunks), width).int()
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(ctxs, dtype=torch.int32)
    q = torch.randn(sum(chunks), HQ, D).to(DT)
    print(f"prefill chunks {chunks} over {ctxs}: "
          f"kernel {ms(lambda: llama_cpu.prefill_attention(q, kc, vc, tables, cu, lens, .125)):.3f} ms, "
          f"twin {ms(lambda: paged_prefill_attention_torch(q, kc, vc, tables, cu, lens, .125)):.3f} ms")

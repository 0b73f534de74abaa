"""The two loops this change compiles, timed on the CPU against what ran before (ms, mean of 10
after warm-up): ``dot_plain``'s multiply-accumulate over 16 terms (eager ``mac_torch`` vs
``rns.mac(compile=True)``), one row and a batch of 4; the key inner product of a rotation at
level 7 with its Galois gather before the compiled loop (a gathered copy) vs inside it.
``python benchmarks/results/2026-11-26-mac/compiled_loops_micro.py``; results must be equal."""

import time

import torch

from veil.crypto.native import rns
from veil.crypto.native.context import RnsContext
from veil.crypto.native.ntt import compiled
from veil.crypto.params import PROTECTED_PARAMS
from veil.kernels.ckks_ops import mac_torch

ctx = RnsContext(PROTECTED_PARAMS, compile=True)


def ms(fn, repeat=10) -> float:
    fn()
    fn()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat * 1e3


def residues(shape, basis):
    return torch.randint(0, 2**62, shape) % torch.tensor(basis.primes).view(-1, 1)


for level in (7, 4, 2):
    basis, _ = ctx.data(level)
    for rows in (1, 4):
        lead = (rows, 2) if rows > 1 else (2,)
        a = [residues((*lead, level + 1, ctx.n), basis) for _ in range(16)]
        w = [residues((level + 1, ctx.n), basis) for _ in range(16)]
        assert torch.equal(rns.mac(a, w, basis, True), mac_torch(a, w, basis))
        eager = ms(lambda a=a, w=w, b=basis: mac_torch(a, w, b))
        comp = ms(lambda a=a, w=w, b=basis: rns.mac(a, w, b, True))
        print(f"dot_plain16 level {level} rows {rows}: eager {eager:.1f} ms, compiled {comp:.1f} ms", flush=True)

ext, _ = ctx.ext(7)
d, key = residues((8, 9, ctx.n), ext), residues((2, 8, 9, ctx.n), ext)
idx = torch.randperm(ctx.n)
f = compiled(rns._key_inner)
assert torch.equal(f(d, key, ext, idx), f(d.index_select(-1, idx), key, ext, None))
print(f"key_inner level 7: gather then compiled {ms(lambda: f(d.index_select(-1, idx), key, ext, None)):.2f} ms, "
      f"gather inside {ms(lambda: f(d, key, ext, idx)):.2f} ms", flush=True)

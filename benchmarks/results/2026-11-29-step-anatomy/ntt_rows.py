"""The C NTT alone, per row of N = 16384, by prime width, direction and rows per call (what
``step_profile.py``'s transforms cost in isolation)."""
import time

import torch

from veil.crypto.native.context import RnsContext
from veil.crypto.params import PROTECTED_PARAMS as P
from veil.kernels import ckks_cpu

ctx = RnsContext(P)
qs, p, n = ctx.data_primes, ctx.special_prime, P.poly_modulus_degree


def median_us(f, rep=200):
    f()
    t0 = time.perf_counter()
    for _ in range(rep):
        f()
    return (time.perf_counter() - t0) / rep * 1e6


for primes, rows in (((qs[7],), 2), ((p,), 2), (qs[:8], 2), ((qs[2],), 16)):
    x = torch.randint(0, min(primes), (rows, len(primes), n), dtype=torch.int64)
    for inv, centre in ((False, False), (True, False), (True, True)):
        us = median_us(lambda: ckks_cpu.ntt_cpu(primes, x, inv, centre))
        print(f"limbs {len(primes)} rows {rows} widths {sorted({q.bit_length() for q in primes})} inverse {inv} "
              f"centre {centre}: {us:.0f} us per call, {us / (rows * len(primes)):.1f} us per row")

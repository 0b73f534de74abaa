"""Both builds' ``veil_ntt_rows`` on the same limbs of the real primes, with the real tables:
microseconds per limb (best of 7, one call of 128 rows) and whether the outputs are equal bit
for bit. From the checkout, one thread:
``OMP_NUM_THREADS=1 PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-ntt-pairs/bench.py kernels/ckks_cpu.c PATCHED.c``."""

import ctypes
import subprocess
import sys
import time
from pathlib import Path

import torch

from veil.crypto.params import PROTECTED_PARAMS as P
from veil.kernels import ckks_cpu


def build(src: str) -> ctypes.CDLL:
    out = f"/tmp/ntt-{Path(src).stem}.so"
    subprocess.run(["gcc", "-O3", "-shared", "-fPIC", "-fopenmp", "-o", out, src], check=True)
    return ctypes.CDLL(out)


libs = {s: build(s) for s in sys.argv[1:]}
n, rows = P.poly_modulus_degree, 128
for q in (P.primes[2], P.primes[0]):
    primes, i64 = (q,), ctypes.c_int64
    tabs = ckks_cpu._tables(primes, n)
    x = torch.randint(0, q, (rows, 1, n))
    for inverse in (0, 1):
        outs = {}
        for name, lib in libs.items():
            best = 1e9
            for _ in range(7):
                out = torch.empty_like(x)
                t = time.perf_counter()
                lib.veil_ntt_rows(ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(x.data_ptr()), i64(n), i64(rows),
                                  i64(1), i64(n), ckks_cpu._primes(primes), tabs.ptrs, inverse, 0, None, 0)
                best = min(best, time.perf_counter() - t)
            outs[name] = out
            print(f"q {q.bit_length()} bits {'inverse' if inverse else 'forward'} {name}: {best / rows * 1e6:.1f} us per limb")
        assert all(torch.equal(next(iter(outs.values())), o) for o in outs.values()), "outputs differ"
print("outputs equal")

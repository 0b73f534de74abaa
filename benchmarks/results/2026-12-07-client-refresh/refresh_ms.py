"""The client's two pieces this folder changes, timed alone (median of 200 calls, ms): a
refresh's re-encoding (``NativeBackend._reencode``: balanced digits of a level-1 polynomial ->
NTT form at the top level) and a symmetric encryption at levels 7 and 1
(``keys.encrypt_symmetric``, sampling included). Run from the checkout:
``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-client-refresh/refresh_ms.py``."""

import statistics
import time

import numpy as np
import torch

from veil.crypto.backend import make_backend
from veil.crypto.native import keys as K
from veil.crypto.native import rns
from veil.crypto.params import PROTECTED_PARAMS

be = make_backend(PROTECTED_PARAMS, "native")
be.generate_keys([1], 1)
ctx, sk, rng = be._ctx, be._sk, np.random.default_rng(0)


def median_ms(fn, reps: int = 200) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


basis1, _ = ctx.data(1)
res = torch.stack([torch.from_numpy(rng.integers(0, q, ctx.n)) for q in basis1.primes])
y = rns.balanced_digits(res, basis1)
primes = ctx.data_primes[:2]
print(f"reencode level 1 -> {ctx.top}: {median_ms(lambda: be._reencode(y, primes, ctx.top)):.3f} ms")
for level in (ctx.top, 1):
    basis, ntt = ctx.data(level)
    m = ntt.forward(torch.stack([torch.from_numpy(rng.integers(0, q, ctx.n)) for q in basis.primes]))
    print(f"encrypt_symmetric at level {level}: {median_ms(lambda m=m, level=level: K.encrypt_symmetric(ctx, sk, m, level)):.3f} ms")

"""The client's CRT of a folded download's residues (8192 coefficients; 1 and 2 limbs, the fold's
levels 0 and 1): ``rounding.crt`` through Python ints, then to float64, against
``rns.balanced_digits`` + ``rns.digits_to_float`` over the small ring's basis (what
``ring_switch.decrypt`` does now: Garner in int64, a float sum); median of 20 after one warm-up.
Run from the repo root: ``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-client-crt/crt_ms.py``."""
import time

import numpy as np
import torch

from veil.crypto import rounding
from veil.crypto.native import rns
from veil.crypto.native.modarith import Basis
from veil.crypto.params import PROTECTED_PARAMS

rng = np.random.default_rng(0)
for limbs in (1, 2):
    qs = tuple(int(q) for q in PROTECTED_PARAMS.primes[:limbs])
    basis = Basis.of(qs)
    m = np.stack([rng.integers(0, q, 8192, dtype=np.int64) for q in qs])
    for name, f in (("python_ints", lambda: rounding.crt(m, qs, centered=True).astype(np.float64)),
                    ("garner", lambda: rns.digits_to_float(rns.balanced_digits(torch.from_numpy(m), basis), qs).numpy())):
        f()
        ts = []
        for _ in range(20):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        print(f"figure client_crt.{name}_ms.limbs{limbs} {sorted(ts)[10] * 1e3:.3f}")

"""The NTT per 16,384-point row on this CPU, forward and inverse, for six 36-bit primes and the
57-bit q0 (8 polynomials each, best of 7), after checking the forward transform against the twin;
run once with VEIL_CPU_AVX2=0 (the scalar loops) and once without (run.sh)."""
import time

import torch
from veil.kernels import ckks_cpu
from veil.crypto.params import PROTECTED_PARAMS
from veil.crypto.native.modarith import Basis
from veil.crypto.native.ntt import NttTables
P = PROTECTED_PARAMS.primes
lib = ckks_cpu._library()
print("paths", [lib.veil_ntt_path(q, 16384) for q in P])
n = 16384
for primes in [P[2:8], (P[0],)]:
    x = torch.stack([torch.randint(0, q, (8, n)) for q in primes], dim=-2)  # [8, L, n]
    fw = ckks_cpu.ntt_cpu(primes, x, inverse=False)
    assert torch.equal(fw, NttTables(Basis.of(primes), n).twin(x, inverse=False))
    for inv in (False, True):
        best = 1e9
        for _ in range(7):
            t = time.perf_counter(); ckks_cpu.ntt_cpu(primes, fw if inv else x, inverse=inv); best = min(best, time.perf_counter() - t)
        print(f"bits {primes[0].bit_length()} inverse={inv}: {best / x.numel() * n * 1e6:.1f} us/row")

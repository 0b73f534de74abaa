import time, torch
from veil.kernels import ckks_cpu
from veil.crypto.params import PROTECTED_PARAMS
torch.set_num_threads(2)
P = PROTECTED_PARAMS.primes
g = torch.Generator().manual_seed(0)
wide = torch.randint(0, P[-2], (2, 8, 16384), generator=g)
x, run = wide[..., -1:, :], (P[7],)
for rnd in range(3):
    for name, f in (("view", lambda: ckks_cpu.ntt_cpu(run, x, True, True)),
                    ("copy first", lambda: ckks_cpu.ntt_cpu(run, x.contiguous(), True, True))):
        for _ in range(20): f()
        t = time.perf_counter(); n = 500
        for _ in range(n): f()
        print(rnd, name, f"{(time.perf_counter() - t) / n * 1e6:.1f} us")

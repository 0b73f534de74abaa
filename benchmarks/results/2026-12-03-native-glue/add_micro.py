import time, torch
from veil.kernels import ckks_cpu
from veil.crypto.native.modarith import Basis
from veil.crypto.params import PROTECTED_PARAMS
torch.set_num_threads(2)
P = PROTECTED_PARAMS.primes[:8]
b = Basis.of(P)
g = torch.Generator().manual_seed(0)
x = torch.stack([torch.randint(0, q, (2, 16384), generator=g) for q in P], 1)
y = torch.stack([torch.randint(0, q, (2, 16384), generator=g) for q in P], 1)
assert torch.equal(ckks_cpu.add_cpu(P, x, y), b.add(x, y))
for rnd in range(3):
    for name, f in (("C add_cpu", lambda: ckks_cpu.add_cpu(P, x, y)), ("Basis.add", lambda: b.add(x, y))):
        for _ in range(20): f()
        t = time.perf_counter(); n = 500
        for _ in range(n): f()
        print(rnd, name, f"{(time.perf_counter() - t) / n * 1e6:.1f} us (level-7 ciphertext, 2 x 8 x 16384)")

"""The CPU multiply-accumulate's rate on this CPU: a key inner product at level 7 (8 digits of
9 limbs against one key's two halves, and a hoisted set of 4 keys) and a 16-term dot_plain at
level 4, in ns per 64-bit product (wall, torch's threads), best of 7."""
import time

import torch

from veil.crypto.params import PROTECTED_PARAMS
from veil.kernels import ckks_cpu

P = PROTECTED_PARAMS.primes
ext = (P[-1],) + P[:8]  # [p, q0..q7]
n = PROTECTED_PARAMS.poly_modulus_degree
col = torch.tensor(ext).view(-1, 1)


def residues(*lead, primes=ext):
    c = torch.tensor(primes).view(-1, 1)
    return torch.remainder(torch.randint(0, 2**62, (*lead, len(primes), n)), c)


def best(f, products):
    t = []
    for _ in range(7):
        s = time.perf_counter(); f(); t.append(time.perf_counter() - s)
    return f"{min(t) / products * 1e9:.2f} ns/product ({min(t) * 1e3:.1f} ms)"


digits = residues(8)
keys = [residues(2, 8) for _ in range(4)]
print("key inner, 1 key:", best(lambda: ckks_cpu.key_inner_cpu(ext, digits, keys[:1]), 8 * 2 * 9 * n))
print("key inner, 4 keys:", best(lambda: ckks_cpu.key_inner_cpu(ext, digits, keys), 4 * 8 * 2 * 9 * n))
lv4 = P[:5]
a = [residues(2, primes=lv4) for _ in range(16)]
w = [residues(primes=lv4) for _ in range(16)]
print("dot_plain 16 terms, 2 polys, level 4:", best(lambda: ckks_cpu.mac_cpu(lv4, a, w), 16 * 2 * 5 * n))

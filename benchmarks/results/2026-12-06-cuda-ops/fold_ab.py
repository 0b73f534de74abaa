# one-off: the fold's bytes with the code before (the HEAD tree in /tmp/wt-before) and after, given
# one fixed stand-in for the CSPRNG stream and seeds (this check only; production draws from the OS)
import hashlib
import sys

import numpy as np

from veil.crypto import ring_switch as rs
from veil.crypto.params import PROTECTED_PARAMS as P


class FixedStream:
    g = np.random.default_rng(5)
    def ternary(self, n): return self.g.integers(-1, 2, n).astype(np.int64)
    def cbd(self, n): return self.g.integers(-3, 4, n).astype(np.int64)
    def gaussian(self, n, s): return np.round(self.g.normal(0, s, n)).astype(np.int64)
rs.Stream = FixedStream
rs.new_seed = lambda: bytes(32)
n = P.poly_modulus_degree
g = np.random.default_rng(9)
secret, key_bytes = rs.make_key(P, g.integers(-1, 2, n))
key = rs.load_key(P, key_bytes, "cpu") if "device" in rs.load_key.__code__.co_varnames else rs.load_key(P, key_bytes)
out = []
for level in (0, 1):
    primes = P.primes[: level + 1]
    coeffs = np.stack([np.stack([g.integers(0, q, n) for q in primes]) for _ in range(2)])
    out.append(rs.fold(P, key, coeffs, level, 2.0**40, 30.0))
    out.append(rs.fold(P, key, coeffs, level, 2.0**40, None, round_log2=20.0))
print(sys.argv[1], [hashlib.sha256(o).hexdigest()[:16] for o in out])

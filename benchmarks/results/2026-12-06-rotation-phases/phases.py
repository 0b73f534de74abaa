"""One native rotation at the top level (level 7) by phase on the CPU, C kernels, torch's default
threads: ModUp (``rns.decompose``: the INTT and the lifted digits' NTTs), the key inner product
(``keyswitch._inner``), ModDown (``rns.mod_down``) and the automorphism's gather, then the whole
``keyswitch.rotate`` and the backend's ``rotate``; median ms of 15 after one warm-up.

    PYTHONSAFEPATH=1 python benchmarks/results/2026-12-06-rotation-phases/phases.py
"""

import time

import numpy as np
import torch

from veil.crypto.backend import make_backend
from veil.crypto.native import keyswitch, ntt, rns
from veil.crypto.params import PROTECTED_PARAMS as P

client = make_backend(P, "native")
client.generate_keys([1])
server = make_backend(P, "native")
server.import_public_material(client.export_public_material())
ct = server.deserialize(client.encrypt_to_bytes(np.random.default_rng(0).uniform(-1, 1, P.slot_count)))
c, ctx = server._unwrap(ct), server._ctx
level, d = c.level, c.data
g, key = server._galois_key(1, level)


def ms(f, n=15):
    f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(ts))


digits = rns.decompose(d[..., 1, :, :], ctx, level)
inner = keyswitch._inner(digits, key, ctx, level)
down = rns.mod_down(inner, ctx, level, plus=d[..., :1, :, :])
print(f"threads {torch.get_num_threads()}, level {level}, digits {tuple(digits.shape)}, "
      f"key {key.at(level).numel() * 8 / 1e6:.1f} MB at the level")
print(f"decompose {ms(lambda: rns.decompose(d[..., 1, :, :], ctx, level)):.3f} ms")
print(f"key inner product {ms(lambda: keyswitch._inner(digits, key, ctx, level)):.3f} ms")
print(f"mod_down {ms(lambda: rns.mod_down(inner, ctx, level, plus=d[..., :1, :, :])):.3f} ms")
print(f"automorphism {ms(lambda: ntt.automorphisms(down[None], ctx.galois_indices((g,)))):.3f} ms")
print(f"keyswitch.rotate {ms(lambda: keyswitch.rotate(d, g, key, ctx, level)):.3f} ms")
print(f"backend rotate {ms(lambda: server.rotate(ct, 1)):.3f} ms")

"""Rounded downloads, C kernels (veil.kernels.rounding_cpu) vs their numpy twins, in one process,
alternating, median of 9: the rounding alone (round_to_bytes, unround) on the protocol's levels
and bits, and a flooded download end to end on the native and SEAL backends (serialize with
noise_log2 on the server, deserialize on the client). The twin is selected by making the
kernel wrappers report "not built" (as where no compiler is)."""
import json
import statistics
import sys
import time

import numpy as np

from veil.crypto import rounding
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS as P
from veil.kernels import rounding_cpu
from veil.protected.circuits import FLOOD_BELOW_SCALE, REFRESH_ROUND_BELOW_SCALE

REAL = rounding_cpu.round_pack, rounding_cpu.unround


def use(kernel: bool) -> None:
    rounding_cpu.round_pack, rounding_cpu.unround = REAL if kernel else (lambda *a: None, lambda *a: None)


def timed(fn, reps=9):
    out = {}
    for kernel in (False, True) * reps:
        use(kernel)
        t = time.perf_counter()
        fn()
        out.setdefault(kernel, []).append(time.perf_counter() - t)
    use(True)
    return {("c" if k else "twin"): statistics.median(v) * 1e3 for k, v in out.items()}


results = {}
rng = np.random.default_rng(0)
# (what, level, bits below the scale): the scores and mlp downloads at 0, final at 1, the masked refresh at 2
cases = [("flooded@0", 0, FLOOD_BELOW_SCALE), ("flooded@1", 1, FLOOD_BELOW_SCALE), ("refresh@2", 2, REFRESH_ROUND_BELOW_SCALE)]
n = P.poly_modulus_degree
for name, level, below in cases:
    primes = tuple(P.primes[: level + 1])
    bits = rounding.bits_for(primes, np.log2(P.scale) - below)
    coeffs = np.stack([np.stack([rng.integers(0, q, n, dtype=np.uint64) for q in primes]) for _ in range(2)])
    blob = rounding.round_to_bytes(coeffs, primes, level, P.scale, bits)
    body = rounding.parse(blob, n, lambda lv: primes if lv == level else None)[4]
    r = timed(lambda: rounding.round_to_bytes(coeffs, primes, level, P.scale, bits))
    u = timed(lambda: rounding.unround(body, 2, n, primes, bits))
    results[f"round_ms.{name}"], results[f"unround_ms.{name}"] = r, u
    print(f"{name}: {bits} bits, round {r['twin']:.2f} -> {r['c']:.2f} ms, unround {u['twin']:.2f} -> {u['c']:.2f} ms",
          flush=True)

for backend in ("native", "seal"):
    client = make_backend(P, backend)
    client.generate_keys([])
    server = make_backend(P, backend)
    server.import_public_material(client.export_public_material())
    for name, level, below in cases:
        ct = server.deserialize(client.encrypt_to_bytes(rng.standard_normal(P.slot_count), level=level))
        noise = float(np.log2(server.scale(ct))) - below
        data = server.serialize(ct, noise_log2=noise)
        s = timed(lambda: server.serialize(ct, noise_log2=noise))
        d = timed(lambda: client.deserialize(data))
        results[f"{backend}.send_ms.{name}"], results[f"{backend}.load_ms.{name}"] = s, d
        print(f"{backend} {name}: send {s['twin']:.2f} -> {s['c']:.2f} ms, load {d['twin']:.2f} -> {d['c']:.2f} ms",
              flush=True)
for key, v in results.items():
    for impl, ms in v.items():
        print(f"figure rounding.{key}.{impl} {ms:.4g}")
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(results, f, indent=1)

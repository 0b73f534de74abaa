"""A span's rows batched against one after another, for a rotation, four hoisted rotations and a
ct x ct with its relinearization, at level 7 on the native CPU backend: one session's keys, 8
rows (what a prefill span's attention would batch). Medians of 5 after one untimed.
``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-xeon-orientation/span_rows_rotations.py``"""
import time, numpy as np
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS as P
c = make_backend(P, "native"); c.generate_keys({1: 7, 8: 7, 64: 7, 512: 7}, 7)
s = make_backend(P, "native"); s.import_public_material(c.export_public_material())
rng = np.random.default_rng(0)
cts = [s.deserialize(c.encrypt_to_bytes(rng.standard_normal(P.slot_count))) for _ in range(8)]
b = type(s).batched([s] * 8)
sb = b.stack(cts)
def t(f, n=5):
    f(); ts = []
    for _ in range(n):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return sorted(ts)[n // 2] * 1e3
for lvl_note in ["level 7"]:
    one = t(lambda: s.rotate(cts[0], 1))
    eight_seq = t(lambda: [s.rotate(x, 1) for x in cts])
    eight_b = t(lambda: b.rotate(sb, 1))
    print(f"rotate: one {one:.2f} ms, 8 one after another {eight_seq:.2f} ms, 8 rows batched {eight_b:.2f} ms")
    one = t(lambda: s.rotate_many(cts[0], [1, 8, 64, 512]))
    eight_seq = t(lambda: [s.rotate_many(x, [1, 8, 64, 512]) for x in cts])
    eight_b = t(lambda: b.rotate_many(sb, [1, 8, 64, 512]))
    print(f"rotate_many(4): one {one:.2f} ms, 8 one after another {eight_seq:.2f} ms, 8 rows batched {eight_b:.2f} ms")
    one = t(lambda: s.multiply(cts[0], cts[1]))
    eight_seq = t(lambda: [s.multiply(x, cts[1]) for x in cts])
    eight_b = t(lambda: b.multiply(sb, sb))
    print(f"ct x ct + relin: one {one:.2f}, 8 seq {eight_seq:.2f}, 8 rows {eight_b:.2f}")

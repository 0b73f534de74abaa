"""One-off: the softmax-weights expansion alone, the previous method (a 0/1 mask and log2 P
rotations per chunk, code of 28d0fda inlined below) against ``Circuit.expand_weights``, native
backend with the full key set, one process, alternating, median of ``REPEAT``. The previous
method reads the upload in the old layout (no shift), the new one in the new layout.

    flock /tmp/veil-quiet.lock python benchmarks/results/2026-11-28-weights-window/expand_micro.py
"""
import statistics
import sys
import time

import numpy as np

from veil.crypto.backend import make_backend
from veil.crypto.linear import broadcast_lane
from veil.crypto.params import PROTECTED_PARAMS
from veil.protected.circuits import Circuit, Constants, rotation_key_levels
from veil.protected.layouts import LayoutDims, pack_weights
from veil.protected.layouts import weights_period
from veil.protected.protocol import LEVELS
from veil.protected.timing import TimedBackend

DIMS = LayoutDims(d=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, slots=8192)
REPEAT = 5


def old_expand(circuit, w, t):
    """28d0fda's attention up to the products: mask, rescale, broadcast, per chunk."""
    be, dims = circuit.be, circuit.dims
    hd = dims.head_dim
    n_chunks = t // dims.per_chunk + 1
    period = weights_period(n_chunks)
    lanes = np.arange(hd)
    out = []
    for c in range(n_chunks):
        def expand_mask(valid, r=c):
            def make():
                mask = np.zeros(dims.slots)
                for b in range(valid):
                    for head in range(dims.heads):
                        mask[dims.value_base(b) + hd * head + lanes[lanes % period == r]] = 1.0
                return mask
            return ("old-expand", period, valid, r), make
        valid = max(0, min(dims.per_chunk, t + 1 - c * dims.per_chunk))
        pt = circuit.plain_rows(valid, expand_mask, be.level(w), be.prime(be.level(w)))
        out.append(broadcast_lane(be, be.multiply_plain(w, pt), c, period))
    return out


def old_pack(dims, w):
    """28d0fda's pack_weights (no shift)."""
    heads, n = w.shape
    chunks = dims.chunks(n)
    period = weights_period(chunks)
    out = np.zeros(dims.slots)
    lanes = np.arange(dims.head_dim)
    c = lanes % period
    for b in range(dims.per_chunk):
        j = dims.per_chunk * c + b
        ok = (c < chunks) & (j < n)
        for h in range(heads):
            out[dims.value_base(b) + dims.head_dim * dims.head_slot(h) + lanes[ok]] = w[h, j[ok]]
    return out


def main():
    client = make_backend(PROTECTED_PARAMS, "native")
    client.generate_keys(rotation_key_levels(DIMS))
    server = make_backend(PROTECTED_PARAMS, "native")
    server.import_public_material(client.export_public_material())
    tb = TimedBackend(server)
    circuit = Circuit(tb, DIMS, LEVELS, Constants(None, DIMS))
    rng = np.random.default_rng(0)
    for positions in [int(a) for a in (sys.argv[1] if len(sys.argv) > 1 else "16,32,64,128,256,512").split(",")]:
        w = rng.standard_normal((DIMS.heads, positions))
        t = positions - 1
        ct_old = client.encrypt(old_pack(DIMS, w), level=LEVELS.w)
        ct_new = client.encrypt(pack_weights(DIMS, w), level=LEVELS.w)
        # warm (encodes the masks once) and check both against each other
        a = [client.decrypt(e) for e in old_expand(circuit, ct_old, t)]
        b = [client.decrypt(e) for e in circuit.expand_weights(ct_new, t)]
        err = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
        times = {"old": [], "new": []}
        for _ in range(REPEAT):
            for name, fn, ct in (("old", old_expand, ct_old), ("new", Circuit.expand_weights, ct_new)):
                t0 = time.perf_counter()
                fn(circuit, ct, t)
                times[name].append(time.perf_counter() - t0)
        old, new = statistics.median(times["old"]), statistics.median(times["new"])
        chunks = DIMS.chunks(positions)
        print(f"figure expand.ms.old.ctx{positions} {old * 1e3:.2f}")
        print(f"figure expand.ms.new.ctx{positions} {new * 1e3:.2f}")
        print(f"# ctx {positions}: {chunks} chunks, period {weights_period(chunks)}: old {old * 1e3:.1f} ms, "
              f"new {new * 1e3:.1f} ms ({new / old:.2f}x), max |old - new| {err:.2e}", flush=True)


if __name__ == "__main__":
    main()

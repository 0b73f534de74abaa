"""The first protected layer's shuffle alone: ``EncodedLayer.shuffled_ffn`` for B rows (one
permutation per session of a batch) on the native backend, with the process's page faults and
system seconds around each call (``getrusage``). Three untimed calls first.

    python benchmarks/results/2026-12-03-context-leak/shuffle_micro.py [--rows 1,4] [--repeat 5]
"""

import argparse
import resource
import time

from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.engine.loader import load_checkpoint
from veil.protected.layouts import dims_of
from veil.protected.weights import EncodedLayer, ffn_permutation, layer_weights_from_tensors

ap = argparse.ArgumentParser()
ap.add_argument("--rows", default="1,4")
ap.add_argument("--repeat", type=int, default=5)
args = ap.parse_args()
ckpt = load_checkpoint(None)
dims = dims_of(ckpt.config, PROTECTED_PARAMS.slot_count)
be = make_backend(PROTECTED_PARAMS, "native")
layer = EncodedLayer(be, layer_weights_from_tensors(ckpt.tensors, ckpt.config, 28, dims), dims, shuffled=True)
for rows in [int(r) for r in args.rows.split(",")]:
    for i in range(3 + args.repeat):
        perms = [ffn_permutation(dims.ffn) for _ in range(rows)]
        a, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = layer.shuffled_ffn(be, perms)
        wall = time.perf_counter() - t
        b = resource.getrusage(resource.RUSAGE_SELF)
        del out
        if i >= 3:
            print(f"rows {rows}: wall {wall:.3f} s, sys {b.ru_stime - a.ru_stime:.3f} s, "
                  f"user {b.ru_utime - a.ru_utime:.3f} s, page faults {b.ru_minflt - a.ru_minflt}", flush=True)

"""A span's shuffle: ``EncodedLayer.shuffled_ffn`` with 1, then 8 (three times), then 1
permutations in one process, each with its page faults; ``keep``: the heap kept as a server keeps
it (``kernels.heap.keep_freed_memory``), ``default``: glibc's policy. Run from the checkout:
``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-bench-warmup/span_shuffle.py keep``."""

import resource
import sys
import time

from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.engine.loader import load_checkpoint
from veil.kernels.heap import keep_freed_memory
from veil.protected.layouts import dims_of
from veil.protected.weights import EncodedLayer, ffn_permutation, layer_weights_from_tensors

if sys.argv[1] == "keep":
    keep_freed_memory()
ckpt = load_checkpoint(None)
cfg = ckpt.config
dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
be = make_backend(PROTECTED_PARAMS, "native")
layer = EncodedLayer(be, layer_weights_from_tensors(ckpt.tensors, cfg, 10, dims), dims, shuffled=True)
for n in (1, 8, 8, 8, 1, 1):
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    out = layer.shuffled_ffn(be, [ffn_permutation(dims.ffn) for _ in range(n)])
    t = time.perf_counter() - t
    del out
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print(f"{n} perms: {t:.3f} s, {t / n:.3f} s per position, faults {faults}", flush=True)

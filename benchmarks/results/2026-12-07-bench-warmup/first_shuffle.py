"""The first protected layer's FFN shuffle (``EncodedLayer.shuffled_ffn``, one permutation) three
times in a fresh process, each with the functions that took the most time under cProfile. Run
from the checkout: ``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-bench-warmup/first_shuffle.py``."""

import cProfile
import io
import pstats
import time

from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.engine.loader import load_checkpoint
from veil.protected.layouts import dims_of
from veil.protected.weights import EncodedLayer, ffn_permutation, layer_weights_from_tensors

ckpt = load_checkpoint(None)
cfg = ckpt.config
dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
be = make_backend(PROTECTED_PARAMS, "native")
layer = EncodedLayer(be, layer_weights_from_tensors(ckpt.tensors, cfg, 10, dims), dims, shuffled=True)
for i in range(3):
    pr = cProfile.Profile()
    pr.enable()
    t = time.perf_counter()
    layer.shuffled_ffn(be, [ffn_permutation(dims.ffn)])
    t = time.perf_counter() - t
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("cumtime").print_stats(12)
    print(f"shuffle {i + 1}: {t:.3f} s")
    print("\n".join(line for line in out.getvalue().splitlines() if "/" in line or "ncalls" in line))

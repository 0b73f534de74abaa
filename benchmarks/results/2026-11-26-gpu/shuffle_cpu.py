"""The first protected layer's shuffled FFN for 1/2/4 rows on the 2-core CPU (native backend, random-weight model at /tmp/model; median of 3).
Old API (e561dd8): one shuffled_ffn per row; new: one call for all rows."""
import time, statistics, numpy as np, inspect
from veil.engine.loader import load_checkpoint
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.protected.layouts import dims_of
from veil.protected.weights import layer_weights_from_tensors, EncodedLayer, ffn_permutation
ckpt = load_checkpoint("/tmp/model"); cfg = ckpt.config
dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
w = layer_weights_from_tensors(ckpt.tensors, cfg, 28, dims)
be = make_backend(PROTECTED_PARAMS, "native")
layer = EncodedLayer(be, w, dims, shuffled=True)
new = "perms" in inspect.signature(layer.shuffled_ffn).parameters
def run(rows):
    if new: return layer.shuffled_ffn(be, [ffn_permutation(dims.ffn) for _ in range(rows)])
    return [layer.shuffled_ffn(be, ffn_permutation(dims.ffn)) for _ in range(rows)]
run(1)
for rows in (1, 2, 4):
    ts=[]
    for _ in range(3):
        t=time.perf_counter(); run(rows); ts.append(time.perf_counter()-t)
    print("new" if new else "old", rows, "rows", f"{statistics.median(ts):.3f} s")

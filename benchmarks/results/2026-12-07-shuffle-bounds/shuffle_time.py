"""The first protected layer's shuffle on the CPU (native backend, the shipped SmolLM2's layer 10,
one session): ``EncodedLayer.shuffled_ffn`` with the FFN matrices' entry bounds (the encodings'
checks from them) and without (the checks read from the encodings, as before), alternating, in
one process. Run from the repo root: ``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-shuffle-bounds/shuffle_time.py``."""
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
t = time.perf_counter()
layer = EncodedLayer(be, layer_weights_from_tensors(ckpt.tensors, cfg, 10, dims), dims, shuffled=True)
print(f"layer encoded with its entry bounds in {time.perf_counter() - t:.2f} s")
bounds = layer.ffn_entries
times = {"bounds": [], "reads": []}
for r in range(6):
    for mode in ("bounds", "reads") if r % 2 == 0 else ("reads", "bounds"):
        layer.ffn_entries = bounds if mode == "bounds" else (None, None)
        t = time.perf_counter()
        gu, down = layer.shuffled_ffn(be, [ffn_permutation(dims.ffn)])
        times[mode].append(time.perf_counter() - t)
for mode, ts in times.items():
    ts = sorted(ts[1:])  # the first of each is a warm-up
    print(f"figure shuffle.{mode}_s {ts[len(ts) // 2]:.4f}  (all: {', '.join(f'{x:.4f}' for x in ts)})")

"""Whether the entry bounds settle every check of the shuffled FFN's encodings for each layer of
the shipped SmolLM2 as the first protected one (k = 0..29): the encodings' and the diagonals'
reads from the device counted (``Tensor.tolist`` and ``.cpu()``), one shuffle per layer, native
backend on the CPU. Run from the repo root:
``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-shuffle-bounds/every_layer.py``."""
import numpy as np
import torch

from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.engine.loader import load_checkpoint
from veil.protected.layouts import dims_of
from veil.protected.weights import EncodedLayer, ffn_permutation, layer_weights_from_tensors

ckpt = load_checkpoint(None)
cfg = ckpt.config
dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
be = make_backend(PROTECTED_PARAMS, "native")
reads = []
for name in ("tolist", "cpu"):
    real = getattr(torch.Tensor, name)
    setattr(torch.Tensor, name, lambda t, *a, _real=real, _n=name, **k: reads.append(_n) or _real(t, *a, **k))
unsettled = 0
for i in range(cfg.num_layers):
    w = layer_weights_from_tensors(ckpt.tensors, cfg, i, dims)
    layer = EncodedLayer(be, w, dims, shuffled=True)
    reads.clear()
    gu, down = layer.shuffled_ffn(be, [ffn_permutation(dims.ffn)])
    zeros = [int((np.asarray(m) == 0).sum()) for m in (w.w_gu, w.w_down)]
    print(f"layer {i}: reads {len(reads)}, zero entries W_gate|up {zeros[0]}, W_down {zeros[1]}, "
          f"plaintexts {len(gu[0].plaintexts)} + {len(down[0].plaintexts)}")
    unsettled += bool(reads)
print(f"figure shuffle.layers_with_reads {unsettled} of {cfg.num_layers}")

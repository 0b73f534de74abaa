import time, sys
import numpy as np
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.crypto.native.batch import NativeBatch
from veil.protected.batch import stack_matrices
from veil.protected.layouts import dims_of
from veil.protected.weights import layer_weights_from_tensors, EncodedLayer, ffn_permutation
from veil.engine.loader import load_checkpoint
ck = load_checkpoint(); cfg = ck.config
dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
cl = make_backend(PROTECTED_PARAMS, "native"); cl.generate_keys([1])
srv = make_backend(PROTECTED_PARAMS, "native"); srv.import_public_material(cl.export_public_material())
layer = EncodedLayer(srv, layer_weights_from_tensors(ck.tensors, cfg, 28, dims), dims, shuffled=True)
batch = NativeBatch([srv] * 4)
res = {}
for rep in range(4):
    for B in (1, 4):
        t = time.perf_counter()
        gus, downs = layer.shuffled_ffn(batch if B > 1 else srv, [ffn_permutation(dims.ffn) for _ in range(B)])
        t1 = time.perf_counter()
        if B > 1:
            stack_matrices(batch, gus); stack_matrices(batch, downs)
        t2 = time.perf_counter()
        res.setdefault(B, []).append((t1 - t, t2 - t1))
print(sys.argv[1], {B: (round(min(a for a, _ in v), 3), round(min(b for _, b in v), 3)) for B, v in res.items()})

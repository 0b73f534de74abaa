import time, cProfile, pstats, sys, os
from veil.crypto.native import evaluator; evaluator.HOIST_CHUNK["cpu"] = int(os.environ.get("HC", 16))
import numpy as np, torch
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.crypto.linear import matvec
from veil.crypto.native.batch import NativeBatch
from veil.protected.circuits import relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.weights import layer_weights_from_tensors, EncodedLayer
from veil.engine.loader import load_checkpoint
ck = load_checkpoint(); cfg = ck.config
dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
steps = rotation_key_levels(dims)
B = 4
clients = []
for _ in range(B):
    be = make_backend(PROTECTED_PARAMS, "native"); be.generate_keys(steps, relin_key_level()); clients.append(be)
keysets = []
for c in clients:
    k = make_backend(PROTECTED_PARAMS, "native"); k.import_public_material(c.export_public_material()); keysets.append(k)
srv = make_backend(PROTECTED_PARAMS, "native")
layer = EncodedLayer(srv, layer_weights_from_tensors(ck.tensors, cfg, 28, dims), dims)
name = sys.argv[1] if len(sys.argv) > 1 else "wqkv"
m = getattr(layer, name)
span = m.plan.input_span if hasattr(m.plan, "input_span") else 576
xs = [c.encrypt(np.random.default_rng(0).standard_normal(PROTECTED_PARAMS.slot_count) * 0.1, level=m.level) for c in clients]
xs = [k.deserialize(c.serialize(x), level=m.level) for k, c, x in zip(keysets, clients, xs)]
batch = NativeBatch(keysets)
xb = batch.stack(xs)
def run1(): return [matvec(k, m, x) for k, x in zip(keysets, xs)]
def runb(): return matvec(batch, m, xb)
for f in (run1, runb): f()
res = {}
for rep in range(4):
    for lab, f in (("4x single", run1), ("batch4", runb)):
        t = time.perf_counter(); f(); res.setdefault(lab, []).append(time.perf_counter() - t)
print(name, "HC", os.environ.get("HC"), {k: round(min(v), 3) for k, v in res.items()}, flush=True)

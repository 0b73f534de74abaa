"""cProfile of the server's work on the second of two protected layers (layers 10 and 11 of the
shipped model, context 16; the second layer has no first-layer FFN shuffle): what a middle
layer of a k = 2 token costs, by function, after one untimed step."""
import cProfile
import pstats
import sys
import time
from veil.benchmarks import protected_bench as pb
from veil.engine.loader import build_model, load_checkpoint
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.protected.key_levels import relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.server import ProtectedExecutor
from veil.protected.weights import layer_weights_from_tensors
from veil.server.config import ServerConfig
ckpt = load_checkpoint(None); model, cfg = build_model(ckpt), ckpt.config
dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
c = make_backend(PROTECTED_PARAMS, "native"); c.generate_keys(rotation_key_levels(dims), relin_key_level())
s = make_backend(PROTECTED_PARAMS, "native"); s.import_public_material(c.export_public_material())
layers = (10, 11)
w = [layer_weights_from_tensors(ckpt.tensors, cfg, i, dims) for i in layers]
ex = ProtectedExecutor(s, cfg, w, ServerConfig().protected_limits())
h0, h1, ref = pb._plain_inputs(model, ckpt.tokenizer, 10, 16)
pr = cProfile.Profile()
handle, spent = ex.handle, [0.0]
def profiled(msg):
    if msg.layer != layers[1] or not on[0]:
        return handle(msg)
    t = time.perf_counter(); pr.enable()
    try:
        return handle(msg)
    finally:
        pr.disable(); spent[0] += time.perf_counter() - t
ex.handle = profiled
on = [False]
ex.drop_session(pb._timed_step(ex, c, cfg, w, layers, h0, h1, 16)[0].id)
on[0] = True
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1):
    ex.drop_session(pb._timed_step(ex, c, cfg, w, layers, h0, h1, 16)[0].id)
print("layer-11 server wall (s):", round(spent[0], 3))
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25)

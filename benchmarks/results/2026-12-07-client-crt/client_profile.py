"""The client's seconds per protected layer as `client_step.py` measures them, with a cProfile of
``ProtectedClientState.handle`` over the six timed steps and the untimed one (by own time, then
cumulative). Run from the repo root:
``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-client-crt/client_profile.py``."""
import time

from veil.benchmarks import protected_bench as pb
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.engine.loader import build_model, load_checkpoint
from veil.protected.client import ProtectedClientState
from veil.protected.key_levels import relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.server import ProtectedExecutor
from veil.protected.weights import layer_weights_from_tensors
from veil.server.config import ServerConfig

ckpt = load_checkpoint(None)
model, cfg = build_model(ckpt), ckpt.config
dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
client = make_backend(PROTECTED_PARAMS, "native")
client.generate_keys(rotation_key_levels(dims), relin_key_level())
server = make_backend(PROTECTED_PARAMS, "native")
server.import_public_material(client.export_public_material())
layers = (10, 11)
weights = [layer_weights_from_tensors(ckpt.tensors, cfg, i, dims) for i in layers]
ex = ProtectedExecutor(server, cfg, weights, ServerConfig().protected_limits())
h0, h1, _ = pb._plain_inputs(model, ckpt.tokenizer, 10, 16)
import cProfile, pstats
prof = cProfile.Profile()
real, spent = ProtectedClientState.handle, [0.0]


def handle(self, reply):
    t = time.perf_counter()
    try:
        prof.enable()
        try:
            return real(self, reply)
        finally:
            prof.disable()
    finally:
        spent[0] += time.perf_counter() - t


ProtectedClientState.handle = handle
steps = []
for i in range(7):
    spent[0] = 0.0
    out = pb._timed_step(ex, client, cfg, weights, layers, h0, h1, 16)
    ex.drop_session(out[0].id)
    if i:
        steps.append(spent[0] / 2)
steps.sort()
print(f"figure client.layer_s {steps[len(steps) // 2]:.5f}  (steps: {', '.join(f'{s * 1e3:.2f}' for s in steps)} ms)")
st = pstats.Stats(prof); st.sort_stats("tottime").print_stats(25)
st.sort_stats("cumulative").print_stats(40)

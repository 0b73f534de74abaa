"""Where a protected decode step's time goes on a CPU without AVX-512 (native backend, C
kernels): cProfile of one two-layer step at context 16 (layers 10 and 11 of the shipped model,
after one untimed step), the 2026-11-29 anatomy's script at today's API. Run from the repo root:
``PYTHONSAFEPATH=1 .venv/bin/python benchmarks/results/2026-12-07-avx2-protected/step_profile.py``."""
import cProfile
import pstats

from veil.benchmarks import protected_bench as pb
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.engine.loader import build_model, load_checkpoint
from veil.protected.key_levels import relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.server import ProtectedExecutor
from veil.protected.weights import layer_weights_from_tensors
from veil.server.config import ServerConfig

ckpt = load_checkpoint(None)
model, cfg = build_model(ckpt), ckpt.config
dims = dims_of(cfg, PROTECTED_PARAMS.slot_count)
c = make_backend(PROTECTED_PARAMS, "native")
c.generate_keys(rotation_key_levels(dims), relin_key_level())
s = make_backend(PROTECTED_PARAMS, "native")
s.import_public_material(c.export_public_material())
layers = (10, 11)
w = [layer_weights_from_tensors(ckpt.tensors, cfg, i, dims) for i in layers]
ex = ProtectedExecutor(s, cfg, w, ServerConfig().protected_limits())
h0, h1, ref = pb._plain_inputs(model, ckpt.tokenizer, 10, 16)
for _ in range(2):
    out = pb._timed_step(ex, c, cfg, w, layers, h0, h1, 16)
    ex.drop_session(out[0].id)
    print("untimed step wall", round(out[5], 3))
pr = cProfile.Profile()
pr.enable()
out = pb._timed_step(ex, c, cfg, w, layers, h0, h1, 16)
pr.disable()
print("profiled step wall", round(out[5], 3))
pstats.Stats(pr).sort_stats("tottime").print_stats(25)

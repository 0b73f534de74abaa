"""Where a fresh process's first protected step goes: ``protected_bench``'s step (layers 10-11,
context 16, native backend, the real model) three times in one process, each with its server
seconds by kind and the process's minor page faults during it. Run from the checkout:
``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-bench-warmup/first_steps.py``."""

import resource

from veil.benchmarks.protected_bench import _plain_inputs, _timed_step
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
client_be = make_backend(PROTECTED_PARAMS, "native")
client_be.generate_keys(rotation_key_levels(dims), relin_key_level())
server_be = make_backend(PROTECTED_PARAMS, "native")
server_be.import_public_material(client_be.export_public_material())
layers = (10, 11)
weights = [layer_weights_from_tensors(ckpt.tensors, cfg, i, dims) for i in layers]
ex = ProtectedExecutor(server_be, cfg, weights, ServerConfig().protected_limits())
h0, h1, _ = _plain_inputs(model, ckpt.tokenizer, 10, 16)
for i in range(3):
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    session, trips, per_op, _, _, wall, _ = _timed_step(ex, client_be, cfg, weights, layers, h0, h1, 16)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    ex.drop_session(session.id)
    kinds = " ".join(f"{k} {v:.3f}" for k, v in sorted(per_op.items(), key=lambda kv: -kv[1]))
    print(f"step {i + 1}: wall {wall:.3f} s, minor faults {faults}; layer 10's cycle: {kinds}", flush=True)

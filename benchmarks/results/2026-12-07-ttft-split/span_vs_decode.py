"""Server seconds by op kind of a prefill span of 8 positions through layers 10-11 (the first of
them shuffled), against 8 decode steps of the same positions one at a time; twice each, in one
process, on its main thread. Run from the repo root:
``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-ttft-split/span_vs_decode.py``."""
import time
import numpy as np
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
h0, h1, out = pb._plain_inputs(model, ckpt.tokenizer, 10, 8)


def run(spans):
    s = ex.new_session()
    c = ProtectedClientState(client, cfg, 10, 12, s.id)
    ex.be.reset()
    server_s, t0 = 0.0, time.perf_counter()
    for span in spans:
        msg = c.token_message(h0[span])
        while True:
            t = time.perf_counter()
            reply = ex.handle(msg)
            server_s += time.perf_counter() - t
            nxt = c.handle(reply)
            if isinstance(nxt, np.ndarray):
                break
            msg = nxt
    ex.drop_session(s.id)
    return server_s, time.perf_counter() - t0, dict(ex.be.times), dict(ex.be.counts)


for name, spans in (("span8", [slice(0, 8)]), ("decode8", [slice(i, i + 1) for i in range(8)])) * 2:
    srv, wall, times, counts = run(spans)
    print(name, f"server {srv:.2f} s wall {wall:.2f} s", {k: round(v, 2) for k, v in sorted(times.items(), key=lambda kv: -kv[1])})
    print("   counts", {k: v for k, v in counts.items()})

"""Four prefill spans of 8 positions through layers 10-11 in one session, each span's seconds and
its shuffle / matvec / rotations seconds, run on the main thread or on a new thread (arguments,
in order; e.g. ``main thread thread``). Run from the repo root:
``[OMP_WAIT_POLICY=PASSIVE] PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-first-prompt/spans_on_a_thread.py main thread thread``."""
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
h0, h1, out = pb._plain_inputs(model, ckpt.tokenizer, 10, 32)


import sys, threading

def run4():
    s = ex.new_session()
    c = ProtectedClientState(client, cfg, 10, 12, s.id)
    ex.be.reset()
    for k in range(4):
        before = dict(ex.be.times)
        msg, t0 = c.token_message(h0[8 * k: 8 * k + 8]), time.perf_counter()
        while True:
            nxt = c.handle(ex.handle(msg))
            if isinstance(nxt, np.ndarray):
                break
            msg = nxt
        d = {kk: round(v - before.get(kk, 0), 2) for kk, v in ex.be.times.items()}
        print(f"span {k}: {time.perf_counter() - t0:.2f} s", {kk: d[kk] for kk in ("shuffle", "matvec", "rotations") if kk in d}, flush=True)
    ex.drop_session(s.id)

for where in sys.argv[1:]:
    print("==", where)
    if where == "thread":
        t = threading.Thread(target=run4); t.start(); t.join()
    else:
        run4()

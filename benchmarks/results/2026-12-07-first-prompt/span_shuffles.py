"""Seconds of each first-layer shuffle (``ProtectedExecutor._shuffled``) in three prefill spans of 8
positions through layers 10-11, one session, in a fresh process on its main thread; with
``pregrow``, 3 GiB of 128 MiB blocks are allocated, filled and freed first (the heap kept); with
``fresh-keys``, the weights are encoded by a key-less backend (as a server's) and the third span
runs in a new session on a backend that has just imported the keys. Run from the repo root:
``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-first-prompt/span_shuffles.py [pregrow|fresh-keys]``."""
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
import sys
import torch

fresh_keys = sys.argv[1:] == ["fresh-keys"]
ex = ProtectedExecutor(make_backend(PROTECTED_PARAMS, "native") if fresh_keys else server, cfg, weights,
                       ServerConfig().protected_limits())
h0, h1, out = pb._plain_inputs(model, ckpt.tokenizer, 10, 32)

if sys.argv[1:] == ["pregrow"]:
    blocks = [torch.ones(1 << 24, dtype=torch.int64) for _ in range(24)]
    del blocks
orig = ex._shuffled
times = []
def timed(*a):
    t = time.perf_counter(); r = orig(*a); times.append(round(time.perf_counter() - t, 3)); return r
ex._shuffled = timed
s = ex.new_session(server)
c = ProtectedClientState(client, cfg, 10, 12, s.id)
for k in range(3):
    if k == 2 and fresh_keys:
        fresh = make_backend(PROTECTED_PARAMS, "native")
        fresh.import_public_material(client.export_public_material())
        s = ex.new_session(fresh)
        c = ProtectedClientState(client, cfg, 10, 12, s.id)
    msg = c.token_message(h0[8 * k: 8 * k + 8])
    while True:
        nxt = c.handle(ex.handle(msg))
        if isinstance(nxt, np.ndarray):
            break
        msg = nxt
    print("span", k, times, flush=True); times.clear()

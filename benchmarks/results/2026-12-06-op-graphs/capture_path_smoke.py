"""Drives OpGraphs._capture and _replay (crypto/native/graphs.py) on the CPU with the stand-ins of
``cuda_standins.py`` (this check only), to check the code paths' Python (buffers, pool, warm-up,
the fallback of a capture that raises) against the eager backend's bytes. Not a GPU check.

    PYTHONSAFEPATH=1 python capture_path_smoke.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # cuda_standins

import numpy as np
import torch
from cuda_standins import Driven, FakeGraph, install

from veil.crypto.backend import make_backend
from veil.crypto.native import graphs as G
from veil.crypto.params import PROTECTED_PARAMS as P

install()
client = make_backend(P, "native")
client.generate_keys([1, 2, 100])
eager, g = make_backend(P, "native"), make_backend(P, "native")
for s in (eager, g):
    s.import_public_material(client.export_public_material())
g._graphs = Driven(torch.device("cpu"))
rng = np.random.default_rng(0)
for _ in range(4):
    up = client.encrypt_to_bytes(rng.standard_normal(P.slot_count))
    a, b = g.deserialize(up), eager.deserialize(up)
    assert g.serialize(g.rotate(a, 1)) == eager.serialize(eager.rotate(b, 1))
    assert g.serialize(g.add(*g.rotate_many(a, [1, 2]))) == eager.serialize(eager.add(*eager.rotate_many(b, [1, 2])))
    assert g.serialize(g.multiply(a, a)) == eager.serialize(eager.multiply(b, b))
print("captures", g._graphs.captures, "replays", g._graphs.replays, "buffers MB", g._graphs.buffer_bytes / 2**20)

bad = Driven(torch.device("cpu"))  # a capture that raises: the name stays eager
calls = []


def boom(x):
    calls.append(1)
    if FakeGraph.capturing is not None:
        raise RuntimeError("operation not permitted when stream is capturing")
    return x + 1


x = torch.zeros(4, dtype=torch.int64)
for _ in range(3):
    assert torch.equal(bad.run(("boom",), boom, x), x + 1)
print("bad captures", bad.captures, "entries", list(bad._graphs.values())[0] is G._EAGER, "calls", len(calls))

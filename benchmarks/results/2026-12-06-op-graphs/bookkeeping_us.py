"""A replay's own Python in ``OpGraphs.run`` (naming by the keys' storage, the lookup, the lock),
with the capture and the replay stubbed out (this timing only): microseconds per call, for one
session's key and for a batch of 16 rows' keys.

    PYTHONSAFEPATH=1 python bookkeeping_us.py
"""

import time

import torch

from veil.crypto.native import graphs as G
from veil.crypto.native import keys as K


class Stubbed(G.OpGraphs):
    def _capture(self, full, fn, inputs):
        return G._Graph(None, (), None, [])

    def _replay(self, g, inputs):
        return None


graphs = Stubbed(torch.device("cpu"))
key = K.SwitchKey(torch.zeros(2, 8, 9, 16, dtype=torch.int64), b"")
rows = K.RowKeys(tuple(K.SwitchKey(torch.zeros(2, 8, 9, 16, dtype=torch.int64), b"") for _ in range(16)))
x = torch.zeros(2, 8, 16, dtype=torch.int64)
for label, k in (("one key", key), ("16 rows' keys", rows)):
    name = ("rotate", 7, 3)
    for _ in range(3):  # eager, captured: every later call replays
        graphs.run(name + G.key_storage(k), lambda d: d, x)
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        graphs.run(name + G.key_storage(k), lambda d: d, x)
    print(f"{label}: {(time.perf_counter() - t) / n * 1e6:.2f} us per call")

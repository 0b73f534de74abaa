"""``OpGraphs._capture`` and ``_replay`` as written, with whole products graphed, driven on the CPU:
``protected_bench`` (native, layers 10-11 of the shipped SmolLM2, context 16, the C kernels,
``--warmup``) with the server backend's graphs run through the stand-ins of
``../2026-12-06-op-graphs/cuda_standins.py`` (this check only: a "replay" reruns the captured
function on the static input buffers into the static output buffer, and returns the facts the
capture found). Prints the names captured by operation, the replays, the static buffers, and
the step's figures (its error against the plaintext blocks: the replays' results, their levels
and scales included, feed the protocol).

    cd benchmarks/results/2026-12-07-product-graphs && PYTHONSAFEPATH=1 python driven_products.py
"""

import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-op-graphs"))

from cuda_standins import install  # noqa: E402

from veil.benchmarks import protected_bench  # noqa: E402
from veil.crypto.native import graphs as G  # noqa: E402
from veil.crypto.native.backend import NativeBackend  # noqa: E402


class Driven(G.OpGraphs):
    def _capture(self, full, fn, inputs):
        entry = super()._capture(full, fn, inputs)
        if entry is not G._EAGER:
            entry.graph.replay_fn = lambda e=entry, f=fn: e.output.copy_(G._split(f(*e.inputs))[0])
        return entry


install()
made = []
_init = NativeBackend.__init__


def init(self, *a, **kw):
    _init(self, *a, **kw)
    self._graphs = Driven(self.device, products=True)
    made.append(self)


NativeBackend.__init__ = init
protected_bench.main(["--he-backend", "native", "--contexts", "16", "--warmup", "--out", "/tmp/driven_products.json"])
g = max(made, key=lambda b: b._graphs.captures)._graphs
kinds = collections.Counter(name[0] for name, e in g._graphs.items() if e is not G._EAGER)
print(f"# server graphs: {g.captures} captured, {g.replays} replays, eager names {sum(e is G._EAGER for e in g._graphs.values())}")
print(f"# names by operation: {dict(kinds)}")
print(f"# static buffers: {len(g._buffers)}, {g.buffer_bytes / 2**20:.1f} MB")

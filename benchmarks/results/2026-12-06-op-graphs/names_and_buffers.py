"""How many graph names and how many bytes of static buffers one session's protected step needs:
``protected_bench`` (native, layers 10-11 of the shipped SmolLM2, context 16, the C kernels) with
the server backend's graphs driven through ``OpGraphs._capture`` / ``_replay`` on the CPU, with
the stand-ins of ``cuda_standins.py`` (this check only). Prints the
names captured, the static buffers' bytes, and the step's figures (its error against the
plaintext blocks: the replays' results feed the protocol).

    cd benchmarks/results/2026-12-06-op-graphs && PYTHONSAFEPATH=1 python names_and_buffers.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # cuda_standins

import collections

from cuda_standins import Driven, install

from veil.benchmarks import protected_bench
from veil.crypto.native import graphs as G
from veil.crypto.native.backend import NativeBackend

install()
made = []
_init = NativeBackend.__init__


def init(self, *a, **kw):
    _init(self, *a, **kw)
    self._graphs = Driven(self.device)
    made.append(self)


NativeBackend.__init__ = init
protected_bench.main(["--he-backend", "native", "--contexts", "16", "--warmup"])
server = max(made, key=lambda b: b._graphs.captures)
g = server._graphs
kinds = collections.Counter(name[0] for name, e in g._graphs.items() if e is not G._EAGER)
print(f"# server graphs: {g.captures} captured, {g.replays} replays, eager names {sum(e is G._EAGER for e in g._graphs.values())}")
print(f"# names by operation: {dict(kinds)}")
print(f"# static buffers: {len(g._buffers)}, {g.buffer_bytes / 2**20:.1f} MB")

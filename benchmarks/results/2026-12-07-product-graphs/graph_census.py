"""What one protected layer's server work launches from Python on the CUDA code path when the key
switches and rescales replay from CUDA graphs (``crypto/native/graphs.py``), and with ``--products``
whole products too (``VEIL_NATIVE_CUDA_GRAPHS=products``), counted on the CPU:
``../2026-11-28-ntt-launches/layer_count.py`` (the CUDA dispatch forced on CPU tensors, every
Triton launcher a counter around its twin, the C kernels off), with the server backend's graphs
replaced by a stand-in that runs a graph's operation uncounted and counts what a replay costs
from Python instead: one graph launch and two torch ops (the copy into the static buffers, one
per input, and the clone out). ``protected_bench`` warms up twice (a name runs eagerly first,
is captured second), so the counted step replays every name it can.

    cd benchmarks/results/2026-12-07-product-graphs && PYTHONSAFEPATH=1 python graph_census.py [--products | --eager]

A copy of ``../2026-12-06-op-graphs/graph_census.py`` with ``--products`` added, on top of
``../2026-12-07-mac-rows/census.py``'s patches (the rows kernel counted: the op-graphs census
predates it, and left a product's giant steps out).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-11-28-ntt-launches"))
PRODUCTS = "--products" in sys.argv
import layer_count  # noqa: E402  (first: it turns the C kernels off and patches the launchers)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-07-mac-rows"))
import census  # noqa: E402, F401  (its patches only: the rows kernel counted, ckks_ops.mac's CUDA branch as it is)

from veil.crypto.native import graphs as G  # noqa: E402
from veil.crypto.native.backend import NativeBackend  # noqa: E402


class CountedReplays(G.OpGraphs):
    """A stand-in for the capture, for this census only: "replaying" runs the operation with the
    counters off and counts the replay's own launches and ops."""

    def _capture(self, full, fn, inputs):
        self.captures += 1
        return G._Graph(fn, (), None, [])

    def _replay(self, g, inputs):
        server = layer_count.state["server"]
        layer_count.state["server"] = False
        try:
            out = g.graph(*inputs)
        finally:
            layer_count.state["server"] = server
        if server:
            layer_count.launches["graph"] += 1
            layer_count.ops["aten.copy_"] += len(inputs)
            layer_count.ops["aten.clone"] += 1
        self.replays += 1
        return out


if "--eager" not in sys.argv:
    _init = NativeBackend.__init__

    def init(self, *a, **kw):
        _init(self, *a, **kw)
        self._graphs = CountedReplays(self.device, products=PRODUCTS)

    NativeBackend.__init__ = init
layer_count.main([a for a in sys.argv[1:] if a not in ("--eager", "--products")])

"""Drives OpGraphs._capture and _replay (crypto/native/graphs.py) on the CPU with stand-ins for
torch.cuda's streams and graph objects (this check only: a "replay" reruns the operation on the static
buffers into the output buffer), to check the code paths' Python (buffers, pool, warm-up, the
fallback of a capture that raises) against the eager backend's bytes. Not a GPU check.

    PYTHONSAFEPATH=1 python capture_path_smoke.py
"""
import contextlib, numpy as np, torch
from veil.crypto.native import graphs as G
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS as P

class FakeStream:
    def __init__(self, device=None): pass
    def wait_stream(self, other): pass
    def __eq__(self, o): return isinstance(o, FakeStream)
class FakeGraph:
    captured = None
    def __init__(self): self.fns = []
    def capture_begin(self, pool=None, capture_error_mode="global"):
        assert capture_error_mode == "thread_local"; FakeGraph.captured = self; self.recording = True
    def capture_end(self): self.recording = False; FakeGraph.captured = None
    def pool(self): return (0, 1)
    def replay(self): self.replay_fn()
torch.cuda.current_stream = lambda device=None: FakeStream()
torch.cuda.Stream = FakeStream
torch.cuda.stream = lambda s: contextlib.nullcontext()
torch.cuda.CUDAGraph = FakeGraph

class Rec(G.OpGraphs):
    def _capture(self, full, fn, inputs):
        entry = super()._capture(full, fn, inputs)
        if entry is not G._EAGER:  # "replaying" reruns fn on the static inputs into the output
            entry.graph.replay_fn = lambda e=entry, f=fn: e.output.copy_(f(*e.inputs))
        return entry

client = make_backend(P, "native"); client.generate_keys([1, 2, 100])
eager, g = make_backend(P, "native"), make_backend(P, "native")
for s in (eager, g): s.import_public_material(client.export_public_material())
g._graphs = Rec(torch.device("cpu"))
rng = np.random.default_rng(0)
for i in range(4):
    up = client.encrypt_to_bytes(rng.standard_normal(P.slot_count))
    a, b = g.deserialize(up), eager.deserialize(up)
    assert g.serialize(g.rotate(a, 1)) == eager.serialize(eager.rotate(b, 1))
    assert g.serialize(g.add(*g.rotate_many(a, [1, 2]))) == eager.serialize(eager.add(*eager.rotate_many(b, [1, 2])))
    assert g.serialize(g.multiply(a, a)) == eager.serialize(eager.multiply(b, b))
print("captures", g._graphs.captures, "replays", g._graphs.replays, "buffers MB", g._graphs.buffer_bytes / 2**20)
# a capture that raises: eager forever
bad = Rec(torch.device("cpu"))
calls = []
def boom(x):
    calls.append(1)
    if FakeGraph.captured is not None: raise RuntimeError("operation not permitted when stream is capturing")
    return x + 1
x = torch.zeros(4, dtype=torch.int64)
for _ in range(3): assert torch.equal(bad.run(("boom",), boom, x), x + 1)
print("bad captures", bad.captures, "entries", list(bad._graphs.values())[0] is G._EAGER, "calls", len(calls))

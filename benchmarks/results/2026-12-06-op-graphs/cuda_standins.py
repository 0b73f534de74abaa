"""Stand-ins for torch.cuda's stream and graph objects, for the CPU checks in this folder only: with
``install()``, ``OpGraphs._capture`` and ``_replay`` (crypto/native/graphs.py) run as written on CPU
tensors, and ``Driven`` makes a "replay" rerun the captured operation on the static buffers into the
output buffer. They check the code paths' Python, not a GPU."""

import contextlib

import torch

from veil.crypto.native import graphs as G


class FakeStream:
    def __init__(self, device=None):
        pass

    def wait_stream(self, other):
        pass

    def __eq__(self, other):
        return isinstance(other, FakeStream)


class FakeGraph:
    capturing = None  # the graph being "captured", if any

    def capture_begin(self, pool=None, capture_error_mode="global"):
        assert capture_error_mode == "thread_local"
        FakeGraph.capturing = self

    def capture_end(self):
        FakeGraph.capturing = None

    def pool(self):
        return (0, 1)

    def replay(self):
        self.replay_fn()


def install() -> None:
    torch.cuda.current_stream = lambda device=None: FakeStream()
    torch.cuda.Stream = FakeStream
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.CUDAGraph = FakeGraph


class Driven(G.OpGraphs):
    def _capture(self, full, fn, inputs):
        entry = super()._capture(full, fn, inputs)
        if entry is not G._EAGER:
            entry.graph.replay_fn = lambda e=entry, f=fn: e.output.copy_(f(*e.inputs))
        return entry

"""CUDA graphs of the native backend's key switches and rescales, replayed instead of launched
one kernel at a time.

Why: on a GPU one session's protected step is bound by launching, not by the GPU (a layer is
~1,150 Triton launches and ~2,300 torch ops from Python, ``benchmarks/results/2026-12-06-cuda-ops``;
a rotation's kernels take a fraction of the host time it spends launching them). A rotation
replayed from a graph is three launches from Python: its input copied in, the graph, its output
copied out.

How (``OpGraphs.run``): an operation is named by what its kernels read besides the input — the
operation and its static arguments (level, Galois elements) and the storage of the keys
(address, shape, strides) — and by its inputs' shapes. The first call of a name runs eagerly
(it fills the tables' caches and compiles the Triton kernels); the second captures a graph on a
side stream and replays it, and every later one replays it. Inputs are copied into static
buffers and the output out of one (a clone: the next replay overwrites it); the buffers are
shared by every graph of the same shapes, and the graphs' intermediates by one memory pool, so a
graph costs no memory of its own beyond its nodes. Calls are serialized by a lock: a replay owns
the buffers from its copy in to its clone out.

Whole products (``VEIL_NATIVE_CUDA_GRAPHS=products``, ``Evaluator.run_product``): a matrix-vector
product's baby steps, giant-step sums, rotations, rescales and additions as one graph, named by
its plaintexts' storage and the backend's keys: one replay in place of its additions', sums' and
key switches' launches (a layer's, counted on the CPU: ``benchmarks/results/2026-12-07-product-graphs``).
A graphed call's own calls run inside its capture (captured with it): a graph is never replayed
inside another's capture, and the lock is not taken twice. Where it runs eagerly (its first
call, a failed capture), its own calls are graphed as any others. ``fn`` may return a tensor and
host-side facts about it that a replay cannot recompute (a ciphertext's level and scale): a
replay returns them as the capture found them.

Why keys by address: a graph reads the key it was captured with in place, so it is replayed only
for a key stored there now (a later key at a freed key's address, same shape and strides, is
that key: the graph reads it). The address tables the key-inner kernel reads are held by the
graph (``ckks_ops.keep_tables``): its cache may drop them, the graph still reads them. A capture
that fails (an operation that syncs with the host, or copies from it) leaves that name eager.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from veil.kernels import ckks_ops

__all__ = ["Name", "OpGraphs", "key_storage"]

log = logging.getLogger("veil.crypto.native")

#: Graphs one backend keeps (least recently used dropped first). A session's protected step uses
#: ~70 names (48 rotations, 10 rescales, 5 hoisted sets, 3 products, 3 relinearizations: two
#: layers, ``benchmarks/results/2026-12-06-op-graphs``); every layer the same.
MAX_GRAPHS = 1024
#: Device bytes of one backend's static buffers (one per role and shape). A session's own names
#: need 101 MB at N = 2^14 (32 buffers, measured; by shape, a hoisted set of 16's output at the top
#: level is 16 x 2 x 8 x N int64, 34 MB); a batch's grow with its rows, and a name whose buffers
#: would not fit stays eager (a batch's hoisted sets, 0.5 GB of output by shape at 16 rows, are
#: one launch sequence each anyway).
MAX_BUFFER_BYTES = 256 << 20
#: What a whole product's working set adds to the pool (``reserved_bytes``), by shape: a batch of
#: 16 rows' baby steps at the top level are 15 x 16 x 2 x 8 x N int64, 503 MB, and its hoisted
#: chunk's digits 151 MB more; one session's product needs a sixteenth of that.
PRODUCT_POOL_BYTES = 1 << 30
_EAGER = object()  # a name whose capture failed
_local = threading.local()  # .within: a graphed call of this thread is running (its calls are part of it)


class Name(tuple):
    """A long part of a graph's name, hashed once: a product's plaintexts (hundreds of entries)
    and a backend's keys are named once and looked up at every call (a lookup of W_gate|up's
    product: 18.7 us with plain tuples, 0.3 with these; ``benchmarks/results/2026-12-07-product-graphs``)."""

    def __new__(cls, items):
        self = super().__new__(cls, items)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash


def key_storage(*keys) -> tuple:
    """What names a switching key for a graph: each ``SwitchKey``'s (and each row's of a
    ``RowKeys``) storage address, shape and strides."""
    out = []
    for key in keys:
        for k in getattr(key, "rows", (key,)):
            out.append((k.data.data_ptr(), tuple(k.data.shape), k.data.stride()))
    return tuple(out)


@dataclass
class _Graph:
    graph: object  # torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # the static buffers it reads (shared by shape)
    output: torch.Tensor  # the static buffer it writes (shared by shape)
    kept: list  # what it reads that no one else holds for it (address tables)
    facts: object = None  # what fn returned beside its tensor, if anything (module doc)


class OpGraphs:
    """One backend's graphs (a session's; a batch of sessions uses its first row's)."""

    def __init__(self, device: torch.device, max_graphs: int = MAX_GRAPHS,
                 max_buffer_bytes: int = MAX_BUFFER_BYTES, products: bool = False) -> None:
        self.device, self.max_graphs, self.max_buffer_bytes = torch.device(device), max_graphs, max_buffer_bytes
        self.products = products  # whole products too (``Evaluator.run_product``), not only key switches
        self._graphs: OrderedDict[tuple, _Graph | object] = OrderedDict()
        self._seen: OrderedDict[tuple, None] = OrderedDict()  # names run once, eagerly
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._pool = None
        self._side: torch.cuda.Stream | None = None  # where every capture of this backend runs
        self._last: torch.cuda.Stream | None = None  # the stream of the last replay
        self._lock = threading.Lock()
        self.replays = self.captures = 0

    def run(self, name: tuple, fn: Callable[..., torch.Tensor | tuple], *inputs: torch.Tensor):
        """``fn(*inputs)``, from a graph where one was captured for ``name`` and these shapes
        (``fn`` returns a tensor, or a tensor and facts about it: module doc)."""
        if getattr(_local, "within", False):  # part of an enclosing graphed call
            return fn(*inputs)
        full = name + tuple((tuple(x.shape), x.dtype) for x in inputs)
        with self._lock:
            entry = self._graphs.get(full)
            if entry is None:
                if full not in self._seen:
                    _remember(self._seen, full, self.max_graphs)
                    entry = _EAGER
                else:
                    entry = self._capture(full, _enclosing(fn), inputs)
                    _remember(self._graphs, full, self.max_graphs, entry)
            else:
                self._graphs.move_to_end(full)
            if entry is not _EAGER:
                return self._replay(entry, inputs)
        # eagerly (a name's first call, or one whose capture failed), outside the lock: its own
        # graphed calls replay their graphs as any others
        return fn(*inputs)

    @property
    def reserved_bytes(self) -> int:
        """What the device budget (``--protected-device-gb``) counts for these graphs from the
        start: the static buffers' limit, and as much again for the pool, which holds the largest
        captured operation's working set (by shape, the digits of a 16-row rotation at the top level
        alone are 16 x 8 x 9 x N int64, 151 MB); with whole products, ``PRODUCT_POOL_BYTES`` more.
        Not measured on a GPU, and the pool is not bounded by this class: an estimate, not a limit."""
        return 2 * self.max_buffer_bytes + (PRODUCT_POOL_BYTES if self.products else 0)

    @property
    def buffer_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def _buffer(self, role: str, like: torch.Tensor) -> torch.Tensor | None:
        """The static buffer of ``role`` for ``like``'s shape, or None where a new one would
        take this backend over ``max_buffer_bytes``."""
        key = (role, tuple(like.shape), like.dtype)
        buf = self._buffers.get(key)
        if buf is None:
            if self.buffer_bytes + like.numel() * like.element_size() > self.max_buffer_bytes:
                return None
            buf = self._buffers[key] = torch.empty(like.shape, dtype=like.dtype, device=self.device)
        return buf

    def _capture(self, full: tuple, fn: Callable, inputs: Sequence[torch.Tensor]) -> _Graph | object:
        static = tuple(self._buffer(f"in{i}", x) for i, x in enumerate(inputs))
        if any(buf is None for buf in static):
            return _EAGER
        for buf, x in zip(static, inputs, strict=True):
            buf.copy_(x)
        # once on the static buffers first, on this stream (its working memory goes back to the
        # eager cache): a kernel specialized for their strides and alignment compiles here, not
        # inside the capture
        first, facts = _split(fn(*static))
        output = self._buffer("out", first)
        if output is None:
            return _EAGER
        current = torch.cuda.current_stream(self.device)
        if self._side is None:
            self._side = torch.cuda.Stream(device=self.device)
        self._side.wait_stream(current)
        graph, kept = torch.cuda.CUDAGraph(), []
        try:
            with torch.cuda.stream(self._side):
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    with ckks_ops.keep_tables(kept):
                        output.copy_(_split(fn(*static))[0])
                except BaseException:
                    with contextlib.suppress(Exception):
                        graph.capture_end()
                    raise
                graph.capture_end()
        except torch.OutOfMemoryError:
            raise  # the step fails (503); the next call of this name tries again
        except Exception as e:  # noqa: BLE001 (this name stays eager; the result comes from fn)
            log.warning("no CUDA graph for %s (%s: %s); it runs eagerly", full[0], type(e).__name__, e)
            return _EAGER
        finally:
            current.wait_stream(self._side)
        if self._pool is None:
            self._pool = graph.pool()
        self.captures += 1
        return _Graph(graph, static, output, kept, facts)

    def _replay(self, g: _Graph, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        current = torch.cuda.current_stream(self.device)
        if self._last is not None and self._last != current:  # the buffers are free once it is done
            current.wait_stream(self._last)
        self._last = current
        for buf, x in zip(g.inputs, inputs, strict=True):
            buf.copy_(x)
        g.graph.replay()
        self.replays += 1
        return g.output.clone() if g.facts is None else (g.output.clone(), g.facts)


def _split(result) -> tuple[torch.Tensor, object]:
    return result if isinstance(result, tuple) else (result, None)


def _enclosing(fn: Callable) -> Callable:
    """``fn`` with this thread's further graphed calls running as part of it."""
    def call(*inputs):
        _local.within = True
        try:
            return fn(*inputs)
        finally:
            _local.within = False
    return call


def _remember(table: OrderedDict, key: tuple, limit: int, value=None) -> None:
    table[key] = value
    while len(table) > limit:
        table.popitem(last=False)

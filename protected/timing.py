"""Server HE time by operation kind: a backend wrapper the executor evaluates through.

Kinds: matvec (whole products, their rotations included), ctct, rotations, refresh, flooding,
serialization, other. ``section(kind)`` attributes everything inside it to ``kind``: a product
written over the interface (``veil.crypto.linear.matvec``) calls ``rotate`` and
``multiply_plain`` many times, and the report wants the product as one figure.

On a GPU the ops return before their kernels finish, so a kind's wall time can carry the
queued work of earlier ones (2026-11-26, 16 sessions on an H200: once the FFN shuffle's encodes
ran on the device, unsynchronized matvec time rose from 1.43 to 2.40 s while the step got
faster, most likely waiting for those encodes). ``synchronize = True`` (the benchmarks set it;
it reaches every sharer) waits for a CUDA backend's device at every timed boundary: each kind's
figure is then its own, at the price of the overlap between host and device.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict

import torch

from veil.crypto.backend import HEBackend

__all__ = ["TimedBackend"]

_OP_KIND = {
    "multiply": "ctct",
    "relinearize": "ctct",
    "rotate": "rotations",
    "rotate_many": "rotations",
    "mask_for_refresh": "refresh",
    "unmask_refresh": "refresh",
    "rerandomize": "flooding",
    "serialize": "serialization",
    "serialize_folded": "serialization",  # a key switch at level 0 or 1, re-randomization, flooding, rounding
    "serialize_folded_refresh": "serialization",
    "deserialize": "serialization",
}


class TimedBackend:
    """Wraps a backend; accumulates wall seconds per op kind. ``sharing(other)`` gives another
    backend (a session's key set) whose time adds to the same counters."""

    def __init__(self, backend: HEBackend, share: TimedBackend | None = None) -> None:
        self._be = backend
        self.times: dict[str, float] = share.times if share else defaultdict(float)
        self.counts: dict[str, int] = share.counts if share else defaultdict(int)
        self.matvec_by_shape: dict[str, float] = share.matvec_by_shape if share else defaultdict(float)
        self._root = share._root if share else self  # holds ``synchronize`` for every sharer
        self._sync_on = False
        # the open section, per thread, for every sharer: a section's work may run through
        # another sharer (a span's positions as one batch: ``Circuit.matvecs``), whose ops it
        # already times (counted again: benchmarks/results/2026-12-07-ttft-split)
        self._sections = share._sections if share else threading.local()
        device = getattr(backend, "device", None)  # what a wait waits for: a CUDA backend's device
        self._cuda = device if isinstance(device, torch.device) and device.type == "cuda" else None

    @property
    def inner(self) -> HEBackend:
        return self._be

    def sharing(self, backend: HEBackend) -> TimedBackend:
        return TimedBackend(backend, share=self)

    @property
    def _open(self) -> bool:
        """Inside a section (of any sharer, on this thread): inner ops are not counted again."""
        return getattr(self._sections, "open", False)

    @_open.setter
    def _open(self, on: bool) -> None:
        self._sections.open = on

    @property
    def synchronize(self) -> bool:
        return self._root._sync_on

    @synchronize.setter
    def synchronize(self, on: bool) -> None:
        self._root._sync_on = on

    def _now(self) -> float:
        if self._cuda is not None and self._root._sync_on:
            torch.cuda.synchronize(self._cuda)
        return time.perf_counter()

    @contextlib.contextmanager
    def section(self, kind: str, detail: str | None = None):
        """Time the block as one ``kind`` (``detail``: matvec shape, e.g. "576x1536@4")."""
        if self._open:
            yield
            return
        self._open, t = True, self._now()
        try:
            yield
        finally:
            self._open, dt = False, self._now() - t
            self.times[kind] += dt
            self.counts[kind] += 1
            if detail is not None:
                self.matvec_by_shape[detail] += dt

    def run_product(self, matrix, fn, x):
        # not an op of its own: fn's ops are timed (a section: as one), and a replay is their time
        return self._be.run_product(matrix, fn, x)

    def __getattr__(self, name):
        attr = getattr(self._be, name)
        if not callable(attr):
            return attr
        kind = _OP_KIND.get(name, "other")

        def timed(*a, **kw):
            if self._open:
                return attr(*a, **kw)
            t = self._now()
            try:
                return attr(*a, **kw)
            finally:
                self.times[kind] += self._now() - t
                self.counts[name] += 1

        return timed

    def reset(self) -> None:
        self.times.clear()
        self.counts.clear()
        self.matvec_by_shape.clear()

"""FCFS batching of protected steps across sessions: continuous batching, for HE.

One worker thread runs every HE computation of the server (as the single HE lock did before).
It takes the oldest pending step, gathers the pending steps that may share its batch
(``ProtectedExecutor.batch_key``: same kind, layer and span length, in other sessions, at any
positions), waits up to ``max_wait_s`` from the oldest's arrival for sessions standing at the
same step whose message has not come yet, and hands at most ``max_batch`` of them to
``handle_batch``. The head of the queue always goes next, so no step waits behind later ones
(FCFS); a step that may not batch runs alone at once. Each caller gets its own reply or
exception, and the HE seconds of its batch divided by the rows (the batch's cost, shared).
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field

__all__ = ["StepScheduler"]


@dataclass
class _Pending:
    msg: object
    arrived: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    seconds: dict = field(default_factory=dict)
    batch: int = 1


class StepScheduler:
    def __init__(self, executor, max_batch: int = 16, max_wait_s: float = 0.05, compute=None) -> None:
        """``compute(fn)``: where a batch's HE work runs (``ProtectedService``); default here."""
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError("max_batch >= 1 and max_wait_s >= 0")
        self.ex, self.max_batch, self.max_wait_s = executor, max_batch, max_wait_s
        self._compute = compute or (lambda fn: fn())
        self._cv = threading.Condition()
        self._queue: list[_Pending] = []
        self._worker = threading.Thread(target=self._loop, name="veil-he", daemon=True)
        self._worker.start()

    def submit(self, msg) -> tuple[object, dict[str, float], int]:
        """Run ``msg``'s step (blocking): ``(reply, HE seconds by kind, batch size)``; raises the
        step's own exception."""
        p = _Pending(msg)
        with self._cv:
            self._queue.append(p)
            self._cv.notify_all()
        p.done.wait()
        if isinstance(p.result, BaseException):
            raise p.result
        return p.result, p.seconds, p.batch

    def _take(self) -> list[_Pending]:
        """The next batch (called with the lock held, queue non-empty)."""
        while True:
            head = self._queue[0]
            key = self.ex.batch_key(head.msg)
            if key is None:
                self._queue.pop(0)
                return [head]
            mates = [p for p in self._queue if self.ex.batch_key(p.msg) == key][: self.max_batch]
            left = head.arrived + self.max_wait_s - time.monotonic()
            could = min(self.max_batch, self.ex.sessions_at(key))
            if len(mates) >= could or left <= 0:
                for p in mates:
                    self._queue.remove(p)
                return mates
            self._cv.wait(left)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                try:
                    batch = self._take()
                except Exception:  # noqa: BLE001 (a bug guard: the worker must outlive it; the head runs alone)
                    batch = [self._queue.pop(0)]
            before = dict(self.ex.be.times)
            try:
                results = self._compute(functools.partial(self.ex.handle_batch, [p.msg for p in batch]))
            except BaseException as e:  # noqa: BLE001 (handle_batch answers per row; this is a bug guard)
                results = [e] * len(batch)
            spent = {k: (v - before.get(k, 0.0)) / len(batch) for k, v in self.ex.be.times.items()
                     if v != before.get(k, 0.0)}
            for p, r in zip(batch, results, strict=True):
                p.result, p.seconds, p.batch = r, spent, len(batch)
                p.done.set()

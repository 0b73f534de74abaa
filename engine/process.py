"""The engine loop in a process of its own (``veil serve --engine-process``).

In one process the HTTP event loop and the engine loop share one GIL: every chunk the server
streams holds it while the engine waits to launch its next op. On tiny models, whose forward
pass is short as a GPU's is, ``veil serve`` streamed 0.69-0.78x of the engine driven directly,
and the engine loop's host time per step grew from ~1.5 to ~6 ms
(benchmarks/results/2026-12-02-served-vs-direct). Here the ``Engine`` runs unchanged in a child
process with its own interpreter; the server's process holds an ``EngineProcess``, which has
the calls the app makes of an engine (requests, split sessions, their steps) and sends each as
one message on a pipe. The child answers once per step with every token, finish and split-step
output of that step in one message; a reader thread in the server's process runs the callbacks
there, as the engine thread would have. vLLM separates its engine core from its API server the
same way.

What does not cross: ``Engine.call`` (the protected path's native HE on the engine's OpenMP
team), so with an engine process the protected path computes in the server's process
(``server.app._he_compute``).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.multiprocessing as mp

from veil.engine.api import (
    EngineConfig,
    EngineDead,
    SessionClosed,
    StepStats,
    WorkDropped,
    check_request,
)
from veil.engine.model import LlamaModel
from veil.engine.sampling import SamplingParams
from veil.engine.sequence import SeqKind

log = logging.getLogger("veil.engine")

START_TIMEOUT_S = 600.0  # the child imports torch and lays out the model before it answers


@dataclass
class SequenceView:
    """The server process's side of a sequence that lives in the engine process: what the app
    reads of a sequence (``finished``, a split session's ``num_inputs``) and its callbacks."""

    id: int
    kind: SeqKind
    on_token: Callable[[int], None] | None = None
    on_finish: Callable[[str | BaseException], None] | None = None
    on_step_done: Callable[[torch.Tensor | BaseException], None] | None = None
    finished: bool = False
    num_inputs: int = 0
    step_rows: int = 0  # rows of the step in flight, taken back if the engine drops it


class EngineProcess:
    """What ``Engine`` offers the server, with the engine in a child process (module doc)."""

    def __init__(self, model: LlamaModel, k: int, cfg: EngineConfig = EngineConfig(),
                 on_step: Callable[[StepStats], None] | None = None):
        self.cfg, self.model_cfg, self.k, self.on_step = cfg, model.cfg, k, on_step
        self.full_model = model.with_ends and model.first == 0
        self._model = model  # handed to the child at start: its tensors are shared, not copied
        self._views: dict[int, SequenceView] = {}
        self._lock = threading.Lock()  # the views and the pipe's sending end
        self._ids = itertools.count(1)
        self._proc = self._conn = self._reader = None
        self.error: BaseException | None = None
        self.steps = self.num_running = self.num_waiting = self.failed_steps = self.failed_in_a_row = 0
        self.failing = False  # the child's Engine.failing, as of its last counts
        self.kv_utilization = 0.0

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> EngineProcess:
        ctx = mp.get_context("spawn")  # not fork: the parent's threads and OpenMP team do not survive one
        ours, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=self.child_main, args=(theirs, self._model, self.k, self.cfg),
                                 name="veil-engine", daemon=True)
        self._proc.start()
        theirs.close()
        self._conn = ours
        try:
            if not ours.poll(START_TIMEOUT_S):
                self._proc.kill()
                raise EngineDead("the engine process did not start in time")
            kind, detail = ours.recv()
        except (EOFError, OSError):  # it died first; under spawn, a main module without the
            # ``if __name__ == "__main__"`` guard is the usual cause (it is run again in the child)
            self._proc.join(5)
            kind, detail = "failed", f"exit code {self._proc.exitcode}"
        if kind != "ready":
            self.error = EngineDead(f"the engine process failed to start: {detail}")
            raise self.error
        self._reader = threading.Thread(target=self._read, name="veil-engine-reader", daemon=True)
        self._reader.start()
        return self

    def stop(self) -> None:
        if self._proc is None:
            return
        try:
            with self._lock:
                self._send(("stop",))
        except EngineDead:
            pass
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
        if self._reader:
            self._reader.join(timeout=10)

    @staticmethod
    def child_main(conn, model: LlamaModel, k: int, cfg: EngineConfig) -> None:
        """What the child runs (a staticmethod so that a test can wrap it: spawn pickles it by name)."""
        from veil.engine.process_child import serve

        serve(conn, model, k, cfg)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive() and self.error is None

    def _check_alive(self) -> None:
        if self.error is not None or self._conn is None:
            raise EngineDead(f"the engine process is not running: {self.error!r}")

    def _send(self, msg) -> None:
        """Callers hold the lock: messages leave in the order the views change."""
        self._check_alive()
        try:
            self._conn.send(msg)
        except OSError as e:  # the child is gone and the reader has not said so yet
            raise EngineDead(f"the engine process has stopped: {e!r}") from None

    # -- full-model requests ---------------------------------------------------------------------
    def add_request(self, tenant: str, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
                    stop_ids: tuple[int, ...] = (), on_token=None, on_finish=None) -> SequenceView:
        check_request(self.full_model, self.model_cfg.vocab_size, prompt_ids, max_new_tokens)
        view = SequenceView(next(self._ids), SeqKind.TOKENS, on_token, on_finish)
        with self._lock:
            self._send(("add", view.id, tenant, list(prompt_ids), max_new_tokens, sampling, tuple(stop_ids)))
            self._views[view.id] = view
        return view

    def abort(self, view: SequenceView) -> None:
        forgotten, _ = self._forget(view, "abort")
        if forgotten and view.on_finish:
            view.on_finish("abort")

    def _forget(self, view: SequenceView, op: str) -> tuple[bool, Callable | None]:
        """Abort or close: the view is finished here at once (what the child still sends for it
        is dropped) and the child told. Returns whether it was still open, and the waiter of a
        split step in flight (taken under the lock the reader takes), if any."""
        with self._lock:
            if view.finished:
                return False, None
            view.finished = True
            self._views.pop(view.id, None)
            done, view.on_step_done = view.on_step_done, None
            try:
                self._send((op, view.id))
            except EngineDead:
                pass  # nothing left to free
        return True, done

    # -- split sessions --------------------------------------------------------------------------
    def open_hidden(self, tenant: str) -> SequenceView:
        view = SequenceView(next(self._ids), SeqKind.HIDDEN)
        with self._lock:
            self._send(("open", view.id, tenant))
            self._views[view.id] = view
        return view

    def submit_hidden(self, view: SequenceView, rows: torch.Tensor, on_done: Callable) -> None:
        """Append a client step's input rows [T, d]; on_done(outputs [T, d] | exception)."""
        with self._lock:
            self._check_alive()
            if view.finished or view.on_step_done is not None:
                raise RuntimeError("the session is closed or has a step in flight")
            self._send(("hidden", view.id, rows.detach().cpu().contiguous().numpy()))
            view.on_step_done, view.step_rows = on_done, rows.shape[0]
            view.num_inputs += rows.shape[0]

    def close(self, view: SequenceView) -> None:
        _, done = self._forget(view, "close")
        if done:  # the step in flight will never complete: tell its waiter
            done(SessionClosed("the session was closed"))

    # -- what the child sends --------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                msg = self._conn.recv()
                if msg[0] == "dead":
                    raise EngineDead(msg[1])
                if msg[0] == "counts":
                    (self.num_running, self.num_waiting, self.kv_utilization, self.failed_steps,
                     self.failing, self.failed_in_a_row) = msg[1:]
                else:
                    self._deliver(msg[1], msg[2])
        except (EOFError, OSError):
            self._die(EngineDead("the engine process ended"))
        except EngineDead as e:
            self._die(e)
        except BaseException as e:  # a callback of ours failed: as fatal as in the engine thread
            log.exception("engine reader crashed")
            self._die(EngineDead(f"the engine reader has stopped: {e!r}"))

    def _deliver(self, events: list, stats) -> None:
        for sid, kind, value in events:
            done = None
            with self._lock:
                view = self._views.get(sid)
                if view is None:  # aborted or closed here since
                    continue
                if kind == "fin":
                    view.finished = True
                    del self._views[sid]
                elif kind == "step":
                    done, view.on_step_done = view.on_step_done, None
                    if isinstance(value, WorkDropped):  # the engine took the step back whole
                        view.num_inputs -= view.step_rows
            if kind == "tok":
                if view.on_token:
                    view.on_token(value)
            elif kind == "fin":
                if view.on_finish:
                    view.on_finish(value)
            elif done is not None:
                done(torch.from_numpy(value) if isinstance(value, np.ndarray) else value)
        if stats is not None:
            self.steps += 1
            if self.on_step:
                self.on_step(stats)

    def _die(self, error: EngineDead) -> None:
        with self._lock:
            self.error = error
            views, self._views = list(self._views.values()), {}
        for view in views:
            view.finished = True
            if view.kind is SeqKind.TOKENS and view.on_finish:
                view.on_finish(error)
            elif view.on_step_done:
                done, view.on_step_done = view.on_step_done, None
                done(error)

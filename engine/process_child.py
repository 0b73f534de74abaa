"""The engine process's side of ``EngineProcess`` (engine/process.py): it runs the ``Engine`` as
it is, applies the server process's commands to it, and sends back, in order, what the engine's
callbacks report: once per step (its tokens, finishes and split-step outputs in one message),
and whatever a command or an out-of-memory step caused within a poll interval.

Messages from the server's process: ("add", id, tenant, prompt ids, max new tokens, sampling,
stop ids), ("abort", id), ("open", id, tenant), ("hidden", id, rows), ("close", id), ("stop",).
To it: ("ready", None) | ("failed", why) once, then ("events", [(id, "tok" | "fin" | "step",
value), ...], StepStats | None), ("counts", running, waiting, kv utilization, failed steps) and, if the loop
dies, ("dead", why).
"""

from __future__ import annotations

import threading
import time
from collections import deque

import torch

from veil.engine.api import EngineConfig, EngineDead, SessionClosed, StepStats, WorkDropped
from veil.engine.engine import Engine
from veil.engine.model import LlamaModel

_POLL_S = 0.01  # how often the child looks for events no step end has sent (a command's, an OOM's)
_COUNT_EVERY_S = 0.5  # how often the child sends /metrics' counts (a count walks every sequence)


def _portable(reason):
    """A finish reason or an error as it can cross the pipe: the engine's own errors as they
    are, any other exception (a crashed loop's) as EngineDead naming it."""
    if isinstance(reason, (str, WorkDropped, SessionClosed, EngineDead)):
        return reason
    return EngineDead(f"the engine loop has stopped: {reason!r}")


def serve(conn, model: LlamaModel, k: int, cfg: EngineConfig) -> None:
    """The engine process's main: until "stop", the pipe closing, or the engine loop dying."""
    torch.set_num_threads(1)  # the loop thread sets its own (EngineConfig.threads): one team only
    events: deque = deque()  # appended by the engine thread's callbacks and by the commands below
    send_lock = threading.Lock()
    engine: Engine | None = None

    def flush(stats=None) -> None:
        with send_lock:  # one sender at a time, and events leave in the order they happened
            batch = []
            while events:
                batch.append(events.popleft())
            if batch or stats is not None:
                conn.send(("events", batch, stats))

    def on_step(s: StepStats) -> None:
        flush(s)

    try:
        engine = Engine(model, k, cfg, on_step=on_step).start()
    except BaseException as e:  # noqa: BLE001 (reported to the parent, which raises it)
        conn.send(("failed", repr(e)))
        return
    conn.send(("ready", None))
    seqs: dict = {}
    next_count = 0.0
    try:
        while engine.alive:
            if conn.poll(_POLL_S):
                msg = conn.recv()
                if msg[0] == "stop":
                    break
                _apply(engine, seqs, events, msg)
            flush()
            if time.monotonic() >= next_count:  # on the loop thread: the scheduler is its own
                next_count = time.monotonic() + _COUNT_EVERY_S
                try:
                    counts = engine.call(lambda: (engine.num_running, engine.num_waiting, engine.kv_utilization,
                                                  engine.failed_steps, engine.failing, engine.failed_in_a_row))
                except EngineDead:
                    continue  # the loop's condition sends "dead"
                with send_lock:
                    conn.send(("counts", *counts))
        else:
            flush()
            conn.send(("dead", f"the engine loop has stopped: {engine.error!r}"))
    except (EOFError, OSError):  # the server's process is gone
        pass
    finally:
        engine.stop()


def _apply(engine: Engine, seqs: dict, events: deque, msg) -> None:
    """One command from the server's process. A refused one answers with its error as the
    sequence's finish (a request) or step result (a split step), as the engine would have."""
    op, sid = msg[0], msg[1]
    if op == "add":
        tenant, prompt, max_new, sampling, stop_ids = msg[2:]

        def finished(reason, sid=sid):
            seqs.pop(sid, None)
            events.append((sid, "fin", _portable(reason)))
        try:
            seqs[sid] = engine.add_request(tenant, prompt, max_new, sampling, stop_ids,
                                           on_token=lambda t, sid=sid: events.append((sid, "tok", t)),
                                           on_finish=finished)
        except Exception as e:  # noqa: BLE001
            events.append((sid, "fin", _portable(e)))
    elif op == "open":
        try:
            seqs[sid] = engine.open_hidden(msg[2])
        except Exception:  # noqa: BLE001 (the loop is dead: the parent learns it from "dead")
            pass
    elif op == "hidden":
        def done(result, sid=sid):
            events.append((sid, "step", result.numpy() if isinstance(result, torch.Tensor) else _portable(result)))
        try:
            engine.submit_hidden(seqs[sid], torch.from_numpy(msg[2]), done)
        except Exception as e:  # noqa: BLE001
            events.append((sid, "step", _portable(e)))
    elif (seq := seqs.pop(sid, None)) is not None:  # "abort" | "close"
        (engine.abort if op == "abort" else engine.close)(seq)

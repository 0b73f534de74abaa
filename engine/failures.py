"""What the engine does when a step or a callback raises, and what it counts of that.

A bug one input meets must not give every tenant 503 (docs/ARCHITECTURE.md): a step that raises
fails sequences, not the loop (``step_failed`` says which), and a callback that raises ends its
own sequence (``receiver_failed``).

An engine whose loop runs but whose every step fails (a kernel, a device or weights broken for
every input) serves no one all the same, and ``/health`` must say so: ``failing`` holds once
``EngineConfig.failing_after_steps`` steps in a row have failed, none completing in between, the
latest less than ``failing_for_s`` ago. One tenant's bad input fails its own step, run alone,
while the rest of the work completes, so it breaks no run unless it is all the work there is;
and a run with no failure for ``failing_for_s`` stops counting, so that a replica a balancer took
out of rotation is tried again (out of device memory counts neither way: it is the device being
full, answered 503 per request).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from veil.engine.api import DeviceOutOfMemory, EngineConfig, StepFailed
from veil.engine.scheduler import Chunk, Scheduler
from veil.engine.sequence import SeqKind, Sequence

log = logging.getLogger("veil.engine")


class StepFailures:
    """The engine's failure handling; its methods run with the engine's lock held (``failing``, a
    read, from any thread)."""

    def __init__(self, cfg: EngineConfig, scheduler: Scheduler, finish: Callable[[Sequence, object], None]):
        self.cfg, self.scheduler, self.finish = cfg, scheduler, finish
        self.cuda = torch.device(cfg.device).type == "cuda"
        self.steps = 0  # steps whose sequences failed (out of memory aside); the loop went on
        self.in_a_row = 0  # of them, since the last step that completed
        self.last = 0.0  # time.monotonic() of the latest

    @property
    def failing(self) -> bool:
        """Every step of a run of ``failing_after_steps`` or more failed, the latest recently (module doc)."""
        return (self.in_a_row >= self.cfg.failing_after_steps
                and time.monotonic() - self.last < self.cfg.failing_for_s)

    def completed(self) -> None:
        self.in_a_row = 0

    def step_failed(self, chunks: list[Chunk], error: Exception, advanced: bool = True, ran: bool = False) -> None:
        """A step that raised preparing, launching (``advanced``: what ``Scheduler.advance`` did
        is taken back) or finishing (``ran``):
        * Out of device memory before it ran: one sequence fails with DeviceOutOfMemory, the one
          with the step's largest chunk (the newest among equals: the likeliest cause, and the one
          that waited least); the rest run again from the next step, so a device that stays full
          empties the batch rather than spinning.
        * Anything else before it ran (a bug some input met), with more than one sequence: none
          fails yet. Each runs again alone (``Scheduler.suspects``), so that only those whose own
          step raises fail, with StepFailed.
        * Any failure finishing (the results are lost, and on CUDA the next step already reads
          them), or of a sequence alone: its sequences fail with StepFailed.
        A request ends; a split session's client step is taken back whole (its rows, its outputs
        so far) and the session stays open. A CUDA device left unusable still stops the loop."""
        oom = isinstance(error, torch.OutOfMemoryError) and not ran
        if self.cuda and not oom:
            torch.cuda.synchronize()  # a sticky CUDA error raises here, out of the loop
        if advanced and not ran:
            self.scheduler.undo(chunks)
        live = [c for c in chunks if not c.seq.finished]
        if oom:
            live = [max(live, key=lambda c: (c.length, c.seq.arrival))] if live else []
            failure = DeviceOutOfMemory(f"the device ran out of memory running a step of {len(chunks)} "
                                        f"sequences; this one's work was dropped, retry it")
            log.warning("out of device memory: dropping %d of a %d-sequence step", len(live), len(chunks))
            if self.cuda:
                torch.cuda.empty_cache()  # what the failed launch left cached, back to the pool
        else:
            self.steps += 1
            self.in_a_row += 1
            self.last = time.monotonic()
            if not ran and len(live) > 1:
                log.error("a step of %d sequences failed; each runs again alone", len(live), exc_info=error)
                self.scheduler.suspects.update(c.seq.id for c in live)
                return
            failure = StepFailed(f"the engine failed running a step of this work ({type(error).__name__}; "
                                 f"the server log says more)")
            log.error("a step of %d sequences failed; they fail, the engine goes on", len(live), exc_info=error)
        for c in live:
            self.scheduler.suspects.discard(c.seq.id)
            try:
                if c.seq.kind is SeqKind.HIDDEN and c.seq.on_step_done is not None:
                    c.seq.take_back_step()(failure)
                else:  # a request, or a session recomputing after a preemption with no step to take back
                    self.finish(c.seq, failure)
            except Exception as e:  # noqa: BLE001
                self.receiver_failed(c.seq, e)

    def receiver_failed(self, seq: Sequence, error: Exception) -> None:
        """A callback of ``seq`` (its tokens', its finish's or its split step's receiver: the
        server's hop onto its event loop, the engine process's pipe, a library user's function)
        raised on the loop thread. That sequence ends, with StepFailed where it still had a
        finish to hear; the loop and every other sequence go on (a bug in one receiver must not
        give every tenant 503)."""
        log.error("a callback of sequence %d raised; it ends, the engine goes on", seq.id, exc_info=error)
        if seq.finished:
            return
        try:
            self.finish(seq, StepFailed(f"the engine could not hand this work's results back "
                                        f"({type(error).__name__}; the server log says more)"))
        except Exception:  # noqa: BLE001 (its finish's receiver raised too: nothing more to tell it)
            log.exception("the finish callback of sequence %d raised as well", seq.id)

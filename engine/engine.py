"""The engine loop: one thread that repeatedly schedules a batch, runs it, and hands results
back. Everything else (HTTP handlers, tests, benchmarks) talks to it through thread-safe calls
that enqueue work and register callbacks; callbacks run on the engine thread and must be quick
(the server's just hop onto its event loop).

On CUDA the loop keeps one step in flight (``EngineConfig.overlap``): it prepares and launches
step n+1, whose decodes read the tokens step n is still sampling on the device, before it waits
for step n's tokens and runs their callbacks, so the host work of a step overlaps the GPU work
of the one before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from veil.engine.api import EngineConfig, EngineDead, SessionClosed, StepStats, check_request
from veil.engine.failures import StepFailures
from veil.engine.kv_cache import PagedKVCache
from veil.engine.model import LlamaModel
from veil.engine.model_runner import ModelRunner, PreparedBatch, StepHandle
from veil.engine.sampling import SamplingParams
from veil.engine.scheduler import Chunk, Scheduler, SchedulerConfig
from veil.engine.sequence import PENDING, SeqKind, Sequence
from veil.kernels import ops

log = logging.getLogger("veil.engine")


class Engine:
    def __init__(self, model: LlamaModel, k: int, cfg: EngineConfig = EngineConfig(),
                 server_secret: bytes | None = None, on_step: Callable[[StepStats], None] | None = None):
        mcfg = model.cfg
        # The KV cache (and the attention over it) follows the weights where bf16 is fast (CUDA,
        # CPUs with AMX-BF16, or with AVX512-BF16 under the C kernels: ops.bf16_is_fast).
        # Elsewhere on CPU it stays fp32 whatever the weights: torch's CPU attention is there
        # several times slower in bf16, and converting the gathered context every layer costs
        # more than the doubled cache memory.
        weights = next(model.parameters()).dtype
        dtype = weights if ops.bf16_is_fast(cfg.device) else torch.float32
        num_layers = model.last - model.first
        per_block = PagedKVCache.bytes_per_token(num_layers, mcfg.num_kv_heads, mcfg.head_dim, dtype) * cfg.block_size
        num_blocks = max(1, cfg.kv_cache_bytes // per_block)
        self.cfg, self.model_cfg, self.k = cfg, mcfg, k
        self.cache = PagedKVCache(num_layers, num_blocks, cfg.block_size, mcfg.num_kv_heads, mcfg.head_dim,
                                  dtype, cfg.device, server_secret)
        self.scheduler = Scheduler(SchedulerConfig(cfg.max_tokens_per_step, cfg.max_seqs_per_step), self.cache)
        self.runner = ModelRunner(model, k, self.cache, cfg.device,
                                  cuda_graph_batch=cfg.max_seqs_per_step if cfg.cuda_graphs else 0)
        self.full_model = self.runner.has_ends
        self.overlap = cfg.overlap if cfg.overlap is not None else torch.device(cfg.device).type == "cuda"
        self.on_step = on_step
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._calls: deque[tuple[Callable, Future]] = deque()
        self.error: BaseException | None = None
        self.steps = 0
        self.failures = StepFailures(cfg, self.scheduler, self._finish)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._loop, name="veil-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread:
            self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    # what /metrics and /health read of the engine (EngineProcess has the same)
    @property
    def failed_steps(self) -> int:
        return self.failures.steps

    @property
    def failing(self) -> bool:
        return self.failures.failing

    @property
    def failed_in_a_row(self) -> int:
        return self.failures.in_a_row

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def kv_utilization(self) -> float:
        return self.cache.utilization

    def _check_alive(self) -> None:
        if self.error is not None or (self._thread is not None and not self._thread.is_alive()):
            raise EngineDead(f"the engine loop has stopped: {self.error!r}")

    # -- work of other components on the loop thread --------------------------------------------
    def call(self, fn: Callable):
        """Run ``fn()`` on the loop thread, between two steps, and return its result (or raise
        its exception). For other CPU work that uses torch's intra-op threads (the protected
        path's native HE): the loop thread owns the process's OpenMP team (``EngineConfig.threads``),
        and a second thread's team made a native rotation 2.1x slower than on the one team,
        slower even than on one thread (benchmarks/results/2026-11-26-he-thread). Calls and
        steps alternate while both wait."""
        if threading.current_thread() is self._thread:
            return fn()
        fut: Future = Future()
        with self._cv:
            self._check_alive()
            if self._thread is None or self._stop:
                raise EngineDead("the engine loop is not running")
            self._calls.append((fn, fut))
            self._cv.notify()
        return fut.result()

    def _fail_calls(self, error: BaseException) -> None:
        """With the lock held: every queued call raises ``error`` in its caller."""
        while self._calls:
            self._calls.popleft()[1].set_exception(error)

    # -- full-model requests ---------------------------------------------------------------------
    def add_request(self, tenant: str, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
                    stop_ids: tuple[int, ...] = (), on_token=None, on_finish=None) -> Sequence:
        check_request(self.full_model, self.model_cfg.vocab_size, prompt_ids, max_new_tokens)
        seq = Sequence.tokens(tenant, prompt_ids, max_new_tokens, sampling, stop_ids, on_token, on_finish)
        with self._cv:
            self._check_alive()
            self.scheduler.add(seq)
            self._cv.notify()
        return seq

    def abort(self, seq: Sequence) -> None:
        with self._cv:
            if not seq.finished:
                self._finish(seq, "abort")

    # -- split sessions --------------------------------------------------------------------------
    def open_hidden(self, tenant: str) -> Sequence:
        seq = Sequence.hidden(tenant)
        with self._cv:
            self._check_alive()
            self.scheduler.add(seq)
        return seq

    def submit_hidden(self, seq: Sequence, rows: torch.Tensor, on_done: Callable) -> None:
        """Append a client step's input rows [T, d]; on_done(outputs [T, d] | exception)."""
        with self._cv:
            self._check_alive()
            # A session preempted while idle still has positions to recompute (num_computed <
            # num_hidden) but no step in flight: its next step is accepted, the recompute runs first.
            if seq.finished or seq.on_step_done is not None:
                raise RuntimeError("the session is closed or has a step in flight")
            seq.hidden_rows.append(rows)
            seq.step_start, seq.num_hidden = seq.num_hidden, seq.num_hidden + rows.shape[0]
            seq.on_step_done = on_done
            self._cv.notify()

    def close(self, seq: Sequence) -> None:
        """End a split session and free its blocks."""
        with self._cv:
            if not seq.finished:
                self._finish(seq, "closed")

    # -- the loop --------------------------------------------------------------------------------
    def _finish(self, seq: Sequence, reason) -> None:
        seq.finished = True
        while seq.token_ids and seq.token_ids[-1] == PENDING:  # drawn by steps in flight: never delivered
            seq.token_ids.pop()
        self.scheduler.remove(seq)
        self.runner.release(seq.id)
        if seq.kind is SeqKind.TOKENS:
            if seq.on_finish:
                seq.on_finish(reason)
        elif seq.on_step_done:  # a step in flight will never complete: tell its waiter
            done, seq.on_step_done = seq.on_step_done, None
            done(reason if isinstance(reason, BaseException) else SessionClosed("the session was closed"))

    def _loop(self) -> None:
        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)  # this thread's team; the caller's stays at 1
        last_was_call = False
        flight: _Step | None = None  # the launched step not finished yet (overlap only)
        try:
            while True:
                with self._cv:
                    while not (self._stop or self.scheduler.has_work() or self._calls or flight):
                        self._cv.wait()
                    if self._stop:
                        self._fail_calls(EngineDead("the engine loop has stopped"))
                        return
                    # a queued call runs unless the previous turn ran one and a step waits
                    turn = self._calls and not (last_was_call and self.scheduler.has_work())
                    call = self._calls.popleft() if turn else None
                    step = None
                    if call is None:
                        t_host = time.perf_counter()
                        chunks = self.scheduler.schedule()
                        # token chunks first (they also run layers [0, k)), within each kind decode
                        # chunks first (their rows form one run for the decode kernel); stable otherwise
                        chunks.sort(key=lambda c: (c.seq.kind is not SeqKind.TOKENS, c.length != 1))
                        try:
                            step = self._prepare(chunks, flight) if chunks else None
                        except Exception as e:  # noqa: BLE001 (e.g. out of memory copying the block tables)
                            self.failures.step_failed(chunks, e, advanced=False)
                        if step is not None:
                            step.host_seconds = time.perf_counter() - t_host
                last_was_call = call is not None
                if step is not None:
                    t0 = time.perf_counter()
                    try:
                        step.handle = self.runner.launch(step.batch, flight.handle if flight else None)
                        step.seconds = time.perf_counter() - t0
                    except Exception as e:  # noqa: BLE001 (that step's sequences fail, not the loop)
                        with self._cv:
                            self.failures.step_failed(step.chunks, e)
                        step = None
                if flight is not None:  # its results come back while the step just launched runs
                    self._complete(flight)
                    flight = None
                if step is not None:
                    if self.overlap:
                        flight = step
                    else:
                        self._complete(step)
                if call is not None:
                    fn, fut = call
                    try:
                        fut.set_result(fn())
                    except BaseException as e:  # noqa: BLE001 (the caller's exception, raised by the caller)
                        fut.set_exception(e)
                    continue
                if step is None and flight is None:
                    time.sleep(0.001)
        except BaseException as e:  # the loop is dead: fail everything that waits on it
            log.exception("engine loop crashed")
            self.error = e
            with self._cv:
                self._fail_calls(EngineDead(f"the engine loop has stopped: {e!r}"))
                for seq in list(self.scheduler.seqs.values()):
                    try:
                        self._finish(seq, e)
                    except Exception:
                        log.exception("callback failed while failing sequence %d", seq.id)

    def _prepare(self, chunks: list[Chunk], flight: _Step | None) -> _Step:
        """With the lock held: the step's batch, its sequences then advanced as if it had run
        (``Scheduler.advance``), so that the next step can be scheduled before its results."""
        batch = self.runner.prepare(chunks, flight.handle if flight else None)
        alone = len(chunks) == 1 and chunks[0].seq.id in self.scheduler.suspects
        return _Step(chunks, self.scheduler.advance(chunks), batch, suspect=alone)

    def _complete(self, step: _Step) -> None:
        """Wait for a launched step and hand its results back."""
        t0 = time.perf_counter()
        try:
            tokens, hidden = self.runner.finish(step.handle)
        except Exception as e:  # noqa: BLE001 (nothing of it was handed back: its sequences fail)
            with self._cv:
                self.failures.step_failed(step.chunks, e, ran=True)
            return
        t1 = time.perf_counter()
        seconds = step.seconds + t1 - t0
        with self._cv:
            for seq, e in self.scheduler.postprocess(step.chunks, step.epochs, tokens, hidden, self._finish):
                self.failures.receiver_failed(seq, e)
            if step.suspect:  # it ran alone without raising: it batches again
                self.scheduler.suspects.discard(step.chunks[0].seq.id)
            self.failures.completed()
        host_seconds = step.host_seconds + time.perf_counter() - t1
        self.steps += 1
        if self.on_step:
            chunks = step.chunks
            try:
                self.on_step(StepStats(len(chunks), sum(c.length for c in chunks), sum(c.length == 1 for c in chunks),
                                       seconds, self.cache.utilization, host_seconds))
            except Exception:  # noqa: BLE001 (a statistics receiver's bug: the step's work is handed back already)
                log.exception("the on_step callback raised; the engine goes on")


@dataclass
class _Step:
    """A scheduled step: its chunks, each sequence's preemption count when it was prepared, the
    batch, the seconds spent scheduling and preparing it, and once launched the runner's handle
    and the launch's seconds."""

    chunks: list[Chunk]
    epochs: list[int]
    batch: PreparedBatch
    handle: StepHandle | None = None
    seconds: float = 0.0
    host_seconds: float = 0.0
    suspect: bool = False  # a sequence of a step that raised, running alone (StepFailures.step_failed)

"""What the engine offers its callers, whether it runs in the server's process (``engine.py``) or
in one of its own (``process.py``): its configuration, the figures of each step, its errors, and
the checks a request passes before it reaches the loop.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16
    kv_cache_bytes: int = 2 << 30  # memory budget of the paged KV pool
    max_tokens_per_step: int = 512
    max_seqs_per_step: int = 64
    device: str = "cpu"
    # CUDA only: capture the full-model decode step as CUDA graphs for batches up to
    # max_seqs_per_step (at engine creation); False runs every step eagerly.
    cuda_graphs: bool = True
    # CPU intra-op threads of the engine loop, set by the loop thread itself; 0 leaves torch's.
    # The loop must own the process's only OpenMP team: a second team (the caller's, left by
    # loading the model with several threads) outnumbers the cores, libgomp then wakes its
    # workers by futex at every parallel op, and the loop's small ops ran ~10x slower
    # (benchmarks/results/2026-11-26-cpu-fastpath). So callers stay at torch.set_num_threads(1)
    # from before loading the model and give the engine its threads here.
    threads: int = 0
    # Overlap each step's host work (scheduling, preparing, postprocessing) with the previous
    # step's device work: the next decode reads its input token on the device, and a sequence
    # that stops runs one step more, discarded. None: on CUDA only (the CPU computes as it
    # launches, so there is nothing to overlap).
    overlap: bool | None = None
    # /health says the engine is failing (503 engine_failing) while this many steps in a row have
    # failed, none completing between, the latest less than failing_for_s ago (engine/failures.py)
    failing_after_steps: int = 8
    failing_for_s: float = 60.0


@dataclass
class StepStats:
    num_seqs: int
    num_tokens: int
    num_decode: int
    seconds: float  # launching the step and waiting for its results
    kv_utilization: float
    host_seconds: float = 0.0  # scheduling, preparing and postprocessing it (the loop's own work)


class EngineDead(RuntimeError):
    pass


class SessionClosed(RuntimeError):
    pass


class WorkDropped(RuntimeError):
    """The engine dropped this work and goes on: a request ended with it, a split session's
    client step was taken back whole (the session as before that step, to be sent again)."""


class DeviceOutOfMemory(WorkDropped):
    """The device ran out of memory running the step that held this work."""


class StepFailed(WorkDropped):
    """This work's own step raised something other than out-of-memory (a bug some input met,
    most likely); ``StepFailures.step_failed`` (engine/failures.py) says how it was told from the rest of its batch."""


def check_request(full_model: bool, vocab_size: int, prompt_ids: list[int], max_new_tokens: int) -> None:
    """What a full-model request must be before it reaches the loop (Engine and EngineProcess)."""
    if not full_model:
        raise RuntimeError("this engine holds only the server half of the model")
    if not prompt_ids or max_new_tokens < 1:
        raise ValueError("a request needs a prompt and at least one new token")
    if not 0 <= min(prompt_ids) <= max(prompt_ids) < vocab_size:
        # checked here, not in the step: an id outside the embedding would end the loop
        raise ValueError(f"prompt token ids must lie in [0, {vocab_size})")

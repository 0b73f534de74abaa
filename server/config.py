"""Server settings: one dataclass, filled from the CLI (`veil serve`) or by tests. Its field
defaults are the only defaults: the CLI, the engine, the protected service and its executor
all take their values from here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from veil.crypto.backend import resolve_backend
from veil.engine.api import EngineConfig
from veil.protected.server import Limits


@dataclass
class ServerConfig:
    tenants_file: Path | None = None
    k: int = 2  # split point; ignored when a server bundle is given (the bundle says)
    bundle: Path | None = None  # server bundle dir; None → the whole embedded model (fast path on)
    model: str | None = None  # a .gguf or HF checkpoint dir instead of the default
    session_ttl_s: float = 600.0  # idle sessions are dropped after this long
    # where a session limit or the protected KV cache's total is reached, a session idle this
    # long gives its place up (least recently used first; its client opens a new one on its
    # next turn); None: 429
    session_evict_idle_s: float | None = 60.0
    sweep_interval_s: float = 5.0
    max_body_bytes: int = 64 << 20  # largest split or protected step body (413 above)
    # largest JSON body (completions, chat, session creation; 413 above), checked before it is
    # parsed, so before its key: a prompt that fits max_context tokens needs far less (8,192
    # tokens of the shipped vocabulary's longest, 81 characters, JSON-escaped: ~4 MB)
    max_json_body_bytes: int = 4 << 20
    max_sessions_per_tenant: int = 64
    max_context: int = 8192  # tokens per session or request (prompt + output)
    max_step_tokens: int = 4096  # tokens in one split step
    # protected path (CKKS)
    he_backend: str = "auto"  # the server's HE backend; "auto": native where its kernels run, else seal (resolve_backend)
    max_key_bytes: int = 1 << 30  # largest evaluation-key upload (the Galois keys are ~410 MB)
    # request bodies held at once (steps and key uploads, from their first byte until answered),
    # per tenant and in all (429 server_busy above); a tenant's must hold its largest upload
    max_arriving_bytes_per_tenant: int = 2 << 30
    max_arriving_bytes: int = 4 << 30
    max_key_bytes_per_tenant: int = 2 << 30
    max_key_bytes_total: int = 8 << 30
    # a key set no session has used for this long is dropped (its client uploads it again on its
    # next session, 404 keys_not_found); an upload over a limit first drops the tenant's own
    # unused sets, least recently used first
    key_ttl_s: float = 3600.0
    max_protected_sessions: int = 8  # concurrent protected sessions on this server
    max_protected_kv_bytes: int = 4 << 30  # encrypted KV cache of one protected session
    max_protected_kv_bytes_total: int = 16 << 30  # encrypted KV cache of all protected sessions
    max_protected_context: int = 512  # positions of one protected session (the layouts' limit)
    protected_max_batch: int = 16  # steps of different sessions evaluated as one (native backend)
    protected_batch_wait_ms: float = 50.0  # how long the oldest step waits for sessions at the same step
    # what the protected path may hold on its device: encoded weights, imported keys and the
    # shuffled FFN of the steps in flight (a key upload or a step beyond it: 429)
    protected_device_bytes: int | None = None
    protected_warmup: bool = False  # encode the protected weights at start, not when the first session opens
    # engine: its own dataclass holds the defaults
    kv_cache_bytes: int = EngineConfig.kv_cache_bytes  # the paged KV pool's memory budget
    block_size: int = EngineConfig.block_size
    max_tokens_per_step: int = EngineConfig.max_tokens_per_step  # token budget of one engine iteration
    # sequences of one engine iteration (and the largest CUDA-graph batch); None → 256 on CUDA,
    # where a step of 256 decodes costs about what one of 64 does, else EngineConfig's 64
    max_seqs_per_step: int | None = None
    device: str = EngineConfig.device  # the engine's device ("cpu" | "cuda"): fast path and split sessions
    threads: int = EngineConfig.threads  # the engine loop's torch threads (0: torch's setting)
    # the engine loop in a process of its own (engine/process.py), so that it and the HTTP event
    # loop do not share one GIL; the protected path then computes in the server's process
    engine_process: bool = False
    dtype: str | None = None  # weights; None → bfloat16 on CUDA, float32 on CPU (KV: Engine, ops.bf16_is_fast)

    def __post_init__(self) -> None:
        if self.session_evict_idle_s is not None and self.session_evict_idle_s < 1.0:
            # below a second, sessions in the middle of a generation (between two round trips) would go
            raise ValueError(f"session_evict_idle_s must be at least 1 s (or None), not {self.session_evict_idle_s}")
        if not max(self.max_body_bytes, self.max_key_bytes) <= self.max_arriving_bytes_per_tenant <= self.max_arriving_bytes:
            raise ValueError("need max_body_bytes and max_key_bytes <= max_arriving_bytes_per_tenant <= max_arriving_bytes")
        self.he_backend = resolve_backend(self.he_backend, self.device)  # /health and the client see the real one

    @property
    def model_dtype(self) -> str:
        # CPU: fp32, the dtype the accuracy figures are measured in (the split path then matches
        # transformers token for token). Where the CPU has bf16 dot products --dtype bfloat16 is
        # much faster on the must-show workload: 1.9x with AMX-BF16
        # (benchmarks/results/2026-11-26-cpu-fastpath), ~2x on an EPYC with AVX512-BF16
        # (benchmarks/results/2026-12-02-epyc-fastpath, 2026-12-03-fp32-prepack), at 0.90-0.98
        # greedy agreement.
        return self.dtype or ("bfloat16" if self.device.startswith("cuda") else "float32")

    @property
    def he_native_on_cpu(self) -> bool:
        """The protected path's HE is the native backend computing on the CPU: its torch ops then
        share the engine loop's OpenMP team (``app._he_compute``) and its large blocks come from
        the kept heap (``kernels/heap``, grown at ``--protected-warmup``)."""
        return self.he_backend == "native" and self.device.split(":")[0] == "cpu"

    def engine_config(self) -> EngineConfig:
        seqs = self.max_seqs_per_step or (256 if self.device.startswith("cuda") else EngineConfig.max_seqs_per_step)
        return EngineConfig(self.block_size, self.kv_cache_bytes, self.max_tokens_per_step, seqs,
                            self.device, threads=self.threads)

    def protected_limits(self) -> Limits:
        return Limits(self.max_protected_context, self.max_protected_kv_bytes, self.max_protected_kv_bytes_total,
                      self.protected_device_bytes)

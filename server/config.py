"""Server settings: one dataclass, filled from the CLI (`veil serve`) or by tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ServerConfig:
    tenants_file: Path | None = None
    k: int = 2  # split point; ignored when a server bundle is given (the bundle says)
    bundle: Path | None = None  # server bundle dir; None → split the embedded model in memory
    model: str | None = None  # a .gguf or HF checkpoint dir to split instead of the default
    session_ttl_s: float = 600.0  # idle sessions are dropped after this long
    sweep_interval_s: float = 5.0
    max_body_bytes: int = 64 << 20  # largest step body accepted (413 above)
    max_sessions_per_tenant: int = 64
    max_context: int = 8192  # tokens per session (KV cache length)
    max_step_tokens: int = 4096  # tokens in one step

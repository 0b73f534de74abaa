"""Sessions: one conversation of one tenant on one path, owning its server-side state.

Session ids are 192-bit random strings and are looked up together with the tenant that made
them, so another tenant's id is indistinguishable from an unknown one (both 404). Idle
sessions expire after the configured TTL; a sweeper drops them and their KV state.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field

from veil.engine.model import LayerKV


@dataclass
class Session:
    id: str
    tenant: str
    path: str  # "plaintext" | "protected"
    created: float
    last_used: float
    next_step: int = 1  # the step id the next message must carry
    kv: list[LayerKV | None] = field(default_factory=list)  # one per server layer
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False

    @property
    def context_len(self) -> int:
        first = self.kv[0] if self.kv else None
        return first.length if first is not None else 0

    def kv_bytes(self) -> int:
        return sum(kv.nbytes() for kv in self.kv if kv is not None)


class SessionStore:
    def __init__(self, ttl_s: float, max_per_tenant: int, num_layers: int):
        self.ttl_s, self.max_per_tenant, self.num_layers = ttl_s, max_per_tenant, num_layers
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, tenant: str, path: str) -> Session:
        now = time.monotonic()
        with self._lock:
            if sum(s.tenant == tenant for s in self._sessions.values()) >= self.max_per_tenant:
                raise OverflowError(f"tenant has {self.max_per_tenant} sessions (max_sessions_per_tenant)")
            s = Session(secrets.token_urlsafe(24), tenant, path, now, now, kv=[None] * self.num_layers)
            self._sessions[s.id] = s
        return s

    def get(self, sid: str, tenant: str) -> Session | None:
        with self._lock:
            s = self._sessions.get(sid)
        if s is None or s.tenant != tenant or s.closed:
            return None
        return s

    def delete(self, sid: str, tenant: str) -> bool:
        with self._lock:
            s = self._sessions.get(sid)
            if s is None or s.tenant != tenant:
                return False
            del self._sessions[sid]
        s.closed = True
        return True

    def sweep(self) -> int:
        """Drop sessions idle for longer than the TTL; returns how many were dropped."""
        cutoff = time.monotonic() - self.ttl_s
        with self._lock:
            dead = [sid for sid, s in self._sessions.items() if s.last_used < cutoff and not s.lock.locked()]
            for sid in dead:
                self._sessions.pop(sid).closed = True
        return len(dead)

    def __len__(self) -> int:
        return len(self._sessions)

    def kv_bytes(self) -> int:
        with self._lock:
            sessions = list(self._sessions.values())
        return sum(s.kv_bytes() for s in sessions)

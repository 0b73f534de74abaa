"""Sessions: one conversation of one tenant on one path, owning its server-side state.

Session ids are 192-bit random strings and are looked up together with the tenant that made
them, so another tenant's id is indistinguishable from an unknown one (both 404). Idle
sessions expire after the configured TTL; the sweeper drops them and releases their engine
state (KV blocks) through `on_drop`. Where a session limit is reached, a session idle for
``evict_idle_s`` gives its place to the new one, least recently used first: the SDK keeps a
chat's session between turns, so the idle sessions a limit meets are mostly conversations
waiting for their user, whose client opens a new session and feeds its conversation again on
its next turn (404 ``session_not_found``).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class SessionLimit(OverflowError):
    """A session limit refused a new session. ``retry_after_s``: when one of the sessions under
    that limit may give its place up, as far as the store can tell (the Retry-After header)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class Session:
    id: str
    tenant: str
    path: str  # "plaintext" | "protected"
    created: float
    last_used: float
    state: Any = None  # the engine's sequence (plaintext) or the protected executor's state
    next_step: int = 1  # the step id the next message must carry
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one step at a time
    in_flight: int = 0  # step requests under way (reading their body, queued or computing)
    closed: bool = False
    # the last step's (id, SHA-256 of its body, reply), for ``resent``
    last_reply: tuple[int, bytes, bytes] | None = None

    @property
    def busy(self) -> bool:
        """A step under way: neither the TTL nor an eviction takes the session then."""
        return self.in_flight > 0 or self.lock.locked()

    def resent(self, step: int, body: bytes | bytearray) -> bytes | None:
        """With the lock held: the reply already given to this very message, where the client
        sends its last step again because the reply was lost on the way (a dropped connection, a
        timeout); the session is unchanged. Any other message with a spent step id stays a
        replay (409). The stored reply, not a new one: recomputing a protected step would draw
        new flooding noise for the same input, and averaging draws is what the noise forbids."""
        last = self.last_reply
        if last is None or last[0] != step or last[1] != hashlib.sha256(body).digest():
            return None
        return last[2]

    def answered(self, step: int, body: bytes | bytearray, reply: bytes) -> None:
        """With the lock held, once ``step`` has committed: keep its reply for ``resent``."""
        self.last_reply = (step, hashlib.sha256(body).digest(), reply)


class SessionStore:
    def __init__(self, ttl_s: float, max_per_tenant: int, on_drop: Callable[[Session], None] = lambda s: None,
                 id_prefix: str = "", evict_idle_s: float | None = None,
                 on_evict: Callable[[Session, str], None] = lambda s, why: None):
        self.ttl_s, self.max_per_tenant, self.on_drop = ttl_s, max_per_tenant, on_drop
        # None: a limit refuses the new session, whatever is idle; on_evict hears of each victim
        # and of the limit it gave way to ("sessions": a session count, "capacity": KV bytes)
        self.evict_idle_s, self.on_evict = evict_idle_s, on_evict
        # Prepended to every new id. A cluster replica sets it to its own routing key, so the
        # ingress can send a session's steps to the replica holding it (veil.cluster.routing).
        self.id_prefix = id_prefix
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, tenant: str, path: str, state_factory: Callable[[str], Any],
               max_on_path: int | None = None) -> Session:
        """A new session whose state is ``state_factory(session_id)``. Where the tenant has
        ``max_per_tenant`` sessions, or the path ``max_on_path`` in all, the least recently used
        of those idle for ``evict_idle_s`` is dropped for it; where none is, SessionLimit and
        nothing changes (nor where ``state_factory`` raises).

        The refusal's wait is exact for the tenant's own limit (its own sessions' idle times).
        For the path's limit it is the whole idle threshold: the sessions there are any tenant's,
        and a tenant must not learn from it when another's conversation last stepped."""
        now = time.monotonic()
        limits = [(lambda s: s.tenant == tenant, self.max_per_tenant, True,
                   f"tenant has {self.max_per_tenant} sessions (max_sessions_per_tenant)")]
        if max_on_path is not None:
            limits.append((lambda s: s.path == path, max_on_path, False,
                           f"the server has {max_on_path} {path} sessions (its limit)"))
        evicted: list[Session] = []
        with self._lock:
            for under, limit, own, why in limits:
                live = [s for s in self._sessions.values() if under(s) and s not in evicted]
                if len(live) >= limit:
                    victim = self._idlest(live, now)
                    if victim is None or len(live) > limit:  # one place is all a new session needs
                        wait = self._wait(live, now) if own and len(live) == limit else self.idle_threshold_s
                        raise SessionLimit(why, math.ceil(max(1.0, wait)))
                    evicted.append(victim)
            sid = self.id_prefix + secrets.token_urlsafe(24)
            s = Session(sid, tenant, path, now, now, state=state_factory(sid))
            for v in evicted:
                del self._sessions[v.id]
            self._sessions[s.id] = s
        for v in evicted:
            self._drop(v)
            self.on_evict(v, "sessions")
        return s

    def evict_for(self, path: str, keep: str, weight: Callable[[Session], int], needed: int) -> list[Session]:
        """For a limit of the whole path (the protected path's encrypted KV cache): drop idle
        sessions on ``path`` other than ``keep``, least recently used first, until their
        ``weight`` adds up to ``needed``; where all the idle ones' would not, drop none."""
        now = time.monotonic()
        with self._lock:
            idle = self._idle([s for s in self._sessions.values() if s.path == path and s.id != keep], now)
            chosen, total = [], 0
            for s in sorted(idle, key=lambda s: s.last_used):
                if total >= needed:
                    break
                if (w := weight(s)) > 0:
                    chosen.append(s)
                    total += w
            if total < needed:
                return []
            for v in chosen:
                del self._sessions[v.id]
        for v in chosen:
            self._drop(v)
            self.on_evict(v, "capacity")
        return chosen

    @property
    def idle_threshold_s(self) -> float:
        """How long a session must be idle before something else may take its place: the
        eviction threshold, or where eviction is off the TTL."""
        return self.evict_idle_s if self.evict_idle_s is not None else self.ttl_s

    def _wait(self, candidates: list[Session], now: float) -> float:
        """Seconds until the first of ``candidates`` has been idle for ``idle_threshold_s`` (a
        busy one's idleness starts after its step, so it counts the whole threshold)."""
        t = self.idle_threshold_s
        return min((t if s.busy else t - (now - s.last_used) for s in candidates), default=t)

    def _idle(self, candidates: list[Session], now: float) -> list[Session]:
        """Those of ``candidates`` idle for ``evict_idle_s``, with no step under way."""
        if self.evict_idle_s is None:
            return []
        return [s for s in candidates
                if now - s.last_used >= self.evict_idle_s and not s.busy]

    def _idlest(self, candidates: list[Session], now: float) -> Session | None:
        return min(self._idle(candidates, now), key=lambda s: s.last_used, default=None)

    def get(self, sid: str, tenant: str) -> Session | None:
        with self._lock:
            s = self._sessions.get(sid)
        if s is None or s.tenant != tenant or s.closed:
            return None
        return s

    def _drop(self, s: Session) -> None:
        s.closed = True
        self.on_drop(s)

    def delete(self, sid: str, tenant: str) -> bool:
        with self._lock:
            s = self._sessions.get(sid)
            if s is None or s.tenant != tenant:
                return False
            del self._sessions[sid]
        self._drop(s)
        return True

    def sweep(self) -> int:
        """Drop sessions idle for longer than the TTL; returns how many were dropped."""
        cutoff = time.monotonic() - self.ttl_s
        with self._lock:
            dead = [s for s in self._sessions.values() if s.last_used < cutoff and not s.busy]
            for s in dead:
                del self._sessions[s.id]
        for s in dead:
            self._drop(s)
        return len(dead)

    def __len__(self) -> int:
        return len(self._sessions)

    def per_path(self) -> dict[str, int]:
        """Live sessions by path; a cluster replica reports them to the router that places new ones."""
        with self._lock:
            return dict(Counter(s.path for s in self._sessions.values()))

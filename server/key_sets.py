"""The evaluation-key sets the protected service holds: for which tenant, used by which sessions,
and for how long.

Every client makes fresh keys (the secret key never leaves it), so a stored set must not live for
ever: with 2 GiB per tenant and 180 MB per full set, a tenant's twelfth client would otherwise be
refused until the server restarted. A set that no open session uses is dropped after
``key_ttl_s``, on its tenant's ``DELETE /v1/keys/{id}``, or when the same tenant's upload needs
its room (least recently used first). A set in use is never dropped, and one tenant's upload
never drops another's. A session naming dropped keys gets 404 ``keys_not_found``, and the SDK
uploads them again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # the cluster's key store (cluster/keys.py) imports this module without torch
    from veil.crypto.backend import HEBackend
    from veil.server.config import ServerConfig

T = TypeVar("T")

log = logging.getLogger("veil.server.protected")


class KeysError(ValueError):
    """Bad or over-limit key material; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code = status, code


def byte_limits(own: int, total: int, nbytes: int, max_per_tenant: int, max_total: int) -> KeysError | None:
    """The refusal (429) where ``nbytes`` more would take the tenant past ``own`` + ``nbytes`` >
    ``max_per_tenant`` or everyone past ``max_total``; None where it fits."""
    if own + nbytes > max_per_tenant:
        return KeysError(429, "key_bytes_per_tenant", f"evaluation keys would exceed max_key_bytes_per_tenant={max_per_tenant}")
    if total + nbytes > max_total:
        return KeysError(429, "key_bytes_total", f"evaluation keys would exceed max_key_bytes_total={max_total}")
    return None


def room_for(idle: Sequence[T], over: Callable[[list[T]], KeysError | None]) -> list[T]:
    """The shortest prefix of ``idle`` (least recently used first) whose dropping leaves
    ``over(dropped)`` None; raises what ``over`` answers where dropping all of them would not do."""
    victims: list[T] = []
    while (refusal := over(victims)) is not None:
        if len(victims) == len(idle):
            raise refusal
        victims.append(idle[len(victims)])
    return victims


@dataclass(eq=False)  # a held resource: equal only to itself
class KeySet:
    """One tenant's uploaded evaluation keys, imported into a key-only backend."""

    id: str  # SHA-256 of the uploaded bytes
    tenant: str
    backend: HEBackend = field(repr=False)
    nbytes: int = 0  # uploaded
    resident: int = 0  # held in the backend's memory (the device's, on CUDA)
    sessions: set[str] = field(default_factory=set)  # the open sessions that use them
    last_used: float = field(default_factory=time.monotonic)  # stored, or a session opened or closed


class KeySets(Mapping):
    """(tenant, keys id) -> KeySet, read-only to callers; every change goes through a method
    here, under one lock. ``executor_bytes()``: what else the device budget holds (the encoded
    weights, the sessions' shuffled W_down)."""

    def __init__(self, cfg: ServerConfig, executor_bytes: Callable[[], int]):
        self.cfg, self._executor_bytes = cfg, executor_bytes
        self._held: dict[tuple[str, str], KeySet] = {}
        self._by_session: dict[str, KeySet] = {}
        self._lock = threading.Lock()

    def __getitem__(self, key: tuple[str, str]) -> KeySet:
        return self._held[key]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(list(self._held))

    def __len__(self) -> int:
        return len(self._held)

    def nbytes(self, tenant: str | None = None) -> int:
        return sum(k.nbytes for k in list(self._held.values()) if tenant is None or k.tenant == tenant)

    def resident(self) -> int:
        return sum(k.resident for k in list(self._held.values()))

    # ---- storing ---------------------------------------------------------------------------
    def cached(self, tenant: str, key_id: str) -> KeySet | None:
        """The tenant's set of that id, marked used (the same upload again costs nothing)."""
        with self._lock:
            if (ks := self._held.get((tenant, key_id))) is not None:
                ks.last_used = time.monotonic()
            return ks

    def check_room(self, tenant: str, nbytes: int) -> None:
        """429 now, before an import, where even dropping all the tenant's unused sets would
        leave no room for ``nbytes`` more uploaded bytes."""
        with self._lock:
            self._room(tenant, nbytes, None)

    def put(self, ks: KeySet) -> KeySet:
        """Store an imported set, first dropping what ``_room`` names; 429 (nothing dropped) where
        it cannot fit. The set already stored under its id, where the same upload won a race."""
        with self._lock:
            if (held := self._held.get((ks.tenant, ks.id))) is not None:
                return held
            victims = self._room(ks.tenant, ks.nbytes, ks.resident)
            for v in victims:
                del self._held[(v.tenant, v.id)]
            self._held[(ks.tenant, ks.id)] = ks
        if victims:
            log.info("dropped %d unused key sets of tenant %s for its upload", len(victims), ks.tenant)
        return ks

    def _room(self, tenant: str, nbytes: int, resident: int | None) -> list[KeySet]:
        """(Under the lock.) The tenant's unused sets, least recently used first, that must go for
        a new set of ``nbytes`` uploaded (and ``resident`` held, where known) to fit every limit;
        KeysError 429 where dropping all of them would not do."""
        cfg, budget = self.cfg, self.cfg.protected_device_bytes
        idle = sorted((k for k in self._held.values() if k.tenant == tenant and not k.sessions),
                      key=lambda k: k.last_used)
        mine, total, held = self.nbytes(tenant), self.nbytes(), self._executor_bytes() + self.resident()

        def over(dropped: list[KeySet]) -> KeysError | None:
            freed, unheld = sum(v.nbytes for v in dropped), sum(v.resident for v in dropped)
            refusal = byte_limits(mine - freed, total - freed, nbytes, cfg.max_key_bytes_per_tenant,
                                  cfg.max_key_bytes_total)
            if refusal is None and resident is not None and budget is not None and held - unheld + resident > budget:
                refusal = KeysError(429, "device_memory", f"evaluation keys ({resident} bytes in memory) would exceed "
                                                          f"protected_device_gb={budget / (1 << 30):g} with the "
                                                          f"{held - unheld} bytes of weights, keys and steps held")
            return refusal

        return room_for(idle, over)

    # ---- dropping --------------------------------------------------------------------------
    def drop(self, tenant: str, key_id: str) -> None:
        """``DELETE /v1/keys/{id}``: 404 where the tenant has no such keys (another tenant's look
        the same), 409 while a session uses them."""
        with self._lock:
            ks = self._held.get((tenant, key_id))
            if ks is None:
                raise KeysError(404, "keys_not_found", "no such evaluation keys for this tenant")
            if ks.sessions:
                raise KeysError(409, "keys_in_use", f"{len(ks.sessions)} open sessions use these keys; "
                                                    "close them first")
            del self._held[(tenant, key_id)]

    def sweep(self, now: float | None = None) -> int:
        """Drop the sets no session has used for ``key_ttl_s``; returns how many."""
        cutoff = (time.monotonic() if now is None else now) - self.cfg.key_ttl_s
        with self._lock:
            dead = [k for k in self._held.values() if not k.sessions and k.last_used < cutoff]
            for k in dead:
                del self._held[(k.tenant, k.id)]
        return len(dead)

    # ---- sessions --------------------------------------------------------------------------
    def acquire(self, ks: KeySet, session_id: str) -> None:
        """The session uses ``ks`` from now; 404 where it was dropped since the caller found it."""
        with self._lock:
            if self._held.get((ks.tenant, ks.id)) is not ks:
                raise KeysError(404, "keys_not_found", "these evaluation keys were dropped; POST /v1/keys again")
            ks.sessions.add(session_id)
            ks.last_used = time.monotonic()
            self._by_session[session_id] = ks

    def release(self, session_id: str) -> None:
        """The session no longer uses its set, which is unused from now if it was the last."""
        with self._lock:
            if (ks := self._by_session.pop(session_id, None)) is not None:
                ks.sessions.discard(session_id)
                ks.last_used = time.monotonic()

"""Tenants' evaluation-key uploads, kept once for every replica of the deployment.

Runs as a Ray Serve deployment-scoped actor (one per deployment, outliving its replicas); the
class itself knows nothing of Ray. It stores the bytes exactly as uploaded, under the tenant and
their SHA-256 (the ``keys_id`` the single-process server answers), after a replica has validated
them; a replica that lacks a tenant's keys imports them from here, validating them again (a
replica trusts no input it did not check). The limits are the server's per-tenant and total
key-byte limits, so the cluster holds at most what one server would.

Like a server's own key sets (``veil.server.key_sets``) the uploads do not stay for ever: one
that no session has named for ``ttl_s`` is dropped (replicas ``touch`` the keys of every
protected session they open), as is one its tenant deletes, and an upload over a limit first
drops the same tenant's least recently used uploads. A replica keeps its own imported copy while
its sessions use it; a session elsewhere that names dropped keys gets 404 and the SDK uploads
them again. A deletion is remembered for ``ttl_s`` (or until the same bytes come again), so that
a replica whose copy the ``DELETE`` did not reach refuses new sessions on it too, as one server
would, instead of serving them from that copy until its own TTL passes.
"""

from __future__ import annotations

import hashlib
import time

from veil.server.key_sets import KeysError, byte_limits, room_for


class KeyStore:
    def __init__(self, max_bytes_per_tenant: int, max_bytes_total: int, ttl_s: float = 3600.0):
        self.max_bytes_per_tenant, self.max_bytes_total, self.ttl_s = max_bytes_per_tenant, max_bytes_total, ttl_s
        self._keys: dict[tuple[str, str], bytes] = {}
        self._used: dict[tuple[str, str], float] = {}  # stored, fetched or touched (monotonic)
        self._deleted: dict[tuple[str, str], float] = {}  # deleted by their tenant, when (monotonic)

    def _bytes(self, tenant: str | None = None) -> int:
        return sum(len(v) for (t, _), v in self._keys.items() if tenant is None or t == tenant)

    def _sweep(self, now: float | None) -> None:
        cutoff = (time.monotonic() if now is None else now) - self.ttl_s
        for key in [k for k, t in self._used.items() if t < cutoff]:
            del self._keys[key], self._used[key]
        for key in [k for k, t in self._deleted.items() if t < cutoff]:
            del self._deleted[key]

    def _room(self, tenant: str, nbytes: int) -> tuple[list, tuple[int, str, str] | None]:
        """The tenant's uploads, least recently used first, to drop for ``nbytes`` more to fit,
        or (status, code, message) where dropping all of them would not do."""
        mine = sorted((k for k in self._keys if k[0] == tenant), key=self._used.__getitem__)
        own, total = self._bytes(tenant), self._bytes()

        def over(dropped: list) -> KeysError | None:
            freed = sum(len(self._keys[v]) for v in dropped)
            return byte_limits(own - freed, total - freed, nbytes, self.max_bytes_per_tenant, self.max_bytes_total)

        try:
            return room_for(mine, over), None
        except KeysError as e:
            return [], (e.status, e.code, str(e))

    def refusal(self, tenant: str, nbytes: int, now: float | None = None) -> tuple[int, str, str] | None:
        """(status, code, message) when ``nbytes`` more for ``tenant`` could not fit even after
        dropping its own uploads."""
        self._sweep(now)
        return self._room(tenant, nbytes)[1]

    def put(self, tenant: str, data: bytes, now: float | None = None) -> tuple[int, str, str] | None:
        """Store validated key bytes; None when stored (or already there), else the refusal."""
        self._sweep(now)
        key = (tenant, hashlib.sha256(data).hexdigest())
        if key not in self._keys:
            victims, refused = self._room(tenant, len(data))
            if refused is not None:
                return refused
            for v in victims:
                del self._keys[v], self._used[v]
            self._keys[key] = data
        self._used[key] = time.monotonic() if now is None else now
        self._deleted.pop(key, None)  # uploaded again: a live set
        return None

    def get(self, tenant: str, key_id: str, now: float | None = None) -> bytes | None:
        return self._keys.get((tenant, key_id)) if self.touch(tenant, key_id, now) else None

    def touch(self, tenant: str, key_id: str, now: float | None = None) -> bool:
        """A session names the keys: they count as used now. False where they are not stored."""
        self._sweep(now)
        if (tenant, key_id) not in self._keys:
            return False
        self._used[(tenant, key_id)] = time.monotonic() if now is None else now
        return True

    def drop(self, tenant: str, key_id: str, now: float | None = None) -> bool:
        """``DELETE /v1/keys/{id}``; False where the tenant has no such upload."""
        if self._keys.pop((tenant, key_id), None) is None:
            return False
        del self._used[(tenant, key_id)]
        self._deleted[(tenant, key_id)] = time.monotonic() if now is None else now
        return True

    def deleted(self, tenant: str, key_id: str, now: float | None = None) -> bool:
        """The tenant deleted these keys within ``ttl_s`` and has not uploaded them since."""
        self._sweep(now)
        return (tenant, key_id) in self._deleted

    def nbytes(self) -> int:
        return self._bytes()

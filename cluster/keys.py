"""Tenants' evaluation-key uploads, kept once for every replica of the deployment.

Runs as a Ray Serve deployment-scoped actor (one per deployment, outliving its replicas); the
class itself knows nothing of Ray. It stores the bytes exactly as uploaded, under the tenant and
their SHA-256 (the ``keys_id`` the single-process server answers), after a replica has validated
them; a replica that lacks a tenant's keys imports them from here, validating them again (a
replica trusts no input it did not check). The limits are the server's per-tenant and total
key-byte limits, so the cluster holds at most what one server would.
"""

from __future__ import annotations

import hashlib


class KeyStore:
    def __init__(self, max_bytes_per_tenant: int, max_bytes_total: int):
        self.max_bytes_per_tenant, self.max_bytes_total = max_bytes_per_tenant, max_bytes_total
        self._keys: dict[tuple[str, str], bytes] = {}

    def _bytes(self, tenant: str | None = None) -> int:
        return sum(len(v) for (t, _), v in self._keys.items() if tenant is None or t == tenant)

    def refusal(self, tenant: str, nbytes: int) -> tuple[int, str, str] | None:
        """(status, code, message) when ``nbytes`` more for ``tenant`` would exceed a limit."""
        if self._bytes(tenant) + nbytes > self.max_bytes_per_tenant:
            return 429, "key_bytes_per_tenant", ("evaluation keys would exceed max_key_bytes_per_tenant="
                                                 f"{self.max_bytes_per_tenant}")
        if self._bytes() + nbytes > self.max_bytes_total:
            return 429, "key_bytes_total", f"evaluation keys would exceed max_key_bytes_total={self.max_bytes_total}"
        return None

    def put(self, tenant: str, data: bytes) -> tuple[int, str, str] | None:
        """Store validated key bytes; None when stored (or already there), else the refusal."""
        key = (tenant, hashlib.sha256(data).hexdigest())
        if key in self._keys:
            return None
        refused = self.refusal(tenant, len(data))
        if refused is None:
            self._keys[key] = data
        return refused

    def get(self, tenant: str, key_id: str) -> bytes | None:
        return self._keys.get((tenant, key_id))

    def nbytes(self) -> int:
        return self._bytes()

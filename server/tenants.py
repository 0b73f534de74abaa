"""Tenants and their API keys.

The tenants file is JSON: `{"version": 1, "tenants": {name: {"key_sha256": hex, "scopes": [...]}}}`.
Only a SHA-256 of each key is stored. Keys are 256-bit random strings, so a fast hash is enough
(no password-stretching needed: there is nothing to brute-force). Lookups compare the presented
key's hash against every tenant's with `hmac.compare_digest`, without early exit, so timing
says nothing about which tenant or how many characters matched.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

SCOPES = ("plaintext", "protected")
KEY_PREFIX = "veil_"


@dataclass(frozen=True)
class Tenant:
    name: str
    key_sha256: str
    scopes: frozenset[str]


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class TenantStore:
    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else None
        self._tenants: dict[str, Tenant] = {}
        self._lock = threading.Lock()
        if self.path and self.path.exists():
            self._load()

    @classmethod
    def from_json(cls, text: str) -> TenantStore:
        """An in-memory copy of a tenants file's content (cluster replicas get the file's text,
        not its path, which may not exist on their node)."""
        store = cls()
        store._parse(json.loads(text))
        return store

    def _load(self) -> None:
        self._parse(json.loads(self.path.read_text()))

    def _parse(self, data: dict) -> None:
        for name, rec in data.get("tenants", {}).items():
            bad = set(rec["scopes"]) - set(SCOPES)
            if bad:
                raise ValueError(f"tenant {name}: unknown scopes {sorted(bad)}")
            self._tenants[name] = Tenant(name, rec["key_sha256"], frozenset(rec["scopes"]))

    def _save(self) -> None:
        if not self.path:
            return
        data = {"version": 1, "tenants": {t.name: {"key_sha256": t.key_sha256, "scopes": sorted(t.scopes)}
                                          for t in self._tenants.values()}}
        tmp = self.path.with_suffix(".tmp")
        # The file holds only hashes, but there is no reason for anyone else to read it.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, self.path)

    def add(self, name: str, scopes: list[str] | tuple[str, ...]) -> str:
        """Create a tenant and return its new API key (shown once, never stored)."""
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise ValueError("tenant names use letters, digits, '-', '_' and '.'")
        bad = set(scopes) - set(SCOPES)
        if bad or not scopes:
            raise ValueError(f"scopes must be a non-empty subset of {SCOPES}")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        with self._lock:
            if name in self._tenants:
                raise ValueError(f"tenant {name!r} exists")
            self._tenants[name] = Tenant(name, hash_key(key), frozenset(scopes))
            self._save()
        return key

    def authenticate(self, key: str) -> Tenant | None:
        digest = hash_key(key)
        found = None
        for t in list(self._tenants.values()):
            if hmac.compare_digest(digest, t.key_sha256):
                found = t
        return found

    def __len__(self) -> int:
        return len(self._tenants)

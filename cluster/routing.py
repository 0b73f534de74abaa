"""Which replica a request belongs to, read from the session id in its path (no Ray here).

A replica names its sessions ``<replica id>.<random>``; Ray's replica ids are short
alphanumeric strings and ``secrets.token_urlsafe`` never yields a dot, so the first dot splits
an id unambiguously. Ids without one (made up, or from a single-process server) pin nothing:
they are balanced like any request and the replica that gets them answers 404.

A request that opens a session is placed by the sessions each replica holds (``router``); the
ingress names the path the new session is on (``opens_session``).
"""

from __future__ import annotations

import json

SEP = "."
#: The header every forwarded answer carries: the id of the replica that produced it.
REPLICA_HEADER = "x-veil-replica"


def session_prefix(replica_id: str) -> str:
    return replica_id + SEP


def pinned_replica(path: str) -> str | None:
    """The replica id encoded in ``/v1/sessions/{id}`` or ``/v1/sessions/{id}/…``, else None."""
    parts = path.split("/", 4)
    if len(parts) < 4 or parts[1] != "v1" or parts[2] != "sessions":
        return None
    replica, sep, rest = parts[3].partition(SEP)
    return replica if sep and replica.isalnum() and rest else None


def opens_session(method: str, path: str, body: bytes) -> str | None:
    """The path ("plaintext" or "protected") of the session ``POST /v1/sessions`` asks for; None
    for any other request. Any other body opens "other" (the replica refuses it, wherever it
    goes): the router keeps counts per path, and a client must not choose how many."""
    if method != "POST" or path != "/v1/sessions":
        return None
    try:
        kind = json.loads(body).get("path")
    except (ValueError, AttributeError):
        return "other"
    return kind if kind in ("plaintext", "protected") else "other"

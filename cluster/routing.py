"""Which replica a request belongs to, read from the session id in its path (no Ray here).

A replica names its sessions ``<replica id>.<random>``; Ray's replica ids are short
alphanumeric strings and ``secrets.token_urlsafe`` never yields a dot, so the first dot splits
an id unambiguously. Ids without one (made up, or from a single-process server) pin nothing:
they are balanced like any request and the replica that gets them answers 404.
"""

from __future__ import annotations

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

"""HTTP plumbing every route shares: the bearer key, a body read within its limit (each route's
own: ``body_limit``), and the count of requests by route and status."""

from __future__ import annotations

import re
import threading

from fastapi import Request

from veil.server.errors import ApiError, error_response
from veil.server.tenants import Tenant, TenantStore

# the routes that read their own binary bodies (``read_body``, after the key is checked)
_STEPS = re.compile(r"/v1/sessions/[^/]+/steps")


def body_limit(path: str, cfg) -> tuple[int, bool]:
    """(the largest body of a request to ``path``, whether its handler reads it itself). A step
    carries ciphertexts or hidden states, a key upload the evaluation keys; every other body is
    JSON that FastAPI parses before the handler runs, so ``LimitBodies`` bounds it first."""
    if _STEPS.fullmatch(path):
        return cfg.max_body_bytes, True
    if path == "/v1/keys":
        return cfg.max_key_bytes, True
    return cfg.max_json_body_bytes, False


def bearer_tenant(request: Request, tenants: TenantStore) -> Tenant:
    auth = request.headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    tenant = tenants.authenticate(key.strip()) if scheme.lower() == "bearer" and key.strip() else None
    if tenant is None:
        raise ApiError(401, "unauthorized", "missing or invalid API key", {"WWW-Authenticate": "Bearer"})
    return tenant


async def read_body(request: Request, limit: int, held: Held | None = None) -> bytes | bytearray:
    """The body, at most ``limit`` bytes (413 above); ``held`` counts it as it arrives (its
    declared length at once), and may refuse it (429). A body of declared length is read into
    one buffer of that size, not joined from its pieces (which held it twice: 1.9 GB of server
    memory for a 900 MB key upload, benchmarks/results/2026-12-06-fuzz); one that arrives in a
    single piece (a cluster replica's forwarded request) is that piece, not a copy of it."""
    declared = request.headers.get("content-length")
    declared = int(declared) if declared is not None and declared.isdigit() else None
    if declared is not None and declared > limit:
        raise ApiError(413, "body_too_large", f"body exceeds max_body_bytes={limit}")
    if held is not None and declared is not None:
        held.add(declared)
    buf, chunks, size = None, [], 0
    async for chunk in request.stream():
        if not chunk:
            continue
        if size + len(chunk) > (limit if declared is None else declared):
            raise ApiError(413, "body_too_large", f"body exceeds max_body_bytes={limit}")
        if declared is None:
            if held is not None:
                held.add(len(chunk))
            chunks.append(chunk)
        elif size == 0 and len(chunk) == declared:
            buf = chunk  # whole: nothing can follow it (413 above)
        else:
            if buf is None:
                buf = bytearray(declared)
            buf[size:size + len(chunk)] = chunk
        size += len(chunk)
    if declared is None:
        return b"".join(chunks)
    if size != declared:
        raise ApiError(400, "bad_request", f"the body ended after {size} of its {declared} bytes")
    return buf if buf is not None else b""


class Arriving:
    """The bytes of the request bodies the server holds (steps and key uploads, from their first
    byte until they are answered), per tenant and in all. A body that would pass either bound is
    refused (429 ``server_busy``) and read no further: without them, one tenant's concurrent
    uploads (64 MB a step, 1 GB a key set) were bounded only by the server's memory."""

    def __init__(self, per_tenant: int, total: int):
        self.per_tenant, self.total = per_tenant, total
        self.by_tenant: dict[str, int] = {}
        self._lock = threading.Lock()

    def hold(self, tenant: str) -> Held:
        return Held(self, tenant)

    def _add(self, tenant: str, n: int) -> None:
        with self._lock:
            mine, everyone = self.by_tenant.get(tenant, 0) + n, sum(self.by_tenant.values()) + n
            if mine > self.per_tenant or everyone > self.total:
                raise ApiError(429, "server_busy", f"request bodies held: {mine} bytes of this tenant's (at most "
                                                   f"{self.per_tenant}), {everyone} of all (at most {self.total})",
                               {"Retry-After": "1"})
            self.by_tenant[tenant] = mine

    def _drop(self, tenant: str, n: int) -> None:
        with self._lock:
            left = self.by_tenant[tenant] - n
            if left:
                self.by_tenant[tenant] = left
            else:
                del self.by_tenant[tenant]


class Held:
    """One request's share of ``Arriving``: what ``add`` counted goes when the ``with`` ends."""

    def __init__(self, arriving: Arriving, tenant: str):
        self.arriving, self.tenant, self.nbytes = arriving, tenant, 0

    def add(self, n: int) -> None:
        self.arriving._add(self.tenant, n)
        self.nbytes += n

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc) -> None:
        if self.nbytes:
            self.arriving._drop(self.tenant, self.nbytes)


class CountRequests:
    """Counts every HTTP request by route and status once its response has gone out. A plain
    ASGI middleware: FastAPI's ``@app.middleware("http")`` passes each chunk of a streamed
    response through a memory stream and more tasks (with the token counter looked up once,
    replacing it took a profiled event loop from 49 to 36 busy seconds over 256 streams)."""

    def __init__(self, app, counter):
        self.app, self.counter = app, counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500  # what the client gets when the app raises before it answers

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")  # set by the router on this scope
            self.counter.labels(getattr(route, "path", "unmatched"), str(status)).inc()


class LimitBodies:
    """413 for a JSON body over ``max_json_body_bytes``, before anything parses it. FastAPI reads
    and parses a route's declared body before the handler checks the key: a 300 MB prompt was
    parsed for an unauthenticated request (RSS +1 GB) and, from a tenant, tokenized until the
    kernel killed the server (23.5 GB; benchmarks/results/2026-12-06-fuzz). The body is read
    here within its limit and handed on whole; routes that read their own binary bodies
    (``body_limit``) pass through."""

    def __init__(self, app, cfg):
        self.app, self.cfg = app, cfg

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit, own = body_limit(scope["path"], self.cfg)
        if own:
            return await self.app(scope, receive, send)
        too_large = error_response(413, "body_too_large", f"body exceeds max_json_body_bytes={limit}")
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return await too_large(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return await too_large(scope, receive, send)
            more = message.get("more_body", False)
        body, given = b"".join(chunks), False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: a disconnect, when it comes

        await self.app(scope, replay, send)

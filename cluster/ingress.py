"""The cluster's HTTP ingress: a Ray Serve deployment behind Ray's HTTP proxy.

It forwards every request to an engine replica through the engine deployment's handle (pinned
to the session's replica, or balanced; see ``router``) and streams the answer back unchanged.
Its own routes are ``/health`` and ``/metrics``, which gather every running replica's.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from ray.exceptions import RayActorError

from veil.cluster.asgi import Forwarded, Head
from veil.cluster.metrics import ClusterMetrics
from veil.cluster.router import running_replicas
from veil.cluster.routing import REPLICA_HEADER, opens_session, pinned_replica
from veil.server.config import ServerConfig
from veil.server.errors import ApiError, error_response
from veil.server.http_common import Arriving, bearer_tenant, body_limit, read_body
from veil.server.tenants import TenantStore

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
ASK_TIMEOUT_S = 10.0  # one replica's /health or /metrics


def _response(head: Head) -> Response:
    r = Response(head.body, status_code=head.status)
    r.raw_headers = list(head.headers)  # the replica's own, content-length included
    return r


class Ingress:
    def __init__(self, engine, cfg: ServerConfig, target_replicas: int, tenants_json: str):
        self.engine = engine.options(stream=True)  # a DeploymentHandle of VeilReplica
        self.cfg = cfg  # each route's body limit (http_common.body_limit), as a replica applies it
        self.target = target_replicas
        # Steps and key uploads (up to 64 MB and 1 GB) are read whole here before any replica
        # sees them, so the ingress checks their key first and bounds what it holds per tenant,
        # as a replica's app does: before, anyone could make it buffer 1 GB per request.
        self.tenants = TenantStore.from_json(tenants_json)
        self.arriving = Arriving(cfg.max_arriving_bytes_per_tenant, cfg.max_arriving_bytes)
        self.metrics = ClusterMetrics()

    def __serve_build_asgi_app__(self) -> FastAPI:
        return ingress_app(self)

    # ---- calls to replicas ---------------------------------------------------------------------
    def lost(self, pin: str | None) -> Response:
        """The answer to a request whose replica died while running it."""
        self.metrics.lost.labels("pinned" if pin else "balanced").inc()
        if pin:  # its session died with the replica: the SDK opens a new one
            return error_response(404, "session_not_found", "the replica holding this session was lost")
        return error_response(503, "replica_lost", "the replica serving this request was lost; retry")

    async def forward(self, req: Forwarded) -> Response:
        pin = pinned_replica(req.path)
        gen = self.engine.forward.remote(req, replica=pin, opens=opens_session(req.method, req.path, req.body))
        try:
            head = await gen.__anext__()
        except RayActorError:
            return self.lost(pin)
        except BaseException:
            gen.cancel()
            raise
        if not head.streaming:
            return _response(head)
        sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in head.headers)

        async def rest():
            done = False
            try:
                yield head.body
                async for chunk in gen:
                    yield chunk
                done = True
            except RayActorError:
                self.metrics.lost.labels("pinned" if pin else "balanced").inc()
                if sse:  # the status is sent already: end the stream with an error event, no [DONE]
                    err = {"error": {"code": "replica_lost", "message": "the replica serving this request was lost",
                                     "type": "replica_lost"}}
                    yield f"data: {json.dumps(err)}\n\n".encode()
            finally:
                if not done:
                    gen.cancel()

        r = StreamingResponse(rest(), status_code=head.status)
        r.raw_headers = [(k, v) for k, v in head.headers if k.lower() != b"content-length"]
        return r

    async def ask(self, path: str, pin: str | None) -> tuple[str, Head]:
        """GET ``path`` on one replica: (the replica that answered, its answer)."""
        gen = self.engine.forward.remote(Forwarded("GET", path, b"", (), b""), replica=pin)
        try:
            head = await asyncio.wait_for(gen.__anext__(), ASK_TIMEOUT_S)
        except BaseException:
            gen.cancel()
            raise
        rid = next((v.decode() for k, v in head.headers if k == REPLICA_HEADER.encode()), pin or "?")
        return rid, head

    async def ask_all(self, path: str) -> dict[str, Head | BaseException]:
        """GET ``path`` on every running replica, by replica id (an exception where one failed)."""
        ids = running_replicas()
        if not ids:  # no call has gone through the handle yet: this one starts its router
            rid, head = await self.ask(path, None)
            ids = running_replicas() or (rid,)
        got = await asyncio.gather(*(self.ask(path, pin) for pin in ids), return_exceptions=True)
        out: dict[str, Head | BaseException] = {}
        for pin, g in zip(ids, got, strict=True):
            if isinstance(g, BaseException):
                out[pin] = g
            else:  # a replica that died meanwhile: another one answered for it
                out.setdefault(g[0], g[1])
        self.metrics.replicas.labels("running").set(len(ids))
        return out

    async def health(self) -> Response:
        replicas, first = [], None
        for rid, head in sorted((await self.ask_all("/health")).items()):
            if isinstance(head, BaseException):
                replicas.append({"id": rid, "status": "unreachable", "error": type(head).__name__})
                continue
            body = json.loads(head.body)
            ok = head.status == 200
            first = first or (body if ok else None)
            replicas.append({"id": rid, "status": "ok" if ok else body.get("error", {}).get("code", str(head.status)),
                             "sessions": body.get("sessions")})
        healthy = sum(r["status"] == "ok" for r in replicas)
        self.metrics.replicas.labels("target").set(self.target)
        self.metrics.replicas.labels("healthy").set(healthy)
        if first is None:
            return error_response(503, "engine_unavailable", "no engine replica is running")
        body = {**first, "status": "ok" if healthy >= self.target else "degraded",
                "sessions": sum(r.get("sessions") or 0 for r in replicas),
                "replicas": {"target": self.target, "running": len(replicas), "healthy": healthy},
                "replica_status": replicas}
        return Response(json.dumps(body), media_type="application/json")

    async def prometheus(self) -> Response:
        texts = {rid: head.body.decode() for rid, head in (await self.ask_all("/metrics")).items()
                 if isinstance(head, Head) and head.status == 200}
        self.metrics.replicas.labels("target").set(self.target)
        return Response(self.metrics.render(texts), media_type="text/plain; version=0.0.4")


def ingress_app(ing: Ingress) -> FastAPI:
    # No docs routes of its own: /docs and /openapi.json are forwarded to a replica's app.
    app = FastAPI(title="Veil cluster ingress", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):  # as a replica answers a bug
        return error_response(500, "internal_error", "the ingress failed on this request; its log says why")

    @app.get("/health")
    async def health():
        return await ing.health()

    @app.get("/metrics")
    async def prometheus():
        return await ing.prometheus()

    @app.api_route("/{path:path}", methods=METHODS)
    async def forward(path: str, request: Request):
        s = request.scope
        limit, reads_own = body_limit(s["path"], ing.cfg)
        if not (reads_own and s["method"] == "POST"):  # JSON (or no body), read whoever sends it
            return await ing.forward(_forwarded(s, await read_body(request, ing.cfg.max_json_body_bytes)))
        # The replica checks scopes and sessions; a valid key is what the ingress can check.
        with ing.arriving.hold(bearer_tenant(request, ing.tenants).name) as held:  # until answered
            return await ing.forward(_forwarded(s, await read_body(request, limit, held)))

    return app


def _forwarded(scope: dict, body: bytes | bytearray) -> Forwarded:
    client = tuple(scope["client"]) if scope.get("client") else None
    return Forwarded(scope["method"], scope["path"], scope.get("query_string", b""),
                     tuple((bytes(k), bytes(v)) for k, v in scope["headers"]), body, client)  # bytes at the replica

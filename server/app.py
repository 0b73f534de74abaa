"""The FastAPI application: authentication, sessions and routes. No math of its own: steps are
handed to the engine (here the server half of the split model).

Errors are JSON `{"error": {"code": ..., "message": ...}}` with a 4xx status for anything the
caller did wrong; a rejected step leaves its session exactly as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import torch
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from veil.crypto.wire import CONTENT_TYPE, HiddenReply, HiddenStep, WireError
from veil.engine.split import ServerHalf
from veil.server.config import ServerConfig
from veil.server.sessions import Session, SessionStore
from veil.server.tenants import Tenant, TenantStore

log = logging.getLogger("veil.server")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def _error(status: int, code: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


class CreateSession(BaseModel):
    path: str = "plaintext"
    k: int | None = None  # the client's split point; must match the server's
    model_fingerprint: str | None = None  # the client's expectation of the server half


def create_app(cfg: ServerConfig, half: ServerHalf, tenants: TenantStore) -> FastAPI:
    sessions = SessionStore(cfg.session_ttl_s, cfg.max_sessions_per_tenant, half.model.last - half.model.first)
    model = half.model

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        async def sweeper():
            while True:
                await asyncio.sleep(cfg.sweep_interval_s)
                if n := sessions.sweep():
                    log.info("expired %d idle sessions", n)

        task = asyncio.create_task(sweeper())
        try:
            yield
        finally:
            task.cancel()

    app = FastAPI(title="Veil", version="0.1.0", lifespan=lifespan)
    app.state.sessions, app.state.tenants, app.state.half, app.state.cfg = sessions, tenants, half, cfg

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return _error(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return _error(400, "bad_request", f"invalid request: {exc.errors()[:3]}")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return _error(exc.status_code, "http_error", str(exc.detail))

    def authenticate(request: Request) -> Tenant:
        auth = request.headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        tenant = tenants.authenticate(key.strip()) if scheme.lower() == "bearer" and key.strip() else None
        if tenant is None:
            raise ApiError(401, "unauthorized", "missing or invalid API key", {"WWW-Authenticate": "Bearer"})
        return tenant

    def session_of(sid: str, tenant: Tenant) -> Session:
        s = sessions.get(sid, tenant.name)
        if s is None:  # unknown, expired and foreign look the same
            raise ApiError(404, "session_not_found", "no such session")
        return s

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cfg.max_body_bytes:
            raise ApiError(413, "body_too_large", f"body exceeds max_body_bytes={cfg.max_body_bytes}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cfg.max_body_bytes:
                raise ApiError(413, "body_too_large", f"body exceeds max_body_bytes={cfg.max_body_bytes}")
            chunks.append(chunk)
        return b"".join(chunks)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": half.config.name, "k": half.k, "model_fingerprint": half.fingerprint,
                "sessions": len(sessions)}

    @app.post("/v1/sessions", status_code=201)
    async def create_session(body: CreateSession, request: Request):
        tenant = authenticate(request)
        if body.path not in ("plaintext", "protected"):
            raise ApiError(400, "bad_path", "path must be 'plaintext' or 'protected'")
        if body.path not in tenant.scopes:
            raise ApiError(403, "forbidden", f"this key lacks the {body.path!r} scope")
        if body.path == "protected":
            raise ApiError(501, "not_implemented", "the protected path is not available on this server yet")
        if body.k is not None and body.k != half.k:
            raise ApiError(409, "split_mismatch", f"server split is k={half.k}, client asked for k={body.k}")
        if body.model_fingerprint is not None and body.model_fingerprint != half.fingerprint:
            raise ApiError(409, "model_mismatch", "the server half is not the one the client bundle was split from")
        try:
            s = sessions.create(tenant.name, body.path)
        except OverflowError as e:
            raise ApiError(429, "too_many_sessions", str(e)) from None
        return {"id": s.id, "path": s.path, "k": half.k, "num_layers": half.config.num_layers,
                "hidden_size": half.config.hidden_size, "model": half.config.name,
                "model_fingerprint": half.fingerprint, "dtype": "float32", "ttl_s": cfg.session_ttl_s,
                "max_context": cfg.max_context}

    @app.delete("/v1/sessions/{sid}", status_code=204)
    async def delete_session(sid: str, request: Request):
        tenant = authenticate(request)
        if not sessions.delete(sid, tenant.name):
            raise ApiError(404, "session_not_found", "no such session")
        return Response(status_code=204)

    def run_step(s: Session, msg: HiddenStep) -> bytes:
        # Everything is validated before the cache is touched; the forward pass returns a new
        # cache which is committed only at the end, so a rejected step changes nothing.
        with s.lock:
            if s.closed:
                raise ApiError(404, "session_not_found", "no such session")
            if msg.step != s.next_step:
                kind = "replayed" if msg.step < s.next_step else "out-of-order"
                raise ApiError(409, "bad_step", f"{kind} step {msg.step}; expected {s.next_step}")
            T, start = msg.hidden.shape[0], s.context_len
            if msg.positions != list(range(start, start + T)):
                raise ApiError(400, "bad_positions", f"positions must continue the context at {start}")
            if start + T > cfg.max_context:
                raise ApiError(413, "context_too_long", f"context would exceed max_context={cfg.max_context}")
            with torch.inference_mode():
                h = msg.hidden.to(torch.float32)
                out, kv = model.forward_layers(h, torch.tensor(msg.positions), s.kv)
            s.kv = kv
            s.next_step += 1
            s.last_used = time.monotonic()
            return HiddenReply(s.id, msg.step, out).to_bytes()

    @app.post("/v1/sessions/{sid}/steps")
    async def step(sid: str, request: Request):
        tenant = authenticate(request)
        s = session_of(sid, tenant)
        body = await read_body(request)
        try:
            msg = HiddenStep.from_bytes(body, max_bytes=cfg.max_body_bytes, hidden_size=half.config.hidden_size,
                                        max_tokens=cfg.max_step_tokens)
        except WireError as e:
            raise ApiError(400, "bad_message", str(e)) from None
        if msg.session != sid:
            raise ApiError(400, "bad_message", "message session id does not match the URL")
        s.last_used = time.monotonic()
        reply = await run_in_threadpool(run_step, s, msg)
        return Response(reply, media_type=CONTENT_TYPE)

    return app

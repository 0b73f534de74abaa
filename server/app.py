"""The FastAPI application: authentication, sessions and routes. No math of its own: split
steps and full-model requests go to the engine, which batches them together.

Errors are JSON `{"error": {"code": ..., "message": ...}}` with a 4xx status for anything the
caller did wrong; a rejected step leaves its session exactly as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from veil.crypto.backend import CiphertextError, HEError
from veil.crypto.wire import CONTENT_TYPE, HiddenReply, HiddenStep, WireError
from veil.engine.engine import DeviceOutOfMemory, Engine, EngineDead, SessionClosed, StepStats
from veil.engine.split import ServerHalf
from veil.protected.protocol import (
    MAX_SPAN,
    PROTOCOL_VERSION,
    UPLOAD_KINDS,
    ProtectedMessage,
    ProtocolError,
)
from veil.server.config import ServerConfig
from veil.server.errors import ApiError, error_response
from veil.server.metrics import Metrics
from veil.server.protected_service import KeysError, ProtectedService
from veil.server.sessions import Session, SessionStore
from veil.server.tenants import Tenant, TenantStore

log = logging.getLogger("veil.server")


class CreateSession(BaseModel):
    path: str = "plaintext"
    k: int | None = None  # the client's split point; must match the server's
    model_fingerprint: str | None = None  # the client's expectation of the server half
    keys_id: str | None = None  # protected: the evaluation keys uploaded with POST /v1/keys
    param_set: str | None = None  # protected: the CKKS parameter set the client uses


def bearer_tenant(request: Request, tenants: TenantStore) -> Tenant:
    auth = request.headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    tenant = tenants.authenticate(key.strip()) if scheme.lower() == "bearer" and key.strip() else None
    if tenant is None:
        raise ApiError(401, "unauthorized", "missing or invalid API key", {"WWW-Authenticate": "Bearer"})
    return tenant


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "body_too_large", f"body exceeds max_body_bytes={limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "body_too_large", f"body exceeds max_body_bytes={limit}")
        chunks.append(chunk)
    return b"".join(chunks)


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


def create_app(cfg: ServerConfig, half: ServerHalf, tenants: TenantStore) -> FastAPI:
    metrics = Metrics()

    def on_step(s: StepStats) -> None:
        metrics.engine_steps.inc()
        metrics.engine_host_seconds.inc(s.host_seconds)
        metrics.batch_size.observe(s.num_seqs)
        metrics.batch_tokens.observe(s.num_tokens)
        metrics.kv_util.set(s.kv_utilization)

    engine = Engine(half.model, half.k, cfg.engine_config(), on_step=on_step)
    # the native backend on the CPU computes with torch's intra-op threads: on the engine loop's
    # OpenMP team (Engine.call), since a second team slows both
    cpu_native = cfg.he_backend == "native" and torch.device(cfg.device).type == "cpu"
    protected = ProtectedService(half, cfg, engine.call if cpu_native else None)

    def drop(s: Session) -> None:
        if s.path == "protected":
            protected.close(s.id)
        elif s.state is not None:
            engine.close(s.state)

    sessions = SessionStore(cfg.session_ttl_s, cfg.max_sessions_per_tenant, on_drop=drop)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        if cfg.protected_warmup:  # else the first protected session waits for the encoding (~1 min at k=2)
            threading.Thread(target=protected.warm_up, name="protected-warmup", daemon=True).start()

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
            engine.stop()

    app = FastAPI(title="Veil", version="0.1.0", lifespan=lifespan)
    app.state.sessions, app.state.tenants, app.state.half, app.state.cfg = sessions, tenants, half, cfg
    app.state.engine, app.state.metrics, app.state.protected = engine, metrics, protected

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errs = [{"loc": e.get("loc"), "msg": e.get("msg")} for e in exc.errors()[:3]]
        return error_response(400, "bad_request", f"invalid request: {errs}")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, "http_error", str(exc.detail))

    @app.exception_handler(EngineDead)
    async def _engine_dead(request: Request, exc: EngineDead):
        return error_response(503, "engine_unavailable", "the inference engine is not running")

    @app.exception_handler(DeviceOutOfMemory)
    async def _device_out_of_memory(request: Request, exc: DeviceOutOfMemory):
        # the engine dropped that work whole: the same request or step may be sent again
        return error_response(503, "device_out_of_memory", str(exc), {"Retry-After": "1"})

    app.add_middleware(CountRequests, counter=metrics.requests)

    def authenticate(request: Request) -> Tenant:
        return bearer_tenant(request, tenants)

    def session_of(sid: str, tenant: Tenant) -> Session:
        s = sessions.get(sid, tenant.name)
        if s is None:  # unknown, expired and foreign look the same
            raise ApiError(404, "session_not_found", "no such session")
        return s

    @app.get("/health")
    async def health():
        if not engine.alive:
            return error_response(503, "engine_unavailable", "the inference engine is not running")
        return {"status": "ok", "model": half.config.name, "k": half.k, "model_fingerprint": half.fingerprint,
                "sessions": len(sessions), "fast_path": half.full, "protected": protected.describe()}

    @app.get("/metrics")
    async def prometheus():
        metrics.sessions.set(len(sessions))
        metrics.running.set(engine.scheduler.num_running)
        metrics.waiting.set(engine.scheduler.num_waiting)
        metrics.kv_util.set(engine.cache.utilization)
        metrics.protected_kv_bytes.set(protected.kv_bytes())
        metrics.protected_key_bytes.set(protected.key_bytes())
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/sessions", status_code=201)
    async def create_session(body: CreateSession, request: Request):
        tenant = authenticate(request)
        if body.path not in ("plaintext", "protected"):
            raise ApiError(400, "bad_path", "path must be 'plaintext' or 'protected'")
        if body.path not in tenant.scopes:
            raise ApiError(403, "forbidden", f"this key lacks the {body.path!r} scope")
        if body.k is not None and body.k != half.k:
            raise ApiError(409, "split_mismatch", f"server split is k={half.k}, client asked for k={body.k}")
        if body.model_fingerprint is not None and body.model_fingerprint != half.fingerprint:
            raise ApiError(409, "model_mismatch", "the server half is not the one the client bundle was split from")
        if body.path == "protected":
            return await create_protected_session(body, tenant)
        try:
            s = sessions.create(tenant.name, body.path, lambda sid: engine.open_hidden(tenant.name))
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

    @app.post("/v1/sessions/{sid}/steps")
    async def step(sid: str, request: Request):
        tenant = authenticate(request)
        s = session_of(sid, tenant)
        body = await read_body(request, cfg.max_body_bytes)
        if s.path == "protected":
            return await protected_step(s, body)
        try:
            msg = HiddenStep.from_bytes(body, max_bytes=cfg.max_body_bytes, hidden_size=half.config.hidden_size,
                                        max_tokens=cfg.max_step_tokens)
        except WireError as e:
            raise ApiError(400, "bad_message", str(e)) from None
        if msg.session != sid:
            raise ApiError(400, "bad_message", "message session id does not match the URL")
        async with s.lock:
            # Everything is checked before the engine sees the step, so a rejected step changes
            # nothing; once submitted, the step will be computed and the step id is spent.
            if s.closed:
                raise ApiError(404, "session_not_found", "no such session")
            if msg.step != s.next_step:
                kind = "replayed" if msg.step < s.next_step else "out-of-order"
                raise ApiError(409, "bad_step", f"{kind} step {msg.step}; expected {s.next_step}")
            T, start = msg.hidden.shape[0], s.state.num_inputs
            if msg.positions != list(range(start, start + T)):
                raise ApiError(400, "bad_positions", f"positions must continue the context at {start}")
            if start + T > cfg.max_context:
                raise ApiError(413, "context_too_long", f"context would exceed max_context={cfg.max_context}")
            loop = asyncio.get_running_loop()
            fut = loop.create_future()

            def done(result):
                def settle():
                    if fut.done():
                        return
                    if isinstance(result, SessionClosed):
                        fut.set_exception(ApiError(404, "session_not_found", "the session was closed"))
                    elif isinstance(result, DeviceOutOfMemory):
                        fut.set_exception(result)
                    elif isinstance(result, BaseException):
                        fut.set_exception(EngineDead(str(result)))
                    else:
                        fut.set_result(result)
                loop.call_soon_threadsafe(settle)

            t0 = time.perf_counter()
            engine.submit_hidden(s.state, msg.hidden.float(), done)
            s.next_step += 1
            try:
                out = await fut
            except DeviceOutOfMemory:
                s.next_step -= 1  # the engine took the step back whole: the client may resend it
                raise
            s.last_used = time.monotonic()
        metrics.step_latency.observe(time.perf_counter() - t0)
        metrics.tokens.labels("split").inc(T)
        reply = HiddenReply(s.id, msg.step, out).to_bytes()
        metrics.bytes_in.labels("plaintext").inc(len(body))
        metrics.bytes_out.labels("plaintext").inc(len(reply))
        return Response(reply, media_type=CONTENT_TYPE)

    # ---- the protected path ----------------------------------------------------------------
    @app.post("/v1/keys", status_code=201)
    async def upload_keys(request: Request):
        """The client's public evaluation material (msgpack, see crypto/wire.py). Answers the
        keys' id (SHA-256 of the bytes), which sessions name. Uploading the same bytes again is
        free: keys are cached per tenant by fingerprint."""
        tenant = authenticate(request)
        if "protected" not in tenant.scopes:
            raise ApiError(403, "forbidden", "this key lacks the 'protected' scope")
        body = await read_body(request, cfg.max_key_bytes)
        try:
            ks = await asyncio.to_thread(protected.add_keys, tenant.name, body)
        except KeysError as e:
            raise ApiError(e.status, e.code, str(e)) from None
        metrics.bytes_in.labels("protected_setup").inc(len(body))
        return {"keys_id": ks.id, "param_set": protected.params.id, "bytes": ks.nbytes}

    async def create_protected_session(body: CreateSession, tenant: Tenant) -> dict:
        try:
            protected.require()
        except KeysError as e:
            raise ApiError(e.status, e.code, str(e)) from None
        if body.param_set is not None and body.param_set != protected.params.id:
            raise ApiError(400, "wrong_params", f"this server runs {protected.params.id!r}, "
                                                f"the client asked for {body.param_set!r}")
        ks = protected.key_set(tenant.name, body.keys_id or "")
        if ks is None:  # unknown and another tenant's keys look the same
            raise ApiError(404, "keys_not_found", "no such evaluation keys for this tenant; POST /v1/keys first")
        await asyncio.to_thread(protected.executor)  # first use: encodes the weights (minutes)
        try:
            s = sessions.create(tenant.name, "protected", lambda sid: protected.open(ks, sid),
                                max_on_path=cfg.max_protected_sessions)
        except OverflowError as e:
            raise ApiError(429, "too_many_sessions", str(e)) from None
        return {"id": s.id, "path": s.path, "k": half.k, "num_layers": half.config.num_layers,
                "hidden_size": half.config.hidden_size, "model": half.config.name,
                "model_fingerprint": half.fingerprint, "param_set": protected.params.id,
                "protocol_version": PROTOCOL_VERSION, "max_span": MAX_SPAN, "ttl_s": cfg.session_ttl_s,
                "max_context": min(cfg.max_context, protected.executor().limits.max_positions),
                "max_kv_bytes": cfg.max_protected_kv_bytes, "he_backend": cfg.he_backend}

    async def protected_step(s: Session, body: bytes) -> Response:
        try:
            msg = ProtectedMessage.from_bytes(body, max_bytes=cfg.max_body_bytes, kinds=UPLOAD_KINDS)
        except WireError as e:
            raise ApiError(400, "bad_message", str(e)) from None
        if msg.session_id != s.id:
            raise ApiError(400, "bad_message", "message session id does not match the URL")
        async with s.lock:
            if s.closed:
                raise ApiError(404, "session_not_found", "no such session")
            t0 = time.perf_counter()
            try:
                reply, op_seconds = await asyncio.to_thread(protected.step, msg)
            except ProtocolError as e:
                retry = {"Retry-After": "1"} if e.status in (429, 503) else None  # limits, device memory
                raise ApiError(e.status, getattr(e, "code", "protocol_error"), str(e), headers=retry) from None
            except (WireError, CiphertextError) as e:
                raise ApiError(400, "bad_ciphertext", str(e)) from None
            except HEError as e:  # a ciphertext that deserialized but cannot be evaluated
                raise ApiError(400, "bad_ciphertext", f"ciphertext rejected: {e}") from None
            s.last_used = time.monotonic()
        metrics.step_latency.observe(time.perf_counter() - t0)
        for op, sec in op_seconds.items():
            metrics.protected_op_seconds.labels(op).inc(sec)
        out = reply.to_bytes()
        metrics.bytes_in.labels("protected").inc(len(body))
        metrics.bytes_out.labels("protected").inc(len(out))
        return Response(out, media_type=CONTENT_TYPE)

    if half.full:
        from veil.server.openai_api import openai_router

        app.include_router(openai_router(cfg, half, engine, tenants, metrics))
    return app

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
from concurrent.futures import ThreadPoolExecutor

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from veil.crypto.wire import CONTENT_TYPE, HiddenReply, HiddenStep, WireError
from veil.engine.api import (
    DeviceOutOfMemory,
    EngineDead,
    SessionClosed,
    StepFailed,
    StepStats,
    WorkDropped,
)
from veil.engine.engine import Engine
from veil.engine.process import EngineProcess
from veil.engine.split import ServerHalf
from veil.server.config import ServerConfig
from veil.server.errors import ApiError, error_response
from veil.server.http_common import (
    Arriving,
    CountRequests,
    Held,
    LimitBodies,
    bearer_tenant,
    read_body,
)
from veil.server.metrics import Metrics
from veil.server.protected_api import ProtectedApi
from veil.server.protected_service import ProtectedService
from veil.server.sessions import Session, SessionLimit, SessionStore
from veil.server.tenants import Tenant, TenantStore

log = logging.getLogger("veil.server")


class CreateSession(BaseModel):
    path: str = "plaintext"
    k: int | None = None  # the client's split point; must match the server's
    model_fingerprint: str | None = None  # the client's expectation of the server half
    keys_id: str | None = None  # protected: the evaluation keys uploaded with POST /v1/keys
    param_set: str | None = None  # protected: the CKKS parameter set the client uses


def _he_compute(cfg: ServerConfig, engine: Engine | EngineProcess):
    """Where the protected path's HE computes (ProtectedService's ``compute``). The native
    backend on the CPU uses torch's intra-op threads: on the engine loop's OpenMP team
    (``Engine.call``), since a second team in the process slows both. With the engine in a
    process of its own, on one thread of this process that has the engine's thread count: the
    HE worker and request threads stay at the one thread ``veil serve`` leaves them."""
    if not cfg.he_native_on_cpu:
        return None
    if not cfg.engine_process:
        return engine.call
    threads = cfg.threads or torch.get_num_threads()
    he = ThreadPoolExecutor(1, "veil-he", initializer=torch.set_num_threads, initargs=(threads,))
    return lambda fn: he.submit(fn).result()


def create_app(cfg: ServerConfig, half: ServerHalf, tenants: TenantStore) -> FastAPI:
    metrics = Metrics()

    def on_step(s: StepStats) -> None:
        metrics.engine_steps.inc()
        metrics.engine_host_seconds.inc(s.host_seconds)
        metrics.batch_size.observe(s.num_seqs)
        metrics.batch_tokens.observe(s.num_tokens)
        metrics.kv_util.set(s.kv_utilization)

    make_engine = EngineProcess if cfg.engine_process else Engine
    engine = make_engine(half.model, half.k, cfg.engine_config(), on_step=on_step)
    protected = ProtectedService(half, cfg, _he_compute(cfg, engine))

    def drop(s: Session) -> None:
        if s.path == "protected":
            protected.close(s.id)
        elif s.state is not None:
            engine.close(s.state)

    def evicted(s: Session, why: str) -> None:
        metrics.sessions_evicted.labels(s.path, why).inc()
        log.info("dropped an idle %s session for new work (%s limit)", s.path, why)

    sessions = SessionStore(cfg.session_ttl_s, cfg.max_sessions_per_tenant, on_drop=drop,
                            evict_idle_s=cfg.session_evict_idle_s, on_evict=evicted)
    arriving = Arriving(cfg.max_arriving_bytes_per_tenant, cfg.max_arriving_bytes)
    protected_api = ProtectedApi(cfg, half, protected, sessions, tenants, metrics, arriving)

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
                if n := protected.keys.sweep():  # after the sessions: their keys' idle time starts there
                    log.info("dropped %d evaluation-key sets no session used for %g s", n, cfg.key_ttl_s)

        task = asyncio.create_task(sweeper())
        try:
            yield
        finally:
            task.cancel()
            engine.stop()

    app = FastAPI(title="Veil", version="0.1.0", lifespan=lifespan)
    app.state.sessions, app.state.tenants, app.state.half, app.state.cfg = sessions, tenants, half, cfg
    app.state.engine, app.state.metrics, app.state.protected = engine, metrics, protected
    app.state.arriving = arriving

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

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        # a bug: the API's JSON error form all the same (Starlette logs the traceback after this)
        return error_response(500, "internal_error", "the server failed on this request; its log says why")

    @app.exception_handler(EngineDead)
    async def _engine_dead(request: Request, exc: EngineDead):
        return error_response(503, "engine_unavailable", "the inference engine is not running")

    @app.exception_handler(StepFailed)
    async def _step_failed(request: Request, exc: StepFailed):
        # the engine goes on; a split step was taken back whole, a request ended
        return error_response(500, "engine_error", str(exc))

    @app.exception_handler(DeviceOutOfMemory)
    async def _device_out_of_memory(request: Request, exc: DeviceOutOfMemory):
        # the engine dropped that work whole: the same request or step may be sent again
        return error_response(503, "device_out_of_memory", str(exc), {"Retry-After": "1"})

    app.add_middleware(LimitBodies, cfg=cfg)
    app.add_middleware(CountRequests, counter=metrics.requests)  # outermost: it counts the 413s too

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
        if engine.failing:  # its loop runs, but every recent step failed (engine/failures.py)
            return error_response(503, "engine_failing", f"the engine's last {engine.failed_in_a_row} steps failed, "
                                  f"none completed since (the server log says why)")
        return {"status": "ok", "model": half.config.name, "k": half.k, "model_fingerprint": half.fingerprint,
                "sessions": len(sessions), "fast_path": half.full, "protected": protected.describe()}

    @app.get("/metrics")
    async def prometheus():
        metrics.sessions.set(len(sessions))
        metrics.running.set(engine.num_running)
        metrics.waiting.set(engine.num_waiting)
        metrics.kv_util.set(engine.kv_utilization)
        metrics.failed_steps.set(engine.failed_steps)
        metrics.failed_in_a_row.set(engine.failed_in_a_row)
        metrics.protected_kv_bytes.set(protected.kv_bytes())
        metrics.protected_key_bytes.set(protected.key_bytes())
        metrics.protected_device_bytes.set(protected.resident_bytes())
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
            return await protected_api.create_session(tenant, body.keys_id, body.param_set)
        try:
            s = sessions.create(tenant.name, body.path, lambda sid: engine.open_hidden(tenant.name))
        except SessionLimit as e:
            raise ApiError(429, "too_many_sessions", str(e), {"Retry-After": str(e.retry_after_s)}) from None
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
        s.in_flight += 1  # a step on its way (a slow upload, say) is no idleness: no eviction takes it
        try:
            with arriving.hold(tenant.name) as held:
                return await run_step(s, request, held)
        finally:
            s.in_flight -= 1

    async def run_step(s: Session, request: Request, held: Held) -> Response:
        body = await read_body(request, cfg.max_body_bytes, held)
        if s.path == "protected":
            return await protected_api.step(s, body)
        try:
            msg = HiddenStep.from_bytes(body, max_bytes=cfg.max_body_bytes, hidden_size=half.config.hidden_size,
                                        max_tokens=cfg.max_step_tokens)
        except WireError as e:
            raise ApiError(400, "bad_message", str(e)) from None
        if msg.session != s.id:
            raise ApiError(400, "bad_message", "message session id does not match the URL")
        async with s.lock:
            # Everything is checked before the engine sees the step, so a rejected step changes
            # nothing; once submitted, the step will be computed and the step id is spent.
            if s.closed:
                raise ApiError(404, "session_not_found", "no such session")
            if (again := s.resent(msg.step, body)) is not None:
                return Response(again, media_type=CONTENT_TYPE)
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
                    elif isinstance(result, WorkDropped):
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
            except WorkDropped:
                s.next_step -= 1  # the engine took the step back whole: the client may resend it
                raise
            s.last_used = time.monotonic()
            reply = HiddenReply(s.id, msg.step, out).to_bytes()
            s.answered(msg.step, body, reply)
        metrics.step_latency.observe(time.perf_counter() - t0)
        metrics.tokens.labels("split").inc(T)
        metrics.bytes_in.labels("plaintext").inc(len(body))
        metrics.bytes_out.labels("plaintext").inc(len(reply))
        return Response(reply, media_type=CONTENT_TYPE)

    app.include_router(protected_api.router)
    if half.full:
        from veil.server.openai_api import openai_router

        app.include_router(openai_router(cfg, half, engine, tenants, metrics))
    return app

"""The protected path's HTTP side: the key upload, protected session creation and each
protected message. The protocol itself is the executor's (`veil.server.protected_service`, then
`veil.protected.server`); this module turns its answers and errors into HTTP ones."""

from __future__ import annotations

import asyncio
import math
import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from veil.crypto.backend import CiphertextError, HEError
from veil.crypto.wire import CONTENT_TYPE, WireError
from veil.engine.split import ServerHalf
from veil.protected.protocol import (
    MAX_SPAN,
    PROTOCOL_VERSION,
    UPLOAD_KINDS,
    CapacityExceeded,
    DeviceBudgetExceeded,
    ProtectedMessage,
    ProtocolError,
)
from veil.server.config import ServerConfig
from veil.server.errors import ApiError
from veil.server.http_common import Arriving, bearer_tenant, read_body
from veil.server.key_sets import KeysError
from veil.server.metrics import Metrics
from veil.server.protected_service import ProtectedService
from veil.server.sessions import Session, SessionLimit, SessionStore
from veil.server.tenants import Tenant, TenantStore


class ProtectedApi:
    def __init__(self, cfg: ServerConfig, half: ServerHalf, protected: ProtectedService, sessions: SessionStore,
                 tenants: TenantStore, metrics: Metrics, arriving: Arriving):
        self.cfg, self.half, self.protected, self.sessions, self.metrics = cfg, half, protected, sessions, metrics
        self.router = APIRouter()

        def protected_tenant(request: Request) -> Tenant:
            tenant = bearer_tenant(request, tenants)
            if "protected" not in tenant.scopes:
                raise ApiError(403, "forbidden", "this key lacks the 'protected' scope")
            return tenant

        @self.router.post("/v1/keys", status_code=201)
        async def upload_keys(request: Request):
            """The client's public evaluation material (msgpack, see crypto/wire.py). Answers the
            keys' id (SHA-256 of the bytes), which sessions name. Uploading the same bytes again
            is free: keys are cached per tenant by fingerprint."""
            tenant = protected_tenant(request)
            with arriving.hold(tenant.name) as held:  # the upload's bytes until its import is done
                body = await read_body(request, cfg.max_key_bytes, held)
                try:
                    ks = await asyncio.to_thread(protected.add_keys, tenant.name, body)
                except KeysError as e:
                    raise ApiError(e.status, e.code, str(e)) from None
            metrics.bytes_in.labels("protected_setup").inc(len(body))
            return {"keys_id": ks.id, "param_set": protected.params.id, "bytes": ks.nbytes}

        @self.router.delete("/v1/keys/{keys_id}", status_code=204)
        async def delete_keys(keys_id: str, request: Request):
            """Drop the tenant's evaluation keys now (else they go ``key_ttl_s`` after their last
            session): 404 if it has none by that id, 409 while a session uses them."""
            tenant = protected_tenant(request)
            try:
                protected.keys.drop(tenant.name, keys_id)
            except KeysError as e:
                raise ApiError(e.status, e.code, str(e)) from None
            return Response(status_code=204)

    async def create_session(self, tenant: Tenant, keys_id: str | None, param_set: str | None) -> dict:
        """POST /v1/sessions with path "protected", once the shared checks (scope, split point,
        model fingerprint) have passed."""
        cfg, half, protected = self.cfg, self.half, self.protected
        try:
            protected.require()
        except KeysError as e:
            raise ApiError(e.status, e.code, str(e)) from None
        if param_set is not None and param_set != protected.params.id:
            raise ApiError(400, "wrong_params", f"this server runs {protected.params.id!r}, "
                                                f"the client asked for {param_set!r}")
        ks = protected.key_set(tenant.name, keys_id or "")
        if ks is None:  # unknown and another tenant's keys look the same
            raise ApiError(404, "keys_not_found", "no such evaluation keys for this tenant; POST /v1/keys first")
        await asyncio.to_thread(protected.executor)  # first use: encodes the weights (minutes)
        try:
            s = self.sessions.create(tenant.name, "protected", lambda sid: protected.open(ks, sid),
                                     max_on_path=cfg.max_protected_sessions)
        except SessionLimit as e:
            raise ApiError(429, "too_many_sessions", str(e), {"Retry-After": str(e.retry_after_s)}) from None
        except KeysError as e:  # dropped between the look-up and the open (the TTL, an upload's room)
            raise ApiError(e.status, e.code, str(e)) from None
        return {"id": s.id, "path": s.path, "k": half.k, "num_layers": half.config.num_layers,
                "hidden_size": half.config.hidden_size, "model": half.config.name,
                "model_fingerprint": half.fingerprint, "param_set": protected.params.id,
                "protocol_version": PROTOCOL_VERSION, "max_span": MAX_SPAN, "ttl_s": cfg.session_ttl_s,
                "max_context": min(cfg.max_context, protected.executor().limits.max_positions),
                "max_kv_bytes": cfg.max_protected_kv_bytes, "he_backend": cfg.he_backend}

    async def _run(self, s: Session, msg: ProtectedMessage) -> tuple[ProtectedMessage, dict[str, float]]:
        """The step; where the encrypted KV cache of all sessions is full, or the device budget
        has no room for the step's shuffled FFN, sessions idle for ``session_evict_idle_s`` give
        up what they hold (their cache; the shuffled W_down of a step they left half done),
        least recently used first, as many as the step lacks, and the step runs again (a
        refused step changed nothing). Where the idle ones hold too little, none goes: 429."""
        while True:
            try:
                return await asyncio.to_thread(self.protected.step, msg)
            except CapacityExceeded as e:
                held = self.protected.working_bytes if isinstance(e, DeviceBudgetExceeded) else self.protected.kv_bytes
                # only where idle sessions hold enough to make the room, and only those
                if not self.sessions.evict_for("protected", s.id, lambda v, held=held: held(v.id), e.needed):
                    raise

    async def step(self, s: Session, body: bytes) -> Response:
        """POST /v1/sessions/{id}/steps of a protected session: one protocol message. A rejected
        message leaves the session as it was (the executor's steps succeed whole or not at all)."""
        try:
            msg = ProtectedMessage.from_bytes(body, max_bytes=self.cfg.max_body_bytes, kinds=UPLOAD_KINDS)
        except WireError as e:
            raise ApiError(400, "bad_message", str(e)) from None
        if msg.session_id != s.id:
            raise ApiError(400, "bad_message", "message session id does not match the URL")
        async with s.lock:
            if s.closed:
                raise ApiError(404, "session_not_found", "no such session")
            if (again := s.resent(msg.step, body)) is not None:
                return Response(again, media_type=CONTENT_TYPE)
            t0 = time.perf_counter()
            try:
                reply, op_seconds = await self._run(s, msg)
            except ProtocolError as e:
                retry = None
                if type(e) is CapacityExceeded:  # room comes when sessions holding cache go idle
                    retry = {"Retry-After": str(math.ceil(self.sessions.idle_threshold_s))}
                elif e.status in (429, 503):  # device memory: the next try may find it
                    retry = {"Retry-After": "1"}
                raise ApiError(e.status, getattr(e, "code", "protocol_error"), str(e), headers=retry) from None
            except (WireError, CiphertextError) as e:
                raise ApiError(400, "bad_ciphertext", str(e)) from None
            except HEError as e:  # a ciphertext that deserialized but cannot be evaluated
                raise ApiError(400, "bad_ciphertext", f"ciphertext rejected: {e}") from None
            s.last_used = time.monotonic()
            out = reply.to_bytes()
            s.answered(msg.step, body, out)
        m = self.metrics
        m.step_latency.observe(time.perf_counter() - t0)
        for op, sec in op_seconds.items():
            m.protected_op_seconds.labels(op).inc(sec)
        m.bytes_in.labels("protected").inc(len(body))
        m.bytes_out.labels("protected").inc(len(out))
        return Response(out, media_type=CONTENT_TYPE)

"""One engine replica: the single-process server (``create_app``) inside a Ray Serve replica.

Every request arrives through ``forward`` and runs through the app in process
(``asgi.call_app``), so the replica answers exactly as ``veil serve`` would. Two requests need
the cluster's shared key store (``keys.KeyStore``) around them: an accepted ``POST /v1/keys``
also stores the uploaded bytes there, and a protected ``POST /v1/sessions`` naming keys this
replica has not imported imports them from there first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from dataclasses import dataclass

from starlette.requests import Request

from veil.cluster.asgi import Forwarded, Head, call_app, scope_of
from veil.cluster.routing import REPLICA_HEADER, session_prefix
from veil.server.app import create_app
from veil.server.config import ServerConfig
from veil.server.errors import ApiError, error_response
from veil.server.http_common import bearer_tenant
from veil.server.key_sets import KeysError
from veil.server.tenants import Tenant, TenantStore

log = logging.getLogger("veil.cluster")
KEY_STORE = "keys"  # the deployment-scoped actor's name


@dataclass(frozen=True)
class ReplicaSpec:
    """What a replica needs beyond the server's settings to build its engine."""

    dtype: str = "float32"


def load_half(cfg: ServerConfig, dtype_name: str):
    import torch

    from veil.engine.loader import load_checkpoint
    from veil.engine.split import load_server_half, server_half_from

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    if cfg.bundle:  # the path must exist on the replica's node
        return load_server_half(cfg.bundle, dtype=dtype)
    return server_half_from(load_checkpoint(cfg.model), cfg.k, full=True, dtype=dtype)


class VeilReplica:
    async def __init__(self, cfg: ServerConfig, spec: ReplicaSpec, tenants_json: str):
        import torch
        from ray import serve

        torch.set_num_threads(1)  # loading; the engine loop owns cfg.threads (EngineConfig.threads)
        self.id = serve.get_replica_context().replica_id.unique_id
        half = await asyncio.to_thread(load_half, cfg, spec.dtype)
        self.app = create_app(cfg, half, TenantStore.from_json(tenants_json))
        self.app.state.sessions.id_prefix = session_prefix(self.id)
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()  # the engine loop and the session sweeper
        self._header = ((REPLICA_HEADER.encode(), self.id.encode()),)
        # One line per replica start, on the replica's stderr (Ray forwards it to `veil serve`'s):
        # operators see replacements, and the fault benchmark learns which process to kill.
        print(f"veil replica {self.id} ready: pid {os.getpid()}, layers [{half.k}, {half.config.num_layers})",
              file=sys.stderr, flush=True)

    def check_health(self) -> None:
        """Ray calls this periodically; raising gets the replica replaced. An engine that lives
        but fails its steps (/health 503 engine_failing) is left in place: the ingress's /health
        counts it out of the healthy ones, and replacing it would drop its sessions for what may
        be one tenant's inputs."""
        if not self.app.state.engine.alive:
            raise RuntimeError("the engine loop died")

    def record_routing_stats(self) -> dict:
        """Ray pulls this every ``request_routing_stats_period_s`` and hands it to the router,
        which places new sessions on the replica holding the fewest on their path."""
        return {"sessions": self.app.state.sessions.per_path()}

    def __del__(self):
        if hasattr(self, "app"):
            self.app.state.engine.stop()

    async def forward(self, req: Forwarded, replica: str | None = None, opens: str | None = None):
        """Answer one request: a ``Head``, then body chunks if it streams. ``replica`` (the
        session's pin) and ``opens`` (the path of the session it opens) are read by the router
        (``router.SessionAffinityRouter``), not here."""
        if req.method == "POST" and req.path == "/v1/keys":
            yield await self._upload_keys(req)
            return
        if req.method == "POST" and req.path == "/v1/sessions":
            refused = await self._import_keys(req)
            if refused is not None:
                yield refused
                return
        if req.method == "DELETE" and req.path.startswith("/v1/keys/"):
            yield await self._delete_keys(req)
            return
        async for item in call_app(self.app, req, self._header):
            yield item

    # ---- evaluation keys through the shared store --------------------------------------------
    def _tenant(self, req: Forwarded) -> Tenant | None:
        try:
            tenant = bearer_tenant(Request(scope_of(req)), self.app.state.tenants)
        except ApiError:
            return None  # the app answers 401 itself
        return tenant if "protected" in tenant.scopes else None

    def _error(self, status: int, code: str, message: str) -> Head:
        r = error_response(status, code, message)
        return Head(status, tuple(r.raw_headers) + self._header, r.body, False)

    async def _whole(self, req: Forwarded) -> Head:
        """The app's answer to a request whose answer does not stream."""
        return [item async for item in call_app(self.app, req, self._header)][0]

    async def _upload_keys(self, req: Forwarded) -> Head:
        from ray import serve

        tenant = self._tenant(req)
        store = serve.get_deployment_actor(KEY_STORE) if tenant else None
        if store is not None and (refused := await store.refusal.remote(tenant.name, len(req.body))):
            return self._error(*refused)
        head = await self._whole(req)  # validates and imports the keys here
        if store is not None and head.status == 201 and (refused := await store.put.remote(tenant.name, req.body)):
            return self._error(*refused)
        return head

    async def _delete_keys(self, req: Forwarded) -> Head:
        """``DELETE /v1/keys/{id}``: this replica's copy (409 while one of its sessions uses it)
        and the store's; 204 where either held them. Another replica refuses new sessions on its
        copy from then on (``_import_keys``, which drops an unused copy), and its TTL drops the rest."""
        from ray import serve

        head, tenant = await self._whole(req), self._tenant(req)
        if tenant is None or head.status not in (204, 404):
            return head  # 401, 403, 409: the app's answer
        dropped = await serve.get_deployment_actor(KEY_STORE).drop.remote(tenant.name, req.path.rsplit("/", 1)[-1])
        return Head(204, self._header, b"", False) if dropped else head

    async def _import_keys(self, req: Forwarded) -> Head | None:
        """Import the tenant's keys from the store if a protected session needs them and this
        replica has not got them; an answer only when the import is refused."""
        from ray import serve

        try:
            body = json.loads(req.body)
        except ValueError:
            return None
        keys_id = body.get("keys_id") if isinstance(body, dict) and body.get("path") == "protected" else None
        tenant = self._tenant(req) if isinstance(keys_id, str) else None
        protected = self.app.state.protected
        if tenant is None:
            return None
        store = serve.get_deployment_actor(KEY_STORE)
        if protected.key_set(tenant.name, keys_id) is not None:
            if await store.touch.remote(tenant.name, keys_id):  # in use: the store keeps them for other replicas
                return None
            if await store.deleted.remote(tenant.name, keys_id):
                # Deleted through another replica: no new session names them, as on one server.
                # This copy goes now where unused; sessions open on it finish on it.
                with contextlib.suppress(KeysError):
                    protected.keys.drop(tenant.name, keys_id)
                return self._error(404, "keys_not_found", "these evaluation keys were deleted; POST /v1/keys again")
            return None
        data = await store.get.remote(tenant.name, keys_id)
        if data is None:
            return None  # never uploaded (or another tenant's): the app answers 404 keys_not_found
        try:
            await asyncio.to_thread(protected.add_keys, tenant.name, data)
        except KeysError as e:
            return self._error(e.status, e.code, str(e))
        log.info("replica %s imported keys %s… of tenant %s from the store", self.id, keys_id[:12], tenant.name)
        return None

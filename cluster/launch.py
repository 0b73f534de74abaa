"""``veil serve --replicas N``: a Ray cluster (local, or joined), the Serve application, and
waiting for a signal to take it down.

The application is two deployments: ``VeilReplica`` (N replicas, each the whole single-process
server; its request router pins sessions) and ``Ingress`` (one replica, behind Ray's HTTP proxy
on ``--host``/``--port``). Ray replaces a replica that dies or fails its health check.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from veil.server.config import ServerConfig

APP_NAME = "veil"
ROUTER = "veil.cluster.router:SessionAffinityRouter"
QUIET_LOGS = {"log_level": "WARNING", "enable_access_log": False}


@dataclass
class ClusterConfig:
    replicas: int = 2
    replica_cpus: float = 1.0  # logical CPUs Ray reserves for each engine replica
    threads: int | None = None  # torch threads per replica; None: replica_cpus, at least 1
    ray_address: str | None = None  # None: start a local Ray cluster in this process
    # Requests Ray lets into one replica at once. The engine queues and batches its own work,
    # so this only needs to exceed what a replica can hold (sessions stepping, streams open).
    max_ongoing_requests: int = 1024
    health_check_period_s: float = 5.0

    @property
    def replica_threads(self) -> int:
        return self.threads or max(1, int(self.replica_cpus))


def build_app(cfg: ServerConfig, cc: ClusterConfig, tenants_json: str):
    import ray
    from ray import serve
    from ray.serve.config import DeploymentActorConfig, RequestRouterConfig

    from veil.cluster.ingress import Ingress
    from veil.cluster.keys import KeyStore
    from veil.cluster.replica import KEY_STORE, ReplicaSpec, VeilReplica
    from veil.cluster.router import STATS_PERIOD_S
    from veil.kernels import heap

    keys = DeploymentActorConfig(name=KEY_STORE, actor_class=ray.remote(KeyStore), actor_options={"num_cpus": 0},
                                 init_kwargs={"max_bytes_per_tenant": cfg.max_key_bytes_per_tenant,
                                              "max_bytes_total": cfg.max_key_bytes_total, "ttl_s": cfg.key_ttl_s})
    engine = serve.deployment(
        VeilReplica, name="VeilReplica", num_replicas=cc.replicas, max_ongoing_requests=cc.max_ongoing_requests,
        # one malloc arena from the replica's start: its HE worker thread reuses the heap's pages
        # (kernels/heap.py); the job's working_dir still applies (a field not named is inherited)
        ray_actor_options={"num_cpus": cc.replica_cpus, "runtime_env": {"env_vars": heap.worker_env()}},
        health_check_period_s=cc.health_check_period_s,
        request_router_config=RequestRouterConfig(request_router_class=ROUTER,
                                                  request_routing_stats_period_s=STATS_PERIOD_S),
        deployment_actors=[keys],
        logging_config=QUIET_LOGS)
    ingress = serve.deployment(serve.ingress()(Ingress), name="Ingress", num_replicas=1,
                               max_ongoing_requests=4 * cc.max_ongoing_requests, ray_actor_options={"num_cpus": 0},
                               logging_config=QUIET_LOGS)
    spec = ReplicaSpec(cfg.model_dtype)
    cfg = replace(cfg, threads=cc.replica_threads)  # the replica's engine loop, not the launcher's
    return ingress.bind(engine.bind(cfg, spec, tenants_json), cfg, cc.replicas, tenants_json)


def serve_cluster(cfg: ServerConfig, cc: ClusterConfig, host: str, port: int, tls_cert: str | None = None,
                  tls_key: str | None = None) -> int:
    """Run until SIGTERM or Ctrl-C."""
    # Set before Ray is imported (it reads them then).
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine
    # Every replica's lines in this process's log (Ray would fold similar lines of replicas into one).
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray
    from ray import serve

    tenants_json = Path(cfg.tenants_file).read_text()  # shipped as text: nodes need not share a disk
    # Ray puts the driver's working directory first on every worker's sys.path, unless the job
    # names a working_dir, which workers then start in. Veil is installed, not shipped with the
    # job, so the job's working_dir is an empty one: no replica imports what lies where
    # `veil serve` was started (the checkout's kernels/ shadowed Hugging Face's `kernels`, which
    # transformers >= 5.25 imports). The paths workers open are made absolute first.
    cfg = replace(cfg, bundle=_absolute(cfg.bundle), model=_absolute(cfg.model))
    tls_cert, tls_key = _absolute(tls_cert), _absolute(tls_key)
    with tempfile.TemporaryDirectory(prefix="veil-ray-job-") as empty:  # uploaded by init, then not needed
        job = {"runtime_env": {"working_dir": empty}}
        if cc.ray_address:
            ray.init(address=cc.ray_address, **job)
        else:
            # Enough logical CPUs for every replica even where they outnumber the cores (they then share them).
            cpus = max(os.cpu_count() or 1, math.ceil(cc.replicas * cc.replica_cpus))
            ray.init(num_cpus=cpus, include_dashboard=False, **job)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        http = {"host": host, "port": port}
        if tls_cert:
            http |= {"ssl_certfile": tls_cert, "ssl_keyfile": tls_key}
        serve.start(http_options=http)
        serve.run(build_app(cfg, cc, tenants_json), name=APP_NAME, route_prefix="/")  # waits for every replica
        scheme = "https" if tls_cert else "http"
        print(f"serving {cc.replicas} engine replicas on Ray Serve at {scheme}://{host}:{port}", file=sys.stderr,
              flush=True)
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        if cc.ray_address:
            serve.delete(APP_NAME)  # someone else's cluster: take down only this application
        else:
            serve.shutdown()
        ray.shutdown()
    return 0


def _absolute(path):
    """A path given relative to where `veil serve` started, as the workers must see it."""
    return None if path is None else type(path)(Path(path).absolute())


def cmd_serve_cluster(args, cfg: ServerConfig) -> int:
    """``veil serve`` with ``--replicas``."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # not imported here: serve_cluster sets Ray's environment first
        print("error: --replicas needs Ray Serve: pip install -e '.[cluster]'", file=sys.stderr)
        return 2
    if args.replicas < 1:
        print("error: --replicas must be at least 1", file=sys.stderr)
        return 2
    cc = ClusterConfig(replicas=args.replicas, replica_cpus=args.replica_cpus, threads=args.threads,
                       ray_address=args.ray_address)
    return serve_cluster(cfg, cc, args.host, args.port, args.tls_cert, args.tls_key)

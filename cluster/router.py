"""The engine deployment's request router: session affinity, else power of two choices.

Ray Serve runs one router per deployment handle, in the caller's process (here: the ingress).
A call made with ``replica=<id>`` goes to exactly that replica while it runs; any other call,
or one whose replica is gone, goes to the less loaded of two random replicas (Ray compares
their queue lengths), as with Ray's default router. A gone replica's session is unknown to
every live one, so the stale call is answered 404 ``session_not_found`` by whichever gets it.

The router also publishes the replicas it routes to (``running_replicas``), which the
ingress needs to ask each of them for ``/health`` and ``/metrics``.
"""

from __future__ import annotations

import random
import threading

from ray.serve.request_router import (
    FIFOMixin,
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    RequestRouter,
    RunningReplica,
)

_running: tuple[str, ...] = ()  # the engine replicas' ids, as the router last saw them
_lock = threading.Lock()


def running_replicas() -> tuple[str, ...]:
    """Ids of the engine replicas the router in this process currently routes to (empty before
    the first call through the handle). One engine deployment per process: the ingress's."""
    with _lock:
        return _running


def _publish(ids) -> None:
    # Ray may load this class by value (cloudpickle), with its own copy of the module globals;
    # the import goes through sys.modules to the module the ingress reads.
    from veil.cluster import router

    with router._lock:
        router._running = tuple(sorted(ids))


class SessionAffinityRouter(FIFOMixin, LocalityMixin, MultiplexMixin, RequestRouter):
    # A CPU engine's step holds the GIL for tens of milliseconds, so on a loaded machine a
    # replica often misses Ray's default 0.1 s queue-length probe and is skipped: in one CI run
    # all 16 unpinned completions went to the other replica. Wait longer before skipping one.
    queue_len_response_deadline_s = 1.0
    max_queue_len_response_deadline_s = 4.0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is not None:
            # Back off between rounds when the chosen replicas are full, rather than spin.
            pending_request.routing_context.should_backoff = True
            pin = pending_request.kwargs.get("replica")
            if pin:
                for r in candidate_replicas:
                    if r.replica_id.unique_id == pin:
                        return [[r]]
        # Random order: between equal queue lengths Ray takes the first.
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        _publish(r.replica_id.unique_id for r in replicas)

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        _publish(r.unique_id for r in self.curr_replicas)

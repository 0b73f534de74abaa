"""The engine deployment's request router: session affinity, sessions placed by count, else
power of two choices.

Ray Serve runs one router per deployment handle, in the caller's process (here: the ingress).
A call made with ``replica=<id>`` goes to exactly that replica while it runs; any other call,
or one whose replica is gone, goes to the less loaded of two random replicas, as with Ray's
default router. A gone replica's session is unknown to every live one, so the stale call is
answered 404 ``session_not_found`` by whichever gets it.

A call that opens a session (``opens=<path>``) goes to the replica holding the fewest live
sessions on that path. A session stays on its replica for its life, and a protected one costs
its replica CKKS work on every token, so a request's moment of load says little about where it
belongs: by load alone, 8 sessions opened one after another on two replicas went 5 / 3 or
6 / 2 in 14 rounds of 20 (``benchmarks/results/2026-12-08-session-placement``). Each replica's
count arrives as its routing stats (``VeilReplica.record_routing_stats``), pulled by Ray every
``STATS_PERIOD_S``; the sessions this router opened since then are added to it.

A replica's load is Ray's queue-length cache (one added when the router sends a request, one
taken off when it ends) plus two things Ray's own router leaves out, both of which split bursts
unevenly (16 completions at once went 3 / 13 on a 2-core VM):

- requests chosen for a replica but not yet sent. Ray routes queued requests one after another
  without yielding to the event loop, so the sends, and their counts, come after a whole run
  of choices made against the same numbers;
- requests sent but not yet answered. With each acceptance the replica reports its count,
  which Ray writes over the router's; taken when the replica accepted that request, it leaves
  out the ones sent to it since.

The router also publishes the replicas it routes to (``running_replicas``), which the
ingress needs to ask each of them for ``/health`` and ``/metrics``.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict, deque

from ray.serve.request_router import (
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    RequestRouter,
    RunningReplica,
)

# A choice not sent, or a send not answered, after this long is taken as lost (the request
# cancelled, routed elsewhere after a failed probe, its replica gone) and stops counting.
PENDING_WINDOW_S = 10.0
# How often Ray pulls each replica's session counts (launch.py), and how long a session opened
# here counts on its replica besides them: the pull, Ray's broadcast of a changed count and
# the router's update take up to about one period more. A session counted twice for a moment
# only delays its replica's next one.
STATS_PERIOD_S = 1.0
OPENED_WINDOW_S = 3 * STATS_PERIOD_S

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


def _drop_expired(times: deque[float], now: float, window_s: float) -> None:
    while times and now - times[0] > window_s:
        times.popleft()


class SessionAffinityRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    # Not Ray's FIFOMixin (its default router has it): it hands the replica found for one request
    # to the oldest request still waiting, which may be pinned to another replica
    # (``_fulfill_next_pending_request`` below).
    # Ray probes a replica whose count has expired or is full. A CPU engine's step holds the
    # GIL for tens of milliseconds, so on a loaded machine a replica often missed Ray's default
    # 0.1 s deadline and was skipped (once all 16 unpinned completions of a CI run went to the
    # other replica). Wait longer before skipping one.
    queue_len_response_deadline_s = 1.0
    max_queue_len_response_deadline_s = 4.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Per replica id, the times of its choices not yet sent and of its sends not yet answered.
        self._chosen: dict[object, deque[float]] = defaultdict(deque)
        self._unanswered: dict[object, deque[float]] = defaultdict(deque)
        # Per (replica id, session path), the times of the session openings routed there lately.
        self._opened: dict[tuple[object, str], deque[float]] = defaultdict(deque)

    def load(self, replica_id) -> int:
        """Requests this router has put on a replica that the replica has not finished. A replica
        without a count in Ray's cache (none yet, or none for 10 s: idle) counts as empty."""
        chosen = self._chosen[replica_id]
        _drop_expired(chosen, time.monotonic(), PENDING_WINDOW_S)
        return (self.replica_queue_len_cache.get(replica_id) or 0) + len(chosen)

    def sessions(self, replica: RunningReplica, path: str) -> int:
        """Live sessions on ``path`` at ``replica``: its last report, plus those opened since."""
        opened = self._opened[(replica.replica_id, path)]
        _drop_expired(opened, time.monotonic(), OPENED_WINDOW_S)
        reported = (replica.routing_stats or {}).get("sessions", {}).get(path, 0)
        return reported + len(opened)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is None:  # Ray asks without a request to route: nothing is chosen
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        # Back off between rounds when the chosen replicas are full, rather than spin.
        pending_request.routing_context.should_backoff = True
        pin = pending_request.kwargs.get("replica")
        best = next((r for r in candidate_replicas if pin and r.replica_id.unique_id == pin), None)
        others = []
        opens = pending_request.kwargs.get("opens")
        if best is None and opens:
            # Every replica, fewest sessions first, then least loaded; random among equals
            # (sorted() keeps the shuffled order of equal keys).
            ranked = sorted(random.sample(candidate_replicas, len(candidate_replicas)),
                            key=lambda r: (self.sessions(r, opens), self.load(r.replica_id)))
            best, others = ranked[0], ranked[1:2]
            self._opened[(best.replica_id, opens)].append(time.monotonic())
        elif best is None:
            # Random order: min() keeps the first of equal loads.
            two = random.sample(candidate_replicas, min(2, len(candidate_replicas)))
            best = min(two, key=lambda r: self.load(r.replica_id))
            others = [r for r in two if r is not best]
        self._chosen[best.replica_id].append(time.monotonic())
        # Ray sends to ``best`` if its cached count has room, else probes it; if the probe
        # fails or finds it full, the other one is tried.
        return [[best], others] if others else [[best]]

    def _fulfill_next_pending_request(self, replica: RunningReplica, request_metadata=None) -> None:
        """Give ``replica`` to the request it was chosen for, or to none. Ray calls this from the
        routing task of the request whose metadata it passes. Its own version finds that request
        by its internal request id, but the calls one ingress request makes (``/health`` asks
        every replica at once) share it, and only the latest is indexed: the others waited
        forever. So the request is found by its metadata object."""
        pr = next((p for p in self._pending_requests_to_fulfill
                   if p.metadata is request_metadata and not p.future.done()), None)
        if pr is None:  # done meanwhile (cancelled): the replica goes unused, as in Ray's
            return
        self._cancel_routing_task_for_pending_request(pr)
        self._record_queue_wait_time(pr)
        pr.future.set_result(replica)
        if self._pending_requests_by_id.get(pr.metadata.internal_request_id) is pr:
            self._remove_pending_request_from_indices(pr)

    def on_send_request(self, replica_id) -> None:
        super().on_send_request(replica_id)
        now = time.monotonic()
        chosen = self._chosen[replica_id]
        _drop_expired(chosen, now, PENDING_WINDOW_S)
        if chosen:
            chosen.popleft()  # now counted in the cache
        self._unanswered[replica_id].append(now)

    def on_new_queue_len_info(self, replica_id, num_ongoing_requests: int) -> None:
        # One send is answered; which one does not matter, only how many are still waiting.
        waiting = self._unanswered[replica_id]
        _drop_expired(waiting, time.monotonic(), PENDING_WINDOW_S)
        if waiting:
            waiting.popleft()
        super().on_new_queue_len_info(replica_id, num_ongoing_requests + len(waiting))

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for pending in (self._chosen, self._unanswered):
            for gone in [rid for rid in pending if rid not in live]:
                del pending[gone]
        for gone in [key for key in self._opened if key[0] not in live]:
            del self._opened[gone]
        _publish(r.replica_id.unique_id for r in replicas)

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        _publish(r.unique_id for r in self.curr_replicas)

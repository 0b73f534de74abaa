"""The engine deployment's request router without a cluster: Ray's own routing code (its
queue-length cache and ``_select_from_candidate_replicas``, the step that takes a replica
from the lists ``choose_replicas`` returns) driven the way Ray's routing loop drives it, over
stand-in replicas. The stand-ins (``_Replica``) are fakes of this test only: what the router
reads of a running replica, and a queue-length probe that answers at once."""

import asyncio

import pytest

pytest.importorskip("ray.serve")

from ray.serve._private.common import (  # noqa: E402
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
)
from ray.serve._private.request_router.common import PendingRequest  # noqa: E402

from veil.cluster import router as router_module  # noqa: E402
from veil.cluster.router import SessionAffinityRouter  # noqa: E402

DEPLOYMENT = DeploymentID(name="VeilReplica", app_name="veil")


class _Replica:
    """Fake of a running replica, for this test only."""

    def __init__(self, name: str, probed_len: int = 0):
        self.replica_id = ReplicaID(unique_id=name, deployment_id=DEPLOYMENT)
        self.max_ongoing_requests = 1024
        self.node_id, self.availability_zone, self.multiplexed_model_ids = "n", None, set()
        self.probed_len = probed_len
        self.probes = 0

    async def get_queue_len(self, *, deadline_s: float) -> int:
        self.probes += 1
        return self.probed_len


def _request(replica: str | None = None) -> PendingRequest:
    meta = RequestMetadata(request_id="r", internal_request_id="i")
    return PendingRequest(args=[], kwargs={"replica": replica} if replica else {}, metadata=meta)


async def _router(*replicas: _Replica) -> SessionAffinityRouter:
    r = SessionAffinityRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN,
                              use_replica_queue_len_cache=True)  # as Ray builds it for a Python handle
    r.update_replicas(list(replicas))
    await asyncio.sleep(0.01)  # the probes of new replicas that update_replicas starts: both 0
    return r


async def _route(r: SessionAffinityRouter, request: PendingRequest) -> _Replica:
    """One routing round as Ray's loop runs it: the lists in turn until one yields a replica."""
    for candidates in await r.choose_replicas(r._replicas_list, request):
        chosen = await r._select_from_candidate_replicas(candidates, 0)
        if chosen is not None:
            return chosen
    raise AssertionError("no replica chosen")


def test_a_burst_routed_before_any_send_splits_evenly():
    # Ray routes queued requests back to back; the sends (and Ray's counts) come afterwards.
    # Without counting the choices, every one of them saw the same two zeros.
    async def go():
        a, b = _Replica("a"), _Replica("b")
        r = await _router(a, b)
        chosen = [await _route(r, _request()) for _ in range(16)]
        for c in chosen:
            r.on_send_request(c.replica_id)
        return chosen, r

    chosen, r = asyncio.run(go())
    assert [c.replica_id.unique_id for c in chosen].count("a") == 8
    assert [r.load(c.replica_id) for c in chosen[:2]] == [8, 8]  # the sends took over the choices' counts


def test_a_late_acceptance_does_not_lower_the_count():
    async def go():
        a, b = _Replica("a"), _Replica("b")
        r = await _router(a, b)
        for _ in range(3):
            r.on_send_request(a.replica_id)
        r.on_new_queue_len_info(a.replica_id, 1)  # accepted the first while two more were on the way
        after_first = r.load(a.replica_id)
        r.on_new_queue_len_info(a.replica_id, 2)
        r.on_new_queue_len_info(a.replica_id, 3)
        answered = r.load(a.replica_id)
        r.on_send_request(b.replica_id)
        r.on_new_queue_len_info(b.replica_id, 1)
        nxt = await _route(r, _request())
        for _ in range(3):
            r.decrement_queue_len_cache(a.replica_id)
        return after_first, answered, nxt.replica_id.unique_id, r.load(a.replica_id)

    assert asyncio.run(go()) == (3, 3, "b", 0)


def test_an_idle_replica_is_asked_before_a_busy_one():
    # A count expires after 10 s without traffic, so an idle replica has none; Ray alone would
    # take the busy replica's count from its cache rather than probe the idle one.
    async def go():
        idle, busy = _Replica("idle"), _Replica("busy")
        r = await _router(idle, busy)
        r.replica_queue_len_cache.invalidate_key(idle.replica_id)
        r.replica_queue_len_cache.update(busy.replica_id, 2)
        probes = idle.probes
        chosen = await _route(r, _request())
        return chosen.replica_id.unique_id, idle.probes - probes

    assert asyncio.run(go()) == ("idle", 1)


def test_pinned_requests_go_to_their_replica_and_count_there():
    async def go():
        a, b = _Replica("a"), _Replica("b")
        r = await _router(a, b)
        lists = await r.choose_replicas(r._replicas_list, _request("b"))
        gone = await r.choose_replicas(r._replicas_list, _request("zzzz"))  # no such replica: balanced
        return lists, gone, r.load(b.replica_id)

    lists, gone, load_b = asyncio.run(go())
    assert [[x.replica_id.unique_id for x in c] for c in lists] == [["b"]] and load_b == 1
    assert len(gone) == 2 and len(gone[0]) == 1


def test_choices_and_sends_never_answered_stop_counting(monkeypatch):
    monkeypatch.setattr(router_module, "PENDING_WINDOW_S", 0.05)

    async def go():
        a, b = _Replica("a"), _Replica("b")
        r = await _router(a, b)
        await r.choose_replicas(r._replicas_list, _request("a"))  # chosen, never sent (say, cancelled)
        r.on_send_request(b.replica_id)
        r.on_send_request(b.replica_id)  # one of the two answers is lost with its call
        held = r.load(a.replica_id), r.load(b.replica_id)
        await asyncio.sleep(0.1)
        r.on_new_queue_len_info(b.replica_id, 1)  # the other's, late: nothing is on the way any more
        return held, r.load(a.replica_id), r.load(b.replica_id)

    assert asyncio.run(go()) == ((1, 2), 0, 1)

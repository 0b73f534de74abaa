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

    def __init__(self, name: str, probed_len: int = 0, sessions: dict[str, int] | None = None,
                 probe_s: float = 0.0):
        self.replica_id = ReplicaID(unique_id=name, deployment_id=DEPLOYMENT)
        self.probe_s = probe_s  # how long its queue-length probe takes to answer
        # what the replica last reported of itself (VeilReplica.record_routing_stats)
        self.routing_stats = {"sessions": sessions} if sessions is not None else {}
        self.max_ongoing_requests = 1024
        self.node_id, self.availability_zone, self.multiplexed_model_ids = "n", None, set()
        self.probed_len = probed_len
        self.probes = 0

    async def get_queue_len(self, *, deadline_s: float) -> int:
        self.probes += 1
        await asyncio.sleep(self.probe_s)
        return self.probed_len


def _request(replica: str | None = None, opens: str | None = None, rid: str = "i") -> PendingRequest:
    meta = RequestMetadata(request_id="r", internal_request_id=rid)
    kwargs = {"replica": replica} if replica else {}
    return PendingRequest(args=[], kwargs=kwargs | ({"opens": opens} if opens else {}), metadata=meta)


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


def test_pinned_requests_routed_together_each_reach_their_own_replica():
    # Through Ray's whole routing loop. The first request's replica answers its probe late, so
    # the second request's replica is found first. A FIFO router (Ray's FIFOMixin) hands a
    # replica found for one request to the oldest one waiting: here, to the first request,
    # whose session that replica does not hold (the cluster's /health once counted one of its
    # two replicas, both asked at once, twice). Both calls carry one internal request id, as
    # the calls of one ingress request do: matched by that id, one of them waited forever.
    async def go():
        slow, fast = _Replica("slow", probe_s=0.3), _Replica("fast")
        r = await _router(slow, fast)
        for rep in (slow, fast):
            r.replica_queue_len_cache.invalidate_key(rep.replica_id)  # both probed
        got = await asyncio.wait_for(asyncio.gather(r._choose_replica_for_request(_request("slow", rid="same")),
                                                    r._choose_replica_for_request(_request("fast", rid="same"))), 10)
        return _names(got)

    assert asyncio.run(go()) == ["slow", "fast"]


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


def _names(chosen) -> list[str]:
    return [c.replica_id.unique_id for c in chosen]


def test_a_session_opens_on_the_replica_with_the_fewest_on_its_path():
    # Counts, not load: "a" is idle but holds 3 protected sessions; "b" is busy and holds 1.
    # Sessions on the other path do not count.
    async def go():
        a = _Replica("a", sessions={"protected": 3})
        b = _Replica("b", sessions={"protected": 1, "plaintext": 9})
        r = await _router(a, b)
        r.replica_queue_len_cache.update(b.replica_id, 5)
        protected = [await _route(r, _request(opens="protected")) for _ in range(4)]
        plaintext = await _route(r, _request(opens="plaintext"))
        balanced = [await _route(r, _request()) for _ in range(4)]  # no session: by load, as before
        return _names(protected), _names([plaintext]), _names(balanced), r.sessions(a, "protected")

    protected, plaintext, balanced, a_protected = asyncio.run(go())
    # b fills up to a's 3, then the two alternate; every opening counted where it went
    assert protected[:2] == ["b", "b"] and sorted(protected[2:]) == ["a", "b"] and a_protected == 4
    assert plaintext == ["a"]
    assert balanced == ["a"] * 4  # b's queue stays longest


def test_sessions_opened_in_a_row_split_evenly_and_then_count_as_reported(monkeypatch):
    monkeypatch.setattr(router_module, "OPENED_WINDOW_S", 0.05)

    async def go():
        a, b, c = _Replica("a", sessions={}), _Replica("b", sessions={}), _Replica("c", sessions={})
        r = await _router(a, b, c)
        burst = []
        for _ in range(9):  # one after another, each answered before the next: no load to tell them apart
            to = await _route(r, _request(opens="plaintext"))
            r.on_send_request(to.replica_id)
            r.on_new_queue_len_info(to.replica_id, 0)
            burst.append(to.replica_id.unique_id)
        await asyncio.sleep(0.1)  # past the window: only the reports count now
        a.routing_stats = {"sessions": {"plaintext": 3}}
        b.routing_stats = {"sessions": {"plaintext": 1}}  # two of b's were closed
        c.routing_stats = {"sessions": {"plaintext": 3}}
        counted = [r.sessions(x, "plaintext") for x in (a, b, c)]  # the openings of the burst forgotten
        after = _names([await _route(r, _request(opens="plaintext")) for _ in range(2)])
        return burst, counted, after

    burst, counted, after = asyncio.run(go())
    assert sorted(burst) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert counted == [3, 1, 3]
    assert after == ["b", "b"]


def test_a_gone_replica_s_openings_are_forgotten():
    async def go():
        a, b = _Replica("a", sessions={}), _Replica("b", sessions={})
        r = await _router(a, b)
        for _ in range(4):
            await _route(r, _request(opens="protected"))
        r.update_replicas([a])
        return sorted(rid.unique_id for rid, _ in r._opened)

    assert asyncio.run(go()) == ["a"]

"""The session store alone: its limits, and the idle sessions that give their place to new ones."""

import asyncio
import time

import pytest

from veil.server.sessions import SessionLimit, SessionStore


def _store(max_per_tenant=2, evict_idle_s=10.0):
    dropped, evicted = [], []
    store = SessionStore(600, max_per_tenant, on_drop=dropped.append, evict_idle_s=evict_idle_s,
                         on_evict=lambda s, why: evicted.append(s))
    return store, dropped, evicted


def _idle(s, seconds):
    s.last_used = time.monotonic() - seconds


def test_a_limit_refuses_while_no_session_has_been_idle_long_enough():
    store, dropped, evicted = _store()
    a, b = (store.create("alice", "plaintext", lambda sid: None) for _ in range(2))
    _idle(a, 5)
    with pytest.raises(OverflowError, match="max_sessions_per_tenant"):
        store.create("alice", "plaintext", lambda sid: None)
    assert len(store) == 2 and store.get(a.id, "alice") is a and not dropped and not evicted
    assert store.create("bob", "plaintext", lambda sid: None)  # another tenant's limit is its own


def test_the_least_recently_used_idle_session_gives_its_place():
    store, dropped, evicted = _store()
    a, b = (store.create("alice", "plaintext", lambda sid: None) for _ in range(2))
    _idle(a, 20), _idle(b, 30)
    c = store.create("alice", "plaintext", lambda sid: "state")
    assert dropped == evicted == [b] and b.closed and store.get(b.id, "alice") is None
    assert store.get(a.id, "alice") is a and store.get(c.id, "alice") is c and c.state == "state"
    assert len(store) == 2


def test_a_session_with_a_step_under_way_is_not_evicted():
    """Neither while its step computes (its lock held) nor while the step's request is still
    arriving (a slow upload: ``in_flight``); nor by the TTL's sweeper."""
    store, dropped, evicted = _store(max_per_tenant=3)
    a, b, c = (store.create("alice", "plaintext", lambda sid: None) for _ in range(3))
    _idle(a, 20), _idle(b, 30), _idle(c, 40)
    c.in_flight = 1

    async def with_b_locked():
        async with b.lock:  # a step of b under way: b's idle time says nothing then
            return store.create("alice", "plaintext", lambda sid: None)

    asyncio.run(with_b_locked())
    assert evicted == [a] and store.get(b.id, "alice") is b and store.get(c.id, "alice") is c
    _idle(c, 10_000)  # past the TTL too: the sweeper waits for its step as well
    assert store.sweep() == 0 and store.get(c.id, "alice") is c
    c.in_flight = 0
    assert store.sweep() == 1 and store.get(c.id, "alice") is None


def test_a_path_limit_takes_any_tenants_idle_session_on_that_path_only():
    store, dropped, evicted = _store(max_per_tenant=8)
    p = store.create("alice", "protected", lambda sid: None)
    q = store.create("bob", "plaintext", lambda sid: None)
    _idle(q, 60)  # the idlest, but on the other path
    with pytest.raises(OverflowError, match="1 protected sessions"):
        store.create("bob", "protected", lambda sid: None, max_on_path=1)
    _idle(p, 11)
    r = store.create("bob", "protected", lambda sid: None, max_on_path=1)
    assert evicted == [p] and store.get(q.id, "bob") is q and store.get(r.id, "bob") is r


def test_nothing_is_evicted_for_a_session_that_fails_to_open_or_where_eviction_is_off():
    store, dropped, evicted = _store()
    a, b = (store.create("alice", "plaintext", lambda sid: None) for _ in range(2))
    _idle(a, 20), _idle(b, 30)

    def fails(sid):
        raise KeyError("the keys went")

    with pytest.raises(KeyError):
        store.create("alice", "plaintext", fails)
    assert len(store) == 2 and not dropped and not b.closed
    off, dropped, _ = _store(evict_idle_s=None)
    for _ in range(2):
        _idle(off.create("alice", "plaintext", lambda sid: None), 1e6)
    with pytest.raises(OverflowError):
        off.create("alice", "plaintext", lambda sid: None)
    assert not dropped


def test_a_path_wide_limit_takes_idle_sessions_only_as_far_as_they_make_the_room():
    """``evict_for`` (the protected path's encrypted KV cache, full while a step of ``keep``
    waits): least recently used first, as many as hold ``needed``, sessions holding nothing
    skipped; none where the idle ones hold too little; never ``keep``, another path's session or
    a fresh one."""
    store, dropped, evicted = _store(max_per_tenant=8)
    me, a, b, empty, fresh = (store.create(t, "protected", lambda sid: None) for t in "mabef")
    plain = store.create("p", "plaintext", lambda sid: None)
    held = {me.id: 100, a.id: 30, b.id: 20, empty.id: 0, fresh.id: 500, plain.id: 500}
    for s, idle in ((me, 100), (plain, 100), (empty, 90), (a, 50), (b, 40), (fresh, 5)):
        _idle(s, idle)

    def weight(s):
        return held[s.id]

    assert store.evict_for("protected", me.id, weight, needed=51) == []  # a and b hold 50
    assert not dropped and len(store) == 6
    assert store.evict_for("protected", me.id, weight, needed=25) == [a]  # the least recently used first
    assert store.evict_for("protected", me.id, weight, needed=1) == [b]  # `empty` holds nothing to give
    assert store.evict_for("protected", me.id, weight, needed=1) == []
    assert dropped == evicted == [a, b] and store.get(empty.id, "e") is empty and store.get(fresh.id, "f") is fresh


def test_the_eviction_threshold_is_a_second_at_least():
    """Below that, sessions between two round trips of one generation would look idle."""
    from veil.server.config import ServerConfig

    for bad in (0.0, 0.5, -1.0):
        with pytest.raises(ValueError, match="session_evict_idle_s"):
            ServerConfig(session_evict_idle_s=bad)
    assert ServerConfig(session_evict_idle_s=None).session_evict_idle_s is None
    assert ServerConfig().session_evict_idle_s == 60.0


def _refusal(store, tenant, path="plaintext", **kw) -> int:
    with pytest.raises(SessionLimit) as e:
        store.create(tenant, path, lambda sid: None, **kw)
    return e.value.retry_after_s


def test_a_refusal_says_when_a_place_may_come_free():
    """Retry-After for the tenant's own limit: when its idlest session reaches the threshold (a
    busy one counts the whole threshold); with eviction off, when the TTL takes one. For a
    path's limit, whose sessions are any tenant's: the whole threshold, whatever they did."""
    store, _, _ = _store(max_per_tenant=2)  # evicts after 10 s idle
    a, b = (store.create("alice", "plaintext", lambda sid: None) for _ in range(2))
    _idle(a, 3.5), _idle(b, 6.5)
    assert _refusal(store, "alice") == 4  # b: ceil(10 - 6.5)
    b.in_flight = 1
    assert _refusal(store, "alice") == 7  # a: ceil(10 - 3.5); b's idleness starts after its step
    a.in_flight = 1
    assert _refusal(store, "alice") == 10
    a.in_flight = b.in_flight = 0
    _idle(b, 9.99)
    assert _refusal(store, "alice") == 1  # at least 1 s

    no_eviction = SessionStore(600, 1, evict_idle_s=None)
    _idle(no_eviction.create("alice", "plaintext", lambda sid: None), 100.5)
    assert _refusal(no_eviction, "alice") == 500

    path = SessionStore(600, 8, evict_idle_s=60.0)
    _idle(path.create("alice", "protected", lambda sid: None), 55)
    assert _refusal(path, "bob", "protected", max_on_path=1) == 60  # not 5: alice's activity stays hers

"""Split-plaintext generation over a real uvicorn server on loopback = local whole-model greedy."""

import httpx
import pytest

from veil.client import VeilClient
from veil.client.sdk import VeilError
from veil.engine.generate import generate_local
from veil.engine.split import server_half_from
from veil.server.app import create_app
from veil.server.config import ServerConfig
from veil.server.runner import start_background
from veil.server.tenants import TenantStore
from veil.server.tls import make_self_signed


@pytest.fixture(scope="module")
def client(live_server, client_half):
    c = VeilClient(live_server.url, live_server.keys["alice"], mode="plaintext", half=client_half)
    yield c
    c.close()


def test_split_greedy_equals_local_greedy(client, chat_prompts, local_greedy):
    for ids, expected in zip(chat_prompts, local_greedy, strict=True):
        res = client.generate(ids, max_new_tokens=32, stop_at_eos=False)
        assert res.tokens == expected
        s = res.stats
        assert s.output_tokens == 32 and s.round_trips == 32
        assert s.ttft_s > 0 and s.tpot_s > 0 and s.bytes_up > 0 and s.bytes_down > 0


def test_chat_streams_the_same_text(client, ckpt):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat(messages, max_new_tokens=24)
    pieces = list(client.chat(messages, max_new_tokens=24, stream=True))
    assert len(pieces) > 1
    assert "".join(pieces) == whole
    assert "Paris" in whole


def test_sessions_are_deleted_after_generation(client, live_server):
    """generate() closes its session; chat() keeps one for the next turn until release_session."""
    client.release_session()  # the session an earlier test's chat kept
    before = len(live_server.app.state.sessions)
    client.generate(client.chat_ids([{"role": "user", "content": "Hi"}]), 2)
    assert len(live_server.app.state.sessions) == before
    client.chat([{"role": "user", "content": "Hi"}], max_new_tokens=2)
    assert len(live_server.app.state.sessions) == before + 1
    client.release_session()
    assert len(live_server.app.state.sessions) == before


def _whole_model_answer(client, full_model, messages, n):
    """The whole model's greedy answer, up to its end-of-turn token as the SDK stops."""
    ids = generate_local(full_model, client.chat_ids(messages), n, stop_ids=tuple(client.cfg.eos_token_ids))
    return client.tokenizer.decode(ids, skip_special_tokens=True)


def test_a_chat_turn_feeds_only_what_the_kept_session_has_not_seen(live_server, client_half, full_model):
    """Three greedy turns: the second and third feed only their new tokens to the session the
    turn before kept (the same server session), and every answer is the whole model's answer
    to the conversation so far. A conversation that does not go on from the last one (an
    edited turn) gets a new session and the kept one is closed."""
    sessions = live_server.app.state.sessions
    before = len(sessions)
    with VeilClient(live_server.url, live_server.keys["alice"], half=client_half) as c:
        messages, sids, previous_seen = [], [], []
        for turn in ("What is the capital of France?", "And of Italy?", "Which of the two is larger?"):
            messages.append({"role": "user", "content": turn})
            answer = c.chat(messages, max_new_tokens=12)
            assert answer == _whole_model_answer(c, full_model, messages, 12)
            s, (session, seen) = c.last_stats, c._kept
            sids.append(session.id)
            # what the turn before fed (its prompt, its answer but the last token) is not fed again
            assert s.reused_tokens == len(previous_seen) and (s.reused_tokens > 0) == (len(sids) > 1)
            prompt = c.chat_ids(messages)  # seen: this prompt and this answer but its last token
            assert seen[: len(prompt)] == prompt and session.pos == len(seen) == len(prompt) + s.output_tokens - 1
            previous_seen = seen
            messages.append({"role": "assistant", "content": answer})
            assert len(sessions) == before + 1
        assert sids[0] == sids[1] == sids[2]
        assert s.round_trips == s.output_tokens  # the new turn's tokens went up in one step

        edited = [messages[0], messages[1], {"role": "user", "content": "And of Spain?"}]
        assert c.chat(edited, max_new_tokens=12) == _whole_model_answer(c, full_model, edited, 12)
        assert c.last_stats.reused_tokens == 0 and c._kept[0].id != sids[0]
        assert len(sessions) == before + 1 and sessions.get(sids[0], "alice") is None
    assert len(sessions) == before  # close() ends the kept session


def test_a_kept_session_the_server_dropped_is_replaced(live_server, client_half, full_model):
    """The server dropped the kept session between turns (its TTL, or a restart): the next
    turn opens a new one, feeds the whole conversation, and answers the same."""
    with VeilClient(live_server.url, live_server.keys["alice"], half=client_half) as c:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        messages.append({"role": "assistant", "content": c.chat(messages, max_new_tokens=6)})
        assert live_server.app.state.sessions.delete(c._kept[0].id, "alice")
        messages.append({"role": "user", "content": "And of Italy?"})
        assert c.chat(messages, max_new_tokens=6) == _whole_model_answer(c, full_model, messages, 6)
        s = c.last_stats
        assert s.reestablished == 1 and s.reused_tokens == 0


def test_seeded_sampling_is_reproducible(client):
    messages = [{"role": "user", "content": "Tell me a word."}]
    a = client.chat(messages, max_new_tokens=8, temperature=0.9, top_p=0.9, top_k=50, seed=7)
    b = client.chat(messages, max_new_tokens=8, temperature=0.9, top_p=0.9, top_k=50, seed=7)
    assert a == b


def test_health(client, live_server):
    r = client.http.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["k"] == 2 and body["model_fingerprint"] == live_server.half.fingerprint


def test_tls_with_a_self_signed_pair(ckpt, client_half, tmp_path, chat_prompts, local_greedy):
    cert, key = make_self_signed(tmp_path / "tls")
    tenants = TenantStore(tmp_path / "tenants.json")
    api_key = tenants.add("alice", ["plaintext"])
    srv = start_background(create_app(ServerConfig(), server_half_from(ckpt, 2), tenants),
                           ssl_certfile=str(cert), ssl_keyfile=str(key))
    try:
        assert srv.url.startswith("https://")
        with pytest.raises(httpx.ConnectError):  # an untrusted certificate is refused by default
            httpx.get(f"{srv.url}/health")
        with VeilClient(srv.url, api_key, half=client_half, verify=str(cert)) as c:
            assert c.generate(chat_prompts[0], 8, stop_at_eos=False).tokens == local_greedy[0][:8]
    finally:
        srv.stop()


def test_client_reestablishes_the_session_after_a_server_restart(make_server, client_half, chat_prompts,
                                                                 local_greedy):
    """The server restarts mid-generation (same port, all state lost): the SDK gets 404 for its
    session, opens a new one, re-prefills prompt + tokens so far, and the output is unchanged.
    A server that stays down is a clear 503 error."""
    srv = make_server()
    port = int(srv.url.rsplit(":", 1)[1])
    client = VeilClient(srv.url, srv.keys["alice"], mode="plaintext", half=client_half)
    it = client.iter_tokens(chat_prompts[0], 32, stop_at_eos=False)
    first = [next(it) for _ in range(10)]
    srv.bg.stop()
    srv.bg = start_background(create_app(srv.cfg, srv.half, srv.tenants), port=port)
    rest = list(it)
    assert first + rest == local_greedy[0]
    assert client.last_stats.reestablished == 1
    srv.bg.stop()
    with pytest.raises(VeilError) as e:
        client.generate(chat_prompts[0], 2)
    assert e.value.status == 503 and e.value.code == "server_unreachable"
    client.close()


def test_a_session_is_kept_only_when_its_caches_hold_what_was_yielded(client_half, monkeypatch):
    """The SDK's bookkeeping alone, with a stand-in session and step (fakes, in this test only):
    a verify step feeds a token and its drafts, and the caches may then run past the token the
    generation stopped at (an end-of-turn draft, a consumer that stopped reading); such a
    session is closed, not kept, since the next turn would go on at the wrong position."""
    class FakeSession:  # the caches' length only
        def __init__(self):
            self.pos, self.closed = 0, False

        def close(self):
            self.closed = True

    eos = next(iter(client_half.config.eos_token_ids))
    c = VeilClient("http://127.0.0.1:9", "unused", half=client_half)  # never connects: all faked
    opened = []

    def open_session(stats=None):
        opened.append(FakeSession())
        return opened[-1]

    def step(steps):  # each step: how many positions it feeds, and the tokens it returns
        it = iter(steps)

        def _step(session, ids, history, sampler, stats, room):
            fed, new = next(it)
            session.pos += fed
            return new
        return _step

    monkeypatch.setattr(c, "open_session", open_session)
    prompt = [10, 11, 12]
    # a prefill, then a verify step fed [5, 6, 7] that kept its 2 drafts: caches = prompt + 5 6 7
    monkeypatch.setattr(c, "_step", step([(3, [5]), (3, [6, 7, 8])]))
    assert list(c.iter_tokens(prompt, 4, keep_session=True)) == [5, 6, 7, 8]
    assert c._kept == (opened[0], prompt + [5, 6, 7]) and not opened[0].closed
    # the same, but the first draft is the end of the turn: the caches hold a token after it
    monkeypatch.setattr(c, "_step", step([(3, [5]), (3, [eos, 7, 8])]))
    assert list(c.iter_tokens([20, 21, 22], 4, keep_session=True)) == [5, eos]
    assert opened[0].closed and opened[1].closed and c._kept is None
    # a consumer that stops reading after the verify step's first token: closed too
    monkeypatch.setattr(c, "_step", step([(3, [5]), (3, [6, 7, 8])]))
    it = c.iter_tokens([30, 31, 32], 4, keep_session=True)
    assert [next(it), next(it)] == [5, 6]
    it.close()
    assert opened[2].closed and c._kept is None
    # ... and after a whole step's tokens: kept
    monkeypatch.setattr(c, "_step", step([(3, [5]), (3, [6, 7, 8])]))
    it = c.iter_tokens([40, 41, 42], 8, keep_session=True)
    assert [next(it) for _ in range(4)] == [5, 6, 7, 8]
    it.close()
    assert c._kept == (opened[3], [40, 41, 42, 5, 6, 7]) and not opened[3].closed
    c.release_session()
    assert opened[3].closed


def test_an_idle_kept_session_gives_its_place_and_its_chat_goes_on(make_server, client_half, full_model):
    """At a session limit (one per tenant here) a new session is refused (429) while the kept
    one is fresh; once that one has been idle for ``session_evict_idle_s`` it is dropped for the
    new one. The chat's next turn then opens a session of its own, feeds the conversation
    again, and answers as the whole model does."""
    srv = make_server(max_sessions_per_tenant=1, session_evict_idle_s=60)
    headers = {"Authorization": f"Bearer {srv.keys['alice']}"}
    with VeilClient(srv.url, srv.keys["alice"], half=client_half) as c:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        messages.append({"role": "assistant", "content": c.chat(messages, max_new_tokens=6)})
        kept = c._kept[0].id
        r = httpx.post(f"{srv.url}/v1/sessions", json={"path": "plaintext"}, headers=headers)
        assert r.status_code == 429 and srv.app.state.sessions.get(kept, "alice") is not None
        assert r.headers["retry-after"] == "60"  # the kept session was used a moment ago
        srv.app.state.sessions.get(kept, "alice").last_used -= 61  # as if its user read for a minute
        r = httpx.post(f"{srv.url}/v1/sessions", json={"path": "plaintext"}, headers=headers)
        assert r.status_code == 201 and srv.app.state.sessions.get(kept, "alice") is None
        assert httpx.delete(f"{srv.url}/v1/sessions/{r.json()['id']}", headers=headers).status_code == 204
        messages.append({"role": "user", "content": "And of Italy?"})
        assert c.chat(messages, max_new_tokens=6) == _whole_model_answer(c, full_model, messages, 6)
        assert c.last_stats.reestablished == 1
    assert 'veil_sessions_evicted_total{limit="sessions",path="plaintext"} 1.0' in httpx.get(f"{srv.url}/metrics").text


def test_a_client_told_to_wait_for_room_waits_for_the_servers_retry_after(make_server, client_half, full_model):
    """A full server's 429 names when a place may come free (Retry-After); a client with
    ``wait_for_room_s`` sends the request again then, and gives up once its wait runs out."""
    import time

    srv = make_server(max_sessions_per_tenant=1, session_evict_idle_s=2)
    prompt = client_half.tokenizer("The capital of France is")["input_ids"]
    with VeilClient(srv.url, srv.keys["alice"], half=client_half) as a:
        a.generate(prompt, 2, stop_at_eos=False, keep_session=True)
        kept = srv.app.state.sessions.get(a._kept[0].id, "alice")
        with VeilClient(srv.url, srv.keys["alice"], half=client_half, wait_for_room_s=0.3) as b:
            kept.last_used, t0 = time.monotonic(), time.perf_counter()
            with pytest.raises(VeilError) as e:
                b.generate(prompt, 2, stop_at_eos=False)
            assert (e.value.status, e.value.code, e.value.retry_after_s) == (429, "too_many_sessions", 2)
            assert 0.3 <= time.perf_counter() - t0 < 1.5  # one retry after 0.3 s, then the wait ran out
            assert not kept.closed
        with VeilClient(srv.url, srv.keys["alice"], half=client_half, wait_for_room_s=10) as b:
            kept.last_used, t0 = time.monotonic(), time.perf_counter()
            res = b.generate(prompt, 4, stop_at_eos=False)
            assert time.perf_counter() - t0 >= 2.0 and kept.closed  # waited its 2 s, then took the place
            assert res.tokens == generate_local(full_model, prompt, 4)
    assert 'veil_sessions_evicted_total{limit="sessions",path="plaintext"} 1.0' in httpx.get(f"{srv.url}/metrics").text


def test_a_session_whose_step_is_still_arriving_is_not_evicted(make_server, client_half):
    """A step's request counts as use from its first byte: a session that looks idle while its
    client is still uploading a step (a slow link) keeps its place, and the step then runs."""
    import threading
    import time

    import torch

    from veil.crypto.wire import CONTENT_TYPE, HiddenStep

    srv = make_server(max_sessions_per_tenant=1, session_evict_idle_s=60)
    headers = {"Authorization": f"Bearer {srv.keys['alice']}"}
    sid = httpx.post(f"{srv.url}/v1/sessions", json={"path": "plaintext"}, headers=headers).json()["id"]
    body = HiddenStep(sid, 1, torch.randn(1, client_half.config.hidden_size), [0]).to_bytes()
    go_on, replies = threading.Event(), []

    def slowly():
        yield body[:16]
        go_on.wait(30)
        yield body[16:]

    upload = threading.Thread(target=lambda: replies.append(httpx.post(
        f"{srv.url}/v1/sessions/{sid}/steps", content=slowly(), timeout=60,
        headers={**headers, "Content-Type": CONTENT_TYPE})))
    upload.start()
    session = srv.app.state.sessions.get(sid, "alice")
    deadline = time.monotonic() + 30
    while not session.in_flight and time.monotonic() < deadline:  # the server is reading the body
        time.sleep(0.01)
    session.last_used -= 61  # idle by its last step's time
    r = httpx.post(f"{srv.url}/v1/sessions", json={"path": "plaintext"}, headers=headers)
    go_on.set()
    upload.join(60)
    assert r.status_code == 429 and srv.app.state.sessions.get(sid, "alice") is session
    assert replies[0].status_code == 200 and session.in_flight == 0

"""Split-plaintext generation over a real uvicorn server on loopback = local whole-model greedy."""

import httpx
import pytest

from veil.client import VeilClient
from veil.client.sdk import VeilError
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
    before = len(live_server.app.state.sessions)
    client.chat([{"role": "user", "content": "Hi"}], max_new_tokens=2)
    assert len(live_server.app.state.sessions) == before


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

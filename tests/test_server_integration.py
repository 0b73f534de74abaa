"""Split-plaintext generation over a real uvicorn server on loopback = local whole-model greedy."""

import pytest

from veil.client import VeilClient


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

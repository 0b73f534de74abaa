"""The protected path end to end over a real loopback server: the native backend (what
``--he-backend auto`` serves wherever its C kernels build), the real parameter set
(ckks-n16384-l7-v2), the real model, split at k=28 so the server runs 2 protected layers (the
full k=2 split is covered by the benchmark). Keys are generated once. SEAL, the other production
backend, serves one generation of its own in ``test_protected_path_seal.py`` (a process of its
own: SEAL's memory pool never shrinks); it runs ~2x slower than native here (the same two
generations: ~200 s against 97 s), so these tests take the native server.
"""

import dataclasses

import httpx
import numpy as np
import pytest
import torch

from veil.benchmarks.accuracy import kl
from veil.client import VeilClient
from veil.crypto.params import PROTECTED_PARAMS
from veil.crypto.wire import CONTENT_TYPE
from veil.engine.generate import generate_local
from veil.engine.split import client_half_from
from veil.protected.client import ProtectedClientState
from veil.protected.protocol import (
    ALLOWED_KINDS,
    CtPayload,
    ProtectedMessage,
    public_material_from_bytes,
    public_material_to_bytes,
)

pytestmark = pytest.mark.he_heavy

K = 28
PROMPTS = ["The capital of France is", "1, 2, 3, 4,"]  # 5 and 11 tokens: the second is two prefill spans
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory, live_server_cls):
    srv = live_server_cls(ckpt, tmp_path_factory.mktemp("protected"), k=K, he_backend="native")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server, ckpt):
    c = VeilClient(server.url, server.keys["carol"], mode="protected", half=client_half_from(ckpt, K))
    c.generate_keys(progress=False)
    yield c
    c.close()


@pytest.fixture(scope="module")
def generations(client):
    prompts = [client.tokenizer(p)["input_ids"] for p in PROMPTS]
    return prompts, [client.generate(ids, NEW_TOKENS, stop_at_eos=False) for ids in prompts]


def _post(server, sid, body, key="carol"):
    return httpx.post(f"{server.url}/v1/sessions/{sid}/steps", content=body, timeout=120,
                      headers={"Authorization": f"Bearer {server.keys[key]}", "Content-Type": CONTENT_TYPE})


def test_protected_greedy_equals_plaintext_greedy(generations, full_model, client):
    prompts, results = generations
    assert any(len(ids) > client.prefill_span for ids in prompts)  # a prompt of several spans
    for ids, res in zip(prompts, results, strict=True):
        assert res.tokens == generate_local(full_model, ids, NEW_TOKENS)
        s = res.stats
        positions = len(ids) + NEW_TOKENS - 1
        steps = -(-len(ids) // client.prefill_span) + NEW_TOKENS - 1  # prompt spans, then one per token
        n_layers = 30 - K
        assert s.round_trips == steps * 3 * n_layers  # token + (weights, mlp_in, refreshed) per layer - 1
        assert s.output_tokens == NEW_TOKENS and s.tpot_s > 0 and s.client_cpu_s > 0
        assert s.bytes_up > positions * n_layers * 1e6  # ciphertexts, not plaintext vectors
        assert sum(s.bytes_by_kind.values()) == s.bytes_up + s.bytes_down
        assert {k.split(".")[1] for k in s.bytes_by_kind} == {"token", "scores", "weights", "mlp", "mlp_in",
                                                              "refresh", "refreshed", "final"}


def test_protected_steps_whose_replies_were_lost_are_answered_the_same(client, full_model, generations,
                                                                        loses_replies):
    """Replies lost after the server answered (a weights upload's and a later token's): the SDK
    sends each step again, the server gives the reply it had given, and the tokens are still
    plaintext greedy, in one session."""
    ids = client.tokenizer(PROMPTS[0])["input_ids"]
    plain_http, lossy = client.http, loses_replies({2, 8})
    client.http = httpx.Client(base_url=plain_http.base_url, headers=plain_http.headers, timeout=120, transport=lossy)
    try:
        res = client.generate(ids, 3, stop_at_eos=False)
    finally:
        client.http.close()
        client.http = plain_http
    assert res.tokens == generate_local(full_model, ids, 3) and res.stats.reestablished == 0
    assert lossy.steps == res.stats.round_trips + 2


def test_client_decrypted_only_protocol_values(client, generations):
    """Transcript audit over everything the SDK decrypted in the generations above."""
    kinds = set()
    # the audit records live in the client state of each session; the SDK keeps the last one
    for rec in client.last_protected_transcript:
        assert set(rec.kinds) <= ALLOWED_KINDS, rec.kinds
        kinds |= set(rec.kinds)
    assert kinds == ALLOWED_KINDS
    assert not kinds & {"q", "k", "v", "a", "o", "h"}


def test_server_holds_no_secret_key(server, client, generations, holds_no_secret):
    holds_no_secret(server.app.state.protected)
    # the upload itself: exactly the public material fields, each a public object
    from veil.crypto.wire import unpack

    sent = unpack(client._material, max_bytes=len(client._material))
    assert set(sent) == {"v", "kind", "params", "public_key", "relin_keys", "galois_keys", "rotation_steps",
                         "rotation_levels", "relin_level", "fold_key"}
    assert sent["params"] == PROTECTED_PARAMS.id


def test_the_client_makes_the_key_set_the_server_prefers(server, client, generations):
    """A native server (it hoists the baby steps) prefers the full key set in /health; the client
    made it without being told, and the greedy tokens above came through it. A SEAL server
    prefers the compact set (``test_protected_path_seal.py``)."""
    info = httpx.get(f"{server.url}/health").json()["protected"]
    assert info == {"available": True, "he_backend": "native", "param_set": PROTECTED_PARAMS.id, "key_set": "full",
                    "ready": True}
    assert client.key_set == "full" and client.he_backend == "native"
    held = next(iter(server.app.state.protected.keys.values())).backend.rotation_steps
    assert 1 in held and 3 in held


def test_server_runs_production_parameters_only(server, generations):
    from veil.crypto.params import production_param_ids

    svc = server.app.state.protected
    assert svc.params.id in production_param_ids() and svc.params is PROTECTED_PARAMS
    assert svc.cfg.he_backend == "native" and svc.executor().be.inner.name == "native"
    assert svc.executor().params_id == PROTECTED_PARAMS.id
    assert all(ks.backend.params.id == PROTECTED_PARAMS.id for ks in svc.keys.values())
    assert [ks.backend.name for ks in svc.keys.values()] == ["native"]  # the client followed /health


def test_sessions_and_ciphertexts_are_released(server, generations):
    svc = server.app.state.protected
    assert svc.executor().sessions == {}  # each generation deleted its session
    assert svc.kv_bytes() == 0


def test_bad_messages_are_rejected_and_the_session_goes_on(server, client, ckpt, full_model):
    """Replayed, out-of-order, malformed, wrong-parameter, wrong-level and foreign messages get
    4xx; the session is unchanged and finishes its position with the right result."""
    info = client._create_session()
    sid = info["id"]
    assert info["param_set"] == PROTECTED_PARAMS.id and info["k"] == K
    state = ProtectedClientState(client.he, ckpt.config, K, 30, sid)
    # a real activation (the first token of a prompt after the client's layers), not a random
    # vector: on N(0, 1) inputs of norm ~24 the flooding noise alone gives relative errors from
    # 2e-4 to 2.1e-3 run to run (8 runs and one CI failure), on this one ~2e-6
    ids = client.tokenizer(PROMPTS[0], return_tensors="pt")["input_ids"][0][:1]
    with torch.no_grad():
        h = full_model.run_layers(full_model.embed(ids), 0, K)[0].double().numpy()

    def send(msg):
        return _post(server, sid, msg.to_bytes())

    token = state.token_message(h)
    r = send(token)
    assert r.status_code == 200
    scores = ProtectedMessage.from_bytes(r.content, max_bytes=1 << 30)
    # The same message sent again (its reply lost on the way) gets the reply already given, byte
    # for byte: not recomputed, so no second draw of the flooding noise. Another message with
    # that spent step id is a replay.
    again = send(token)
    assert again.status_code == 200 and again.content == r.content
    c = token.cts[0]
    flipped = dataclasses.replace(token, cts=(CtPayload(c.tag, c.level, c.data[:-1] + bytes([c.data[-1] ^ 1]), c.token),))
    assert send(flipped).status_code == 409  # replayed step
    nxt = state.handle(scores)  # the weights upload (step 2)
    bad = [
        b"\x00garbage",  # not msgpack
        ProtectedMessage(nxt.kind, sid, nxt.step, nxt.layer, nxt.position, nxt.cts, "ckks-n8192-test").to_bytes(),
        ProtectedMessage(nxt.kind, sid, nxt.step, nxt.layer, nxt.position,
                         (CtPayload(nxt.cts[0].tag, nxt.cts[0].level - 1, nxt.cts[0].data),), nxt.params_id).to_bytes(),
        ProtectedMessage(nxt.kind, sid, nxt.step, nxt.layer, nxt.position,
                         (CtPayload(nxt.cts[0].tag, nxt.cts[0].level, nxt.cts[0].data[:-100]),),
                         nxt.params_id).to_bytes(),
        ProtectedMessage("scores", sid, nxt.step, nxt.layer, nxt.position, nxt.cts, nxt.params_id).to_bytes(),
    ]
    for body in bad:
        r = _post(server, sid, body)
        assert r.status_code == 400, (r.status_code, r.text)
    skipped = ProtectedMessage(nxt.kind, sid, nxt.step, nxt.layer + 1, nxt.position, nxt.cts, nxt.params_id)
    assert send(skipped).status_code == 409  # a message for the wrong layer
    other = ProtectedMessage(nxt.kind, "someone-else", nxt.step, nxt.layer, nxt.position, nxt.cts, nxt.params_id)
    assert send(other).status_code == 400  # body names another session than the URL
    assert _post(server, sid, nxt.to_bytes(), key="alice").status_code in (403, 404)  # foreign tenant
    # bob holds the protected scope too, yet carol's session does not exist for him (404, the
    # same answer as an unknown id), neither to step nor to delete
    assert _post(server, sid, nxt.to_bytes(), key="bob").status_code == 404
    assert _post(server, "x" * 32, nxt.to_bytes(), key="bob").status_code == 404
    r = httpx.delete(f"{server.url}/v1/sessions/{sid}", headers={"Authorization": f"Bearer {server.keys['bob']}"})
    assert r.status_code == 404
    # the session goes on: finish the position and compare with the plaintext layers
    msg = nxt
    while True:
        r = send(msg)
        assert r.status_code == 200, r.text
        out = state.handle(ProtectedMessage.from_bytes(r.content, max_bytes=1 << 30))
        if isinstance(out, np.ndarray):
            break
        msg = out
    with torch.no_grad():
        ref = full_model.run_layers(torch.tensor(h, dtype=torch.float32)[None], K, 30)[0].double().numpy()
    client._delete_session(sid)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-4


def test_key_and_session_errors(server, client):
    h = {"Authorization": f"Bearer {server.keys['carol']}"}
    url = server.url
    r = httpx.post(f"{url}/v1/keys", content=b"not keys", headers=h)
    assert r.status_code == 400
    r = httpx.post(f"{url}/v1/keys", content=b"x", headers={"Authorization": f"Bearer {server.keys['alice']}"})
    assert r.status_code == 403  # plaintext-only tenant
    # keys declared for fewer levels than the circuits rotate at are refused before any import
    client.ensure_keys()
    mat = public_material_from_bytes(client._material, max_bytes=len(client._material))
    low = dataclasses.replace(mat, rotation_levels=(0,) * len(mat.rotation_steps))
    r = httpx.post(f"{url}/v1/keys", content=public_material_to_bytes(low), headers=h, timeout=120)
    assert r.status_code == 400 and "levels" in r.text
    body = {"path": "protected", "k": K, "keys_id": "0" * 64, "param_set": PROTECTED_PARAMS.id}
    assert httpx.post(f"{url}/v1/sessions", json=body, headers=h).status_code == 404
    body["keys_id"] = client.ensure_keys()
    body["param_set"] = "ckks-n8192-l4-test"
    assert httpx.post(f"{url}/v1/sessions", json=body, headers=h).status_code == 400
    # bob (protected scope too) cannot use carol's keys
    body["param_set"] = PROTECTED_PARAMS.id
    hb = {"Authorization": f"Bearer {server.keys['bob']}"}
    assert httpx.post(f"{url}/v1/sessions", json=body, headers=hb).status_code == 404


def test_abandoned_session_is_reclaimed_within_the_ttl(ckpt, client, live_server_cls, tmp_path):
    """A client that disappears mid-generation: its session, encrypted KV cache and refresh mask
    are dropped by the TTL sweeper (short TTL here), and the server goes on serving."""
    import time

    srv = live_server_cls(ckpt, tmp_path, k=29, he_backend="native", session_ttl_s=1.0, sweep_interval_s=0.2)
    try:
        c = VeilClient(srv.url, srv.keys["carol"], mode="protected", half=client_half_from(ckpt, 29))
        c.he, c._material = client.he, client._material  # the same key pair: no new key generation
        session = c.open_session()
        state = session.state
        r = _post(srv, session.id, state.token_message(np.ones(ckpt.config.hidden_size)).to_bytes())
        assert r.status_code == 200  # the first layer's keys and values are now cached
        svc = srv.app.state.protected
        assert svc.kv_bytes() > 0 and session.id in svc.executor().sessions
        deadline = time.monotonic() + 30
        while session.id in svc.executor().sessions and time.monotonic() < deadline:
            time.sleep(0.2)
        assert session.id not in svc.executor().sessions and svc.kv_bytes() == 0
        assert len(srv.app.state.sessions) == 0
        # the server still serves a fresh session with the same keys
        res = c.generate(c.tokenizer("Hi")["input_ids"], 1, stop_at_eos=False)
        assert res.stats.output_tokens == 1
        c.close()
    finally:
        srv.stop()


def test_an_idle_protected_session_gives_its_place_at_the_server_limit(ckpt, client, live_server_cls, tmp_path,
                                                                      full_model):
    """``max_protected_sessions=1``: a second session is refused (429) while the kept one is
    fresh, and given that one's place (its encrypted KV cache released) once it has been idle
    for ``session_evict_idle_s``; the kept session's next turn then opens a new session, feeds
    its whole prompt, and its tokens are still plaintext greedy's. The same where the encrypted
    KV cache of all sessions is full: a step is refused (429) while the session holding it is
    fresh, and runs once that one, idle, gives it up."""
    from veil.client.sdk import VeilError

    srv = live_server_cls(ckpt, tmp_path, k=29, he_backend="native", max_protected_sessions=1,
                          session_evict_idle_s=60)

    def age(sid):  # as if its user had been reading for a minute
        srv.app.state.sessions.get(sid, "carol").last_used -= 61

    half = client_half_from(ckpt, 29)
    a, b = (VeilClient(srv.url, srv.keys["carol"], mode="protected", half=half) for _ in range(2))
    try:
        for c in (a, b):
            c.he, c._material = client.he, client._material  # the same key pair: no new key generation
        first = a.tokenizer("The capital of France is")["input_ids"]
        res = a.generate(first, 2, stop_at_eos=False, keep_session=True)
        kept, b._keys_id = a._kept[0].id, a._keys_id  # b goes on at once: no upload of its own
        with pytest.raises(VeilError) as e:
            b.generate(b.tokenizer("Hi")["input_ids"], 1, stop_at_eos=False)
        assert (e.value.status, e.value.code, e.value.retry_after_s) == (429, "too_many_sessions", 60)
        executor = srv.app.state.protected.executor()
        assert kept in executor.sessions
        age(kept)
        assert b.generate(b.tokenizer("Hi")["input_ids"], 1, stop_at_eos=False).stats.output_tokens == 1
        assert kept not in executor.sessions and srv.app.state.sessions.get(kept, "carol") is None
        second = first + res.tokens + a.tokenizer(" The capital of Italy is")["input_ids"]
        again = a.generate(second, 2, stop_at_eos=False)
        assert again.tokens == generate_local(full_model, second, 2) and again.stats.reestablished == 1
        assert 'veil_sessions_evicted_total{limit="sessions",path="protected"} 1.0' in httpx.get(f"{srv.url}/metrics").text

        srv.cfg.max_protected_sessions = 8  # the session count no longer binds: the KV cache's total does
        a.generate(first, 1, stop_at_eos=False, keep_session=True)
        kept, held = a._kept[0].id, executor.kv_bytes_total
        executor.limits = dataclasses.replace(executor.limits, max_kv_bytes_total=held)
        with pytest.raises(VeilError) as e:
            b.generate(b.tokenizer("Hi")["input_ids"], 1, stop_at_eos=False)
        assert (e.value.status, e.value.code, e.value.retry_after_s) == (429, "kv_capacity", 60)
        assert kept in executor.sessions and executor.kv_bytes_total == held
        age(kept)
        assert b.generate(b.tokenizer("Hi")["input_ids"], 1, stop_at_eos=False).stats.output_tokens == 1
        assert kept not in executor.sessions and srv.app.state.sessions.get(kept, "carol") is None
        text = httpx.get(f"{srv.url}/metrics").text
        assert 'veil_sessions_evicted_total{limit="capacity",path="protected"} 1.0' in text
        device = next(float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("veil_protected_device_bytes "))
        protected = srv.app.state.protected
        # no step in flight holds a shuffled W_down now: the weights and the keys
        assert device == protected.resident_bytes() == executor.encoded_bytes + protected.keys.resident() > 0
    finally:
        a.close(), b.close()
        srv.stop()


def test_four_concurrent_protected_sessions(server, client, ckpt, full_model):
    """4 protected generations at once (4 threads, one session each, the same key pair): 0
    errors, and each equals the plaintext greedy continuation of its prompt."""
    import threading

    prompts = [client.tokenizer(p)["input_ids"] for p in ("Hello", "One", "The sky", "Water")]
    results: dict = {}
    executor = server.app.state.protected.executor()
    before = set(executor.sessions)  # what other tests left open is theirs to answer for

    def run(i):
        c = VeilClient(server.url, server.keys["carol"], mode="protected", half=client.half)
        c.he, c._material, c._keys_id = client.he, client._material, client._keys_id
        try:
            results[i] = c.generate(prompts[i], 2, stop_at_eos=False).tokens
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            results[i] = e
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, ids in enumerate(prompts):
        assert results[i] == generate_local(full_model, ids, 2), results[i]
    assert set(executor.sessions) == before  # the four closed their sessions


def test_speculative_decoding_keeps_greedy_output(server, client, ckpt, full_model):
    """Drafts by prompt lookup, verified in one step each: on a repetitive prompt some drafts
    are accepted (more than one token per step), and the tokens are exactly plain greedy
    decoding's; the rejected drafts leave the server's cache (the next steps would diverge).
    A kept session then goes on with the next prompt."""
    c = VeilClient(server.url, server.keys["carol"], mode="protected", half=client.half, speculate=3)
    c.he, c._material, c._keys_id = client.he, client._material, client._keys_id  # no second key set
    try:
        ids = c.tokenizer("one two three four five, one two three four five, one two three four")["input_ids"]
        res = c.generate(ids, 10, stop_at_eos=False, keep_session=True)
        more = ids + res.tokens + c.tokenizer(" six seven")["input_ids"]
        after = c.generate(more, 2, stop_at_eos=False)
    finally:
        c.close()
    assert after.stats.reused_tokens == len(ids) + 10 - 1
    assert after.tokens == generate_local(full_model, more, 2)
    s = res.stats
    assert res.tokens == generate_local(full_model, ids, 10)
    assert s.verify_steps >= 1 and s.accepted >= 1 and s.accepted_tokens_per_step > 1.0
    steps = -(-len(ids) // c.prefill_span) + (s.output_tokens - 1 - s.accepted)  # prefill spans, then one per step
    assert s.round_trips == steps * 3 * (30 - K)


def test_a_kept_session_feeds_only_the_next_turn(server, client, full_model):
    """keep_session: the second prompt goes on from everything the first generation fed and
    sampled, so only its new tokens go up (one span, on the same encrypted KV cache), and its
    tokens are the plaintext greedy continuation of the whole second prompt."""
    executor = server.app.state.protected.executor()
    before = set(executor.sessions)
    first = client.tokenizer("The capital of France is")["input_ids"]
    a = client.generate(first, 3, stop_at_eos=False, keep_session=True)
    session, seen = client._kept
    assert seen == first + a.tokens[:-1] and set(executor.sessions) == before | {session.id}
    second = first + a.tokens + client.tokenizer(" The capital of Italy is")["input_ids"]
    b = client.generate(second, 3, stop_at_eos=False, keep_session=True)
    assert b.tokens == generate_local(full_model, second, 3)
    fed = len(second) - len(seen)
    assert b.stats.reused_tokens == len(seen) and 1 < fed <= client.prefill_span
    assert b.stats.round_trips == (1 + 3 - 1) * 3 * (30 - K)  # one span, then one step per token
    assert client._kept[0].id == session.id
    client.release_session()
    assert set(executor.sessions) == before


def test_a_span_after_rejected_drafts_goes_on_from_the_kept_positions(client, full_model):
    """A verify step whose drafts are all rejected, then a span of several new positions (what
    a kept session's next turn sends after a generation that stopped right there): the server
    takes the rejected positions off every layer's cache first, so the span's logits are the
    whole model's on the kept tokens and the span."""
    ids = client.tokenizer("The capital of France is")["input_ids"]
    more = client.tokenizer(" a city. The capital of Italy is")["input_ids"]
    session = client.open_session()
    try:
        t = int(session.forward(ids).argmax())
        rows = session.verify([t, *more[:3]])
        assert int(rows[0].argmax()) != more[0]  # the first draft is rejected, and so all three
        session.keep(1)
        logits = session.forward(more)
    finally:
        session.close()

    def whole_model(seq):
        with torch.inference_mode():
            h, _ = full_model.forward_layers(full_model.embed(torch.tensor(seq)), torch.arange(len(seq)),
                                             [None] * full_model.cfg.num_layers)
            return full_model.logits(h[-1:])[0]

    expected = whole_model(ids + [t] + more)
    assert int(logits.argmax()) == int(expected.argmax()) and kl(expected, logits) < 1e-3
    assert kl(expected, whole_model(ids + [t] + more[:3] + more)) > 1e-2  # drafts left in would show


def test_a_key_file_spares_a_new_client_its_keys_and_their_upload(server, client, full_model, tmp_path):
    """Last in the module: it drops the shared keys from the server. A client made on a key file
    of the fixture's key pair generates no keys and, while the server holds them, uploads
    nothing; its tokens are plaintext greedy's, and closing it leaves the keys for the next.
    Once the server has dropped them (`veil keys forget`, then a plain DELETE), the next such
    client uploads them and goes on."""
    from veil.cli.main import main
    from veil.client import key_file

    path = tmp_path / "carol.keys"
    secret, fold = client.he.export_secret()
    key_file.save(path, key_file.ClientKeys(PROTECTED_PARAMS.id, client.he.name, client.key_set, secret, fold,
                                            client._material))
    ids = client.tokenizer("The capital of France is")["input_ids"]
    expected = generate_local(full_model, ids, 2)
    protected, kid = server.app.state.protected, client.ensure_keys()
    for upload in (0, len(client._material)):
        with VeilClient(server.url, server.keys["carol"], mode="protected", half=client.half, key_file=path) as c:
            res = c.generate(ids, 2, stop_at_eos=False)
            assert res.tokens == expected and res.stats.setup_bytes == upload
            assert c.he is not client.he and c._keys_id == kid
        assert protected.key_set("carol", kid) is not None  # the key file's keys stay on the server
        client.release_session()
        if not upload:
            assert main(["keys", "forget", str(path), "--server", server.url, "--api-key", server.keys["carol"]]) == 0
            assert protected.key_set("carol", kid) is None and path.exists()
        else:
            r = httpx.delete(f"{server.url}/v1/keys/{kid}", headers={"Authorization": f"Bearer {server.keys['carol']}"})
            assert r.status_code == 204

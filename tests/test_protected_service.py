"""The protected service's memory bound: keys beyond ``protected_device_bytes`` are refused (429).

``ProtectedService`` is built over a stand-in for the server half (``add_keys`` reads only the
model config; the executor is never built here), with the native backend and real keys.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from veil.crypto.backend import make_backend
from veil.crypto.linear import rotation_steps_of
from veil.crypto.params import PROTECTED_PARAMS
from veil.protected.key_levels import relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.protocol import public_material_to_bytes
from veil.protected.weights import product_plan
from veil.server.config import ServerConfig
from veil.server.key_sets import KeysError
from veil.server.protected_service import ProtectedService


@pytest.fixture(scope="module")
def upload(ckpt):
    client = make_backend(PROTECTED_PARAMS, "native")
    client.generate_keys(rotation_key_levels(dims_of(ckpt.config, PROTECTED_PARAMS.slot_count)))
    return public_material_to_bytes(client.export_public_material())


def _service(ckpt, budget):
    half = SimpleNamespace(config=ckpt.config, k=28)  # stand-in: add_keys reads the config only
    return ProtectedService(half, ServerConfig(he_backend="native", protected_device_bytes=budget))


@pytest.fixture(scope="module")
def imported(ckpt, upload):
    svc = _service(ckpt, None)
    return svc, svc.add_keys("alice", upload)


def test_keys_count_what_they_hold_in_memory(imported, upload):
    svc, ks = imported
    # the seeded halves are expanded on import: memory exceeds the upload
    assert ks.resident == ks.backend.resident_bytes() > ks.nbytes == len(upload)
    assert svc.resident_bytes() == ks.resident
    be, fold = ks.backend, ks.backend._fold_key  # the fold key's tensors count too (the client sent one)
    try:
        be._fold_key = None
        without = be.resident_bytes()
    finally:
        be._fold_key = fold
    assert fold is not None and fold.nbytes > 1_000_000 and ks.resident == without + fold.nbytes


def test_keys_beyond_the_device_budget_are_refused_with_429(ckpt, upload, imported):
    need = imported[1].resident
    svc = _service(ckpt, 2 * need - 1)
    svc.add_keys("alice", upload)
    with pytest.raises(KeysError) as e:
        svc.add_keys("bob", upload)
    assert (e.value.status, e.value.code) == (429, "device_memory")
    assert [k.tenant for k in svc.keys.values()] == ["alice"]  # nothing of bob's stays
    assert svc.add_keys("alice", upload).tenant == "alice"  # the same keys again: no new memory


@pytest.mark.parametrize("bad", [{"protected_max_batch": 0}, {"protected_batch_wait_ms": -1.0},
                                 {"protected_device_bytes": 0}])
def test_bad_batching_and_memory_settings_are_refused_at_start(ckpt, bad):
    with pytest.raises(ValueError, match="protected_max_batch"):
        ProtectedService(SimpleNamespace(config=ckpt.config, k=28), ServerConfig(he_backend="native", **bad))


def test_key_imports_run_where_compute_says(ckpt, upload):
    """``compute`` (``Engine.call`` for the native backend on the CPU) builds the backend and
    imports the keys, in one call; an exception it raises leaves no keys behind."""
    seen = []

    def compute(fn):
        seen.append(fn)
        if len(seen) == 2:
            raise RuntimeError("the engine loop has stopped")
        return fn()

    half = SimpleNamespace(config=ckpt.config, k=28)
    svc = ProtectedService(half, ServerConfig(he_backend="native"), compute)
    ks = svc.add_keys("alice", upload)
    assert ks.tenant == "alice" and ks.backend.rotation_steps and len(seen) == 1
    with pytest.raises(RuntimeError, match="stopped"):
        svc.add_keys("bob", upload)
    assert [k.tenant for k in svc.keys.values()] == ["alice"]


def test_every_key_set_is_accepted_and_a_set_short_of_the_minimal_one_is_refused(ckpt, upload, imported):
    """The server requires the minimal key set, which the compact set contains, which the full
    set contains (step for step, level for level): all import; material without step 1 at the
    top level (W_qkv's chain) is refused with 400 ``missing_rotations`` and leaves nothing
    behind."""
    dims = dims_of(ckpt.config, PROTECTED_PARAMS.slot_count)
    full, compact, minimal = (rotation_key_levels(dims, key_set=ks) for ks in ("full", "compact", "minimal"))
    for big, small in ((full, compact), (compact, minimal)):
        assert all(big.get(st, -1) >= lv for st, lv in small.items()) and len(small) < len(big)
    assert compact[1] == PROTECTED_PARAMS.top_level and 3 not in compact
    # W_qkv's 3 blocks per frame chain by its stride in every set; its frame fold has a key
    qkv = product_plan(dims, "wqkv")
    stride, frame_fold = qkv.stride, rotation_steps_of(qkv.frame_folds, dims.slots)[0]
    assert stride in minimal and 2 * stride not in full and -4096 in compact and -4096 not in minimal
    assert frame_fold in minimal
    with pytest.raises(ValueError, match="unknown key set"):
        rotation_key_levels(dims, key_set="tiny")
    svc = _service(ckpt, None)
    assert svc.required_levels == minimal
    client = make_backend(PROTECTED_PARAMS, "native")
    sizes = []
    for steps in (compact, minimal):
        client.generate_keys(steps)
        sizes.append(len(small := public_material_to_bytes(client.export_public_material())))
        assert svc.add_keys("alice", small).backend.rotation_steps == tuple(sorted(steps))
    assert sizes[1] < sizes[0] < 0.65 * len(upload)  # the full set: 46 keys, compact 35, minimal 31
    client.generate_keys({**minimal, 1: PROTECTED_PARAMS.top_level - 1})
    with pytest.raises(KeysError) as e:
        svc.add_keys("bob", public_material_to_bytes(client.export_public_material()))
    assert (e.value.status, e.value.code) == (400, "missing_rotations")
    assert {k.tenant for k in svc.keys.values()} == {"alice"}


def test_a_relinearization_key_for_its_level_is_accepted_and_one_below_it_refused(ckpt):
    """The client makes its relinearization key for the highest level the circuits relinearize
    at (``relin_key_level``: 4): the server takes it, and refuses one made for a level below with
    400 ``missing_relin_level``, keeping nothing of it."""
    assert relin_key_level() == 4
    svc = _service(ckpt, None)
    client = make_backend(PROTECTED_PARAMS, "native")
    steps = rotation_key_levels(dims_of(ckpt.config, PROTECTED_PARAMS.slot_count), key_set="minimal")
    client.generate_keys(steps, relin_key_level())
    assert svc.add_keys("alice", public_material_to_bytes(client.export_public_material())).backend.relin_level == 4
    client.generate_keys(steps, relin_key_level() - 1)
    with pytest.raises(KeysError) as e:
        svc.add_keys("bob", public_material_to_bytes(client.export_public_material()))
    assert (e.value.status, e.value.code) == (400, "missing_relin_level")
    assert [k.tenant for k in svc.keys.values()] == ["alice"]


def test_the_sdk_reads_backend_and_key_set_from_health(ckpt, client_half):
    """``describe`` is what ``/health`` carries under "protected"; the SDK takes its backend and
    key set from it, and a server that says nothing (older, or unreachable) gets SEAL keys of
    the full set. The server is a ``httpx.MockTransport`` stand-in here (the live-server tests
    in test_protected_path check the real /health)."""
    import httpx

    from veil.client import VeilClient

    svc = ProtectedService(SimpleNamespace(config=ckpt.config, k=28), ServerConfig(he_backend="native"))
    assert svc.describe() == {"available": True, "he_backend": "native", "param_set": PROTECTED_PARAMS.id,
                              "key_set": "full", "ready": False}
    seal = ProtectedService(SimpleNamespace(config=ckpt.config, k=28), ServerConfig(he_backend="seal"))
    assert seal.describe()["key_set"] == "compact"
    for health, expect in (({"status": "ok", "protected": svc.describe()}, svc.describe()),
                           ({"status": "ok"}, {}), (None, {})):
        c = VeilClient("http://server", "key", mode="protected", half=client_half)
        reply = (lambda _r, h=health: httpx.Response(200, json=h)) if health else (
            lambda _r: httpx.Response(503, json={"error": {"code": "engine_unavailable"}}))
        c.http = httpx.Client(base_url="http://server", transport=httpx.MockTransport(reply))
        assert c._server_protected_info() == expect
        c.close()


def test_protected_warmup_encodes_the_weights_at_start(ckpt, live_server_cls, tmp_path, monkeypatch):
    """``--protected-warmup``: the server encodes its protected weights in the background at
    start, then (native backend on the CPU) grows its heap by what a first span takes
    (``kernels/heap.grow``, tested in test_heap; here a stand-in that records its argument and
    takes a second, so that a /health poll can see the service wait for it), and /health says
    ``ready`` only once both are done, before any protected session opened; without it the
    weights wait for the first session (``ready`` false) and nothing grows; on SEAL nothing
    grows either."""
    import time

    import httpx

    from veil.kernels import heap
    from veil.protected.protocol import MAX_SPAN

    grown = []
    monkeypatch.setattr(heap, "grow", lambda nbytes: (time.sleep(1.0), grown.append((nbytes, time.monotonic())), nbytes)[2])
    cold = live_server_cls(ckpt, tmp_path / "cold", k=29, he_backend="native")
    warm = live_server_cls(ckpt, tmp_path / "warm", k=29, protected_warmup=True, he_backend="native")
    try:
        deadline = time.monotonic() + 120
        while not httpx.get(f"{warm.url}/health").json()["protected"]["ready"]:
            assert time.monotonic() < deadline, "the warm-up did not finish"
            time.sleep(0.1)
        seen_ready = time.monotonic()
        ex = warm.app.state.protected.executor()
        assert ex.sessions == {} and httpx.get(f"{cold.url}/health").json()["protected"]["ready"] is False
        # a span's first-layer shuffled pairs, twice (the products' blocks among them), before
        # /health said ready
        assert [n for n, _ in grown] == [2 * MAX_SPAN * ex.layers[0].shuffle_bytes] and grown[0][1] <= seen_ready
    finally:
        cold.stop()
        warm.stop()
    # SEAL keeps its own memory pool: its warm-up grows nothing (an executor stand-in, built)
    seal = ProtectedService(SimpleNamespace(config=ckpt.config, k=28), ServerConfig(he_backend="seal"))
    seal._executor = SimpleNamespace(span_heap_bytes=lambda positions: 1 << 30)
    seal.warm_up()
    assert len(grown) == 1 and seal.describe()["ready"]


def test_auto_backend_is_native_where_its_kernels_run(monkeypatch):
    """``veil serve``'s default ``--he-backend auto`` resolves once, in ``ServerConfig``: native
    on CUDA and where the C kernels built, SEAL where they did not (native's torch twins are
    slower than SEAL); a named backend stays as named. /health then names the resolved one."""
    from veil.kernels import ckks_cpu

    monkeypatch.setattr(ckks_cpu, "available", lambda: True)
    assert ServerConfig().he_backend == "native"
    assert ServerConfig(he_backend="seal").he_backend == "seal"
    monkeypatch.setattr(ckks_cpu, "available", lambda: False)
    assert ServerConfig().he_backend == "seal"
    assert ServerConfig(device="cuda").he_backend == "native"
    assert ServerConfig(he_backend="native").he_backend == "native"


def test_a_malformed_fold_key_is_refused_with_400_and_an_empty_one_accepted(ckpt, upload):
    """``PublicMaterial.fold_key`` (``crypto/ring_switch.py``): a damaged key is refused with 400
    ``bad_keys`` and leaves nothing behind; material without one imports (the server then sends
    every download whole)."""
    import dataclasses

    from veil.protected.protocol import public_material_from_bytes

    svc = _service(ckpt, None)
    material = public_material_from_bytes(upload, max_bytes=len(upload))
    with pytest.raises(KeysError) as e:  # a byte short (tests/test_ring_switch.py damages it other ways)
        svc.add_keys("bob", public_material_to_bytes(dataclasses.replace(material, fold_key=material.fold_key[:-1])))
    assert (e.value.status, e.value.code) == (400, "bad_keys") and "fold key" in str(e.value)
    assert not svc.keys
    ks = svc.add_keys("alice", public_material_to_bytes(dataclasses.replace(material, fold_key=b"")))
    assert not ks.backend.can_fold and svc.add_keys("carol", upload).backend.can_fold


def test_a_model_the_layouts_cannot_hold_still_serves_the_plaintext_paths(ckpt, tmp_path, live_server_cls):
    """A Llama whose dimensions the protected slot layouts cannot hold (d = 64 here: the value
    blocks would wrap around the slot vector) does not stop the server: /health says why the
    protected path is unavailable, key uploads and protected sessions are 501, the SDK says so
    before making keys, and the fast path and the plaintext split serve as usual."""
    import httpx
    import torch

    from veil.client import VeilClient, VeilError
    from veil.engine.config import ModelConfig
    from veil.engine.loader import Checkpoint
    from veil.engine.split import client_half_from

    d, f, v, layers = 64, 128, 512, 3
    cfg = ModelConfig(vocab_size=v, hidden_size=d, intermediate_size=f, num_layers=layers, num_heads=4,
                      num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                      max_position_embeddings=1024, tie_word_embeddings=True, eos_token_ids=(2,), name="tiny")
    g = torch.Generator().manual_seed(0)  # a test model's weights, not key material
    t = {"model.embed_tokens.weight": torch.randn(v, d, generator=g) * 0.02, "model.norm.weight": torch.ones(d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj", (d, d)), ("self_attn.k_proj", (32, d)), ("self_attn.v_proj", (32, d)),
                            ("self_attn.o_proj", (d, d)), ("mlp.gate_proj", (f, d)), ("mlp.up_proj", (f, d)),
                            ("mlp.down_proj", (d, f))):
            t[p + name + ".weight"] = torch.randn(*shape, generator=g) * 0.02
        t[p + "input_layernorm.weight"] = t[p + "post_attention_layernorm.weight"] = torch.ones(d)
    tiny = Checkpoint(cfg, t, ckpt.tokenizer, "tiny", 0.0)
    with pytest.raises(ValueError):
        dims_of(cfg, PROTECTED_PARAMS.slot_count)
    srv = live_server_cls(tiny, tmp_path / "srv")
    try:
        info = httpx.get(f"{srv.url}/health").json()["protected"]
        assert info["available"] is False and "cannot lay out" in info["reason"]
        h = {"Authorization": f"Bearer {srv.keys['bob']}"}
        r = httpx.post(f"{srv.url}/v1/keys", content=b"\x80", headers=h)
        assert r.status_code == 501 and r.json()["error"]["code"] == "protected_unavailable"
        r = httpx.post(f"{srv.url}/v1/sessions", json={"path": "protected", "keys_id": "0" * 64}, headers=h)
        assert r.status_code == 501 and r.json()["error"]["code"] == "protected_unavailable"
        with VeilClient(srv.url, srv.keys["bob"], mode="protected", half=client_half_from(tiny, 2)) as c:
            with pytest.raises(VeilError) as e:
                c.generate_keys(progress=False)
            assert e.value.status == 501 and c._keys_id is None
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True},
                       headers=h, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        with VeilClient(srv.url, srv.keys["bob"], half=client_half_from(tiny, 2)) as c:
            sess = c.open_session()
            assert sess.forward([5, 6, 7]).shape == (v,)
            sess.close()
    finally:
        srv.stop()


# ---- key sets' lifetime: TTL, an upload's room, DELETE -----------------------------------------
@pytest.fixture(scope="module")
def minimal_uploads(ckpt):
    """Three different key sets of the minimal kind, each from fresh keys."""
    client = make_backend(PROTECTED_PARAMS, "native")
    steps = rotation_key_levels(dims_of(ckpt.config, PROTECTED_PARAMS.slot_count), key_set="minimal")
    out = []
    for _ in range(3):
        client.generate_keys(steps, relin_key_level())
        out.append(public_material_to_bytes(client.export_public_material()))
    assert len(set(out)) == 3
    return out


@pytest.fixture(scope="module")
def half29(ckpt):
    """A real server half whose executor (layer 29 only) encodes in seconds: sessions open on it."""
    from veil.engine.split import server_half_from

    return server_half_from(ckpt, 29)


def test_key_sets_no_session_uses_expire_after_the_key_ttl(half29, minimal_uploads):
    """``KeySets.sweep`` drops a key set once no session has used it for ``key_ttl_s``, counted from
    its upload or its last session's close; never one that an open session uses. A session
    opened on dropped keys is refused with 404 ``keys_not_found`` and leaves no session behind."""
    import time

    svc = ProtectedService(half29, ServerConfig(he_backend="native", key_ttl_s=60))
    a, b = (svc.add_keys("alice", u) for u in minimal_uploads[:2])
    c = svc.add_keys("bob", minimal_uploads[2])
    svc.open(a, "s1")
    now = time.monotonic()
    assert svc.keys.sweep(now + 30) == 0 and len(svc.keys) == 3
    assert svc.keys.sweep(now + 61) == 2 and list(svc.keys.values()) == [a]  # b and c unused; a in use
    svc.close("s1")
    closed = time.monotonic()
    assert svc.keys.sweep(closed + 59) == 0 and svc.keys.sweep(closed + 61) == 1 and not svc.keys
    assert svc.resident_bytes() == svc.executor().encoded_bytes  # nothing of the keys is counted
    with pytest.raises(KeysError) as e:
        svc.open(a, "s2")
    assert (e.value.status, e.value.code) == (404, "keys_not_found")
    assert "s2" not in svc.executor().sessions and not svc.keys._by_session
    again = svc.add_keys("alice", minimal_uploads[0])  # what the SDK does on that 404
    assert again is not a and again.id == a.id and svc.open(again, "s3") is svc.executor().sessions["s3"]
    assert b.id != c.id


def test_an_upload_over_a_limit_drops_the_tenants_own_unused_sets_first(half29, minimal_uploads):
    """An upload that would exceed the tenant's or the server's key bytes first drops that
    tenant's unused key sets, least recently used first; never one in use, never another
    tenant's. Where that cannot make room the upload is refused (429) and nothing is dropped."""
    size = max(len(u) for u in minimal_uploads)
    u0, u1, u2 = minimal_uploads
    svc = ProtectedService(half29, ServerConfig(he_backend="native", max_key_bytes_per_tenant=2 * size,
                                                max_key_bytes_total=3 * size))
    a0, a1 = svc.add_keys("alice", u0), svc.add_keys("alice", u1)
    svc.open(a1, "alice-1")
    b2 = svc.add_keys("bob", u2)
    a2 = svc.add_keys("alice", u2)  # over alice's 2 sets: her unused a0 goes, a1 (in use) stays
    assert set(svc.keys.values()) == {a1, a2, b2}
    b0 = svc.add_keys("bob", u0)  # over the server's 3: bob's own unused b2 goes, not alice's a2
    assert set(svc.keys.values()) == {a1, a2, b0} and a0.id == b0.id  # the same bytes, bob's copy
    svc.open(a2, "alice-2")
    before = dict(svc.keys)
    with pytest.raises(KeysError) as e:  # both of alice's sets are in use
        svc.add_keys("alice", u0)
    assert (e.value.status, e.value.code) == (429, "key_bytes_per_tenant") and svc.keys == before
    svc.open(b0, "bob-0")
    svc.close("alice-2")
    with pytest.raises(KeysError) as e:  # alice's a2 could go, but bob's b0 holds the third share
        svc.add_keys("carol", u1)
    assert (e.value.status, e.value.code) == (429, "key_bytes_total") and svc.keys == before
    assert svc.add_keys("alice", u1) is a1  # the same keys again: nothing new
    a3 = svc.add_keys("alice", u0)  # her now unused a2 makes the room
    assert set(svc.keys.values()) == {a1, b0, a3} and a3 is not a0


def test_keys_are_deleted_over_http_only_by_their_tenant_and_only_when_unused(ckpt, live_server_cls, tmp_path,
                                                                          minimal_uploads):
    """``DELETE /v1/keys/{id}``: 204, then the keys are gone (a session naming them: 404); 404
    for another tenant's keys (they look absent) and for unknown ones, 403 without the protected
    scope, 409 while a session uses them (they stay). ``VeilClient.close`` deletes its keys."""
    import httpx

    from veil.client import VeilClient
    from veil.crypto.wire import CONTENT_TYPE

    srv = live_server_cls(ckpt, tmp_path / "keys", k=29, he_backend="native")
    try:
        def as_(tenant):
            return {"Authorization": f"Bearer {srv.keys[tenant]}"}

        def upload(data, tenant="carol"):
            r = httpx.post(f"{srv.url}/v1/keys", content=data, headers={**as_(tenant), "Content-Type": CONTENT_TYPE},
                           timeout=120)
            assert r.status_code == 201, r.text
            return r.json()["keys_id"]

        def delete(kid, tenant="carol"):
            r = httpx.delete(f"{srv.url}/v1/keys/{kid}", headers=as_(tenant))
            return r.status_code, (r.json()["error"]["code"] if r.status_code >= 400 else None)

        def open_session(kid):
            return httpx.post(f"{srv.url}/v1/sessions", headers=as_("carol"), timeout=120,
                              json={"path": "protected", "k": 29, "keys_id": kid, "param_set": PROTECTED_PARAMS.id})

        kid = upload(minimal_uploads[0])
        assert delete(kid, "bob") == (404, "keys_not_found") and delete(kid, "alice")[0] == 403
        assert delete("0" * 64) == (404, "keys_not_found")
        r = open_session(kid)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert delete(kid) == (409, "keys_in_use")
        assert srv.app.state.protected.key_set("carol", kid) is not None
        assert httpx.delete(f"{srv.url}/v1/sessions/{sid}", headers=as_("carol")).status_code == 204
        assert delete(kid) == (204, None) and delete(kid) == (404, "keys_not_found")
        r = open_session(kid)
        assert r.status_code == 404 and r.json()["error"]["code"] == "keys_not_found"

        kid = upload(minimal_uploads[1])
        client = VeilClient(srv.url, srv.keys["carol"], mode="protected", half=SimpleNamespace(
            model=None, tokenizer=None, config=ckpt.config, k=29))  # stand-in half: close() reads no model
        client._keys_id = client._uploaded_keys_id = kid  # as ensure_keys leaves them after its upload
        client.close()
        assert srv.app.state.protected.key_set("carol", kid) is None
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def budgeted(half29, ckpt, full_model):
    """A native service of layer 29 (the first and only protected one) whose device budget holds
    the encoded weights, one key set and one position's shuffled W_gate|up and W_down; the
    client's backend, the key set, and an input h of layer 29."""
    client = make_backend(PROTECTED_PARAMS, "native")
    client.generate_keys(rotation_key_levels(dims_of(ckpt.config, PROTECTED_PARAMS.slot_count), key_set="minimal"),
                         relin_key_level())
    upload = public_material_to_bytes(client.export_public_material())
    probe = ProtectedService(half29, ServerConfig(he_backend="native"))
    keys, ex = probe.add_keys("alice", upload).resident, probe.executor()
    budget = ex.encoded_bytes + keys + ex.layers[0].shuffle_bytes
    svc = ProtectedService(half29, ServerConfig(he_backend="native", protected_device_bytes=budget))
    ids = ckpt.tokenizer("The capital of France is", return_tensors="pt")["input_ids"][0]
    with torch.no_grad():
        h = full_model.run_layers(full_model.embed(ids), 0, 29)[-1].double().numpy()
    return client, svc, svc.add_keys("alice", upload), h


def test_a_step_past_the_device_budget_is_refused_with_429_until_another_gives_its_w_down_back(budgeted, ckpt):
    """A session's WEIGHTS step runs; a second session's is refused with 429 ``device_memory``
    and left as it was while the first holds its W_down (which the key uploads' budget counts
    too); once the first's MLP_IN gives it back, the second runs, and both finish with the same
    h_L."""
    from veil.protected.client import ProtectedClientState
    from veil.protected.protocol import DeviceBudgetExceeded, MsgKind

    client, svc, ks, h = budgeted
    ex = svc.executor()
    clients = []
    for sid in ("s1", "s2"):
        svc.open(ks, sid)
        clients.append(ProtectedClientState(client, ckpt.config, 29, 30, sid))
    weights = [c.handle(svc.step(c.token_message(h))[0]) for c in clients]
    mlp = svc.step(weights[0])[0]
    assert mlp.kind == MsgKind.MLP and ex.working_bytes == svc.working_bytes("s1") > 0
    assert svc.keys._executor_bytes() == ex.encoded_bytes + ex.working_bytes  # what a key upload meets
    s2 = ex.sessions["s2"]
    before = (s2.step, s2.state, s2.kv_bytes)
    with pytest.raises(DeviceBudgetExceeded) as e:
        svc.step(weights[1])
    assert (e.value.status, e.value.code) == (429, "device_memory") and (s2.step, s2.state, s2.kv_bytes) == before
    final = clients[0].handle(svc.step(clients[0].handle(mlp))[0])
    assert ex.working_bytes == 0
    again = clients[1].handle(svc.step(clients[1].handle(svc.step(weights[1])[0]))[0])
    assert np.allclose(final, again, rtol=0, atol=1e-2 * np.abs(final).max())
    svc.close("s1"), svc.close("s2")


def test_an_idle_session_gives_up_the_w_down_it_holds_for_another_sessions_step(budgeted, ckpt, half29):
    """Over HTTP's step handler (``ProtectedApi._run``): a session that left its first-layer step
    half done holds its shuffled W_down; another session's step that the budget then cannot hold
    is refused while the holder is fresh, and once the holder has been idle for
    ``session_evict_idle_s`` it is dropped for the step, which runs."""
    import asyncio

    from veil.protected.client import ProtectedClientState
    from veil.protected.protocol import DeviceBudgetExceeded, MsgKind
    from veil.server.metrics import Metrics
    from veil.server.protected_api import ProtectedApi
    from veil.server.sessions import SessionStore

    client, svc, ks, h = budgeted
    store = SessionStore(600, 8, on_drop=lambda s: svc.close(s.id), evict_idle_s=60)
    api = ProtectedApi(svc.cfg, half29, svc, store, None, Metrics(), None)  # tenants, bodies: not used here
    a, b = (store.create("alice", "protected", lambda sid: svc.open(ks, sid)) for _ in range(2))
    ca, cb = (ProtectedClientState(client, ckpt.config, 29, 30, s.id) for s in (a, b))
    wa, wb = (c.handle(svc.step(c.token_message(h))[0]) for c in (ca, cb))
    svc.step(wa)  # a holds its W_down, and its client goes away
    with pytest.raises(DeviceBudgetExceeded):
        asyncio.run(api._run(b, wb))
    a.last_used -= 61
    reply, _ = asyncio.run(api._run(b, wb))
    assert reply.kind == MsgKind.MLP and store.get(a.id, "alice") is None
    assert a.id not in svc.executor().sessions and svc.working_bytes(b.id) > 0
    assert store.delete(b.id, "alice") and b.id not in svc.executor().sessions


def test_a_key_upload_during_a_first_layer_step_counts_the_steps_shuffled_ffn(budgeted, ckpt, half29,
                                                                             minimal_uploads):
    """Steps run on the HE worker, key uploads on request threads, neither waiting for the other.
    With a budget that holds the weights, alice's keys and either the step's shuffled pair or
    bob's keys but not both: bob's upload while alice's first-layer WEIGHTS step shuffles (made
    from inside that step, where another thread's would meet it) is refused with 429
    ``device_memory``; once alice's MLP_IN has given her W_down back, the same upload is taken."""
    from veil.protected.client import ProtectedClientState

    client, small, ks, h = budgeted
    pair = small.executor().layers[0].shuffle_bytes
    budget = small.executor().encoded_bytes + ks.resident + max(pair, ks.resident)
    svc = ProtectedService(half29, ServerConfig(he_backend="native", protected_device_bytes=budget))
    alice = svc.add_keys("alice", public_material_to_bytes(client.export_public_material()))
    ex = svc.executor()
    svc.open(alice, "a")
    ca = ProtectedClientState(client, ckpt.config, 29, 30, "a")
    weights = ca.handle(svc.step(ca.token_message(h))[0])
    during, shuffled = [], ex._shuffled

    def upload_while_shuffling(*args):
        try:
            svc.add_keys("bob", minimal_uploads[0])
            during.append("accepted")
        except KeysError as e:
            during.append((e.status, e.code))
        return shuffled(*args)

    ex._shuffled = upload_while_shuffling  # observes the step from inside; the step itself is unchanged
    try:
        mlp = svc.step(weights)[0]
    finally:
        del ex._shuffled
    assert during == [(429, "device_memory")] and [t for t, _ in svc.keys] == ["alice"]
    assert ex.device_bytes == ex.encoded_bytes + ex.working_bytes  # the step's reservation, gone with it
    assert isinstance(ca.handle(svc.step(ca.handle(mlp))[0]), np.ndarray)  # MLP_IN: alice's W_down goes back
    assert ex.working_bytes == 0 and ex.device_bytes == ex.encoded_bytes
    assert svc.add_keys("bob", minimal_uploads[0]).resident == ks.resident
    svc.close("a")


@pytest.mark.parametrize(("status", "code"), [(429, "device_memory"), (503, "device_out_of_memory")])
def test_the_sdk_sends_a_step_refused_for_device_memory_again(client_half, status, code):
    """A step refused (429 ``device_memory``) or dropped (503 ``device_out_of_memory``) for want of
    device memory changed nothing on the server: the SDK sends it again after ``Retry-After``, up
    to ``OOM_RETRIES`` times, then reports it. The server is a stand-in transport (a fake inside
    this SDK test only; the server's side is the test above)."""
    import httpx

    from veil.client.sdk import OOM_RETRIES, VeilClient, VeilError

    sent = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(request.read())
        if len(sent) <= OOM_RETRIES:
            return httpx.Response(status, headers={"Retry-After": "0"}, json={"error": {"code": code, "message": "m"}})
        return httpx.Response(200, content=b"reply")

    c = VeilClient("http://server", "k", half=client_half)
    c.http = httpx.Client(base_url="http://server", transport=httpx.MockTransport(server))
    assert c._post("/v1/sessions/s/steps", content=b"step").content == b"reply" and sent == [b"step"] * (OOM_RETRIES + 1)
    sent.clear()
    c.http = httpx.Client(base_url="http://server", transport=httpx.MockTransport(
        lambda request: sent.append(1) or httpx.Response(status, headers={"Retry-After": "0"},
                                                         json={"error": {"code": code, "message": "m"}})))
    with pytest.raises(VeilError, match=f"{status} {code}"):
        c._post("/v1/sessions/s/steps", content=b"step")
    assert len(sent) == OOM_RETRIES + 1
    c.close()

"""The protected protocol, server and client halves driven directly (no HTTP), on every backend.

Two protected layers [11, 13) of SmolLM2 (layer 12 creates the model's massive activations,
|h| ~ 22552, the headroom case) on the real parameter set (N=16384, ckks-n16384-l7-v2): 9 decode
positions with the encrypted KV cache (crossing the 8-position chunk boundary), the same
positions in prefill spans, and every refusal, checked against the plaintext ``LlamaModel``.
On ``plain`` (layouts, masks, level plan, message flow) the module takes seconds; on ``seal``
(real CKKS: noise, flooding, serialization) about two minutes on the 2-core CI machine, in a
process of its own (``he_heavy``).
"""

import dataclasses

import numpy as np
import pytest
import torch

from veil.crypto.backend import CiphertextError, HEError
from veil.crypto.params import PROTECTED_PARAMS
from veil.protected.circuits import Circuit
from veil.protected.client import HeadroomExceeded, ProtectedClientState
from veil.protected.key_levels import relin_key_level, rotation_key_levels
from veil.protected.layouts import (
    SCORES_DIV,
    dims_of,
    hidden_layout,
    score_slot,
    unpack_mlp,
    unpack_scores,
    unpack_sigma,
)
from veil.protected.protocol import (
    ALLOWED_KINDS,
    LEVELS,
    MAX_SPAN,
    CapacityExceeded,
    CtPayload,
    LimitExceeded,
    MessageError,
    MsgKind,
    ProtocolError,
    Tag,
)
from veil.protected.server import ProtectedExecutor
from veil.server.config import ServerConfig

HE_HEAVY = True
FIRST, LAST, POSITIONS = 11, 13, 9
PROMPT = "The capital of France is Paris, and the capital of Italy is"

# Error bound of the protected output relative to the plaintext block (L2 norm of h_L):
# measured 3e-5 .. 2e-4 per layer. Sources: key-switching noise of SEAL at scale 2^36
# (~2^-22 relative per rotation, measured), a few dozen rotations per layer, and the flooding
# noise on every download (std 2^(18 + 6.5 - 36) = 2^-11.5 absolute per slot, on σ, ŝ, û and
# h_L). 2e-3 for two layers leaves ~5x margin over the worst measured position.
REL_ERR_BOUND = 2e-3


LIMITS = ServerConfig().protected_limits()


@pytest.fixture(scope="module")
def keys(ckpt, he_backend, he_pair):
    """The smallest evaluation keys a server accepts (the minimal set, the relinearization key
    for level 4): the circuits compose what they lack (test_protected_batch runs the full set)."""
    steps = rotation_key_levels(dims_of(ckpt.config, PROTECTED_PARAMS.slot_count), key_set="minimal")
    return he_pair(he_backend, PROTECTED_PARAMS, steps, relin_key_level())


@pytest.fixture(scope="module")
def executor(ckpt, keys):
    return ProtectedExecutor.from_checkpoint(keys[1], ckpt, FIRST, LAST, LIMITS)


@pytest.fixture(scope="module")
def plain(ckpt, full_model):
    ids = ckpt.tokenizer(PROMPT, return_tensors="pt")["input_ids"][0][:POSITIONS]
    assert len(ids) == POSITIONS
    with torch.no_grad():
        h = full_model.run_layers(full_model.embed(ids), 0, FIRST)
        h_in = h.double().numpy()
        h = full_model.run_layers(h, FIRST, LAST)
    return h_in, h.double().numpy()


def run_token(executor, client, h):
    """One decode step through all protected layers; returns (h_L, messages)."""
    msgs = []
    msg = client.token_message(h)
    while True:
        reply = executor.handle(msg)
        msgs.append((msg, reply))
        nxt = client.handle(reply)
        if isinstance(nxt, np.ndarray):
            return nxt, msgs
        msg = nxt


@pytest.fixture(scope="module")
def decoded(ckpt, keys, executor, plain):
    h_in, _ = plain
    session = executor.new_session()
    client = ProtectedClientState(keys[0], ckpt.config, FIRST, LAST, session.id)
    outs, msgs = [], []
    for t in range(POSITIONS):
        out, m = run_token(executor, client, h_in[t])
        outs.append(out)
        msgs.append(m)
    return session, client, np.array(outs), msgs


def test_server_holds_no_secret_key(keys, ckpt):
    client, server = keys
    assert client.has_secret_key and not server.has_secret_key
    with pytest.raises(ValueError):
        ProtectedExecutor.from_checkpoint(client, ckpt, FIRST, FIRST + 1, LIMITS)


def test_protected_layers_match_plaintext(decoded, plain):
    _, ref = plain
    _, _, outs, _ = decoded
    rel = np.linalg.norm(outs - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert np.abs(ref).max() > 1e4  # the massive-activation layer is covered
    assert rel.max() < REL_ERR_BOUND, rel


def test_the_benchmarks_seeded_cache_gives_the_plaintext_step(ckpt, full_model, keys, executor, plain):
    """``protected_bench`` and ``protected_sessions`` put the cached positions' k̂ and v̂ into the
    encrypted cache directly, in the cache layout (a bench-only shortcut), and time the next
    step. The step through that cache must equal the plaintext layers', or they time a wrong
    computation: when the folded scores moved key blocks 4-7 the seeding kept the old layout
    (two-layer error 0.25, every token wrong) and nothing failed."""
    from veil.benchmarks.protected_bench import _timed_step
    from veil.protected.weights import layer_weights_from_tensors

    h_in, ref = plain
    with torch.no_grad():  # the layer's input back in the model's dtype (exact: it was that dtype)
        h1 = full_model.run_layers(torch.from_numpy(h_in).to(next(full_model.parameters()).dtype), FIRST, FIRST + 1)
    layers = (FIRST, FIRST + 1)
    weights = [layer_weights_from_tensors(ckpt.tensors, ckpt.config, i, executor.dims) for i in layers]
    # positions 0..7 seeded (every block of the first chunk, both halves), position 8 stepped
    session, *_, out = _timed_step(executor, keys[0], ckpt.config, weights, layers, h_in, h1.double().numpy(),
                                   POSITIONS)
    executor.drop_session(session.id)
    assert np.linalg.norm(out - ref[-1]) / np.linalg.norm(ref[-1]) < REL_ERR_BOUND


def test_a_level0_download_near_its_ceiling_stops_the_client(ckpt, keys, he_backend):
    """Level 0 decrypts |value| < q0 / (2 scale) = 2^20; past it a value wraps without a trace.
    The client refuses a download within half a bit of the ceiling, which also catches a value
    that wrapped (made here by switching an over-large level-1 value down to level 0)."""
    client, server = keys
    state = ProtectedClientState(client, ckpt.config, FIRST, LAST, "session")
    ceiling = client.prime(0) / (2 * PROTECTED_PARAMS.scale)
    assert np.log2(ceiling) == pytest.approx(20, abs=0.01)

    def download(value: float) -> CtPayload:  # encrypted at 1 (SEAL refuses to encode it at 0), then switched
        ct = server.mod_switch_to(client.encrypt(np.full(PROTECTED_PARAMS.slot_count, value), level=1), 0)
        return CtPayload(Tag.U_SIGMA2, 0, server.serialize(ct))

    assert np.abs(state._decrypt(download(2.0**18.5), FIRST) - 2.0**18.5).max() < 1
    with pytest.raises(HeadroomExceeded, match="ceiling"):
        state._decrypt(download(2.0**19.7), FIRST)
    if he_backend == "plain":  # the slot-vector double refuses the overflow itself; CKKS wraps it
        with pytest.raises(HEError, match="overflow"):
            download(1.2 * ceiling)
    else:
        wrapped = download(1.2 * ceiling)
        got = client.decrypt(client.deserialize(wrapped.data, level=0))
        assert np.abs(got + 0.8 * ceiling).max() < 1  # 1.2 x 2^20 decrypts as -0.8 x 2^20
        with pytest.raises(HeadroomExceeded):
            state._decrypt(wrapped, FIRST)
    assert len(state.transcript) == 1  # the refused downloads were not recorded as decrypted


def test_round_trips_and_kv_cache(decoded, executor):
    session, client, _, msgs = decoded
    n = LAST - FIRST
    for m in msgs:
        assert len(m) == 3 * n  # token + (weights, mlp_in, refreshed) per layer, no refresh after the last
        assert [q.kind for q, _ in m] == [MsgKind.TOKEN] + [
            MsgKind.WEIGHTS, MsgKind.MLP_IN, MsgKind.REFRESHED] * (n - 1) + [MsgKind.WEIGHTS, MsgKind.MLP_IN]
        assert [r.kind for _, r in m] == [MsgKind.SCORES] + [MsgKind.MLP, MsgKind.REFRESH, MsgKind.SCORES] * (
            n - 1) + [MsgKind.MLP, MsgKind.FINAL]
    chunks = -(-POSITIONS // executor.dims.per_chunk)
    for layer in range(FIRST, LAST):
        kv = session.kv[layer]
        assert len(kv.keys) == len(kv.values) == chunks
    ct_bytes = lambda level: 2 * (level + 1) * PROTECTED_PARAMS.poly_modulus_degree * 8  # noqa: E731
    lv = executor.levels
    assert lv.keys == lv.kv - 1  # keys are stored where they are used
    assert session.kv_bytes == chunks * n * (ct_bytes(lv.keys) + ct_bytes(lv.kv))
    assert session.state.length == POSITIONS and client.position == POSITIONS


def test_rope_plaintexts_are_shared_by_layers_and_bounded(decoded, executor):
    """RoPE's encoded factors depend on the position alone: both layers of a token reuse one
    set (six: cos, -sin, sin for q and for k), and only the last MAX_SPAN positions' stay
    encoded (~5.5 MB each at N=16384), however long the session runs."""
    assert POSITIONS > MAX_SPAN  # the decode above ran past the bound
    cached = executor.consts.rope_plains
    assert sorted(t for t, _, _ in cached) == list(range(POSITIONS - MAX_SPAN, POSITIONS))
    assert len({(level, scale) for _, level, scale in cached}) == 1  # one level and scale for all layers
    for factors in cached.values():
        assert sorted(factors) == [0, executor.dims.qdim]  # q's lanes and k's
        assert all(len(row) == 3 and all(pt is not None for pt in row) for row in factors.values())


def scores_slots(dims, positions: int) -> np.ndarray:
    """Every slot the scores download may carry something in."""
    idx = [score_slot(dims, p, h) for p in range(positions) for h in range(dims.heads)]
    return np.array(sorted(idx + [dims.sigma_slot]))


def audit(client, dims) -> set:
    """Every value ``client`` decrypted has a kind of the protocol's table, and the decrypted
    vectors carry nothing outside the documented slots. Returns the kinds seen."""
    forbidden = {"q", "k", "v", "a", "o", "h"}
    seen = set()
    for rec in client.transcript:
        assert set(rec.kinds) <= ALLOWED_KINDS, rec.kinds
        assert not set(rec.kinds) & forbidden
        seen |= set(rec.kinds)
        if rec.values is None:  # the masked h' went through refresh_reencrypt only
            assert rec.kinds == ("masked_h",)
            continue
        v = rec.values
        if rec.tag == Tag.SCORES_SIGMA:
            keep = np.unique(scores_slots(dims, rec.position + 1) % len(v))  # folded: S/2 slots
        elif rec.tag == Tag.SIGMA:
            keep = np.array([dims.sigma_slot])
        elif rec.tag == Tag.U_SIGMA2:
            keep = np.r_[np.arange(2 * dims.ffn), dims.sigma2_slot]
        else:
            assert rec.tag == Tag.H_FINAL and rec.layer == LAST
            keep = np.arange(dims.d)
        if rec.tag == Tag.U_SIGMA2:
            v = v - v[dims.sigma2_slot]  # σ'/(8d) rides in every slot (documented)
        elif rec.tag in (Tag.SCORES_SIGMA, Tag.SIGMA):
            v = v - v[dims.sigma_slot]  # and σ/(8d) in every slot of the scores download
        rest = np.delete(v, keep)
        assert np.abs(rest).max() < 5e-3, (rec.tag, np.abs(rest).max())  # flooding noise only
    return seen


def test_transcript_audit(decoded, executor):
    _, client, _, _ = decoded
    assert audit(client, executor.dims) == ALLOWED_KINDS


SPANS = (5, 4)  # 9 positions in two prefill steps; the second crosses the 8-position chunk boundary


@pytest.fixture(scope="module")
def spanned(ckpt, keys, executor, plain):
    """The same 9 positions as ``decoded``, prefilled in spans: every round trip carries a span.
    On a backend that batches (plain, native) the span's products run as the rows of one batch,
    as they do where a batch pays (a GPU: ``HEBackend.batch_pays``); on SEAL one by one."""
    h_in, _ = plain
    session = executor.new_session()
    client = ProtectedClientState(keys[0], ckpt.config, FIRST, LAST, session.id)
    outs, msgs, a, batches = [], [], 0, []
    cls = type(keys[1])
    with pytest.MonkeyPatch.context() as mp:
        if cls.supports_batch:
            make = cls.batched
            mp.setattr(cls, "batch_pays", property(lambda self: True))
            mp.setattr(cls, "batched", classmethod(lambda c, rows: batches.append(len(rows)) or make(rows)))
        for n in SPANS:
            out, m = run_token(executor, client, h_in[a : a + n])
            outs.append(out)
            msgs.append(m)
            a += n
    yield session, client, np.array(outs), msgs, batches
    executor.drop_session(session.id)


def test_prefill_spans_match_one_position_steps(spanned, decoded, plain, executor, keys):
    """A prefill span (its products batched where the backend batches) computes what
    one-position steps compute: the span's last h_L, every
    layer's r_j (from σ_j), and the encrypted KV cache (decrypted and compared), with 3 round
    trips per layer per span. At the last layer only the span's last position goes past its KV
    append: the others send σ alone and no weights."""
    _, ref = plain
    session, client, outs, msgs, batches = spanned
    s1, c1, outs1, _ = decoded
    if keys[1].supports_batch:  # per layer and span: W_qkv, W_o, W_gate|up, W_down (the last layer: one position)
        n_layers = LAST - FIRST
        assert batches == [span for span in SPANS for _ in range(4 * n_layers - 3)], batches
    ends = np.cumsum(SPANS) - 1
    rel = np.linalg.norm(outs - ref[ends], axis=1) / np.linalg.norm(ref[ends], axis=1)
    assert rel.max() < REL_ERR_BOUND, rel
    assert np.abs(outs - outs1[ends]).max() / np.abs(outs1[ends]).max() < REL_ERR_BOUND
    n = LAST - FIRST
    for span, m in zip(SPANS, msgs, strict=True):
        assert len(m) == 3 * n
        for q, r in m:
            assert q.count == r.count == span
            last_layer = q.layer == LAST - 1 and q.kind in (MsgKind.WEIGHTS, MsgKind.MLP_IN)
            assert len(q.cts) == (1 if last_layer else span), (q.kind, q.layer, len(q.cts))
    for layer in range(FIRST, LAST):
        np.testing.assert_allclose(client.r[layer], c1.r[layer], rtol=1e-3)
        for which, level in (("keys", executor.levels.keys), ("values", executor.levels.kv)):
            for ct, ct1 in zip(getattr(session.kv[layer], which), getattr(s1.kv[layer], which), strict=True):
                x, y = (keys[0].decrypt(keys[0].deserialize(keys[1].serialize(c), level=level))
                        for c in (ct, ct1))
                assert np.abs(x - y).max() < 1e-3 * np.abs(y).max(), (layer, which)
    assert session.kv_bytes == s1.kv_bytes and session.state.length == client.position == sum(SPANS)
    sigma_only = [(r.layer, r.position) for r in client.transcript if r.tag == Tag.SIGMA]
    assert sorted(sigma_only) == sorted((LAST - 1, p) for p in range(sum(SPANS)) if p not in ends)
    assert audit(client, executor.dims) == ALLOWED_KINDS


def test_span_with_a_missing_position_is_refused(ckpt, keys, executor, plain):
    """A span whose message lacks one position's ciphertext is refused (400) before any work;
    the session is unchanged and the full span then goes through."""
    h_in, _ = plain
    s = executor.new_session()
    c = ProtectedClientState(keys[0], ckpt.config, FIRST, LAST, s.id)
    msg = c.token_message(h_in[:3])
    for cts in (msg.cts[:2], msg.cts[:2] + (dataclasses.replace(msg.cts[0], token=2, tag=Tag.W),)):
        with pytest.raises(MessageError) as e:
            executor.handle(dataclasses.replace(msg, cts=cts))
        assert e.value.status == 400
        assert (s.step, s.state.expect, s.kv_bytes, s.state.length) == (-1, MsgKind.TOKEN, 0, 0)
    limits = executor.limits
    executor.limits = dataclasses.replace(limits, max_positions=2)
    with pytest.raises(ProtocolError) as e:  # the span would pass the context limit
        executor.handle(msg)
    assert e.value.status == 413 and s.kv_bytes == 0
    executor.limits = limits
    reply = executor.handle(msg)
    assert reply.kind == MsgKind.SCORES and reply.count == 3 and len(reply.cts) == 3
    executor.drop_session(s.id)


def test_circuit_privacy_same_computation_differs(ckpt, keys, executor, plain):
    """The same computation twice leaves in different bytes (re-randomized, flooded) and
    decrypts alike within the flooding noise."""
    h_in, _ = plain
    replies = []
    for _ in range(2):
        s = executor.new_session()
        c = ProtectedClientState(keys[0], ckpt.config, FIRST, LAST, s.id)
        replies.append((c, executor.handle(c.token_message(h_in[0]))))
    (c0, r0), (c1, r1) = replies
    (a,), (b,) = r0.payloads({0: Tag.SCORES_SIGMA}), r1.payloads({0: Tag.SCORES_SIGMA})
    assert a.data != b.data  # (lengths may differ: SEAL compresses with zstd)
    assert keys[0].is_folded(a.data) and keys[0].is_folded(b.data)  # the scores fold (32 chunks at most)
    x, y = keys[0].decrypt_folded(a.data)[0], keys[0].decrypt_folded(b.data)[0]
    assert np.abs(x - y).max() < 5e-3 and np.abs(x).max() > 1.0


def test_downloads_are_folded_only_for_a_client_that_sent_a_fold_key(ckpt, keys, executor, plain, he_backend):
    """With the client's fold key the scores and MLP downloads, the masked refresh and h_L leave
    in the ring of N/2 (half the bytes, ``crypto/ring_switch.py``; the scores since the second
    half of a chunk's blocks sits 32 lanes over; the refresh as the polynomial in X² the hidden
    layout makes of h'', which the client re-encrypts); a server given the same keys without it
    sends them whole. The client reads the same scores, σ, û and σ' from either, and both
    sessions reach the same h_L."""
    from veil.crypto.backend import make_backend

    h_in, ref = plain
    client_be, _ = keys
    whole_be = make_backend(PROTECTED_PARAMS, he_backend, allow_test_backends=True,
                            **({"noise": True} if he_backend == "plain" else {}))
    whole_be.import_public_material(dataclasses.replace(client_be.export_public_material(), fold_key=b""))
    runs = []
    for be in (None, whole_be):
        s = executor.new_session(backend=be)
        c = ProtectedClientState(client_be, ckpt.config, FIRST, LAST, s.id)
        out, msgs = run_token(executor, c, h_in[0])
        executor.drop_session(s.id)
        down = {kind: [p for _, reply in msgs if reply.kind == kind for p in reply.cts]
                for kind in (MsgKind.SCORES, MsgKind.MLP, MsgKind.REFRESH, MsgKind.FINAL)}
        mlp_vecs = [d.values for d in c.transcript if d.tag == Tag.U_SIGMA2]
        score_vecs = [d.values for d in c.transcript if d.tag == Tag.SCORES_SIGMA]
        runs.append((out, down, mlp_vecs, score_vecs))
    (out_f, down_f, vec_f, sc_f), (out_w, down_w, vec_w, sc_w) = runs
    counts = {MsgKind.SCORES: LAST - FIRST, MsgKind.MLP: LAST - FIRST, MsgKind.REFRESH: LAST - FIRST - 1,
              MsgKind.FINAL: 1}
    for kind, count in counts.items():
        folded, whole = down_f[kind], down_w[kind]
        assert len(folded) == len(whole) == count
        assert all(client_be.is_folded(p.data) for p in folded) and not any(client_be.is_folded(p.data) for p in whole)
        if he_backend != "plain":  # plain's slot vectors are not sized like ciphertexts
            assert all(len(a.data) < 0.51 * len(b.data) for a, b in zip(folded, whole, strict=True))
    dims = executor.dims
    for layer, (a, b) in enumerate(zip(vec_f, vec_w, strict=True)):
        assert a.size == dims.slots // 2 and b.size == dims.slots
        (sf, gf, uf), (sw, gw, uw) = unpack_mlp(dims, a), unpack_mlp(dims, b)
        if layer == 0:  # the first protected layer's û comes in each session's own secret order
            gf, gw, uf, uw = np.sort(gf), np.sort(gw), np.sort(uf), np.sort(uw)
        # the sessions' flooding differs, and through the client's softmax so does h': close, not equal
        assert np.isclose(sf, sw, rtol=2e-3)
        assert np.allclose(gf, gw, rtol=2e-3, atol=0.1) and np.allclose(uf, uw, rtol=2e-3, atol=0.1)
    from veil.benchmarks.flooding_margin import flood_std

    # a score is (slot - σ slot) * SCORES_DIV: two sessions' flooding differ by std
    # 2 * SCORES_DIV * flood_std (0.022); 8 of those, where a misplaced score is off by the score
    score_tol = 8 * 2 * SCORES_DIV * flood_std(dims)
    for a, b in zip(sc_f, sc_w, strict=True):  # position 0: one score per head
        assert a.size == dims.slots // 2 and b.size == dims.slots
        (sf, scf), (sw, scw) = unpack_scores(dims, a, 1), unpack_scores(dims, b, 1)
        assert np.isclose(sf, sw, rtol=2e-3) and np.allclose(scf, scw, rtol=2e-3, atol=score_tol)
    for out in (out_f, out_w):
        assert np.linalg.norm(out - ref[0]) / np.linalg.norm(ref[0]) < REL_ERR_BOUND


def test_scores_download_folds_up_to_32_chunks_only(keys, executor):
    """A scores download folds while it holds at most 32 chunks (positions < 256: its lanes stay
    in [0, 32) of the first half's blocks and [32, 64) of the second's) and leaves whole from
    the 33rd on; the client reads σ alike from either."""
    s = executor.new_session()
    try:
        c = Circuit(s.be, executor.dims, LEVELS, executor.consts)
        h = hidden_layout(np.ones(executor.dims.d), executor.dims.slots)  # σ/d = 1
        ct = keys[0].encrypt(h, level=LEVELS.h_prime)
        sigmas = []
        for t, folds in ((255, True), (256, False)):
            data = c.scores_download(s.be.deserialize(keys[0].serialize(ct), level=LEVELS.h_prime), None, t)
            assert keys[0].is_folded(data) == folds
            vec = keys[0].decrypt_folded(data)[0] if folds else keys[0].decrypt(keys[0].deserialize(data, level=0))
            sigmas.append(unpack_sigma(executor.dims, vec))
        assert np.allclose(sigmas, 1.0, atol=0.02)  # flooding: std 2.8e-3 on σ/d
    finally:
        executor.drop_session(s.id)


def test_protocol_rejects_replay_and_wrong_kind(ckpt, keys, executor, plain):
    h_in, _ = plain
    s = executor.new_session()
    c = ProtectedClientState(keys[0], ckpt.config, FIRST, LAST, s.id)
    msg = c.token_message(h_in[0])
    reply = executor.handle(msg)
    state = (s.step, s.state, s.kv_bytes)
    with pytest.raises(ProtocolError):
        executor.handle(msg)  # replayed step
    wrong = c.token_message(h_in[1])  # a token while weights are expected
    with pytest.raises(ProtocolError):
        executor.handle(wrong)
    assert (s.step, s.state, s.kv_bytes) == state
    with pytest.raises(ProtocolError):  # the client, likewise, takes no reply under another parameter set
        c.handle(dataclasses.replace(reply, params_id="ckks-other"))
    # and the session goes on
    nxt = c.handle(reply)
    assert executor.handle(nxt).kind == MsgKind.MLP


def test_kv_limits_are_refused_without_changing_state(ckpt, keys, executor, plain):
    """Per-session (413) and server-wide (429) encrypted KV budgets: the refused token leaves the
    session as it was."""
    h_in, _ = plain
    saved = executor.limits
    try:
        s = executor.new_session()
        c = ProtectedClientState(keys[0], ckpt.config, FIRST, LAST, s.id)
        # no room for a new chunk
        executor.limits = dataclasses.replace(saved, max_kv_bytes_total=executor.kv_bytes_total)
        with pytest.raises(CapacityExceeded) as e:
            executor.handle(c.token_message(h_in[0]))
        assert e.value.status == 429 and "max_protected_kv_bytes_total" in str(e.value)
        assert (s.step, s.state.expect, s.kv_bytes, s.state.length) == (-1, MsgKind.TOKEN, 0, 0)
        executor.limits = dataclasses.replace(saved, max_kv_bytes=0)
        c2 = ProtectedClientState(keys[0], ckpt.config, FIRST, LAST, s.id)
        with pytest.raises(LimitExceeded) as e:
            executor.handle(c2.token_message(h_in[0]))
        assert e.value.status == 413 and "max_protected_kv_bytes" in str(e.value)
        assert s.kv_bytes == 0 and s.state.expect == MsgKind.TOKEN
    finally:
        executor.limits = saved
        executor.drop_session(s.id)


def test_refresh_upload_is_validated_and_the_session_goes_on(ckpt, keys, executor, plain):
    """h'' goes down at level 1 on 2^27 with a 109-bit mask (its 118-bit mask on Δ would need
    level 2); the re-encrypted h'' (REFRESHED) at a wrong level or scale, or replayed, is refused
    (400 / 409), the refresh mask is kept, and the correct upload then starts the next layer."""
    h_in, _ = plain
    s = executor.new_session()
    c = ProtectedClientState(keys[0], ckpt.config, FIRST, LAST, s.id)
    msg = c.token_message(h_in[0])
    while True:
        reply = executor.handle(msg)
        msg = c.handle(reply)
        if msg.kind == MsgKind.REFRESHED:
            break
    assert reply.kind == MsgKind.REFRESH and s.state.refresh_mask
    (down,) = reply.payloads({0: Tag.MASKED_H})
    mask = s.state.refresh_mask[0]
    assert (down.level, LEVELS.refresh, mask.bits, mask.scale) == (1, 1, 109, 2.0**27)
    assert c.be.is_folded(down.data)  # h'' in the hidden layout is a polynomial in X²: it folds
    assert c.be.decrypt_folded(down.data)[1] == pytest.approx(2.0**27, rel=1e-12)
    (p,) = msg.payloads({0: Tag.H_REFRESHED})
    on_delta = c.be.encrypt_to_bytes(np.zeros(c.be.params.slot_count), LEVELS.h)  # Δ, not the refresh's scale
    with pytest.raises(MessageError) as e:
        executor.handle(dataclasses.replace(msg, cts=(CtPayload(p.tag, p.level - 1, p.data, p.token),)))
    assert e.value.status == 400
    with pytest.raises(CiphertextError, match="scale"):  # the app answers it 400 bad_ciphertext
        executor.handle(dataclasses.replace(msg, cts=(CtPayload(p.tag, p.level, on_delta, p.token),)))
    stale = dataclasses.replace(msg, step=s.step)
    with pytest.raises(ProtocolError) as e:
        executor.handle(stale)
    assert e.value.status == 409
    assert s.state.expect == MsgKind.REFRESHED and s.state.refresh_mask and s.state.layer == FIRST
    nxt = executor.handle(msg)
    assert nxt.kind == MsgKind.SCORES and nxt.layer == FIRST + 1 and not s.state.refresh_mask
    executor.drop_session(s.id)


def test_first_layer_ffn_coordinates_are_shuffled_per_position(ckpt, keys, executor, plain):
    """The client knows the first protected layer's input, so it must not see that layer's û in
    a fixed order: two sessions with the same input decrypt the same values (as multisets) in
    different orders; the next layer's û keeps its order."""
    h_in, _ = plain
    seen = []
    for _ in range(2):
        s = executor.new_session()
        c = ProtectedClientState(keys[0], ckpt.config, FIRST, LAST, s.id)
        run_token(executor, c, h_in[0])
        seen.append({r.layer: np.concatenate(unpack_mlp(executor.dims, r.values)[1:])
                     for r in c.transcript if r.tag == Tag.U_SIGMA2})
        executor.drop_session(s.id)
    (a, b), f = seen, executor.dims.ffn
    scale = np.abs(a[FIRST]).max()
    for half in (slice(0, f), slice(f, 2 * f)):  # u_gate, u_up: each a permutation of the same values
        np.testing.assert_allclose(np.sort(a[FIRST][half]), np.sort(b[FIRST][half]), atol=1e-3 * scale)
        assert np.abs(a[FIRST][half] - b[FIRST][half]).max() > 0.1 * scale
    # gate and up stay paired (one permutation for both): Σ_i g_i u_i is order-free
    pair = [float(v[:f] @ v[f:]) for v in (a[FIRST], b[FIRST])]
    assert abs(pair[0] - pair[1]) < 1e-3 * abs(pair[0])
    np.testing.assert_allclose(a[FIRST + 1], b[FIRST + 1], atol=1e-3 * np.abs(a[FIRST + 1]).max())


def test_held_bytes_count_the_first_layers_clear_ffn_weights(executor):
    """The first protected layer keeps W_gate|up and W_down in the clear for the shuffle;
    ``--protected-device-gb`` must count them with the encoded weights."""
    first, second = executor.layers[0], executor.layers[1]
    clear = sum(w.nbytes for w in first.ffn)
    assert second.ffn is None and clear == 3 * executor.dims.ffn * executor.dims.d * 8  # float64
    encoded = sum(m.nbytes for m in (first.wqkv, first.wo, first.wgu, first.wdown))
    assert first.nbytes == encoded + clear and executor.encoded_bytes == first.nbytes + second.nbytes


def test_flooding_sits_20_bits_above_the_download_mask_residues(ckpt, keys, executor, plain, he_backend):
    """The 0/1 masks that clean the MLP and scores downloads leave of the partial sums they
    clean (W_gate|up's folded sums, the score lanes of other positions and heads: their encoding
    error times them, in the slots they zero) at least 2^20 times less than the flooding noise,
    at the massive-activation layer too; the norm statistics take no 0/1 mask at all. And all
    that either download carries outside its slots before flooding (those residues plus the
    rescale's rounding noise, which depends on fresh randomness, not on the weights) stays 2^8
    under it. Real CKKS only: plain's masks are exact, there is no residue to measure."""
    if he_backend == "plain":
        pytest.skip("the plain backend's masks are exact")
    from veil.benchmarks.flooding_margin import flood_std, residues

    h_in, _ = plain
    s = executor.new_session()
    masks: dict = {}
    found = residues(executor, ProtectedClientState(keys[0], ckpt.config, FIRST, LAST, s.id), keys[0], h_in[:3], {},
                     masks)
    executor.drop_session(s.id)
    std = flood_std(executor.dims)
    for mask in ("first_2f", "scores"):
        assert 0 < masks[mask] and std / masks[mask] >= 2.0**20, (mask, masks)
    assert masks["norm"] == 0.0 and "sigma" not in masks, masks  # constants zero no slot
    for kind in (MsgKind.MLP, MsgKind.SCORES):
        got = {k: v["max_residue"] for k, v in found.items() if k.startswith(kind + ".")}
        assert sorted(got) == [f"{kind}.l{layer}" for layer in range(FIRST, LAST)]
        for key, residue in got.items():
            assert std / residue >= 2.0**8, (key, residue)


def _decrypted_cache(keys, executor, session):
    client_be, server_be = keys
    out = {}
    for layer, kv in session.kv.items():
        for which, level in (("keys", executor.levels.keys), ("values", executor.levels.kv)):
            out[layer, which] = [client_be.decrypt(client_be.deserialize(server_be.serialize(ct), level=level))
                                 for ct in getattr(kv, which)]
    return out


def test_verify_step_returns_every_position_and_rollback_leaves_no_trace(ckpt, keys, executor, plain, decoded):
    """A speculative step: positions 5..8 go up as one verify span (crossing the chunk boundary)
    and every position's h_L comes back, equal to one-position steps; the client then keeps 2 of
    them and the next TOKEN at position 7 takes 7 and 8 back off every layer's cache, so the
    cache is what one-position steps over positions 0..7 hold (``decoded``'s first chunk: its
    second holds position 8 alone; decrypted, compared), and position 7 then decodes as in
    ``decoded``."""
    h_in, ref = plain
    s1, _, outs1, _ = decoded
    s = executor.new_session()
    c = ProtectedClientState(keys[0], ckpt.config, FIRST, LAST, s.id)
    run_token(executor, c, h_in[:5])  # prefill
    rows, msgs = _run_verify(executor, c, h_in[5:9])
    assert rows.shape == (4, executor.dims.d) and msgs[-1][1].kind == MsgKind.FINAL
    assert np.abs(rows - outs1[5:9]).max() < REL_ERR_BOUND * np.abs(outs1[5:9]).max()
    undo_bytes = sum(u.nbytes for u in s.state.undo.values())
    assert undo_bytes > 0 and s.state.length == 9
    # a TOKEN outside the last span is refused and changes nothing
    c.rollback(7)
    before = (s.step, s.state, s.kv_bytes)
    with pytest.raises(ProtocolError):
        executor.handle(dataclasses.replace(c.token_message(h_in[7]), position=4))
    assert (s.step, s.state, s.kv_bytes) == before
    out7, _ = run_token(executor, c, h_in[7])
    assert np.abs(out7 - outs1[7]).max() < REL_ERR_BOUND * np.abs(outs1[7]).max()
    assert 2 * s.kv_bytes == s1.kv_bytes and not s.state.undo  # one chunk of two; the undo data is gone
    mine, theirs = _decrypted_cache(keys, executor, s), _decrypted_cache(keys, executor, s1)
    assert mine.keys() == theirs.keys()
    for k in mine:
        assert len(mine[k]) == 1 and len(theirs[k]) == 2, k  # position 8 left no chunk behind
        assert np.abs(mine[k][0] - theirs[k][0]).max() < 1e-3 * np.abs(theirs[k][0]).max(), k
    executor.drop_session(s.id)


def _run_verify(executor, client, rows):
    msgs, msg = [], client.token_message(rows, verify=True)
    while True:
        reply = executor.handle(msg)
        msgs.append((msg, reply))
        nxt = client.handle(reply)
        if isinstance(nxt, np.ndarray):
            return nxt, msgs
        msg = nxt

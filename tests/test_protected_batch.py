"""Protected steps of several sessions run as one batch (``ProtectedExecutor.handle_batch``).

On the ``plain`` test double (seconds; the native batch's operations are checked bit for bit
against each row alone in ``test_native_batch``, and the k=28 native run is measured by
``benchmarks/protected_sessions.py``): three sessions with their own keys decode in lockstep
through layers [11, 13) and each matches the plaintext model; the batch really ran as one (a
third of the products of three sessions alone); a bad upload in a batch fails its own row only
and leaves that session as it was; sessions at different positions share batches and stay right.
"""

import threading

import numpy as np
import pytest
import torch

from veil.crypto.backend import CiphertextError
from veil.crypto.params import PROTECTED_PARAMS
from veil.protected.client import ProtectedClientState
from veil.protected.key_levels import relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.protocol import CtPayload, DeviceOutOfMemory, MsgKind
from veil.protected.server import ProtectedExecutor
from veil.server.config import ServerConfig

FIRST, LAST, POSITIONS, ROWS = 11, 13, 3, 3
AHEAD = 9  # a session this far ahead holds two KV chunks of 8 positions
PROMPT = "The capital of France is Paris, and the capital of Italy is"
REL_ERR_BOUND = 2e-3  # as test_protected_protocol: the plain double injects CKKS-sized noise


@pytest.fixture(scope="module")
def setup(ckpt, full_model, he_pair):
    steps = rotation_key_levels(dims_of(ckpt.config, PROTECTED_PARAMS.slot_count))
    pairs = [he_pair("plain", PROTECTED_PARAMS, steps, relin_key_level()) for _ in range(ROWS)]
    ex = ProtectedExecutor.from_checkpoint(pairs[0][1], ckpt, FIRST, LAST, ServerConfig().protected_limits())
    ids = ckpt.tokenizer(PROMPT, return_tensors="pt")["input_ids"][0][:AHEAD + 2]
    with torch.no_grad():
        h = full_model.run_layers(full_model.embed(ids), 0, FIRST)
        ref = full_model.run_layers(h, FIRST, LAST).double().numpy()
    return pairs, ex, h.double().numpy(), ref


def _open(ckpt, ex, pair):
    s = ex.new_session(pair[1])
    return s, ProtectedClientState(pair[0], ckpt.config, FIRST, LAST, s.id)


def _lockstep(ex, clients, h):
    """One decode step of every client (``h``: every client's input, or a list of one per
    client), each round trip as one handle_batch call."""
    hs = h if isinstance(h, list) else [h] * len(clients)
    return _finish(ex, clients, [c.token_message(x) for c, x in zip(clients, hs, strict=True)])


def _finish(ex, clients, msgs):
    """Each client's pending message and those its replies lead to, every round trip of the
    clients still going as one handle_batch call, until each has its output."""
    msgs, outs = list(msgs), [None] * len(clients)
    while any(m is not None for m in msgs):
        live = [i for i, m in enumerate(msgs) if m is not None]
        for i, reply in zip(live, ex.handle_batch([msgs[i] for i in live]), strict=True):
            assert not isinstance(reply, Exception), reply
            nxt = clients[i].handle(reply)
            outs[i], msgs[i] = (nxt, None) if isinstance(nxt, np.ndarray) else (None, nxt)
    return outs


def test_sessions_decoded_in_one_batch_match_the_plaintext(ckpt, setup):
    pairs, ex, h_in, ref = setup
    opened = [_open(ckpt, ex, p) for p in pairs]
    ex.be.reset()
    for t in range(POSITIONS):
        outs = _lockstep(ex, [c for _, c in opened], h_in[t])
        for out in outs:
            assert np.linalg.norm(out - ref[t]) / np.linalg.norm(ref[t]) < REL_ERR_BOUND
    batched = ex.be.counts["matvec"]
    # the same positions, one session alone: a batch of three evaluates each product once
    s, c = _open(ckpt, ex, pairs[0])
    ex.be.reset()
    for t in range(POSITIONS):
        out = _lockstep(ex, [c], h_in[t])[0]
        assert np.linalg.norm(out - ref[t]) / np.linalg.norm(ref[t]) < REL_ERR_BOUND
    assert batched == ex.be.counts["matvec"] > 0
    for sess, _ in opened:  # every row committed its own cache, as a session alone does
        assert sess.step == s.step and sess.kv_bytes == s.kv_bytes and sess.state.length == POSITIONS
        assert len(sess.kv[FIRST].keys) == len(s.kv[FIRST].keys)
    for sess, _ in [*opened, (s, c)]:
        ex.drop_session(sess.id)


def test_a_bad_row_fails_alone_and_its_session_is_unchanged(ckpt, setup):
    pairs, ex, h_in, ref = setup
    opened = [_open(ckpt, ex, p) for p in pairs]
    msgs = [c.token_message(h_in[0]) for _, c in opened]
    bad = msgs[1]
    first = bad.cts[0]
    msgs[1] = type(bad)(bad.kind, bad.session_id, bad.step, bad.layer, bad.position,
                        (CtPayload(first.tag, first.level, first.data[:-8], first.token),), bad.params_id)
    before = (opened[1][0].step, opened[1][0].state, opened[1][0].kv_bytes)
    replies = ex.handle_batch(msgs)
    assert isinstance(replies[1], CiphertextError)
    assert (opened[1][0].step, opened[1][0].state, opened[1][0].kv_bytes) == before
    assert [r.kind for i, r in enumerate(replies) if i != 1] == [MsgKind.SCORES] * 2
    # the bad session goes on with a good upload, now alone (the others are a step ahead)
    assert ex.handle(opened[1][1].token_message(h_in[0])).kind == MsgKind.SCORES
    for sess, _ in opened:
        ex.drop_session(sess.id)


def test_sessions_at_different_positions_share_a_batch(ckpt, setup):
    """Three sessions at positions 9 (two KV chunks), 1 and 0 decode two tokens in lockstep.
    Every step but WEIGHTS runs the three as one batch (RoPE, key blocks, score and weight masks
    per row; the shorter caches padded); a WEIGHTS step batches the rows of one weights period
    (1 and 0) and runs the row at 9 alone. Each output matches the plaintext, and each session's
    cache holds the chunks of its own positions only."""
    pairs, ex, h_in, ref = setup
    opened = [_open(ckpt, ex, p) for p in pairs]
    (s0, c0), (s1, c1), (s2, c2) = opened
    out = _lockstep(ex, [c0], h_in[: AHEAD - 1])[0]  # a prefill span of 8, then one position
    assert np.linalg.norm(out - ref[AHEAD - 2]) / np.linalg.norm(ref[AHEAD - 2]) < REL_ERR_BOUND
    _lockstep(ex, [c0], h_in[AHEAD - 1])
    _lockstep(ex, [c1], h_in[0])
    starts = (AHEAD, 1, 0)
    msgs = [c.token_message(h_in[t]) for c, t in zip((c0, c1, c2), starts, strict=True)]
    assert len({ex.batch_key(m) for m in msgs}) == 1
    for step in range(2):
        ex.be.reset()
        outs = _lockstep(ex, [c0, c1, c2], [h_in[t + step] for t in starts])
        for o, t in zip(outs, starts, strict=True):
            assert np.linalg.norm(o - ref[t + step]) / np.linalg.norm(ref[t + step]) < REL_ERR_BOUND
        # per layer: QKV once for the three, W_o and W_gate|up twice (rows 1 and 0, row 9), W_down once
        assert ex.be.counts["matvec"] == (LAST - FIRST) * (1 + 2 * 2 + 1)
    chunk = s1.kv_bytes  # 3 positions: one chunk per layer
    assert s2.kv_bytes == chunk and s0.kv_bytes == 2 * chunk
    assert [len(s.kv[FIRST].keys) for s, _ in opened] == [2, 1, 1]
    for sess, _ in opened:
        ex.drop_session(sess.id)


def test_rows_of_one_weights_period_share_the_weights_step_over_padded_chunks(ckpt, full_model, setup):
    """Positions 17 (three KV chunks) and 25 (four) share the weights period 4, so the WEIGHTS
    step runs them as one too: the shorter row's fourth chunk is padding whose masks are zero.
    Every step of the two is one batch, and both outputs match the plaintext."""
    pairs, ex, _, _ = setup
    ids = ckpt.tokenizer(" ".join([PROMPT] * 3), return_tensors="pt")["input_ids"][0][:27]
    with torch.no_grad():
        h = full_model.run_layers(full_model.embed(ids), 0, FIRST)
        ref = full_model.run_layers(h, FIRST, LAST).double().numpy()
    h_in = h.double().numpy()
    opened = [_open(ckpt, ex, p) for p in pairs[:2]]
    starts = (25, 17)
    for (_, c), t in zip(opened, starts, strict=True):
        for a in range(0, t, 8):
            _lockstep(ex, [c], h_in[a : min(t, a + 8)])
    ex.be.reset()
    outs = _lockstep(ex, [c for _, c in opened], [h_in[t] for t in starts])
    for o, t in zip(outs, starts, strict=True):
        assert np.linalg.norm(o - ref[t]) / np.linalg.norm(ref[t]) < REL_ERR_BOUND
    assert ex.be.counts["matvec"] == (LAST - FIRST) * 4  # QKV, W_o, W_gate|up, W_down: once for both
    assert [len(s.kv[FIRST].keys) for s, _ in opened] == [4, 3]
    for sess, _ in opened:
        ex.drop_session(sess.id)


def test_the_scheduler_gathers_sessions_at_different_positions(ckpt, setup):
    """The service's HE worker (``StepScheduler``) with three client threads whose sessions stand
    at positions 2, 1 and 0: each thread submits its own round trips, the scheduler gathers the
    three sessions' steps into batches of three, and every output matches the plaintext."""
    from veil.protected.scheduler import StepScheduler

    pairs, ex, h_in, ref = setup
    opened = [_open(ckpt, ex, p) for p in pairs]
    _lockstep(ex, [opened[0][1]], h_in[:2])
    _lockstep(ex, [opened[1][1]], h_in[0])
    sched = StepScheduler(ex, max_batch=4, max_wait_s=2.0)  # generous: the threads are not in step
    starts, outs, sizes = (2, 1, 0), {}, []

    def run(b):
        c, msg = opened[b][1], opened[b][1].token_message(h_in[starts[b]])
        while True:
            reply, _, size = sched.submit(msg)
            sizes.append(size)
            nxt = c.handle(reply)
            if isinstance(nxt, np.ndarray):
                outs[b] = nxt
                return
            msg = nxt

    threads = [threading.Thread(target=run, args=(b,)) for b in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for b, t in enumerate(starts):
        assert np.linalg.norm(outs[b] - ref[t]) / np.linalg.norm(ref[t]) < REL_ERR_BOUND
    assert max(sizes) == 3 and sizes.count(3) >= 3  # at least one round trip ran the three as one
    for sess, _ in opened:
        ex.drop_session(sess.id)


def test_device_out_of_memory_fails_the_step_with_503_and_changes_nothing(ckpt, setup, monkeypatch):
    """A CUDA OOM inside a step (simulated: ``on_weights`` raises torch's OOM error) is a 503 for
    that step; the session is unchanged and goes on once memory is back. In a batch, the rows
    are retried one at a time (here they fail again, each with its own 503)."""
    pairs, ex, h_in, ref = setup
    opened = [_open(ckpt, ex, p) for p in pairs[:2]]
    nxt = [c.handle(r) for (_, c), r in zip(opened, ex.handle_batch([c.token_message(h_in[0]) for _, c in opened]),
                                              strict=True)]
    real = ex.on_weights

    def oom(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(ex, "on_weights", oom)
    before = [(s.step, s.state, s.kv_bytes) for s, _ in opened]
    with pytest.raises(DeviceOutOfMemory) as e:
        ex.handle(nxt[0])
    assert e.value.status == 503
    replies = ex.handle_batch(nxt)
    assert all(isinstance(r, DeviceOutOfMemory) for r in replies)
    assert [(s.step, s.state, s.kv_bytes) for s, _ in opened] == before
    monkeypatch.setattr(ex, "on_weights", real)
    assert [r.kind for r in ex.handle_batch(nxt)] == [MsgKind.MLP, MsgKind.MLP]
    for sess, _ in opened:
        ex.drop_session(sess.id)


@pytest.mark.parametrize("mlp_in", ["same order", "other order", "alone"])
def test_a_batchs_shuffled_w_down_goes_back_whole_to_the_same_rows(ckpt, setup, monkeypatch, mlp_in):
    """The first protected layer's W_down, encoded under each row's own permutation and stacked
    at a batched WEIGHTS step, stays stacked in the rows' states (``RowOf``): the same sessions'
    MLP_IN batch in the same order takes it back as it is, with nothing stacked; in another
    order it is stacked anew from the rows, and a session alone uses its own row. Every output
    matches the plaintext either way."""
    from veil.protected import batch as B

    pairs, ex, h_in, ref = setup
    opened = [_open(ckpt, ex, p) for p in pairs]
    restacked = []
    real = B.stack_matrices
    monkeypatch.setattr(B, "stack_matrices", lambda be, ms: restacked.append(len(ms)) or real(be, ms))
    clients = [c for _, c in opened]
    msgs, outs = [c.token_message(h_in[0]) for c in clients], [None] * len(clients)
    while any(m is not None for m in msgs):
        live = [i for i, m in enumerate(msgs) if m is not None]
        if msgs[live[0]].kind == MsgKind.MLP_IN and msgs[live[0]].layer == FIRST:
            rows = [s.state.shuffled_down for s, _ in opened]
            assert all(isinstance(d[0], B.RowOf) and d[0].stacked is rows[0][0].stacked for d in rows)
            assert [d[0].row for d in rows] == [0, 1, 2]
            assert ex.working_bytes == rows[0][0].stacked.matrix.nbytes > 0  # held once, by every row
            if mlp_in == "other order":
                live = live[::-1]
        groups = [[i] for i in live] if mlp_in == "alone" and msgs[live[0]].kind == MsgKind.MLP_IN else [live]
        for group in groups:
            for i, reply in zip(group, ex.handle_batch([msgs[i] for i in group]), strict=True):
                assert not isinstance(reply, Exception), reply
                nxt = clients[i].handle(reply)
                outs[i], msgs[i] = (nxt, None) if isinstance(nxt, np.ndarray) else (None, nxt)
    assert restacked == ([3] if mlp_in == "other order" else [])
    for out in outs:
        assert np.linalg.norm(out - ref[0]) / np.linalg.norm(ref[0]) < REL_ERR_BOUND
    for sess, _ in opened:
        ex.drop_session(sess.id)


def test_a_step_whose_shuffled_ffn_would_pass_the_device_budget_is_refused_with_429(ckpt, setup, monkeypatch):
    """``max_device_bytes`` counts the weights, the key sets and the first layer's shuffled W_down
    that sessions hold from WEIGHTS to MLP_IN. With room for the weights, keys and one position's
    shuffled pair: the first session's WEIGHTS runs; a batch of both is refused and its rows run
    alone, the second refused with 429 (unchanged) while the first holds its W_down; once the
    first's MLP_IN gives it back, the second runs, and both match the plaintext."""
    from dataclasses import replace

    from veil.protected.protocol import DeviceBudgetExceeded

    pairs, ex, h_in, ref = setup
    layer, keys = ex.layers[0], 12_345
    monkeypatch.setattr(ex, "_key_bytes", lambda: keys)
    monkeypatch.setattr(ex, "limits", replace(ex.limits, max_device_bytes=ex.encoded_bytes + keys + layer.shuffle_bytes))
    # what a key upload on another thread meets while a step shuffles (observed, not changed)
    during, shuffled = [], ex._shuffled
    monkeypatch.setattr(ex, "_shuffled", lambda *args: (during.append(ex.device_bytes), shuffled(*args))[1])
    (a, ca), (b, cb) = opened = [_open(ckpt, ex, p) for p in pairs[:2]]
    weights = [c.handle(r) for c, r in zip((ca, cb), ex.handle_batch([c.token_message(h_in[0]) for c in (ca, cb)]),
                                             strict=True)]
    assert {m.kind for m in weights} == {MsgKind.WEIGHTS} and ex.working_bytes == 0
    before = (b.step, b.state, b.kv_bytes)
    ra, rb = ex.handle_batch(weights)  # 2 positions' pairs do not fit: alone, a fits and b not
    assert ra.kind == MsgKind.MLP and isinstance(rb, DeviceBudgetExceeded)
    assert (rb.status, rb.code) == (429, "device_memory") and (b.step, b.state, b.kv_bytes) == before
    held = ex.working_bytes
    assert 0 < held == a.state.shuffled_down[0].nbytes <= layer.shuffle_bytes
    # a's step counted its pair while it ran, and once committed only the W_down a holds
    assert during == [ex.encoded_bytes + layer.shuffle_bytes] and ex.device_bytes == ex.encoded_bytes + held
    mlp_in = ca.handle(ra)
    with pytest.raises(DeviceBudgetExceeded):  # a session alone, too
        ex.handle(weights[1])
    refresh = ex.handle(mlp_in)  # a's W_down goes back
    assert ex.working_bytes == 0 and refresh.kind == MsgKind.REFRESH
    outs = _finish(ex, (ca, cb), [ca.handle(refresh), cb.handle(ex.handle(weights[1]))])
    for out in outs:
        assert np.linalg.norm(out - ref[0]) / np.linalg.norm(ref[0]) < REL_ERR_BOUND
    for sess, _ in opened:
        ex.drop_session(sess.id)


def test_a_batch_past_the_device_budget_runs_the_rows_the_room_holds_as_one_batch(ckpt, setup, monkeypatch):
    """With room for the weights and two positions' shuffled pairs, a first-layer WEIGHTS batch of
    three runs its first two rows as one batch and refuses the third alone (429, unchanged);
    once the two have given their W_down back (MLP_IN), the third runs; all match the plaintext."""
    from dataclasses import replace

    from veil.protected.protocol import DeviceBudgetExceeded

    pairs, ex, h_in, ref = setup
    monkeypatch.setattr(ex, "limits", replace(ex.limits, max_device_bytes=ex.encoded_bytes + 2 * ex.layers[0].shuffle_bytes))
    batches, run_batch = [], ex._run_batch  # observed: the sizes of the batches that ran
    monkeypatch.setattr(ex, "_run_batch", lambda ms: (batches.append(len(ms)), run_batch(ms))[1])
    opened = [_open(ckpt, ex, p) for p in pairs]
    clients = [c for _, c in opened]
    weights = [c.handle(r) for c, r in zip(clients, ex.handle_batch([c.token_message(h_in[0]) for c in clients]),
                                             strict=True)]
    third = opened[2][0]
    before, batches[:] = (third.step, third.state, third.kv_bytes), []
    replies = ex.handle_batch(weights)
    assert batches == [3, 2] and [r.kind for r in replies[:2]] == [MsgKind.MLP] * 2
    assert isinstance(replies[2], DeviceBudgetExceeded) and (third.step, third.state, third.kv_bytes) == before
    refreshes = ex.handle_batch([c.handle(r) for c, r in zip(clients[:2], replies[:2], strict=True)])
    assert ex.working_bytes == 0 and {r.kind for r in refreshes} == {MsgKind.REFRESH}
    outs = _finish(ex, clients, [*(c.handle(r) for c, r in zip(clients[:2], refreshes, strict=True)),
                                 clients[2].handle(ex.handle(weights[2]))])
    for out in outs:
        assert np.linalg.norm(out - ref[0]) / np.linalg.norm(ref[0]) < REL_ERR_BOUND
    for sess, _ in opened:
        ex.drop_session(sess.id)

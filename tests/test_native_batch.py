"""``NativeBatch``: a batch of sessions evaluated as one equals each session evaluated alone.

Deterministic operations (add, ct×pt, ct×ct, relinearize, rescale, rotations, hoisted
rotations, a diagonal product) must give every row bit for bit what the row's own backend gives;
the randomized ones (re-randomization, flooding, the masked refresh) must decrypt right under
each row's own secret key, with independent randomness per row. Test-only N=8192 set.
"""

import numpy as np
import pytest
import torch

from veil.crypto.backend import HEError
from veil.crypto.linear import (
    EntryBounds,
    encode_matrices,
    encode_matrix,
    matvec,
    plan_matvec,
    replicate_input,
)
from veil.crypto.native.batch import NativeBatch
from veil.crypto.params import TEST_PARAMS_ID, get_params

P = get_params(TEST_PARAMS_ID, allow_test_params=True)
SLOTS = P.slot_count
PRODUCT = plan_matvec(64, 64, SLOTS, "bsgs", 8)
STEPS = sorted({1, -3, 100} | set(PRODUCT.rotation_steps))


@pytest.fixture(scope="module")
def rows(he_pair):
    """Three sessions with their own keys (the third lacks step 100: the batch drops it)."""
    out = [he_pair("native", P, STEPS) for _ in range(2)]
    out.append(he_pair("native", P, [s for s in STEPS if s != 100]))
    return out


def _data(be, ct):
    return be._unwrap(ct).data


def _run_both(rows, fn, level=None):
    rng = np.random.default_rng(3)
    servers = [s for _, s in rows]
    batch = NativeBatch(servers)
    xs = [rng.standard_normal(SLOTS) * 0.5 for _ in rows]
    cts = [s.deserialize(c.encrypt_to_bytes(x, level=level)) for (c, s), x in zip(rows, xs, strict=True)]
    alone = [fn(s, ct) for s, ct in zip(servers, cts, strict=True)]
    together = batch.unstack(fn(batch, batch.stack(cts)))
    return servers, alone, together, xs


@pytest.mark.parametrize("op", ["add", "square", "rotate", "rescale_plain", "mod_switch"])
def test_batched_operations_equal_each_row_alone(rows, op):
    pt_vals = np.linspace(-1, 1, SLOTS)

    def fn(be, ct):
        if op == "add":
            return be.add(ct, ct)
        if op == "square":
            return be.multiply(ct, ct)
        if op == "rotate":
            return be.rotate(ct, -3)
        if op == "rescale_plain":
            return be.multiply_plain(ct, be.encode(pt_vals, be.level(ct)))
        return be.mod_switch_to(ct, 2)

    servers, alone, together, _ = _run_both(rows, fn)
    for s, a, t in zip(servers, alone, together, strict=True):
        assert torch.equal(_data(s, a), _data(s, t))


def test_hoisted_rotations_and_a_product_equal_each_row_alone(rows):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 64)) / 8

    def fn(be, ct):
        m = encode_matrix(be, w, be.level(ct), n1=8)
        return [matvec(be, m, ct), *be.rotate_many(ct, [1, -3])]

    servers = [s for _, s in rows]
    batch = NativeBatch(servers)
    xs = [replicate_input(rng.standard_normal(64), SLOTS) for _ in rows]
    cts = [s.deserialize(c.encrypt_to_bytes(x)) for (c, s), x in zip(rows, xs, strict=True)]
    alone = [fn(s, ct) for s, ct in zip(servers, cts, strict=True)]
    together = [batch.unstack(ct) for ct in fn(batch, batch.stack(cts))]
    for b, s in enumerate(servers):
        for k in range(3):
            assert torch.equal(_data(s, alone[b][k]), _data(s, together[k][b]))
    client = rows[0][0]
    got = client.decrypt(client.deserialize(servers[0].serialize(together[0][0])), 64)
    np.testing.assert_allclose(got, w @ xs[0][:64], atol=1e-3)


def test_per_row_plaintexts_multiply_their_own_row(rows):
    def fn(be, ct):
        if isinstance(be, NativeBatch):
            pts = [be.encode(np.full(SLOTS, b + 1.0), be.level(ct)) for b in range(be.batch_size)]
            return be.multiply_plain(ct, be.stack_plain(pts))
        return be.multiply_plain(ct, be.encode(np.full(SLOTS, fn.row + 1.0), be.level(ct)))

    servers = [s for _, s in rows]
    rng = np.random.default_rng(5)
    batch = NativeBatch(servers)
    xs = [rng.standard_normal(SLOTS) for _ in rows]
    cts = [s.deserialize(c.encrypt_to_bytes(x)) for (c, s), x in zip(rows, xs, strict=True)]
    together = batch.unstack(fn(batch, batch.stack(cts)))
    for b, s in enumerate(servers):
        fn.row = b
        assert torch.equal(_data(s, fn(s, cts[b])), _data(s, together[b]))


def test_picked_rows_and_padded_stacks_are_exact(rows):
    """Rows at different positions: ``pick_rows`` keeps each row of one ciphertext or the other
    (or zero) bit for bit; a ``None`` row of ``stack`` is the exact zero ciphertext, which adds
    nothing and multiplies to zero."""
    servers = [s for _, s in rows]
    batch = NativeBatch(servers)
    cts = [s.deserialize(c.encrypt_to_bytes(np.full(SLOTS, b + 1.0))) for b, (c, s) in enumerate(rows)]
    a, rot = batch.stack(cts), batch.rotate(batch.stack(cts), -3)
    picked = batch.unstack(batch.pick_rows([True, False, True], rot, a))
    assert torch.equal(_data(batch, picked[0]), _data(servers[0], servers[0].rotate(cts[0], -3)))
    assert torch.equal(_data(batch, picked[1]), _data(servers[1], cts[1]))
    assert not _data(batch, batch.unstack(batch.pick_rows([True, False, True], a))[1]).any()
    padded = batch.stack([cts[0], None, cts[2]])
    assert not _data(batch, batch.unstack(padded)[1]).any()
    summed = batch.unstack(batch.add(batch.stack(cts), padded))
    assert torch.equal(_data(batch, summed[1]), _data(servers[1], cts[1]))
    assert not _data(batch, batch.unstack(batch.multiply(padded, a, relinearize=False))[1]).any()
    with pytest.raises(HEError):
        batch.pick_rows([True, False], a)
    with pytest.raises(HEError):
        batch.stack([None, None, None])


def test_randomized_operations_decrypt_per_row_with_fresh_randomness(rows):
    def fn(be, ct):
        masked, mask = be.mask_for_refresh(ct)
        return be.rerandomize(masked), mask

    servers = [s for _, s in rows]
    rng = np.random.default_rng(6)
    batch = NativeBatch(servers)
    xs = [rng.standard_normal(SLOTS) for _ in rows]
    level = P.min_mask_level()
    cts = [s.deserialize(c.encrypt_to_bytes(x, level=level)) for (c, s), x in zip(rows, xs, strict=True)]
    out, mask = fn(batch, batch.stack(cts))
    masks = batch.unstack_mask(mask)
    assert not np.array_equal(masks[0].coeffs, masks[1].coeffs)  # independent draws per row
    rows_out = batch.unstack(out)
    # the rounded download of every row from one transform: each row's own bytes
    assert batch.serialize(out, noise_log2=20.0) == [s.serialize(r, noise_log2=20.0)
                                                     for s, r in zip(servers, rows_out, strict=True)]
    for b, ((client, server), x) in enumerate(zip(rows, xs, strict=True)):
        fresh = client.deserialize(client.refresh_reencrypt_to_bytes(
            client.deserialize(server.serialize(rows_out[b])), level=level))
        back = server.unmask_refresh(server.deserialize(client.serialize(fresh)), masks[b])
        # flooding std 2^24 coefficient units at scale 2^40: ~1.4e-3 per slot, max of 4096 ~5e-3
        np.testing.assert_allclose(client.decrypt(client.deserialize(server.serialize(back))), x, atol=2e-2)
    # the batched unmask equals unmasking row by row
    refreshed = [r[1].deserialize(r[0].serialize(r[0].deserialize(r[0].refresh_reencrypt_to_bytes(
        r[0].deserialize(r[1].serialize(rows_out[b])), level=level)))) for b, r in enumerate(rows)]
    together = batch.unstack(batch.unmask_refresh(batch.stack(refreshed), batch.stack_masks(masks)))
    for b, (_, server) in enumerate(rows):
        assert torch.equal(_data(server, together[b]), _data(server, server.unmask_refresh(refreshed[b], masks[b])))


def test_a_batchs_folds_are_each_rows_own(rows, monkeypatch):
    """``serialize_folded`` and ``serialize_folded_refresh`` of a batch fold every row at once,
    each under its session's fold key (``ring_switch.fold_rows``). With the fold's randomness
    made reproducible (a fake, in this test only: one ChaCha20 stream of a fixed key in place of
    the fresh OS-CSPRNG-keyed ``Stream`` each fold draws from), the batch's bytes equal the rows
    folded one by one from the same stream, bit for bit, from a level the fold first switches
    down from. With the real randomness each row's download decrypts under its own client's fold
    secret, and no two rows' bytes are alike."""
    from veil.crypto import ring_switch
    from veil.crypto.native.sampling import Stream

    servers = [s for _, s in rows]
    batch = NativeBatch(servers)
    rng = np.random.default_rng(8)
    xs = [rng.uniform(-10, 10, SLOTS) for _ in rows]
    cts = [s.deserialize(c.encrypt_to_bytes(x, level=2)) for (c, s), x in zip(rows, xs, strict=True)]
    scale = 2.0**27
    ws = [np.tile(rng.normal(0.0, 10.0, SLOTS // 2), 2) for _ in rows]
    low = [s.deserialize(c.encrypt_to_bytes(w, 1, scale), level=1, scale=scale)
           for (c, s), w in zip(rows, ws, strict=True)]
    masked = batch.mask_for_refresh(batch.stack(low), fold=True)[0]

    def both(fold_batch, fold_row):
        out = []
        for fold in (lambda: [fold_row(s, r) for s, r in zip(servers, fold_batch[1], strict=True)],
                     lambda: fold_batch[0]()):
            shared = Stream(key=bytes(32))  # the fake: every fold of this run reads on in one stream
            monkeypatch.setattr(ring_switch, "Stream", lambda shared=shared: shared)
            out.append(fold())
        monkeypatch.undo()
        return out

    stacked = batch.stack(cts)
    alone, together = both((lambda: batch.serialize_folded(stacked, 20.0), batch.unstack(stacked)),
                           lambda s, r: s.serialize_folded(r, 20.0))
    assert together == alone and len(set(together)) == len(rows)
    alone, together = both((lambda: batch.serialize_folded_refresh(masked, 3.0), batch.unstack(masked)),
                           lambda s, r: s.serialize_folded_refresh(r, 3.0))
    assert together == alone
    real = batch.serialize_folded(stacked, 20.0)
    half = SLOTS // 2
    for (client, _), x, folded in zip(rows, xs, real, strict=True):
        got, _ = client.decrypt_folded(folded)
        assert np.abs(got - (x[:half] + x[half:])).max() < 0.05
    with pytest.raises(HEError, match="size-2"):
        batch.serialize_folded(batch.multiply(stacked, stacked, rescale=False, relinearize=False), 20.0)


def test_batch_keys_are_the_steps_every_row_holds(rows):
    batch = NativeBatch([s for _, s in rows])
    assert 100 not in batch.rotation_steps and -3 in batch.rotation_steps
    ct = batch.stack([s.deserialize(c.encrypt_to_bytes(np.ones(SLOTS))) for c, s in rows])
    with pytest.raises(HEError, match="no Galois key"):
        batch.rotate(ct, 100)
    with pytest.raises(HEError, match="serialize one ciphertext"):
        rows[0][1].serialize(ct)
    with pytest.raises(ValueError, match="secret key"):
        NativeBatch([c for c, _ in rows])
    with pytest.raises(HEError, match="one level"):
        batch.stack([rows[0][1].deserialize(rows[0][0].encrypt_to_bytes(np.ones(SLOTS), level=lv)) for lv in (1, 2, 2)])


@pytest.mark.parametrize("layout,shape", [("bsgs", (64, 64)), ("folded", (40, 64)), ("wide", (24, 96))])
def test_matrices_encoded_together_equal_each_alone(rows, layout, shape):
    """``encode_matrices`` (one gather, one ``encode_many``; the first protected layer's
    per-row shuffled FFN) = ``encode_matrix`` per matrix, bit for bit, from an array and from
    the backend's device tensor; a diagonal zero in one matrix only is kept for all (as zeros)."""
    be = rows[0][1]
    ws = np.random.default_rng(6).standard_normal((3, *shape))
    if layout == "bsgs":
        j = np.arange(shape[0])
        ws[1, j, (j + 5) % shape[1]] = 0.0  # diagonal 5 of the second matrix only
    for stack in (ws, be.encodable(ws)):
        together = encode_matrices(be, stack, 2, layout=layout)
        for w, m in zip(ws, together, strict=True):
            alone = encode_matrix(be, w, 2, layout=layout)
            assert m.plan == alone.plan and set(alone.plaintexts) <= set(m.plaintexts)
            for u, pt in m.plaintexts.items():
                want = alone.plaintexts[u]._obj if u in alone.plaintexts else torch.zeros_like(pt._obj)
                assert torch.equal(pt._obj, want)
        if layout == "bsgs":
            assert len(together[1].plaintexts) == len(encode_matrix(be, ws[1], 2).plaintexts) + 1


def test_permuted_matrices_encode_from_their_entry_bounds_without_a_read(rows, monkeypatch):
    """The shuffled FFN (``EncodedLayer.shuffled_ffn``): copies of one matrix with its rows in
    other orders, a few entries exactly zero (as in the shipped weights), encoded together from
    the device tensor with the matrix's ``EntryBounds``: no read from the device (on a GPU each
    waits for every queued kernel), and the same plaintexts and all-zero flags as without them,
    bit for bit. A matrix whose zeros could fill a diagonal is read, and still right; the bounds
    are a lower bound on any set of its entries' squares."""
    be = rows[0][1]
    rng = np.random.default_rng(8)
    w = rng.standard_normal((64, 64))
    w.flat[rng.choice(w.size, 40, replace=False)] = 0.0
    sparse = np.zeros((64, 64))
    sparse[0, 0] = sparse[5, 9] = sparse[63, 1] = 1.0
    reads = []
    for name in ("cpu", "tolist"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _real=real, **k: reads.append(t.shape) or _real(t, *a, **k))
    for m, want_reads in ((w, False), (sparse, True)):
        perms = torch.from_numpy(np.stack([rng.permutation(64) for _ in range(3)]))
        stack = be.encodable(m)[perms]  # [3, 64, 64]: 3 x 64 diagonals, three of the encoder's chunks
        without = encode_matrices(be, stack, 2)
        reads.clear()
        bounded = encode_matrices(be, stack, 2, entries=EntryBounds.of(m))
        assert bool(reads) is want_reads
        for a, b in zip(without, bounded, strict=True):
            assert set(a.plaintexts) == set(b.plaintexts)
            for u, pt in a.plaintexts.items():
                assert torch.equal(pt._obj, b.plaintexts[u]._obj) and pt.nonzero is b.plaintexts[u].nonzero
    sq = np.sort(np.square(w).ravel())
    for bounds in (EntryBounds.of(w), EntryBounds.of(w, points=100)):  # every sum kept; every 40th
        for c in (1, 41, 500, 4095, sq.size):
            least = bounds.least_sumsq(np.array([c]))[0]
            assert least <= sq[:c].sum() <= sq[rng.choice(sq.size, c, replace=False)].sum() * (1 + 1e-12)
            assert least >= sq[: c // bounds.step * bounds.step].sum() * (1 - 1e-5)
        with pytest.raises(HEError, match="smaller matrix"):
            bounds.least_sumsq(np.array([sq.size + 1]))
    none, some = EntryBounds.of(w).least_sumsq(np.array([40, 41]))  # 40 entries are zero
    assert none == 0 < some


def test_rows_encoded_together_stack_without_a_copy(rows):
    """The shuffled FFN's per-session encodings (``encode_matrices``: a diagonal's rows come
    out side by side) stack as a view of the encoder's output, and so do a stacked plaintext's
    rows given back (``unstack_plain``: a session's W_down between its WEIGHTS and MLP_IN
    steps); rows from separate encodings, or out of order, are copied. Either way the operand
    equals the rows stacked. Four rows: the encoder's chunks (64 vectors) then hold whole
    diagonals; a diagonal split across two chunks is copied."""
    be = rows[0][1]
    batch = NativeBatch([be] * 4)
    ws = np.random.default_rng(7).standard_normal((4, 64, 64))
    together = encode_matrices(be, ws, 2)
    alone = [encode_matrix(be, w, 2) for w in ws]
    for ms, shared in ((together, True), (alone, False), (together[::-1], False)):
        for u in ms[0].plaintexts:
            parts = [m.plaintexts[u]._obj for m in ms]
            st = batch.stack_plain([m.plaintexts[u] for m in ms])._obj
            assert torch.equal(st, torch.stack(parts).unsqueeze(1))
            assert (st.untyped_storage().data_ptr() == parts[0].untyped_storage().data_ptr()) is shared
    st = batch.stack_plain([m.plaintexts[0] for m in together])
    again = batch.stack_plain(batch.unstack_plain(st))
    assert again._obj.data_ptr() == st._obj.data_ptr() and torch.equal(again._obj, st._obj)


def test_a_stacked_plaintext_takes_its_zero_check_from_its_rows(rows):
    """``stack_plain`` carries the rows' all-zero checks (``encode_many`` makes them once per
    chunk), so a product with it does not check the device tensor again, a host sync per stacked
    diagonal per step on a GPU; the flag is what that check would give (any row nonzero), and
    unknown where a row's is. The rows it gives back keep their own checks."""
    be = rows[0][1]
    batch = NativeBatch([be] * 2)
    vals = np.zeros((4, 16))
    vals[1, 3] = 1.0
    zero, one, zero2, one2 = be.encode_many(vals, 2)
    for pts, want in (([zero, one], True), ([zero, zero2], False), ([one2, one], True)):
        st = batch.stack_plain(pts)
        assert st.nonzero is want and bool(st._obj.any()) is want
    back = batch.unstack_plain(batch.stack_plain([zero, one]))  # a session's W_down between its steps
    assert [p.nonzero for p in back] == [False, True] and batch.stack_plain(back).nonzero is True
    fresh = be.encode(vals[1], level=2)
    assert fresh.nonzero is True  # ``encode`` checks too (here from the host values alone)
    fresh.nonzero = None  # a plaintext not checked yet
    assert batch.stack_plain([one, fresh]).nonzero is None
    assert [p.nonzero for p in batch.unstack_plain(batch.stack_plain([one, fresh]))] == [None, None]
    ct = batch.stack([be.deserialize(rows[0][0].encrypt_to_bytes(np.ones(SLOTS), level=2))] * 2)
    with pytest.raises(HEError, match="all-zero"):
        batch.multiply_plain(ct, batch.stack_plain([zero, zero2]))


def test_one_sessions_positions_as_rows_use_its_own_keys(rows):
    """A prefill span's products (``Circuit.matvecs`` where a batch pays): the rows are one
    session's positions, so the batch holds that session's keys themselves (one key read for all
    rows, no per-row stack), and a product, hoisted rotations and a relinearization give each
    position bit for bit what the session gives it alone, per-row plaintexts included."""
    rng = np.random.default_rng(5)
    client, server = rows[0]
    batch = NativeBatch([server] * 3)
    assert batch._gks == server._gks and batch._rlk is server._rlk and not batch.batch_pays
    ws = [rng.standard_normal((64, 64)) / 8 for _ in range(3)]  # per position, as the first layer's shuffle
    xs = [replicate_input(rng.standard_normal(64), SLOTS) for _ in range(3)]
    cts = [server.deserialize(client.encrypt_to_bytes(x)) for x in xs]
    ms = [encode_matrix(server, w, server.level(cts[0]), n1=8) for w in ws]
    pts = {u: batch.stack_plain([m.plaintexts[u] for m in ms]) for u in ms[0].plaintexts}
    stacked = type(ms[0])(ms[0].params_id, ms[0].level, ms[0].plan, pts)
    st = batch.stack(cts)
    together = [batch.unstack(matvec(batch, stacked, st)), batch.unstack(matvec(batch, ms[1], st)),
                *(batch.unstack(r) for r in batch.rotate_many(st, [1, -3])),
                batch.unstack(batch.multiply(st, st))]
    alone = [[matvec(server, m, ct) for m, ct in zip(ms, cts, strict=True)], [matvec(server, ms[1], ct) for ct in cts],
             *([server.rotate(ct, s) for ct in cts] for s in (1, -3)), [server.multiply(ct, ct) for ct in cts]]
    for a_row, t_row in zip(alone, together, strict=True):
        for a, t in zip(a_row, t_row, strict=True):
            assert torch.equal(_data(server, a), _data(server, t))
    for m, x, y in zip(ws, xs, together[0], strict=True):
        assert np.abs(client.decrypt(y, 64) - m @ x[:64]).max() < 1e-4

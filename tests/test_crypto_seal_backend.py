"""SEAL backend arithmetic: levels, rotations, ct x ct, and baby-step/giant-step products.

Runs on the test-only N=8192 set (the properties do not depend on N); client and server are
separate backend objects and the server holds only the exported public material.
"""

import numpy as np
import pytest

from veil.crypto.backend import (
    BabySteps,
    HEError,
    Plaintext,
    bsgs_split,
    matvec_rotation_steps,
    plan_matvec,
    replicate_input,
    replicate_rotation_steps,
)
from veil.crypto.params import TEST_PARAMS_ID, get_params
from veil.crypto.seal_backend import SealBackend

P = get_params(TEST_PARAMS_ID, allow_test_params=True)
SLOTS = P.slot_count
N1 = 24  # one baby-step size for every matrix: the Galois keys and baby steps are shared
REPLICATE_STEPS = [-192, -384, -768]
FOLDED_SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (40, 7), (500, 288)]
WIDE_SHAPES = [(576, 1536), (100, 512), (3, 16)]
FOLDED_STEPS = sorted(
    set().union(*(plan_matvec(r, c, SLOTS, "folded").rotation_steps for r, c in FOLDED_SHAPES))
    | set().union(*(plan_matvec(r, c, SLOTS, "wide").rotation_steps for r, c in WIDE_SHAPES))
)


@pytest.fixture(scope="module")
def pair():
    client = SealBackend(P)
    steps = set(matvec_rotation_steps(1536, N1)) | set(REPLICATE_STEPS) | {5, -7}
    steps |= set(FOLDED_STEPS) | set(replicate_rotation_steps(100, 11))
    client.generate_keys(sorted(steps))
    server = SealBackend(P)
    server.import_public_material(client.export_public_material())
    return client, server


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(1234)


def _tol(values_scale=1.0):
    # 2^40 scale: ~1e-7 relative after a few hundred accumulated terms
    return 1e-5 * values_scale


def test_encrypt_decrypt_levels(pair, rng):
    client, server = pair
    x = rng.standard_normal(SLOTS)
    for level in range(P.top_level + 1):
        ct = client.encrypt(x, level=level)
        assert server.level(ct) == level and server.scale(ct) == P.scale and server.size(ct) == 2
        np.testing.assert_allclose(client.decrypt(ct), x, atol=1e-7)
    assert client.decrypt(client.encrypt(x[:10]), 10).shape == (10,)
    with pytest.raises(HEError):
        client.encrypt(np.ones(SLOTS + 1))
    with pytest.raises(HEError):
        client.encrypt(x, level=P.top_level + 1)
    with pytest.raises(HEError):
        client.encrypt(np.array([np.nan]))


def test_server_cannot_decrypt(pair, rng):
    client, server = pair
    assert client.has_secret_key and not server.has_secret_key
    ct = client.encrypt(rng.standard_normal(8))
    with pytest.raises(HEError):
        server.decrypt(ct)
    # the server encrypts under the public key; the client decrypts
    y = server.encrypt(np.arange(4.0))
    np.testing.assert_allclose(client.decrypt(y, 4), np.arange(4.0), atol=1e-6)


def test_add_sub_plain(pair, rng):
    client, server = pair
    a, b = rng.standard_normal(SLOTS), rng.standard_normal(SLOTS)
    ca, cb = client.encrypt(a), client.encrypt(b)
    np.testing.assert_allclose(client.decrypt(server.add(ca, cb)), a + b, atol=1e-6)
    np.testing.assert_allclose(client.decrypt(server.sub(ca, cb)), a - b, atol=1e-6)
    np.testing.assert_allclose(client.decrypt(server.add_plain(ca, b)), a + b, atol=1e-6)
    prod = server.multiply_plain(ca, b)
    assert server.level(prod) == P.top_level - 1
    assert server.scale(prod) == pytest.approx(P.scale, rel=1e-12)  # encoded at q_level
    np.testing.assert_allclose(client.decrypt(prod), a * b, atol=1e-5)


def test_rotations(pair, rng):
    client, server = pair
    x = rng.standard_normal(SLOTS)
    ct = client.encrypt(x)
    for step in (1, 5, 24, -7, -192, 0):
        got = client.decrypt(server.rotate(ct, step))
        np.testing.assert_allclose(got, np.roll(x, -step), atol=1e-5, err_msg=f"step {step}")
    # a left rotation by slots - 7 is a right rotation by 7: same key
    np.testing.assert_allclose(
        client.decrypt(server.rotate(ct, SLOTS - 7)), np.roll(x, 7), atol=1e-5
    )
    with pytest.raises(HEError, match="Galois"):
        server.rotate(ct, 3 * 1000 + 1)


def test_ct_ct_multiply_rescale_modswitch(pair, rng):
    client, server = pair
    a, b = rng.standard_normal(SLOTS), rng.standard_normal(SLOTS)
    ca, cb = client.encrypt(a), client.encrypt(b)
    c = server.multiply(ca, cb)
    assert server.size(c) == 2 and server.level(c) == P.top_level - 1
    np.testing.assert_allclose(client.decrypt(c), a * b, atol=1e-5)
    raw = server.multiply(ca, cb, rescale=False)
    assert server.level(raw) == P.top_level and server.scale(raw) == P.scale**2
    r = server.rescale(raw)
    assert server.level(r) == P.top_level - 1
    np.testing.assert_allclose(client.decrypt(r), a * b, atol=1e-5)
    m = server.mod_switch_to(ca, 0)
    assert server.level(m) == 0 and server.scale(m) == P.scale
    np.testing.assert_allclose(client.decrypt(m), a, atol=1e-6)
    with pytest.raises(HEError):
        server.rescale(m)
    with pytest.raises(HEError):
        server.mod_switch_to(m, 1)
    with pytest.raises(HEError, match="level"):
        server.add(c, ca)
    with pytest.raises(HEError, match="scale"):
        server.add(raw, ca)
    c2 = server.set_scale(c, P.scale)
    assert server.scale(c2) == P.scale


def test_sum_of_unrelinearized_products_relinearized_once(pair, rng):
    """Σ a_i b_i with one relinearization (after the rescale) equals the sum of relinearized
    products; a three-polynomial ciphertext is refused as a product operand."""
    client, server = pair
    xs = [(rng.standard_normal(SLOTS), rng.standard_normal(SLOTS)) for _ in range(3)]
    acc = None
    for a, b in xs:
        p = server.multiply(client.encrypt(a, level=2), client.encrypt(b, level=2), rescale=False, relinearize=False)
        assert server.size(p) == 3
        acc = p if acc is None else server.add(acc, p)
    out = server.relinearize(server.rescale(acc))
    assert server.size(out) == 2 and server.level(out) == 1
    np.testing.assert_allclose(client.decrypt(out), sum(a * b for a, b in xs), atol=1e-4)
    with pytest.raises(HEError, match="two-polynomial"):
        server.multiply(acc, acc)


def test_bsgs_split_and_steps():
    assert bsgs_split(576) == (24, 24)
    assert bsgs_split(1536, 24) == (24, 64)
    assert bsgs_split(5) == (3, 2)
    assert matvec_rotation_steps(576) == list(range(1, 24)) + [24 * g for g in range(1, 24)]
    x = np.arange(5.0)
    r = replicate_input(x, 12)
    assert r.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]


@pytest.mark.parametrize(
    "rows,cols,level",
    [
        (576, 576, 2),  # W_q / W_o shape, top level
        (192, 576, 2),  # W_k / W_v (GQA): 576 -> 192
        (1536, 576, 1),  # W_gate / W_up: 576 -> 1536, at a lower level
        (40, 7, 1),  # tiny, n1 does not divide cols
    ],
)
def test_matvec_vs_numpy(pair, rng, rows, cols, level):
    client, server = pair
    w = rng.standard_normal((rows, cols)) / np.sqrt(cols)
    w[:, 3 % cols] = 0.0  # some zero entries; an all-zero diagonal is skipped
    x = rng.standard_normal(cols)
    ct = client.encrypt(replicate_input(x, SLOTS), level=level)
    n1 = N1 if cols >= N1 else None
    m = server.encode_matrix(w, level, n1=n1)
    assert (m.rows, m.cols, m.level) == (rows, cols, level)
    y = server.matvec(m, ct)
    assert server.level(y) == level - 1
    assert server.scale(y) == pytest.approx(P.scale, rel=1e-9)
    out = client.decrypt(y)
    ref = w @ x
    # error bound: ~2^-40 * sqrt(cols) * |w||x| per term plus key-switching noise
    assert np.abs(out[:rows] - ref).max() < 1e-5
    assert np.abs(out[rows:]).max() < 1e-5  # zero-padded output


def test_matvec_1536_to_576(pair, rng):
    """W_down: 1536 -> 576 (1536 diagonals) at level 1."""
    client, server = pair
    w = rng.standard_normal((576, 1536)) / np.sqrt(1536)
    x = rng.standard_normal(1536)
    ct = client.encrypt(replicate_input(x, SLOTS), level=1)
    m = server.encode_matrix(w, 1, n1=N1)
    out = client.decrypt(server.matvec(m, ct), 576)
    assert np.abs(out - w @ x).max() < 1e-5


@pytest.mark.parametrize("layout,rows,cols", [("folded", r, c) for r, c in FOLDED_SHAPES]
                         + [("wide", r, c) for r, c in WIDE_SHAPES])
def test_matvec_packed_layouts(pair, rng, layout, rows, cols):
    """Folded: blocks of diagonals share plaintexts, every diagonal in exactly one block (also
    with 7 blocks folded as 8). Wide (Halevi-Shoup hybrid, rows < cols): the diagonals of the
    row-tiled matrix, for W_down's shape no more plaintexts than folded. Both: slots [0, rows)
    hold W x after one level."""
    client, server = pair
    w = rng.standard_normal((rows, cols)) / np.sqrt(cols)
    x = rng.standard_normal(cols)
    level = 2
    ct = client.encrypt(replicate_input(x, SLOTS), level=level)
    m = server.encode_matrix(w, level, layout=layout)
    plan = m.plan
    assert plan.layout == layout and plan.input_span <= SLOTS
    assert plan.fold_blocks & (plan.fold_blocks - 1) == 0 and plan.blocks <= plan.fold_blocks < 2 * plan.blocks
    owned = [k for row in plan.diagonal_owners() for k in row if k >= 0]
    assert sorted(owned) == list(range(plan.num_diagonals))  # every diagonal exactly once
    if layout == "folded":
        assert plan.stride >= rows and (plan.fold_blocks - 1) * plan.stride + rows <= SLOTS
        assert len(m.plaintexts) <= plan.per_block < cols or cols < 8
    else:
        assert rows <= plan.row_period < cols and cols % plan.row_period == 0 and plan.row_folds
        assert len(m.plaintexts) <= plan.per_block
        if (rows, cols) == (576, 1536):  # W_down's shape: the reason the layout exists
            assert len(m.plaintexts) <= len(server.encode_matrix(w, level, layout="folded").plaintexts)
    y = server.matvec(m, ct)
    assert server.level(y) == level - 1
    assert np.abs(client.decrypt(y, rows) - w @ x).max() < 1e-5


def test_plan_matvec():
    p = plan_matvec(576, 576, 8192, "folded")
    assert p.blocks == 8 and p.per_block == 72 and p.stride == 648
    # a stride that is not the block size (mod cols): the block offsets t*987 mod 576 leave
    # gaps of at most 84, so 7 blocks of 84 diagonals fit where disjoint windows allowed 4 of 144
    q = plan_matvec(960, 576, 8064, "folded", 16)
    assert (q.blocks, q.fold_blocks, q.per_block, q.stride, q.n2) == (7, 8, 84, 987, 6)
    assert sorted(q.block_offsets) == [0, 81, 162, 246, 327, 411, 492]
    assert q.rotations < plan_matvec(1728, 576, 8064, "folded", 16).rotations
    assert p.rotations < plan_matvec(576, 576, 8192).rotations
    b = plan_matvec(576, 576, 8192)
    assert (b.n1, b.n2, b.blocks, b.rotations) == (24, 24, 1, 46)
    with pytest.raises(ValueError):
        plan_matvec(4000, 600, 4096)
    with pytest.raises(ValueError):
        plan_matvec(4, 4, 4096, layout="spiral")


def test_shared_baby_steps_and_chaining(pair, rng):
    """W_q and W_k share the baby steps of h; W_k's output is replicated into W_up-like input."""
    client, server = pair
    h = rng.standard_normal(576)
    wq = rng.standard_normal((576, 576)) / 24
    wk = rng.standard_normal((192, 576)) / 24
    w2 = rng.standard_normal((576, 192)) / np.sqrt(192)
    ct = client.encrypt(replicate_input(h, SLOTS), level=2)
    mq, mk = server.encode_matrix(wq, 2, n1=N1), server.encode_matrix(wk, 2, n1=N1)
    bs = server.baby_steps(ct, N1)
    assert isinstance(bs, BabySteps) and len(bs.rotations) == N1
    q, k = server.matvec(mq, bs), server.matvec(mk, bs)
    assert np.abs(client.decrypt(q, 576) - wq @ h).max() < 1e-5
    assert np.abs(client.decrypt(k, 192) - wk @ h).max() < 1e-5
    # chain: k (192 values, zero elsewhere) -> replicated -> 192 -> 576 product
    kr = server.replicate(k, 192, 8)  # 8 copies cover rows + cols + n1 = 576 + 192 + 24
    got = client.decrypt(kr)
    np.testing.assert_allclose(got[: 8 * 192], np.tile(wk @ h, 8), atol=1e-5)
    m2 = server.encode_matrix(w2, 1, n1=N1)
    z = server.matvec(m2, kr)
    assert np.abs(client.decrypt(z, 576) - w2 @ (wk @ h)).max() < 1e-4


def test_matvec_rejects_mismatch(pair, rng):
    client, server = pair
    m = server.encode_matrix(rng.standard_normal((8, 8)), 2)
    ct1 = client.encrypt(replicate_input(np.ones(8), SLOTS), level=1)
    with pytest.raises(HEError, match="level"):
        server.matvec(m, ct1)
    ct2 = client.encrypt(replicate_input(np.ones(8), SLOTS), level=2)
    with pytest.raises(HEError, match="n1"):
        server.matvec(m, server.baby_steps(ct2, 2))
    with pytest.raises(HEError):
        server.encode_matrix(np.ones((8, 8)), 0)  # nothing to rescale into
    with pytest.raises(HEError):
        server.encode_matrix(np.ones((4000, 600)), 2)  # does not fit the slots
    with pytest.raises(HEError):
        server.encode_matrix(np.zeros((4, 4)), 2)


def test_encode_handle(pair, rng):
    client, server = pair
    x, w = rng.standard_normal(SLOTS), rng.standard_normal(SLOTS)
    ct = client.encrypt(x, level=2)
    pt = server.encode(w, level=2, scale=2.0**30)
    assert isinstance(pt, Plaintext) and pt.level == 2
    y = server.multiply_plain(ct, pt)
    assert server.scale(y) == pytest.approx(P.scale * 2.0**30 / server._levels[2].primes[-1])
    np.testing.assert_allclose(client.decrypt(y), x * w, atol=1e-4)
    same = server.encode(w, level=2)
    np.testing.assert_allclose(client.decrypt(server.add_plain(ct, same)), x + w, atol=1e-6)
    with pytest.raises(HEError, match="level"):
        server.multiply_plain(client.encrypt(x, level=1), pt)
    with pytest.raises(HEError, match="scale"):
        server.add_plain(ct, pt)


def test_replicate_any_number_of_copies(pair, rng):
    client, server = pair
    assert replicate_rotation_steps(100, 11) == [-1000, -800, -400, -200, -100]
    v = rng.standard_normal(100)
    ct = client.encrypt(v)  # zero outside [0, 100)
    for copies in (1, 2, 3, 8, 11):
        got = client.decrypt(server.replicate(ct, 100, copies))
        np.testing.assert_allclose(got[: 100 * copies], np.tile(v, copies), atol=1e-5)
        assert np.abs(got[100 * copies :]).max() < 1e-5
    with pytest.raises(HEError):
        server.replicate(ct, 100, 41)

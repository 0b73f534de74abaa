"""Linear algebra over the HE interface (``veil.crypto.linear``), on every backend.

Diagonal products in every layout, replication, window sums and lane broadcasts against
numpy, on the test-only N=8192 set (4096 slots hold a 1536 -> 576 product).
"""

import numpy as np
import pytest

from veil.crypto.backend import HEError
from veil.crypto.linear import (
    baby_steps,
    broadcast_lane,
    bsgs_split,
    composed_rotation,
    encode_matrix,
    matvec,
    pack_inputs,
    plan_matvec,
    replicate,
    replicate_input,
    replicate_rotation_steps,
    unpack_outputs,
)
from veil.crypto.params import TEST_PARAMS_ID, get_params
from veil.kernels import ckks_cpu

# conftest: native runs here by default where its C kernels are built (8 s); with the eager twins
# its rotations take ~15 min, so without a C compiler VEIL_TEST_NATIVE=1 opts in
NATIVE_OPT_IN = not ckks_cpu.available()
P = get_params(TEST_PARAMS_ID, allow_test_params=True)
SLOTS = P.slot_count
N1 = 24  # one baby-step size for every bsgs matrix: few Galois keys
FOLDED_SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (40, 7), (500, 288)]
WIDE_SHAPES = [(576, 1536), (100, 512), (3, 16)]
BSGS_SHAPES = [(576, 576, 2), (192, 576, 2), (1536, 576, 1), (40, 7, 1), (576, 1536, 1)]
PACKED = [("folded", 192, 576, 2), ("folded", 500, 288, 4), ("wide", 100, 512, 2), ("bsgs", 40, 7, 4)]
FRAMED = [(192, 576), (500, 288), (40, 7)]  # inputs repeated in 2 frames of SLOTS/2, whole copies


def _framed(x: np.ndarray) -> np.ndarray:
    """``x`` in whole copies in each of two frames of SLOTS/2 slots, zero tails (the hidden layout)."""
    frame = np.zeros(SLOTS // 2)
    copies = frame.size // x.size
    frame[: copies * x.size] = np.tile(x, copies)
    return np.tile(frame, 2)


def _framed_plan(rows: int, cols: int):
    return plan_matvec(rows, cols, SLOTS // 2 // cols * cols, "folded", None, 2, SLOTS // 2)


def _steps() -> list[int]:
    steps = set()
    for r, c, _ in BSGS_SHAPES:
        steps |= set(plan_matvec(r, c, SLOTS, "bsgs", N1 if c >= N1 else None).rotation_steps)
    for layout, shapes in (("folded", FOLDED_SHAPES), ("wide", WIDE_SHAPES)):
        for r, c in shapes:
            steps |= set(plan_matvec(r, c, SLOTS, layout).rotation_steps)
    for layout, r, c, pack in PACKED:
        steps |= set(plan_matvec(r, c, SLOTS // pack, layout).rotation_steps)
    for r, c in FRAMED:
        steps |= set(_framed_plan(r, c).rotation_steps)
    steps |= set(replicate_rotation_steps(100, 11)) | set(replicate_rotation_steps(192, 8))
    steps |= {1, 2, 4, 8, 16, 32, 64, -1, -2, -4}  # window sums and lane broadcasts
    return sorted(s for s in steps if s % SLOTS)


@pytest.fixture(scope="module")
def pair(he_backend, he_pair):
    return he_pair(he_backend, P, _steps())


@pytest.fixture()
def rng():
    return np.random.default_rng(1234)


def test_bsgs_split_and_replicated_input():
    assert bsgs_split(576) == (24, 24)
    assert bsgs_split(1536, 24) == (24, 64)
    assert bsgs_split(5) == (3, 2)
    # baby steps 1..23, and the giant steps all by 24 (Horner's rule): 24 keys, not 46
    assert plan_matvec(576, 576, 8192).rotation_steps == list(range(1, 25))
    assert replicate_input(np.arange(5.0), 12).tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]


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
    # the hidden layout's two frames of 7 copies: W_qkv's and W_gate|up's framed plans take the
    # rotations of the one-period plans over 14 copies; W_qkv 96 plaintexts where that took 84
    f = plan_matvec(960, 576, 4032, "folded", 16, 2, 4096)
    assert (f.blocks, f.per_block, f.stride, f.frame_stride, q.per_block) == (6, 96, 960, 4192, 84)
    assert f.rotations == q.rotations and f.frame_folds == [4192] and f.input_span <= 4032
    assert sorted(f.block_offsets) == [0, 96, 192, 288, 384, 480]
    g, g1 = plan_matvec(3072, 576, 4032, "folded", 16, 2, 4096), plan_matvec(3072, 576, 8064, "folded", 16)
    assert (g.per_block, g.rotations, g.frame_stride) == (g1.per_block, g1.rotations, 4096 + 288)
    with pytest.raises(ValueError, match="framed"):
        plan_matvec(100, 512, 2048, "wide", None, 2, 4096)
    with pytest.raises(ValueError, match="framed"):
        plan_matvec(960, 576, 4096 + 576, "folded", 16, 2, 4096)
    with pytest.raises(ValueError):
        plan_matvec(4000, 600, 4096)
    with pytest.raises(ValueError):
        plan_matvec(4, 4, 4096, layout="spiral")


def test_distinct_entries_count_each_diagonals_distinct_reads(rng):
    """``_distinct_entries`` (the shuffled FFN's encoding bounds, ``EntryBounds``) counts what
    ``np.unique`` of each diagonal plaintext's read positions counts, empty slots (-1) left out:
    on every layout's plans, and on rows that read entries more than once."""
    from veil.crypto.linear.encode import _diagonal_index, _distinct_entries, _distinct_per_row

    plans = [plan_matvec(rows, cols, SLOTS, "folded", N1) for rows, cols in FOLDED_SHAPES[:4]]
    plans += [plan_matvec(rows, cols, SLOTS, "wide", N1) for rows, cols in WIDE_SHAPES]
    plans += [plan_matvec(rows, cols, SLOTS // 2 - 64, "folded", N1, 2, SLOTS // 2) for rows, cols in FRAMED]
    plans += [plan_matvec(40, 7, SLOTS, "bsgs", N1)]
    for plan in plans:
        index = _diagonal_index(plan, SLOTS)[1]
        assert _distinct_entries(plan, SLOTS).tolist() == [np.unique(row[row >= 0]).size for row in index]
    repeats = rng.integers(-1, 30, size=(50, 64))  # entries read again, slots empty, rows of -1 only
    repeats[3] = -1
    assert _distinct_per_row(repeats).tolist() == [np.unique(row[row >= 0]).size for row in repeats]


@pytest.mark.parametrize("rows,cols,level", BSGS_SHAPES)
def test_bsgs_matvec_vs_numpy(pair, rng, rows, cols, level):
    client, server = pair
    w = rng.standard_normal((rows, cols)) / np.sqrt(cols)
    w[:, 3 % cols] = 0.0  # some zero entries
    x = rng.standard_normal(cols)
    ct = client.encrypt(replicate_input(x, SLOTS), level=level)
    m = encode_matrix(server, w, level, n1=N1 if cols >= N1 else None)
    assert (m.rows, m.cols, m.level) == (rows, cols, level)
    y = matvec(server, m, ct)
    assert server.level(y) == level - 1 and server.scale(y) == pytest.approx(P.scale, rel=1e-9)
    out = client.decrypt(y)
    # ~2^-40 * sqrt(cols) * |w||x| per term, plus key-switching noise of the rotations
    assert np.abs(out[:rows] - w @ x).max() < 1e-5
    assert np.abs(out[rows:]).max() < 1e-5  # the bsgs output is zero outside [0, rows)


def test_dot_plain_many_is_a_dot_plain_per_row(pair, rng):
    """The giant steps' inner sums in one call: each row equals ``dot_plain`` over its present
    terms (bit for bit where the backend is deterministic), a row without any term and a row of
    the wrong length are refused."""
    client, server = pair
    cts = [client.encrypt(rng.standard_normal(SLOTS), level=2) for _ in range(5)]
    pts = [[server.encode(rng.standard_normal(SLOTS), 2) if (o + k) % 3 else None for k in range(5)] for o in range(4)]
    got = server.dot_plain_many(cts, pts)
    for row, y in zip(pts, got, strict=True):
        terms = [(c, p) for c, p in zip(cts, row, strict=True) if p is not None]
        want = server.dot_plain([c for c, _ in terms], [p for _, p in terms])
        assert server.level(y) == 2 and server.scale(y) == pytest.approx(server.scale(want), rel=1e-12)
        if server.name in ("native", "seal"):
            assert server.serialize(y) == server.serialize(want)
        assert np.abs(client.decrypt(y) - client.decrypt(want)).max() < 1e-6
    with pytest.raises(HEError, match="empty"):
        server.dot_plain_many(cts, [[None] * 5])
    with pytest.raises(HEError):
        server.dot_plain_many(cts, [pts[0][:4]])


@pytest.mark.parametrize("layout,rows,cols,pack", PACKED)
def test_packed_positions_share_one_product(pair, rng, layout, rows, cols, pack):
    """``pack`` positions in one ciphertext, each in its own frame of S/pack slots: one product
    (the plan's rotations, once) gives every position its own W x; a frame left empty gives
    zero. The plaintexts repeat with period S/pack."""
    client, server = pair
    w = rng.standard_normal((rows, cols)) / np.sqrt(cols)
    xs = [rng.standard_normal(cols) for _ in range(pack - 1)]  # the last frame stays empty
    ct = client.encrypt(pack_inputs(xs, SLOTS, pack), level=2)
    m = encode_matrix(server, w, 2, layout=layout, pack=pack)
    assert m.pack == pack and m.plan == plan_matvec(rows, cols, SLOTS // pack, layout)
    assert m.plan.input_span <= SLOTS // pack
    y = client.decrypt(matvec(server, m, ct))
    out = unpack_outputs(y, rows, pack)
    for p, x in enumerate(xs):
        assert np.abs(out[p] - w @ x).max() < 1e-5
    assert np.abs(out[-1]).max() < 1e-5
    with pytest.raises(HEError, match="power of two"):
        encode_matrix(server, w, 2, layout=layout, pack=3)


@pytest.mark.parametrize("rows,cols", FRAMED)
def test_framed_input_products(pair, rng, rows, cols):
    """An input repeated in two frames (whole copies, zero tails): blocks in both frames, the
    second frame's ``delta`` slots further in so that its blocks see other diagonals, summed by
    one more rotation. W x in [0, rows); every diagonal in exactly one block; no block reads
    past its frame's copies; never more plaintexts than a one-frame plan over the same span."""
    client, server = pair
    w = rng.standard_normal((rows, cols)) / np.sqrt(cols)
    x = rng.standard_normal(cols)
    span = SLOTS // 2 // cols * cols
    m = encode_matrix(server, w, 2, layout="folded", max_input_span=span, frames=2)
    plan = m.plan
    assert plan == _framed_plan(rows, cols) and plan.frames == 2 and plan.input_span <= span
    assert plan.frame_stride >= SLOTS // 2 and plan.frame_folds == [plan.frame_stride]
    owned = [k for row in plan.diagonal_owners() for k in row if k >= 0]
    assert sorted(owned) == list(range(cols))
    for start in plan.block_starts:  # inside a frame's copies, input span included
        assert start % (SLOTS // 2) + rows + plan.n1 * plan.n2 <= span
    assert len(m.plaintexts) <= len(encode_matrix(server, w, 2, layout="folded", max_input_span=span).plaintexts)
    y = matvec(server, m, client.encrypt(_framed(x), level=2))
    assert np.abs(client.decrypt(y, rows) - w @ x).max() < 1e-5
    with pytest.raises(HEError, match="one position"):
        encode_matrix(server, w, 2, layout="folded", max_input_span=span, pack=2, frames=2)


@pytest.mark.parametrize("layout,rows,cols", [("folded", r, c) for r, c in FOLDED_SHAPES]
                         + [("wide", r, c) for r, c in WIDE_SHAPES])
def test_packed_layouts(pair, rng, layout, rows, cols):
    """Folded: blocks of diagonals share plaintexts, every diagonal in exactly one block (also
    with 7 blocks folded as 8). Wide (Halevi-Shoup hybrid, rows < cols): the diagonals of the
    row-tiled matrix, for W_down's shape no more plaintexts than folded. Both: slots [0, rows)
    hold W x after one level."""
    client, server = pair
    w = rng.standard_normal((rows, cols)) / np.sqrt(cols)
    x = rng.standard_normal(cols)
    ct = client.encrypt(replicate_input(x, SLOTS), level=2)
    m = encode_matrix(server, w, 2, layout=layout)
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
            assert len(m.plaintexts) <= len(encode_matrix(server, w, 2, layout="folded").plaintexts)
    y = matvec(server, m, ct)
    assert server.level(y) == 1
    assert np.abs(client.decrypt(y, rows) - w @ x).max() < 1e-5


def _count_calls(monkeypatch, be, name: str) -> list:
    """Record the step arguments of ``be.<name>`` (a counting wrapper, test only)."""
    calls, inner = [], getattr(be, name)
    monkeypatch.setattr(be, name, lambda ct, st: calls.append(st if name == "rotate" else list(st)) or inner(ct, st))
    return calls


def _folded_product(pair, rows: int, cols: int, level: int, rng, monkeypatch):
    """W x through a folded product on ``pair``'s keys: (the steps rotated by, the largest error,
    the server, the input)."""
    client, server = pair
    w = rng.standard_normal((rows, cols)) / np.sqrt(cols)
    x = rng.standard_normal(cols)
    ct = client.encrypt(replicate_input(x, SLOTS), level=level)
    m = encode_matrix(server, w, level, layout="folded")
    calls = _count_calls(monkeypatch, server, "rotate")
    y = matvec(server, m, ct)
    return calls, np.abs(client.decrypt(y, rows) - w @ x).max(), server, ct


def test_three_blocks_are_summed_by_a_chain_of_rotations_by_the_stride(he_backend, he_pair, rng, monkeypatch):
    """Three blocks (W_qkv's per frame): y + rot(y, s) + rot(rot(y, s), s), two key switches
    by the stride as the halving fold of four takes, from one key instead of two; four blocks
    still halve (2 key switches, not 3)."""
    rows, cols, level = 576, 1536, 2
    plan = plan_matvec(rows, cols, SLOTS, "folded")
    assert plan.frame_blocks == 3 and plan.chains_blocks and plan.block_folds == [plan.stride] * 2
    assert 2 * plan.stride not in plan.rotation_steps and len(plan.block_folds) == plan.fold_blocks.bit_length() - 1
    four = plan_matvec(576, 576, SLOTS, "folded")
    assert four.frame_blocks == 4 and four.block_folds == [2 * four.stride, four.stride]
    calls, err, _, _ = _folded_product(he_pair(he_backend, P, plan.key_levels(level, chained=True)), rows, cols,
                                       level, rng, monkeypatch)
    assert calls[-2:] == [plan.stride, plan.stride] and len(calls) == plan.rotations and err < 1e-5


def test_baby_steps_chain_from_step_1_under_a_compact_key_set(he_backend, he_pair, pair, rng, monkeypatch):
    """With a key for step 1 but not for the other baby steps (the client's compact set), a
    product's baby steps chain from step 1: the same n1 - 1 key switches and the same result
    as the hoisted ones, from one key. A backend holding every baby step still hoists them."""
    rows, cols, level = 192, 576, 2
    plan = plan_matvec(rows, cols, SLOTS, "folded")
    full, compact = plan.key_levels(level), plan.key_levels(level, chained=True)
    assert set(compact) == set(full) - set(range(2, plan.n1)) and compact[1] == level
    full_client, full_server = pair  # holds every baby step of this plan: one rotate_many, no chain
    many = _count_calls(monkeypatch, full_server, "rotate_many")
    baby_steps(full_server, full_client.encrypt(np.ones(SLOTS), level=level), plan.n1)
    assert many == [list(range(1, plan.n1))]
    client, server = he_pair(he_backend, P, compact)
    w = rng.standard_normal((rows, cols)) / np.sqrt(cols)
    x = rng.standard_normal(cols)
    ct = client.encrypt(replicate_input(x, SLOTS), level=level)
    calls = _count_calls(monkeypatch, server, "rotate")
    babies = baby_steps(server, ct, plan.n1)
    assert calls == [1] * (plan.n1 - 1)
    xs = replicate_input(x, SLOTS)
    for b in (1, plan.n1 - 1):
        assert np.abs(client.decrypt(babies[b])[: SLOTS - b] - np.roll(xs, -b)[: SLOTS - b]).max() < 1e-5
    m = encode_matrix(server, w, level, layout="folded")
    assert np.abs(client.decrypt(matvec(server, m, ct), rows) - w @ x).max() < 1e-5
    with pytest.raises(HEError, match="no Galois key"):
        server.rotate_many(ct, [2])  # the backend itself composes nothing


def test_composed_rotation_is_the_shortest_sum_of_held_steps():
    assert composed_rotation(4 * 987, (1, 16, 987), SLOTS) == (987,) * 4
    assert sorted(composed_rotation(-2624, (-2048, -576, 3584, 192), SLOTS)) == [-2048, -576]
    assert composed_rotation(-2624 % SLOTS, (-2048, -576), SLOTS) == composed_rotation(-2624, (-2048, -576), SLOTS)
    with pytest.raises(HEError, match="no Galois key for rotation step 5"):
        composed_rotation(5, (2, 4), SLOTS)  # only even offsets reach
    with pytest.raises(HEError):
        composed_rotation(9, (1,), SLOTS, max_len=8)


def test_folds_composed_from_the_smallest_under_a_minimal_key_set(he_backend, he_pair, rng, monkeypatch):
    """Without the keys of the larger folds (the client's minimal set), a folded product folds
    by its stride alone: fold_blocks - 1 key switches by the stride instead of log2(fold_blocks),
    and the same result. Elsewhere a missing key stays an error."""
    rows, cols, level = 192, 576, 2
    plan = plan_matvec(rows, cols, SLOTS, "folded")
    assert plan.fold_blocks >= 4  # else there is nothing to compose
    minimal = plan.key_levels(level, chained=True, composed_folds=True)
    folds = [h * plan.stride for h in range(1, plan.fold_blocks) if h & (h - 1) == 0]
    assert [f for f in folds if f in minimal] == [plan.stride]
    calls, err, server, ct = _folded_product(he_pair(he_backend, P, minimal), rows, cols, level, rng, monkeypatch)
    assert calls.count(plan.stride) == plan.fold_blocks - 1 and not set(folds[1:]) & set(calls)
    assert err < 1e-5
    with pytest.raises(HEError, match="no Galois key"):
        server.rotate(ct, 2 * plan.stride)


def test_chained_products_through_replicate(pair, rng):
    """W_k's output (192 values, zero elsewhere) replicated into the next product's input."""
    client, server = pair
    h = rng.standard_normal(576)
    wk, w2 = rng.standard_normal((192, 576)) / 24, rng.standard_normal((576, 192)) / np.sqrt(192)
    k = matvec(server, encode_matrix(server, wk, 2, n1=N1), client.encrypt(replicate_input(h, SLOTS), level=2))
    kr = replicate(server, k, 192, 8)  # 8 copies cover rows + cols + n1 = 576 + 192 + 24
    np.testing.assert_allclose(client.decrypt(kr)[: 8 * 192], np.tile(wk @ h, 8), atol=1e-5)
    z = matvec(server, encode_matrix(server, w2, 1, n1=N1), kr)
    assert np.abs(client.decrypt(z, 576) - w2 @ (wk @ h)).max() < 1e-4


def test_matvec_rejects_mismatch(pair, rng):
    client, server = pair
    m = encode_matrix(server, rng.standard_normal((8, 8)), 2)
    with pytest.raises(HEError, match="level"):
        matvec(server, m, client.encrypt(replicate_input(np.ones(8), SLOTS), level=1))
    for bad, level in ((np.ones((8, 8)), 0), (np.ones((4000, 600)), 2), (np.zeros((4, 4)), 2), (np.ones(4), 2)):
        with pytest.raises(HEError):
            encode_matrix(server, bad, level)


def test_replicate_any_number_of_copies(pair, rng):
    client, server = pair
    assert replicate_rotation_steps(100, 11) == [-1000, -800, -400, -200, -100]
    v = rng.standard_normal(100)
    ct = client.encrypt(v)  # zero outside [0, 100)
    for copies in (1, 2, 3, 8, 11):
        got = client.decrypt(replicate(server, ct, 100, copies))
        np.testing.assert_allclose(got[: 100 * copies], np.tile(v, copies), atol=1e-5)
        assert np.abs(got[100 * copies :]).max() < 1e-5
    with pytest.raises(HEError):
        replicate(server, ct, 100, 41)


@pytest.mark.parametrize("lane,period", [(0, 1), (0, 4), (3, 4), (5, 8), (2, 8)])
def test_broadcast_lane_fills_each_period(pair, rng, lane, period):
    """``e`` nonzero only on lanes ≡ lane (mod period) inside periods of 64: every slot of a
    period ends up with that period's lane value, and nothing crosses into the next period."""
    client, server = pair
    x = np.zeros(SLOTS)
    x[lane:: period] = rng.standard_normal(len(range(lane, SLOTS, period)))
    got = client.decrypt(broadcast_lane(server, client.encrypt(x), lane, period))
    np.testing.assert_allclose(got, np.repeat(x[lane::period], period), atol=1e-5)


@pytest.mark.parametrize("lane,period,start", [(5, 8, 4), (3, 8, 8), (6, 8, 2), (1, 4, 2)])
def test_broadcast_lane_from_a_filled_window(pair, rng, lane, period, start):
    """``start``: each period already holds its lane's value on the aligned ``start`` lanes
    around the lane; the remaining doublings fill the period, nothing crosses into the next."""
    client, server = pair
    values = rng.standard_normal(SLOTS // period)
    x = np.zeros(SLOTS)
    first = lane - lane % start
    for i in range(first, first + start):
        x[i::period] = values
    got = client.decrypt(broadcast_lane(server, client.encrypt(x), lane, period, start=start))
    np.testing.assert_allclose(got, np.repeat(values, period), atol=1e-5)

"""Client math, slot layouts and slot circuits of the protected path, on the ``plain`` backend
(slot vectors with CKKS level and scale bookkeeping: fast, and rotations need their keys)."""

import numpy as np
import pytest
import torch

from veil.crypto.backend import make_backend
from veil.crypto.params import HE_STANDARD_MAX_LOG_Q_128, PROTECTED_PARAMS
from veil.protected.circuits import Circuit
from veil.protected.client import softmax_weights, swiglu_from_u
from veil.protected.constants import Constants
from veil.protected.key_levels import rotation_key_levels, score_lane_groups
from veil.protected.layouts import (
    SCORES_DIV,
    SIGMA_DIV,
    UPPER_BLOCK_SHIFT,
    WEIGHTS_WINDOW,
    LayoutDims,
    pack_weights,
    score_slot,
    unpack_scores,
    weights_period,
    weights_shift,
)
from veil.protected.protocol import LEVELS
from veil.protected.timing import TimedBackend

DIMS = LayoutDims(d=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, slots=8192)


@pytest.fixture(scope="module")
def slots():
    """(client, server): plain backends with exactly the protocol's Galois keys; the server is
    timed, so its ``counts["rotate"]`` counts rotations."""
    return _pair("full")


@pytest.fixture(scope="module")
def compact_slots():
    """``slots`` with the compact key set (the baby steps chained from step 1)."""
    return _pair("compact")


def _pair(key_set: str):
    client = make_backend(PROTECTED_PARAMS, "plain", allow_test_backends=True)
    client.generate_keys(rotation_key_levels(DIMS, key_set=key_set))
    server = make_backend(PROTECTED_PARAMS, "plain", allow_test_backends=True)
    server.import_public_material(client.export_public_material())
    return client, TimedBackend(server)


def test_protected_params_budget():
    p = PROTECTED_PARAMS
    assert p.log_q <= HE_STANDARD_MAX_LOG_Q_128[p.poly_modulus_degree]
    # the layer starts at the top level: no level above it goes unused (each one would grow
    # every Galois key), and the circuit's depth fits
    assert p.top_level == LEVELS.h
    # the refresh of h'' happens at level 2; the mask must fit there (and the bound must hold)
    assert p.min_mask_level() <= 2
    assert p.mask_lambda >= 54  # N * 2^-(lambda+1) <= 2^-41
    # SmolLM2's residual stream reaches |h| ~ 2^14.5: the mask's coefficient bound covers 2^16
    assert p.mask_value_bits >= 16


def test_softmax_weights_reproduce_llama_attention():
    rng = np.random.default_rng(0)
    heads, t, hd, eps = 9, 7, 64, 1e-5
    sig = rng.uniform(1, 1000, t)  # σ/d of each position
    r = np.sqrt(sig + eps)
    qh = rng.standard_normal((heads, hd)) * r[-1]  # unnormalized q̂_t
    kh = rng.standard_normal((heads, t, hd)) * r[None, :, None]
    vh = rng.standard_normal((heads, t, hd)) * r[None, :, None]
    s_hat = np.einsum("hd,hjd->hj", qh, kh) / np.sqrt(hd)
    w, r_t = softmax_weights(sig[-1], s_hat, list(r[:-1]), eps)
    assert np.isclose(r_t, r[-1])
    a_hat = np.einsum("hj,hjd->hd", w, vh)
    # reference: normalized q, k, v and standard attention
    q, k, v = qh / r[-1], kh / r[None, :, None], vh / r[None, :, None]
    ref = torch.softmax(torch.tensor(np.einsum("hd,hjd->hj", q, k) / np.sqrt(hd)), -1).numpy()
    assert np.allclose(a_hat, np.einsum("hj,hjd->hd", ref, v), atol=1e-12)


def test_swiglu_from_u():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(576) * 30
    wg, wu = rng.standard_normal((2, 1536, 576)) / 24
    r = np.sqrt((x**2).mean() + 1e-5)
    m = swiglu_from_u((x**2).mean(), wg @ x, wu @ x, 1e-5)
    ref = torch.nn.functional.silu(torch.tensor(wg @ (x / r))).numpy() * (wu @ (x / r))
    assert np.allclose(m, ref, atol=1e-10)


def _rot(v, s):
    return np.roll(v, -s)


@pytest.mark.parametrize("key_set", ["full", "compact"])
@pytest.mark.parametrize("positions", [1, 8, 9, 20, 33, 64, 100, 512])
def test_weights_layout_expands_like_the_server(request, key_set, positions):
    """pack_weights + ``Circuit.expand_weights`` give each chunk's dense weights (zero past the
    position in the last chunk) at the level the values are multiplied at: the upload rotated
    once by 1..2s for all chunks (one hoisted call with the full key set, a chain of steps by 1
    with the compact one), then log2(P/W) rotations per chunk."""
    client, server = request.getfixturevalue("slots" if key_set == "full" else "compact_slots")
    rng = np.random.default_rng(positions)
    w = rng.standard_normal((DIMS.heads, positions))
    packed = pack_weights(DIMS, w)
    chunks = DIMS.chunks(positions)
    period = weights_period(chunks)
    window = weights_shift(period) + 1
    circuit = Circuit(server, DIMS, LEVELS, Constants(None, DIMS))
    server.reset()
    got = circuit.expand_weights(client.encrypt(packed, level=LEVELS.w), positions - 1)
    high = chunks * ((period // window).bit_length() - 1)
    if key_set == "full":
        assert (server.counts["rotate_many"], server.counts["rotate"]) == (int(window > 1), high)
    else:
        assert (server.counts["rotate_many"], server.counts["rotate"]) == (0, 2 * (window - 1) + high)
    assert len(got) == chunks and all(server.level(e) == LEVELS.kv for e in got)
    for c, e in enumerate(got):
        want = np.zeros(DIMS.slots)
        for b in range(DIMS.per_chunk):
            j = c * DIMS.per_chunk + b
            if j < positions:
                for h in range(DIMS.heads):
                    base = DIMS.value_base(b) + 64 * DIMS.head_slot(h)
                    want[base : base + 64] = w[h, j]
        np.testing.assert_allclose(client.decrypt(e), want, atol=1e-12, err_msg=f"{positions} positions, chunk {c}")


def test_weights_upload_sits_its_shift_after_the_value_blocks():
    """The upload's lanes are the value layout's moved ``weights_shift(P)`` slots on (cyclically)."""
    rng = np.random.default_rng(7)
    for positions, want_shift in ((1, 0), (16, 1), (40, 7), (300, 7)):  # periods 1, 2, 8, 64
        w = rng.standard_normal((DIMS.heads, positions))
        period = weights_period(DIMS.chunks(positions))
        shift = weights_shift(period)
        assert shift == want_shift and WEIGHTS_WINDOW == 8
        packed = pack_weights(DIMS, w)
        h, j = 4, positions - 1
        b, c = j % DIMS.per_chunk, j // DIMS.per_chunk
        slot = (DIMS.value_base(b) + 64 * DIMS.head_slot(h) + c + shift) % DIMS.slots
        assert packed[slot] == w[h, j]
        assert np.count_nonzero(packed) == w.size * (64 // period)


def test_head_slots_repeat_the_kv_lanes():
    """Head slot g reads KV head g % kv_heads, so the keys of all 9 head slots are the 192 KV
    lanes repeated 3 times (what the server builds), and head_slot inverts head_order."""
    group, kvd = DIMS.group, DIMS.kv_dim
    assert sorted(DIMS.head_order.tolist()) == list(range(DIMS.heads))
    for g, h in enumerate(DIMS.head_order):
        assert DIMS.head_slot(int(h)) == g and h // group == g % DIMS.kv_heads
    rng = np.random.default_rng(4)
    k = rng.standard_normal((DIMS.kv_heads, 64))
    repeated = np.tile(k.ravel(), group)
    for h in range(DIMS.heads):
        g = DIMS.head_slot(h)
        assert np.array_equal(repeated[64 * g : 64 * g + 64], k[h // group])
    assert repeated.size == group * kvd == DIMS.qdim


def test_value_shift_sum_gives_periodic_weighted_values():
    """Value blocks at stride q summed over 16 right shifts by q: â exact with period q on
    [0, value_span), the input W_o's product reads."""
    rng = np.random.default_rng(5)
    q = DIMS.qdim
    x = np.zeros(DIMS.slots)
    blocks = rng.standard_normal((DIMS.per_chunk, q))
    for b in range(DIMS.per_chunk):
        x[DIMS.value_base(b) : DIMS.value_base(b) + q] = blocks[b]
    assert np.count_nonzero(x) == DIMS.per_chunk * q  # contiguous, no wrap
    st = 1
    while st < DIMS.value_shifts:
        x = x + _rot(x, -q * st)
        st *= 2
    span = DIMS.value_span
    assert span >= 5 * q
    np.testing.assert_allclose(x[:span], np.tile(blocks.sum(0), span // q), atol=1e-12)
    assert not np.allclose(x[span : span + q], blocks.sum(0))  # beyond the span: not exact


def test_scores_layout_matches_lane_placement():
    """Chunk c's masked scores rotated right c times land where unpack_scores reads them."""
    rng = np.random.default_rng(3)
    n = 30
    s = rng.standard_normal((DIMS.heads, n))
    chunks = DIMS.chunks(n)
    sel = []
    for c in range(chunks):
        v = np.zeros(DIMS.slots)
        for b in range(DIMS.per_chunk):
            j = c * DIMS.per_chunk + b
            if j < n:
                v[DIMS.block_base(b) + 64 * np.arange(DIMS.heads)] = s[DIMS.head_order, j]  # head slot g
        sel.append(v)
    acc = sel[-1]
    for c in range(chunks - 2, -1, -1):
        acc = _rot(acc, -1) + sel[c]
    assert acc[DIMS.sigma_slot] == 0.0  # slot d holds no score
    # the download: ŝ/(sqrt(hd)·SCORES_DIV) at the score slots, σ/(d·SIGMA_DIV) in every slot
    sig, got = unpack_scores(DIMS, acc / SCORES_DIV + 5.0, n)
    assert sig == 5.0 * SIGMA_DIV
    np.testing.assert_allclose(got, s, rtol=0, atol=1e-13)
    assert len({score_slot(DIMS, j, h) for j in range(DIMS.max_positions) for h in range(9)}) == 512 * 9


def test_scores_fold_without_two_lanes_meeting_up_to_32_chunks():
    """Folded (slot j plus slot j + S/2), the scores download keeps every score and σ apart while
    its lanes stay under ``UPPER_BLOCK_SHIFT`` (32 chunks, 256 positions), and unpacks like the
    whole one when σ rides at half its value; at 33 chunks two lanes meet."""
    half = DIMS.slots // 2

    def apart(positions: int) -> bool:
        idx = [score_slot(DIMS, j, h) % half for j in range(positions) for h in range(DIMS.heads)]
        return len(set(idx) | {DIMS.sigma_slot}) == len(idx) + 1

    assert apart(UPPER_BLOCK_SHIFT * DIMS.per_chunk) and not apart(UPPER_BLOCK_SHIFT * DIMS.per_chunk + 1)
    n = UPPER_BLOCK_SHIFT * DIMS.per_chunk
    s = np.random.default_rng(4).standard_normal((DIMS.heads, n))
    whole = np.full(DIMS.slots, 2.5)  # σ/(d·SIGMA_DIV) = 5 at half its value
    whole[score_slot(DIMS, np.arange(n)[None, :], np.arange(DIMS.heads)[:, None])] += s / SCORES_DIV
    sig, got = unpack_scores(DIMS, whole[:half] + whole[half:], n)
    assert sig == 5.0 * SIGMA_DIV
    np.testing.assert_allclose(got, s, rtol=0, atol=1e-13)


def test_norm_statistic_is_sigma_over_8d_in_every_slot(slots):
    """h clean and replicated at 2 -> Σh² / (d · SIGMA_DIV) in every slot at 0 (what the client
    reads at slot d of the scores download and slot 2F of the MLP download), by 13 rotations
    and no 0/1 mask."""
    client, server = slots
    rng = np.random.default_rng(5)
    h = rng.standard_normal(DIMS.d) * 30
    x = np.zeros(DIMS.slots)
    x[: DIMS.copies * DIMS.d] = np.tile(h, DIMS.copies)
    circuit = Circuit(server, DIMS, LEVELS, Constants(None, DIMS))
    server.reset()
    out = circuit.norm_statistic(client.encrypt(x, level=LEVELS.h_prime))
    assert server.level(out) == LEVELS.scores_download == LEVELS.mlp_download == 0
    np.testing.assert_allclose(client.decrypt(out), (h**2).sum() / (DIMS.d * SIGMA_DIV), rtol=1e-12)
    assert server.counts["rotate"] == 13


@pytest.mark.parametrize("positions", [1, 8, 9, 20, 33, 64, 65, 72, 127, 200, 512])
def test_lane_sums_place_every_chunk_at_its_lane(slots, positions):
    """Random chunk products -> each head's 64-lane sum / (sqrt(hd) * SCORES_DIV) of position j
    at score_slot(j, h), zero in every other slot (also past position t in the last chunk), at
    the scores download's level, with the rotations ``score_lane_groups`` plans."""
    client, server = slots
    rng = np.random.default_rng(positions)
    chunks = DIMS.chunks(positions)
    t = positions - 1
    valid = [min(DIMS.per_chunk, t + 1 - c * DIMS.per_chunk) for c in range(chunks)]
    prods = [rng.standard_normal(DIMS.slots) for _ in range(chunks)]
    circuit = Circuit(server, DIMS, LEVELS, Constants(None, DIMS))
    server.reset()
    out = circuit.lane_sums([client.encrypt(p, level=3) for p in prods], valid)
    assert server.level(out) == LEVELS.scores_download == 0
    want = np.zeros(DIMS.slots)
    for j in range(positions):
        c, b = divmod(j, DIMS.per_chunk)
        for h in range(DIMS.heads):
            g = DIMS.head_slot(h)
            lanes = prods[c][DIMS.block_base(b) + 64 * g : DIMS.block_base(b) + 64 * g + 64]
            want[score_slot(DIMS, j, h)] = lanes.sum() / (8.0 * SCORES_DIV)
    np.testing.assert_allclose(client.decrypt(out), want, atol=1e-9)
    groups = score_lane_groups(chunks, 6)
    assert server.counts["rotate"] == sum(n * j + (n - 1) + (6 - j) for n, j in groups) + len(groups) - 1


def test_ffn_permutation_comes_from_the_os_csprng(monkeypatch):
    """The permutation is secret material: drawn through ``secrets``, never numpy's or torch's
    generators (made to fail here), and every order of 3 items turns up."""
    import random

    from veil.protected.weights import ffn_permutation

    def refuse(*a, **k):
        raise AssertionError("a non-cryptographic generator was used")

    for mod, names in ((np.random, ("permutation", "shuffle", "randint", "rand", "choice", "default_rng")),
                       (torch, ("randperm", "randint", "rand")), (random, ("shuffle", "randint", "random"))):
        for name in names:
            monkeypatch.setattr(mod, name, refuse)
    perm = ffn_permutation(1536)
    assert sorted(perm.tolist()) == list(range(1536)) and perm.tolist() != list(range(1536))
    assert len({tuple(ffn_permutation(3).tolist()) for _ in range(200)}) == 6


def test_timed_backend_waits_for_a_cuda_device_only_when_asked(monkeypatch):
    """``synchronize`` (set on the executor's TimedBackend) reaches the session backends that
    share its counters, and waits only for CUDA backends. The backend here is a stand-in that
    claims a CUDA device (this unit test checks the timer, not HE); the device wait is recorded."""
    import torch

    from veil.protected.timing import TimedBackend

    class ClaimsCuda:
        device = torch.device("cuda")

        def add(self, a, b):
            return a + b

    waits = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waits.append(device))
    root = TimedBackend(ClaimsCuda())
    session = root.sharing(ClaimsCuda())
    assert session.add(1, 2) == 3 and waits == []
    root.synchronize = True
    assert session.add(1, 2) == 3 and len(waits) == 2
    with session.section("matvec"):
        session.add(1, 2)  # inside a section only its ends wait
    assert len(waits) == 4 and root.counts["add"] == 2 and root.counts["matvec"] == 1
    session.synchronize = False  # one switch for all: set through any sharer
    assert not root.synchronize and session.add(1, 2) == 3 and len(waits) == 4


def test_a_section_counts_its_work_once_whichever_sharer_runs_it():
    """Ops inside a section are the section's, also where they run through another backend
    sharing its counters (a span's positions batched: ``Circuit.matvecs``), and only on the
    section's thread. The backend is a stand-in (this unit test checks the timer, not HE)."""
    import threading

    from veil.protected.timing import TimedBackend

    class Adds:
        def add(self, a, b):
            return a + b

    root = TimedBackend(Adds())
    batch = root.sharing(Adds())
    elsewhere = []
    with root.section("matvec"):
        batch.add(1, 2)
        root.sharing(Adds()).add(1, 2)
        t = threading.Thread(target=lambda: elsewhere.append(batch.add(3, 4)))
        t.start(), t.join()
    assert root.counts["matvec"] == 1 and root.counts["add"] == 1 and elsewhere == [7]
    batch.add(1, 2)
    assert root.counts["add"] == 2 and set(root.times) == {"matvec", "other"}

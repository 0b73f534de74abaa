"""Native backend arithmetic: exact modular products, NTT, automorphisms, RNS operations.

References are Python integers (object arrays or a big-integer Kronecker product), so every
check is exact. Primes: the chains of the three parameter sets (57/36-, 60/50- and 60/40-bit).
"""

import dataclasses
import math

import numpy as np
import pytest
import torch

from veil.crypto.native import rns
from veil.crypto.native.context import RnsContext
from veil.crypto.native.modarith import Basis
from veil.crypto.native.ntt import NttTables, automorphism_index, coeff_automorphism
from veil.crypto.params import PROTECTED_PARAMS, TEST_PARAMS_ID, get_params
from veil.crypto.rounding import crt

TEST_P = get_params(TEST_PARAMS_ID, allow_test_params=True)
PRIMES = sorted(set(PROTECTED_PARAMS.primes) | set(TEST_P.primes)
                | set(get_params("ckks-n16384-l6-v1").primes))
NARROW = [q for q in PRIMES if q.bit_length() <= 50]


def _edges(q: int) -> list[int]:
    """Values where a quotient estimate or the 2^30 split is most likely to slip."""
    s, r = 1 << 30, math.isqrt(q)
    vals = [0, 1, 2, q - 1, q - 2, (q - 1) // 2, (q + 1) // 2, s - 1, s, s + 1, q - s, q - s - 1,
            (q // s) * s, (q // s) * s - 1, r, r + 1, q // 3, 2 * q // 3]
    return [v % q for v in vals]


def _operands(q: int, rng, count: int) -> tuple[np.ndarray, np.ndarray]:
    edges = np.array(_edges(q), dtype=np.int64)
    a = np.concatenate([np.repeat(edges, len(edges)), rng.integers(0, q, count, dtype=np.int64)])
    b = np.concatenate([np.tile(edges, len(edges)), rng.integers(0, q, count, dtype=np.int64)])
    return a, b


def _ref(a, b, q):
    return (a.astype(object) * b.astype(object)) % q


def test_int64_products_wrap_modulo_2_64():
    rng = np.random.default_rng(0)
    x = rng.integers(-(2**62), 2**62, 10_000, dtype=np.int64)
    y = rng.integers(-(2**62), 2**62, 10_000, dtype=np.int64)
    got = (torch.from_numpy(x) * torch.from_numpy(y)).numpy()
    assert np.array_equal(got.view(np.uint64), (x.view(np.uint64) * y.view(np.uint64)))
    assert (torch.tensor([1 << 62]) << 2).item() == 0


@pytest.mark.parametrize("q", PRIMES)
def test_mulmod_exact_on_edges_and_random(q):
    rng = np.random.default_rng(q % 2**32)
    a, b = _operands(q, rng, 40_000)
    basis = Basis.of([q])
    got = basis.mul(torch.from_numpy(a)[None], torch.from_numpy(b)[None])[0].numpy()
    assert np.array_equal(got.astype(object), _ref(a, b, q))
    # lazy products take signed operands in (-q, q) and land in (-q, q)
    lazy = basis.mul_lazy(torch.from_numpy(-a)[None], torch.from_numpy(b)[None])[0].numpy()
    assert np.all(np.abs(lazy) < q)
    assert np.array_equal(lazy.astype(object) % q, _ref(-a, b, q))
    # a fixed operand with precomputed quotient factors
    const = basis.const(torch.from_numpy(b)[None])
    assert np.array_equal(const.mul(torch.from_numpy(a)[None])[0].numpy().astype(object), _ref(a, b, q))


def test_narrow_and_wide_paths_agree_on_narrow_primes():
    rng = np.random.default_rng(1)
    for q in NARROW:
        a, b = _operands(q, rng, 20_000)
        narrow = Basis.of([q])
        part = narrow.parts[0][2]
        wide = Basis(narrow.primes, narrow.q, narrow.qinv, ((0, 1, dataclasses.replace(part, wide=True)),))
        ta, tb = torch.from_numpy(a)[None], torch.from_numpy(b)[None]
        assert not narrow.wide and wide.wide and torch.equal(narrow.mul(ta, tb), wide.mul(ta, tb))


def test_reduce_any_int64():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.integers(-(2**63), 2**63 - 1, 50_000, dtype=np.int64),
                        np.array([-(2**63), 2**63 - 1, -1, 0, 1], dtype=np.int64)])
    basis = Basis.of(PRIMES)
    got = basis.reduce(torch.from_numpy(x)[None].expand(len(PRIMES), -1)).numpy()
    for i, q in enumerate(PRIMES):
        assert np.array_equal(got[i].astype(object), x.astype(object) % q)


def _negacyclic_schoolbook(a: list[int], b: list[int], q: int) -> list[int]:
    n = len(a)
    out = [0] * n
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                k = i + j
                if k < n:
                    out[k] += x * y
                else:
                    out[k - n] -= x * y
    return [v % q for v in out]


def _negacyclic_kronecker(a: np.ndarray, b: np.ndarray, q: int) -> np.ndarray:
    """Exact negacyclic product of residue vectors via one big-integer multiplication."""
    n = a.size
    width = (2 * q.bit_length() + n.bit_length() + 8) // 8 + 1  # bytes per packed coefficient

    def pack(v):
        buf = np.zeros((n, width), dtype=np.uint8)
        buf[:, :8] = v.astype("<u8").view(np.uint8).reshape(n, 8)
        return int.from_bytes(buf.tobytes(), "little")

    prod = (pack(a) * pack(b)).to_bytes(2 * n * width, "little")
    c = [int.from_bytes(prod[i * width : (i + 1) * width], "little") for i in range(2 * n)]
    return np.array([(c[k] - c[k + n]) % q for k in range(n)], dtype=object)


@pytest.mark.parametrize("params", [PROTECTED_PARAMS, TEST_P], ids=lambda p: p.id)
def test_ntt_product_matches_schoolbook_small_n(params):
    primes, n = params.primes, 64
    ntt, basis = NttTables(Basis.of(primes), n), Basis.of(primes)
    rng = np.random.default_rng(3)
    a = np.stack([rng.integers(0, q, n, dtype=np.int64) for q in primes])
    b = np.stack([rng.integers(0, q, n, dtype=np.int64) for q in primes])
    a[:, 5:9], b[:, :3] = 0, np.array(primes)[:, None] - 1  # zeros and q-1
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    assert torch.equal(ntt.inverse(ntt.forward(ta)), ta)
    got = ntt.inverse(basis.mul(ntt.forward(ta), ntt.forward(tb))).numpy()
    for i, q in enumerate(primes):
        assert got[i].tolist() == _negacyclic_schoolbook(a[i].tolist(), b[i].tolist(), q)


def test_ntt_slots_are_bit_reversed_odd_power_evaluations():
    q, n = TEST_P.primes[1], 16
    ntt = NttTables(Basis.of([q]), n)
    from veil.crypto.native.ntt import bit_reverse, min_root_2n

    psi, rev = min_root_2n(q, n), bit_reverse(n)
    a = list(range(3, 3 + n))
    got = ntt.forward(torch.tensor([a]))[0].tolist()
    want = [sum(c * pow(psi, (2 * rev[j] + 1) * k, q) for k, c in enumerate(a)) % q for j in range(n)]
    assert got == want


@pytest.mark.parametrize("params", [PROTECTED_PARAMS, TEST_P], ids=lambda p: p.id)
def test_ntt_product_at_full_size_matches_big_integer_product(params):
    """Dense random operands at the set's N, on the special prime, q_0 (a run of two wide limbs:
    the lazy butterflies' periodic reductions) and one narrow prime."""
    sel = [params.primes[-1], params.primes[0], params.primes[1]]
    basis, n = Basis.of(sel), params.poly_modulus_degree
    ntt = NttTables(basis, n)
    rng = np.random.default_rng(4)
    a = np.stack([rng.integers(0, q, n, dtype=np.int64) for q in sel])
    b = np.stack([rng.integers(0, q, n, dtype=np.int64) for q in sel])
    ta = torch.from_numpy(a)
    assert torch.equal(ntt.inverse(ntt.forward(ta)), ta)
    got = ntt.inverse(basis.mul(ntt.forward(ta), ntt.forward(torch.from_numpy(b))))
    for i, q in enumerate(sel):
        assert np.array_equal(got[i].numpy().astype(object), _negacyclic_kronecker(a[i], b[i], q))


def test_automorphism_in_ntt_form_is_a_gather():
    primes, n = TEST_P.primes, 256
    basis = Basis.of(primes)
    ntt = NttTables(basis, n)
    rng = np.random.default_rng(5)
    a = torch.from_numpy(np.stack([rng.integers(0, q, n, dtype=np.int64) for q in primes]))
    for g in (3, 5, 2 * n - 1, pow(3, 17, 2 * n)):
        want = ntt.forward(coeff_automorphism(a, g, basis))
        assert torch.equal(ntt.forward(a).index_select(-1, automorphism_index(g, n)), want)


# ---- RNS operations (exact, against Python integers) ---------------------------------------------
@pytest.fixture(scope="module")
def ctx():
    return RnsContext(TEST_P)


def _random_level(ctx, level, rng):
    primes = ctx.data_primes[: level + 1]
    res = np.stack([rng.integers(0, q, ctx.n, dtype=np.int64) for q in primes])
    return torch.from_numpy(res), primes


def _crt(res: np.ndarray, primes) -> np.ndarray:
    return crt(res, primes, centered=True)


def test_balanced_digits_compose_the_centred_integer(ctx):
    rng = np.random.default_rng(6)
    level = ctx.top
    res, primes = _random_level(ctx, level, rng)
    y = rns.balanced_digits(res, ctx.data(level)[0])
    assert all(int(y[k].abs().max()) <= (q - 1) // 2 for k, q in enumerate(primes))
    want = _crt(res.numpy(), primes)
    assert np.array_equal(rns.digits_to_ints(y, primes), want)
    approx = rns.digits_to_float(y, primes).numpy()
    assert np.allclose(approx, want.astype(np.float64), rtol=2.0**-48, atol=0)
    # the same integers in NTT form, back to these residues
    _, ntt = ctx.data(level)
    radices = tuple(math.prod(primes[:k]) for k in range(len(primes)))
    assert torch.equal(ntt.inverse(rns.digits_to_ntt(y, ctx, level, radices)), res)


def test_rescale_is_rounded_division(ctx):
    rng = np.random.default_rng(7)
    level = ctx.top
    res, primes = _random_level(ctx, level, rng)
    _, ntt = ctx.data(level)
    _, low_ntt = ctx.data(level - 1)
    out = low_ntt.inverse(rns.rescale(ntt.forward(res), ctx, level)).numpy()
    x = _crt(res.numpy(), primes)
    ql = primes[-1]
    want = np.array([(v + ql // 2) // ql for v in x], dtype=object)  # q_l odd: no ties
    assert np.array_equal(_crt(out, primes[:-1]), want)


def test_mod_down_is_rounded_division_by_p(ctx):
    rng = np.random.default_rng(8)
    level = 1
    ext_primes = (ctx.special_prime,) + ctx.data_primes[: level + 1]
    res = torch.from_numpy(np.stack([rng.integers(0, q, ctx.n, dtype=np.int64) for q in ext_primes]))
    _, ext_ntt = ctx.ext(level)
    _, ntt = ctx.data(level)
    out = ntt.inverse(rns.mod_down(ext_ntt.forward(res), ctx, level)).numpy()
    x, p = _crt(res.numpy(), ext_primes), ctx.special_prime
    want = np.array([(v + p // 2) // p for v in x], dtype=object)
    assert np.array_equal(_crt(out, ext_primes[1:]), want)


def test_digits_to_ntt_is_the_ntt_of_the_digits_integers(ctx):
    """``rns.digits_to_ntt`` (each digit lifted into NTT form, then one multiply-accumulate with
    the radices' residues) is the NTT of ``sum_k y_k * radix_k`` reduced exactly (Python integers)
    into the target basis: a refresh's balanced digits re-encoded at the top level and at a lower
    one, and a refresh mask's base-2^40 digits with its -2^bits term; with leading rows."""
    rng = np.random.default_rng(21)
    cases = []
    for from_level in (1, ctx.top, 2):
        res, primes = _random_level(ctx, from_level, rng)
        cases.append((rns.balanced_digits(res, ctx.data(from_level)[0]), tuple(rns.radices(primes))))
    mask = np.concatenate([rng.integers(0, 1 << 40, (2, ctx.n)), -np.ones((1, ctx.n), np.int64)])
    cases.append((torch.from_numpy(mask), (1, 1 << 40, 1 << 70)))
    for (y, radices), level in zip(cases, (ctx.top, ctx.top, 1, 1), strict=True):
        basis, ntt = ctx.data(level)
        ints = sum(y[k].numpy().astype(object) * r for k, r in enumerate(radices))
        want = torch.from_numpy(np.stack([(ints % q).astype(np.int64) for q in basis.primes]))
        assert torch.equal(ntt.inverse(rns.digits_to_ntt(y, ctx, level, radices)), want)
        rows = torch.stack([y, -y])  # [2, K, N]
        neg = torch.from_numpy(np.stack([((-ints) % q).astype(np.int64) for q in basis.primes]))
        assert torch.equal(ntt.inverse(rns.digits_to_ntt(rows, ctx, level, radices)), torch.stack([want, neg]))

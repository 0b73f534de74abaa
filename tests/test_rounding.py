"""``veil.crypto.rounding`` on its own: exact CRT rounding, the error bound, the form's checks."""

import math

import numpy as np
import pytest

from veil.crypto import rounding
from veil.crypto.params import PROTECTED_PARAMS, TEST_PARAMS
from veil.kernels import rounding_cpu

PRIMES = PROTECTED_PARAMS.primes[:3]
N = 64


def _residues(values, primes=PRIMES):
    return np.stack([np.array([v % q for v in values], dtype=np.uint64) for q in primes])


def test_round_trip_error_is_half_a_step():
    q = math.prod(PRIMES)
    rng = np.random.default_rng(0)
    values = [int(rng.integers(0, 2**62)) * int(rng.integers(0, 2**62)) * 2**30 % q for _ in range(2 * N)]
    values[:4] = [0, 1, q - 1, q // 2]  # the ends of [0, Q) wrap onto each other
    coeffs = np.stack([_residues(values[:N]), _residues(values[N:])])
    for bits in (20, 64, 100, q.bit_length()):
        blob = rounding.round_to_bytes(coeffs, PRIMES, 2, 2.0**36, bits)
        level, polys, got_bits, scale, body = rounding.parse(blob, N, lambda lv: PRIMES if lv == 2 else None)
        assert (level, polys, got_bits, scale) == (2, 2, bits, 2.0**36)
        back = rounding.unround(body, polys, N, PRIMES, bits)
        got = [sum(int(back[p, i, j]) * (q // qi) * pow(q // qi, -1, qi) for i, qi in enumerate(PRIMES)) % q
               for p in range(2) for j in range(N)]
        step = q / 2**bits
        for v, g in zip(values, got, strict=True):
            d = min((g - v) % q, (v - g) % q)  # distance on the circle Z_Q
            assert d <= step / 2 + 1


def test_bits_follow_the_noise_floor():
    q_bits = math.prod(PRIMES).bit_length()
    assert rounding.bits_for(PRIMES, 18.0) == q_bits - 18 + rounding.MARGIN_BITS
    assert rounding.bits_for(PRIMES, -5.0) == q_bits  # never more than the modulus has
    assert rounding.bits_for(PRIMES, 1e4) == 1


def test_form_is_validated():
    coeffs = np.zeros((2, 3, N), dtype=np.uint64)
    blob = rounding.round_to_bytes(coeffs, PRIMES, 2, 2.0**36, 40)
    at = lambda lv: PRIMES if lv == 2 else None  # noqa: E731
    for bad in (b"", b"VRC0" + blob[4:], blob[:-1], blob + b"\0",
                blob[:4] + bytes([3]) + blob[5:],        # unknown level
                blob[:5] + bytes([3]) + blob[6:],        # three polynomials
                blob[:6] + bytes([0]) + blob[7:],        # zero bits
                blob[:6] + bytes([200]) + blob[7:]):     # more bits than the modulus
        with pytest.raises(rounding.RoundedError):
            rounding.parse(bad, N, at)
    with pytest.raises(rounding.RoundedError, match="scale"):
        rounding.parse(blob[:8] + np.float64(np.nan).tobytes() + blob[16:], N, at)


def _definition(values, bits, primes=PRIMES):
    q = math.prod(primes)
    return [((v << bits) + q // 2) // q % (1 << bits) for v in values]


def _limbs_to_ints(limbs):
    return [sum(int(x) << (32 * k) for k, x in enumerate(row)) for row in limbs]


WIDE_PRIMES = TEST_PARAMS.primes[:3]  # 60-bit q_0: unround reduces its lazy sums in steps


@pytest.mark.parametrize("primes,bits", [(PRIMES, b) for b in (1, 31, 32, 33, 64, 100, 147, 148)]
                         + [(WIDE_PRIMES, b) for b in (33, 100, 140)])
def test_fixed_width_rounding_equals_the_definition(primes, bits):
    """``_round`` (limbs, modarith products, a double for the carry of the fractions) against
    ``round(c * 2^bits / Q)`` in Python ints, and ``unround`` against ``round(r * Q / 2^bits)``."""
    q = math.prod(primes)
    rng = np.random.default_rng(bits)
    values = [int.from_bytes(rng.bytes(20), "little") % q for _ in range(N)]
    values[:5] = [0, 1, q - 1, q // 2, q // 2 + 1]
    got = _limbs_to_ints(rounding._round(_residues(values, primes), primes, bits))
    assert got == _definition(values, bits, primes)
    body = rounding._pack_bits(rounding._round(_residues(values, primes), primes, bits), bits)
    want = _residues([((r * q + (1 << (bits - 1))) >> bits) for r in got], primes)
    assert np.array_equal(rounding._unround(body, 1, N, primes, bits)[0], want)  # the numpy twin
    assert np.array_equal(rounding.unround(body, 1, N, primes, bits)[0], want)  # the C kernel where built


def test_roundings_near_a_half_take_the_exact_path(monkeypatch):
    """Values whose ``c * 2^bits / Q`` lies within 2^-100 of a half-integer, where a double
    cannot decide: they go through Python ints and still equal the definition."""
    q, bits = math.prod(PRIMES), 20
    values = [((2 * k + 1) * q >> (bits + 1)) % q for k in range(N)]  # (k + 1/2) Q / 2^bits, rounded down
    values += [(v + 1) % q for v in values]  # and just above
    calls = []
    exact = rounding._round_exact
    monkeypatch.setattr(rounding, "_round_exact", lambda r, p, b: calls.append(r.shape[1]) or exact(r, p, b))
    got = _limbs_to_ints(rounding._round(_residues(values), PRIMES, bits))
    assert got == _definition(values, bits)
    assert calls and sum(calls) >= N
    # the C kernel hands such a ciphertext back to the twin, and the bytes still follow the definition
    coeffs = _residues(values)[None]
    if rounding_cpu.available():
        assert rounding_cpu.round_pack(coeffs, PRIMES, bits) is None
    blob = rounding.round_to_bytes(coeffs, PRIMES, 2, 2.0**36, bits)
    assert blob[rounding._HEAD.size:] == rounding._pack_bits(np.array([[v] for v in _definition(values, bits)],
                                                                      dtype=np.uint64), bits)


@pytest.mark.skipif(not rounding_cpu.available(), reason="the C kernels are not built here")
@pytest.mark.parametrize("primes,polys,n", [(PROTECTED_PARAMS.primes[:1], 2, 4096), (PRIMES, 2, 61),
                                            (PRIMES, 1, 4096), (WIDE_PRIMES, 2, 100),
                                            (PROTECTED_PARAMS.primes[:8], 2, 64)])
def test_c_kernels_equal_their_numpy_twins(primes, polys, n):
    """``rounding_cpu.round_pack`` gives the twin's bytes and ``rounding_cpu.unround`` its
    residues, at bit widths on and off the 32-bit limbs and the bytes, and coefficient counts
    that do not fill the kernel's last run of 8."""
    primes = tuple(primes)
    q_bits = math.prod(primes).bit_length()
    rng = np.random.default_rng(n + len(primes))
    coeffs = np.stack([np.stack([rng.integers(0, q, n, dtype=np.uint64) for q in primes]) for _ in range(polys)])
    for bits in sorted({1, 7, 31, 32, 33, 46, q_bits - 13, q_bits}):
        twin = rounding._pack_bits(rounding._round(coeffs.transpose(1, 0, 2).reshape(len(primes), -1), primes, bits),
                                   bits)
        assert rounding_cpu.round_pack(coeffs, primes, bits) == twin
        assert np.array_equal(rounding_cpu.unround(twin, polys, n, primes, bits),
                              rounding._unround(twin, polys, n, primes, bits))

"""``veil.crypto.rounding`` on its own: exact CRT rounding, the error bound, the form's checks."""

import math

import numpy as np
import pytest

from veil.crypto import rounding
from veil.crypto.params import PROTECTED_PARAMS

PRIMES = PROTECTED_PARAMS.primes[:3]
N = 64


def _residues(values):
    return np.stack([np.array([v % q for v in values], dtype=np.uint64) for q in PRIMES])


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

"""``veil.crypto.wide``: limb arithmetic and Shoup products against Python ints, at the edges."""

import numpy as np
import pytest

from veil.crypto import wide
from veil.crypto.params import PROTECTED_PARAMS

EDGES = [0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1]


def _lanes(rng, count=256):
    return np.concatenate([np.array(EDGES, dtype=np.uint64),
                           rng.integers(0, 2**64, size=count, dtype=np.uint64)])


def test_mulhi_equals_python_ints():
    rng = np.random.default_rng(1)
    a = _lanes(rng)
    for c in EDGES + [int(x) for x in rng.integers(0, 2**64, size=8, dtype=np.uint64)]:
        assert [int(x) for x in wide.mulhi(a, c)] == [(int(x) * c) >> 64 for x in a]


@pytest.mark.parametrize("q", sorted(set(PROTECTED_PARAMS.primes)) + [3, 2**61 - 1, 2**63 - 25])
def test_shoup_products_equal_python_ints(q):
    rng = np.random.default_rng(q % 2**32)
    a = _lanes(rng)
    for w in (0, 1, q - 1, q // 3, 2**70 + 5):
        got = wide.ShoupConst(w, q).mul(a)
        assert [int(x) for x in got] == [int(x) * w % q for x in a]


def test_shoup_refuses_a_modulus_out_of_range():
    for q in (1, 2**63, 2**64 + 1):
        with pytest.raises(ValueError):
            wide.ShoupConst(5, q)


@pytest.mark.parametrize("bits", [1, 32, 33, 95, 160])
def test_products_mod_a_power_of_two_carry_right(bits):
    rng = np.random.default_rng(bits)
    width = -(-bits // 32)
    xs = [0, 2**bits - 1] + [int.from_bytes(rng.bytes(24), "little") % 2**bits for _ in range(64)]
    a = np.array([wide.to_limbs(x, width) for x in xs], dtype=np.uint64)
    for c in (0, 1, 2**bits - 1, int.from_bytes(rng.bytes(24), "little")):
        cols = wide.carry(wide.mul_mod_2k(a, c, bits), bits)
        got = [sum(int(v) << (32 * k) for k, v in enumerate(row)) for row in cols]
        assert got == [x * c % 2**bits for x in xs]

"""``veil.crypto.wide``: limb arithmetic modulo 2^bits against Python ints, at the edges."""

import numpy as np
import pytest

from veil.crypto import wide


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

"""The production set ckks-n16384-l6-v1 end to end, kept small (few Galois keys): SEAL accepts
it at 128-bit security, a product uses every level, and the refresh mask fits where
``min_mask_level`` says (118-bit mask at level 2)."""

import numpy as np
import pytest

from veil.crypto.linear import encode_matrix, matvec, plan_matvec, replicate, replicate_input
from veil.crypto.params import DEFAULT_PARAMS, get_params
from veil.crypto.seal.backend import SealBackend

P = get_params()
SLOTS = P.slot_count


@pytest.fixture(scope="module")
def pair():
    client = SealBackend(P)
    client.generate_keys(plan_matvec(16, 16, SLOTS, n1=4).rotation_steps + [-16, -32])
    server = SealBackend(P)
    server.import_public_material(client.export_public_material())
    return client, server


def test_context_levels(pair):
    _, server = pair
    assert P is DEFAULT_PARAMS
    assert sorted(server._c.levels) == list(range(7))
    for level, lvl in server._c.levels.items():
        assert len(lvl.primes) == level + 1
        assert lvl.q_product.bit_length() <= P.level_log_q(level)
        assert lvl.q_product.bit_length() >= P.level_log_q(level) - level - 1


def test_depth_six_chain(pair):
    """Six chained 16x16 products from the top level to level 0, all on the server: each
    zero-padded output is re-replicated with rotations and fed to the next product."""
    client, server = pair
    rng = np.random.default_rng(5)
    x = rng.standard_normal(16)
    ct = client.encrypt(replicate_input(x, SLOTS))
    ref = x
    for level in range(P.top_level, 0, -1):
        w = rng.standard_normal((16, 16)) / 4
        y = matvec(server, encode_matrix(server, w, level, n1=4), ct)
        ref = w @ ref
        assert server.level(y) == level - 1
        full = client.decrypt(y)
        assert np.abs(full[:16] - ref).max() < 1e-6 * max(1.0, np.abs(ref).max())
        assert np.abs(full[16:]).max() < 1e-6  # zero-padded output
        ct = replicate(server, y, 16, 4)


def test_refresh_with_production_mask(pair):
    client, server = pair
    rng = np.random.default_rng(6)
    x = rng.uniform(-2000, 2000, SLOTS)  # within 2^mask_value_bits
    level = P.min_mask_level()
    assert level == 2
    ct = client.encrypt(x, level=level)
    before = client.decrypt_poly(ct)
    masked, mask = server.mask_for_refresh(ct, rerandomize=False)
    assert mask.bits == 118
    assert np.array_equal(client.decrypt_poly(masked) - mask.coeffs, before)
    masked, mask = server.mask_for_refresh(ct)
    fresh = server.deserialize(client.refresh_reencrypt_to_bytes(masked), level=P.top_level)
    out = server.unmask_refresh(fresh, mask)
    np.testing.assert_allclose(client.decrypt(out), x, atol=1e-7)
    # flooding at the production sigma keeps the precision the client needs
    flooded = client.decrypt(server.rerandomize(out))
    assert np.abs(flooded - x).max() < 2e-3

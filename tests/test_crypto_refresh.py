"""Masked refresh (exact, uniform integer mask) and re-randomization + noise flooding.

Test-only N=8192 set; no Galois keys needed.
"""

import math

import numpy as np
import pytest

from veil.crypto.backend import HEError, RefreshMask
from veil.crypto.params import TEST_PARAMS_ID, get_params
from veil.crypto.sampling import gaussian_int_poly, uniform_int_poly
from veil.crypto.seal.backend import SealBackend

P = get_params(TEST_PARAMS_ID, allow_test_params=True)
N = P.poly_modulus_degree
SLOTS = P.slot_count


@pytest.fixture(scope="module")
def pair():
    client = SealBackend(P)
    client.generate_keys([])
    server = SealBackend(P)
    server.import_public_material(client.export_public_material())
    return client, server


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(7)


def _at_mask_level(client, server, x):
    """A ciphertext after some computation, at the lowest level that can carry the mask."""
    level = P.min_mask_level()
    ct = client.encrypt(x, level=level + 1)
    half = server.encode(np.full(SLOTS, 0.5), level + 1, server.prime(level + 1))
    return server.multiply_plain(ct, half)  # one rescale -> mask level


def test_mask_add_is_exact_on_the_plaintext_polynomial(pair, rng):
    client, server = pair
    x = rng.uniform(-100, 100, SLOTS)
    ct = _at_mask_level(client, server, x)
    plain = client.decrypt_poly(ct)
    masked, mask = server.mask_for_refresh(ct, rerandomize=False)
    assert isinstance(mask, RefreshMask) and mask.bits == P.mask_bits(server.scale(ct))
    got = client.decrypt_poly(masked)
    # exact integer identity: Dec(ct + rho) = Dec(ct) + rho, coefficient by coefficient
    assert np.array_equal(got - mask.coeffs, plain)
    # and the client sees only x + rho: the decoded slots are dominated by the mask
    seen = client.decrypt(masked)
    assert np.abs(seen).min() > 2.0 ** (P.mask_lambda - 8)
    assert abs(np.corrcoef(seen, x)[0, 1]) < 0.1


def test_refresh_round_trip_is_exact(pair, rng):
    client, server = pair
    x = rng.uniform(-1000, 1000, SLOTS)
    ct = _at_mask_level(client, server, x)
    before = client.decrypt_poly(ct)
    masked, mask = server.mask_for_refresh(ct)
    # client: decrypt x + rho as integers, re-encrypt at the top level (same scale)
    fresh = client.refresh_reencrypt(masked, level=P.top_level)
    assert server.level(fresh) == P.top_level
    assert server.scale(fresh) == server.scale(ct)
    out = server.unmask_refresh(fresh, mask)
    assert server.level(out) == P.top_level
    # slots: x / 2 to CKKS precision
    np.testing.assert_allclose(client.decrypt(out), x * 0.5, atol=1e-6)
    # polynomial: the same integers up to fresh-encryption and re-randomization noise
    diff = (client.decrypt_poly(out) - before).astype(np.float64)
    assert np.abs(diff).max() < 2.0**20  # noise, never a mask remnant (2^94)


def test_refresh_via_seeded_upload_bytes(pair, rng):
    client, server = pair
    x = rng.standard_normal(SLOTS)
    ct = _at_mask_level(client, server, x)
    masked, mask = server.mask_for_refresh(ct)
    blob = server.serialize(masked)
    up = client.refresh_reencrypt_to_bytes(client.deserialize(blob, level=P.min_mask_level()))
    fresh = server.deserialize(up, level=P.top_level, scale=mask.scale)
    assert len(up) < 0.6 * len(server.serialize(fresh))  # seeded: about half size
    out = server.unmask_refresh(fresh, mask)
    np.testing.assert_allclose(client.decrypt(out), 0.5 * x, atol=1e-6)


def test_refresh_refuses_a_level_without_room(pair):
    client, server = pair
    ct = client.encrypt(np.ones(4), level=P.min_mask_level() - 1)
    with pytest.raises(HEError, match="mask"):
        server.mask_for_refresh(ct)


def test_unmask_checks(pair, rng):
    client, server = pair
    ct = _at_mask_level(client, server, rng.standard_normal(SLOTS))
    _, mask = server.mask_for_refresh(ct)
    other = client.encrypt(np.ones(4), scale=2.0**30)
    with pytest.raises(HEError, match="scale"):
        server.unmask_refresh(other, mask)


def _chi_square_uniform(samples: np.ndarray, buckets: int) -> float:
    counts = np.bincount(samples, minlength=buckets).astype(np.float64)
    expected = samples.size / buckets
    return float(((counts - expected) ** 2 / expected).sum())


def test_mask_coefficients_are_uniform(pair, rng):
    client, server = pair
    ct = _at_mask_level(client, server, rng.standard_normal(SLOTS))
    masks = [server.mask_for_refresh(ct, rerandomize=False)[1] for _ in range(4)]
    bits = masks[0].bits
    rho = np.concatenate([m.coeffs for m in masks])  # Python ints in [-2^bits, 2^bits)
    assert rho.min() >= -(1 << bits) and rho.max() < (1 << bits)
    shifted = rho + (1 << bits)  # uniform on [0, 2^(bits+1))
    buckets = 64
    # chi-square with 63 degrees of freedom: mean 63, sd ~11.2; 140 is p < 1e-7
    top = (shifted >> (bits + 1 - 6)).astype(np.int64)
    low = (shifted % buckets).astype(np.int64)
    mid = ((shifted >> (bits // 2)) % buckets).astype(np.int64)
    for name, s in (("top", top), ("low", low), ("mid", mid)):
        stat = _chi_square_uniform(s, buckets)
        assert stat < 140, f"{name} bits not uniform: chi2={stat:.1f}"
    # the extremes of the range are reached (not a narrower distribution)
    assert rho.max() > (1 << bits) * 0.99 and rho.min() < -(1 << bits) * 0.99
    # two masks are independent
    assert not np.array_equal(masks[0].coeffs, masks[1].coeffs)


def test_samplers():
    u = uniform_int_poly(4096, 30)
    assert u.min() >= -(2**30) and u.max() < 2**30
    g = gaussian_int_poly(100000, 2.0**20)
    assert abs(g.std() / 2.0**20 - 1) < 0.02 and abs(g.mean()) < 2.0**20 * 0.02
    assert np.all(gaussian_int_poly(10, 0) == 0)


def test_rerandomize_changes_bytes_not_values(pair, rng):
    client, server = pair
    x = rng.standard_normal(SLOTS)
    ct = client.encrypt(x)
    w = rng.standard_normal(SLOTS)
    # the same computation twice: equal ciphertexts without re-randomization ...
    pt = server.encode(w, P.top_level, server.prime(P.top_level))
    y1, y2 = server.multiply_plain(ct, pt), server.multiply_plain(ct, pt)
    assert server.serialize(y1) == server.serialize(y2)
    # ... different bytes after it, decrypting alike
    r1, r2 = server.rerandomize(y1), server.rerandomize(y2)
    b1, b2 = server.serialize(r1), server.serialize(r2)
    assert b1 != b2
    d1, d2 = client.decrypt(r1), client.decrypt(r2)
    # flooding error: sigma * sqrt(N) / scale per slot (~2^-10 for the test set)
    slot_sd = 2.0**P.flood_log2_sigma * math.sqrt(N) / P.scale
    assert np.abs(d1 - x * w).max() < 8 * slot_sd
    assert np.abs(d1 - d2).max() < 12 * slot_sd
    # without flooding only the fresh encryption of zero is added
    r3 = server.rerandomize(y1, flood_log2_sigma=float("-inf"))
    assert server.serialize(r3) != b1
    assert np.abs(client.decrypt(r3) - x * w).max() < 1e-5


def test_flooding_noise_has_the_named_size(pair, rng):
    client, server = pair
    ct = client.encrypt(rng.standard_normal(SLOTS), level=1)
    before = client.decrypt_poly(ct)
    after = client.decrypt_poly(server.rerandomize(ct))
    noise = (after - before).astype(np.float64)
    sigma = 2.0**P.flood_log2_sigma
    assert abs(noise.std() / sigma - 1) < 0.05
    assert abs(noise.mean()) < 0.05 * sigma
    big = client.decrypt_poly(server.rerandomize(ct, flood_log2_sigma=30))
    assert abs((big - before).astype(np.float64).std() / 2.0**30 - 1) < 0.05


def test_server_without_public_key_cannot_rerandomize(rng):
    lone = SealBackend(P)
    client = SealBackend(P)
    client.generate_keys([])
    with pytest.raises(HEError):
        lone.rerandomize(client.encrypt(np.ones(3)))

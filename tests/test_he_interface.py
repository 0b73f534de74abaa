"""The HE interface's contract (``veil.crypto.backend.HEBackend``), on every backend.

Runs on the test-only N=8192 set (the properties do not depend on N); client and server are
separate backend objects and the server holds only the client's exported public material.
Tolerances: scale 2^40, so encoding and rescale errors are ~2^-30 relative per operation; the
flooding noise of ``rerandomize`` is 2^24 coefficient units, ~2^(24+6-40) = 1e-3 per slot.
"""

import dataclasses

import numpy as np
import pytest

from veil.crypto.backend import (
    BackendError,
    CiphertextError,
    HEError,
    KeyMaterialError,
    Plaintext,
    backend_names,
    make_backend,
)
from veil.crypto.params import PROTECTED_PARAMS, TEST_PARAMS_ID, get_params

P = get_params(TEST_PARAMS_ID, allow_test_params=True)
SLOTS = P.slot_count
STEPS = [1, 5, 24, -7, -192, 64, 128]


@pytest.fixture(scope="module")
def pair(he_backend, he_pair):
    return he_pair(he_backend, P, STEPS)


@pytest.fixture()
def rng():
    return np.random.default_rng(1234)


def test_production_selection_refuses_test_backends_and_params():
    assert "plain" not in backend_names() and "seal" in backend_names()
    assert "plain" in backend_names(include_test=True)
    with pytest.raises(BackendError, match="test-only"):
        make_backend(PROTECTED_PARAMS, "plain")
    with pytest.raises(BackendError, match="test-only"):
        make_backend(P, "seal")
    with pytest.raises(BackendError, match="unknown"):
        make_backend(PROTECTED_PARAMS, "openfhe")
    assert make_backend(P, "plain", allow_test_backends=True).name == "plain"


def test_encrypt_decrypt_levels(pair, rng):
    client, server = pair
    x = rng.standard_normal(SLOTS)
    for level in range(P.top_level + 1):
        ct = server.deserialize(client.encrypt_to_bytes(x, level), level=level, scale=P.scale)
        assert server.level(ct) == level and server.scale(ct) == P.scale
        assert server.nbytes(ct) == 2 * (level + 1) * P.poly_modulus_degree * 8
        np.testing.assert_allclose(client.decrypt(ct), x, atol=1e-7)
    assert client.decrypt(client.encrypt(x[:10]), 10).shape == (10,)
    for bad in (np.ones(SLOTS + 1), np.array([np.nan])):
        with pytest.raises(HEError):
            client.encrypt(bad)
    with pytest.raises(HEError):
        client.encrypt(x, level=P.top_level + 1)


def test_server_cannot_decrypt(pair, rng):
    client, server = pair
    assert client.has_secret_key and not server.has_secret_key
    with pytest.raises(HEError):
        server.decrypt(client.encrypt(rng.standard_normal(8)))


def test_add_and_plaintext_products_keep_the_scale(pair, rng):
    client, server = pair
    a, b = rng.standard_normal(SLOTS), rng.standard_normal(SLOTS)
    ca, cb = client.encrypt(a), client.encrypt(b)
    np.testing.assert_allclose(client.decrypt(server.add(ca, cb)), a + b, atol=1e-6)
    top = P.top_level
    pt = server.encode(b, top, server.prime(top))
    assert isinstance(pt, Plaintext) and pt.level == top and pt.nbytes > 0
    prod = server.multiply_plain(ca, pt)  # encoded at the prime it rescales by: the scale stays
    assert server.level(prod) == top - 1 and server.scale(prod) == pytest.approx(P.scale, rel=1e-12)
    np.testing.assert_allclose(client.decrypt(prod), a * b, atol=1e-5)
    raw = server.multiply_plain(ca, server.encode(b, top, 2.0**20), rescale=False)
    assert server.level(raw) == top and server.scale(raw) == P.scale * 2.0**20
    assert server.scale(server.rescale(raw)) == pytest.approx(P.scale * 2.0**20 / P.primes[top])
    with pytest.raises(HEError, match="level"):
        server.multiply_plain(client.encrypt(a, level=1), pt)
    with pytest.raises(HEError):
        server.multiply_plain(server.mod_switch_to(ca, 0), server.encode(b, 0, 2.0**10))  # no level left


def test_a_product_with_an_all_zero_plaintext_is_refused(pair, rng):
    """ct x pt (alone and in a dot product) with a plaintext whose every coefficient is zero is
    refused (the product would be a transparent ciphertext), whether the plaintext was encoded
    alone or with others (``encode_many``, which the shuffled FFN encodes afresh every step), and
    a nonzero one encoded beside it is not."""
    client, server = pair
    a = rng.standard_normal(SLOTS)
    ca, top = client.encrypt(a), P.top_level
    zeros = np.zeros(SLOTS)
    alone, (together, other) = server.encode(zeros, top), server.encode_many([zeros, a], top)
    for pt in (alone, together):
        with pytest.raises(HEError, match="all-zero"):
            server.multiply_plain(ca, pt)
        with pytest.raises(HEError, match="all-zero"):
            server.dot_plain([ca, ca], [other, pt])
    np.testing.assert_allclose(client.decrypt(server.multiply_plain(ca, other)), a * a, atol=1e-4)


def test_rotations_and_hoisted_rotations(pair, rng):
    client, server = pair
    x = rng.standard_normal(SLOTS)
    ct = client.encrypt(x)
    for step in (*STEPS, 0):
        np.testing.assert_allclose(client.decrypt(server.rotate(ct, step)), np.roll(x, -step), atol=1e-5)
    # a left rotation by slots - 7 is a right rotation by 7: the same key
    np.testing.assert_allclose(client.decrypt(server.rotate(ct, SLOTS - 7)), np.roll(x, 7), atol=1e-5)
    many = server.rotate_many(ct, STEPS)
    assert len(many) == len(STEPS)
    for step, got in zip(STEPS, many, strict=True):
        np.testing.assert_allclose(client.decrypt(got), np.roll(x, -step), atol=1e-5)
    with pytest.raises(HEError, match="Galois"):
        server.rotate(ct, 3001)


def test_ct_ct_multiply_rescale_mod_switch(pair, rng):
    client, server = pair
    a, b = rng.standard_normal(SLOTS), rng.standard_normal(SLOTS)
    ca, cb = client.encrypt(a), client.encrypt(b)
    c = server.multiply(ca, cb)
    assert server.level(c) == P.top_level - 1
    np.testing.assert_allclose(client.decrypt(c), a * b, atol=1e-5)
    raw = server.multiply(ca, cb, rescale=False)
    assert server.level(raw) == P.top_level and server.scale(raw) == P.scale**2
    np.testing.assert_allclose(client.decrypt(server.rescale(raw)), a * b, atol=1e-5)
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


def test_sum_of_unrelinearized_products_relinearized_once(pair, rng):
    """Σ a_i b_i with one relinearization (after the rescale) equals the sum of products; a
    three-polynomial ciphertext is refused as a product operand."""
    client, server = pair
    xs = [(rng.standard_normal(SLOTS), rng.standard_normal(SLOTS)) for _ in range(3)]
    acc = None
    for a, b in xs:
        p = server.multiply(client.encrypt(a, level=2), client.encrypt(b, level=2), rescale=False, relinearize=False)
        acc = p if acc is None else server.add(acc, p)
    out = server.relinearize(server.rescale(acc))
    assert server.level(out) == 1
    np.testing.assert_allclose(client.decrypt(out), sum(a * b for a, b in xs), atol=1e-4)
    with pytest.raises(HEError, match="two-polynomial"):
        server.multiply(acc, acc)


def test_masked_refresh_round_trip(pair, rng):
    """Server masks (at the lowest level with room), client re-encrypts at the top, server
    unmasks: the values come back; the client saw them only under the mask."""
    client, server = pair
    x = rng.uniform(-1000, 1000, SLOTS)
    level = P.min_mask_level()
    ct = client.encrypt(x, level=level)
    masked, mask = server.mask_for_refresh(ct)
    assert server.level(masked) == level and mask.params_id == P.id
    assert np.abs(client.decrypt(masked) - x).max() > 1e3  # hidden by the mask
    fresh = server.deserialize(client.refresh_reencrypt_to_bytes(masked), level=P.top_level)
    out = server.unmask_refresh(fresh, mask)
    assert server.level(out) == P.top_level and server.scale(out) == server.scale(ct)
    np.testing.assert_allclose(client.decrypt(out), x, atol=1e-5)
    with pytest.raises(HEError, match="refresh mask"):
        server.mask_for_refresh(server.mod_switch_to(ct, level - 1))


def test_rerandomize_changes_bytes_not_values(pair, rng):
    client, server = pair
    x = rng.standard_normal(SLOTS)
    ct = client.encrypt(x)
    a, b = server.rerandomize(ct), server.rerandomize(ct)
    assert server.serialize(a) != server.serialize(b)
    for y in (a, b):
        np.testing.assert_allclose(client.decrypt(y), x, atol=1e-2)  # 2^24 coefficient flooding


def test_serialization_validates(pair, rng):
    client, server = pair
    ct = client.encrypt(rng.standard_normal(SLOTS), level=1)
    blob = server.serialize(ct)
    back = server.deserialize(blob, level=1, scale=P.scale)
    assert server.serialize(back) == blob
    for kw in ({"level": 2}, {"scale": P.scale * 2}, {"size": 3}):
        with pytest.raises(CiphertextError):
            server.deserialize(blob, **kw)
    for bad in (b"", blob[: len(blob) // 2], blob + b"\0" * 64, b"\xff" * len(blob), "text"):
        with pytest.raises(CiphertextError):
            server.deserialize(bad)


def test_rounded_download(pair, rng, he_backend):
    """A flooded ciphertext sent rounded to the bits above its flooding noise: smaller, and the
    decrypted error grows by a few percent of the flooding noise at most (``crypto.rounding``)."""
    client, server = pair
    x = rng.standard_normal(SLOTS)
    flood = np.log2(P.scale) - 16  # 2^24 coefficient units
    for level in (0, 1, 2):
        ct = server.rerandomize(client.encrypt(x, level=level), flood)
        full, rounded = server.serialize(ct), server.serialize(ct, noise_log2=flood)
        back = client.deserialize(rounded, level=level, scale=P.scale)
        exact = client.decrypt(ct)
        if he_backend == "plain":  # slot vectors: nothing to round, the same bytes
            assert rounded == full and np.array_equal(client.decrypt(back), exact)
            continue
        assert len(rounded) < 0.95 * len(full)
        flood_err = np.std(exact - x)
        round_err = np.std(client.decrypt(back) - exact)
        assert 0 < round_err < 0.35 * flood_err, (level, round_err, flood_err)
        for bad in (rounded[:-1], rounded + b"\0", rounded[:4] + bytes([9]) + rounded[5:],
                    rounded[:6] + bytes([255]) + rounded[7:]):
            with pytest.raises(CiphertextError):
                client.deserialize(bad)
        with pytest.raises(CiphertextError):
            client.deserialize(rounded, level=level + 1)


def test_keys_for_their_levels_only(he_backend, he_pair, rng):
    """Galois keys generated for the levels their rotations run at: smaller (SEAL, native), used
    at those levels, refused above them; material declaring more than its keys hold is refused."""
    levels = {1: P.top_level, -1: 0, 3: 1}
    client, server = he_pair(he_backend, P, levels)
    mat = client.export_public_material()
    assert mat.rotation_steps == (-1, 1, 3) and mat.rotation_levels == (0, P.top_level, 1)
    x = rng.standard_normal(SLOTS)
    for step, level in levels.items():
        for lv in range(level + 1):
            got = client.decrypt(server.rotate(client.encrypt(x, level=lv), step))
            np.testing.assert_allclose(got, np.roll(x, -step), atol=1e-3)
        if level < P.top_level:
            with pytest.raises(HEError, match="serves levels"):
                server.rotate(client.encrypt(x, level=level + 1), step)
            with pytest.raises(HEError, match="serves levels"):
                server.rotate_many(client.encrypt(x, level=level + 1), [step])
    if he_backend == "plain":  # no key bytes: the declared levels are all there is
        return
    full, _ = he_pair(he_backend, P, list(levels))
    assert len(mat.galois_keys) < 0.7 * len(full.export_public_material().galois_keys)
    for bad in ((P.top_level, P.top_level, 1), (0, 1), (0, P.top_level, P.top_level + 1)):
        fresh = make_backend(P, he_backend, allow_test_backends=True)
        with pytest.raises(KeyMaterialError):
            fresh.import_public_material(dataclasses.replace(mat, rotation_levels=bad))
        assert fresh.rotation_steps == ()


def test_relinearization_key_for_its_levels_only(he_backend, he_pair, rng):
    """A relinearization key made for level 1: smaller (SEAL, native), products at it, refused
    above it (with and without the deferred relinearization); material declaring more than the
    key holds is refused."""
    client, server = he_pair(he_backend, P, [1], relin_level=1)
    mat = client.export_public_material()
    assert mat.relin_level == 1 and server.relin_level == 1
    x, y = rng.standard_normal((2, SLOTS))
    for lv in (1,):
        a, b = client.encrypt(x, level=lv), client.encrypt(y, level=lv)
        np.testing.assert_allclose(client.decrypt(server.multiply(a, b)), x * y, atol=1e-3)
        prod = server.multiply(a, b, rescale=False, relinearize=False)
        np.testing.assert_allclose(client.decrypt(server.rescale(server.relinearize(prod))), x * y, atol=1e-3)
    a, b = client.encrypt(x, level=2), client.encrypt(y, level=2)
    with pytest.raises(HEError, match="relinearization key serves levels <= 1"):
        server.multiply(a, b)
    with pytest.raises(HEError, match="relinearization key serves levels <= 1"):
        server.relinearize(server.multiply(a, b, rescale=False, relinearize=False))
    # the plain double has no key bytes: only levels outside the chain are wrong there
    for bad in (P.top_level + 1, -1) if he_backend == "plain" else (2, P.top_level + 1, -1):
        fresh = make_backend(P, he_backend, allow_test_backends=True)
        with pytest.raises(KeyMaterialError):
            fresh.import_public_material(dataclasses.replace(mat, relin_level=bad))
    if he_backend == "plain":
        return
    full, _ = he_pair(he_backend, P, [1])
    assert full.export_public_material().relin_level == P.top_level
    assert len(mat.relin_keys) < 0.6 * len(full.export_public_material().relin_keys)  # 2 x 3 of 3 x 4 runs


def test_key_import_validates(pair, he_backend):
    client, _ = pair
    mat = client.export_public_material()
    fresh = make_backend(P, he_backend, allow_test_backends=True)
    with pytest.raises(KeyMaterialError):
        fresh.import_public_material(dataclasses.replace(mat, params_id=PROTECTED_PARAMS.id))
    with pytest.raises(KeyMaterialError):
        fresh.import_public_material(dataclasses.replace(mat, public_key=b"junk" * 10))
    fresh.import_public_material(mat)
    assert not fresh.has_secret_key and fresh.rotation_steps == tuple(sorted(STEPS))


def test_dot_plain_is_the_sum_of_products(pair, rng):
    client, server = pair
    xs, ws = rng.standard_normal((3, SLOTS)), rng.standard_normal((3, SLOTS))
    top = P.top_level
    cts = [client.encrypt(x) for x in xs]
    pts = [server.encode(w, top, server.prime(top)) for w in ws]
    out = server.dot_plain(cts, pts)
    assert server.level(out) == top and server.scale(out) == pytest.approx(P.scale * P.primes[top])
    np.testing.assert_allclose(client.decrypt(server.rescale(out)), (xs * ws).sum(0), atol=1e-5)
    with pytest.raises(HEError):
        server.dot_plain(cts[:1], [server.encode(ws[0], top - 1, server.prime(top - 1))])  # level mismatch
    with pytest.raises((HEError, ValueError)):
        server.dot_plain(cts, pts[:2])

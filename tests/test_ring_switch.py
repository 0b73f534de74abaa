"""Folded downloads (``veil.crypto.ring_switch``): a ciphertext at level 0 or 1 sent in the ring of N/2.

On SEAL and native at the protected parameter set: the client decrypts slot j plus slot j + S/2
of what the server held, with the noise per slot a whole download carries, in half the bytes; a
masked refresh of a polynomial in X² comes back re-encrypted as that polynomial;
the test-only N=8192 set folds as well (the ring's degree is the parameter's). Malformed fold
keys are refused on import (a 400 on ``POST /v1/keys``), malformed folded downloads on the
client, and a server without the client's fold key does not fold. ``plain`` mirrors the slots.
"""

import dataclasses

import msgpack
import numpy as np
import pytest

from veil.crypto import ring_switch, rounding
from veil.crypto.backend import CiphertextError, HEError, KeyMaterialError, make_backend
from veil.crypto.params import PROTECTED_PARAMS, TEST_PARAMS_ID, get_params
from veil.protected.protocol import WireError, public_material_from_bytes, public_material_to_bytes

FLOOD = 18.0  # coefficient units, log2: the protected downloads' flooding at scale 2^36


@pytest.fixture(scope="module", params=["seal", "native"])
def pair(request, he_pair):
    return he_pair(request.param, PROTECTED_PARAMS, {1: 0}, relin_level=0)


def _values(params, seed=5):
    return np.random.default_rng(seed).uniform(-1000.0, 1000.0, params.slot_count)


def test_a_folded_download_holds_both_halves_summed_with_the_whole_downloads_noise(pair):
    client, server = pair
    p = server.params
    v = _values(p)
    ct = server.deserialize(client.encrypt_to_bytes(v, 0))
    half = p.slot_count // 2
    folded = server.serialize_folded(ct, FLOOD)
    whole = server.serialize(server.rerandomize(ct, FLOOD), noise_log2=FLOOD)
    got, scale = client.decrypt_folded(folded)
    assert client.is_folded(folded) and not client.is_folded(whole)
    assert got.shape == (half,) and scale == p.scale
    err_fold = got - (v[:half] + v[half:])
    err_whole = client.decrypt(client.deserialize(whole)) - v
    # flooding of std 2^18 coefficient units: 2^18 * sqrt(N/2) / 2^36 ~ 2^-11.5 per slot either way
    expect = 2.0**FLOOD * np.sqrt(p.slot_count) / p.scale
    assert 0.8 < np.std(err_fold) / expect < 1.25 and 0.8 < np.std(err_whole) / expect < 1.25
    assert abs(np.mean(err_fold)) < 4 * expect / np.sqrt(half)
    assert len(folded) - 4 <= len(whole) // 2 + 16  # half the coefficients, the same bits each
    # level 1 (the final download's) folds with the key's second digit, the same noise per slot;
    # a level above is switched down to 1 first
    ct1 = server.deserialize(client.encrypt_to_bytes(v, 1), level=1)
    folded1 = server.serialize_folded(ct1, FLOOD)
    got1, _ = client.decrypt_folded(folded1)
    assert 0.8 < np.std(got1 - (v[:half] + v[half:])) / expect < 1.25
    assert len(folded1) - 4 <= len(server.serialize(server.rerandomize(ct1, FLOOD), noise_log2=FLOOD)) // 2 + 16
    ct2 = server.deserialize(client.encrypt_to_bytes(v, 2), level=2)
    folded2 = server.serialize_folded(ct2, FLOOD)
    assert len(folded2) == len(folded1)
    assert np.abs(client.decrypt_folded(folded2)[0] - (v[:half] + v[half:])).max() < 0.05


def test_a_masked_refresh_folds_to_its_polynomial_which_the_client_reencrypts(pair):
    """h'' with slots that repeat every S/2 (a polynomial in X², the hidden layout), masked with a
    mask in X² at the refresh's level and scale: the folded refresh is half the bytes, the
    client sees the mask (|coefficients| ~ 2^109), re-encrypts g(X²) at the top level, and once
    the server subtracts the mask it holds h'' with the key switch's noise (~2^-14 per slot,
    under the big ring's re-randomization noise the whole refresh carries on the native backend)."""
    client, server = pair
    p, half = server.params, server.params.slot_count // 2
    scale = 2.0**27  # the refresh's (Circuit.refresh_scale)
    w = np.tile(np.random.default_rng(9).normal(0.0, 10.0, half), 2)
    ct = server.deserialize(client.encrypt_to_bytes(w, 1, scale), level=1, scale=scale)
    masked, mask = server.mask_for_refresh(ct, fold=True)
    folded = server.serialize_folded_refresh(masked, 3.0)
    whole_masked, _ = server.mask_for_refresh(ct)
    assert client.is_folded(folded) and len(folded) - 4 <= len(server.serialize(whole_masked, noise_log2=3.0)) // 2 + 16
    g, level, got_scale = ring_switch.decrypt_residues(p, client._fold_secret, folded)
    assert (level, got_scale) == (1, scale)
    assert np.abs(rounding.crt(g, tuple(p.primes[:2]), centered=True).astype(np.float64)).max() > 2.0**105
    up = client.refresh_reencrypt_folded_to_bytes(folded, p.top_level)
    h = server.unmask_refresh(server.deserialize(up, scale=scale), mask)
    assert server.level(h) == p.top_level and server.scale(h) == scale
    err = client.decrypt(h) - w
    assert np.std(err) < 2.0**-13 and np.abs(err).max() < 2.0**-10
    for bad in (folded[:-1], folded + b"\0", ring_switch.MAGIC + folded[8:]):
        with pytest.raises(CiphertextError):
            client.refresh_reencrypt_folded_to_bytes(bad, p.top_level)


def test_folding_runs_on_the_test_ring_too(he_pair):
    p = get_params(TEST_PARAMS_ID, allow_test_params=True)
    client, server = he_pair("native", p, [1])
    v = _values(p, 7)
    got, _ = client.decrypt_folded(server.serialize_folded(server.deserialize(client.encrypt_to_bytes(v, 0)), 20.0))
    half = p.slot_count // 2
    assert np.abs(got - (v[:half] + v[half:])).max() < 0.05


def test_each_backend_exports_a_fold_key_that_travels_in_the_public_material(pair):
    client, server = pair
    material = client.export_public_material()
    assert len(material.fold_key) == ring_switch.key_bytes(PROTECTED_PARAMS)
    assert material.nbytes == (len(material.public_key) + len(material.relin_keys) + len(material.galois_keys)
                               + len(material.fold_key))
    back = public_material_from_bytes(public_material_to_bytes(material), max_bytes=1 << 30)
    assert back == material and server.can_fold and not client.can_fold
    raw = msgpack.unpackb(public_material_to_bytes(material))
    raw["fold_key"] = "text"
    with pytest.raises(WireError, match="fold_key"):
        public_material_from_bytes(msgpack.packb(raw), max_bytes=1 << 30)


@pytest.mark.parametrize("damage", ["short", "magic", "residue"])
def test_a_malformed_fold_key_is_refused_and_the_backend_keeps_what_it_held(pair, damage):
    client, server = pair
    material = client.export_public_material()
    key = bytearray(material.fold_key)
    if damage == "short":
        key = key[:-1]
    elif damage == "magic":
        key[:4] = b"XXXX"
    else:  # the first residue mod p set to all ones: 2^57 - 1 >= p
        bits = PROTECTED_PARAMS.primes[-1].bit_length()
        start = 4 + 32
        for i in range(bits):
            key[start + i // 8] |= 1 << (i % 8)
    fresh = make_backend(PROTECTED_PARAMS, server.name)
    with pytest.raises(KeyMaterialError, match="fold key"):
        fresh.import_public_material(dataclasses.replace(material, fold_key=bytes(key)))
    assert not fresh.can_fold
    v = _values(PROTECTED_PARAMS, 3)
    ct = server.deserialize(client.encrypt_to_bytes(v, 0))
    got, _ = client.decrypt_folded(server.serialize_folded(ct, FLOOD))  # the server's own key is untouched
    assert np.abs(got - (v[:4096] + v[4096:])).max() < 0.05


def test_a_malformed_folded_download_is_refused_by_the_client(pair):
    client, server = pair
    ct = server.deserialize(client.encrypt_to_bytes(_values(PROTECTED_PARAMS), 0))
    good = server.serialize_folded(ct, FLOOD)
    for bad in (good[:-1], good + b"\0", b"VFD1" + b"\0" * 20, ring_switch.MAGIC + good[8:]):
        with pytest.raises(CiphertextError):
            client.decrypt_folded(bad)


def test_without_a_fold_key_the_server_does_not_fold(pair):
    client, _ = pair
    server = make_backend(PROTECTED_PARAMS, client.name)
    server.import_public_material(dataclasses.replace(client.export_public_material(), fold_key=b""))
    assert not server.can_fold
    with pytest.raises(HEError, match="fold key"):
        server.serialize_folded(server.deserialize(client.encrypt_to_bytes(_values(PROTECTED_PARAMS), 0)), FLOOD)


def test_plain_mirrors_the_fold_in_slots(he_pair):
    p = get_params(TEST_PARAMS_ID, allow_test_params=True)
    client, server = he_pair("plain", p, [1])
    v = _values(p, 11)
    folded = server.serialize_folded(server.deserialize(client.encrypt_to_bytes(v, 1), level=1), 20.0)
    got, scale = client.decrypt_folded(folded)
    half = p.slot_count // 2
    assert client.is_folded(folded) and scale == p.scale
    assert np.abs(got - (v[:half] + v[half:])).max() < 0.05
    with pytest.raises(CiphertextError):
        client.decrypt_folded(folded[:-8])
    w = np.tile(v[:half], 2)  # a masked refresh in X²: the halves' mean is the polynomial itself
    masked, mask = server.mask_for_refresh(server.deserialize(client.encrypt_to_bytes(w, 1, 2.0**27), level=1,
                                                              scale=2.0**27), fold=True)
    up = client.refresh_reencrypt_folded_to_bytes(server.serialize_folded_refresh(masked, 3.0), p.top_level)
    assert np.abs(client.decrypt(server.unmask_refresh(server.deserialize(up, scale=2.0**27), mask)) - w).max() < 1e-3


def test_a_key_pair_exported_for_the_key_file_decrypts_and_encrypts_as_the_one_that_made_it(pair):
    """``export_secret`` / ``import_secret`` (the client's key file): a backend holding only the
    imported secret decrypts what the original encrypted, whole and folded, and the server,
    under the original's uploaded keys, computes on what the imported one encrypts."""
    client, server = pair
    p, half = server.params, server.params.slot_count // 2
    secret, fold = client.export_secret()
    again = make_backend(p, client.name)
    again.import_secret(secret, fold)
    v = _values(p)
    ct = server.deserialize(client.encrypt_to_bytes(v, 0))
    assert np.abs(again.decrypt(server.deserialize(server.serialize(ct))) - v).max() < 1e-3
    got, _ = again.decrypt_folded(server.serialize_folded(ct, FLOOD))
    assert np.abs(got - (v[:half] + v[half:])).max() < 0.05
    rotated = server.rotate(server.deserialize(again.encrypt_to_bytes(v, 0)), 1)  # the server's Galois key
    assert np.abs(client.decrypt(rotated) - np.roll(v, -1)).max() < 1e-3
    assert again.export_secret() == (secret, fold)


@pytest.mark.parametrize("damage", ["short", "not_ternary", "fold_short", "fold_not_ternary"])
def test_a_damaged_secret_is_refused_and_the_backend_keeps_none(pair, damage):
    client, _ = pair
    secret, fold = client.export_secret()
    if damage == "short":
        secret = secret[:-9]
    elif damage == "not_ternary":
        secret = secret[:-16] + b"\x07" * 16 if client.name == "native" else secret[:100] + b"\xff" * 64 + secret[164:]
    elif damage == "fold_short":
        fold = fold[1:]
    else:
        fold = b"\x02" + fold[1:]
    fresh = make_backend(client.params, client.name)
    with pytest.raises(KeyMaterialError):
        fresh.import_secret(secret, fold)
    assert not fresh.has_secret_key


def test_the_clients_crt_in_floats_equals_the_exact_integers():
    """The folded download's decryption takes its centred integers as balanced mixed-radix
    digits summed in floats (``rns.balanced_digits``, ``rns.digits_to_float`` over the small
    ring's basis): the CRT integers ``rounding.crt`` composes exactly, to within 1e-15 relative,
    at the fold's levels and beyond; residues at the edges (0, q - 1, the integers next to ±Q/2
    and small ones of either sign) included."""
    import math

    import torch

    from veil.crypto.native import rns
    from veil.crypto.native.modarith import Basis

    rng = np.random.default_rng(11)
    for limbs in (1, 2, 3, 5):
        qs = tuple(int(q) for q in PROTECTED_PARAMS.primes[:limbs])
        big = math.prod(qs)
        edges = [0, 1, -1, 12345, -12345, big // 2, -(big // 2), big // 2 - 1, 2**50, -(2**50)]
        res = np.stack([rng.integers(0, q, 4096, dtype=np.int64) for q in qs])
        res[:, : len(edges)] = [[x % q for x in edges] for q in qs]
        res[:, len(edges)] = [q - 1 for q in qs]
        want = rounding.crt(res, qs, centered=True)
        got = rns.digits_to_float(rns.balanced_digits(torch.from_numpy(res), Basis.of(qs)), qs).numpy()
        assert got.dtype == np.float64 and got.shape == want.shape
        assert all(abs(g - int(w)) <= 1e-15 * abs(int(w)) for g, w in zip(got, want, strict=True))
        fits = [i for i, x in enumerate(edges) if abs(x) < 2**53]  # exact where a double holds the value
        assert [got[i] for i in fits] == [float(edges[i]) for i in fits]

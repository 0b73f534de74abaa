"""Ciphertext (de)serialization with validation, and the public-material export."""

import dataclasses
import os
import tempfile

import numpy as np
import pytest

from veil.crypto.backend import CiphertextError, HEError, KeyMaterialError, PublicMaterial
from veil.crypto.params import DEFAULT_PARAMS, TEST_PARAMS_ID, CkksParams, get_params
from veil.crypto.seal import format as seal_format
from veil.crypto.seal import packing as seal_packing
from veil.crypto.seal.backend import SealBackend, galois_element

P = get_params(TEST_PARAMS_ID, allow_test_params=True)
SLOTS = P.slot_count


@pytest.fixture(scope="module")
def pair():
    client = SealBackend(P)
    client.generate_keys([1, -1, 3])
    server = SealBackend(P)
    server.import_public_material(client.export_public_material())
    return client, server


@pytest.fixture(scope="module")
def ct_and_bytes(pair):
    client, server = pair
    x = np.linspace(-1, 1, SLOTS)
    ct = client.encrypt(x)
    return x, ct, server.serialize(ct)


def test_round_trip(pair, ct_and_bytes):
    client, server = pair
    x, ct, blob = ct_and_bytes
    back = server.deserialize(blob, level=P.top_level, size=2, scale=P.scale)
    np.testing.assert_allclose(client.decrypt(back), x, atol=1e-7)
    # bit-packed: exactly the header, SEAL's members and N residues per prime at the prime's width
    assert seal_packing.is_packed(blob)
    widths = [q.bit_length() for q in server._c.levels[P.top_level].primes]
    n = P.poly_modulus_degree
    assert len(blob) == 8 + 73 + 2 * sum((n * w + 7) // 8 for w in widths)
    # lower levels are smaller on the wire
    low = server.serialize(server.mod_switch_to(ct, 0))
    assert len(low) < 0.6 * len(blob)
    assert server.level(server.deserialize(low, level=0)) == 0


def test_seeded_upload_is_half_size(pair):
    client, server = pair
    x = np.arange(16.0)
    up = client.encrypt_to_bytes(x)
    full = server.serialize(client.encrypt(x))
    assert len(up) < 0.6 * len(full)
    ct = server.deserialize(up, level=P.top_level)
    np.testing.assert_allclose(client.decrypt(ct, 16), x, atol=1e-6)


def test_rejects_wrong_level_size_scale(pair, ct_and_bytes):
    _, server = pair
    _, _, blob = ct_and_bytes
    with pytest.raises(CiphertextError, match="level"):
        server.deserialize(blob, level=0)
    with pytest.raises(CiphertextError, match="size"):
        server.deserialize(blob, size=3)
    with pytest.raises(CiphertextError, match="scale"):
        server.deserialize(blob, scale=2.0**30)
    with pytest.raises(CiphertextError):
        server.deserialize(blob, size=9)


def test_rejects_other_parameter_set(pair):
    _, server = pair
    other = SealBackend(DEFAULT_PARAMS)  # the production N=16384 set
    other.generate_keys([])
    blob = other.serialize(other.encrypt(np.ones(4)))
    with pytest.raises(CiphertextError):
        server.deserialize(blob)
    # same ring dimension, another modulus chain: other parms_id, refused as well
    same_n = CkksParams("test-other-chain", 8192, (60, 40, 60), 40, test_only=True)
    sibling = SealBackend(same_n)
    sibling.generate_keys([])
    with pytest.raises(CiphertextError):
        server.deserialize(sibling.serialize(sibling.encrypt(np.ones(4))))
    # and the other way round
    mine = server.serialize(server.encrypt(np.ones(4)))
    with pytest.raises(CiphertextError):
        other.deserialize(mine)


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"garbage",
        b"\x00" * 64,
        os.urandom(4096),
        b"\x5e\xa1\x10\x04\x03\x02\x00\x00" + (10**9).to_bytes(8, "little"),  # lying size
    ],
)
def test_rejects_garbage(pair, bad):
    _, server = pair
    with pytest.raises(CiphertextError):
        server.deserialize(bad)


def test_rejects_truncated_and_tampered(pair, ct_and_bytes):
    client, server = pair
    _, _, blob = ct_and_bytes
    with pytest.raises(CiphertextError):
        server.deserialize(blob[:-1])
    with pytest.raises(CiphertextError):
        server.deserialize(blob[: len(blob) // 2])
    with pytest.raises(CiphertextError):
        server.deserialize(blob + b"\x00")
    with pytest.raises(CiphertextError):
        server.deserialize("not bytes")  # type: ignore[arg-type]
    # uncompressed blob with a residue >= its prime is refused by SEAL's data check
    ct = server.deserialize(blob)
    obj = ct._obj
    lvl = server._c.levels[P.top_level]
    polys = np.zeros((2, len(lvl.primes), P.poly_modulus_degree), dtype=np.uint64)
    polys[0, 0, 0] = lvl.primes[0]  # not reduced
    polys[1] = 1
    bad = seal_format.ciphertext_blob(polys, obj.parms_id(), obj.scale, True, server._c.version)
    with pytest.raises(CiphertextError):
        server.deserialize(bad)
    # random byte flips: a clean error or a (different) valid ciphertext, never a crash
    rng = np.random.default_rng(3)
    for _ in range(20):
        b = bytearray(blob)
        for pos in rng.integers(0, len(b), size=3):
            b[pos] ^= 0xFF
        try:
            server.deserialize(bytes(b))
        except CiphertextError:
            pass


def test_packed_form_is_validated(pair, ct_and_bytes):
    """The packed wire form: a SEAL blob is still accepted; bad flags, an unknown level, a
    missing or surplus seed, a residue >= its prime and every truncation are refused."""
    client, server = pair
    x, ct, blob = ct_and_bytes
    legacy = server._c.io.save(ct._obj)  # SEAL's own (zstd) form
    np.testing.assert_allclose(client.decrypt(server.deserialize(legacy)), x, atol=1e-7)
    bad_flags = blob[:4] + b"\x02" + blob[5:]
    unknown_level = blob[:8] + b"\x01" * 32 + blob[40:]
    up = client.encrypt_to_bytes(np.ones(8), level=1)
    assert up[4] == 1  # seeded
    unseeded_flag = up[:4] + b"\x00" + up[5:]
    for bad in (bad_flags, unknown_level, unseeded_flag, up[:-81], up + b"\x00", blob[:-1], blob[:100]):
        with pytest.raises(CiphertextError):
            server.deserialize(bad)
    # a residue equal to its prime (fits the packed width) is refused by SEAL's load check
    lvl = server._c.levels[P.top_level]
    polys = np.ones((2, len(lvl.primes), P.poly_modulus_degree), dtype=np.uint64)
    polys[0, 0, 5] = lvl.primes[0]
    raw = seal_format.ciphertext_blob(polys, ct._obj.parms_id(), ct._obj.scale, True, server._c.version)
    packed = seal_packing.pack(raw, server._c.prime_widths)
    with pytest.raises(CiphertextError):
        server.deserialize(packed)
    # and the seeded upload round-trips
    np.testing.assert_allclose(client.decrypt(server.deserialize(up, level=1), 8), np.ones(8), atol=1e-6)


def _zstd_rle_bomb(blocks: int) -> bytes:
    """A valid zstd frame of RLE blocks, each inflating 4 bytes to 128 KiB."""
    frame = bytearray((0xFD2FB528).to_bytes(4, "little"))
    frame += bytes([0x00, 0x70])  # no content size, not single segment; window 128 MiB
    for i in range(blocks):
        last = 1 if i == blocks - 1 else 0
        frame += ((128 * 1024) << 3 | 1 << 1 | last).to_bytes(3, "little") + b"\x00"
    return bytes(frame)


def test_rejects_decompression_bomb(pair, ct_and_bytes):
    _, server = pair
    payload = _zstd_rle_bomb(20000)  # 80 KB that would inflate to 2.6 GB
    header = seal_format._HEADER.pack(
        seal_format.SEAL_MAGIC, 16, 4, 3, seal_format.COMPR_ZSTD, 0, 16 + len(payload)
    )
    assert seal_format.inflated_size_bound(header + payload, 10**12) == 20000 * 128 * 1024
    with pytest.raises(CiphertextError, match="inflate"):
        server.deserialize(header + payload)
    # a zlib bomb is inflated with an output cap only
    import zlib

    z = zlib.compress(b"\x00" * (64 << 20), 9)
    zh = seal_format._HEADER.pack(
        seal_format.SEAL_MAGIC, 16, 4, 3, seal_format.COMPR_ZLIB, 0, 16 + len(z)
    )
    with pytest.raises(CiphertextError, match="inflate"):
        server.deserialize(zh + z)
    # real ciphertexts in SEAL's own form are well inside the bound
    _, ct, _ = ct_and_bytes
    bound = seal_format.inflated_size_bound(server._c.io.save(ct._obj), 10**9)
    assert bound < 2 * 2 * P.poly_modulus_degree * (P.top_level + 1) * 8


def test_public_material_has_no_secret_key(pair):
    client, _ = pair
    mat = client.export_public_material()
    assert isinstance(mat, PublicMaterial)
    assert {f.name for f in dataclasses.fields(mat)} == {
        "params_id",
        "public_key",
        "relin_keys",
        "galois_keys",
        "rotation_steps",
        "rotation_levels",
        "relin_level",
        "fold_key",
    }
    assert mat.params_id == P.id and mat.rotation_steps == (-1, 1, 3)
    blobs = [mat.public_key, mat.relin_keys, mat.galois_keys, mat.fold_key]
    assert seal_packing.is_packed(mat.public_key)
    assert seal_packing.is_packed_keys(mat.relin_keys) and seal_packing.is_packed_keys(mat.galois_keys)
    export = b"".join(blobs)
    # the secret key's raw residue words (read from SEAL) occur nowhere in the export
    sk_plain = client._sk.data()
    words = np.array([sk_plain[i] for i in range(0, 4096)], dtype="<u8").tobytes()
    for off in range(0, len(words) - 32, 512):
        assert words[off : off + 32] not in export
    # nor does any chunk of the secret key's own serialization
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "sk.bin")
        client._sk.save(path)
        with open(path, "rb") as f:
            sk_blob = f.read()
    for off in range(64, len(sk_blob) - 64, len(sk_blob) // 16):
        assert sk_blob[off : off + 64] not in export
    # a backend built from the export alone holds only public objects and cannot decrypt
    fresh = SealBackend(P)
    fresh.import_public_material(mat)
    assert not fresh.has_secret_key and fresh._sk is None and fresh._decryptor is None
    with pytest.raises(HEError):
        fresh.decrypt(fresh.encrypt(np.ones(2)))
    assert fresh.rotation_steps == (-1, 1, 3)


def test_public_material_import_validation(pair):
    client, _ = pair
    mat = client.export_public_material()
    fresh = SealBackend(P)
    with pytest.raises(KeyMaterialError, match="for"):
        fresh.import_public_material(dataclasses.replace(mat, params_id=DEFAULT_PARAMS.id))
    with pytest.raises(KeyMaterialError):
        fresh.import_public_material(dataclasses.replace(mat, public_key=b"junk" * 10))
    with pytest.raises(KeyMaterialError):
        fresh.import_public_material(dataclasses.replace(mat, relin_keys=mat.relin_keys[:-10]))
    with pytest.raises(KeyMaterialError, match="step"):
        fresh.import_public_material(dataclasses.replace(mat, rotation_steps=(1, 2, 3)))
    with pytest.raises(KeyMaterialError, match="too many keys"):  # more keys than named steps
        fresh.import_public_material(dataclasses.replace(mat, rotation_steps=(1, 2),
                                                         rotation_levels=mat.rotation_levels[:2]))
    with pytest.raises(KeyMaterialError, match="levels"):  # one level per step
        fresh.import_public_material(dataclasses.replace(mat, rotation_steps=(1, 2)))
    with pytest.raises(KeyMaterialError):
        fresh.import_public_material("not material")  # type: ignore[arg-type]
    # keys of another parameter set, relabelled, are refused by SEAL's validation
    other = SealBackend(DEFAULT_PARAMS)
    other.generate_keys([])
    omat = other.export_public_material()
    with pytest.raises(KeyMaterialError):
        fresh.import_public_material(
            dataclasses.replace(
                omat, params_id=P.id, galois_keys=mat.galois_keys, rotation_steps=mat.rotation_steps
            )
        )
    assert not fresh.has_secret_key and fresh.rotation_steps == ()


def test_keys_travel_packed_and_smaller(pair):
    """Keys are bit-packed at their primes' widths: smaller than SEAL's own (zstd) save; SEAL's
    own form still loads; unpacking gives a SEAL blob that packs back to the same bytes."""
    client, server = pair
    mat = client.export_public_material()
    kg = client._keygen
    seal_gk = client._c.io.save(kg.create_galois_keys([galois_element(s, P.poly_modulus_degree)
                                                       for s in mat.rotation_steps]))
    assert len(mat.galois_keys) < 0.9 * len(seal_gk)
    assert len(mat.public_key) < 0.9 * len(client._c.io.save(client._pk))
    # SEAL's own form still loads (it is validated the same way)
    fresh = SealBackend(P)
    fresh.import_public_material(dataclasses.replace(mat, galois_keys=seal_gk))
    x = np.linspace(-1, 1, SLOTS)
    got = client.decrypt(fresh.rotate(client.encrypt(x), 3))
    assert np.abs(got - np.roll(x, -3)).max() < 1e-3
    # unpack(pack(keys)) is SEAL's uncompressed serialization of the same keys
    widths = client._c.key_prime_widths
    raw, levels = seal_packing.unpack_keys(mat.relin_keys, widths, client._c.version, client._c.n, 1, 8)
    assert levels == {0: seal_packing.FULL}
    assert seal_packing.pack_keys(raw, widths, 1 << 30) == mat.relin_keys


def test_packed_keys_are_validated(pair):
    client, _ = pair
    mat = client.export_public_material()
    gk = mat.galois_keys
    # layout: magic 0:4, pad 4:8, parms_id 8:40, u64 dim1 40:48, u32 count 48:52, then the first
    # entry: u32 index 52:56, u16 components 56:58, u8 level 58
    cases = {
        "truncated": (gk[:-100], "truncated"),
        "trailing": (gk + b"\0", "trailing"),
        "dim1 beyond N": (gk[:40] + (2**40).to_bytes(8, "little") + gk[48:], "too many keys"),
        "too many keys": (gk[:48] + (2**20).to_bytes(4, "little") + gk[52:], "too many keys"),
        "bad index": (gk[:52] + (2**31).to_bytes(4, "little") + gk[56:], "bad key index"),
        "zero components": (gk[:56] + (0).to_bytes(2, "little") + gk[58:], "component count"),
        "level out of range": (gk[:58] + bytes([200]) + gk[59:], "key level"),
        "wrong magic": (b"VPK9" + gk[4:], "bad SEAL magic"),  # not ours, so read as SEAL's own format
    }
    for name, (blob, why) in cases.items():
        fresh = SealBackend(P)
        with pytest.raises(KeyMaterialError, match=why):
            fresh.import_public_material(dataclasses.replace(mat, galois_keys=blob))
        assert fresh.rotation_steps == (), name
    # a packed Galois key in the relinearization slot has more keys than one
    with pytest.raises(KeyMaterialError):
        SealBackend(P).import_public_material(dataclasses.replace(mat, relin_keys=gk))


"""Native wire formats: exact round trips, the seeded (half-size) upload, and validation of
ciphertexts and key material against malformed, truncated, oversized, bit-flipped and foreign
input (``CiphertextError`` / ``KeyMaterialError``, never another exception)."""

import dataclasses
import struct

import numpy as np
import pytest

from veil.crypto import bitpack
from veil.crypto.backend import CiphertextError, KeyMaterialError, make_backend
from veil.crypto.native import serial
from veil.crypto.params import PROTECTED_PARAMS, TEST_PARAMS_ID, get_params
from veil.kernels import bitpack_cpu

P = get_params(TEST_PARAMS_ID, allow_test_params=True)
STEPS = [1, 2, -3]


@pytest.fixture(scope="module")
def pair(he_pair):
    return he_pair("native", P, STEPS)


def test_round_trips_and_seeded_upload(pair):
    client, server = pair
    x = np.linspace(-3, 3, P.slot_count)
    for level in range(P.top_level + 1):
        up = client.encrypt_to_bytes(x, level=level)
        ct = server.deserialize(up, level=level, scale=P.scale)
        full = server.serialize(ct)
        assert len(up) < 0.52 * len(full)  # c0 and a 32-byte seed instead of c0 and c1
        assert server.serialize(server.deserialize(full)) == full
        np.testing.assert_allclose(client.decrypt(ct), x, atol=1e-6)
    raw = server.multiply(ct, ct, rescale=False, relinearize=False)
    blob = server.serialize(raw)
    assert server.serialize(server.deserialize(blob, size=3)) == blob
    # residues take their prime's width: 60 + 40 + 40 bits per coefficient at level 2
    assert len(full) == 24 + 2 * P.poly_modulus_degree * (60 + 40 + 40) // 8


def _flip(blob: bytes, pos: int, bit: int = 0) -> bytes:
    b = bytearray(blob)
    b[pos] ^= 1 << bit
    return bytes(b)


def test_ciphertext_validation(pair):
    client, server = pair
    ct = client.encrypt(np.ones(10), level=1)
    blob = server.serialize(ct)
    head = struct.Struct("<4sBBBB8sd")
    magic, version, flags, size, level, tag, scale = head.unpack_from(blob)
    bad = {
        "empty": b"",
        "short": blob[:10],
        "truncated": blob[:-1],
        "extended": blob + b"\0",
        "oversized": blob + bytes(len(blob)),
        "magic": _flip(blob, 0),
        "version": head.pack(magic, 2, flags, size, level, tag, scale) + blob[head.size :],
        "flags": head.pack(magic, version, 6, size, level, tag, scale) + blob[head.size :],
        "seeded flag": head.pack(magic, version, 1, size, level, tag, scale) + blob[head.size :],
        "size": head.pack(magic, version, flags, 9, level, tag, scale) + blob[head.size :],
        "level": head.pack(magic, version, flags, size, 7, tag, scale) + blob[head.size :],
        "other level": head.pack(magic, version, flags, size, 2, tag, scale) + blob[head.size :],
        "tag": _flip(blob, 10),
        "nan scale": head.pack(magic, version, flags, size, level, tag, float("nan")) + blob[head.size :],
        "zero scale": head.pack(magic, version, flags, size, level, tag, 0.0) + blob[head.size :],
        "huge scale": head.pack(magic, version, flags, size, level, tag, 2.0**200) + blob[head.size :],
        "residue >= q": blob[: head.size] + b"\xff" * 8 + blob[head.size + 8 :],
        "junk": b"\x5a" * len(blob),
    }
    for name, data in bad.items():
        with pytest.raises(CiphertextError):
            server.deserialize(data)
            pytest.fail(name)
    for kw in ({"level": 0}, {"size": 3}, {"scale": 2.0 * P.scale}):
        with pytest.raises(CiphertextError):
            server.deserialize(blob, **kw)
    with pytest.raises(CiphertextError):
        server.deserialize("text")
    other = make_backend(PROTECTED_PARAMS, "native")
    with pytest.raises(CiphertextError, match="parameter set"):
        other.deserialize(blob)


def test_bit_flip_fuzz_never_crashes(pair):
    """Every single-bit flip in the header and a sample over the residues: either refused with
    CiphertextError or accepted as a well-formed ciphertext of this set."""
    client, server = pair
    blob = client.encrypt_to_bytes(np.ones(4), level=0)
    rng = np.random.default_rng(5)
    positions = list(range(24)) + list(rng.integers(24, len(blob), 200))
    accepted = 0
    for pos in positions:
        for bit in (0, 7) if pos >= 24 else range(8):
            try:
                ct = server.deserialize(_flip(blob, int(pos), bit))
            except CiphertextError:
                continue
            accepted += 1
            assert server.level(ct) == 0 and server.size(ct) == 2
    assert accepted > 100  # flips inside residues mostly stay below the prime


def test_key_material_validation(pair):
    client, _ = pair
    mat = client.export_public_material()
    fresh = lambda: make_backend(P, "native", allow_test_backends=True)  # noqa: E731
    cases = {
        "params": dataclasses.replace(mat, params_id=PROTECTED_PARAMS.id),
        "junk pk": dataclasses.replace(mat, public_key=b"junk" * 10),
        "truncated galois": dataclasses.replace(mat, galois_keys=mat.galois_keys[:-5]),
        "missing step": dataclasses.replace(mat, rotation_steps=(*mat.rotation_steps, 7)),
        "extra key": dataclasses.replace(mat, rotation_steps=mat.rotation_steps[:-1]),
        "duplicate step": dataclasses.replace(mat, rotation_steps=(*mat.rotation_steps, mat.rotation_steps[0])),
        "bad step": dataclasses.replace(mat, rotation_steps=(0,)),
        "relin as galois": dataclasses.replace(mat, galois_keys=mat.relin_keys),
        "galois as relin": dataclasses.replace(mat, relin_keys=mat.galois_keys),
        "no galois bytes": dataclasses.replace(mat, galois_keys=b""),
        "galois without steps": dataclasses.replace(mat, rotation_steps=()),
        "residue >= q": dataclasses.replace(mat, relin_keys=mat.relin_keys[:64] + b"\xff" * 16 + mat.relin_keys[80:]),
    }
    for name, m in cases.items():
        with pytest.raises(KeyMaterialError):
            fresh().import_public_material(m)
            pytest.fail(name)
    with pytest.raises(KeyMaterialError):
        fresh().import_public_material("not material")
    ok = fresh()
    ok.import_public_material(mat)
    assert ok.rotation_steps == tuple(sorted(STEPS)) and not ok.has_secret_key


def test_packing_is_exact_at_every_width():
    import torch

    from veil.crypto.native.context import RnsContext

    ctx = RnsContext(P)
    rng = np.random.default_rng(6)
    primes = ctx.data_primes
    x = torch.from_numpy(np.stack([[rng.integers(0, q, ctx.n) for q in primes] for _ in range(2)]))
    x[..., 0] = torch.tensor(primes) - 1
    buf = serial.pack(x, primes)
    assert len(buf) == 2 * ctx.n * sum(q.bit_length() for q in primes) // 8
    assert torch.equal(serial.unpack(buf, 2, primes, ctx.n, ctx.device), x)


@pytest.mark.skipif(not bitpack_cpu.available(), reason="the C kernels are not built here")
@pytest.mark.parametrize("n", [8, 24, 16384])
def test_bit_packing_kernel_equals_its_numpy_twin(n):
    """The C packer and unpacker give the twin's bytes and values at every width 1..64 (runs of
    several widths one after another, as a ciphertext's limbs are), and count the same values
    not below their bound."""
    rng = np.random.default_rng(n)
    widths = np.array([*range(1, 65), 57, 55, 36, 36], dtype=np.int32)
    top = np.array([(1 << int(w)) - 1 for w in widths], dtype=np.uint64)
    values = (rng.integers(0, 2**63, (widths.size, n), dtype=np.uint64) * np.uint64(2)
              + rng.integers(0, 2, (widths.size, n), dtype=np.uint64)) & top[:, None]
    values[:, 0] = top  # all ones at every width
    buf = bitpack_cpu.pack_runs(values, widths)
    assert buf == bitpack._pack_numpy(values, widths)
    assert len(buf) == n * int(widths.sum()) // 8
    bounds = np.maximum(top >> np.uint64(1), np.uint64(1))  # about half of each row lies above
    got, bad = bitpack_cpu.unpack_runs(buf, n, widths, bounds)
    want, want_bad = bitpack._unpack_numpy(buf, n, widths, bounds)
    assert np.array_equal(got, values) and np.array_equal(want, values)
    assert bad == want_bad == int((values >= bounds[:, None]).sum()) > 0
    assert bitpack_cpu.unpack_runs(buf, n, widths, None)[1] == 0

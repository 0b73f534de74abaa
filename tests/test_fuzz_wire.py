"""Property-based fuzzing (hypothesis) of every wire deserializer and of the ciphertext and key
parsers: arbitrary bytes, arbitrary msgpack structures and mutated valid messages must either
decode or raise the module's own validation error (WireError, CiphertextError,
KeyMaterialError) — never another exception, never a crash or a hang of the process.

The ciphertext parser runs on the test-only N=8192 set (the parsing code is the same for every
set; this keeps key generation fast)."""

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from veil.crypto.backend import CiphertextError, KeyMaterialError
from veil.crypto.params import TEST_PARAMS_ID, get_params
from veil.crypto.seal.backend import SealBackend
from veil.crypto.wire import HiddenReply, HiddenStep, WireError
from veil.protected.protocol import (
    CtPayload,
    ProtectedMessage,
    public_material_from_bytes,
    public_material_to_bytes,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
P = get_params(TEST_PARAMS_ID, allow_test_params=True)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
                    st.text(max_size=20), st.binary(max_size=64))
values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=5),
                                                      st.dictionaries(st.text(max_size=10), kids, max_size=6)),
                      max_leaves=20)
FIELDS = ["v", "session", "step", "kind", "tensor", "positions", "layer", "position", "params", "cts", "dtype",
          "shape", "data", "tag", "level", "count", "token", "public_key", "relin_keys", "galois_keys", "rotation_steps"]
# maps built from the real field names, so the fuzzer reaches past the first checks
messages = st.dictionaries(st.sampled_from(FIELDS), values, max_size=10).map(
    lambda d: {**d, "v": d.get("v", 1)})


def _decoders():
    return [
        lambda b: HiddenStep.from_bytes(b, max_bytes=1 << 20, hidden_size=8, max_tokens=16),
        lambda b: HiddenReply.from_bytes(b, max_bytes=1 << 20),
        lambda b: ProtectedMessage.from_bytes(b, max_bytes=1 << 20),
        lambda b: public_material_from_bytes(b, max_bytes=1 << 20),
    ]


@FUZZ
@given(st.binary(max_size=512))
def test_wire_decoders_on_arbitrary_bytes(data):
    for decode in _decoders():
        try:
            decode(data)
        except WireError:
            pass


@FUZZ
@given(messages)
def test_wire_decoders_on_arbitrary_maps(msg):
    data = msgpack.packb(msg, use_bin_type=True)
    for decode in _decoders():
        try:
            decode(data)
        except WireError:
            pass


def _valid_protected() -> bytes:
    return ProtectedMessage("weights", "s" * 22, 3, 12, 5, (CtPayload("softmax_w", 6, b"\x01" * 40),),
                            "ckks-n16384-l7-v1").to_bytes()


@FUZZ
@given(st.data())
def test_protected_decoder_on_mutated_messages(data):
    raw = bytearray(_valid_protected())
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(raw)))
    try:
        ProtectedMessage.from_bytes(bytes(raw[:cut]), max_bytes=1 << 20)
    except WireError:
        pass


@pytest.fixture(scope="module")
def seal_pair():
    client = SealBackend(P)
    client.generate_keys([1])
    server = SealBackend(P)
    server.import_public_material(client.export_public_material())
    ct = client.encrypt_to_bytes(np.arange(8, dtype=float), level=1)
    return client, server, ct


@pytest.mark.parametrize("form", ["packed", "rounded"])
def test_ciphertext_parser_on_mutations(seal_pair, form):
    """Bit flips, byte overwrites, truncations and extensions of a valid serialized ciphertext:
    the packed upload form, and the rounded download form (``crypto/rounding.py``)."""
    _, server, good = seal_pair
    if form == "rounded":
        flooded = server.rerandomize(server.deserialize(good, level=1))
        good = server.serialize(flooded, noise_log2=float(np.log2(server.scale(flooded))) - 18)

    @FUZZ
    @given(st.data())
    def run(data):
        raw = bytearray(good)
        kind = data.draw(st.sampled_from(["flip", "overwrite", "truncate", "extend", "header"]))
        if kind == "flip":
            for _ in range(data.draw(st.integers(1, 16))):
                i = data.draw(st.integers(0, len(raw) - 1))
                raw[i] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "overwrite":
            i = data.draw(st.integers(0, len(raw) - 1))
            chunk = data.draw(st.binary(min_size=1, max_size=64))
            raw[i:i + len(chunk)] = chunk
        elif kind == "truncate":
            raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
        elif kind == "extend":
            raw += data.draw(st.binary(min_size=1, max_size=256))
        else:  # the 16-byte SEAL header: magic, version, compression, size
            i = data.draw(st.integers(0, 15))
            raw[i] = data.draw(st.integers(0, 255))
        try:
            server.deserialize(bytes(raw), level=1)
        except CiphertextError:
            pass

    run()


@FUZZ
@given(st.binary(max_size=2048))
def test_ciphertext_parser_on_arbitrary_bytes(data):
    server = _server_only()
    try:
        server.deserialize(data)
    except CiphertextError:
        pass


_SERVER: list = []


def _server_only() -> SealBackend:
    if not _SERVER:
        _SERVER.append(SealBackend(P))
    return _SERVER[0]


def test_key_import_on_mutated_material(seal_pair):
    """Truncated, flipped or swapped key blobs are refused with KeyMaterialError."""
    client, _, _ = seal_pair
    good = client.export_public_material()
    wire = public_material_to_bytes(good)
    assert public_material_from_bytes(wire, max_bytes=len(wire)) == good
    import dataclasses

    for level in ("4", 1.5, True):  # the relinearization key's level is an integer or absent
        wire_bad = public_material_to_bytes(dataclasses.replace(good, relin_level=level))
        with pytest.raises(WireError, match="relin_level"):
            public_material_from_bytes(wire_bad, max_bytes=len(wire_bad))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def run(data):
        from dataclasses import replace

        field = data.draw(st.sampled_from(["public_key", "relin_keys", "galois_keys"]))
        blob = bytearray(getattr(good, field))
        kind = data.draw(st.sampled_from(["flip", "truncate", "swap"]))
        if kind == "flip":
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] ^= 0xFF
        elif kind == "truncate":
            blob = blob[: data.draw(st.integers(0, len(blob) - 1))]
        else:
            other = data.draw(st.sampled_from([f for f in ("public_key", "relin_keys", "galois_keys") if f != field]))
            blob = bytearray(getattr(good, other))
        server = SealBackend(P)
        bad = replace(good, **{field: bytes(blob)})
        if kind == "flip":  # may land where SEAL cannot tell (compressed padding): no crash is the property
            try:
                server.import_public_material(bad)
            except KeyMaterialError:
                pass
        else:  # a truncated blob, or another key type's blob, is always refused
            with pytest.raises(KeyMaterialError):
                server.import_public_material(bad)

    run()


def test_public_material_levels_are_validated():
    """``rotation_levels``: one integer per rotation step, or none at all (every key full)."""
    from veil.crypto.backend import PublicMaterial

    mat = PublicMaterial("p", b"pk", b"rk", b"gk", (1, -2), (3, 1))
    assert public_material_from_bytes(public_material_to_bytes(mat), max_bytes=1 << 20) == mat
    legacy = msgpack.unpackb(public_material_to_bytes(mat))
    del legacy["rotation_levels"]
    got = public_material_from_bytes(msgpack.packb(legacy), max_bytes=1 << 20)
    assert got.rotation_levels == () and got.key_levels(7) == {1: 7, -2: 7}
    for bad in ([3], [3, "1"], [3, True], "3,1", [0] * 5000):
        msg = msgpack.unpackb(public_material_to_bytes(mat))
        msg["rotation_levels"] = bad
        with pytest.raises(WireError):
            public_material_from_bytes(msgpack.packb(msg), max_bytes=1 << 20)

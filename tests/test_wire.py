"""Wire format units: tensor records and step messages round-trip and reject bad input."""

import dataclasses

import msgpack
import pytest
import torch

from veil.crypto.wire import HiddenReply, HiddenStep, WireError, decode_tensor, encode_tensor
from veil.protected.protocol import MAX_SPAN, CtPayload, MessageError, ProtectedMessage


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tensor_round_trip(dtype):
    t = torch.randn(3, 5).to(dtype)
    back = decode_tensor(msgpack.unpackb(msgpack.packb(encode_tensor(t))), max_elements=100)
    assert back.dtype == dtype and torch.equal(back, t)


def test_step_round_trip():
    h = torch.randn(4, 8)
    msg = HiddenStep.from_bytes(HiddenStep("s", 3, h, [5, 6, 7, 8]).to_bytes(), max_bytes=1 << 20,
                                hidden_size=8, max_tokens=16)
    assert msg.session == "s" and msg.step == 3 and msg.positions == [5, 6, 7, 8] and torch.equal(msg.hidden, h)
    reply = HiddenReply.from_bytes(HiddenReply("s", 3, h).to_bytes())
    assert torch.equal(reply.hidden, h)


@pytest.mark.parametrize("rec", [
    None, [], {"dtype": "float64", "shape": [1], "data": b"\0" * 8},
    {"dtype": "float32", "shape": [2], "data": b"\0" * 4},
    {"dtype": "float32", "shape": [-1], "data": b""},
    {"dtype": "float32", "shape": [True], "data": b"\0" * 4},
    {"dtype": "float32", "shape": [10**9], "data": b""},
    {"dtype": "float32", "shape": [1], "data": "abcd"},
])
def test_bad_tensor_records(rec):
    with pytest.raises(WireError):
        decode_tensor(rec, max_elements=1000)


def test_limits_and_kinds():
    body = HiddenStep("s", 1, torch.zeros(4, 8), [0, 1, 2, 3]).to_bytes()
    with pytest.raises(WireError):
        HiddenStep.from_bytes(body, max_bytes=10, hidden_size=8, max_tokens=16)
    with pytest.raises(WireError):
        HiddenStep.from_bytes(body, max_bytes=1 << 20, hidden_size=8, max_tokens=2)
    with pytest.raises(WireError):
        HiddenStep.from_bytes(msgpack.packb({"v": 1, "kind": "hidden", "session": 5, "step": 1}),
                              max_bytes=1 << 20, hidden_size=8, max_tokens=16)


def _span_message(count=3, tokens=None):
    tokens = range(count) if tokens is None else tokens
    cts = tuple(CtPayload("h_in", 7, bytes([i + 1]) * 4, i) for i in tokens)
    return ProtectedMessage("token", "s", 1, 2, 16, cts, "p", count=count)


def test_protected_span_round_trip():
    msg = _span_message()
    back = ProtectedMessage.from_bytes(msg.to_bytes(), max_bytes=1 << 20)
    assert back == msg and back.count == 3
    assert [c.data[0] for c in back.payloads({i: "h_in" for i in range(3)})] == [1, 2, 3]
    for wrong in ({0: "h_in", 1: "h_in"}, {i: "m" for i in range(3)}, {i: "h_in" for i in range(4)}):
        with pytest.raises(MessageError) as e:
            back.payloads(wrong)
        assert e.value.status == 400


def test_protected_span_limits():
    raw = msgpack.unpackb(_span_message().to_bytes())
    for bad in ({"count": 0}, {"count": MAX_SPAN + 1}, {"count": True}, {"count": "3"}):
        with pytest.raises(WireError):
            ProtectedMessage.from_bytes(msgpack.packb({**raw, **bad}), max_bytes=1 << 20)
    # a ciphertext for a position outside the span, twice the same position, a non-integer one
    for token in (3, -1, True, "0"):
        recs = [dict(raw["cts"][0], token=token)] + raw["cts"][1:]
        with pytest.raises(WireError):
            ProtectedMessage.from_bytes(msgpack.packb({**raw, "cts": recs}), max_bytes=1 << 20)
    recs = raw["cts"] + [raw["cts"][0]]
    with pytest.raises(WireError):
        ProtectedMessage.from_bytes(msgpack.packb({**raw, "cts": recs}), max_bytes=1 << 20)
    # a message without the fields (a one-position step) still decodes as one position
    old = {**raw, "cts": [{k: v for k, v in raw["cts"][0].items() if k != "token"}]}
    del old["count"]
    one = ProtectedMessage.from_bytes(msgpack.packb(old), max_bytes=1 << 20)
    assert one.count == 1 and [c.token for c in one.payloads({0: "h_in"})] == [0]


def test_protected_verify_flag():
    msg = dataclasses.replace(_span_message(), verify=True)
    back = ProtectedMessage.from_bytes(msg.to_bytes(), max_bytes=1 << 20)
    assert back.verify and back == msg
    assert not ProtectedMessage.from_bytes(_span_message().to_bytes(), max_bytes=1 << 20).verify
    raw = msgpack.unpackb(msg.to_bytes())
    for bad in ({"verify": 1}, {"verify": "yes"}, {"kind": "weights"}):
        with pytest.raises(WireError):
            ProtectedMessage.from_bytes(msgpack.packb({**raw, **bad}), max_bytes=1 << 20)


def test_a_body_that_is_not_a_map_is_refused_before_it_is_unpacked(monkeypatch):
    """A garbage body: msgpack would read its first object and copy the whole rest into its
    ExtraData error; the first byte already says it is no message (a map). Maps of every header
    size still unpack."""
    calls = []
    real = msgpack.unpackb
    monkeypatch.setattr(msgpack, "unpackb", lambda *a, **k: calls.append(1) or real(*a, **k))
    for body in (b"", b"\x01" + b"x" * (1 << 20), msgpack.packb([1, 2]), msgpack.packb("hello")):
        with pytest.raises(WireError, match="must be a map"):
            HiddenStep.from_bytes(body, max_bytes=1 << 21, hidden_size=8, max_tokens=16)
    assert not calls
    body = HiddenStep("s", 1, torch.zeros(2, 8), [0, 1]).to_bytes()
    assert HiddenStep.from_bytes(body, max_bytes=1 << 20, hidden_size=8, max_tokens=16).session == "s"
    for header in (b"\xde\x00\x01", b"\xdf\x00\x00\x00\x01"):  # map 16, map 32 of {"v": 2}: unpacked
        with pytest.raises(WireError, match="protocol version 2"):
            HiddenStep.from_bytes(header + msgpack.packb("v") + msgpack.packb(2), max_bytes=1 << 20,
                                  hidden_size=8, max_tokens=16)
    assert len(calls) == 3

"""The wire format shared by client and server: msgpack messages, tensors as raw bytes.

Every message is a msgpack map:

    {"v": PROTOCOL_VERSION, "session": str, "step": int, "kind": str, ...kind-specific fields}

A plaintext split step ("hidden") carries hidden states as a tensor record
`{"dtype": "float32", "shape": [T, d], "data": <raw little-endian bytes>}` and the absolute
positions of its T tokens. Step ids start at 1 and increase by one per step of a session; the
server rejects replays and gaps. Decoding validates everything (types, sizes, dtype, finiteness)
and raises `WireError`, which servers answer with 400; nothing is trusted before that.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import torch

PROTOCOL_VERSION = 1
CONTENT_TYPE = "application/msgpack"

# dtype names on the wire → (torch dtype, bytes per element). Little-endian always.
_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "float32": (torch.float32, 4),
    "float16": (torch.float16, 2),
    "bfloat16": (torch.bfloat16, 2),
}
_NAMES = {dt: name for name, (dt, _) in _DTYPES.items()}


class WireError(ValueError):
    """A message that does not decode or does not validate."""


def encode_tensor(t: torch.Tensor) -> dict[str, Any]:
    t = t.detach().contiguous().cpu()
    if t.dtype not in _NAMES:
        raise WireError(f"dtype {t.dtype} cannot travel")
    raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
        raise WireError("big-endian hosts are not supported")
    return {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data": raw}


def decode_tensor(rec: Any, *, max_elements: int, ndim: int | None = None) -> torch.Tensor:
    if not isinstance(rec, dict):
        raise WireError("tensor record must be a map")
    dtype_name, shape, data = rec.get("dtype"), rec.get("shape"), rec.get("data")
    if dtype_name not in _DTYPES:
        raise WireError(f"unknown dtype {dtype_name!r}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise WireError("shape must be a list of non-negative integers")
    if ndim is not None and len(shape) != ndim:
        raise WireError(f"expected a {ndim}-d tensor, got shape {shape}")
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if n > max_elements:
        raise WireError(f"tensor of {n} elements exceeds the limit of {max_elements}")
    if not isinstance(data, bytes | bytearray):
        raise WireError("tensor data must be bytes")
    dtype, size = _DTYPES[dtype_name]
    if len(data) != n * size:
        raise WireError(f"tensor data has {len(data)} bytes, shape {shape} × {dtype_name} needs {n * size}")
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape) if n else torch.empty(shape, dtype=dtype)
    if not torch.isfinite(t).all():
        raise WireError("tensor holds NaN or infinity")
    return t


def pack(msg: dict[str, Any]) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def unpack(data: bytes, *, max_bytes: int) -> dict[str, Any]:
    if len(data) > max_bytes:
        raise WireError(f"message of {len(data)} bytes exceeds {max_bytes}")
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=max_bytes, max_str_len=1 << 16,
                              max_array_len=1 << 20, max_map_len=64)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise WireError(f"not a msgpack message: {type(e).__name__}") from None
    if not isinstance(msg, dict):
        raise WireError("message must be a map")
    if msg.get("v") != PROTOCOL_VERSION:
        raise WireError(f"protocol version {msg.get('v')!r} is not {PROTOCOL_VERSION}")
    return msg


def _int(msg: dict, key: str) -> int:
    v = msg.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise WireError(f"field {key!r} must be an integer")
    return v


@dataclass
class HiddenStep:
    """A plaintext split step: hidden states of T consecutive tokens at `positions`."""

    session: str
    step: int
    hidden: torch.Tensor  # [T, d]
    positions: list[int] = field(default_factory=list)
    kind: str = "hidden"

    def to_bytes(self) -> bytes:
        return pack({"v": PROTOCOL_VERSION, "session": self.session, "step": self.step, "kind": self.kind,
                     "tensor": encode_tensor(self.hidden), "positions": list(self.positions)})

    @classmethod
    def from_bytes(cls, data: bytes, *, max_bytes: int, hidden_size: int, max_tokens: int) -> HiddenStep:
        msg = unpack(data, max_bytes=max_bytes)
        if msg.get("kind") != "hidden":
            raise WireError(f"unexpected message kind {msg.get('kind')!r}")
        session = msg.get("session")
        if not isinstance(session, str):
            raise WireError("field 'session' must be a string")
        step = _int(msg, "step")
        hidden = decode_tensor(msg.get("tensor"), max_elements=max_tokens * hidden_size, ndim=2)
        if hidden.shape[1] != hidden_size or hidden.shape[0] == 0:
            raise WireError(f"hidden states must be [T>0, {hidden_size}], got {list(hidden.shape)}")
        positions = msg.get("positions")
        if not isinstance(positions, list) or len(positions) != hidden.shape[0] or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in positions
        ):
            raise WireError("positions must be a list of T integers")
        return cls(session, step, hidden, positions)


@dataclass
class HiddenReply:
    session: str
    step: int
    hidden: torch.Tensor

    def to_bytes(self) -> bytes:
        return pack({"v": PROTOCOL_VERSION, "session": self.session, "step": self.step, "kind": "hidden",
                     "tensor": encode_tensor(self.hidden)})

    @classmethod
    def from_bytes(cls, data: bytes, *, max_bytes: int = 1 << 30) -> HiddenReply:
        msg = unpack(data, max_bytes=max_bytes)
        t = decode_tensor(msg.get("tensor"), max_elements=max_bytes, ndim=2)
        return cls(str(msg.get("session")), _int(msg, "step"), t)


# ---------------------------------------------------------------------------------------------
# The protected path (PROTOCOL.md): ciphertext messages and the client's public key material
# ---------------------------------------------------------------------------------------------

#: Message kinds of the protected protocol; the upload kinds travel client -> server.
PROTECTED_UPLOAD_KINDS = ("token", "weights", "mlp_in", "refreshed")
PROTECTED_KINDS = (*PROTECTED_UPLOAD_KINDS, "scores", "mlp", "refresh", "final")
#: The most positions one protected message may carry (a prefill span; decode steps carry one).
#: Bounds the server's per-step work and memory: every position holds its own residual
#: ciphertexts (~2 MB at the layer-start level) while its span is in flight.
MAX_SPAN = 8
_MAX_CTS = 2 * MAX_SPAN  # the most ciphertexts a protected message may carry


@dataclass(frozen=True)
class CtPayload:
    """One serialized ciphertext with its layout tag and level (validated by the backend when
    it is deserialized: parameter set, size, level, scale)."""

    tag: str
    level: int
    data: bytes = field(repr=False)
    token: int = 0  # which position of the message's span (0 .. count-1) it belongs to


@dataclass(frozen=True)
class ProtectedMessage:
    """One message of the protected protocol, in either direction."""

    kind: str
    session_id: str
    step: int
    layer: int
    position: int
    cts: tuple[CtPayload, ...]
    params_id: str = ""
    version: int = PROTOCOL_VERSION
    count: int = 1  # positions [position, position + count): a prefill span, or one decode step

    @property
    def nbytes(self) -> int:
        return sum(len(c.data) for c in self.cts)

    def ct(self, tag: str, token: int = 0) -> CtPayload:
        for c in self.cts:
            if c.tag == tag and c.token == token:
                return c
        raise WireError(f"{self.kind} message lacks a {tag!r} ciphertext for span position {token}")

    def payloads(self, expected: dict[int, str]) -> list[CtPayload]:
        """Exactly one ciphertext per span position of ``expected`` (position -> tag) and nothing
        else, in position order; ``WireError`` otherwise."""
        cts = sorted(self.cts, key=lambda c: c.token)
        got, want = [(c.token, c.tag) for c in cts], sorted(expected.items())
        if got != want:
            raise WireError(f"{self.kind} message carries ciphertexts {got}, expected {want}")
        return cts

    def to_bytes(self) -> bytes:
        return pack({"v": self.version, "session": self.session_id, "step": self.step, "kind": self.kind,
                     "layer": self.layer, "position": self.position, "count": self.count, "params": self.params_id,
                     "cts": [{"tag": c.tag, "level": c.level, "token": c.token, "data": c.data} for c in self.cts]})

    @classmethod
    def from_bytes(cls, data: bytes, *, max_bytes: int, kinds: tuple[str, ...] = PROTECTED_KINDS) -> ProtectedMessage:
        msg = unpack(data, max_bytes=max_bytes)
        kind = msg.get("kind")
        if kind not in kinds:
            raise WireError(f"unexpected message kind {kind!r}")
        session, params = msg.get("session"), msg.get("params")
        if not isinstance(session, str) or not isinstance(params, str):
            raise WireError("fields 'session' and 'params' must be strings")
        step, layer, position = _int(msg, "step"), _int(msg, "layer"), _int(msg, "position")
        if step < 0 or layer < 0 or position < 0:
            raise WireError("step, layer and position must be non-negative")
        count = _int(msg, "count") if "count" in msg else 1
        if not 1 <= count <= MAX_SPAN:
            raise WireError(f"'count' must be 1..{MAX_SPAN} positions")
        recs = msg.get("cts")
        if not isinstance(recs, list) or not 0 < len(recs) <= _MAX_CTS:
            raise WireError(f"'cts' must be a list of 1..{_MAX_CTS} ciphertexts")
        cts = []
        for rec in recs:
            if not isinstance(rec, dict):
                raise WireError("a ciphertext record must be a map")
            tag, level, blob, token = rec.get("tag"), rec.get("level"), rec.get("data"), rec.get("token", 0)
            if not isinstance(tag, str) or not isinstance(level, int) or isinstance(level, bool) or level < 0:
                raise WireError("a ciphertext record needs a string 'tag' and a non-negative integer 'level'")
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < count:
                raise WireError(f"a ciphertext record's 'token' must be an integer in 0..{count - 1}")
            if not isinstance(blob, bytes | bytearray) or not blob:
                raise WireError("a ciphertext record's 'data' must be non-empty bytes")
            cts.append(CtPayload(tag, level, bytes(blob), token))
        if len({(c.tag, c.token) for c in cts}) != len(cts):
            raise WireError("duplicate ciphertext tags")
        return cls(kind, session, step, layer, position, tuple(cts), params, msg["v"], count)


def public_material_to_bytes(material) -> bytes:
    """The client's evaluation keys (``veil.crypto.backend.PublicMaterial``: public key, relin
    and Galois keys, never the secret key) as one msgpack map."""
    return pack({"v": PROTOCOL_VERSION, "kind": "public_material", "params": material.params_id,
                 "public_key": material.public_key, "relin_keys": material.relin_keys,
                 "galois_keys": material.galois_keys, "rotation_steps": list(material.rotation_steps)})


def public_material_from_bytes(data: bytes, *, max_bytes: int):
    from veil.crypto.backend import PublicMaterial

    msg = unpack(data, max_bytes=max_bytes)
    if msg.get("kind") != "public_material":
        raise WireError(f"unexpected message kind {msg.get('kind')!r}")
    params = msg.get("params")
    blobs = [msg.get(k) for k in ("public_key", "relin_keys", "galois_keys")]
    steps = msg.get("rotation_steps")
    if not isinstance(params, str) or not all(isinstance(b, bytes | bytearray) for b in blobs):
        raise WireError("public material needs 'params' and the three key blobs")
    if not isinstance(steps, list) or len(steps) > 4096 or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in steps):
        raise WireError("'rotation_steps' must be a list of integers")
    return PublicMaterial(params, bytes(blobs[0]), bytes(blobs[1]), bytes(blobs[2]), tuple(steps))

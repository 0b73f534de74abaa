"""The wire format shared by client and server: msgpack messages, tensors as raw bytes.

Every message is a msgpack map (the protected protocol's messages, ``veil.protected.protocol``,
use the same envelope):

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
    if not data or not (0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF)):  # fixmap, map 16, map 32
        # refused before unpacking: msgpack would read the first object and copy the whole rest
        # of a garbage body into the error it raises (ExtraData)
        raise WireError("message must be a map")
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


def int_field(msg: dict, key: str) -> int:
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
        step = int_field(msg, "step")
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
        return cls(str(msg.get("session")), int_field(msg, "step"), t)

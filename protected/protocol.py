"""The protected protocol's vocabulary, defined once for both halves (docs/PROTOCOL.md).

The server half (``veil.protected.server``) and the client half (``veil.protected.client``)
each read top to bottom and mirror each other: a server method ``on_<upload>`` answers each
upload kind, a client method ``on_<reply>`` answers each reply kind. One layer, four steps:

==========  =============================================  ==========================
 upload      the server                                     reply
==========  =============================================  ==========================
 TOKEN       starts layer ``first``: q̂ k̂ v̂, KV append, ŝ    SCORES  [ŝ/sqrt(hd), σ/d]
 WEIGHTS     weighted values, W_o, residual h'; û, σ'       MLP     [û_g, û_u, σ'/(8d)]
 MLP_IN      W_down, residual h'', masked for its refresh   REFRESH [h'' + ρ]  (FINAL [h_L])
 REFRESHED   unmasks h'', starts the next layer              SCORES
==========  =============================================  ==========================

``STEPS`` holds this table; ``EXPECT`` the upload the server waits for after each reply. After
the last layer MLP_IN is answered with FINAL, so a span of positions costs ``3n`` round trips
for ``n`` protected layers. Everything a message carries is named by a ``Tag``; ``LEVELS`` says
at which level each value travels and lives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from veil.crypto.backend import PublicMaterial
from veil.crypto.wire import PROTOCOL_VERSION, WireError, int_field, pack, unpack

__all__ = [
    "PROTOCOL_VERSION", "MAX_SPAN", "MsgKind", "Tag", "STEPS", "EXPECT", "UPLOAD_KINDS", "DECRYPTED",
    "ALLOWED_KINDS", "Levels", "LEVELS", "active_positions", "ProtocolError", "MessageError",
    "UnknownSession", "LimitExceeded", "CapacityExceeded", "DeviceBudgetExceeded", "DeviceOutOfMemory", "CtPayload", "ProtectedMessage",
    "public_material_to_bytes", "public_material_from_bytes",
]

#: The most positions one step may carry (a prefill span; a decode step carries one). Bounds the
#: server's per-step work and memory: every position holds its own residual ciphertexts (~2 MB
#: at the layer-start level) while its span is in flight.
MAX_SPAN = 8


class MsgKind:
    TOKEN = "token"  # c->s: ct(h), the input of layer `first`
    SCORES = "scores"  # s->c: ct[ŝ, σ]
    WEIGHTS = "weights"  # c->s: ct(w), the softmax weights
    MLP = "mlp"  # s->c: ct[û, σ']
    MLP_IN = "mlp_in"  # c->s: ct(m), the SwiGLU output
    REFRESH = "refresh"  # s->c: ct(h'' + ρ), masked for its refresh
    REFRESHED = "refreshed"  # c->s: ct(h'' + ρ) re-encrypted at the layer-start level
    FINAL = "final"  # s->c: ct(h_L)


class Tag:
    H_IN = "h_in"
    SCORES_SIGMA = "scores_sigma"
    SIGMA = "sigma"  # σ alone: a span position whose work ends at the last layer's KV append
    W = "softmax_w"
    U_SIGMA2 = "u_sigma2"
    M = "m"
    MASKED_H = "masked_h"
    H_REFRESHED = "h_refreshed"
    H_FINAL = "h_final"


#: upload kind -> (reply kind, what the server computes in between)
STEPS: dict[str, tuple[str, str]] = {
    MsgKind.TOKEN: (MsgKind.SCORES, "layer `first`: QKV, RoPE, KV append, scores, σ"),
    MsgKind.WEIGHTS: (MsgKind.MLP, "weighted values, W_o, residual h'; σ', W_gate|up"),
    MsgKind.MLP_IN: (MsgKind.REFRESH, "W_down, residual h'' masked for its refresh (FINAL after the last layer)"),
    MsgKind.REFRESHED: (MsgKind.SCORES, "h'' unmasked; the next layer as on TOKEN"),
}
#: reply kind -> the upload the server accepts next
EXPECT: dict[str, str] = {MsgKind.SCORES: MsgKind.WEIGHTS, MsgKind.MLP: MsgKind.MLP_IN,
                          MsgKind.REFRESH: MsgKind.REFRESHED, MsgKind.FINAL: MsgKind.TOKEN}
UPLOAD_KINDS = tuple(STEPS)
KINDS = (*UPLOAD_KINDS, *EXPECT)

#: What the client learns: the tag of each downloaded ciphertext -> the kinds of value it holds.
#: The client decrypts nothing else (its transcript is audited against this table), and the
#: masked h'' is never decoded: it is decrypted as an integer polynomial and re-encrypted.
DECRYPTED: dict[str, tuple[str, ...]] = {
    Tag.SCORES_SIGMA: ("sigma", "scores"),
    Tag.SIGMA: ("sigma",),
    Tag.U_SIGMA2: ("sigma_prime", "u_gate", "u_up"),
    Tag.MASKED_H: ("masked_h",),
    Tag.H_FINAL: ("h_final",),
}
ALLOWED_KINDS = frozenset(k for kinds in DECRYPTED.values() for k in kinds)


@dataclass(frozen=True)
class Levels:
    """Where each value lives in the modulus chain of ``ckks-n16384-l7-v2`` (docs/PROTOCOL.md,
    "Levels"): the uploads at ``h``, ``w`` and ``m``, the downloads at the ``*_download``
    levels, and the masked refresh of h'' at ``refresh``."""

    h: int = 7  # layer input (TOKEN, REFRESHED): clean and replicated
    w: int = 6  # softmax weights (WEIGHTS)
    kv: int = 5  # values (multiplied by the expanded weights at 5)
    m: int = 4  # SwiGLU output (MLP_IN)
    h_prime: int = 2  # h' and h''
    scores_download: int = 0
    mlp_download: int = 0
    final_download: int = 1

    @property
    def refresh(self) -> int:
        """h'' masked for its refresh: one product under ``h_prime`` (``Circuit.to_refresh``),
        on the largest scale whose mask this level holds."""
        return self.h_prime - 1

    @property
    def keys(self) -> int:
        """Keys are only ever used one level under the values (against q̂ switched to 4):
        stored there, each chunk is 5/6 of the bytes and needs no switch per use."""
        return self.kv - 1

    @property
    def matrices(self) -> dict[str, int]:
        """The level each product's input (and its encoded weights) sits at."""
        return {"wqkv": self.h, "wo": self.kv - 1, "wgu": self.h_prime, "wdown": self.m}


LEVELS = Levels()


def active_positions(layer: int, last: int, count: int, verify: bool = False) -> list[int]:
    """The span positions (0..count-1) that go past their KV append at ``layer`` of a protected
    range ending at ``last``: all of them, except at the last layer of a prefill span, where only
    the span's last position does (the others' outputs feed no later layer and no logits; their
    keys, values and σ are all the future needs). A verify step needs every position's h_L."""
    return list(range(count)) if layer + 1 < last or verify else [count - 1]


class ProtocolError(ValueError):
    """A message that does not fit the session's state. ``status`` is the HTTP answer: 409 for
    a state conflict (replayed or out-of-order step, wrong kind); the subclasses below for the
    rest. Whatever is raised, the session is unchanged."""

    status = 409


class MessageError(ProtocolError):
    """Malformed: wrong parameter set, level, positions or ciphertexts."""

    status = 400


class UnknownSession(ProtocolError):
    status = 404


class LimitExceeded(ProtocolError):
    """A limit of this session (context, encrypted KV cache bytes)."""

    status = 413


class CapacityExceeded(ProtocolError):
    """A limit of the whole server, here the encrypted KV cache bytes of all sessions: retry
    later, or at once where idle sessions give up what they hold. ``needed``: the bytes the
    step lacked."""

    status = 429
    code = "kv_capacity"

    def __init__(self, message: str, needed: int = 0) -> None:
        super().__init__(message)
        self.needed = needed


class DeviceBudgetExceeded(CapacityExceeded):
    """The step's working memory would take the protected path past ``--protected-device-gb``
    (the first protected layer's shuffled FFN): retry once other sessions' steps give theirs
    back, or idle sessions the W_down they hold. The step is refused before it runs."""

    code = "device_memory"  # as a key upload refused for the same budget

    def __init__(self, message: str, needed: int = 0, rows: int = 0) -> None:
        super().__init__(message, needed)
        self.rows = rows  # how many of a batch's rows the room holds (it runs them as a smaller batch)


class DeviceOutOfMemory(ProtocolError):
    """The device ran out of memory during this step: the step is dropped, retry later."""

    status = 503
    code = "device_out_of_memory"


@dataclass(frozen=True)
class CtPayload:
    """One serialized ciphertext with its tag and level (the backend validates the rest when it
    deserializes it: parameter set, size, level, scale)."""

    tag: str
    level: int
    data: bytes = field(repr=False)
    token: int = 0  # which position of the message's span (0 .. count-1) it belongs to


_MAX_CTS = 2 * MAX_SPAN  # the most ciphertexts a message may carry


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
    verify: bool = False  # TOKEN only: every position's h_L comes back (a speculative step)

    @property
    def nbytes(self) -> int:
        return sum(len(c.data) for c in self.cts)

    def payloads(self, expected: dict[int, str]) -> list[CtPayload]:
        """Exactly one ciphertext per span position of ``expected`` (position -> tag) and nothing
        else, in position order; ``MessageError`` otherwise."""
        cts = sorted(self.cts, key=lambda c: c.token)
        got, want = [(c.token, c.tag) for c in cts], sorted(expected.items())
        if got != want:
            raise MessageError(f"{self.kind} message carries ciphertexts {got}, expected {want}")
        return cts

    def to_bytes(self) -> bytes:
        msg = {"v": self.version, "session": self.session_id, "step": self.step, "kind": self.kind,
               "layer": self.layer, "position": self.position, "count": self.count, "params": self.params_id,
               "cts": [{"tag": c.tag, "level": c.level, "token": c.token, "data": c.data} for c in self.cts]}
        if self.verify:
            msg["verify"] = True
        return pack(msg)

    @classmethod
    def from_bytes(cls, data: bytes, *, max_bytes: int, kinds: tuple[str, ...] = KINDS) -> ProtectedMessage:
        msg = unpack(data, max_bytes=max_bytes)
        kind = msg.get("kind")
        if kind not in kinds:
            raise WireError(f"unexpected message kind {kind!r}")
        session, params = msg.get("session"), msg.get("params")
        if not isinstance(session, str) or not isinstance(params, str):
            raise WireError("fields 'session' and 'params' must be strings")
        step, layer, position = int_field(msg, "step"), int_field(msg, "layer"), int_field(msg, "position")
        if step < 0 or layer < 0 or position < 0:
            raise WireError("step, layer and position must be non-negative")
        count = int_field(msg, "count") if "count" in msg else 1
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
        verify = msg.get("verify", False)
        if not isinstance(verify, bool) or (verify and kind != MsgKind.TOKEN):
            raise WireError("'verify' must be a boolean, and only a token message carries it")
        return cls(kind, session, step, layer, position, tuple(cts), params, msg["v"], count, verify)


def public_material_to_bytes(material: PublicMaterial) -> bytes:
    """The client's evaluation keys (``PublicMaterial``: public key, relinearization and Galois
    keys, never the secret key) as one msgpack map: the body of ``POST /v1/keys``."""
    return pack({"v": PROTOCOL_VERSION, "kind": "public_material", "params": material.params_id,
                 "public_key": material.public_key, "relin_keys": material.relin_keys,
                 "galois_keys": material.galois_keys, "rotation_steps": list(material.rotation_steps),
                 "rotation_levels": list(material.rotation_levels), "relin_level": material.relin_level,
                 "fold_key": material.fold_key})


def public_material_from_bytes(data: bytes, *, max_bytes: int) -> PublicMaterial:
    msg = unpack(data, max_bytes=max_bytes)
    if msg.get("kind") != "public_material":
        raise WireError(f"unexpected message kind {msg.get('kind')!r}")
    params = msg.get("params")
    blobs = [msg.get(k) for k in ("public_key", "relin_keys", "galois_keys")]
    steps = msg.get("rotation_steps")
    if not isinstance(params, str) or not all(isinstance(b, bytes | bytearray) for b in blobs):
        raise WireError("public material needs 'params' and the three key blobs")
    levels = msg.get("rotation_levels", [])
    for name, vals in (("rotation_steps", steps), ("rotation_levels", levels)):
        if not isinstance(vals, list) or len(vals) > 4096 or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in vals):
            raise WireError(f"{name!r} must be a list of integers")
    if levels and len(levels) != len(steps):
        raise WireError("'rotation_levels' must name one level per rotation step")
    relin_level = msg.get("relin_level")
    if relin_level is not None and (not isinstance(relin_level, int) or isinstance(relin_level, bool)):
        raise WireError("'relin_level' must be an integer")
    fold_key = msg.get("fold_key", b"")
    if not isinstance(fold_key, bytes | bytearray):
        raise WireError("'fold_key' must be bytes")
    return PublicMaterial(params, bytes(blobs[0]), bytes(blobs[1]), bytes(blobs[2]), tuple(steps), tuple(levels),
                          relin_level, bytes(fold_key))

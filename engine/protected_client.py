"""Client half of the protected protocol: the math the client SDK runs between round trips.

Pure functions (``softmax_weights``, ``swiglu_from_u``) plus ``ProtectedClientState``, which
drives one session's messages against ``veil.engine.protected.ProtectedExecutor`` (the SDK
will wrap it in HTTP). The client holds the secret key in its backend; it decrypts exactly the
values of PROTOCOL.md's table, and each decryption is recorded in ``transcript`` with its kind
(an audit hook): ``sigma``, ``scores``, ``sigma_prime``, ``u_gate``, ``u_up``, ``masked_h``,
``h_final``. Nothing else is ever decrypted.

Per layer the client keeps ``r_j = sqrt(σ_j/d + eps)`` of every past position: the server's
values are unnormalized (``v̂_j = W_v γ h_j``), so the softmax weights it uploads are
``w_tj = p_tj / r_j``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from veil.crypto.backend import HEBackend
from veil.crypto.layouts import (
    hidden_layout,
    pack_weights,
    periodic_layout,
    unpack_mlp,
    unpack_scores,
)
from veil.crypto.wire import WireError
from veil.engine.protected import (
    LEVELS,
    MAX_SPAN,
    CtPayload,
    Levels,
    MsgKind,
    ProtectedMessage,
    ProtocolError,
    Tag,
    active_positions,
    dims_of,
)

__all__ = [
    "ALLOWED_KINDS",
    "Decryption",
    "ProtectedClientState",
    "softmax_weights",
    "swiglu_from_u",
]

#: PROTOCOL.md's table: the only kinds of value the client may decrypt.
ALLOWED_KINDS = frozenset({"sigma", "scores", "sigma_prime", "u_gate", "u_up", "masked_h", "h_final"})

_TAG_KINDS = {
    Tag.SCORES_SIGMA: ("sigma", "scores"),
    Tag.SIGMA: ("sigma",),
    Tag.U_SIGMA2: ("sigma_prime", "u_gate", "u_up"),
    Tag.MASKED_H: ("masked_h",),
    Tag.H_FINAL: ("h_final",),
}


@dataclass
class Decryption:
    """One decryption the client performed (audit record)."""

    kinds: tuple[str, ...]
    tag: str
    layer: int
    position: int
    values: np.ndarray | None = field(default=None, repr=False)  # decoded slots (None: poly)


def softmax_weights(
    sigma_over_d: float, scores_scaled: np.ndarray, r_past: list[float], eps: float
) -> tuple[np.ndarray, float]:
    """Attention weights from the decrypted statistics.

    ``scores_scaled[h, j] = <q̂_t, k̂_j>_h / sqrt(hd)`` for j <= t. Returns ``(w, r_t)`` with
    ``w[h, j] = softmax_j(ŝ/(sqrt(hd) r_t r_j))[h, j] / r_j``.
    """
    r_t = float(np.sqrt(max(sigma_over_d, 0.0) + eps))
    r = np.asarray(list(r_past) + [r_t])
    s = scores_scaled / (r_t * r[None, :])
    s = s - s.max(axis=1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=1, keepdims=True)
    return p / r[None, :], r_t


def swiglu_from_u(sigma2_over_d: float, u_gate: np.ndarray, u_up: np.ndarray, eps: float) -> np.ndarray:
    """``m = SiLU(û_g / r') ⊙ (û_u / r')`` with ``r' = sqrt(σ'/d + eps)``."""
    r = float(np.sqrt(max(sigma2_over_d, 0.0) + eps))
    g = u_gate / r
    return g / (1.0 + np.exp(-g)) * (u_up / r)


class ProtectedClientState:
    """One protected session on the client: builds uploads, decrypts downloads."""

    def __init__(self, backend: HEBackend, cfg, first: int, last: int, session_id: str, *, levels: Levels = LEVELS,
                 record_values: bool = True):
        if not backend.has_secret_key:
            raise ValueError("the client backend needs the secret key")
        self.be = backend
        self.cfg = cfg
        self.first, self.last = first, last
        self.session_id = session_id
        self.levels = levels
        self.dims = dims_of(cfg, backend.params.slot_count)
        self.eps = cfg.rms_norm_eps
        self.r: dict[int, list[float]] = {i: [] for i in range(first, last)}
        self.position = 0  # first position of the span in flight
        self.count = 1  # positions in the span
        self.step = 0
        self.transcript: list[Decryption] = []
        self.record_values = record_values  # False: the audit keeps kinds only (long sessions)
        self.bytes_up = 0
        self.bytes_down = 0
        self._pending_r: dict[int, list[float]] = {}

    # ---- helpers -----------------------------------------------------------------------------
    def _msg(self, kind: str, layer: int, cts: tuple[CtPayload, ...]) -> ProtectedMessage:
        self.step += 1
        msg = ProtectedMessage(kind, self.session_id, self.step, layer, self.position, cts, self.be.params.id,
                               count=self.count)
        self.bytes_up += msg.nbytes
        return msg

    def _decrypt(self, payload: CtPayload, layer: int, length: int | None = None) -> np.ndarray:
        kinds = _TAG_KINDS.get(payload.tag)
        if kinds is None or payload.tag == Tag.MASKED_H:
            raise ProtocolError(f"the client does not decrypt {payload.tag!r}")
        ct = self.be.deserialize(payload.data, level=payload.level)
        vec = self.be.decrypt(ct, length)
        self.transcript.append(Decryption(kinds, payload.tag, layer, self.position + payload.token,
                                          vec if self.record_values else None))
        return vec

    def active(self, layer: int) -> list[int]:
        return active_positions(layer, self.last, self.count)

    def _payloads(self, msg: ProtectedMessage, tags: dict[int, str]) -> list[CtPayload]:
        """The reply's ciphertexts, one per span position in ``tags`` with exactly that tag."""
        try:
            return msg.payloads(tags)
        except WireError as e:
            raise ProtocolError(str(e)) from None

    # ---- the protocol ------------------------------------------------------------------------
    def token_message(self, h: np.ndarray) -> ProtectedMessage:
        """Round trip 0: the inputs of layer ``first`` for the next ``len(h)`` positions (``h``:
        one row per position, at most ``MAX_SPAN``; a 1-D ``h`` is one position)."""
        rows = np.atleast_2d(h)
        if not 1 <= len(rows) <= MAX_SPAN:
            raise ValueError(f"a step carries 1..{MAX_SPAN} positions, not {len(rows)}")
        self.count = len(rows)
        cts = tuple(CtPayload(Tag.H_IN, self.levels.h,
                              self.be.encrypt_to_bytes(hidden_layout(row, self.dims.slots), level=self.levels.h), i)
                    for i, row in enumerate(rows))
        return self._msg(MsgKind.TOKEN, self.first, cts)

    def handle(self, msg: ProtectedMessage) -> ProtectedMessage | np.ndarray:
        """Process a server reply; returns the next upload, or h_L of the span's last position
        (np.ndarray) at the end."""
        if msg.session_id != self.session_id or msg.position != self.position or msg.count != self.count:
            raise ProtocolError("reply for another session or positions")
        self.bytes_down += msg.nbytes
        if msg.kind == MsgKind.SCORES:
            return self._on_scores(msg)
        if msg.kind == MsgKind.MLP:
            return self._on_mlp(msg)
        if msg.kind == MsgKind.REFRESH:
            return self._on_refresh(msg)
        if msg.kind == MsgKind.FINAL:
            (p,) = self._payloads(msg, {self.count - 1: Tag.H_FINAL})
            self._expect_level(p, self.levels.final_download)
            h = self._decrypt(p, msg.layer)[: self.dims.d]
            self.position += self.count
            return h
        raise ProtocolError(f"unexpected reply kind {msg.kind!r}")

    def _expect_level(self, p: CtPayload, level: int) -> None:
        if p.level != level:
            raise ProtocolError(f"{p.tag} at level {p.level}, expected {level}")

    def _on_scores(self, msg: ProtectedMessage) -> ProtectedMessage:
        layer, active = msg.layer, self.active(msg.layer)
        tags = {i: Tag.SCORES_SIGMA if i in active else Tag.SIGMA for i in range(self.count)}
        r_span, cts = [], []
        for p in self._payloads(msg, tags):
            self._expect_level(p, self.levels.scores_download)
            t = self.position + p.token
            vec = self._decrypt(p, layer)
            if p.tag == Tag.SIGMA:  # a span position whose work ends at this layer's KV append
                r_span.append(float(np.sqrt(max(float(vec[self.dims.sigma_slot]), 0.0) + self.eps)))
                continue
            # position t attends to every cached position and to its span predecessors
            sigma, scores = unpack_scores(self.dims, vec, t + 1)
            w, r_t = softmax_weights(sigma, scores, self.r[layer][: self.position] + r_span, self.eps)
            r_span.append(r_t)
            data = self.be.encrypt_to_bytes(pack_weights(self.dims, w), level=self.levels.w)
            cts.append(CtPayload(Tag.W, self.levels.w, data, p.token))
        self._pending_r[layer] = r_span
        return self._msg(MsgKind.WEIGHTS, layer, tuple(cts))

    def _on_mlp(self, msg: ProtectedMessage) -> ProtectedMessage:
        layer, cts = msg.layer, []
        for p in self._payloads(msg, {i: Tag.U_SIGMA2 for i in self.active(layer)}):
            self._expect_level(p, self.levels.mlp_download)
            sigma2, ug, uu = unpack_mlp(self.dims, self._decrypt(p, layer))
            m = swiglu_from_u(sigma2, ug, uu, self.eps)
            m_data = self.be.encrypt_to_bytes(periodic_layout(m, self.dims.slots), level=self.levels.m)
            cts.append(CtPayload(Tag.M, self.levels.m, m_data, p.token))
        # the span's r of this layer are final once the layer's attention is done
        r = self.r[layer]
        if len(r) == self.position:
            r.extend(self._pending_r.pop(layer))
        return self._msg(MsgKind.MLP_IN, layer, tuple(cts))

    def _on_refresh(self, msg: ProtectedMessage) -> ProtectedMessage:
        """h'' + ρ: decrypted as an integer polynomial (never decoded) and re-encrypted at the
        layer-start level; the server subtracts ρ."""
        cts = []
        for masked in self._payloads(msg, {i: Tag.MASKED_H for i in range(self.count)}):
            self._expect_level(masked, self.levels.h_prime)
            ct = self.be.deserialize(masked.data, level=masked.level)
            self.transcript.append(Decryption(("masked_h",), masked.tag, msg.layer, self.position + masked.token,
                                              None))
            h_data = self.be.refresh_reencrypt_to_bytes(ct, level=self.levels.h)
            cts.append(CtPayload(Tag.H_REFRESHED, self.levels.h, h_data, masked.token))
        return self._msg(MsgKind.REFRESHED, msg.layer, tuple(cts))

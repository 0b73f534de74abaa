"""The client half of the protected protocol: what the SDK computes between round trips.

It mirrors ``veil.protected.server`` step for step: ``token_message`` starts a span, and each
reply kind has its handler — ``on_scores`` (softmax weights), ``on_mlp`` (SwiGLU), ``on_refresh``
(re-encryption of the masked h''), ``on_final`` (h_L). The client holds the secret key; it
decrypts exactly the values ``protocol.DECRYPTED`` names, and records each decryption with its
kinds in ``transcript`` (the audit trail the tests check).

Per layer the client keeps ``r_j = sqrt(σ_j/d + eps)`` of every past position: the server's
values are unnormalized (``v̂_j = W_v γ h_j``), so the weights it uploads are ``w_tj = p_tj / r_j``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from veil.crypto.backend import HEBackend
from veil.protected.layouts import (
    dims_of,
    hidden_layout,
    pack_weights,
    periodic_layout,
    unpack_mlp,
    unpack_scores,
    unpack_sigma,
)
from veil.protected.protocol import (
    DECRYPTED,
    LEVELS,
    MAX_SPAN,
    CtPayload,
    Levels,
    MsgKind,
    ProtectedMessage,
    ProtocolError,
    Tag,
    active_positions,
)

__all__ = ["Decryption", "HeadroomExceeded", "ProtectedClientState", "softmax_weights", "swiglu_from_u"]

#: How close to its ceiling a decrypted level-0 slot may come, in bits. Level 0 decrypts a slot
#: correctly only while |value| < q0 / (2 scale) (2^20 with ckks-n16384-l7-v2); past it the value
#: wraps around and nothing in it says so. The shipped model's downloads stay under 2^18.1 on
#: real text (benchmarks/download_ranges.py), so a slot within half a bit of the ceiling means a
#: model or input whose values may already have wrapped: the client stops instead of computing
#: on them. A value that wraps lands near -ceiling (up to ~1.29x the ceiling this catches it).
LEVEL0_MARGIN_BITS = 0.5


class HeadroomExceeded(ValueError):
    """A level-0 download came within ``LEVEL0_MARGIN_BITS`` of the level's ceiling."""


@dataclass
class Decryption:
    """One decryption the client performed (audit record)."""

    kinds: tuple[str, ...]
    tag: str
    layer: int
    position: int
    values: np.ndarray | None = field(default=None, repr=False)  # decoded slots (None: poly)


def softmax_weights(sigma_over_d: float, scores_scaled: np.ndarray, r_past: list[float],
                    eps: float) -> tuple[np.ndarray, float]:
    """Attention weights from the decrypted statistics: ``scores_scaled[h, j] = <q̂_t, k̂_j>_h /
    sqrt(hd)`` for j <= t. Returns ``(w, r_t)`` with ``w[h, j] = softmax_j(ŝ/(sqrt(hd) r_t
    r_j))[h, j] / r_j``."""
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

    def __init__(self, backend: HEBackend, cfg, first: int, last: int, session_id: str, *,
                 levels: Levels = LEVELS, record_values: bool = True):
        if not backend.has_secret_key:
            raise ValueError("the client backend needs the secret key")
        self.be, self.cfg = backend, cfg
        self.first, self.last = first, last
        self.session_id = session_id
        self.levels = levels
        self.dims = dims_of(cfg, backend.params.slot_count)
        self.eps = cfg.rms_norm_eps
        self.r: dict[int, list[float]] = {i: [] for i in range(first, last)}
        self.position = 0  # first position of the span in flight
        self.count = 1  # positions in the span
        self.verify = False  # the span in flight is a verify step
        self.last_span = 0  # first position of the last finished span (how far rollback may go)
        self.step = 0
        self.transcript: list[Decryption] = []
        self.record_values = record_values  # False: the audit keeps kinds only (long sessions)
        self.bytes_up = self.bytes_down = 0
        self._pending_r: dict[int, list[float]] = {}

    # ---- the steps -----------------------------------------------------------------------------
    def token_message(self, h: np.ndarray, verify: bool = False) -> ProtectedMessage:
        """The inputs of layer ``first`` for the next ``len(h)`` positions (one row each, at most
        ``MAX_SPAN``; a 1-D ``h`` is one position). ``verify``: every position's h_L comes back
        (a speculative step; ``rollback`` then takes rejected positions back)."""
        rows = np.atleast_2d(h)
        if not 1 <= len(rows) <= MAX_SPAN:
            raise ValueError(f"a step carries 1..{MAX_SPAN} positions, not {len(rows)}")
        self.count, self.verify = len(rows), verify
        lv = self.levels.h
        cts = tuple(CtPayload(Tag.H_IN, lv, self.be.encrypt_to_bytes(hidden_layout(row, self.dims.slots), lv), i)
                    for i, row in enumerate(rows))
        return self._upload(MsgKind.TOKEN, self.first, cts)

    def handle(self, msg: ProtectedMessage) -> ProtectedMessage | np.ndarray:
        """Process a server reply: the next upload, or h_L of the span's last position at the end."""
        if msg.session_id != self.session_id or msg.position != self.position or msg.count != self.count:
            raise ProtocolError("reply for another session or positions")
        if msg.params_id != self.be.params.id:  # as the server checks every upload's
            raise ProtocolError(f"reply under parameter set {msg.params_id!r}, the session's is {self.be.params.id!r}")
        on = {MsgKind.SCORES: self.on_scores, MsgKind.MLP: self.on_mlp, MsgKind.REFRESH: self.on_refresh,
              MsgKind.FINAL: self.on_final}.get(msg.kind)
        if on is None:
            raise ProtocolError(f"unexpected reply kind {msg.kind!r}")
        self.bytes_down += msg.nbytes
        return on(msg)

    def on_scores(self, msg: ProtectedMessage) -> ProtectedMessage:
        """SCORES -> WEIGHTS: σ and the scores of each active position give its softmax weights;
        the positions that end at the last layer's KV append send σ alone (for their r)."""
        layer, active = msg.layer, active_positions(msg.layer, self.last, self.count, self.verify)
        tags = {i: Tag.SCORES_SIGMA if i in active else Tag.SIGMA for i in range(self.count)}
        r_span, cts = [], []
        for p in self._downloads(msg, tags, self.levels.scores_download):
            t = self.position + p.token
            vec = self._decrypt(p, layer)
            if p.tag == Tag.SIGMA:
                r_span.append(float(np.sqrt(max(unpack_sigma(self.dims, vec), 0.0) + self.eps)))
                continue
            # position t attends to every cached position and to its span predecessors
            sigma, scores = unpack_scores(self.dims, vec, t + 1)
            w, r_t = softmax_weights(sigma, scores, self.r[layer][: self.position] + r_span, self.eps)
            r_span.append(r_t)
            data = self.be.encrypt_to_bytes(pack_weights(self.dims, w), self.levels.w)
            cts.append(CtPayload(Tag.W, self.levels.w, data, p.token))
        self._pending_r[layer] = r_span
        return self._upload(MsgKind.WEIGHTS, layer, tuple(cts))

    def on_mlp(self, msg: ProtectedMessage) -> ProtectedMessage:
        """MLP -> MLP_IN: σ' and û give m = SiLU(û_g/r') ⊙ (û_u/r')."""
        layer, cts = msg.layer, []
        tags = dict.fromkeys(active_positions(layer, self.last, self.count, self.verify), Tag.U_SIGMA2)
        for p in self._downloads(msg, tags, self.levels.mlp_download):
            sigma2, ug, uu = unpack_mlp(self.dims, self._decrypt(p, layer))
            m = swiglu_from_u(sigma2, ug, uu, self.eps)
            data = self.be.encrypt_to_bytes(periodic_layout(m, self.dims.slots), self.levels.m)
            cts.append(CtPayload(Tag.M, self.levels.m, data, p.token))
        r = self.r[layer]  # the span's r of this layer are final once its attention is done
        if len(r) == self.position:
            r.extend(self._pending_r.pop(layer))
        return self._upload(MsgKind.MLP_IN, layer, tuple(cts))

    def on_refresh(self, msg: ProtectedMessage) -> ProtectedMessage:
        """REFRESH -> REFRESHED: h'' + ρ decrypted as an integer polynomial (never decoded) and
        re-encrypted at the layer-start level; the server subtracts ρ. A folded refresh is that
        polynomial's even part g(Y), re-encrypted as g(X²) (h'' + ρ is a polynomial in X²)."""
        cts = []
        for p in self._downloads(msg, dict.fromkeys(range(self.count), Tag.MASKED_H), self.levels.refresh):
            self.transcript.append(Decryption(DECRYPTED[p.tag], p.tag, msg.layer, self.position + p.token))
            if self.be.is_folded(p.data):
                data = self.be.refresh_reencrypt_folded_to_bytes(p.data, self.levels.h)
            else:
                data = self.be.refresh_reencrypt_to_bytes(self.be.deserialize(p.data, level=p.level), self.levels.h)
            cts.append(CtPayload(Tag.H_REFRESHED, self.levels.h, data, p.token))
        return self._upload(MsgKind.REFRESHED, msg.layer, tuple(cts))

    def on_final(self, msg: ProtectedMessage) -> np.ndarray:
        """FINAL: h_L of the span's last position, or of every position of a verify step (one row
        each); the span is done."""
        active = active_positions(msg.layer - 1, self.last, self.count, self.verify)
        payloads = self._downloads(msg, dict.fromkeys(active, Tag.H_FINAL), self.levels.final_download)
        rows = np.array([self._decrypt(p, msg.layer)[: self.dims.d] for p in payloads])
        self.last_span, self.position = self.position, self.position + self.count
        return rows if self.verify else rows[-1]

    def rollback(self, position: int) -> None:
        """Take back the positions from ``position`` on, inside the last verify step's span (the
        drafts the client rejected): the server undoes them on the next TOKEN, which starts at
        ``position``; the client forgets their r_j."""
        if not (self.verify and self.last_span <= position <= self.position):
            raise ValueError(f"position {position} is not inside the last verify step's span")
        self.position = position
        for r in self.r.values():
            del r[position:]

    # ---- helpers -------------------------------------------------------------------------------
    def _upload(self, kind: str, layer: int, cts: tuple[CtPayload, ...]) -> ProtectedMessage:
        self.step += 1
        msg = ProtectedMessage(kind, self.session_id, self.step, layer, self.position, cts, self.be.params.id,
                               count=self.count, verify=self.verify and kind == MsgKind.TOKEN)
        self.bytes_up += msg.nbytes
        return msg

    def _downloads(self, msg: ProtectedMessage, tags: dict[int, str], level: int) -> list[CtPayload]:
        """The reply's ciphertexts, one per span position in ``tags`` with exactly that tag and
        at the level the protocol puts it."""
        payloads = msg.payloads(tags)
        for p in payloads:
            if p.level != level:
                raise ProtocolError(f"{p.tag} at level {p.level}, expected {level}")
        return payloads

    def _decrypt(self, p: CtPayload, layer: int) -> np.ndarray:
        if p.tag not in DECRYPTED or p.tag == Tag.MASKED_H:
            raise ProtocolError(f"the client does not decrypt {p.tag!r}")
        if self.be.is_folded(p.data):  # the ring of N/2: S/2 slots (``ring_switch``)
            vec, scale = self.be.decrypt_folded(p.data)
        else:
            ct = self.be.deserialize(p.data, level=p.level)
            vec, scale = self.be.decrypt(ct), self.be.scale(ct)
        if p.level == 0:
            ceiling = self.be.prime(0) / (2 * scale)
            top = float(np.abs(vec).max())
            if top >= ceiling * 2.0 ** -LEVEL0_MARGIN_BITS:
                raise HeadroomExceeded(
                    f"a {p.tag} download at layer {layer} holds |value| = 2^{np.log2(top):.2f}, within "
                    f"{LEVEL0_MARGIN_BITS} bit of level 0's ceiling 2^{np.log2(ceiling):.2f}: this model's "
                    "activations may overflow the protected downloads (python -m veil.benchmarks.download_ranges)")
        self.transcript.append(Decryption(DECRYPTED[p.tag], p.tag, layer, self.position + p.token,
                                          vec if self.record_values else None))
        return vec

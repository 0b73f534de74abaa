"""The encoded plaintexts every session of an executor shares: 0/1 masks, constants and RoPE
factors. They depend on no key, so one executor encodes each once (an FFT and an NTT per prime)
for all its sessions; ``Circuit`` asks for them by name, level and scale."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from veil.crypto.backend import Plaintext
from veil.protected.layouts import LayoutDims
from veil.protected.protocol import MAX_SPAN
from veil.protected.weights import rope_cos_sin

__all__ = ["Constants"]


class Constants:
    """Encoded 0/1 masks, constants and RoPE factors, shared by every session of an executor:
    they depend on no key, and encoding one costs an FFT and an NTT per prime."""

    def __init__(self, cfg, dims: LayoutDims):
        self.cfg, self.dims = cfg, dims
        self.plains: dict[tuple, Plaintext] = {}
        # RoPE's plaintexts by position: every layer of a token (or span) multiplies by the same
        # six, so the last MAX_SPAN positions' stay encoded (least recently used dropped first);
        # a batch whose rows stand at more positions than that raises the bound to their number
        self.rope_plains: OrderedDict[tuple, dict[int, list]] = OrderedDict()
        self.rope_keep = MAX_SPAN

    def get(self, be, key, make, level: int, scale: float) -> Plaintext:
        k = (key, level, scale)
        pt = self.plains.get(k)
        if pt is None:
            pt = self.plains[k] = be.encode(make(), level, scale)
        return pt

    def rope(self, be, t: int, level: int, scale: float) -> dict[int, list]:
        """RoPE of position ``t`` at ``level`` and ``scale``: lane offset (0 for q, q for k) ->
        [cos (with y), -sin on the low half-heads (with rot(y, +hd/2)), sin on the high
        half-heads (with rot(y, -hd/2))], None where all zero (sin at position 0)."""
        key = (t, level, scale)
        plains = self.rope_plains.get(key)
        if plains is not None:
            self.rope_plains.move_to_end(key)
            return plains
        hd, q = self.dims.head_dim, self.dims.qdim
        cos, sin = rope_cos_sin(self.cfg, t)
        lane = np.arange(q) % hd
        factors = (np.tile(cos, q // hd), np.where(lane < hd // 2, -np.tile(sin, q // hd), 0.0),
                   np.where(lane >= hd // 2, np.tile(sin, q // hd), 0.0))
        plains = {}
        for off, n in ((0, q), (q, self.dims.kv_dim)):
            plains[off] = []
            for vals in factors:
                v = np.zeros(self.dims.slots)
                v[off : off + n] = vals[:n]
                plains[off].append(be.encode(v, level, scale) if np.any(v) else None)
        self.rope_plains[key] = plains
        while len(self.rope_plains) > self.rope_keep:
            self.rope_plains.popitem(last=False)
        return plains

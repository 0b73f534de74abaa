"""``NativeBatch``: several sessions' ciphertexts evaluated as one, each row under its own keys.

The protected server runs the same step of the same layer for many sessions; the circuits are
written over the backend interface, so a backend whose ciphertexts are ``[B, size, L, N]``
(row b = session b) runs them for all B sessions at once. Operations without keys (additions,
ct×pt, ct×ct, rescale, the NTTs inside every key switch) are one batched computation, and a
plaintext shared by every session — a weight diagonal, a mask — is read once per batch instead
of once per session. Only the key inner product reads per-row material (``keys.RowKeys``); the
fresh encryptions of zero, flooding noise and refresh masks are drawn per row from the OS
CSPRNG like a single session's; so are a folded download's, whose fold runs for all rows at once
under each row's fold key.

The batch holds no key of its own: it refers to the rows' imported public material, so it is
cheap to build per step. ``stack`` and ``unstack`` move ciphertexts between the rows' backends
and the batch (``unstack`` copies, so a session never keeps the batch's storage alive).

The rows may also be one session's positions (``NativeBatch([be] * n)``, a prefill span's
products): the batch then holds that session's keys themselves, and the key inner product reads
each key once for all rows instead of once per row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from veil.crypto import ring_switch
from veil.crypto.backend import Ciphertext, HEError, Plaintext
from veil.crypto.native import keys as K
from veil.crypto.native.backend import NativeBackend
from veil.crypto.row_batch import RowBatch

__all__ = ["NativeBatch"]


class NativeBatch(RowBatch, NativeBackend):
    name = "native-batch"
    supports_batch = False  # a batch of batches is not a thing

    def __init__(self, rows: Sequence[NativeBackend]) -> None:  # not super().__init__: it would rebuild the tables
        rows = self._check_rows(rows, NativeBackend)
        first = rows[0]
        if any(r.device != first.device for r in rows):
            raise ValueError("a batch's rows share one device")
        self.params, self._ctx, self._encoder = first.params, first._ctx, first._encoder
        self._n, self._slots = first._n, first._slots
        self._graphs = first._graphs  # the first row's context, so its graphs
        self._sk, self._export = None, None
        self._pk = [self._require(r._pk, "public key") for r in rows]
        if all(r is first for r in rows):  # one session's span positions: its own keys, read once per batch
            self._rlk, self._gks = first._rlk, dict(first._gks)
            return
        self._rlk = K.RowKeys(tuple(r._rlk for r in rows)) if all(r._rlk is not None for r in rows) else None
        elements = set.intersection(*(set(r._gks) for r in rows))
        self._gks = {g: K.RowKeys(tuple(r._gks[g] for r in rows)) for g in elements}

    def _public_zero(self, level: int) -> torch.Tensor:
        return K.public_zeros(self._ctx, self._pk, level)  # every row's at once

    def serialize(self, ct: Ciphertext, noise_log2: float | None = None) -> list[bytes]:
        if noise_log2 is None:
            return super().serialize(ct)
        c = self._unwrap(ct)
        return self._rounded(c.data, c.level, c.scale, noise_log2)  # every row's transform at once

    def serialize_folded(self, ct: Ciphertext, noise_log2: float) -> list[bytes]:
        return self._fold_rows(ct, noise_log2)

    def serialize_folded_refresh(self, ct: Ciphertext, round_log2: float) -> list[bytes]:
        return self._fold_rows(ct, None, round_log2)

    def _fold_rows(self, ct: Ciphertext, noise_log2: float | None, round_log2: float | None = None) -> list[bytes]:
        """Every row's fold under its session's fold key in one batched pass and one copy to the
        host (``ring_switch.fold_rows``), as ``HEBackend._fold`` does for one ciphertext."""
        keys = [r._fold_key for r in self.row_backends]
        if any(k is None for k in keys):
            raise HEError("no fold key: the client's public material holds none")
        if self.level(ct) > ring_switch.TOP_LEVEL:
            ct = self.mod_switch_to(ct, ring_switch.TOP_LEVEL)
        c = self._unwrap(ct)
        if c.data.dim() != 4 or c.data.shape[1] != 2:
            raise HEError("folding takes a batch of size-2 ciphertexts")
        _, ntt = self._ctx.data(c.level)
        return ring_switch.fold_rows(self.params, keys, ntt.inverse(c.data), c.level, c.scale, noise_log2, round_log2)

    def stack(self, cts: Sequence[Ciphertext | None]) -> Ciphertext:
        if len(cts) != self.batch_size or all(ct is None for ct in cts):
            raise HEError(f"a batch of {self.batch_size} stacks one ciphertext per row")
        cs = [None if ct is None else self._unwrap(ct) for ct in cts]
        c0 = next(c for c in cs if c is not None)
        if any(c is not None and (c.data.dim() != 3 or c.data.shape != c0.data.shape or c.level != c0.level
                                  or c.scale != c0.scale) for c in cs):
            raise HEError("a batch stacks ciphertexts of one level, scale and size")
        zero = torch.zeros_like(c0.data)
        return self._wrap(torch.stack([zero if c is None else c.data for c in cs]), c0.level, c0.scale)

    def pick_rows(self, keep: Sequence[bool], ct: Ciphertext, other: Ciphertext | None = None) -> Ciphertext:
        c = self._unwrap(ct)
        o = torch.zeros_like(c.data) if other is None else self._unwrap(other).data
        if len(keep) != self.batch_size or o.shape != c.data.shape or (
                other is not None and (self._unwrap(other).level, self._unwrap(other).scale) != (c.level, c.scale)):
            raise HEError("rows are picked between ciphertexts of one batch, level and scale")
        mask = torch.tensor(list(keep), dtype=torch.bool, device=c.data.device).view(-1, *[1] * (c.data.dim() - 1))
        return self._wrap(torch.where(mask, c.data, o), c.level, c.scale)

    def unstack(self, ct: Ciphertext) -> list[Ciphertext]:
        c = self._unwrap(ct)
        return [self._wrap(row.clone(), c.level, c.scale) for row in c.data.unbind(0)]

    def stack_plain(self, pts: Sequence[Plaintext]) -> Plaintext:
        """``[B, 1, L, N]``: broadcasts against ``[B, size, L, N]``. Rows that already lie one
        after another in one tensor (encoded together, ``linear.encode_matrices``, or a stacked
        plaintext's rows given back) are taken as a view of it, not copied: the first protected
        layer's W_gate|up and W_down, shuffled for every session at every step."""
        if len(pts) != self.batch_size or len({(p.level, p.scale, p.params_id) for p in pts}) != 1 \
                or not all(isinstance(p._obj, torch.Tensor) and p._obj.dim() == 2 for p in pts):
            raise HEError("a batch stacks one encoded plaintext per row, of one level and scale")
        rows = [p._obj for p in pts]
        m = _adjacent_rows(rows)
        m = (torch.stack(rows) if m is None else m).unsqueeze(1)
        out = Plaintext(m, self.params.id, pts[0].level, pts[0].scale, m.numel() * 8)
        flags = tuple(p.nonzero for p in pts)
        if None not in flags:  # the products' all-zero check from the rows' (encode_many's), not a
            out.nonzero, out.row_nonzero = any(flags), flags  # host sync per stacked diagonal per step
        return out

    @staticmethod
    def unstack_plain(pt: Plaintext) -> list[Plaintext]:
        """Views of the rows (a row's plaintexts are read until its next step, then dropped)."""
        m = pt._obj
        rows = [Plaintext(m[b, 0], pt.params_id, pt.level, pt.scale, pt.nbytes // m.shape[0]) for b in range(m.shape[0])]
        for row, flag in zip(rows, pt.row_nonzero or (), strict=False):  # restacked at the next step
            row.nonzero = flag
        return rows


def _adjacent_rows(rows: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``torch.stack(rows)`` as a view where the rows are contiguous, of one shape, and each
    starts where the one before ends in one storage; else None."""
    first = rows[0]
    size = first.numel() * first.element_size()
    if not all(r.is_contiguous() and r.shape == first.shape and r.dtype == first.dtype
               and r.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
               and r.data_ptr() == first.data_ptr() + b * size for b, r in enumerate(rows)):
        return None
    return first.as_strided((len(rows), *first.shape), (first.numel(), *first.stride()))

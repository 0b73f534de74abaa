"""Several sessions evaluated as one (``HEBackend.batched``): the mixin a batching backend puts
before its own class. A batch's ciphertexts hold one row per session, row b under row b's keys;
the service's scheduler gathers the same step of different sessions into one (continuous
batching for HE, ``protected/batch.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from veil.crypto.backend import Ciphertext, HEBackend, HEError, Plaintext, RefreshMask

__all__ = ["RowBatch"]


class RowBatch:
    """Mixin of a backend that evaluates several sessions as one (``HEBackend.batched``): its
    ciphertexts hold one row per session; ``stack``/``unstack`` move ciphertexts between the
    sessions' backends and the batch; refresh masks hold one row per session too. Put it before
    the backend class in the bases (its ``serialize`` returns one blob per row)."""

    _rows: tuple[int, ...]
    row_backends: tuple[HEBackend, ...]
    #: a batch's rows are never batched again (a batch of batches is not a thing)
    batch_pays = False

    @property
    def batch_size(self) -> int:
        return self._rows[0]

    def _check_rows(self, rows: Sequence[HEBackend], kind: type) -> tuple[HEBackend, ...]:
        rows = tuple(rows)
        if len(rows) < 2 or not all(type(r) is kind for r in rows):
            raise ValueError(f"a batch takes two or more {kind.__name__} backends")
        if len({r.params.id for r in rows}) != 1:
            raise ValueError("a batch's rows share one parameter set")
        if any(r.has_secret_key for r in rows):
            raise ValueError("a server-side batch holds no secret key")
        self._rows, self.row_backends = (len(rows),), rows
        # the Galois steps every row holds, each at the level all of them serve
        steps = set.intersection(*(set(r._key_levels) for r in rows))
        self._key_levels = {st: min(r._key_levels[st] for r in rows) for st in sorted(steps)}
        self._relin_level = min(r.relin_level for r in rows)
        return rows

    def stack(self, cts: Sequence[Ciphertext | None]) -> Ciphertext:
        """Row b = ``cts[b]`` (one ciphertext of each row's session, same level, scale, size);
        a None row holds the exact zero ciphertext (a KV chunk a shorter session has not begun)."""
        raise NotImplementedError

    def pick_rows(self, keep: Sequence[bool], ct: Ciphertext, other: Ciphertext | None = None) -> Ciphertext:
        """Row b of ``ct`` where ``keep[b]``, else row b of ``other`` (default: the exact zero
        ciphertext): rows are independent ciphertexts, so choosing between them is free of noise
        and levels. It lets rows at different positions share a step (a rotation only some
        rows need, a block added to the chunk of some rows only)."""
        raise NotImplementedError

    def unstack(self, ct: Ciphertext) -> list[Ciphertext]:
        """Each row as a ciphertext of its own (a copy: a session never keeps the batch alive)."""
        raise NotImplementedError

    def stack_plain(self, pts: Sequence[Plaintext]) -> Plaintext:
        """One plaintext per row (e.g. each session's own permuted weights) as one operand."""
        raise NotImplementedError

    @staticmethod
    def unstack_plain(pt: Plaintext) -> list[Plaintext]:
        """The rows of a stacked plaintext (a static method: a row outlives the batch, which
        refers to every row's keys; ``protected.batch.RowOf``)."""
        raise NotImplementedError

    def stack_masks(self, masks: Sequence[RefreshMask]) -> RefreshMask:
        if len(masks) != self.batch_size or len({(m.bits, m.scale) for m in masks}) != 1:
            raise HEError("a batch stacks one refresh mask per row, of one size and scale")
        return RefreshMask(masks[0].params_id, masks[0].bits, np.stack([m.coeffs for m in masks]), masks[0].scale)

    def unstack_mask(self, mask: RefreshMask) -> list[RefreshMask]:
        return [RefreshMask(mask.params_id, mask.bits, row, mask.scale) for row in mask.coeffs]

    def serialize(self, ct: Ciphertext, noise_log2: float | None = None) -> list[bytes]:
        """One serialized ciphertext per row, in row order."""
        one = super().serialize  # bound here: zero-argument super() fails inside a comprehension
        return [one(row, noise_log2) for row in self.unstack(ct)]

    @property
    def can_fold(self) -> bool:
        return all(r.can_fold for r in self.row_backends)

    def serialize_folded(self, ct: Ciphertext, noise_log2: float) -> list[bytes]:
        """One folded download per row, each under its row's fold key."""
        return [be.serialize_folded(row, noise_log2) for be, row in zip(self.row_backends, self.unstack(ct), strict=True)]

    def serialize_folded_refresh(self, ct: Ciphertext, round_log2: float) -> list[bytes]:
        """One folded masked refresh per row, each under its row's fold key."""
        return [be.serialize_folded_refresh(row, round_log2)
                for be, row in zip(self.row_backends, self.unstack(ct), strict=True)]

    def deserialize(self, data, **kw) -> Ciphertext:
        raise HEError("a batch loads each row with its session's backend, then stacks")

"""The HE circuits of a protected layer, over the backend interface (docs/PROTOCOL.md, "Levels").

``Circuit`` is the per-step context the server evaluates with: one session's backend (its
evaluation keys, timed) plus the executor-wide encoded constants. Its methods are the pieces
of a layer in protocol order — ``qkv`` and ``kv_blocks``, ``scores``, ``sigma`` and
``scores_download`` (for SCORES), ``attention``, ``attention_residual`` and ``mlp_statistics``
(for MLP), ``residual`` and ``final`` (for REFRESH / FINAL) — and ``download`` prepares anything
that leaves. The products run through ``matvecs``, all positions of a span at once. Each
comment's trailing number is the level the value lands at on ``ckks-n16384-l7-v2``.

0/1 masks ("select"): a product with a plaintext of zeros and ones keeps some slots and cleans
the rest, at the price of one level. Its encoding error ε (~2^5.2 / plaintext scale) multiplies
whatever the cleaned slots held, so masks before a download get a large plaintext scale: the
final download's land on ``DOWNLOAD_SCALE`` (~2^56), the scores' on ``SCORE_MASK_SCALE``
(2^62) before a constant takes them to Δ, the MLP's rescales by the 55-bit q1. ε times the
folded partial sums then stays far under the flooding noise. Norm statistics (σ, σ') need no
0/1 mask: a cyclic sum puts them in every slot. Every ciphertext that leaves is re-randomized
and flooded with noise of std ``scale * 2^-FLOOD_BELOW_SCALE`` coefficient units (~2^-11.5
absolute per slot).
"""

from __future__ import annotations

import numpy as np

from veil.crypto import ring_switch
from veil.crypto.backend import Ciphertext, Plaintext
from veil.crypto.linear import (
    EncodedMatrix,
    baby_steps,
    broadcast_lane,
    matvec,
    replicate,
    rotate,
)
from veil.protected.batch import rows_of, stack_matrices
from veil.protected.constants import Constants
from veil.protected.key_levels import score_lane_groups, sum_all_steps
from veil.protected.layouts import (
    HIDDEN_FRAMES,
    SCORES_DIV,
    SIGMA_DIV,
    UPPER_BLOCK_SHIFT,
    LayoutDims,
    weights_period,
    weights_shift,
)
from veil.protected.protocol import Levels
from veil.protected.timing import TimedBackend

__all__ = ["DOWNLOAD_SCALE", "FLOOD_BELOW_SCALE", "SCORE_MASK_SCALE", "Circuit"]

DOWNLOAD_SCALE = 2.0**56
#: The score masks land on 2^62 at level 1 (then a constant takes the scores to Δ at 0): their
#: encoding error, ~2^-57 of the lane partial sums they clean, then divided by SCORES_DIV, sits
#: ~25 bits under the flooding noise (benchmarks/results/2026-11-27-scores-level0).
SCORE_MASK_SCALE = 2.0**62
#: Flooding std in coefficient units = scale * 2^-FLOOD_BELOW_SCALE (equals the parameter set's
#: flood_log2_sigma = 18 at scale 2^36).
FLOOD_BELOW_SCALE = 18.0
#: The masked refresh is not flooded; it is sent rounded to 2^-REFRESH_ROUND_BELOW_SCALE of its
#: scale (rounding error std under 2^-26 of the scale, below the noise h'' already holds). On
#: the refresh's 2^27 that is finer than the coefficients' unit, so they travel whole (112 bits).
REFRESH_ROUND_BELOW_SCALE = 24.0


def _mask(slots: int, ranges: list[tuple[int, int]], value: float = 1.0) -> np.ndarray:
    v = np.zeros(slots)
    for a, b in ranges:
        v[a:b] = value
    return v


class Circuit:
    """One step's HE evaluation under one session's keys (see the module docstring)."""

    def __init__(self, be: TimedBackend, dims: LayoutDims, levels: Levels, consts: Constants):
        self.be, self.dims, self.levels, self.consts = be, dims, levels, consts

    # ---- building blocks ---------------------------------------------------------------------
    def select(self, ct: Ciphertext, key, make, target: float | None = None) -> Ciphertext:
        """``make() ⊙ ct`` (one level), landing on scale ``target`` (default Δ); the plaintext
        is encoded once per ``key``, level and scale."""
        be = self.be
        target = be.params.scale if target is None else target
        level = be.level(ct)
        scale = target * be.prime(level) / be.scale(ct)
        return be.multiply_plain(ct, self.consts.get(be, key, make, level, scale))

    def select_rows(self, ct: Ciphertext, arg, mask_of, target: float | None = None) -> Ciphertext:
        """``select`` with the mask ``mask_of(arg) -> (key, make)``; where ``arg`` is a batch's
        per-row value (a tuple: its rows stand at different positions) each row gets the mask of
        its own value."""
        be = self.be
        target = be.params.scale if target is None else target
        level = be.level(ct)
        return be.multiply_plain(ct, self.plain_rows(arg, mask_of, level, target * be.prime(level) / be.scale(ct)))

    def plain_rows(self, arg, mask_of, level: int, scale: float) -> Plaintext:
        """The encoded ``mask_of(arg)``; for per-row ``arg`` (a tuple) the rows' own, stacked."""
        if not isinstance(arg, tuple):
            return self.consts.get(self.be, *mask_of(arg), level, scale)
        return self.be.stack_plain([self.consts.get(self.be, *mask_of(a), level, scale) for a in arg])

    def valid_blocks(self, ts: tuple[int, ...], chunk: int):
        """Blocks of ``chunk`` at or before each row's position in ``ts`` (``rows_of``: one int
        where the rows agree): the positions a score or a weight of that row may use."""
        n = self.dims.per_chunk
        return rows_of(max(0, min(n, t + 1 - chunk * n)) for t in ts)

    def first(self, n: int):
        return lambda: _mask(self.dims.slots, [(0, n)])

    def matvec(self, m: EncodedMatrix, x: Ciphertext) -> Ciphertext:
        with self.be.section("matvec", f"{m.rows}x{m.cols}@{m.level}"):
            return matvec(self.be, m, x)

    def matvecs(self, ms: EncodedMatrix | list[EncodedMatrix], xs: list[Ciphertext]) -> list[Ciphertext]:
        """``W x`` for every position of a span (``ms``: one matrix, or one per position, as the
        first protected layer's shuffled copies). Where a batch pays on the backend (a GPU), the
        positions are the rows of one batched product under the session's keys: each diagonal
        read once and every step one launch for the whole span (the prefill's products, ~70% of
        a layer's server time); elsewhere one product after another."""
        ms = list(ms) if isinstance(ms, list) else [ms] * len(xs)
        inner = self.be.inner
        if len(xs) < 2 or not inner.batch_pays:
            return [self.matvec(m, x) for m, x in zip(ms, xs, strict=True)]
        batch = self.be.sharing(type(inner).batched([inner] * len(xs)))
        m = ms[0] if all(x is ms[0] for x in ms) else stack_matrices(batch.inner, ms)
        with self.be.section("matvec", f"{m.rows}x{m.cols}@{m.level}"):
            return batch.unstack(matvec(batch, m, batch.stack(xs)))

    def rotate_blocks(self, ct: Ciphertext, blocks, steps) -> Ciphertext:
        """Move a block-0 vector into block ``blocks``: the rotation ``steps[i]`` for each bit
        ``i`` set (``LayoutDims.key_block_steps`` or ``value_block_steps``); per-row ``blocks``
        (a tuple): each bit's rotation is made for every row and kept where the row's bit is set."""
        rows = blocks if isinstance(blocks, tuple) else (blocks,)
        for i, step in enumerate(steps):
            need = [bool(b >> i & 1) for b in rows]
            if any(need):
                rot = rotate(self.be, ct, step)  # composed where a minimal key set lacks it
                ct = rot if all(need) else self.be.pick_rows(need, rot, ct)
        return ct

    def repeat_kv(self, x: Ciphertext) -> Ciphertext:
        """``x`` zero outside ``[lo, lo + kv_dim)`` -> ``group`` copies on ``[lo - (group-1)*kv_dim,
        lo + kv_dim)``, by left rotations of one step (a key the executor needs anyway)."""
        acc = cur = x
        for _ in range(self.dims.group - 1):
            cur = self.be.rotate(cur, self.dims.kv_dim)
            acc = self.be.add(acc, cur)
        return acc

    def sum_all(self, ct: Ciphertext) -> Ciphertext:
        """Cyclic sum of all slots into every slot (log2(slots) rotations): no partial sums."""
        for st in sum_all_steps(self.dims.slots):
            ct = self.be.add(ct, rotate(self.be, ct, st))
        return ct

    def download(self, ct: Ciphertext, level: int, fold: bool = False) -> bytes:
        """Switched to ``level``, re-randomized and flooded, serialized: ready to leave. ``fold``
        (``level <= ring_switch.TOP_LEVEL``): folded into the ring of N/2 first, and flooded there
        (``crypto/ring_switch.py``)."""
        be = self.be
        ct = be.mod_switch_to(ct, level) if be.level(ct) > level else ct
        flood = float(np.log2(be.scale(ct))) - FLOOD_BELOW_SCALE
        if fold:
            return be.serialize_folded(ct, flood)
        # the flooding noise is the floor: the coefficients travel rounded to the bits above it
        return be.serialize(be.rerandomize(ct, flood), noise_log2=flood)

    def _folds(self, level: int) -> bool:
        return self.be.can_fold and level <= ring_switch.TOP_LEVEL

    def folds_mlp(self) -> bool:
        """Whether the MLP download leaves folded into the ring of N/2 (``crypto/ring_switch.py``,
        half the bytes): the client sent a fold key, the download's level is one the key
        switches, and its slots ``[0, 2F]`` lie in the first half, so that the fold adds only σ'
        slots onto them."""
        return self._folds(self.levels.mlp_download) and 2 * self.dims.ffn < self.dims.slots // 2

    def folds_scores(self, chunks: int) -> bool:
        """Whether a scores download of ``chunks`` chunks leaves folded (half the bytes): the
        client sent a fold key, and its lanes stay under ``UPPER_BLOCK_SHIFT``, so that the
        blocks S/2 apart (the first half's lanes [0, 32), the second's [32, 64)) never meet."""
        return self._folds(self.levels.scores_download) and chunks <= UPPER_BLOCK_SHIFT

    def folds_refresh(self) -> bool:
        """Whether the masked refresh leaves folded (half the bytes): h'' is in the hidden layout,
        whose slots repeat every S/2 for an even frame count (a polynomial in X²), so the fold's
        even part is h'' itself."""
        return self._folds(self.levels.refresh) and HIDDEN_FRAMES % 2 == 0

    def folds_final(self) -> bool:
        """Whether h_L leaves folded: it is cleaned to ``[0, d)``, in the first half."""
        return self._folds(self.levels.final_download) and self.dims.d <= self.dims.slots // 2

    def mlp_download(self, u: Ciphertext, h_prime: Ciphertext) -> bytes:
        """The MLP download (``mlp_statistics``), folded where ``folds_mlp``: then σ' rides in every
        slot at half its value, so that the fold's sum of slot j and j + S/2 gives the client the
        same [û + σ'/(8d), σ'/(8d)] as the whole download."""
        fold = self.folds_mlp()
        return self.download(self.mlp_statistics(u, h_prime, 0.5 if fold else 1.0), self.levels.mlp_download, fold)

    def mask_for_refresh(self, h: Ciphertext):
        """h'' (2) -> (h'' + ρ at the refresh level and scale, ρ): ``to_refresh``, then the mask,
        the one ``masked_download`` needs (a polynomial in X² where the refresh folds)."""
        return self.be.mask_for_refresh(self.to_refresh(h), fold=self.folds_refresh())

    def masked_download(self, masked: Ciphertext) -> bytes:
        """A masked refresh, folded where ``folds_refresh`` (re-randomized there), else already
        re-randomized; rounded as ``REFRESH_ROUND_BELOW_SCALE`` says."""
        floor = float(np.log2(self.be.scale(masked))) - REFRESH_ROUND_BELOW_SCALE
        if self.folds_refresh():
            return self.be.serialize_folded_refresh(masked, floor)
        return self.be.serialize(masked, noise_log2=floor)

    def final_download(self, h_prime: Ciphertext, down: Ciphertext) -> bytes:
        """h_L (``final``) ready to leave, folded where ``folds_final``."""
        return self.download(self.final(h_prime, down), self.levels.final_download, self.folds_final())

    # ---- TOKEN / REFRESHED -> SCORES -----------------------------------------------------------
    def qkv(self, y: Ciphertext, t: int, want_q: bool):
        """q̂ (or None), k̂ and v̂ of position ``t`` from ``y = W_qkv h`` (h clean and replicated at
        7; y at 6, folded: y_q at [0, q), y_k at [q, q + kvd), y_v after): k̂ at [0, q), v̂ in the
        value frame, both repeated for the head slots, not yet in their block."""
        be, dims = self.be, self.dims
        hd, q, kvd = dims.head_dim, dims.qdim, dims.kv_dim
        # RoPE one level lower: q̂ and k̂ then land at the keys' level, where the scores use them,
        # its two rotations are cheaper, and their keys are the lane sums' (at 5 anyway)
        y_r = be.mod_switch_to(y, self.levels.keys + 1)
        y_up, y_dn = be.rotate_many(y_r, (hd // 2, -(hd // 2)))  # one decomposition where it hoists
        plains = self.rope(t, be.level(y_r), be.prime(be.level(y_r)))

        def rope(off: int) -> Ciphertext:
            acc = None
            for src, pt in zip((y_r, y_up, y_dn), plains[off], strict=True):
                if pt is not None:  # sin = 0 at position 0
                    prod = be.multiply_plain(src, pt, rescale=False)
                    acc = prod if acc is None else be.add(acc, prod)
            return be.rescale(acc)

        q_hat = rope(0) if want_q else None  # [0, q), 4
        # KV lanes repeated for the head slots (slot g reads KV head g % kv_heads), then moved
        # to [0, q) (keys) and to the value frame (values)
        k_hat = be.rotate(self.repeat_kv(rope(q)), kvd)  # 4
        v_lanes = lambda: _mask(dims.slots, [(q + kvd, q + 2 * kvd)])  # noqa: E731
        v_mask = self.consts.get(be, "v_lanes", v_lanes, be.level(y), be.prime(be.level(y)))
        v_hat = be.rotate(self.repeat_kv(be.multiply_plain(y, v_mask)), 2 * kvd - dims.value_offset)  # 5
        return q_hat, k_hat, v_hat

    def rope(self, t, level: int, scale: float) -> dict[int, list]:
        """``Constants.rope`` of position ``t``; of a batch's per-row positions (a tuple), each
        factor the rows' stacked (a row without it, sin at position 0, holds zeros)."""
        if not isinstance(t, tuple):
            return self.consts.rope(self.be, t, level, scale)
        self.consts.rope_keep = max(self.consts.rope_keep, len(set(t)))
        rows = [self.consts.rope(self.be, x, level, scale) for x in t]
        zero = lambda: np.zeros(self.dims.slots)  # noqa: E731
        out = {}
        for off in rows[0]:
            out[off] = []
            for k in range(len(rows[0][off])):
                pts = [r[off][k] for r in rows]
                if all(p is None for p in pts):
                    out[off].append(None)
                    continue
                pts = [self.consts.get(self.be, "zero", zero, level, scale) if p is None else p for p in pts]
                out[off].append(self.be.stack_plain(pts))
        return out

    def kv_blocks(self, k_hat: Ciphertext, v_hat: Ciphertext, t) -> tuple[Ciphertext, Ciphertext]:
        """k̂ and v̂ moved to position ``t``'s block of its chunk (key block of 1024 slots, value
        block of q slots); ``t`` per row for a batch whose rows stand at different positions."""
        dims = self.dims
        b = tuple(x % dims.per_chunk for x in t) if isinstance(t, tuple) else t % dims.per_chunk
        return self.rotate_blocks(k_hat, b, dims.key_block_steps), self.rotate_blocks(v_hat, b, dims.value_block_steps)

    def scores(self, q_hat: Ciphertext, keys: list[Ciphertext], t) -> Ciphertext:
        """ŝ_tj / sqrt(hd) for all cached j <= t, chunk c at lane c of each head (1). For a batch
        whose rows stand at different positions (``t`` a tuple) every row takes the longest
        row's chunks, its own zero-padded ones with no valid block."""
        dims, be = self.dims, self.be
        q_rep = q_hat  # q̂ at the keys' level (4), copied into every block by doubling
        for step in dims.key_block_steps:
            q_rep = be.add(q_rep, rotate(be, q_rep, step))
        ts = t if isinstance(t, tuple) else (t,)
        n_chunks = max(ts) // dims.per_chunk + 1
        valid = [self.valid_blocks(ts, c) for c in range(n_chunks)]
        # relinearized after the rescale, on one limb fewer (as the weighted values are)
        prods = [be.relinearize(be.rescale(be.multiply(q_rep, keys[c], rescale=False, relinearize=False)))
                 for c in range(n_chunks)]
        return self.lane_sums(prods, valid)  # 3 -> 0

    def lane_sums(self, prods: list[Ciphertext], valid: list[int]) -> Ciphertext:
        """Scores download from the chunk products ``q ⊙ K_c`` (3): ``Σ_lanes / (sqrt(hd) *
        SCORES_DIV)`` of chunk ``c`` at lane ``c`` of each head, every other slot zero (0).

        The 64-lane sums are shared between the chunks of a group: each chunk's product gets
        the first j halvings of its lane sum (rotations 1..2^(j-1)), a 0/1 mask keeps the lanes
        that are multiples of 2^j (2^j >= chunks in the group; also zero for positions > t:
        ``valid`` blocks) and chunk c moves to lane offset c; after adding the chunks the last
        6-j halvings (rotations 2^j..32) finish every chunk at once: lane c only ever meets lanes
        of its own residue class mod 2^j. A group of C chunks costs C*j + (C-1) + (6-j)
        rotations instead of 6C + (C-1); ``score_lane_groups`` splits the chunks into groups
        where that is cheaper, each masked on its own and joined at the download's level."""
        be, dims = self.be, self.dims
        hd, heads, slots = dims.head_dim, dims.heads, dims.slots
        log_hd = hd.bit_length() - 1
        if len(prods) > hd:
            raise ValueError(f"{len(prods)} chunks exceed {hd} lanes")  # max_positions prevents it
        groups = score_lane_groups(len(prods), log_hd)
        parts, base = [], 0
        for n, j in groups:
            kept = []
            for c in range(base, base + n):
                prod = prods[c]
                for st in range(j):
                    prod = be.add(prod, be.rotate(prod, 1 << st))

                def class_mask(v, j=j):
                    def make():
                        mask = np.zeros(slots)
                        lanes = hd * np.arange(heads)[:, None] + np.arange(0, hd, 1 << j)[None, :]
                        for b in range(v):
                            mask[dims.block_base(b) + lanes] = 1.0
                        return mask
                    return ("lane_class", j, v), make

                kept.append(self.select_rows(prod, valid[c], class_mask))
            part = kept[-1]
            for i in range(n - 2, -1, -1):  # chunk base+i at lane offset i
                part = be.add(be.rotate(part, -1), kept[i])
            for st in range(j, log_hd):
                part = be.add(part, be.rotate(part, 1 << st))

            def score_mask(n=n):  # every block: the class masks already zeroed positions > t
                mask = np.zeros(slots)
                for b in range(dims.per_chunk):
                    mask[dims.block_base(b) + hd * np.arange(heads)[:, None] + np.arange(n)[None, :]] = 1 / np.sqrt(hd)
                return mask

            parts.append(self.select(part, ("scores", n), score_mask, SCORE_MASK_SCALE))  # 1
            base += n
        scores = parts[-1]
        for i in range(len(parts) - 2, -1, -1):  # group i+1 starts groups[i][0] lanes after group i
            scores = be.add(parts[i], be.rotate(scores, -groups[i][0]))
        # from 2^62 down to Δ at the download's level by a constant (a constant polynomial: its
        # encoding error scales every slot alike and moves nothing between slots)
        return self.select(scores, "scores_div", lambda: np.full(slots, 1.0 / SCORES_DIV))  # 0

    def sigma(self, h: Ciphertext, scores: Ciphertext | None, share: float = 1.0) -> Ciphertext:
        """share · σ_t / (d * SIGMA_DIV) in every slot, added to the scores when there are any
        (0); ``share`` 1/2 where the download folds (``scores_download``)."""
        out = self.norm_statistic(self.be.mod_switch_to(h, self.levels.scores_download + 2), share)
        return out if scores is None else self.be.add(scores, out)

    def scores_download(self, h: Ciphertext, scores: Ciphertext | None, positions) -> bytes:
        """The scores download of a position (``positions``: its own, or a batch's per-row
        ones), folded where ``folds_scores``: then σ rides in every slot at half its value, so
        that the fold's sum of slot j and j + S/2 gives the client the same slots as the whole
        download."""
        top = max(positions) if isinstance(positions, tuple) else positions
        fold = self.folds_scores(self.dims.chunks(top + 1))
        return self.download(self.sigma(h, scores, 0.5 if fold else 1.0), self.levels.scores_download, fold)

    def norm_statistic(self, x: Ciphertext, share: float = 1.0) -> Ciphertext:
        """share · Σ x² / (d * SIGMA_DIV) in every slot from x clean and replicated at 2 (0): a cyclic sum
        of all slots (13 rotations, no partial sums anywhere) times a constant. A window sum of one
        period (10 rotations) needs a 0/1 mask to keep one slot, and that mask's encoding error
        times the partial sums it cleans (up to σ ~ 2^29 at the massive-activation layers)
        would spill into the other slots, 7-8 bits under the flooding noise (measured,
        benchmarks/results/2026-11-27-scores-level0); the client subtracts it where it needs the
        slots clean."""
        be = self.be
        sq = self.sum_all(be.relinearize(be.rescale(be.multiply(x, x, rescale=False, relinearize=False))))  # 1
        return self.select(sq, ("norm", share),
                           lambda: np.full(self.dims.slots, share / (self.dims.d * self.dims.copies * SIGMA_DIV)))

    # ---- WEIGHTS -> MLP ------------------------------------------------------------------------
    def expand_weights(self, w: Ciphertext, t) -> list[Ciphertext]:
        """Chunk ``c``'s softmax weights over all lanes of its value blocks (5): slot
        ``value_base(b) + hd*head_slot(h) + l`` holds ``w^h_{8c+b}``, zero in blocks past
        position ``t``, from the compact upload ``w`` (6; ``layouts.pack_weights``).

        The window of ``W`` lanes around lane ``c`` (``layouts.WEIGHTS_WINDOW``) reads the
        upload at offsets ``c mod W - W + 1 .. c mod W``; every chunk's offsets lie in ``-s..s``
        (``s = W - 1``), and the upload sits ``s`` slots late, so they are the left rotations
        of ``w`` by ``0..2s``: made once for all chunks (one hoisted decomposition where the
        backend hoists and holds the keys, the W_qkv baby steps'; a chain of steps by 1
        elsewhere), each chunk a sum of ``W`` of them times the 0/1 mask of one lane residue
        (one ``dot_plain_many`` for all chunks). Then ``log2(P/W)`` doublings per chunk fill the
        rest of its period. Against a mask and ``log2 P`` rotations per chunk this takes, at 8
        chunks, 14 rotations of ``w`` instead of 24 (measured in
        benchmarks/results/2026-11-28-weights-window)."""
        be, dims = self.be, self.dims
        hd = dims.head_dim
        ts = t if isinstance(t, tuple) else (t,)
        n_chunks = max(ts) // dims.per_chunk + 1
        # the upload's layout: every row of a batch has this period (``batch.step_key``)
        period = weights_period(n_chunks)
        if any(weights_period(x // dims.per_chunk + 1) != period for x in ts):
            raise ValueError("rows of different weights periods in one batch")
        s = weights_shift(period)
        window = s + 1
        rots = baby_steps(be, w, 2 * s + 1)  # rots[v] = rot(w, v): the offset v - s
        level, lanes = be.level(w), np.arange(hd)

        def residue_mask(valid, r):  # lanes ≡ r (mod period) of the blocks before ``valid``
            def make():
                mask = np.zeros(dims.slots)
                for b in range(valid):
                    for head in range(dims.heads):
                        mask[dims.value_base(b) + hd * head + lanes[lanes % period == r]] = 1.0
                return mask
            return ("expand", period, valid, r), make

        rows = []
        for c in range(n_chunks):
            valid = self.valid_blocks(ts, c)
            row: list[Plaintext | None] = [None] * len(rots)
            for u in range(c % window - window + 1, c % window + 1):  # the lanes ≡ c - u read lane c
                row[u + s] = self.plain_rows(valid, lambda v, r=(c - u) % period: residue_mask(v, r),
                                             level, be.prime(level))
            rows.append(row)
        return [broadcast_lane(be, be.rescale(e), c, period, start=window)  # 5
                for c, e in enumerate(be.dot_plain_many(rots, rows))]

    def attention(self, values: list[Ciphertext], w: Ciphertext, t: int) -> Ciphertext:
        """The weighted values â of position ``t`` from its softmax weights ``w`` (6): period q on
        ``[0, value_span)`` at 4, W_o's input."""
        be, dims = self.be, self.dims
        acc = None
        for c, e in enumerate(self.expand_weights(w, t)):
            # unrelinearized: the sum needs one key switch instead of one per chunk
            prod = be.multiply(e, values[c], rescale=False, relinearize=False)
            acc = prod if acc is None else be.add(acc, prod)
        a = be.relinearize(be.rescale(acc))  # 4 (relinearized one level lower: cheaper)
        st = 1
        while st < dims.value_shifts:  # shift sum: â with period q on [0, value_span)
            a = be.add(a, be.rotate(a, -dims.qdim * st))
            st *= 2
        return a

    def attention_residual(self, h: Ciphertext, o: Ciphertext) -> Ciphertext:
        """h' = h + W_o â, with ``o = W_o â`` (3, folded) cleaned and replicated: at 2, the input of
        W_gate|up and of the MLP's residual."""
        be, d = self.be, self.dims.d
        o = self.replicate_hidden(self.select(o, "first_d", self.first(d)))  # 2
        return be.add(be.mod_switch_to(h, be.level(o)), o)

    def replicate_hidden(self, x: Ciphertext) -> Ciphertext:
        """A vector in ``[0, d)`` (zero elsewhere) -> the hidden layout: copied into every frame,
        then replicated in all frames at once (their copies never cross)."""
        dims = self.dims
        return replicate(self.be, replicate(self.be, x, dims.frame, HIDDEN_FRAMES), dims.d, dims.frame_copies)

    def mlp_statistics(self, u: Ciphertext, h_prime: Ciphertext, share: float = 1.0) -> Ciphertext:
        """The MLP download from ``u = W_gate|up h'`` (1, folded; the first protected layer's under
        the position's shuffle): [û + σ'/(8d), σ'/(8d) in every other slot] at 0 (the client
        subtracts slot 2F from û); σ' times ``share`` (``mlp_download``)."""
        return self.be.add(self.select(u, "first_2f", self.first(2 * self.dims.ffn)), self.norm_statistic(h_prime, share))

    # ---- MLP_IN -> REFRESH / FINAL (after W_down m: 3, wide, partial sums outside [0, d)) -----
    def residual(self, h_prime: Ciphertext, down: Ciphertext) -> Ciphertext:
        """h'' = h' + W_down m, clean and replicated (2): the next layer's input once refreshed."""
        return self.be.add(h_prime, self.replicate_hidden(self.select(down, "first_d", self.first(self.dims.d))))

    def refresh_scale(self) -> float:
        """The scale h'' travels at in its masked refresh: the largest power of two (at most Δ)
        whose mask fits the refresh level, 2^27 on ckks-n16384-l7-v2 (a 109-bit mask in level 1's
        112 bits; at Δ = 2^36 it would need 120, level 2, 36 more bits per coefficient down)."""
        params = self.be.params
        return min(params.scale, params.max_mask_scale(self.levels.refresh))

    def to_refresh(self, h: Ciphertext) -> Ciphertext:
        """h'' (2) at the refresh level and scale (1): a plaintext of ones lands it there."""
        return self.select(h, "ones", self._ones, self.refresh_scale())

    def from_refresh(self, h: Ciphertext) -> Ciphertext:
        """The unmasked re-encryption (7, at the refresh scale) back on Δ: times the power of two
        between them as an integer plaintext, no level spent. The rounding noise of the rescale
        onto 2^27 stays in h (docs/PROTOCOL.md, "Refresh and circuit privacy": what it costs)."""
        be = self.be
        lift = be.params.scale / be.scale(h)
        if lift == 1.0:
            return h
        return be.multiply_plain(h, self.consts.get(be, "ones", self._ones, be.level(h), lift), rescale=False)

    def _ones(self) -> np.ndarray:
        return np.ones(self.dims.slots)

    def final(self, h_prime: Ciphertext, down: Ciphertext) -> Ciphertext:
        """h_L = h' + W_down m, both cleaned at the download scale (1)."""
        be, d = self.be, self.dims.d
        h_out = self.select(h_prime, "first_d", self.first(d), DOWNLOAD_SCALE)  # 1
        down = self.select(down, "first_d", self.first(d), DOWNLOAD_SCALE)  # 2
        return be.add(h_out, be.mod_switch_to(down, be.level(h_out)))

"""Choosing the layout of a product (``plan_matvec``, ``plan_packed``): a search over block
counts, strides and frame offsets, by a cost model of key switches against plaintext products."""

from __future__ import annotations

import functools

import numpy as np

from veil.crypto.linear.plan import MatvecPlan, bsgs_split


def plan_matvec(
    rows: int, cols: int, slot_count: int, layout: str = "bsgs", n1: int | None = None, frames: int = 1,
    frame_slots: int = 0,
) -> MatvecPlan:
    """Choose the slot layout of a product (see ``MatvecPlan``) for an input periodic on
    ``slot_count`` slots; ``frames > 1``: on ``slot_count`` slots of each of ``frames`` frames of
    ``frame_slots`` (a framed input, "folded" only)."""
    if rows < 1 or cols < 1:
        raise ValueError("empty matrix")
    if frames > 1:
        if layout != "folded" or frames & (frames - 1) or slot_count > frame_slots:
            raise ValueError(f"a framed input needs the folded layout, a power-of-two frame count and "
                             f"a span within the frame ({layout!r}, {frames}, {slot_count} > {frame_slots})")
        plan = _plan_framed(rows, cols, slot_count, frames, frame_slots, n1)
        if plan is None:
            raise ValueError(f"{rows}x{cols} does not fit {frames} frames of {slot_count} slots")
        return plan
    if layout == "bsgs":
        a, b = bsgs_split(cols, n1)
        plan = MatvecPlan("bsgs", rows, cols, a, b, 1, cols, 0)
        if plan.input_span > slot_count:
            raise ValueError(f"{rows}x{cols} needs {plan.input_span} slots, have {slot_count}")
        return plan
    if layout not in ("folded", "wide"):
        raise ValueError(f"unknown layout {layout!r}")
    plan = _plan_folded(rows, cols, slot_count, n1) if layout == "folded" else _plan_wide(rows, cols, slot_count, n1)
    if plan is None:
        raise ValueError(f"{rows}x{cols} does not fit {slot_count} slots")
    return plan


def _cost(rotations, plaintexts):
    # cost model: a key switch ~ 20 plaintext products (SEAL, N=16384, 7 primes)
    return 20 * rotations + plaintexts


@functools.lru_cache(maxsize=256)
def _plan_folded(rows: int, cols: int, slot_count: int, n1: int | None) -> MatvecPlan | None:
    """Search every block count and stride (vectorized over strides) for the cheapest plan."""
    best = None
    for blocks in range(1, min(cols, slot_count // rows) + 1):
        fold = 1 << (blocks - 1).bit_length()
        if blocks == 1:
            strides = np.array([rows])
        else:
            strides = np.arange(rows, (slot_count - rows) // (blocks - 1) + 1)
            if fold > blocks:  # the empty frames of the fold must read zero slots, no wrap
                strides = strides[(fold - 1) * strides + rows <= slot_count]
        if strides.size == 0:
            break
        offs = np.sort(np.arange(blocks)[None, :] * strides[:, None] % cols, axis=1)
        gaps = np.diff(np.concatenate([offs, offs[:, :1] + cols], axis=1), axis=1)
        k = gaps.max(axis=1)  # diagonals per block: the widest gap between offsets
        a, b = _bsgs_counts(k, n1)
        span = (blocks - 1) * strides + rows + a * b
        cost = _cost((a - 1) + (b - 1) + (fold.bit_length() - 1), k)
        ok = np.flatnonzero(span <= slot_count)
        if ok.size == 0:
            continue
        i = ok[np.lexsort((span[ok], cost[ok]))[0]]  # cheapest, then the shortest input span
        if best is None or cost[i] < best[0]:
            plan = MatvecPlan("folded", rows, cols, int(a[i]), int(b[i]), blocks, int(k[i]), int(strides[i]))
            best = (int(cost[i]), plan)
    return None if best is None else best[1]


def _bsgs_counts(k: np.ndarray, n1: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Baby and giant steps for ``k`` diagonals per block (vectorized ``bsgs_split``)."""
    a = np.where(k >= n1, n1, np.ceil(np.sqrt(k))) if n1 is not None else np.ceil(np.sqrt(k))
    a = a.astype(np.int64)
    return a, -(-k // a)


@functools.lru_cache(maxsize=64)
def _plan_framed(rows: int, cols: int, span: int, frames: int, frame_slots: int, n1: int | None) -> MatvecPlan | None:
    """Every block count per frame, stride and frame offset ``delta``. Offsets depend on stride
    and delta modulo ``cols`` only and the span grows with both, so each runs over one period
    (vectorized: a ``cols x cols`` grid per block count)."""
    best = None
    for per in range(1, min(cols, span // rows) + 1):
        fold = 1 << (per - 1).bit_length()
        strides = np.arange(rows, rows + cols) if per > 1 else np.array([rows])
        deltas = np.arange(cols)
        s, dl = strides[:, None, None], deltas[None, :, None]
        f = np.arange(frames)[:, None].repeat(per, 1).ravel()
        t = np.tile(np.arange(per), frames)
        offs = np.sort((f * dl + t * s) % cols, axis=-1)
        gaps = np.diff(np.concatenate([offs, offs[..., :1] + cols], axis=-1), axis=-1)
        k = gaps.max(axis=-1)  # (strides, deltas)
        a, b = _bsgs_counts(k, n1)
        s2, d2 = strides[:, None], deltas[None, :]
        local_span = (frames - 1) * d2 + (per - 1) * s2 + rows + a * b
        # the fold's empty block frames read zero slots: before the next frame's blocks, and
        # in the last frame without wrapping onto block 0
        zero_ok = ((fold - 1) * s2 + rows <= frame_slots + d2) & (
            (frames - 1) * (frame_slots + d2) + (fold - 1) * s2 + rows <= frames * frame_slots)
        ok = (local_span <= span) & zero_ok & ((frames - 1) * d2 < frame_slots)
        if not ok.any():
            continue
        cost = _cost((a - 1) + (b - 1) + (fold.bit_length() - 1) + (frames.bit_length() - 1), k)
        cand = np.flatnonzero(ok.ravel())
        i = cand[np.lexsort((local_span.ravel()[cand], cost.ravel()[cand]))[0]]
        si, di = np.unravel_index(i, k.shape)
        if best is None or cost.ravel()[i] < best[0]:
            plan = MatvecPlan("folded", rows, cols, int(a[si, di]), int(b[si, di]), frames * per, int(k[si, di]),
                              int(strides[si]), frames=frames, input_frame=frame_slots,
                              frame_stride=frame_slots + int(deltas[di]))
            best = (int(cost.ravel()[i]), plan)
    return None if best is None else best[1]


def _plan_wide(rows: int, cols: int, slot_count: int, n1: int | None) -> MatvecPlan | None:
    period = cols
    while period % 2 == 0 and period // 2 >= rows:
        period //= 2
    if period == cols:
        raise ValueError(f"{rows}x{cols}: the wide layout needs cols / 2^i >= rows for some i >= 1")
    best = None
    t = 1
    while t <= period:
        k = -(-period // t)
        stride = k + cols * max(0, -(-(cols - k) // cols))  # >= cols and == k (mod cols)
        a, b = bsgs_split(k, n1 if n1 is not None and n1 <= k else None)
        plan = MatvecPlan("wide", rows, cols, a, b, t, k, stride, period)
        if plan.input_span <= slot_count:
            cost = _cost(plan.rotations, k)
            if best is None or cost < best[0]:
                best = (cost, plan)
        t *= 2
    return None if best is None else best[1]


def plan_packed(rows: int, cols: int, slot_count: int, layout: str = "bsgs", n1: int | None = None,
                max_input_span: int | None = None, pack: int = 1, frames: int = 1) -> MatvecPlan:
    """The plan of a product whose ciphertexts hold ``pack`` positions (a power of two), each on
    a frame of ``slot_count / pack`` slots, for an input periodic on at most ``max_input_span``
    of them (``encode_matrices``); ValueError where the product does not fit a frame.
    ``frames``: the one position's input repeats every ``slot_count / frames`` slots."""
    if pack < 1 or pack & (pack - 1) or pack > slot_count:
        raise ValueError(f"pack must be a power of two up to {slot_count}, got {pack}")
    if frames > 1:
        if pack > 1:
            raise ValueError("a framed input holds one position")
        frame = slot_count // frames
        return plan_matvec(rows, cols, frame if max_input_span is None else max_input_span, layout, n1, frames, frame)
    frame = slot_count // pack
    span = frame if max_input_span is None else min(max_input_span, frame)
    return plan_matvec(rows, cols, span, layout, n1)


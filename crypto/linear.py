"""Linear algebra on CKKS slot vectors, written once over the ``HEBackend`` interface.

Everything here is backend-neutral: it calls ``encode``, ``dot_plain_many``, ``multiply_plain``,
``add``, ``rescale``, ``rotate``, ``rotate_many`` and ``can_rotate`` and nothing else, so SEAL,
the native backend and the slot-vector test double all run the same products (as Lattigo keeps
its linear transformations generic over its evaluator).

Matrix-vector products: generalized diagonals ``diag_k[j] = W[j, (j+k) % cols]`` against an
input replicated with period ``cols``; baby steps ``rot(x, b), b < n1`` from one
``rotate_many`` (a backend may hoist them; ``baby_steps`` chains them from step 1 when the
client made the compact key set), giant-step rotations ``g * n1`` pre-applied to the
plaintexts and undone by Horner's rule (every giant rotation is by ``n1``: one Galois key), so a
product costs ``n1 - 1 + n2 - 1`` rotations plus the folds of its layout (``MatvecPlan``).
Diagonals are encoded at scale ``prime(level)``, so the rescaled output keeps the input's scale.

Layout conventions (``S = params.slot_count`` slots):

* A *matrix input* of length ``cols`` is periodic: slot ``k`` holds ``x[k % cols]`` on the
  first ``plan.input_span`` slots (``replicate_input``); a server-side output that is zero
  outside ``[0, len)`` becomes one with ``replicate`` (rotations, no level).
* A matrix output of length ``rows`` sits in slots ``[0, rows)``; with the "bsgs" layout the
  other slots are zero up to noise, with "folded" and "wide" they hold partial sums.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from veil.crypto.backend import Ciphertext, HEBackend, HEError, Plaintext

__all__ = [
    "MatvecPlan",
    "plan_matvec",
    "bsgs_split",
    "EncodedMatrix",
    "encode_matrix",
    "encode_matrices",
    "plan_packed",
    "pack_inputs",
    "unpack_outputs",
    "matvec",
    "replicate",
    "replicate_input",
    "replicate_rotation_steps",
    "baby_steps",
    "broadcast_lane",
    "rotate",
    "composed_rotation",
]


@dataclass(frozen=True)
class MatvecPlan:
    """How a ``rows x cols`` product is laid out in the slots.

    ``layout="bsgs"``: one generalized diagonal per plaintext (``cols`` plaintexts), giant-step
    rotations pre-applied; the output is zero outside ``[0, rows)``.

    ``layout="folded"``: ``blocks`` groups of up to ``per_block`` diagonals share each
    plaintext: block ``t`` sits at slots ``[t*stride, t*stride + rows)``, and with the periodic
    input it sees the diagonals from offset ``o_t = t*stride mod cols`` on (``block_offsets``).
    The windows ``[o_t, o_t + per_block)`` cover all ``cols`` diagonals; each diagonal goes to
    the first block whose window holds it. ``stride = per_block`` (mod cols) gives disjoint
    windows, but any stride whose offsets leave no gap wider than ``per_block`` works, which
    lets more blocks fit: 960x576 takes 7 blocks of 84 diagonals at stride 987 (84
    plaintexts), where stride = per_block allowed only 4 blocks of 144. The blocks are summed
    by ``log2(fold_blocks)`` rotations (the blocks rounded up to a power of two; the empty
    ones read zero slots), up to three by a chain of rotations by ``stride`` (``block_folds``).
    About ``blocks`` times fewer plaintexts and multiplications and fewer rotations, but the
    output holds partial sums (garbage) outside ``[0, rows)``: use it where the result goes to
    the client, or clean it with a 0/1 ``multiply_plain`` (one level).

    ``layout="wide"`` (rows < cols, for W_down): the folded layout applied to the matrix tiled
    vertically to ``cols`` rows (row ``j`` is row ``j % row_period`` of the matrix padded to
    ``row_period`` rows, ``row_period`` = cols / 2^i >= rows), keeping only its first
    ``row_period`` diagonals, each ``cols`` slots long; ``log2(cols / row_period)`` more
    rotations by multiples of ``row_period`` add the row groups (Halevi–Shoup's hybrid method).
    Every diagonal slot then carries a weight: for 576x1536 192 plaintexts, half of what the
    folded layout needs at stride = per_block (the general-stride search of "folded" also
    reaches 192 there), with the same output layout (partial sums outside ``[0, rows)``).

    The input must be periodic (``x[k % cols]``) on slots ``[0, input_span)``.

    *Framed* input (``frames > 1``, "folded" only): the input repeats every ``input_frame``
    slots and is periodic with period ``cols`` on the first ``input_span`` slots of each frame
    (the hidden layout, ``veil.protected.layouts``). The blocks are then ``frame_blocks`` per
    frame at ``stride``, frame ``f``'s starting ``f * frame_stride`` (``frame_stride =
    input_frame + delta``: the later frames' blocks sit ``delta`` slots further into their
    frame, so that they see other diagonals than frame 0's), and ``log2(frames)`` more
    rotations by ``frame_stride`` add the frames. A block at slot ``p`` sees the diagonals from
    ``(p mod input_frame) mod cols`` on. 960x576 on two frames of 4032 whole copies takes 3
    blocks per frame at stride 960, the second frame's 96 slots further in: 96 plaintexts and 23
    rotations, where 7 blocks over 6978 slots of one period take 84 and 23.
    """

    layout: str
    rows: int
    cols: int
    n1: int
    n2: int
    blocks: int = 1
    per_block: int = 0
    stride: int = 0
    row_period: int = 0  # "wide" only
    frames: int = 1  # framed input: frames (a power of two), the slots of one, and the frame stride
    input_frame: int = 0
    frame_stride: int = 0

    @property
    def diag_len(self) -> int:
        """Slots each diagonal occupies."""
        return self.cols if self.layout == "wide" else self.rows

    @property
    def num_diagonals(self) -> int:
        return self.row_period if self.layout == "wide" else self.cols

    @property
    def row_folds(self) -> list[int]:
        """Rotation steps adding the row groups of the "wide" layout (largest first)."""
        if self.layout != "wide":
            return []
        out, h = [], self.cols // self.row_period // 2
        while h >= 1:
            out.append(h * self.row_period)
            h //= 2
        return out

    @property
    def frame_blocks(self) -> int:
        return self.blocks // self.frames

    @property
    def block_starts(self) -> list[int]:
        """First slot of each block, frame by frame."""
        return [f * self.frame_stride + t * self.stride for f in range(self.frames) for t in range(self.frame_blocks)]

    def _local(self, slot: int) -> int:
        return slot % self.input_frame if self.frames > 1 else slot

    @property
    def input_span(self) -> int:
        """Slots (of each frame, for a framed input) on which the input must be periodic."""
        return max(self._local(p) for p in self.block_starts) + self.diag_len + self.n1 * self.n2

    @property
    def fold_blocks(self) -> int:
        """``frame_blocks`` rounded up to a power of two: the fold adds this many block frames."""
        return 1 << (self.frame_blocks - 1).bit_length()

    @property
    def chains_blocks(self) -> bool:
        """Up to three blocks per frame are summed by a chain, ``y + rot(y, s) + rot(rot(y, s),
        s)`` with ``s = stride``: as many key switches as halving their power-of-two fold
        (``log2(fold_blocks)``: 1 for 2, 2 for 3), with one Galois key instead of two. From four
        blocks on the halvings take fewer (W_o's and W_down's 4: 2 against 3)."""
        return self.frame_blocks <= 3

    @property
    def block_folds(self) -> list[int]:
        """Rotation steps summing a frame's blocks onto its first: the chain's ``frame_blocks - 1``
        rotations by ``stride``, each of the one before, or the halvings (largest first), each
        of the running sum."""
        if self.chains_blocks:
            return [self.stride] * (self.frame_blocks - 1)
        return [h * self.stride for h in _halvings(self.fold_blocks)]

    @property
    def frame_folds(self) -> list[int]:
        """Rotation steps adding the frames of a framed input (largest first)."""
        return [h * self.frame_stride for h in _halvings(self.frames)]

    @property
    def block_offsets(self) -> list[int]:
        """First diagonal each block sees (``wide``: consecutive groups of ``per_block``)."""
        if self.layout == "wide":
            return [t * self.per_block for t in range(self.blocks)]
        return [self._local(p) % self.cols for p in self.block_starts]

    def diagonal_owners(self) -> list[list[int]]:
        """``owners[t][u]``: the diagonal block ``t`` carries in its ``u``-th plaintext, or -1.

        Every diagonal below ``num_diagonals`` appears exactly once."""
        n, seen = self.num_diagonals, set()
        owners = []
        for o in self.block_offsets:
            row = []
            for u in range(self.diagonals_per_block):
                k = o + u if self.layout == "wide" else (o + u) % self.cols
                if k >= n or k in seen:
                    row.append(-1)
                else:
                    seen.add(k)
                    row.append(k)
            owners.append(row)
        if len(seen) != n:
            raise ValueError("the blocks do not cover every diagonal")
        return owners

    @property
    def rotation_steps(self) -> list[int]:
        steps = set(range(1, self.n1)) | ({self.n1} if self.n2 > 1 else set())  # giant steps: Horner
        steps.update(self.block_folds, self.row_folds, self.frame_folds)
        return sorted(steps)

    def key_levels(self, level: int, chained: bool = False, composed_folds: bool = False) -> dict[int, int]:
        """Each rotation step of a product whose input sits at ``level``, with the level it
        rotates at: the baby steps rotate the input, the giant steps and folds run after the
        rescale, one level lower. ``chained``: the baby steps come from step 1 alone
        (``baby_steps``); ``composed_folds``: the folds come from the smallest, ``stride``
        (``rotate``: the fold by 2^i strides is 2^i rotations by one)."""
        folds = set(self.block_folds) - {self.stride} if composed_folds else set()
        steps = [st for st in self.rotation_steps if not (chained and 1 < st < self.n1) and st not in folds]
        return {st: level if st < self.n1 else level - 1 for st in steps}

    @property
    def rotations(self) -> int:
        """Key switches per product (baby steps included)."""
        return (self.n1 - 1) + (self.n2 - 1) + len(self.block_folds) + len(self.row_folds) + len(self.frame_folds)

    @property
    def diagonals_per_block(self) -> int:
        return self.per_block if self.layout in ("folded", "wide") else self.cols


def _halvings(n: int) -> list[int]:
    """``[n/2, n/4, ..., 1]`` for a power of two ``n`` (empty for 1)."""
    return [n >> i for i in range(1, n.bit_length())]


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


def bsgs_split(cols: int, n1: int | None = None) -> tuple[int, int]:
    """Baby/giant step counts for ``cols`` generalized diagonals: ``n1 * n2 >= cols``."""
    if cols < 1:
        raise ValueError("cols must be positive")
    if n1 is None:
        n1 = max(1, int(np.ceil(np.sqrt(cols))))
    n1 = min(n1, cols)
    n2 = -(-cols // n1)
    return n1, n2


def replicate_rotation_steps(length: int, copies: int) -> list[int]:
    """Rotation steps ``replicate(be, ct, length, copies)`` uses (all negative)."""
    if length < 1 or copies < 1:
        raise ValueError("length and copies must be positive")
    top = copies.bit_length() - 1
    steps = {-length * (1 << i) for i in range(top)}
    have = 1 << top
    for i in range(top - 1, -1, -1):
        if copies >> i & 1:
            steps.add(-length * have)
            have += 1 << i
    return sorted(steps)


def replicate_input(x: np.ndarray, slot_count: int) -> np.ndarray:
    """The matrix-input layout: slot ``k`` holds ``x[k % len(x)]``."""
    x = np.asarray(x, dtype=np.float64).ravel()
    if x.size == 0 or x.size > slot_count:
        raise ValueError(f"input length {x.size} does not fit {slot_count} slots")
    reps = -(-slot_count // x.size)
    return np.tile(x, reps)[:slot_count]


# ------------------------------------------------------------------------------------------
# Products over the interface
# ------------------------------------------------------------------------------------------


@dataclass
class EncodedMatrix:
    """A weight matrix encoded for one layout at one level (``rows x cols`` is W's shape in
    ``y = W x``): built once, used for every product. ``plaintexts[u]`` is the u-th diagonal
    plaintext of the plan (absent where all blocks are empty)."""

    params_id: str
    level: int
    plan: MatvecPlan
    plaintexts: dict[int, Plaintext] = field(repr=False)
    pack: int = 1  # positions per ciphertext: the plan is for slot_count / pack slots (``pack_inputs``)

    @property
    def rows(self) -> int:
        return self.plan.rows

    @property
    def cols(self) -> int:
        return self.plan.cols

    @property
    def nbytes(self) -> int:
        return sum(pt.nbytes for pt in self.plaintexts.values())


def _diagonals(w: np.ndarray, plan: MatvecPlan) -> np.ndarray:
    rows, cols = w.shape
    if plan.layout == "wide":
        # diagonals of the matrix padded to row_period rows and tiled to cols rows:
        # diag_k[j] = W[j % row_period, (j + k) % cols], j < cols, k < row_period
        wpad = np.zeros((plan.row_period, cols))
        wpad[:rows] = w
        j = np.arange(cols)
        return wpad[(j % plan.row_period)[None, :], (j[None, :] + np.arange(plan.row_period)[:, None]) % cols]
    j = np.arange(rows)  # diag_k[j] = W[j, (j + k) % cols], j < rows, k < cols
    return w[j[None, :], (j[None, :] + np.arange(cols)[:, None]) % cols]


@functools.lru_cache(maxsize=32)
def _diagonal_index(plan: MatvecPlan, slots: int) -> tuple[tuple[int, ...], np.ndarray]:
    """Where each slot of each diagonal plaintext reads ``W`` from: ``(keys, index)`` with
    ``index[k, slot]`` the flat position in ``W`` of plaintext ``keys[k]``'s slot (``-1``: zero).
    Found by laying out the matrix of flat positions + 1 (0 stays the padding), so it is the
    layout itself, not a second description of it."""
    w = np.arange(1, plan.rows * plan.cols + 1, dtype=np.float64).reshape(plan.rows, plan.cols)
    diags = _diagonals(w, plan)
    owners = plan.diagonal_owners()  # "bsgs": one block holding every diagonal
    keys, bufs = [], []
    for u in range(plan.diagonals_per_block):
        g = u // plan.n1
        buf = np.zeros(slots)
        for start, row in zip(plan.block_starts, owners, strict=True):
            if row[u] >= 0:  # the block pre-rotated by -g*n1 for its giant step
                start += g * plan.n1
                buf[start : start + plan.diag_len] = diags[row[u]]
        if np.any(buf):
            keys.append(u)
            bufs.append(buf)
    return tuple(keys), np.stack(bufs).astype(np.int64) - 1 if bufs else np.zeros((0, slots), np.int64)


def encode_matrix(be: HEBackend, weight: np.ndarray, level: int, n1: int | None = None, layout: str = "bsgs",
                  max_input_span: int | None = None, pack: int = 1, frames: int = 1) -> EncodedMatrix:
    """Encode the diagonals of ``weight`` for inputs at ``level``, giant-step rotations
    pre-applied. ``max_input_span``: the input is periodic on fewer slots than all of them
    (the plan must read no further). ``pack``, ``frames``: see ``encode_matrices``."""
    w = np.asarray(weight, dtype=np.float64)
    if w.ndim != 2:
        raise HEError("weight must be a 2-D matrix")
    return encode_matrices(be, w[None], level, n1, layout, max_input_span, pack, frames)[0]


def encode_matrices(be: HEBackend, weights, level: int, n1: int | None = None, layout: str = "bsgs",
                    max_input_span: int | None = None, pack: int = 1, frames: int = 1) -> list[EncodedMatrix]:
    """``encode_matrix`` for B matrices of one shape ``[B, rows, cols]`` (numpy, or a torch
    tensor where the backend encodes tensors: ``HEBackend.encodable``) in one ``encode_many``:
    the slots are gathered from each matrix by one index, and every result holds the same
    diagonals (those non-zero in any of the matrices).

    ``pack = P`` (a power of two): for ciphertexts holding P positions, position p's input on
    slots ``[p*S/P, (p+1)*S/P)`` (``pack_inputs``). The plan is made for S/P slots and each
    plaintext is its S/P-slot diagonal vector repeated P times. Every output slot of frame p
    reads input slots of frame p only (the plan never reads past its input span, at most S/P),
    so ``matvec`` runs unchanged and one product serves P positions with the rotations of one.
    The plaintexts are P-periodic, i.e. polynomials in X^P (a backend may store them in N/P
    coefficients).

    ``frames = F`` (pack 1): a framed input, the same vector in each of F frames of S/F slots,
    periodic on the first ``max_input_span`` of each (``MatvecPlan``)."""
    if weights.ndim != 3:
        raise HEError("weights must be a stack of 2-D matrices")
    batch, rows, cols = weights.shape
    try:
        plan = plan_packed(rows, cols, be.params.slot_count, layout, n1, max_input_span, pack, frames)
    except ValueError as e:
        raise HEError(str(e)) from e
    if level == 0:
        raise HEError("a matrix product needs a level to rescale into")
    keys, index = _diagonal_index(plan, be.params.slot_count // pack)
    index = np.tile(index, (1, pack))
    flat = weights.reshape(batch, rows * cols)
    if isinstance(flat, np.ndarray):
        vals = np.where(index >= 0, flat[:, np.maximum(index, 0)].astype(np.float64, copy=False), 0.0)
        nonzero = vals.any(axis=(0, 2))
    else:  # a torch tensor: gathered where it lives
        import torch

        at = torch.as_tensor(index, device=flat.device)
        vals = torch.where(at >= 0, flat[:, at.clamp(min=0)].double(), 0.0)
        nonzero = vals.ne(0).any(-1).any(0).cpu().numpy()
    if not nonzero.any():
        raise HEError("all-zero matrix")
    keep = np.flatnonzero(nonzero)
    # diagonal-major: a diagonal's B encodings come out side by side, so that a batch of
    # sessions stacks them (``RowBatch.stack_plain``) as a view where the backend allows it
    vals = vals[:, keep].swapaxes(0, 1).reshape(keep.size * batch, -1)
    pts = be.encode_many(vals, level, float(be.prime(level)))
    return [EncodedMatrix(be.params.id, level, plan, {keys[k]: pts[j * batch + b] for j, k in enumerate(keep)},
                          pack) for b in range(batch)]


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


def pack_inputs(xs: Sequence[np.ndarray], slot_count: int, pack: int) -> np.ndarray:
    """Up to ``pack`` matrix inputs in one slot vector: input p replicated (``replicate_input``)
    on its frame ``[p*S/P, (p+1)*S/P)``; missing positions are zero. A product encoded with the
    same ``pack`` leaves output p at ``p*S/P + [0, rows)``."""
    if pack < 1 or pack & (pack - 1) or not 0 < len(xs) <= pack:
        raise ValueError(f"{len(xs)} inputs for a pack of {pack}")
    frame = slot_count // pack
    out = np.zeros(slot_count)
    for p, x in enumerate(xs):
        out[p * frame : (p + 1) * frame] = replicate_input(x, frame)
    return out


def unpack_outputs(y: np.ndarray, rows: int, pack: int) -> np.ndarray:
    """``[pack, rows]``: each position's output from a decrypted packed product."""
    frame = y.size // pack
    return np.stack([y[p * frame : p * frame + rows] for p in range(pack)])


def matvec(be: HEBackend, matrix: EncodedMatrix, x: Ciphertext) -> Ciphertext:
    """``W x`` for an input periodic on ``plan.input_span`` slots; output in ``[0, rows)``."""
    if matrix.params_id != be.params.id:
        raise HEError("matrix encoded for another parameter set")
    if be.level(x) != matrix.level:
        raise HEError(f"input at level {be.level(x)}, matrix encoded for {matrix.level}")
    plan = matrix.plan
    baby = baby_steps(be, x, plan.n1)
    # every giant step's inner sum over the baby steps in one call (a backend may read each
    # baby step once for all of them); a giant step without any diagonal has none
    rows = {g: [matrix.plaintexts.get(g * plan.n1 + b) for b in range(plan.n1)] for g in range(plan.n2)}
    rows = {g: row for g, row in rows.items() if any(pt is not None for pt in row)}
    inners = dict(zip(rows, be.dot_plain_many(baby, list(rows.values())), strict=True))
    # Giant steps by Horner's rule, highest first: acc <- rot(acc, n1) + inner_g. The same
    # n2 - 1 rotations as rotating each inner_g by g * n1, but all by the one step n1, so the
    # client makes one Galois key per product for them instead of n2 - 1.
    acc = None
    for g in range(plan.n2 - 1, -1, -1):
        if acc is not None:
            acc = be.rotate(acc, plan.n1)
        if g not in inners:
            continue
        # rescale before the giant-step rotation: a key switch at level l costs ~(l+1)(l+2)
        # NTTs, so rotating one level lower is cheaper than the extra rescales
        inner = be.rescale(inners.pop(g))
        acc = inner if acc is None else be.add(acc, inner)
    if plan.chains_blocks:  # fold the blocks onto block 0: y + rot(y, s) + rot(rot(y, s), s)
        moved = acc
        for step in plan.block_folds:
            moved = be.rotate(moved, step)
            acc = be.add(acc, moved)
    else:  # halvings, composed from the stride where a key set lacks the larger ones
        for step in plan.block_folds:
            acc = be.add(acc, rotate(be, acc, step))
    for step in plan.row_folds + plan.frame_folds:  # "wide": add the row groups; framed: the frames
        acc = be.add(acc, be.rotate(acc, step))
    return acc


def rotate(be: HEBackend, x: Ciphertext, step: int) -> Ciphertext:
    """``rot(x, step)``: one key switch where the backend holds the step's key at x's level,
    else the fewest rotations by steps it does hold there (a key set that makes some steps from
    others, ``rotation_key_levels(key_set="minimal")``). Only the call sites that such a set
    plans for compose; everywhere else a missing key stays an error (``HEBackend.rotate``)."""
    level = be.level(x)
    if be.can_rotate(step, level):
        return be.rotate(x, step)
    held = tuple(st for st in be.rotation_steps if be.can_rotate(st, level))
    for st in composed_rotation(int(step), held, be.params.slot_count):
        x = be.rotate(x, st)
    return x


@functools.lru_cache(maxsize=512)
def composed_rotation(step: int, held: tuple[int, ...], slots: int, max_len: int = 8) -> tuple[int, ...]:
    """The shortest sequence of ``held`` steps that adds up to ``step`` modulo ``slots`` (a
    breadth-first search over the offsets); HEError when none of at most ``max_len`` does."""
    target = step % slots
    parent: dict[int, tuple[int, int]] = {0: (0, 0)}
    frontier = [0]
    for _ in range(max_len):
        nxt = []
        for off in frontier:
            for st in held:
                o = (off + st) % slots
                if o not in parent:
                    parent[o] = (off, st)
                    nxt.append(o)
        if target in parent:
            path = []
            while target:
                target, st = parent[target]
                path.append(st)
            return tuple(reversed(path))
        frontier = nxt
    raise HEError(f"no Galois key for rotation step {step}, nor {max_len} or fewer that add up to it")


def baby_steps(be: HEBackend, x: Ciphertext, n1: int) -> list[Ciphertext]:
    """``[rot(x, b) for b < n1]``. Where the backend holds a key for every step at x's level
    they come from one ``rotate_many`` (hoisted on the native backend); else, with a compact key
    set (``rotation_key_levels(key_set="compact")``), as a chain of rotations by 1: the same n1 - 1
    key switches from one Galois key instead of n1 - 1, none of them hoisted."""
    level = be.level(x)
    if n1 < 2:
        return [x]
    if all(be.can_rotate(b, level) for b in range(1, n1)):
        return [x, *be.rotate_many(x, range(1, n1))]
    out = [x]
    for _ in range(1, n1):
        out.append(be.rotate(out[-1], 1))
    return out


def replicate(be: HEBackend, ct: Ciphertext, length: int, copies: int) -> Ciphertext:
    """A vector in slots ``[0, length)`` (zero elsewhere) -> ``copies`` consecutive copies, by
    doubling (steps: ``replicate_rotation_steps``; composed where a key set lacks one). Uses no
    level."""
    if length < 1 or copies < 1 or length * copies > be.params.slot_count:
        raise HEError(f"{copies} copies of {length} slots do not fit {be.params.slot_count} slots")
    powers = [ct]  # powers[i]: 2^i copies in [0, 2^i * length)
    while 1 << len(powers) <= copies:
        prev = powers[-1]
        powers.append(be.add(prev, rotate(be, prev, -length * (1 << (len(powers) - 1)))))
    top = len(powers) - 1
    cur, have = powers[top], 1 << top
    for i in range(top - 1, -1, -1):
        if copies >> i & 1:
            cur = be.add(cur, rotate(be, powers[i], -length * have))
            have += 1 << i
    return cur


def broadcast_lane(be: HEBackend, e: Ciphertext, lane: int, period: int, start: int = 1) -> Ciphertext:
    """``e`` zero outside the lanes ``≡ lane (mod period)`` (``lane < period``, a power of two)
    -> every slot holds the value of that lane of its period: log2(period) doublings with
    signed steps, ``+2^i`` where bit i of ``lane`` is set, else ``-2^i``. The offsets the sums
    reach are then exactly ``[lane - period + 1, lane]``: every slot of a period reads its lane
    and nothing crosses into the next period, with no rotation to lane 0 first. ``start`` (a
    power of two): ``e`` already holds the lane's value on the aligned ``start`` lanes around it
    (the doublings below ``start`` done), and only the rest run."""
    st = start
    while st < period:
        e = be.add(e, be.rotate(e, st if lane & st else -st))
        st *= 2
    return e


def rotation_steps_of(steps: Sequence[int], slots: int) -> list[int]:
    """Rotation steps normalized to ``(-slots/2, slots/2]`` the way Galois keys name them."""
    half = slots // 2
    return sorted({s % slots if s % slots < half else s % slots - slots for s in steps})

"""Weight matrices as diagonal plaintexts of a plan (``EncodedMatrix``), and the client's side of
the slot layout: inputs replicated, packed and unpacked."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from veil.crypto.backend import HEBackend, HEError, Plaintext, ValueBounds
from veil.crypto.linear.plan import MatvecPlan
from veil.crypto.linear.planner import plan_packed


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
    # what a backend that graphs whole products names this matrix's plaintexts by, made at its
    # first product there (``native.evaluator.run_product``): the plaintexts do not change
    graph_name: object = field(default=None, init=False, repr=False, compare=False)

    @property
    def rows(self) -> int:
        return self.plan.rows

    @property
    def cols(self) -> int:
        return self.plan.cols

    @property
    def nbytes(self) -> int:
        return sum(pt.nbytes for pt in self.plaintexts.values())


@dataclass(frozen=True)
class EntryBounds:
    """What holds of a matrix's entries in any order: the largest magnitude, and a lower bound
    on the sum of squares of any ``c`` distinct entries (the ``c`` smallest squares summed). A
    copy of the matrix with its rows or columns permuted (the shuffled FFN, in a new secret order
    every step) has the same, so ``encode_matrices`` takes its diagonals' all-zero pattern and
    their encodings' checks from these instead of reading them from the device."""

    peak: float
    entries: int
    step: int  # ``smallest[i]``: the ``i * step`` smallest squares summed (kept at ~4k points)
    smallest: np.ndarray = field(repr=False)

    @classmethod
    def of(cls, w, points: int = 4096) -> EntryBounds:
        a = np.abs(np.asarray(w, dtype=np.float64)).ravel()
        # a margin for the float64 sums' rounding (at most entries * 2^-53 relative); where the
        # bound matters it clears its threshold by orders of magnitude
        sums = np.concatenate(([0.0], np.cumsum(np.sort(a * a)))) * (1 - 1e-6)
        step = max(1, a.size // points)
        return cls(float(a.max()) if a.size else 0.0, a.size, step, sums[::step].copy())

    def least_sumsq(self, distinct: np.ndarray) -> np.ndarray:
        """A lower bound on the sum of squares of vectors reading ``distinct[i]`` distinct
        entries (an entry read more than once only adds): the sums grow with ``c``, so the
        kept point at or below it."""
        if distinct.size and distinct.max() > self.entries:
            raise HEError("entry bounds of a smaller matrix")
        return self.smallest[distinct // self.step]


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


@functools.lru_cache(maxsize=32)
def _distinct_entries(plan: MatvecPlan, slots: int) -> np.ndarray:
    """How many distinct entries of ``W`` each diagonal plaintext of ``_diagonal_index`` reads."""
    return _distinct_per_row(_diagonal_index(plan, slots)[1])


def _distinct_per_row(index: np.ndarray) -> np.ndarray:
    """The distinct values >= 0 of each row of ``index``: each sorted row's changes of value.
    One sort of all rows, not ``np.unique`` per row, ten times slower in a process's first
    shuffled step (benchmarks/results/2026-12-07-bench-warmup)."""
    s = np.sort(index, axis=1)
    return (s[:, :1] >= 0).sum(1) + ((s[:, 1:] != s[:, :-1]) & (s[:, 1:] >= 0)).sum(1)


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
                    max_input_span: int | None = None, pack: int = 1, frames: int = 1,
                    entries: EntryBounds | None = None) -> list[EncodedMatrix]:
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
    periodic on the first ``max_input_span`` of each (``MatvecPlan``).

    ``entries``: bounds that hold for every matrix's entries in any order (``EntryBounds``: the
    shuffled FFN's). Where they show every diagonal nonzero, its pattern is not read from the
    device, and the encodings' checks come from them (``ValueBounds``)."""
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
    least = None if entries is None else entries.least_sumsq(_distinct_entries(plan, be.params.slot_count // pack))
    index = np.tile(index, (1, pack))
    flat = weights.reshape(batch, rows * cols)
    if isinstance(flat, np.ndarray):
        vals = np.where(index >= 0, flat[:, np.maximum(index, 0)].astype(np.float64, copy=False), 0.0)
    else:  # a torch tensor: gathered where it lives
        import torch

        from veil.kernels.host import to_device

        at = to_device(torch.from_numpy(index), flat.device)  # queued, not waited for
        vals = torch.where(at >= 0, flat[:, at.clamp(min=0)].double(), 0.0)
    if least is not None and least.all():  # each diagonal's squares sum above zero, in any order
        nonzero = np.ones(len(keys), dtype=bool)
    elif isinstance(vals, np.ndarray):
        nonzero = vals.any(axis=(0, 2))
    else:
        nonzero = vals.ne(0).any(-1).any(0).cpu().numpy()  # waits for the device
    if not nonzero.any():
        raise HEError("all-zero matrix")
    keep = np.flatnonzero(nonzero)
    # diagonal-major: a diagonal's B encodings come out side by side, so that a batch of
    # sessions stacks them (``RowBatch.stack_plain``) as a view where the backend allows it
    vals = vals[:, keep].swapaxes(0, 1).reshape(keep.size * batch, -1)
    bounds = None if least is None else ValueBounds(entries.peak, np.repeat(least[keep], batch))
    pts = be.encode_many(vals, level, float(be.prime(level)), bounds=bounds)
    return [EncodedMatrix(be.params.id, level, plan, {keys[k]: pts[j * batch + b] for j, k in enumerate(keep)},
                          pack) for b in range(batch)]


def replicate_input(x: np.ndarray, slot_count: int) -> np.ndarray:
    """The matrix-input layout: slot ``k`` holds ``x[k % len(x)]``."""
    x = np.asarray(x, dtype=np.float64).ravel()
    if x.size == 0 or x.size > slot_count:
        raise ValueError(f"input length {x.size} does not fit {slot_count} slots")
    reps = -(-slot_count // x.size)
    return np.tile(x, reps)[:slot_count]


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


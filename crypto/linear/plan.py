"""What a matrix-vector product's slot layout is (``MatvecPlan``): its blocks, baby and giant
steps, folds and the rotation keys it needs. Choosing one is ``planner.py``'s."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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


def bsgs_split(cols: int, n1: int | None = None) -> tuple[int, int]:
    """Baby/giant step counts for ``cols`` generalized diagonals: ``n1 * n2 >= cols``."""
    if cols < 1:
        raise ValueError("cols must be positive")
    if n1 is None:
        n1 = max(1, int(np.ceil(np.sqrt(cols))))
    n1 = min(n1, cols)
    n2 = -(-cols // n1)
    return n1, n2


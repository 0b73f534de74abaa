"""Slot layouts of the protected path (docs/PROTOCOL.md, "Layouts").

Pure numpy: no backend type appears here. Both halves use these functions, so the client's
packing and the server's masks agree by construction. Notation: ``d`` hidden size, ``H``
query heads of ``hd`` lanes, ``F`` MLP width, ``S`` slot count (8192 at N=16384).

Layouts (slot indices of one ciphertext):

* **hidden** (the residual stream): two frames of ``S/2`` slots, each holding ``x`` replicated
  with period ``d``, ``(S/2) // d`` whole copies (7 for d=576, 14 in all), zeros in each
  frame's tail. The slots repeat every ``S/2``, so the plaintext is a polynomial in X^2: the
  shape a refresh folded into the ring of N/2 needs (``veil.crypto.ring_switch``). The products
  that read it (W_qkv, W_gate|up) use the framed plans of ``veil.crypto.linear`` (``MatvecPlan``:
  the rotations of a plan over one period of 14 copies; W_gate|up its 288 plaintexts, W_qkv 96
  instead of 84), and the server rebuilds it from a vector in ``[0, d)`` with one rotation
  by ``S/2`` and ``linear.replicate`` (no level).
* **position blocks**: the key cache and the query replicas use blocks of ``BLOCK = 1024``
  slots, ``S // BLOCK = 8`` positions per ciphertext ("chunk"). Position ``j`` lives in chunk
  ``j // 8``, block ``j % 8``; inside a block, slot ``g*hd + i`` holds lane ``i`` of the head
  in *head slot* ``g``, the other slots are zero. The blocks of a chunk's second half
  (``j % 8 >= 4``, slots ``[S/2, S)``) start ``UPPER_BLOCK_SHIFT = 32`` slots further into their
  block (``block_base``), so that their score lanes never meet the first half's when the scores
  download folds (below). Head slots are ordered so that head
  slot ``g`` reads KV head ``g % kv_heads`` (``head_slot``: query head ``h`` of KV head
  ``h // group`` sits at slot ``(h % group) * kv_heads + h // group``): the keys and values
  of all query heads are then the ``kv_heads*hd`` KV lanes repeated ``group`` times, which
  the server makes with ``group - 1`` rotations instead of a ``group`` times taller W_k and W_v. The
  client never needs the order (softmax is per head); ``score_slot`` and ``pack_weights``
  take true head indices. The value cache uses the same chunks with the "value blocks" below.
* **value blocks**: the value cache and the expanded softmax weights pack position ``j % 8`` of
  a chunk at ``value_base(b) = (value_offset + q*b) mod S`` (``q = H*hd = 576`` slots, no gap),
  so the 8 blocks fill ``8q = 4608`` contiguous slots and ``S - 8q = 3584`` stay zero. Summing
  ``2*8 = 16`` right shifts by ``q`` (4 rotations) then leaves the block sum, i.e. the weighted
  values â, correct on 5 consecutive copies of period ``q`` (``value_copies``; the other
  shifts only pick up the zero slots); ``value_offset`` puts those copies at ``[0, 5q)``. That
  is a valid input of period ``q`` for W_o (a 576x576 product of 144 plaintexts), where blocks
  of 1024 slots (as the keys use) gave period 1024 and a zero-padded 576x1024 product of 256.
* **scores download** (level 0): ``σ/(d * SIGMA_DIV)`` in *every* slot (read at slot ``d``,
  inside block 0's zero gap), plus ``ŝ^h_{j} / (sqrt(hd) * SCORES_DIV)`` at slot
  ``block_base(j%8) + hd*head_slot(h) + j//8`` (lane = chunk index, so up to ``8*hd = 512``
  positions fit one ciphertext); the server masks every other slot's partial sums away. Up to
  ``UPPER_BLOCK_SHIFT`` chunks (256 positions) the lanes of block ``b`` and ``b + 4``, S/2
  apart, are disjoint (``[0, 32)`` and ``[32, 64)`` of each head), so the download folds into the
  ring of N/2 (slot ``j`` plus slot ``j + S/2``) losing nothing; σ then rides at half its value
  in every slot, and the folded slots carry the same ``σ/(d * SIGMA_DIV)``.
* **softmax weights upload** (compact, one ciphertext for up to 512 positions): with ``C``
  chunks and ``P`` the next power of two >= C, slot ``value_base(b) + hd*head_slot(h) + l + s``
  holds ``w^h_{8*(l % P) + b}`` (zero for positions beyond the current one), ``s =
  weights_shift(P)`` slots later than the value block it weighs. The server fills each chunk's
  window of ``W = min(P, WEIGHTS_WINDOW)`` lanes from the upload rotated by ``0..2s`` (shared by
  every chunk: the offsets ``-s..s`` a window's lanes read, all left rotations thanks to the
  shift) times 0/1 masks of one lane residue each, and the rest of the period with ``log2(P/W)``
  rotations per chunk (signed by the bits of ``c``, so lane ``c`` reaches its whole period
  without first moving to lane 0).
* **MLP download**: ``σ'/(d * SIGMA_DIV)`` in *every* slot (read at slot ``2F``), plus
  ``û_g`` at ``[0, F)`` and ``û_u`` at ``[F, 2F)``. (A 0/1 mask on σ' would leave its encoding
  error times σ' in the û slots; a constant factor does not.)
* **m upload**: ``m`` replicated with period ``F`` over all slots (the matrix-input layout).

Several positions per ciphertext is not implemented yet: a prefill span carries up to
``MAX_SPAN`` positions per round trip, each in its own ciphertexts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = [
    "BLOCK",
    "HIDDEN_FRAMES",
    "UPPER_BLOCK_SHIFT",
    "SCORES_DIV",
    "SIGMA_DIV",
    "LayoutDims",
    "dims_of",
    "hidden_layout",
    "hidden_copies",
    "periodic_layout",
    "weights_period",
    "weights_shift",
    "WEIGHTS_WINDOW",
    "pack_weights",
    "unpack_scores",
    "unpack_sigma",
    "unpack_mlp",
    "score_slot",
]

BLOCK = 1024
#: Slots the position blocks of a chunk's second half sit further into their block: their
#: score lanes are then [32, 64) of each head where the first half's are [0, 32), and a scores
#: download of at most this many chunks folds into the ring of N/2 without two lanes meeting.
UPPER_BLOCK_SHIFT = 32
#: Frames of the hidden layout: its slots repeat every ``S / HIDDEN_FRAMES``.
HIDDEN_FRAMES = 2
# The scores and MLP downloads sit at level 0, which holds |value| < 2^20 at scale 2^36 (q0 has
# 57 bits). On the shipped SmolLM2 the unnormalized values reach 2^22.1 (ŝ/sqrt(hd), layer 28)
# and 2^20.2 (σ/d, layers 12-28: massive activations); divided as below each stays under 2^17.2
# and a scores slot (a score on top of σ) under 2^18.1, the MLP's (û on σ') under 2^17.6
# (``benchmarks/download_ranges.py``). The price is the division's factor on the flooding
# noise's absolute error (docs/PROTOCOL.md, "Levels").
#: σ and σ' are downloaded divided by d * SIGMA_DIV.
SIGMA_DIV = 8.0
#: ŝ/sqrt(hd) is downloaded divided by SCORES_DIV.
SCORES_DIV = 32.0


@dataclass(frozen=True)
class LayoutDims:
    """The model dimensions the layouts depend on."""

    d: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    slots: int

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def qdim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def head_slot(self, head: int) -> int:
        """Head slot of query head ``head`` (see "position blocks"): slot ``g`` reads KV head
        ``g % kv_heads``."""
        return (head % self.group) * self.kv_heads + head // self.group

    @cached_property
    def head_order(self) -> np.ndarray:
        """``head_order[g]``: the query head in head slot ``g``."""
        order = np.empty(self.heads, dtype=np.int64)
        for h in range(self.heads):
            order[self.head_slot(h)] = h
        return order

    @property
    def per_chunk(self) -> int:
        return self.slots // BLOCK

    def block_base(self, block):
        """First slot of position block ``block`` of a chunk (an int or a numpy array): the
        second half's blocks ``UPPER_BLOCK_SHIFT`` slots into theirs."""
        return BLOCK * block + UPPER_BLOCK_SHIFT * (block >= self.per_chunk // 2)

    @property
    def key_block_steps(self) -> tuple[int, ...]:
        """The rotation by which bit ``i`` of a block index moves a block-0 vector (right
        shifts, all negative): ``BLOCK * 2^i``, the top bit (S/2) plus ``UPPER_BLOCK_SHIFT``.
        Doubling by them replicates q̂ into every block; summing those of ``b``'s bits moves k̂
        into block ``b``."""
        steps = [-BLOCK * (1 << i) for i in range(self.per_chunk.bit_length() - 1)]
        steps[-1] -= UPPER_BLOCK_SHIFT
        return tuple(steps)

    @property
    def value_block_steps(self) -> tuple[int, ...]:
        """Bit ``i`` of a block index moves a value-block-0 vector right by ``q * 2^i``."""
        return tuple(-self.qdim * (1 << i) for i in range(self.per_chunk.bit_length() - 1))

    @property
    def max_positions(self) -> int:
        return self.per_chunk * self.head_dim

    @property
    def copies(self) -> int:
        """Copies of x in the hidden layout, all frames together."""
        return HIDDEN_FRAMES * self.frame_copies

    @property
    def frame(self) -> int:
        """Slots of one frame of the hidden layout."""
        return self.slots // HIDDEN_FRAMES

    @property
    def frame_copies(self) -> int:
        return hidden_copies(self.d, self.slots)

    @property
    def sigma_slot(self) -> int:
        return self.d

    @property
    def sigma2_slot(self) -> int:
        return 2 * self.ffn

    def chunks(self, positions: int) -> int:
        return -(-positions // self.per_chunk)

    @property
    def value_shifts(self) -> int:
        """Right shifts by ``q`` summed into the weighted values (a power of two)."""
        return 2 * self.per_chunk

    @cached_property  # value_base runs per block and head when the client packs weights
    def value_copies(self) -> tuple[int, int]:
        """(first, count): the block-frame copies of period ``q`` that the sum of
        ``value_shifts`` shifts leaves exact. Frame copy ``p`` collects frame blocks ``p - r``,
        ``r < value_shifts``: every block ``0..per_chunk-1`` exactly once, and every other
        shift must land on the zero slots ``[per_chunk*q, S)`` of the frame."""
        q, S, n = self.qdim, self.slots, self.per_chunk
        valid = []
        for p in range(S // q):
            got = [p - r for r in range(self.value_shifts)]
            ok = set(range(n)) <= set(got) and (p + 1) * q <= S
            for b in got:
                if b >= n:
                    ok &= (b + 1) * q <= S
                elif b < 0:
                    ok &= S + b * q >= n * q
            if ok:
                valid.append(p)
        if not valid or valid != list(range(valid[0], valid[-1] + 1)):
            raise ValueError("no contiguous run of exact value copies")
        return valid[0], len(valid)

    @property
    def value_offset(self) -> int:
        """Slot of value block 0: the first exact copy then starts at slot 0."""
        return (-self.value_copies[0] * self.qdim) % self.slots

    @property
    def value_span(self) -> int:
        """Slots ``[0, value_span)`` hold â with period ``q`` after the shift sum."""
        return self.value_copies[1] * self.qdim

    def value_base(self, block: int) -> int:
        return (self.value_offset + self.qdim * block) % self.slots

    def check(self) -> None:
        if self.slots % BLOCK or self.qdim + UPPER_BLOCK_SHIFT > BLOCK or self.d > BLOCK:
            raise ValueError("position blocks need d <= 1024, heads*head_dim <= 992 and 1024 | slots")
        if self.per_chunk & (self.per_chunk - 1) or self.per_chunk < 2:
            raise ValueError("a chunk's position blocks must be a power of two, at least 2")
        if self.d != self.qdim:
            raise ValueError("the layouts assume hidden size == heads * head_dim")
        if 2 * self.ffn + 1 > self.slots:
            raise ValueError("the MLP download does not fit one ciphertext")
        if self.heads % self.kv_heads:
            raise ValueError("GQA needs heads divisible by kv_heads")
        if self.value_offset + self.per_chunk * self.qdim > self.slots:
            raise ValueError("value blocks would wrap around the slot vector")


def dims_of(cfg, slots: int) -> LayoutDims:
    """The layout dimensions of a model config (``engine.config.ModelConfig``), checked."""
    dims = LayoutDims(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, slots)
    dims.check()
    return dims


def hidden_copies(d: int, slots: int) -> int:
    """Whole copies of a ``d``-vector in one frame of the hidden layout."""
    return slots // HIDDEN_FRAMES // d


def hidden_layout(x: np.ndarray, slots: int) -> np.ndarray:
    """``x`` replicated with period ``len(x)`` in each frame, whole copies only, zero tails."""
    x = np.asarray(x, dtype=np.float64).ravel()
    copies = hidden_copies(x.size, slots)
    frame = np.zeros(slots // HIDDEN_FRAMES)
    frame[: copies * x.size] = np.tile(x, copies)
    return np.tile(frame, HIDDEN_FRAMES)


def periodic_layout(x: np.ndarray, slots: int) -> np.ndarray:
    """``x`` replicated with period ``len(x)`` over all slots (the last copy partial)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    return np.tile(x, -(-slots // x.size))[:slots]


def weights_period(chunks: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, chunks))))


#: Lanes of a chunk's period the server fills from shared rotations of the weights upload
#: (``Circuit.expand_weights``): it rotates the upload by 1..2(W-1), steps whose keys the full key
#: set holds anyway (W_qkv's baby steps 1..15, at the top level); 16 would need steps up to 30.
WEIGHTS_WINDOW = 8


def weights_shift(period: int) -> int:
    """Slots the weights upload sits after its value blocks: ``min(period, WEIGHTS_WINDOW) - 1``."""
    return min(period, WEIGHTS_WINDOW) - 1


def score_slot(dims: LayoutDims, position, head):
    """Slot of head ``head``'s score for ``position`` (ints, or numpy arrays that broadcast) in a
    whole download; in a folded one (S/2 slots) the slot modulo S/2."""
    b, c = position % dims.per_chunk, position // dims.per_chunk
    return dims.block_base(b) + dims.head_dim * dims.head_slot(head) + c


def pack_weights(dims: LayoutDims, w: np.ndarray) -> np.ndarray:
    """Compact softmax-weights layout for ``w`` of shape (heads, positions)."""
    heads, n = w.shape
    if heads != dims.heads or n > dims.max_positions:
        raise ValueError("weights do not fit the layout")
    chunks = dims.chunks(n)
    period = weights_period(chunks)
    shift = weights_shift(period)
    out = np.zeros(dims.slots)
    lanes = np.arange(dims.head_dim)
    c = lanes % period
    for b in range(dims.per_chunk):
        j = dims.per_chunk * c + b
        ok = (c < chunks) & (j < n)
        for h in range(heads):
            base = dims.value_base(b) + dims.head_dim * dims.head_slot(h) + shift
            out[(base + lanes[ok]) % dims.slots] = w[h, j[ok]]
    return out


def unpack_sigma(dims: LayoutDims, vec: np.ndarray) -> float:
    """-> σ/d from a scores download (every slot carries σ/(d * SIGMA_DIV); slot d no score)."""
    return float(vec[dims.sigma_slot]) * SIGMA_DIV


def unpack_scores(dims: LayoutDims, vec: np.ndarray, positions: int) -> tuple[float, np.ndarray]:
    """-> (σ/d, ŝ/sqrt(hd) of shape (heads, positions)); ``vec`` whole or folded."""
    idx = score_slot(dims, np.arange(positions)[None, :], np.arange(dims.heads)[:, None]) % len(vec)
    base = float(vec[dims.sigma_slot])
    return unpack_sigma(dims, vec), (vec[idx] - base) * SCORES_DIV


def unpack_mlp(dims: LayoutDims, vec: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """-> (σ'/d, û_g, û_u). Every slot carries σ'/(d * SIGMA_DIV) on top of û."""
    f = dims.ffn
    base = float(vec[dims.sigma2_slot])
    return base * SIGMA_DIV, vec[:f] - base, vec[f : 2 * f] - base

"""Which evaluation keys the protected circuits need, and at which level (docs/PROTOCOL.md,
"Keys"): every Galois step with the highest level any of its rotations runs at, for each of the
key sets a client can make, and the relinearization key's level. A key made for level l holds
only the residues that level needs, and the backend refuses a rotation above it, so the client
(``client/sdk.py``) and the server (``server/protected_service.py``) both read this one table."""

from __future__ import annotations

import functools

from veil.crypto.linear import replicate_rotation_steps, rotation_steps_of
from veil.protected.layouts import BLOCK, HIDDEN_FRAMES, LayoutDims, weights_period, weights_shift
from veil.protected.protocol import LEVELS, Levels
from veil.protected.weights import matrix_shapes, product_plan

__all__ = ["KEY_SETS", "lane_sum_key_levels", "relin_key_level", "rotation_key_levels", "score_lane_groups",
           "sum_all_steps"]


def sum_all_steps(slots: int) -> list[int]:
    """The rotations of ``Circuit.sum_all``: every power of two below ``slots``, those from a
    block on as right shifts (the key blocks' steps, where a key set holds them anyway)."""
    return [1 << i if 1 << i < BLOCK else -(1 << i) for i in range(slots.bit_length() - 1)]


@functools.cache
def score_lane_groups(n_chunks: int, log_hd: int) -> tuple[tuple[int, int], ...]:
    """Groups ``(chunks, j)`` of ``Circuit.lane_sums``, in lane order: a group of ``C`` chunks
    with ``2^j >= C`` costs ``C*j`` rotations at level 3 and ``(C-1) + (log_hd-j)`` at level 2,
    and each group after the first a join at the download's level. Every group but the last is a power of
    two (the joins rotate by its size). The cheapest split by a time model, by exhaustive
    recursion (8 chunks: 4 + 4, 9: 2 + 4 + 3)."""

    def single(n: int) -> tuple[int, int]:
        return n, max(0, (n - 1).bit_length())

    def cost(groups) -> float:
        # ms on the 2-core dev CPU, N=16384: a rotation at level 3 6.5, at level 2 4.4, a mask +
        # rescale 1.4, a group join 2.7 (at level 1 then; benchmarks/results/2026-11-21-protected)
        return sum(6.5 * n * j + 4.4 * ((n - 1) + (log_hd - j)) + 1.4 for n, j in groups) + 2.7 * (len(groups) - 1)

    best = (single(n_chunks),)
    e = 0
    while (1 << e) < n_chunks:
        cand = ((1 << e, e),) + score_lane_groups(n_chunks - (1 << e), log_hd)
        if cost(cand) < cost(best):
            best = cand
        e += 1
    return best


def lane_sum_key_levels(log_hd: int, lv: Levels = LEVELS) -> dict[int, int]:
    """The steps ``Circuit.lane_sums`` rotates by at any number of chunks, each with its highest
    level: a group's first halvings on the chunk products (3), the moves into lane offsets and
    the last halvings (2), the joins of the groups (1)."""
    need: dict[int, int] = {}

    def use(step: int, level: int) -> None:
        need[step] = max(need.get(step, level), level)

    prods = lv.scores_download + 3
    for chunks in range(1, (1 << log_hd) + 1):
        groups = score_lane_groups(chunks, log_hd)
        for n, j in groups:
            for st in range(log_hd):
                use(1 << st, prods if st < j else prods - 1)
            if n > 1:
                use(-1, prods - 1)
        for n, _ in groups[:-1]:
            use(-n, prods - 2)
    return need


#: The evaluation-key sets a client can make (``rotation_key_levels``), largest first.
KEY_SETS = ("full", "compact", "minimal")


def relin_key_level(lv: Levels = LEVELS) -> int:
    """The highest level a ct x ct product is relinearized at: the weighted values (relinearized
    after their rescale, 4), the scores (q̂ ⊙ K_c, likewise, 3) and h² for σ (1). The
    client makes its relinearization key for it: 30 of the 72 residue runs of a whole key."""
    return max(lv.keys - 1, lv.kv - 1, lv.scores_download + 1)


def rotation_key_levels(dims: LayoutDims, lv: Levels = LEVELS, key_set: str = "full") -> dict[int, int]:
    """Every Galois step the circuits use, with the highest level any of its rotations runs at.
    The client generates each key for that level only: a key for level l holds (l+1)(l+2) of
    the 8 x 9 residue runs of a top-level key, and the backend refuses a rotation above it (so
    a wrong entry here fails loudly; ``tests/test_protected_protocol.py`` runs every step).

    ``key_set`` (``KEY_SETS``; docs/PROTOCOL.md, "Keys"), each a subset of the one before, step
    for step and level for level:

    * ``"full"``: a key for every step: what a backend that hoists rotations (native) wants.
    * ``"compact"``: the products' baby steps come from step 1 alone (``linear.baby_steps``),
      which drops the keys of steps 2..15 that W_qkv needs at the top level; 2 and 4 stay for
      the lane sums (at 3 and 2), 8 for the weights' doublings (5); the weights upload's
      rotations by 1..14 chain from step 1 too. On a backend that does not hoist (SEAL) that is
      the same work.
    * ``"minimal"``: also each product's folds from its smallest, a fold by 2^i strides as 2^i
      rotations, and the largest key-block step (-4128: S/2 and ``UPPER_BLOCK_SHIFT``) and S/2
      from the smaller ones (``linear.rotate``): fewer bytes, for 9 more key switches per layer
      and position (one each in W_o and W_down at 3; 3 at 4 where q̂ is copied and a key moved
      into the second half of its chunk, -2048, -2048, -32 for -4128; 2 at 2 and 2 at 1 where
      S/2 is). W_qkv's three blocks per frame chain by its stride in every set
      (``MatvecPlan.chains_blocks``), so it composes nothing."""
    if key_set not in KEY_SETS:
        raise ValueError(f"unknown key set {key_set!r}; choose one of {KEY_SETS}")
    chained, minimal = key_set != "full", key_set == "minimal"
    need: dict[int, int] = {}

    def use(steps, level: int) -> None:
        for st in rotation_steps_of(list(steps), dims.slots):
            need[st] = max(need.get(st, 0), level)

    for name in matrix_shapes(dims):
        plan = product_plan(dims, name)
        for st, level in plan.key_levels(lv.matrices[name], chained=chained, composed_folds=minimal).items():
            use({st}, level)
    hd = dims.head_dim
    use({hd // 2, -(hd // 2)}, lv.keys + 1)  # RoPE on y switched to 5
    use({dims.kv_dim, 2 * dims.kv_dim - dims.value_offset}, lv.kv)  # KV lanes -> head slots (k̂ at 4, v̂ at 5)
    use({-dims.qdim * (1 << i) for i in range(dims.value_shifts.bit_length() - 1)}, lv.kv)  # value blocks, â shifts
    use(dims.key_block_steps, lv.keys)  # key blocks, q̂ copies
    window = weights_shift(weights_period(hd)) + 1  # the widest weights window (64 chunks)
    use(range(1, 2 * window - 1) if not chained else {1}, lv.w)  # the weights upload's rotations (6)
    log_w, log_hd = window.bit_length() - 1, hd.bit_length() - 1
    use({sign << i for sign in (1, -1) for i in range(log_w, log_hd)}, lv.kv)  # weights' doublings (5)
    for st, level in lane_sum_key_levels(log_hd, lv).items():
        use({st}, level)
    use(sum_all_steps(dims.slots), lv.h_prime - 1)  # σ and σ' cyclic slot sums (1)
    use([*replicate_rotation_steps(dims.frame, HIDDEN_FRAMES), *replicate_rotation_steps(dims.d, dims.frame_copies)],
        lv.h_prime)  # o and W_down m replicated (``Circuit.replicate_hidden``)
    if minimal:  # the largest key-block steps from the smaller (q̂ copies, key blocks, σ sums)
        for st in rotation_steps_of([dims.key_block_steps[-1], dims.slots // 2], dims.slots):
            need.pop(st)
    return dict(sorted(need.items()))

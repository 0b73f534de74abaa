"""The products over the interface: ``matvec`` (baby steps, giant steps by Horner's rule, folds),
rotations composed from the keys a set holds, replication and lane broadcasts."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from veil.crypto.backend import Ciphertext, HEBackend, HEError
from veil.crypto.linear.encode import EncodedMatrix


def matvec(be: HEBackend, matrix: EncodedMatrix, x: Ciphertext) -> Ciphertext:
    """``W x`` for an input periodic on ``plan.input_span`` slots; output in ``[0, rows)``."""
    if matrix.params_id != be.params.id:
        raise HEError("matrix encoded for another parameter set")
    if be.level(x) != matrix.level:
        raise HEError(f"input at level {be.level(x)}, matrix encoded for {matrix.level}")
    return be.run_product(matrix, lambda y: _matvec(be, matrix, y), x)


def _matvec(be: HEBackend, matrix: EncodedMatrix, x: Ciphertext) -> Ciphertext:
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


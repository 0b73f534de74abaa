"""Negacyclic NTT / INTT of ``[..., L, N]`` residues in Triton, four butterfly stages per launch.

The twin is ``veil.crypto.native.ntt.NttTables`` itself (its torch path): the same SEAL
network, the same twiddle tables, the same lazy-reduction plan (``_RunNtt.plan``) and the same
products (``ckks_arith``); both end canonical, so outputs are equal bit for bit.
``NttTables.forward`` / ``.inverse`` call ``ntt_triton`` on CUDA tensors.

Why: on a GPU the protected path is launch-bound (a rotation was 53 launches, 49 of them NTT
stages, ~100 us each with their Python: ``benchmarks/results/2026-11-28-gpu``), so a transform
of N = 2^14 takes 4 launches over every limb (4 + 4 + 4 + 2 stages), not 7 per run of limbs.

Radix 16: a lane owns the 16 values ``base + r*d`` and applies four consecutive stages in
registers as two passes of two: a pair of stages closes over quadruples ``(0, e, 2e, 3e)``
(forward: the stage at distance ``2e`` pairs ``(0, 2e)``, ``(e, 3e)``, the next one ``(0, e)``,
``(2e, 3e)``; the inverse runs the two in the opposite order), first on ``(r, r+4, r+8, r+12)``
(``e = 4d``), then on ``(4s .. 4s+3)`` (``e = d``) forward, the other way round inverse. The
16-tuples of a launch are disjoint, so it works in place. The last stages come as a radix-4 or
radix-2 launch. A value's bound before each product is the one the plan gives the twin: where
the plan reduces before a stage, the kernel reduces its values.

Every run of limbs shares each launch: the runs' constants are stacked on the limb axis once
(``MulConst.stacked`` of the master tables, views for each level's run: ``NttPack``), and a
program reads its limb's product scheme and its run's plan (``Basis.wide_limbs``, ``plan``) and
takes that branch (uniform per program). Grid: ``(B * L, lanes / BLOCK)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from veil.kernels._utils import check_triton_device
from veil.kernels.ckks_arith import NO_FMA, fix, mul_const_lazy, reduce_lazy

__all__ = ["NttPack", "ntt_triton"]

# lanes per program by stages per launch: a lane holds 2, 4 or 16 values in registers
_BLOCK = {1: 1024, 2: 512, 4: 128}
#: transforms of at most this many rows (a rescale's or ModDown's dropped limb, a decomposition's
#: limbs) run as one launch, a program per row (``_ntt_row_kernel``), 256 lanes at a time
ONE_LAUNCH_ROWS = 32
_ROW_CHUNK = 256


@triton.jit
def _tw(tw_ptr, wq_ptr, w0_ptr, w0q_ptr, off, mask, WIDE: tl.constexpr):
    """A constant's fields at ``off`` (``_PartConst``: w or w1, fl(w/q); wide: w0, fl(w0/q))."""
    w = tl.load(tw_ptr + off, mask=mask)
    wq = tl.load(wq_ptr + off, mask=mask)
    if WIDE:
        return w, wq, tl.load(w0_ptr + off, mask=mask), tl.load(w0q_ptr + off, mask=mask)
    else:
        return w, wq, w, wq  # the low half is unused by the narrow product


@triton.jit
def _ct(u, v, w, wq, w0, w0q, c, q, WIDE: tl.constexpr):
    """Cooley-Tukey butterfly ``(u + w*v, u - w*v)``: the bound grows by ``q``."""
    p = mul_const_lazy(v, w, wq, w0, w0q, c, q, WIDE)
    return u + p, u - p


@triton.jit
def _gs(u, v, w, wq, w0, w0q, c, q, WIDE: tl.constexpr):
    """Gentleman-Sande butterfly ``(u + v, w*(u - v))``: the bound doubles."""
    return u + v, mul_const_lazy(u - v, w, wq, w0, w0q, c, q, WIDE)


@triton.jit
def _gs_last(u, v, lo, hi, c, q, WIDE: tl.constexpr, CENTRE: tl.constexpr):
    """The inverse's last butterfly ``(lo*(u + v), hi*(u - v))``, ``lo = 1/N``, ``hi =
    psi^-brev(1)/N`` (``ntt._inv_last``), canonical, or centred ``(-q/2, q/2]``
    (``Basis.center``) with ``CENTRE``."""
    lw, lwq, lw0, lw0q = lo
    hw, hwq, hw0, hw0q = hi
    a = fix(mul_const_lazy(u + v, lw, lwq, lw0, lw0q, c, q, WIDE), q)
    b = fix(mul_const_lazy(u - v, hw, hwq, hw0, hw0q, c, q, WIDE), q)
    if CENTRE:
        a = tl.where(a > (q >> 1), a - q, a)
        b = tl.where(b > (q >> 1), b - q, b)
    return a, b


@triton.jit
def _canon(x, q, qinv):
    return fix(reduce_lazy(x, q, qinv), q)


@triton.jit
def _at(t, off, mask, WIDE: tl.constexpr):
    """The fields at ``off`` of a limb's twiddle table ``t`` (four pointers)."""
    tw_ptr, wq_ptr, w0_ptr, w0q_ptr = t
    return _tw(tw_ptr, wq_ptr, w0_ptr, w0q_ptr, off, mask, WIDE)


@triton.jit
def _reduce4(x0, x1, x2, x3, q, qinv):
    return reduce_lazy(x0, q, qinv), reduce_lazy(x1, q, qinv), reduce_lazy(x2, q, qinv), \
        reduce_lazy(x3, q, qinv)


@triton.jit
def _fw4(x0, x1, x2, x3, T, g1, g2, mask, c, q, qinv, REDUCE_A, REDUCE_B, FINAL: tl.constexpr,
         WIDE: tl.constexpr):
    """Two forward stages on a quadruple ``(0, e, 2e, 3e)``: the first (distance ``2e``, twiddle
    ``T[g1]``) pairs ``(0, 2e)`` and ``(e, 3e)``, the second (distance ``e``) ``(0, e)`` with
    ``T[g2]`` and ``(2e, 3e)`` with ``T[g2 + 1]``."""
    if REDUCE_A:
        x0, x1, x2, x3 = _reduce4(x0, x1, x2, x3, q, qinv)
    w, wq, w0, w0q = _at(T, g1, mask, WIDE)
    x0, x2 = _ct(x0, x2, w, wq, w0, w0q, c, q, WIDE)
    x1, x3 = _ct(x1, x3, w, wq, w0, w0q, c, q, WIDE)
    if REDUCE_B:
        x0, x1, x2, x3 = _reduce4(x0, x1, x2, x3, q, qinv)
    w, wq, w0, w0q = _at(T, g2, mask, WIDE)
    x0, x1 = _ct(x0, x1, w, wq, w0, w0q, c, q, WIDE)
    w, wq, w0, w0q = _at(T, g2 + 1, mask, WIDE)
    x2, x3 = _ct(x2, x3, w, wq, w0, w0q, c, q, WIDE)
    if FINAL:
        x0, x1, x2, x3 = _canon(x0, q, qinv), _canon(x1, q, qinv), _canon(x2, q, qinv), \
            _canon(x3, q, qinv)
    return x0, x1, x2, x3


@triton.jit
def _inv4(x0, x1, x2, x3, T, g1, g2, lo, hi, mask, c, q, qinv, REDUCE_A, REDUCE_B,
          LAST: tl.constexpr, WIDE: tl.constexpr):
    """Two inverse stages on a quadruple ``(0, e, 2e, 3e)``: the first (distance ``e``) pairs
    ``(0, e)`` with ``T[g1]`` and ``(2e, 3e)`` with ``T[g1 + 1]``, the second (distance ``2e``,
    twiddle ``T[g2]``, or the last stage's ``lo``/``hi``) ``(0, 2e)`` and ``(e, 3e)``."""
    if REDUCE_A:
        x0, x1, x2, x3 = _reduce4(x0, x1, x2, x3, q, qinv)
    w, wq, w0, w0q = _at(T, g1, mask, WIDE)
    x0, x1 = _gs(x0, x1, w, wq, w0, w0q, c, q, WIDE)
    w, wq, w0, w0q = _at(T, g1 + 1, mask, WIDE)
    x2, x3 = _gs(x2, x3, w, wq, w0, w0q, c, q, WIDE)
    if REDUCE_B:
        x0, x1, x2, x3 = _reduce4(x0, x1, x2, x3, q, qinv)
    if LAST:
        x0, x2 = _gs_last(x0, x2, lo, hi, c, q, WIDE, LAST == 2)
        x1, x3 = _gs_last(x1, x3, lo, hi, c, q, WIDE, LAST == 2)
    else:
        w, wq, w0, w0q = _at(T, g2, mask, WIDE)
        x0, x2 = _gs(x0, x2, w, wq, w0, w0q, c, q, WIDE)
        x1, x3 = _gs(x1, x3, w, wq, w0, w0q, c, q, WIDE)
    return x0, x1, x2, x3


@triton.jit
def _load4(p, d, mask):
    return tl.load(p, mask=mask), tl.load(p + d, mask=mask), tl.load(p + 2 * d, mask=mask), \
        tl.load(p + 3 * d, mask=mask)


@triton.jit
def _store4(p, d, mask, x0, x1, x2, x3):
    tl.store(p, x0, mask=mask)
    tl.store(p + d, x1, mask=mask)
    tl.store(p + 2 * d, x2, mask=mask)
    tl.store(p + 3 * d, x3, mask=mask)


@triton.jit
def _ntt_kernel(src_ptr, x_ptr, w_ptr, wq_ptr, w0_ptr, w0q_ptr, c_ptr, q_ptr, qinv_ptr,
                lo_ptr, loq_ptr, lo0_ptr, lo0q_ptr, hi_ptr, hiq_ptr, hi0_ptr, hi0q_ptr,
                wide_ptr, plan_ptr, plan_stride, stage, limbs, n, g0, log_d,
                INVERSE: tl.constexpr, STAGES: tl.constexpr, LAST: tl.constexpr,
                FINAL: tl.constexpr, LIFT: tl.constexpr, BLOCK: tl.constexpr):
    # ``STAGES`` (1, 2 or 4) consecutive stages per launch, from ``stage`` on, over every limb
    # of every polynomial: a limb's product scheme (``wide``) and its reductions (``plan``: reduce
    # before the stage) are read per program, so limbs of all runs share the launch.
    # ``g0``: the groups of the launch's first stage (forward: m, twiddles [m, 2m); inverse: h,
    # twiddles [h, 2h)). ``d = 2^log_d``: the smallest butterfly distance of the launch; a lane
    # owns the ``2^STAGES`` values ``i0 + r*d``. LAST: the launch ends with the inverse's last
    # stage (2: its output centred); FINAL: the forward's canonical reduction follows. ``src``:
    # the input (the first launch) or ``x`` itself; every element is loaded and stored by
    # exactly one lane, so in place is safe. LIFT (a forward's first launch): ``src`` holds one
    # integer polynomial (|c| < 2^62) per row of limbs, reduced mod each limb's prime on load.
    row = tl.program_id(0).to(tl.int64)
    limb = row % limbs
    src = src_ptr + (row // limbs if LIFT else row) * n
    base_ptr = x_ptr + row * n
    k = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    q = tl.load(q_ptr + limb)
    qinv = tl.load(qinv_ptr + limb)
    c = tl.load(c_ptr + limb)  # fl(2^30/q); unused by narrow products
    tw = limb * n
    T = (w_ptr + tw, wq_ptr + tw, w0_ptr + tw, w0q_ptr + tw)  # this limb's twiddle fields
    # the last inverse stage's two constants (read by LAST launches only)
    L = (lo_ptr + limb, loq_ptr + limb, lo0_ptr + limb, lo0q_ptr + limb)
    H = (hi_ptr + limb, hiq_ptr + limb, hi0_ptr + limb, hi0q_ptr + limb)
    flags = plan_ptr + limb * plan_stride + stage
    if tl.load(wide_ptr + limb) != 0:
        _stages(src, base_ptr, T, L, H, c, q, qinv, flags, k, n, g0, log_d, INVERSE, STAGES, LAST,
                FINAL, LIFT, True)
    else:
        _stages(src, base_ptr, T, L, H, c, q, qinv, flags, k, n, g0, log_d, INVERSE, STAGES, LAST,
                FINAL, LIFT, False)


@triton.jit
def _stages(src, base_ptr, T, L, H, c, q, qinv, flags, k, n, g0, log_d, INVERSE: tl.constexpr,
            STAGES: tl.constexpr, LAST: tl.constexpr, FINAL: tl.constexpr, LIFT: tl.constexpr,
            WIDE: tl.constexpr):
    # ``STAGES`` stages from the one whose plan entry ``flags`` points at, on lanes ``k`` of ``n >>
    # STAGES``; a lane owns the ``2^STAGES`` values ``i0 + r*d``, ``grp`` its group of the last
    # (forward) / first (inverse) stage of the pass.
    mask = k < (n >> STAGES)
    grp = k >> log_d
    d = 1 << log_d
    i0 = grp * ((1 << STAGES) * d) + (k & (d - 1))
    R0 = (tl.load(flags) != 0) | LIFT  # a lifted input is reduced to (-q, q) first
    R1, R2, R3 = R0, R0, R0  # placeholders where the pass has fewer stages
    if STAGES > 1:
        R1 = tl.load(flags + 1) != 0
    if STAGES > 2:
        R2, R3 = tl.load(flags + 2) != 0, tl.load(flags + 3) != 0
    if LAST:  # the last inverse stage's constants, live only where they are used
        lo = _at(L, 0, None, WIDE)
        hi = _at(H, 0, None, WIDE)
    else:
        lo = (q, q, q, q)
        hi = lo
    if STAGES == 4:
        # radix 16: two passes of two stages over the lane's 16 values x[r] = src[i0 + r*d]
        x0, x1, x2, x3 = _load4(src + i0, d, mask)
        x4, x5, x6, x7 = _load4(src + i0 + 4 * d, d, mask)
        x8, x9, x10, x11 = _load4(src + i0 + 8 * d, d, mask)
        x12, x13, x14, x15 = _load4(src + i0 + 12 * d, d, mask)
        if INVERSE:
            # distances d, 2d on the quadruples (4s .. 4s+3): groups 8G+2s(+1), 4G+s
            g, h = g0 + 8 * grp, (g0 >> 1) + 4 * grp
            x0, x1, x2, x3 = _inv4(x0, x1, x2, x3, T, g, h, lo, hi, mask, c, q, qinv, R0, R1,
                                   False, WIDE)
            x4, x5, x6, x7 = _inv4(x4, x5, x6, x7, T, g + 2, h + 1, lo, hi, mask, c, q, qinv, R0,
                                   R1, False, WIDE)
            x8, x9, x10, x11 = _inv4(x8, x9, x10, x11, T, g + 4, h + 2, lo, hi, mask, c, q, qinv,
                                     R0, R1, False, WIDE)
            x12, x13, x14, x15 = _inv4(x12, x13, x14, x15, T, g + 6, h + 3, lo, hi, mask, c, q,
                                       qinv, R0, R1, False, WIDE)
            # distances 4d, 8d on the quadruples (r, r+4, r+8, r+12): groups 2G(+1), G
            g, h = (g0 >> 2) + 2 * grp, (g0 >> 3) + grp
            x0, x4, x8, x12 = _inv4(x0, x4, x8, x12, T, g, h, lo, hi, mask, c, q, qinv, R2, R3,
                                    LAST, WIDE)
            x1, x5, x9, x13 = _inv4(x1, x5, x9, x13, T, g, h, lo, hi, mask, c, q, qinv, R2, R3,
                                    LAST, WIDE)
            x2, x6, x10, x14 = _inv4(x2, x6, x10, x14, T, g, h, lo, hi, mask, c, q, qinv, R2, R3,
                                     LAST, WIDE)
            x3, x7, x11, x15 = _inv4(x3, x7, x11, x15, T, g, h, lo, hi, mask, c, q, qinv, R2, R3,
                                     LAST, WIDE)
        else:
            # distances 8d, 4d on the quadruples (r, r+4, r+8, r+12): groups G, 2G(+1)
            g, h = g0 + grp, 2 * g0 + 2 * grp
            x0, x4, x8, x12 = _fw4(x0, x4, x8, x12, T, g, h, mask, c, q, qinv, R0, R1, False, WIDE)
            x1, x5, x9, x13 = _fw4(x1, x5, x9, x13, T, g, h, mask, c, q, qinv, R0, R1, False, WIDE)
            x2, x6, x10, x14 = _fw4(x2, x6, x10, x14, T, g, h, mask, c, q, qinv, R0, R1, False,
                                    WIDE)
            x3, x7, x11, x15 = _fw4(x3, x7, x11, x15, T, g, h, mask, c, q, qinv, R0, R1, False,
                                    WIDE)
            # distances 2d, d on the quadruples (4s .. 4s+3): groups 4G+s, 8G+2s(+1)
            g, h = 4 * g0 + 4 * grp, 8 * g0 + 8 * grp
            x0, x1, x2, x3 = _fw4(x0, x1, x2, x3, T, g, h, mask, c, q, qinv, R2, R3, FINAL, WIDE)
            x4, x5, x6, x7 = _fw4(x4, x5, x6, x7, T, g + 1, h + 2, mask, c, q, qinv, R2, R3, FINAL,
                                  WIDE)
            x8, x9, x10, x11 = _fw4(x8, x9, x10, x11, T, g + 2, h + 4, mask, c, q, qinv, R2, R3,
                                    FINAL, WIDE)
            x12, x13, x14, x15 = _fw4(x12, x13, x14, x15, T, g + 3, h + 6, mask, c, q, qinv, R2,
                                      R3, FINAL, WIDE)
        _store4(base_ptr + i0, d, mask, x0, x1, x2, x3)
        _store4(base_ptr + i0 + 4 * d, d, mask, x4, x5, x6, x7)
        _store4(base_ptr + i0 + 8 * d, d, mask, x8, x9, x10, x11)
        _store4(base_ptr + i0 + 12 * d, d, mask, x12, x13, x14, x15)
    elif STAGES == 2:
        x0, x1, x2, x3 = _load4(src + i0, d, mask)
        if INVERSE:  # distance d: groups 2G, 2G+1; distance 2d: group G
            x0, x1, x2, x3 = _inv4(x0, x1, x2, x3, T, g0 + 2 * grp, (g0 >> 1) + grp, lo, hi, mask,
                                   c, q, qinv, R0, R1, LAST, WIDE)
        else:  # distance 2d: group G; distance d: groups 2G, 2G+1
            x0, x1, x2, x3 = _fw4(x0, x1, x2, x3, T, g0 + grp, 2 * g0 + 2 * grp, mask, c, q, qinv,
                                  R0, R1, FINAL, WIDE)
        _store4(base_ptr + i0, d, mask, x0, x1, x2, x3)
    else:
        # one stage: g0 groups, butterflies at distance d
        u = tl.load(src + i0, mask=mask)
        v = tl.load(src + i0 + d, mask=mask)
        if R0:
            u, v = reduce_lazy(u, q, qinv), reduce_lazy(v, q, qinv)
        if LAST:
            u, v = _gs_last(u, v, lo, hi, c, q, WIDE, LAST == 2)
        else:
            w, wq, w0, w0q = _at(T, g0 + grp, mask, WIDE)
            if INVERSE:
                u, v = _gs(u, v, w, wq, w0, w0q, c, q, WIDE)
            else:
                u, v = _ct(u, v, w, wq, w0, w0q, c, q, WIDE)
            if FINAL:
                u, v = _canon(u, q, qinv), _canon(v, q, qinv)
        tl.store(base_ptr + i0, u, mask=mask)
        tl.store(base_ptr + i0 + d, v, mask=mask)


@triton.jit
def _ntt_row_kernel(src_ptr, x_ptr, w_ptr, wq_ptr, w0_ptr, w0q_ptr, c_ptr, q_ptr, qinv_ptr,
                    lo_ptr, loq_ptr, lo0_ptr, lo0q_ptr, hi_ptr, hiq_ptr, hi0_ptr, hi0q_ptr,
                    wide_ptr, plan_ptr, plan_stride, limbs,
                    INVERSE: tl.constexpr, LOG_N: tl.constexpr, CENTRE: tl.constexpr,
                    LIFT: tl.constexpr, CHUNK: tl.constexpr):
    # The whole transform of one row (a polynomial's limb) in one program: the same passes as
    # ``_ntt_kernel``'s launches, one after the other, ``CHUNK`` lanes at a time, in place in
    # ``x`` with a barrier between passes (global writes are visible to the block after it).
    # One launch for every row: for the small transforms of a key switch and a rescale, whose
    # launches otherwise cost more than their work.
    row = tl.program_id(0).to(tl.int64)
    limb = row % limbs
    n = 1 << LOG_N
    src = src_ptr + (row // limbs if LIFT else row) * n
    base_ptr = x_ptr + row * n
    q = tl.load(q_ptr + limb)
    qinv = tl.load(qinv_ptr + limb)
    c = tl.load(c_ptr + limb)
    tw = limb * n
    T = (w_ptr + tw, wq_ptr + tw, w0_ptr + tw, w0q_ptr + tw)
    L = (lo_ptr + limb, loq_ptr + limb, lo0_ptr + limb, lo0q_ptr + limb)
    H = (hi_ptr + limb, hiq_ptr + limb, hi0_ptr + limb, hi0q_ptr + limb)
    flags = plan_ptr + limb * plan_stride
    if tl.load(wide_ptr + limb) != 0:
        _row_passes(src, base_ptr, T, L, H, c, q, qinv, flags, INVERSE, LOG_N, CENTRE, LIFT, CHUNK, True)
    else:
        _row_passes(src, base_ptr, T, L, H, c, q, qinv, flags, INVERSE, LOG_N, CENTRE, LIFT, CHUNK, False)


@triton.jit
def _row_passes(src, base_ptr, T, L, H, c, q, qinv, flags, INVERSE: tl.constexpr,
                LOG_N: tl.constexpr, CENTRE: tl.constexpr, LIFT: tl.constexpr, CHUNK: tl.constexpr,
                WIDE: tl.constexpr):
    # the launch plan of ``_launches``: radix 16 while four stages remain, then 4, then 2
    for p in tl.static_range(LOG_N // 4):
        _row_pass(src if p == 0 else base_ptr, base_ptr, T, L, H, c, q, qinv, flags, 4 * p, INVERSE,
                  LOG_N, 4, CENTRE, LIFT and p == 0, CHUNK, WIDE)
        tl.debug_barrier()
    if LOG_N % 4 >= 2:
        s0: tl.constexpr = 4 * (LOG_N // 4)
        _row_pass(src if s0 == 0 else base_ptr, base_ptr, T, L, H, c, q, qinv, flags, s0, INVERSE,
                  LOG_N, 2, CENTRE, LIFT and s0 == 0, CHUNK, WIDE)
        tl.debug_barrier()
    if LOG_N % 2 == 1:
        s1: tl.constexpr = LOG_N - 1
        _row_pass(src if s1 == 0 else base_ptr, base_ptr, T, L, H, c, q, qinv, flags, s1, INVERSE,
                  LOG_N, 1, CENTRE, LIFT and s1 == 0, CHUNK, WIDE)


@triton.jit
def _row_pass(src, base_ptr, T, L, H, c, q, qinv, flags, S: tl.constexpr, INVERSE: tl.constexpr,
              LOG_N: tl.constexpr, STAGES: tl.constexpr, CENTRE: tl.constexpr, LIFT: tl.constexpr,
              CHUNK: tl.constexpr, WIDE: tl.constexpr):
    n = 1 << LOG_N
    ends: tl.constexpr = S + STAGES == LOG_N
    if INVERSE:
        g0 = n >> (S + 1)
        log_d: tl.constexpr = S
    else:
        g0 = 1 << S
        log_d: tl.constexpr = LOG_N - S - STAGES
    for start in range(0, n >> STAGES, CHUNK):
        k = start + tl.arange(0, CHUNK).to(tl.int64)
        _stages(src, base_ptr, T, L, H, c, q, qinv, flags + S, k, n, g0, log_d, INVERSE, STAGES,
                (2 if CENTRE else 1) if INVERSE and ends else 0, not INVERSE and ends, LIFT, WIDE)


@dataclass(frozen=True)
class NttPack:
    """One direction's constants of every limb of an ``NttTables``, for launches that span its
    runs (``NttTables.triton_pack``): its twiddles' and last-stage constants' fields as
    ``MulConst.stacked`` gives them, and each limb's lazy-reduction plan (its run's). The primes
    and each limb's product scheme are the basis's (``q``, ``qinv``, ``wide_limbs``)."""

    tw: tuple[torch.Tensor, ...]  # [L, N] each: w (w1), fl(w/q), w0, fl(w0/q)
    c: torch.Tensor  # [L] float64: fl(2^30/q), 0 on narrow limbs
    lo: tuple[torch.Tensor, ...]  # [L, 1] each: the last inverse stage's 1/N, as the twiddles
    hi: tuple[torch.Tensor, ...]  # [L, 1] each: its psi^-brev(1)/N
    plan: torch.Tensor  # [L, log N] int32: reduce before the stage


def _launches(stages: int):
    """``(first stage, stages, ends?)`` per launch: four stages (radix 16) while four remain,
    then two, then one."""
    s = 0
    while s < stages:
        width = 4 if s + 4 <= stages else 2 if s + 2 <= stages else 1
        yield s, width, s + width == stages
        s += width


def ntt_triton(tables, x: torch.Tensor, inverse: bool, centre: bool = False,
               lift: bool = False) -> torch.Tensor:
    """``tables.forward(x)`` (``inverse=False``) or ``tables.inverse(x)`` for an ``NttTables``
    on the device of ``x`` (``[..., L, N]`` int64, any strides): a new tensor, canonical.
    ``centre``: the inverse's output centred, ``tables.inverse_centred(x)``. ``lift``: ``x`` is
    ``[..., N]`` integer coefficients (``|c| < 2^62``), transformed in every limb
    (``NttTables.lift``)."""
    check_triton_device(x, tables.basis.q)
    n, limbs = tables.n, len(tables.basis)
    want = (n,) if lift else (limbs, n)
    if x.dtype != torch.int64 or x.shape[-len(want):] != want or (lift and inverse):
        raise ValueError(f"expected int64 [..., {', '.join(map(str, want))}], got {x.dtype} {tuple(x.shape)}")
    src = x.reshape(-1, n) if lift else x.reshape(-1, limbs, n)
    src = src if src.is_contiguous() else src.contiguous()
    rows = src.shape[0]
    out = torch.empty((rows, limbs, n), dtype=torch.int64, device=x.device)
    shape = (*x.shape[:-1], limbs, n) if lift else x.shape
    if out.numel() == 0:
        return out.view(shape)
    p = tables.triton_pack[inverse]
    primes, wide = (tables.basis.q, tables.basis.qinv), tables.basis.wide_limbs  # [L, 1]: ptr + limb
    log_n = n.bit_length() - 1
    if rows * limbs <= ONE_LAUNCH_ROWS:  # the whole transform of each row in one program
        _ntt_row_kernel[(rows * limbs,)](
            src, out, *p.tw, p.c, *primes, *p.lo, *p.hi, wide, p.plan, p.plan.stride(0), limbs,
            INVERSE=inverse, LOG_N=log_n, CENTRE=centre, LIFT=lift, CHUNK=min(_ROW_CHUNK, n >> 4),
            num_warps=8, num_stages=1, **NO_FMA)  # one lane per thread; no prefetch of the next chunk
        return out.view(shape)
    reading = src
    for s, width, ends in _launches(log_n):
        if inverse:  # groups n/2^(s+1), smallest distance 2^s
            g0, log_d = n >> (s + 1), s
        else:  # groups 2^s, smallest distance n/2^(s+width)
            g0, log_d = 1 << s, log_n - s - width
        count = n >> width
        block = min(_BLOCK[width], triton.next_power_of_2(count))
        grid = (rows * limbs, triton.cdiv(count, block))
        _ntt_kernel[grid](
            reading, out, *p.tw, p.c, *primes, *p.lo, *p.hi, wide, p.plan, p.plan.stride(0), s,
            limbs, n, g0, log_d, INVERSE=inverse, STAGES=width,
            LAST=(2 if centre else 1) if inverse and ends else 0, FINAL=not inverse and ends,
            LIFT=lift and s == 0, BLOCK=block, **NO_FMA)
        reading = out
    return out.view(shape)

"""Negacyclic NTT / INTT of ``[..., L, N]`` residues in Triton, two butterfly stages per launch.

The twin is ``veil.crypto.native.ntt.NttTables`` itself (its torch path): the same SEAL
network, the same twiddle tables (read in place, no copies), the same lazy-reduction plan
(``_RunNtt.plan``) and the same products (``ckks_arith``); both end canonical, so outputs are
equal bit for bit. ``NttTables.forward`` / ``.inverse`` call ``ntt_triton`` on CUDA tensors.

Radix 4: a launch fuses two consecutive stages, whose butterflies close over quadruples
``base + {0, d, 2d, 3d}``: forward, the stage with half-size ``2d`` pairs ``(0, 2d)`` and
``(d, 3d)``, the next one (half-size ``d``) ``(0, d)`` and ``(2d, 3d)``; the inverse runs the
same two in the opposite order. Each program loads a block of quadruples once, applies both
stages in registers and stores them in place (the quadruples of a launch are disjoint), which
halves the passes over memory of one launch per stage. An odd stage count ends with a radix-2
launch. A value's bound before each product is the one the plan gives the twin: where the plan
reduces before a stage, the kernel reduces its four values (``REDUCE_A`` / ``REDUCE_B``).

Grid: ``(B * limbs of the run, quadruples / BLOCK)``; one launch per pair of stages per run of
limbs sharing a product scheme (two runs in the production basis).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from veil.kernels._utils import check_triton_device
from veil.kernels.ckks_arith import NO_FMA, fix, mul_const_lazy, reduce_lazy

__all__ = ["ntt_triton"]

_BLOCK = 1024  # butterflies (radix 2) or quadruples (radix 4) per program


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
def _gs_last(u, v, lo, hi, c, q, WIDE: tl.constexpr):
    """The inverse's last butterfly ``(lo*(u + v), hi*(u - v))``, ``lo = 1/N``, ``hi =
    psi^-brev(1)/N`` (``ntt._inv_last``), canonical."""
    lw, lwq, lw0, lw0q = lo
    hw, hwq, hw0, hw0q = hi
    return (fix(mul_const_lazy(u + v, lw, lwq, lw0, lw0q, c, q, WIDE), q),
            fix(mul_const_lazy(u - v, hw, hwq, hw0, hw0q, c, q, WIDE), q))


@triton.jit
def _canon(x, q, qinv):
    return fix(reduce_lazy(x, q, qinv), q)


@triton.jit
def _ntt_kernel(src_ptr, x_ptr, tw_ptr, wq_ptr, w0_ptr, w0q_ptr, c_ptr, q_ptr, qinv_ptr,
                lo_ptr, loq_ptr, lo0_ptr, lo0q_ptr, hi_ptr, hiq_ptr, hi0_ptr, hi0q_ptr,
                tw_stride, c_stride, last_stride, limbs, run_limbs, first_limb, n, g0, log_d,
                INVERSE: tl.constexpr, TWO: tl.constexpr, REDUCE_A: tl.constexpr,
                REDUCE_B: tl.constexpr, LAST: tl.constexpr, FINAL: tl.constexpr,
                WIDE: tl.constexpr, BLOCK: tl.constexpr):
    # ``g0``: the groups of the launch's first stage (forward: m, twiddles [m, 2m); inverse: h,
    # twiddles [h, 2h)). ``d = 2^log_d``: the smallest butterfly distance of the launch. LAST:
    # the launch ends with the inverse's last stage; FINAL: the forward's canonical reduction
    # follows. ``src``: the input (the first launch) or ``x`` itself; every element is loaded
    # and stored by exactly one lane, so in place is safe.
    row = tl.program_id(0).to(tl.int64)
    limb = row % run_limbs
    offset = ((row // run_limbs) * limbs + first_limb + limb) * n
    src = src_ptr + offset
    base_ptr = x_ptr + offset
    k = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = k < (n >> (2 if TWO else 1))
    grp = k >> log_d  # this butterfly's (or quadruple's) group
    d = 1 << log_d
    i0 = grp * ((4 if TWO else 2) * d) + (k & (d - 1))
    q = tl.load(q_ptr + limb)
    qinv = tl.load(qinv_ptr + limb)
    c = qinv  # unused by narrow products
    if WIDE:
        c = tl.load(c_ptr + limb * c_stride)  # fl(2^30/q)
    tw = limb * tw_stride
    # the last inverse stage's two constants (scalars per limb; read by LAST launches only)
    lo = _tw(lo_ptr, loq_ptr, lo0_ptr, lo0q_ptr, limb * last_stride, None, WIDE)
    hi = _tw(hi_ptr, hiq_ptr, hi0_ptr, hi0q_ptr, limb * last_stride, None, WIDE)
    if TWO:
        x0 = tl.load(src + i0, mask=mask)
        x1 = tl.load(src + i0 + d, mask=mask)
        x2 = tl.load(src + i0 + 2 * d, mask=mask)
        x3 = tl.load(src + i0 + 3 * d, mask=mask)
        if REDUCE_A:
            x0, x1 = reduce_lazy(x0, q, qinv), reduce_lazy(x1, q, qinv)
            x2, x3 = reduce_lazy(x2, q, qinv), reduce_lazy(x3, q, qinv)
        if INVERSE:
            # stage h (distance d): groups 2G, 2G+1 of the quadruple's group G
            wa, wqa, w0a, w0qa = _tw(tw_ptr, wq_ptr, w0_ptr, w0q_ptr, tw + g0 + 2 * grp, mask, WIDE)
            wb, wqb, w0b, w0qb = _tw(tw_ptr, wq_ptr, w0_ptr, w0q_ptr, tw + g0 + 2 * grp + 1, mask,
                                     WIDE)
            x0, x1 = _gs(x0, x1, wa, wqa, w0a, w0qa, c, q, WIDE)
            x2, x3 = _gs(x2, x3, wb, wqb, w0b, w0qb, c, q, WIDE)
            if REDUCE_B:
                x0, x1 = reduce_lazy(x0, q, qinv), reduce_lazy(x1, q, qinv)
                x2, x3 = reduce_lazy(x2, q, qinv), reduce_lazy(x3, q, qinv)
            # stage h/2 (distance 2d): group G
            if LAST:
                x0, x2 = _gs_last(x0, x2, lo, hi, c, q, WIDE)
                x1, x3 = _gs_last(x1, x3, lo, hi, c, q, WIDE)
            else:
                w, wq, w0, w0q = _tw(tw_ptr, wq_ptr, w0_ptr, w0q_ptr, tw + (g0 >> 1) + grp, mask,
                                     WIDE)
                x0, x2 = _gs(x0, x2, w, wq, w0, w0q, c, q, WIDE)
                x1, x3 = _gs(x1, x3, w, wq, w0, w0q, c, q, WIDE)
        else:
            # stage m (distance 2d): group G; then stage 2m (distance d): groups 2G, 2G+1
            w, wq, w0, w0q = _tw(tw_ptr, wq_ptr, w0_ptr, w0q_ptr, tw + g0 + grp, mask, WIDE)
            x0, x2 = _ct(x0, x2, w, wq, w0, w0q, c, q, WIDE)
            x1, x3 = _ct(x1, x3, w, wq, w0, w0q, c, q, WIDE)
            if REDUCE_B:
                x0, x1 = reduce_lazy(x0, q, qinv), reduce_lazy(x1, q, qinv)
                x2, x3 = reduce_lazy(x2, q, qinv), reduce_lazy(x3, q, qinv)
            wa, wqa, w0a, w0qa = _tw(tw_ptr, wq_ptr, w0_ptr, w0q_ptr, tw + 2 * g0 + 2 * grp, mask,
                                     WIDE)
            wb, wqb, w0b, w0qb = _tw(tw_ptr, wq_ptr, w0_ptr, w0q_ptr, tw + 2 * g0 + 2 * grp + 1,
                                     mask, WIDE)
            x0, x1 = _ct(x0, x1, wa, wqa, w0a, w0qa, c, q, WIDE)
            x2, x3 = _ct(x2, x3, wb, wqb, w0b, w0qb, c, q, WIDE)
            if FINAL:
                x0, x1, x2, x3 = _canon(x0, q, qinv), _canon(x1, q, qinv), _canon(x2, q, qinv), \
                    _canon(x3, q, qinv)
        tl.store(base_ptr + i0, x0, mask=mask)
        tl.store(base_ptr + i0 + d, x1, mask=mask)
        tl.store(base_ptr + i0 + 2 * d, x2, mask=mask)
        tl.store(base_ptr + i0 + 3 * d, x3, mask=mask)
    else:
        # one stage: g0 groups, butterflies at distance d
        u = tl.load(src + i0, mask=mask)
        v = tl.load(src + i0 + d, mask=mask)
        if REDUCE_A:
            u, v = reduce_lazy(u, q, qinv), reduce_lazy(v, q, qinv)
        if LAST:
            u, v = _gs_last(u, v, lo, hi, c, q, WIDE)
        else:
            w, wq, w0, w0q = _tw(tw_ptr, wq_ptr, w0_ptr, w0q_ptr, tw + g0 + grp, mask, WIDE)
            if INVERSE:
                u, v = _gs(u, v, w, wq, w0, w0q, c, q, WIDE)
            else:
                u, v = _ct(u, v, w, wq, w0, w0q, c, q, WIDE)
            if FINAL:
                u, v = _canon(u, q, qinv), _canon(v, q, qinv)
        tl.store(base_ptr + i0, u, mask=mask)
        tl.store(base_ptr + i0 + d, v, mask=mask)


def _fields(p, wide: bool) -> tuple[torch.Tensor, ...]:
    """A ``_PartConst``'s ``(w, wq, w0, w0q)``, the narrow scheme's unused halves replaced by
    ``w``/``wq``; all four share one stride on the limb axis."""
    fields = (p.w, p.wq, p.w0, p.w0q) if wide else (p.w, p.wq, p.w, p.wq)
    if len({t.stride(0) for t in fields}) != 1:
        raise ValueError("the fields of an NTT constant differ in layout")
    return fields


def _launches(plan: list[bool]):
    """``(first stage, two stages?, reduce before each, last/final flags)`` per launch: pairs of
    stages, and a single last one when their count is odd."""
    stages = len(plan)
    s = 0
    while s < stages:
        two = s + 1 < stages
        end = s + (2 if two else 1)
        yield s, two, plan[s], two and plan[s + 1], end == stages
        s = end


def ntt_triton(tables, x: torch.Tensor, inverse: bool) -> torch.Tensor:
    """``tables.forward(x)`` (``inverse=False``) or ``tables.inverse(x)`` for an ``NttTables``
    on the device of ``x`` (``[..., L, N]`` int64, any strides): a new tensor, canonical."""
    check_triton_device(x, tables.basis.q)
    n, limbs = tables.n, len(tables.basis)
    if x.dtype != torch.int64 or x.shape[-2:] != (limbs, n):
        raise ValueError(f"expected int64 [..., {limbs}, {n}], got {x.dtype} {tuple(x.shape)}")
    src = x.reshape(-1, limbs, n)
    src = src if src.is_contiguous() else src.contiguous()
    out = torch.empty_like(src)
    if out.numel() == 0:
        return out.view(x.shape)
    log_n = n.bit_length() - 1
    for first, _, run in tables.runs:
        const = run.inv if inverse else run.fw
        wide = const.wide
        q, qinv = run.q, run.qinv
        if q.stride(0) != 1 or qinv.stride(0) != 1:
            raise ValueError("the primes of an NTT run must be a contiguous column")
        tw = _fields(const, wide)
        if tw[0].stride(1) != 1:
            raise ValueError("NTT twiddles must be contiguous along N")
        lo, hi = _fields(run.last_lo, wide), _fields(run.last_hi, wide)
        if lo[0].stride(0) != hi[0].stride(0):
            raise ValueError("the last inverse stage's constants differ in layout")
        c = const.c if wide else qinv
        run_limbs = q.shape[0]
        reading = src
        for s, two, reduce_a, reduce_b, ends in _launches(run.plan(n, inverse)):
            if inverse:  # groups n/2^(s+1), smallest distance 2^s
                g0, log_d = n >> (s + 1), s
            else:  # groups 2^s, smallest distance n/2^(s+2) (two stages) or n/2^(s+1)
                g0, log_d = 1 << s, log_n - s - (2 if two else 1)
            count = n >> (2 if two else 1)
            block = min(_BLOCK, triton.next_power_of_2(count))
            grid = (src.shape[0] * run_limbs, triton.cdiv(count, block))
            _ntt_kernel[grid](
                reading, out, *tw, c, q, qinv, *lo, *hi, tw[0].stride(0), c.stride(0),
                lo[0].stride(0), limbs, run_limbs, first, n, g0, log_d,
                INVERSE=inverse, TWO=two, REDUCE_A=reduce_a, REDUCE_B=reduce_b,
                LAST=inverse and ends, FINAL=not inverse and ends, WIDE=wide, BLOCK=block,
                **NO_FMA)
            reading = out
    return out.view(x.shape)

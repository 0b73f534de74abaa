"""Exact modular arithmetic on int64 residue tensors, any device.

Residues live in int64 tensors shaped ``[..., limbs, N]``; a ``Basis`` holds the primes of the
limb axis as ``[limbs, 1, ...]`` columns so every function broadcasts over leading batch dims
(``ndim`` names how many trailing dims the limb axis heads: 2 for ``[..., L, N]``). Canonical
residues are in ``[0, q)``; ``*_lazy`` products return ``(-q, q)`` for sums reduced once later.

Products use a floating-point quotient estimate and exact wrap-around int64 arithmetic (NTL's
MulMod idea): ``r = a*b - round(a*b/q)*q`` computed modulo 2^64 is the true value whenever the
true value fits in int64, which holds when the estimate is within 1/2 + eps of ``a*b/q``.
Torch's int64 multiply wraps (two's complement) on every device; a test checks it.

Two exact schemes (u = 2^-53 is the double rounding unit). A basis is split into runs of limbs
that share one (``_Part``); with the limb order ``[p, q_0, q_1..]`` the 57-bit primes form one
leading run and the 36-bit primes the rest.

* ``narrow`` (primes < 2^50): for ``|a*b/q| < 2^50`` with ``a``, ``b`` exact in double
  (``|.| < 2^53``), ``fl(fl(a*b) * fl(1/q))`` has relative error <= 3u, so the estimate is off
  by < 3/8 and ``r`` lands in ``(-q, q)``. Lazy operands may thus grow far beyond ``q``.
* ``wide`` (primes < 2^61), inputs ``|a| <= 32q``, ``|b| < q``: the true quotient has up to 66
  bits, more than a double holds, so ``b = b1*2^30 + b0`` is split: (1) ``t = a*b1 -
  round(a*b1/q)*q``: ``|a*b1/q| < 2^36`` is estimated with relative error <= 4u, i.e. absolute
  error < 2^-15, so ``|t| < q``; (2) ``s = t*2^30 + a*b0`` has ``|s/q| < 2^36``, estimated from
  ``t`` and ``a*b0`` in double with relative error <= 9u (< 2^-13 absolute), so ``r = s -
  round(s/q)*q`` is in ``(-q, q)`` and ``r == a*b mod q``. ``|a| <= 32q`` also keeps ``a`` in
  int64 for q < 2^57 (for larger primes, ``|a| < 2^62``).

A product with a fixed operand (NTT twiddles, RNS constants) precomputes ``w/q`` (and the split
of ``w``) once: ``MulConst``; its bounds are the same with one rounding fewer.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Basis", "MulConst", "NARROW_BITS", "WIDE_BITS", "SPLIT"]

NARROW_BITS = 50
WIDE_BITS = 61
SPLIT = 30
_LOW = (1 << SPLIT) - 1
_TWO_SPLIT = float(1 << SPLIT)


def _fix(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``(-q, q) -> [0, q)``, in place: every caller passes a temporary of its own."""
    return r.add_((r >> 63) & q)


def _col(x: torch.Tensor, ndim: int) -> torch.Tensor:
    return x.view((x.shape[0],) + (1,) * (ndim - 1))


def _cut(t: torch.Tensor, start: int, stop: int, ndim: int, limbs: int) -> torch.Tensor:
    """The limbs ``[start, stop)`` of an operand whose limb axis is ``-ndim`` (a broadcast
    operand, size 1 or missing there, is used whole)."""
    if t.dim() < ndim or t.shape[-ndim] != limbs:
        return t
    return t.narrow(t.dim() - ndim, start, stop - start)


@dataclass(frozen=True)
class _Part:
    """A run of limbs whose primes share one product scheme."""

    q: torch.Tensor  # int64 [L]
    qinv: torch.Tensor  # float64 [L]
    wide: bool
    limit: float  # lazy values must stay below this magnitude (product preconditions)

    def mul_lazy(self, a: torch.Tensor, b: torch.Tensor, ndim: int) -> torch.Tensor:
        # in-place steps on fresh temporaries: fewer allocations, the same floating-point order
        q, qinv = _col(self.q, ndim), _col(self.qinv, ndim)
        af = a.to(torch.float64)
        if not self.wide:
            qh = torch.mul(af, b.to(torch.float64)).mul_(qinv).round_().to(torch.int64).mul_(q)
            return torch.mul(a, b).sub_(qh)
        b1, b0 = b >> SPLIT, b & _LOW
        qh = torch.mul(af, b1.to(torch.float64)).mul_(qinv).round_().to(torch.int64).mul_(q)
        t = torch.mul(a, b1).sub_(qh)
        s_f = torch.mul(t.to(torch.float64), _TWO_SPLIT).add_(torch.mul(af, b0.to(torch.float64)))
        return (t << SPLIT).add_(torch.mul(a, b0)).sub_(s_f.mul_(qinv).round_().to(torch.int64).mul_(q))

    def const(self, w: torch.Tensor) -> _PartConst:
        w = w.to(torch.int64)
        ndim = w.dim()
        q, qf = _col(self.q, ndim), _col(self.q, ndim).to(torch.float64)
        if not self.wide:
            return _PartConst(q, False, w, w.to(torch.float64) / qf)
        w1, w0 = w >> SPLIT, w & _LOW
        return _PartConst(q, True, w1, w1.to(torch.float64) / qf, w0, w0.to(torch.float64) / qf,
                          _TWO_SPLIT / qf)


@dataclass(frozen=True)
class _PartConst:
    q: torch.Tensor
    wide: bool
    w: torch.Tensor  # narrow: w; wide: w1
    wq: torch.Tensor  # fl(w/q) or fl(w1/q)
    w0: torch.Tensor | None = None
    w0q: torch.Tensor | None = None
    c: torch.Tensor | None = None  # fl(2^30/q)

    def map(self, f) -> _PartConst:
        """Apply ``f`` to the constant's fields (not to the prime columns)."""
        g = lambda x: None if x is None else f(x)  # noqa: E731
        return _PartConst(self.q, self.wide, f(self.w), f(self.wq), g(self.w0), g(self.w0q), self.c)

    def limbs(self, s: slice) -> _PartConst:
        g = lambda x: None if x is None else x[s]  # noqa: E731
        return _PartConst(self.q[s], self.wide, self.w[s], self.wq[s], g(self.w0), g(self.w0q), g(self.c))

    def mul_lazy(self, a: torch.Tensor) -> torch.Tensor:
        """``a`` has the full shape (the constant broadcasts into it)."""
        af = a.to(torch.float64)
        qh = torch.mul(af, self.wq).round_().to(torch.int64).mul_(self.q)
        if not self.wide:
            return torch.mul(a, self.w).sub_(qh)
        t = torch.mul(a, self.w).sub_(qh)
        s = torch.mul(t.to(torch.float64), self.c).add_(af.mul_(self.w0q))
        return (t << SPLIT).add_(torch.mul(a, self.w0)).sub_(s.round_().to(torch.int64).mul_(self.q))


def _runs(primes: tuple[int, ...]) -> list[tuple[int, int, bool]]:
    """Maximal runs of limbs sharing a scheme: ``(start, stop, wide)``."""
    out: list[tuple[int, int, bool]] = []
    for i, p in enumerate(primes):
        wide = p.bit_length() > NARROW_BITS
        if out and out[-1][2] == wide:
            out[-1] = (out[-1][0], i + 1, wide)
        else:
            out.append((i, i + 1, wide))
    return out


@dataclass(frozen=True)
class Basis:
    """The primes of a limb axis, as ``[L, 1]`` columns on one device, split into runs."""

    primes: tuple[int, ...]
    q: torch.Tensor  # int64 [L, 1]
    qinv: torch.Tensor  # float64 [L, 1]: fl(1/q)
    parts: tuple[tuple[int, int, _Part], ...]

    @staticmethod
    def of(primes: Sequence[int], device: torch.device | str = "cpu") -> Basis:
        primes = tuple(int(p) for p in primes)
        if not primes or any(p % 2 == 0 or not 20 <= p.bit_length() <= WIDE_BITS for p in primes):
            raise ValueError(f"primes must be odd, of 20 to {WIDE_BITS} bits: {primes}")
        q = torch.tensor(primes, dtype=torch.int64, device=device)
        qinv = 1.0 / q.to(torch.float64)
        parts = []
        for start, stop, wide in _runs(primes):
            top = max(primes[start:stop])
            limit = min(32.0 * top, 2.0**62) if wide else 2.0**50
            parts.append((start, stop, _Part(q[start:stop], qinv[start:stop], wide, limit)))
        return Basis(primes, q.view(-1, 1), qinv.view(-1, 1), tuple(parts))

    def limbs(self, s: slice) -> Basis:
        """The basis of a run of limbs (views of these columns and tables)."""
        start, stop, _ = s.indices(len(self.primes))
        parts = []
        for a, b, part in self.parts:
            lo, hi = max(a, start), min(b, stop)
            if lo < hi:
                cut = slice(lo - a, hi - a)
                parts.append((lo - start, hi - start, _Part(part.q[cut], part.qinv[cut], part.wide, part.limit)))
        return Basis(self.primes[s], self.q[s], self.qinv[s], tuple(parts))

    def __len__(self) -> int:
        return len(self.primes)

    @functools.cached_property
    def wide_limbs(self) -> torch.Tensor:
        """``int32 [L]``, 1 where a limb takes the wide product: kernels whose launch spans the
        runs read their limb's scheme from it."""
        flags = [int(part.wide) for a, b, part in self.parts for _ in range(b - a)]
        return torch.tensor(flags, dtype=torch.int32, device=self.q.device)

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def wide(self) -> bool:
        return any(part.wide for _, _, part in self.parts)

    def cols(self, ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, qinv)`` as ``[L, 1, ..., 1]`` with ``ndim`` dims in all."""
        return _col(self.q, ndim), _col(self.qinv, ndim)

    # ---- additive (one formula for every prime size) -------------------------------------------
    def add(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _fix(torch.add(a, b).sub_(self.q), self.q)

    def sub(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _fix(a - b, self.q)

    def neg(self, a: torch.Tensor) -> torch.Tensor:
        return _fix(-a, self.q)

    def reduce(self, x: torch.Tensor, ndim: int = 2) -> torch.Tensor:
        """Any int64 ``x`` -> ``[0, q)`` (primes >= 2^20). ``|x/q| < 2^43`` is estimated with
        relative error <= 3u (absolute < 2^-9), so ``x - round(x/q)*q`` is in ``(-q, q)``."""
        q, qinv = self.cols(ndim)
        r = x - torch.mul(x.to(torch.float64), qinv).round_().to(torch.int64).mul_(q)
        return r.add_((r >> 63) & q)

    def center(self, a: torch.Tensor) -> torch.Tensor:
        """``[0, q) -> (-q/2, q/2]``."""
        return torch.where(a > (self.q >> 1), a - self.q, a)

    # ---- multiplicative (per run of limbs) ---------------------------------------------------
    def _split(self, fn, operands: Sequence[torch.Tensor], ndim: int) -> torch.Tensor:
        if len(self.parts) == 1:
            return fn(self.parts[0][2], *operands)
        n = len(self.primes)
        outs = [fn(part, *(_cut(t, a, b, ndim, n) for t in operands)) for a, b, part in self.parts]
        return torch.cat(outs, dim=-ndim)

    def mul_lazy(self, a: torch.Tensor, b: torch.Tensor, ndim: int = 2) -> torch.Tensor:
        """``a*b mod q`` in ``(-q, q)`` (preconditions in the module docstring)."""
        return self._split(lambda part, x, y: part.mul_lazy(x, y, ndim), (a, b), ndim)

    def mul(self, a: torch.Tensor, b: torch.Tensor, ndim: int = 2) -> torch.Tensor:
        return _fix(self.mul_lazy(a, b, ndim), self.cols(ndim)[0])

    def const(self, w: torch.Tensor) -> MulConst:
        """Precompute a fixed operand ``w`` (residues ``[0, q)``, limbs on dim 0, as many dims as
        the data it multiplies from its limb axis on; a one-prime basis takes any ``w``)."""
        if len(self.primes) == 1:
            parts = ((0, 1, self.parts[0][2].const(w)),)
        else:
            parts = tuple((a, b, part.const(w[a:b])) for a, b, part in self.parts)
        return MulConst(len(self.primes), w.dim(), parts, _col(self.q.view(-1), w.dim()))


@dataclass(frozen=True)
class MulConst:
    """A fixed multiplicand with its quotient factors, per run of limbs."""

    limbs_: int
    ndim: int
    parts: tuple[tuple[int, int, _PartConst], ...]
    q: torch.Tensor  # [L, 1, ...]: the primes of all runs

    @functools.cached_property
    def stacked(self) -> tuple[torch.Tensor, ...]:
        """The constant's ``(w, fl(w/q), w0, fl(w0/q))`` over all runs, each ``[L, -1]``
        contiguous (narrow limbs repeat ``w``, ``fl(w/q)``), and ``c = fl(2^30/q)`` ``[L]``
        (0 on narrow limbs, which do not read it): for kernels whose launch spans the runs
        (each program reading its limb's scheme from ``Basis.wide_limbs``)."""
        cols: list[list[torch.Tensor]] = [[], [], [], [], []]
        for a, b, p in self.parts:
            fields = (p.w, p.wq, p.w0, p.w0q) if p.wide else (p.w, p.wq, p.w, p.wq)
            for col, f in zip(cols[:4], fields, strict=True):
                col.append(f.reshape(b - a, -1))
            cols[4].append(p.c.reshape(b - a) if p.wide else p.wq.new_zeros(b - a))
        return tuple(torch.cat(col).contiguous() for col in cols)

    def limbs(self, s: slice) -> MulConst:
        start, stop, _ = s.indices(self.limbs_)
        parts = []
        for a, b, part in self.parts:
            lo, hi = max(a, start), min(b, stop)
            if lo < hi:
                parts.append((lo - start, hi - start, part.limbs(slice(lo - a, hi - a))))
        return MulConst(stop - start, self.ndim, tuple(parts), self.q[s])

    def __getitem__(self, idx) -> MulConst:
        """Slice the constant's non-limb dims (e.g. one NTT stage's twiddles): ``idx`` indexes
        from dim 1 on."""
        idx = idx if isinstance(idx, tuple) else (idx,)
        parts = tuple((a, b, p.map(lambda x: x[(slice(None),) + idx])) for a, b, p in self.parts)
        return MulConst(self.limbs_, self.ndim, parts, self.q)

    def mul_lazy(self, a: torch.Tensor) -> torch.Tensor:
        """``a*w mod q`` in ``(-q, q)``: narrow for ``|a*w/q| < 2^51`` (``a`` exact, ``fl(w/q)``
        and the product add 2u: error < 1/4); wide for ``|a| <= 32q`` (relative errors <= 3u
        and 8u in the two estimates)."""
        if len(self.parts) == 1:
            return self.parts[0][2].mul_lazy(a)
        outs = [p.mul_lazy(_cut(a, lo, hi, self.ndim, self.limbs_)) for lo, hi, p in self.parts]
        return torch.cat(outs, dim=-self.ndim)

    def mul(self, a: torch.Tensor) -> torch.Tensor:
        return _fix(self.mul_lazy(a), self.q)

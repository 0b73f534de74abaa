"""Exact modular arithmetic on int64 residue tensors, any device.

Residues live in int64 tensors shaped ``[..., limbs, N]``; a ``Basis`` holds the primes of the
limb axis as ``[limbs, 1]`` columns so every function broadcasts over leading batch dims.
Canonical residues are in ``[0, q)``; the ``*_lazy`` variants return ``(-q, q)`` for sums that
are reduced once at the end.

Products use a floating-point quotient estimate and exact wrap-around int64 arithmetic (NTL's
MulMod idea): ``r = a*b - round(a*b/q)*q`` computed modulo 2^64 is the true value whenever the
true value fits in int64, which holds when the estimate is within 1/2 + eps of ``a*b/q``.
Torch's int64 multiply wraps (two's complement) on every device; a test checks it.

Two exact schemes, chosen per basis (u = 2^-53 is the double rounding unit):

* ``narrow`` (every prime < 2^50), inputs ``|a|, |b| < q``: ``a`` and ``b`` convert to double
  exactly; ``fl(fl(a*b) * fl(1/q))`` has relative error <= 3u, so the estimate of
  ``|a*b/q| < 2^50`` is off by <= 3 * 2^-3 < 1/2 and ``r`` lands in ``(-q, q)``.
* ``wide`` (primes < 2^61: the 57- and 60-bit primes), inputs ``|a|, |b| < q``: the true
  quotient has up to 61 bits, more than a double holds, so ``b = b1*2^30 + b0`` is split:
  (1) ``t = a*b1 - round(a*b1/q)*q``: ``|a*b1/q| < 2^31`` is estimated with relative error
  <= 4u, i.e. absolute error < 2^-20, so ``|t| < q``; (2) ``s = t*2^30 + a*b0`` has
  ``|s/q| < 2^31``, estimated from ``t`` and ``a*b0`` in double with relative error <= 9u
  (< 2^-19 absolute), so ``r = s - round(s/q)*q`` is in ``(-q, q)`` and ``r == a*b mod q``.

A product with a fixed operand (NTT twiddles, rescale constants) precomputes ``w/q`` (and the
split of ``w``) once: ``MulConst``; its bounds are the same with one rounding fewer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Basis", "MulConst", "NARROW_BITS", "WIDE_BITS", "SPLIT"]

#: Primes below 2^NARROW_BITS take the one-quotient product; below 2^WIDE_BITS the split one.
NARROW_BITS = 50
WIDE_BITS = 61
SPLIT = 30
_LOW = (1 << SPLIT) - 1
_TWO_SPLIT = float(1 << SPLIT)


def _round_i64(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x).to(torch.int64)


def _fix(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``(-q, q) -> [0, q)``."""
    return r + ((r >> 63) & q)


@dataclass(frozen=True)
class Basis:
    """The primes of a limb axis, as broadcastable ``[limbs, 1]`` columns on one device."""

    primes: tuple[int, ...]
    q: torch.Tensor  # int64 [L, 1]
    qf: torch.Tensor  # float64 [L, 1]
    qinv: torch.Tensor  # float64 [L, 1]: fl(1/q)
    wide: bool

    @staticmethod
    def of(primes: Sequence[int], device: torch.device | str = "cpu") -> Basis:
        primes = tuple(int(p) for p in primes)
        if not primes or any(p % 2 == 0 or not 20 <= p.bit_length() <= WIDE_BITS for p in primes):
            raise ValueError(f"primes must be odd, of 20 to {WIDE_BITS} bits: {primes}")
        q = torch.tensor(primes, dtype=torch.int64, device=device).view(-1, 1)
        qf = q.to(torch.float64)
        wide = max(primes).bit_length() > NARROW_BITS
        return Basis(primes, q, qf, 1.0 / qf, wide)

    def limbs(self, s: slice) -> Basis:
        """The basis of a run of limbs (views of these columns)."""
        primes = self.primes[s]
        wide = max(primes).bit_length() > NARROW_BITS
        return Basis(primes, self.q[s], self.qf[s], self.qinv[s], wide)

    def __len__(self) -> int:
        return len(self.primes)

    @property
    def device(self) -> torch.device:
        return self.q.device

    def cols(self, ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, qinv)`` reshaped to ``[L, 1, ..., 1]`` with ``ndim`` dims in all (for views
        such as the NTT's ``[..., L, m, t]``)."""
        shape = (len(self.primes),) + (1,) * (ndim - 1)
        return self.q.view(shape), self.qinv.view(shape)

    # ---- additive ----------------------------------------------------------------------------
    def add(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        r = a + b - self.q
        return _fix(r, self.q)

    def sub(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _fix(a - b, self.q)

    def neg(self, a: torch.Tensor) -> torch.Tensor:
        return _fix(-a, self.q)

    def reduce(self, x: torch.Tensor, q=None, qinv=None) -> torch.Tensor:
        """Any int64 ``x`` -> ``[0, q)`` (primes >= 2^20). ``|x/q| < 2^43`` is estimated with
        relative error <= 3u (absolute < 2^-9), so ``x - round(x/q)*q`` is in ``(-q, q)``."""
        q = self.q if q is None else q
        qinv = self.qinv if qinv is None else qinv
        return _fix(x - _round_i64(x.to(torch.float64) * qinv) * q, q)

    def center(self, a: torch.Tensor) -> torch.Tensor:
        """``[0, q) -> (-q/2, q/2]``."""
        return torch.where(a > (self.q >> 1), a - self.q, a)

    # ---- multiplicative ----------------------------------------------------------------------
    def mul_lazy(self, a: torch.Tensor, b: torch.Tensor, q=None, qinv=None) -> torch.Tensor:
        """``a*b mod q`` in ``(-q, q)`` for ``|a|, |b| < q`` (bounds in the module docstring).
        ``q``/``qinv`` override the ``[L, 1]`` columns for other view shapes."""
        q = self.q if q is None else q
        qinv = self.qinv if qinv is None else qinv
        af = a.to(torch.float64)
        if not self.wide:
            qh = _round_i64(af * b.to(torch.float64) * qinv)
            return a * b - qh * q
        b1, b0 = b >> SPLIT, b & _LOW
        t = a * b1 - _round_i64(af * b1.to(torch.float64) * qinv) * q
        s_f = t.to(torch.float64) * _TWO_SPLIT + af * b0.to(torch.float64)
        return (t << SPLIT) + a * b0 - _round_i64(s_f * qinv) * q

    def mul(self, a: torch.Tensor, b: torch.Tensor, q=None, qinv=None) -> torch.Tensor:
        q = self.q if q is None else q
        return _fix(self.mul_lazy(a, b, q, qinv), q)

    def const(self, w: torch.Tensor, ndim: int = 2) -> MulConst:
        """Precompute a fixed operand ``w`` (residues ``[0, q)``, ``ndim`` dims with the limbs
        first, broadcastable against the data) for repeated products."""
        q, qinv = self.cols(ndim)
        return MulConst.build(w, q, qinv, self.wide)


@dataclass(frozen=True)
class MulConst:
    """A fixed multiplicand ``w`` with its quotient factors: ``w/q`` (narrow), or the split
    ``w = w1*2^30 + w0`` with ``w1/q``, ``w0/q`` and ``2^30/q`` (wide)."""

    w: torch.Tensor
    q: torch.Tensor
    wide: bool
    wq: torch.Tensor  # narrow: fl(w/q); wide: fl(w1/q)
    w1: torch.Tensor | None = None
    w0: torch.Tensor | None = None
    w0q: torch.Tensor | None = None
    c: torch.Tensor | None = None  # fl(2^30/q)

    @staticmethod
    def build(w: torch.Tensor, q: torch.Tensor, qinv: torch.Tensor, wide: bool) -> MulConst:
        w = w.to(torch.int64)
        qf = q.to(torch.float64)
        if not wide:
            return MulConst(w, q, False, w.to(torch.float64) / qf)
        w1, w0 = w >> SPLIT, w & _LOW
        return MulConst(w, q, True, w1.to(torch.float64) / qf, w1, w0,
                        w0.to(torch.float64) / qf, _TWO_SPLIT / qf)

    def limbs(self, s: slice) -> MulConst:
        """The constant restricted to a run of limbs (dim 0 of every field)."""
        def cut(x):
            return None if x is None else x[s]
        return MulConst(self.w[s], self.q[s], self.wide, self.wq[s], cut(self.w1), cut(self.w0),
                        cut(self.w0q), cut(self.c))

    def __getitem__(self, idx) -> MulConst:
        """Slice the constant (not the prime columns): e.g. one NTT stage's twiddles."""
        def cut(x):
            return None if x is None else x[idx]
        return MulConst(self.w[idx], self.q, self.wide, self.wq[idx], cut(self.w1), cut(self.w0),
                        cut(self.w0q), self.c)

    def mul_lazy(self, a: torch.Tensor) -> torch.Tensor:
        """``a*w mod q`` in ``(-q, q)`` for ``|a| < q``. Narrow: ``a`` exact in double, ``fl(w/q)``
        and the product add 2u (estimate off by < 2^-2). Wide: as ``Basis.mul_lazy``, with the
        quotient factors precomputed (relative errors <= 3u and 8u)."""
        af = a.to(torch.float64)
        if not self.wide:
            return a * self.w - _round_i64(af * self.wq) * self.q
        t = a * self.w1 - _round_i64(af * self.wq) * self.q
        s = t.to(torch.float64) * self.c + af * self.w0q
        return (t << SPLIT) + a * self.w0 - _round_i64(s) * self.q

    def mul(self, a: torch.Tensor) -> torch.Tensor:
        return _fix(self.mul_lazy(a), self.q)

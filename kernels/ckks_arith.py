"""Exact modular products in Triton: ``veil.crypto.native.modarith``'s two schemes, per element.

The CKKS kernels (``ckks_ntt``, ``ckks_ops``) build on these ``@triton.jit`` helpers. Each one
performs the floating-point operations of its torch twin in ``modarith`` in the same order, so
the bounds proved in ``modarith``'s docstring hold unchanged:

* ``r = a*b - k*q`` is computed in int64 that wraps modulo 2^64 (two's complement: numpy under
  the interpreter, ``mul.lo.s64`` / ``shl.b64`` on the GPU; ``test_ckks_kernels`` checks the
  wrap) and equals the true value whenever the estimate ``k`` of ``a*b/q`` is off by < 1;
* the estimate is rounded with ``floor(x + 0.5)`` (round half up; torch rounds half to even):
  modarith's bounds only ask for an integer within 1/2 of ``x``, never for a tie rule, and
  ``x + 0.5`` is exact because every estimate here has ``|x| < 2^51`` (narrow products), 2^37
  (wide ones) or 2^43 (``reduce``), where a double's ulp is at most 1/4;
* launches pass ``enable_fp_fusion=False`` (``NO_FMA``): an FMA would drop a rounding the
  bounds count. Fewer roundings would only tighten them, but without fusion the GPU's quotient
  estimates equal torch's, which keeps kernel and twin easy to compare.

Residues are int64, the estimates float64. Canonical residues are in ``[0, q)``; ``*_lazy``
results in ``(-q, q)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from veil.kernels._utils import interpreter_enabled

#: launch options of every CKKS kernel (see the module docstring)
NO_FMA = {"enable_fp_fusion": False}


def use_triton(t: torch.Tensor) -> bool:
    """The dispatch rule of the native backend: the Triton kernels for CUDA tensors, the torch
    twins otherwise. Under the interpreter (TRITON_INTERPRET=1, which the test suite sets) CUDA
    tensors take the twins too: interpreted kernels would run as Python on host copies, minutes
    per key switch at N=16384; the kernel tests call the launchers directly instead."""
    return t.is_cuda and not interpreter_enabled()

SPLIT: tl.constexpr = tl.constexpr(30)  # modarith.SPLIT: the wide scheme's 30-bit halves
LOW: tl.constexpr = tl.constexpr((1 << 30) - 1)
TWO_SPLIT: tl.constexpr = tl.constexpr(float(1 << 30))


@triton.jit
def rint(x):
    """Nearest integer (ties up) of a float64 ``|x| < 2^51``, as int64."""
    return tl.floor(x + 0.5).to(tl.int64)


@triton.jit
def fix(r, q):
    """``(-q, q) -> [0, q)``: add ``q`` where the sign bit is set."""
    return r + ((r >> 63) & q)


@triton.jit
def reduce_lazy(x, q, qinv):
    """Any int64 ``x`` -> ``(-q, q)`` (``Basis.reduce``): ``|x/q| < 2^43`` for q >= 2^20, estimated
    with relative error <= 3u, i.e. off by < 2^-9."""
    return x - rint(x.to(tl.float64) * qinv) * q


@triton.jit
def mul_lazy(a, b, q, qinv, WIDE: tl.constexpr):
    """``a*b mod q`` in ``(-q, q)`` for two variable operands (``_Part.mul_lazy``). Narrow: ``a``,
    ``b`` exact in double and ``|a*b/q| < 2^50``. Wide: ``|a| <= 32q`` (``|a| < 2^62``),
    ``0 <= b < q``; ``b`` is split into 30-bit halves."""
    af = a.to(tl.float64)
    if WIDE:
        b1 = b >> SPLIT
        b0 = b & LOW
        t = a * b1 - rint(af * b1.to(tl.float64) * qinv) * q  # |a*b1/q| < 2^36, off by < 2^-15
        s = t.to(tl.float64) * TWO_SPLIT + af * b0.to(tl.float64)  # |s/q| < 2^36, off by < 2^-13
        return (t << SPLIT) + a * b0 - rint(s * qinv) * q
    else:
        return a * b - rint(af * b.to(tl.float64) * qinv) * q


@triton.jit
def mul_const_lazy(a, w, wq, w0, w0q, c, q, WIDE: tl.constexpr):
    """``a*w mod q`` in ``(-q, q)`` for a precomputed constant (``_PartConst.mul_lazy``). Narrow:
    ``w``, ``wq = fl(w/q)``, ``|a*w/q| < 2^51``. Wide: ``w`` is the high half ``w1``, ``wq =
    fl(w1/q)``, ``w0``/``w0q`` the low half, ``c = fl(2^30/q)``; ``|a| <= 32q``."""
    af = a.to(tl.float64)
    t = a * w - rint(af * wq) * q
    if WIDE:
        s = t.to(tl.float64) * c + af * w0q
        t = (t << SPLIT) + a * w0 - rint(s) * q
    return t

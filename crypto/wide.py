"""Wide integers as vectors of 32-bit limbs in numpy ``uint64`` lanes: exact arithmetic modulo
``2^bits`` on thousands of coefficients at once without Python integers (products modulo the
primes are ``veil.crypto.native.modarith``'s).

Why: the rounded downloads (``crypto/rounding.py``) map every coefficient of a ciphertext
through values of ~130 bits. Done with numpy object arrays of Python ints that took ~25 ms per
ciphertext on the host, the largest per-session cost of a protected step on a GPU (measured
2026-11-26, ``benchmarks/results/2026-11-26-gpu``).

A limb vector ``[count, W]`` holds ``sum_k x[:, k] * 2^(32k)``, each ``x[:, k] < 2^32``; the
``uint64`` lanes leave room to add many partial products before carrying.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MASK32", "to_limbs", "carry", "mul_mod_2k"]

MASK32 = np.uint64(0xFFFF_FFFF)
_S32 = np.uint64(32)


def to_limbs(x: int, width: int) -> list[int]:
    """A non-negative Python int -> its ``width`` low 32-bit limbs, least significant first."""
    return [(x >> (32 * k)) & 0xFFFF_FFFF for k in range(width)]


def carry(cols: np.ndarray, bits: int) -> np.ndarray:
    """Column sums ``[count, W]`` (each < 2^63) -> proper limbs of the value mod ``2^bits``
    (``bits <= 32 W``), in place."""
    width = cols.shape[1]
    for k in range(width - 1):
        cols[:, k + 1] += cols[:, k] >> _S32
        cols[:, k] &= MASK32
    cols[:, -1] &= np.uint64((1 << (bits - 32 * (width - 1))) - 1)
    return cols


def mul_mod_2k(a: np.ndarray, c: int, bits: int, out: np.ndarray | None = None) -> np.ndarray:
    """Column sums of ``a * c mod 2^bits`` for limb vectors ``a`` ``[count, A]`` and a constant
    ``c``, added into ``out`` ``[count, W]`` (``W = ceil(bits / 32)``); the caller carries."""
    width = -(-bits // 32)
    if out is None:
        out = np.zeros((a.shape[0], width), dtype=np.uint64)
    for k, ck in enumerate(to_limbs(c, width)):
        if ck == 0:
            continue
        for j in range(min(a.shape[1], width - k)):
            p = a[:, j] * np.uint64(ck)  # < 2^64: two 32-bit limbs
            out[:, j + k] += p & MASK32
            if j + k + 1 < width:
                out[:, j + k + 1] += p >> _S32
    return out

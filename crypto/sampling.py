"""Integer polynomials the server samples itself, from the OS CSPRNG only.

Refresh masks and flooding noise are secret material: they come from ``os.urandom``, never from
torch's or numpy's generators (which are not cryptographic). Backends share these samplers.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["urandom_u64", "uniform_int_poly", "standard_normal", "gaussian_int_poly"]


def urandom_u64(count: int) -> np.ndarray:
    return np.frombuffer(os.urandom(8 * count), dtype="<u8").astype(np.uint64)


def uniform_int_poly(n: int, bits: int) -> np.ndarray:
    """``n`` independent uniform integers in ``[-2^bits, 2^bits)``, as an object array of
    Python ints."""
    if bits < 1 or bits > 127:
        raise ValueError("mask bits must be in [1, 127]")
    total = bits + 1
    lo = urandom_u64(n)
    if total <= 64:
        vals = (lo & np.uint64((1 << total) - 1)).astype(object)
    else:
        hi = urandom_u64(n) & np.uint64((1 << (total - 64)) - 1)
        vals = (hi.astype(object) << 64) + lo.astype(object)
    return vals - (1 << bits)


def standard_normal(n: int) -> np.ndarray:
    """``n`` samples of N(0, 1) (Box-Muller on 53-bit uniforms), float64."""
    u = urandom_u64(2 * n) >> np.uint64(11)  # 53 random bits
    u = (u.astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
    return np.sqrt(-2.0 * np.log(u[:n])) * np.cos(2.0 * np.pi * u[n:])


def gaussian_int_poly(n: int, sigma: float) -> np.ndarray:
    """``n`` samples of round(N(0, sigma^2)), int64."""
    if sigma <= 0:
        return np.zeros(n, dtype=np.int64)
    if sigma > 2.0**52:
        raise ValueError("flooding sigma too large for double-precision sampling")
    return np.rint(standard_normal(n) * sigma).astype(np.int64)

"""The rounded downloads' coefficient maps in C (``rounding_cpu.c``), built on first use.

* ``round_pack``: residues ``(P, L, N)`` of ``c`` -> ``round(c * 2^bits / Q) mod 2^bits``,
  bit-packed. Twin: ``veil.crypto.rounding._round`` + ``_pack_bits`` (the same bytes: the
  integer part is exact in both, and the double sum of the fractions differs only far inside
  the 2^-30 band around a half that both hand to the exact path).
* ``unround``: the packed values -> the residues ``(P, L, N)`` of ``round(v * Q / 2^bits)``.
  Twin: ``veil.crypto.rounding.unround``'s numpy body.

Why C: the twins make a dozen numpy passes per prime over ``[count, W]`` limb arrays and
unpack the bits into bytes; they took ~8.6 ms to round one flooded download and ~11 ms to load
it on the H100 machine's host (``he_ops``, benchmarks/results/2026-11-28-gpu), the largest
host cost of a protected step at 16 sessions on a GPU. Here a coefficient is one pass.
Tests: ``tests/test_rounding.py`` (C = twin, byte for byte and residue for residue).
"""

from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path

import numpy as np

from veil.kernels import cbuild

__all__ = ["available", "round_pack", "unround"]

_SOURCE = Path(__file__).with_name("rounding_cpu.c")
_MAX_LIMBS32 = 16  # the C file's MAXW
_MAX_Q = 1 << 62


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = cbuild.load(_SOURCE, ("-O3", "-ffp-contract=off"))
    if lib is None:
        return None
    p, i64, i = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.veil_round_pack.argtypes = [p, p, i64, i64, i64, p, p, p, p, p, i, i]
    lib.veil_round_pack.restype = i64
    lib.veil_unround.argtypes = [p, p, i64, i64, i64, p, i, i, p, p, p, p, p, p]
    lib.veil_unround.restype = None
    return lib


def available() -> bool:
    return cbuild.enabled() and _library() is not None


def _shoup(w, q) -> np.ndarray:
    """Shoup's quotients ``floor(w * 2^64 / q)`` of constants ``w`` modulo primes ``q``."""
    return np.array([(int(a) << 64) // int(b) for a, b in zip(np.ravel(w), np.ravel(q), strict=True)],
                    dtype=np.uint64).reshape(np.shape(w))


def _limbs32(x: int, width: int) -> np.ndarray:
    return np.array([(x >> (32 * k)) & 0xFFFF_FFFF for k in range(width)], dtype=np.uint32)


@functools.lru_cache(maxsize=64)
def _round_consts(primes: tuple[int, ...], bits: int):
    q, mod, w = math.prod(primes), 1 << bits, -(-bits // 32)
    k = np.array([(pow(q // qi, -1, qi) << bits) % qi for qi in primes], dtype=np.uint64)
    c = np.concatenate([_limbs32((-pow(qi, -1, mod)) % mod, w) for qi in primes])
    qs = np.array(primes, dtype=np.uint64)
    return qs, k, _shoup(k, qs), 1.0 / qs.astype(np.float64), c, w


@functools.lru_cache(maxsize=64)
def _unround_consts(primes: tuple[int, ...], bits: int):
    q, mod, w = math.prod(primes), 1 << bits, -(-bits // 32)
    radix = np.array([[pow(2, 32 * j, qi) for j in range(w)] for qi in primes], dtype=np.uint64)
    half = np.array([pow(2, bits - 1, qi) for qi in primes], dtype=np.uint64)
    inv = np.array([pow(mod, -1, qi) for qi in primes], dtype=np.uint64)
    qs = np.array(primes, dtype=np.uint64)
    return (qs, _limbs32(q % mod, w), radix, _shoup(radix, np.repeat(qs[:, None], w, 1)), half, inv,
            _shoup(inv, qs), w)


def _usable(primes: tuple[int, ...], bits: int) -> bool:
    return available() and -(-bits // 32) <= _MAX_LIMBS32 and max(primes) < _MAX_Q


def round_pack(coeffs: np.ndarray, primes: tuple[int, ...], bits: int) -> bytes | None:
    """Canonical residues ``(P, L, N)`` (uint64) -> the packed rounded values, or None where the
    kernel is not built or a coefficient's fractions sum to within 2^-30 of a half (the caller's
    exact path decides those)."""
    if not _usable(primes, bits):
        return None
    polys, limbs, n = coeffs.shape
    if limbs != len(primes):
        raise ValueError("residues do not match the primes")
    res = np.ascontiguousarray(coeffs, dtype=np.uint64)
    qs, k, kp, qinv, c, w = _round_consts(primes, bits)
    out = np.zeros((polys * n * bits + 7) // 8, dtype=np.uint8)
    near = _library().veil_round_pack(out.ctypes.data, res.ctypes.data, polys, limbs, n, qs.ctypes.data,
                                      k.ctypes.data, kp.ctypes.data, qinv.ctypes.data, c.ctypes.data, w, bits)
    return None if near else out.tobytes()


def unround(body: bytes, polys: int, n: int, primes: tuple[int, ...], bits: int) -> np.ndarray | None:
    """The packed rounded values -> residues ``(P, L, N)`` (uint64), or None where the kernel is
    not built."""
    if not _usable(primes, bits):
        return None
    if len(body) != (polys * n * bits + 7) // 8:
        raise ValueError("rounded body of the wrong length")
    qs, qlimbs, radix, radixp, half, inv, invp, w = _unround_consts(primes, bits)
    src = np.frombuffer(body, dtype=np.uint8)
    out = np.empty((polys, len(primes), n), dtype=np.uint64)
    _library().veil_unround(out.ctypes.data, src.ctypes.data, polys, len(primes), n, qlimbs.ctypes.data, w, bits,
                            qs.ctypes.data, radix.ctypes.data, radixp.ctypes.data, half.ctypes.data,
                            inv.ctypes.data, invp.ctypes.data)
    return out

"""Rounded downloads: a ciphertext's coefficients sent only down to the noise they already carry.

Why: every ciphertext the server sends down is flooded with Gaussian noise of std ``σ``
coefficient units (circuit privacy), so the low ``log2 σ`` bits of ``m = c0 + c1·s mod Q`` are
noise before they leave. The server maps each coefficient of ``c0`` and ``c1`` from ``[0, Q)``
to ``[0, 2^b)`` (``c' = round(c · 2^b / Q)``) and the client maps it back
(``ĉ = round(c' · Q / 2^b)``). Each coefficient then errs by at most ``Q / 2^(b+1)``, and the
decrypted polynomial by ``e0 + e1·s``: for a ternary secret of N coefficients its std is about
``(Q / 2^b) · sqrt((1 + 2N/3) / 12)`` (30 · Q / 2^b at N = 16384). With
``b = ceil(log2 Q) - floor(log2 σ) + MARGIN_BITS`` that is under ``σ / 4``: the noise the
client decrypts grows by at most 3%. Nothing the server sends is more than it sent before
(the rounded coefficients are a function of the old ones).

Rounding in RNS needs the coefficient itself, so the ciphertext is taken out of NTT form and
CRT-composed (Python ints; downloads have at most three primes); the client reduces
``ĉ`` modulo each prime and returns to NTT form. Backends supply the residues and rebuild the
ciphertext; everything else is here.

Form (little endian)::

    b"VRC1" | u8 level | u8 polys | u8 bits | 1 zero byte | f64 scale
    | polys x N values of ``bits`` bits, LSB first
"""

from __future__ import annotations

import math
import struct

import numpy as np

__all__ = ["MAGIC", "MARGIN_BITS", "RoundedError", "bits_for", "crt", "is_rounded", "round_to_bytes", "parse",
           "unround"]

MAGIC = b"VRC1"
_HEAD = struct.Struct("<4sBBBxd")
#: 2^-7 · 30 < 1/4: the rounding error's std under a quarter of the noise floor (N = 16384)
MARGIN_BITS = 7


class RoundedError(ValueError):
    """Bytes that are not a well-formed rounded ciphertext for the expected ring and level."""


def is_rounded(data: bytes) -> bool:
    return data[:4] == MAGIC


def bits_for(primes: tuple[int, ...] | list[int], noise_log2: float) -> int:
    """Bits per coefficient that keep the rounding error under a quarter of a noise floor of
    std ``2^noise_log2`` coefficient units (never more than the modulus has)."""
    q_bits = math.prod(primes).bit_length()
    return max(1, min(q_bits, q_bits - math.floor(noise_log2) + MARGIN_BITS))


def crt(residues: np.ndarray, primes, centered: bool = False) -> np.ndarray:
    """(L, count) residues -> their CRT values as Python ints (object array): in [0, Q), or
    centred in (-Q/2, Q/2]."""
    q = math.prod(primes)
    acc = np.zeros(residues.shape[-1], dtype=object)
    for r, qi in zip(residues, primes, strict=True):
        m = q // qi
        acc = acc + r.astype(object) * (m * pow(m, -1, qi))
    acc = acc % q
    return np.where(acc > q // 2, acc - q, acc) if centered else acc


def _pack_bits(values: np.ndarray, bits: int) -> bytes:
    """Python ints below 2^bits -> ``bits`` bits each, LSB first."""
    words = -(-bits // 64)
    out = np.empty((values.size, words), dtype="<u8")
    rest = values
    for w in range(words):
        out[:, w] = (rest & 0xFFFF_FFFF_FFFF_FFFF).astype(np.uint64)
        rest = rest >> 64
    b = np.unpackbits(out.view(np.uint8).reshape(values.size, 8 * words), axis=1, bitorder="little")
    return np.packbits(b[:, :bits], bitorder="little").tobytes()


def _unpack_bits(buf: bytes, count: int, bits: int) -> np.ndarray:
    words = -(-bits // 64)
    b = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")[: count * bits]
    full = np.zeros((count, 64 * words), dtype=np.uint8)
    full[:, :bits] = b.reshape(count, bits)
    w = np.packbits(full, axis=1, bitorder="little").view("<u8").reshape(count, words)
    out = np.zeros(count, dtype=object)
    for i in range(words - 1, -1, -1):
        out = (out << 64) + w[:, i].astype(object)
    return out


def round_to_bytes(coeffs: np.ndarray, primes, level: int, scale: float, bits: int) -> bytes:
    """Coefficient-form residues ``(polys, L, N)`` of a ciphertext -> the rounded form."""
    polys, limbs, n = coeffs.shape
    if limbs != len(primes) or not 1 <= bits <= math.prod(primes).bit_length():
        raise ValueError("residues do not match the primes, or bits out of range")
    q = math.prod(primes)
    c = crt(coeffs.transpose(1, 0, 2).reshape(limbs, polys * n), primes)
    r = ((c << bits) + q // 2) // q % (1 << bits)
    return _HEAD.pack(MAGIC, level, polys, bits, scale) + _pack_bits(r, bits)


def parse(data: bytes, n: int, primes_of) -> tuple[int, int, int, float, bytes]:
    """Header checks: ``(level, polys, bits, scale, body)``. ``primes_of(level)`` gives the
    level's primes or ``None`` for a level that does not exist."""
    if len(data) < _HEAD.size or not is_rounded(data):
        raise RoundedError("not a rounded ciphertext")
    _, level, polys, bits, scale = _HEAD.unpack_from(data, 0)
    primes = primes_of(level)
    if primes is None:
        raise RoundedError(f"rounded ciphertext at an unknown level {level}")
    if polys != 2:
        raise RoundedError("a rounded ciphertext has two polynomials")
    if not 1 <= bits <= math.prod(primes).bit_length():
        raise RoundedError(f"{bits} bits per coefficient is out of range for level {level}")
    body = data[_HEAD.size :]
    if len(body) != (polys * n * bits + 7) // 8:
        raise RoundedError(f"rounded ciphertext body of {len(body)} bytes, expected {(polys * n * bits + 7) // 8}")
    if not (math.isfinite(scale) and scale >= 1.0):
        raise RoundedError(f"scale {scale} out of range")
    return level, polys, bits, scale, body


def unround(body: bytes, polys: int, n: int, primes, bits: int) -> np.ndarray:
    """The rounded coefficients -> coefficient-form residues ``(polys, L, N)`` (uint64)."""
    q = math.prod(primes)
    r = _unpack_bits(body, polys * n, bits)
    c = (r * q + (1 << (bits - 1))) >> bits
    out = np.empty((polys, len(primes), n), dtype=np.uint64)
    for i, qi in enumerate(primes):
        out[:, i, :] = (c % qi).astype(np.uint64).reshape(polys, n)
    return out

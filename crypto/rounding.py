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

Rounding needs the coefficients, so the ciphertext is taken out of NTT form; the rounded value
is then computed from the residues in fixed-width arithmetic (``_round``: 32-bit limbs, no CRT
composition into Python ints), and the client gets each residue of ``ĉ`` the same way
(``unround``) and returns to NTT form. Both maps run as C kernels where they are built
(``veil.kernels.rounding_cpu``, one pass per coefficient); the numpy code here is their twin and
the fallback. Backends supply the residues and rebuild the ciphertext; everything else is here.

Form (little endian)::

    b"VRC1" | u8 level | u8 polys | u8 bits | 1 zero byte | f64 scale
    | polys x N values of ``bits`` bits, LSB first
"""

from __future__ import annotations

import functools
import math
import struct

import numpy as np
import torch

from veil.crypto import wide
from veil.crypto.native.modarith import Basis
from veil.kernels import rounding_cpu

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


def _pack_bits(limbs: np.ndarray, bits: int) -> bytes:
    """Values as 32-bit limbs ``[count, W]`` (each below 2^bits) -> ``bits`` bits each, LSB first."""
    b = np.unpackbits(limbs.astype("<u4").view(np.uint8), axis=1, bitorder="little")
    return np.packbits(b[:, :bits], bitorder="little").tobytes()


def _unpack_bits(buf: bytes, count: int, bits: int) -> np.ndarray:
    """The inverse of ``_pack_bits``: 32-bit limbs ``[count, ceil(bits / 32)]`` (uint64)."""
    width = -(-bits // 32)
    b = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")[: count * bits]
    full = np.zeros((count, 32 * width), dtype=np.uint8)
    full[:, :bits] = b.reshape(count, bits)
    return np.packbits(full, axis=1, bitorder="little").view("<u4").astype(np.uint64)


def _from_ints(values: np.ndarray, width: int) -> np.ndarray:
    return np.array([wide.to_limbs(int(v), width) for v in values], dtype=np.uint64).reshape(-1, width)


def _round_exact(residues: np.ndarray, primes, bits: int) -> np.ndarray:
    """``round(c * 2^bits / Q) mod 2^bits`` through Python ints (``L, count`` residues -> limbs):
    the definition, used where the fast path cannot decide a rounding."""
    q = math.prod(primes)
    c = crt(residues, primes)
    return _from_ints(((c << bits) + q // 2) // q % (1 << bits), -(-bits // 32))


@functools.lru_cache(maxsize=16)
def _basis(primes: tuple[int, ...]) -> Basis:
    return Basis.of(primes)


def _mul_const(basis: Basis, consts: list[int], x: torch.Tensor) -> torch.Tensor:
    """``x * consts mod q``, one constant per limb of ``x`` ``[L, count]`` (residues)."""
    w = torch.tensor([c % q for c, q in zip(consts, basis.primes, strict=True)], dtype=torch.int64)
    return basis.const(w.view(-1, 1)).mul(x)


def _round(residues: np.ndarray, primes, bits: int) -> np.ndarray:
    """``round(c * 2^bits / Q) mod 2^bits`` of the CRT values ``c`` of ``(L, count)`` residues,
    as 32-bit limbs ``[count, W]``, without composing ``c``.

    With ``f_i = [r_i * (Q/q_i)^-1 * 2^bits]_{q_i}``, ``c * 2^bits / Q = sum_i f_i / q_i + a
    (mod 2^bits)`` where ``a = sum_i -f_i * q_i^-1 mod 2^bits`` is an integer: the fractions
    decide only the rounding, ``round(sum_i f_i / q_i)``. Doubles get that sum within 1e-15;
    the coefficients whose sum lies near a half (none in practice: Q is odd, so the exact value
    is never a half) are rounded through ``_round_exact`` instead."""
    primes = tuple(primes)
    q, mod = math.prod(primes), 1 << bits
    fs = _mul_const(_basis(primes), [pow(q // qi, -1, qi) << bits for qi in primes],
                    torch.from_numpy(residues.astype(np.int64))).numpy().astype(np.uint64)
    cols = np.zeros((residues.shape[1], -(-bits // 32)), dtype=np.uint64)
    frac = np.zeros(residues.shape[1])
    for f, qi in zip(fs, primes, strict=True):
        frac += f.astype(np.float64) / qi
        parts = np.stack([f & wide.MASK32, f >> np.uint64(32)], axis=1)
        wide.mul_mod_2k(parts, (-pow(qi, -1, mod)) % mod, bits, out=cols)
    up = np.floor(frac + 0.5)
    cols[:, 0] += up.astype(np.uint64)
    out = wide.carry(cols, bits)
    near = np.flatnonzero(np.abs(frac - np.floor(frac) - 0.5) < 2.0**-30)
    if near.size:
        out[near] = _round_exact(residues[:, near], primes, bits)
    return out


def round_to_bytes(coeffs: np.ndarray, primes, level: int, scale: float, bits: int) -> bytes:
    """Coefficient-form residues ``(polys, L, N)`` of a ciphertext -> the rounded form."""
    polys, limbs, n = coeffs.shape
    if limbs != len(primes) or not 1 <= bits <= math.prod(primes).bit_length():
        raise ValueError("residues do not match the primes, or bits out of range")
    body = rounding_cpu.round_pack(coeffs, tuple(primes), bits)  # the C kernel where built
    if body is None:  # no kernel, or a coefficient near a half: the twin decides it exactly
        body = _pack_bits(_round(coeffs.transpose(1, 0, 2).reshape(limbs, polys * n), primes, bits), bits)
    return _HEAD.pack(MAGIC, level, polys, bits, scale) + body


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
    """The rounded coefficients -> coefficient-form residues ``(polys, L, N)`` (uint64): the C
    kernel where built (``veil.kernels.rounding_cpu``), else ``_unround``."""
    out = rounding_cpu.unround(body, polys, n, tuple(primes), bits)
    return _unround(body, polys, n, primes, bits) if out is None else out


def _unround(body: bytes, polys: int, n: int, primes, bits: int) -> np.ndarray:
    """``unround`` in numpy: ``c = floor((r * Q + 2^(bits-1)) / 2^bits)``; with
    ``low = (r * Q + 2^(bits-1)) mod 2^bits`` (wide limbs) and ``r * Q = 0 mod q_i``, each residue
    is ``(2^(bits-1) - low) * 2^-bits mod q_i``: no Python ints."""
    primes = tuple(primes)
    basis, q, mod = _basis(primes), math.prod(primes), 1 << bits
    low = wide.mul_mod_2k(_unpack_bits(body, polys * n, bits), q, bits)
    low[:, (bits - 1) // 32] += np.uint64(1 << ((bits - 1) % 32))
    low = torch.from_numpy(wide.carry(low, bits).astype(np.int64)).T  # [W, count], limbs < 2^32
    # low mod q_i = sum_k limb_k * 2^(32k): W lazy products in (-q, q), reduced once per ``step``
    # of them (all at once for the protected primes: 32 x 2^57 < 2^62)
    radix = torch.tensor([[pow(2, 32 * k, qi) for k in range(low.shape[0])] for qi in primes], dtype=torch.int64)
    terms = basis.const(radix[..., None]).mul_lazy(low.expand(len(primes), -1, -1))
    step = (1 << 62) // max(primes)
    acc = basis.reduce(terms[:, :step].sum(1))
    for k in range(step, terms.shape[1], step):
        acc = basis.add(acc, basis.reduce(terms[:, k : k + step].sum(1)))
    half = torch.tensor([pow(2, bits - 1, qi) for qi in primes], dtype=torch.int64).view(-1, 1)
    c = _mul_const(basis, [pow(mod, -1, qi) for qi in primes], basis.sub(half.expand_as(acc), acc))
    return c.numpy().astype(np.uint64).reshape(len(primes), polys, n).transpose(1, 0, 2).copy()

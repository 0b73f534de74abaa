"""Wire formats of the native backend: ciphertexts and public key material.

Both carry residues bit-packed at their prime's width (``bit_length(q)`` bits, LSB first, a
limb's run of N residues is a whole number of bytes since N is a multiple of 8): 57 + 7 * 36
bits per coefficient at the top level of ckks-n16384-l7-v1, where 64-bit words would spend 576.

Ciphertext (little endian)::

    b"VNC1" | u8 version 1 | u8 flags (bit 0: seeded) | u8 size | u8 level
    | 8-byte parameter tag (SHA-256 of the id, N and primes) | f64 scale
    | residues [poly][limb][coeff] (seeded: c0 only) | seeded: 32-byte seed of c1

Key material::

    b"VNK1" | u8 version 3 | u8 kind (1 public, 2 relinearization, 3 Galois) | 2 zero bytes
    | 8-byte parameter tag | u32 keys | u32 digits | u32 limbs | Galois only: u32 element per key
    | relinearization and Galois: u32 level per key
    | per key: 32-byte seed of the a-halves | residues of the b-halves [digit][limb][coeff]

A switching key (relinearization or Galois) of level ``l`` carries digits ``0..l`` over limbs
``p, q_0..q_l`` only: what a key switch at levels ``<= l`` reads (``keys.SwitchKey.at``).

Parsing trusts nothing: every size is derived from the parameter set and compared with the
exact length before anything is unpacked, and every residue is checked below its prime.
"""

from __future__ import annotations

import hashlib
import math
import struct

import numpy as np
import torch

from veil.crypto.bitpack import pack_runs, run_bytes, unpack_runs
from veil.crypto.native.context import RnsContext
from veil.crypto.native.sampling import SEED_BYTES
from veil.kernels.host import to_device

__all__ = ["SerialError", "params_tag", "pack", "unpack", "check_header", "ct_to_bytes", "ct_from_bytes",
           "keys_to_bytes", "keys_from_bytes", "KIND_PUBLIC", "KIND_RELIN", "KIND_GALOIS"]

CT_MAGIC, KEY_MAGIC, VERSION, KEY_VERSION = b"VNC1", b"VNK1", 1, 3
_CT_HEAD = struct.Struct("<4sBBBB8sd")
_KEY_HEAD = struct.Struct("<4sBB2x8sIII")
FLAG_SEEDED = 1
KIND_PUBLIC, KIND_RELIN, KIND_GALOIS = 1, 2, 3
MAX_SIZE = 3


class SerialError(ValueError):
    """Bytes that are not a well-formed object of this parameter set."""


def params_tag(ctx: RnsContext) -> bytes:
    text = f"{ctx.params.id}|{ctx.n}|{','.join(map(str, ctx.data_primes + (ctx.special_prime,)))}"
    return hashlib.sha256(text.encode()).digest()[:8]


def _run_bytes(n: int, q: int) -> int:
    return run_bytes(n, q.bit_length())


def pack(x: torch.Tensor, primes: tuple[int, ...]) -> bytes:
    """Residues ``[..., L, N]`` (``[0, q)``) -> their bit-packed runs, on the host (one
    device-to-host copy; a few torch ops per limb would cost more on the CPU and a launch each
    on a GPU)."""
    a = x.reshape(-1, x.shape[-1]).cpu().numpy().view(np.uint64)
    return pack_runs(a, [q.bit_length() for q in primes] * (a.shape[0] // len(primes)))


def unpack(buf: bytes, polys: int, primes: tuple[int, ...], n: int,
           device: torch.device) -> torch.Tensor:
    """Bit-packed runs -> residues ``[polys, L, N]``; ``SerialError`` if a residue is not
    below its prime (checked on the host, before anything reaches the device). ``len(buf)``
    must be exact (checked by the callers)."""
    values, bad = unpack_runs(buf, n, [q.bit_length() for q in primes] * polys, list(primes) * polys)
    if bad:
        raise SerialError("a residue is not below its prime")
    return to_device(torch.from_numpy(values.view(np.int64).reshape(polys, len(primes), n)), device)


def _limb_bytes(n: int, primes: tuple[int, ...]) -> int:
    return sum(_run_bytes(n, q) for q in primes)


def ct_to_bytes(ctx: RnsContext, data: torch.Tensor, level: int, scale: float,
                seed: bytes | None = None) -> bytes:
    """``data`` ``[size, level+1, N]``; seeded form: ``data`` is ``c0`` only ``[1, ...]``."""
    size = 2 if seed is not None else data.shape[0]
    head = _CT_HEAD.pack(CT_MAGIC, VERSION, FLAG_SEEDED if seed is not None else 0, size, level,
                         params_tag(ctx), float(scale))
    return head + pack(data, ctx.data_primes[: level + 1]) + (seed or b"")


def check_header(ctx: RnsContext, got_level: int, got_size: int, got_scale: float, *, level: int | None,
                 size: int, scale: float | None) -> None:
    """A ciphertext's level, size and scale against the parameter set and the caller's
    expectations (``None``: any); shared by every wire form (``crypto/rounding.py`` too)."""
    if got_level > ctx.top or (level is not None and got_level != level):
        raise SerialError(f"ciphertext at level {got_level}, expected {level}")
    if got_size != size or not 2 <= got_size <= MAX_SIZE:
        raise SerialError(f"ciphertext has size {got_size}, expected {size}")
    q_level = float(ctx.level_modulus(got_level))
    if not (math.isfinite(got_scale) and 1.0 <= got_scale < q_level):
        raise SerialError(f"ciphertext scale {got_scale} out of range")
    if scale is not None and not math.isclose(got_scale, scale, rel_tol=1e-9):
        raise SerialError(f"ciphertext scale {got_scale}, expected {scale}")


def ct_from_bytes(ctx: RnsContext, buf: bytes, *, level: int | None, size: int,
                  scale: float | None) -> tuple[torch.Tensor | None, bytes | None, int, float]:
    """Validate and parse: ``(polys, seed, level, scale)``; a seeded ciphertext returns ``c0`` as
    ``polys[0]`` and its seed (the caller expands ``c1``)."""
    if len(buf) < _CT_HEAD.size:
        raise SerialError("shorter than a ciphertext header")
    magic, version, flags, got_size, got_level, tag, got_scale = _CT_HEAD.unpack_from(buf, 0)
    if magic != CT_MAGIC or version != VERSION:
        raise SerialError("not a native ciphertext")
    if flags & ~FLAG_SEEDED:
        raise SerialError("unknown flags")
    if tag != params_tag(ctx):
        raise SerialError(f"ciphertext of another parameter set than {ctx.params.id}")
    seeded = bool(flags & FLAG_SEEDED)
    if seeded and got_size != 2:
        raise SerialError(f"a seeded ciphertext has size 2, not {got_size}")
    check_header(ctx, got_level, got_size, got_scale, level=level, size=size, scale=scale)
    primes = ctx.data_primes[: got_level + 1]
    polys = 1 if seeded else got_size
    body = polys * _limb_bytes(ctx.n, primes)
    if len(buf) != _CT_HEAD.size + body + (SEED_BYTES if seeded else 0):
        raise SerialError("ciphertext length does not match its header")
    data = unpack(buf[_CT_HEAD.size : _CT_HEAD.size + body], polys, primes, ctx.n, ctx.device)
    seed = buf[_CT_HEAD.size + body :] if seeded else None
    return data, seed, got_level, got_scale


def keys_to_bytes(ctx: RnsContext, kind: int, keys: list[tuple[bytes, torch.Tensor]],
                  primes: tuple[int, ...], elements: tuple[int, ...] = (),
                  levels: tuple[int, ...] = ()) -> bytes:
    """``keys``: ``(seed, b)`` with ``b`` ``[digits, limbs, N]``; Galois keys: their
    ``elements``; switching keys: the ``levels`` they serve (only those digits and limbs are
    written)."""
    digits = keys[0][1].shape[0]
    head = _KEY_HEAD.pack(KEY_MAGIC, KEY_VERSION, kind, params_tag(ctx), len(keys), digits, len(primes))
    parts = [head, struct.pack(f"<{len(elements)}I", *elements), struct.pack(f"<{len(levels)}I", *levels)]
    for i, (seed, b) in enumerate(keys):
        if levels:
            lv = levels[i]
            b, kept = b[: lv + 1, : lv + 2], primes[: lv + 2]
        else:
            kept = primes
        parts += [seed, pack(b, kept)]
    return b"".join(parts)


def keys_from_bytes(ctx: RnsContext, buf: bytes, kind: int, count: int, digits: int,
                    primes: tuple[int, ...]
                    ) -> tuple[tuple[int, ...], tuple[int, ...], list[tuple[bytes, torch.Tensor]]]:
    """Validate and parse ``count`` keys of ``digits x len(primes)`` limbs: ``(elements,
    levels, [(seed, b)])``; a switching key of level ``l`` comes back as ``b`` ``[l+1, l+2, N]``.
    Expected counts come from the caller, never from the bytes."""
    if len(buf) < _KEY_HEAD.size:
        raise SerialError("shorter than a key header")
    magic, version, got_kind, tag, got_count, got_digits, limbs = _KEY_HEAD.unpack_from(buf, 0)
    if magic != KEY_MAGIC or version != KEY_VERSION or got_kind != kind:
        raise SerialError("not native key material of the expected kind")
    if tag != params_tag(ctx):
        raise SerialError(f"key material of another parameter set than {ctx.params.id}")
    if (got_count, got_digits, limbs) != (count, digits, len(primes)):
        raise SerialError("key material has other dimensions than this parameter set needs")
    n_elements = count if kind == KIND_GALOIS else 0
    n_levels = count if kind in (KIND_GALOIS, KIND_RELIN) else 0
    pos = _KEY_HEAD.size + 4 * (n_elements + n_levels)
    if len(buf) < pos:
        raise SerialError("key material length does not match its header")
    elements = struct.unpack_from(f"<{n_elements}I", buf, _KEY_HEAD.size)
    levels = struct.unpack_from(f"<{n_levels}I", buf, _KEY_HEAD.size + 4 * n_elements)
    if any(lv > digits - 1 for lv in levels):
        raise SerialError("a switching key level beyond the parameter set's levels")
    shapes = [(lv + 1, primes[: lv + 2]) for lv in levels] if n_levels else [(digits, primes)] * count
    sizes = [SEED_BYTES + d * _limb_bytes(ctx.n, ps) for d, ps in shapes]
    if len(buf) != pos + sum(sizes):
        raise SerialError("key material length does not match its header")
    keys = []
    for (d, ps), one in zip(shapes, sizes, strict=True):
        seed = buf[pos : pos + SEED_BYTES]
        b = unpack(buf[pos + SEED_BYTES : pos + one], d, ps, ctx.n, ctx.device)
        keys.append((seed, b))
        pos += one
    return elements, levels, keys

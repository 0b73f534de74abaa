"""Bit-packed wire form of SEAL ciphertexts: every RNS residue in exactly its prime's width.

Why: SEAL keeps each residue in a 64-bit word and compresses a saved object with zstd, which
cannot find much structure in uniformly random residues: a level-4 upload of the protected
parameter set (one 57-bit and four 36-bit primes) compresses to 74% of its raw size, where its
information content is (57 + 4*36) / (5*64) = 63%. The protected path moves ~3 MB per layer and
token, so the wire carries packed residues instead; SEAL still validates every object it loads.

Packed form (little endian)::

    b"VPC1" | u8 flags (bit 0: seeded) | 3 zero bytes
    | the 73 bytes of SEAL's Ciphertext members before its data, verbatim (parms_id, is_ntt_form,
      size, N, number of primes, scale, correction factor)
    | residues: for each stored polynomial and each prime j, N residues of bit_length(q_j) bits,
      LSB first, each prime's run padded to a whole byte
    | seeded only: the PRNG-info object SEAL writes after c0 (the seed that regenerates c1)

``pack`` takes a blob from SEAL's ``save`` (any compression); ``unpack`` rebuilds an
uncompressed SEAL blob for ``load``. Both refuse anything whose sizes do not add up exactly.

Key-switching keys (relinearization and Galois keys) travel the same way: SEAL's ``KSwitchKeys``
members are a parms_id, ``u64 dim1`` and, per index, ``u64 dim2`` and ``dim2`` seeded
ciphertexts at the key level (component ``j`` for data prime ``q_j``); for Galois keys
``dim1`` is N and only the indices of the generated rotations hold keys. Packed form::

    b"VPK1" | 4 zero bytes | parms_id (32 bytes) | u64 dim1 | u32 indices holding keys
    | per such index: u32 index, u16 dim2, u8 level (255: all), 1 zero byte,
      then dim2 times (u32 length, a packed ciphertext)

A key for ``level`` l < L is used only on ciphertexts at level <= l, where SEAL's key switch
reads components ``0..l`` and, of each, the residues of ``q_0..q_l`` and the special prime: only
those runs travel (the others, and every run of the components above l, are loaded as zeros;
the seeds of all components travel, 81 bytes each). At N=16384 the bit packing alone is 14%
smaller than SEAL's zstd output; a level-4 key is 30/72 of a full one.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from veil.crypto.bitpack import pack_runs, run_bytes, unpack_runs
from veil.crypto.seal import format as seal_format
from veil.crypto.seal.format import HEADER_SIZE, SealFormatError

MAGIC = b"VPC1"
_PREFIX = struct.Struct("<4sB3x")
_MEMBERS = 73  # parms_id 32 + is_ntt_form 1 + size, N, primes 24 + scale 8 + correction 8
_SEEDED = 1
_MAX_PRNG_INFO = 256  # SEAL's PRNG-info object is 81 bytes (header, type, 64-byte seed)

#: ``widths(parms_id)``: the bit width of each prime of that level (``None``: unknown id).
WidthsOf = Callable[[tuple[int, ...]], Sequence[int] | None]


def is_packed(data: bytes) -> bool:
    return data[:4] == MAGIC


def _members(blob: bytes, limit: int) -> bytes:
    h = seal_format.parse_header(blob)
    body = blob[HEADER_SIZE:]
    if h.compr_mode == seal_format.COMPR_NONE:
        return body
    if h.compr_mode == seal_format.COMPR_ZSTD:
        import zstandard

        return zstandard.ZstdDecompressor().decompress(body, max_output_size=limit)
    d = zlib.decompressobj()
    return d.decompress(body, limit)


#: Largest inflated ciphertext ``pack`` accepts (N=2^16, 16 primes, 8 polynomials is 64 MiB).
_MAX_MEMBERS = 64 << 20


def _parse(blob: bytes) -> tuple[bytes, np.ndarray, bytes]:
    """A SEAL ciphertext blob (any compression) -> (its members, residues ``(polys, primes, N)``,
    the seed trailer: empty unless seeded, where ``polys`` is 1)."""
    members = _members(blob, limit=_MAX_MEMBERS)
    if len(members) < _MEMBERS + HEADER_SIZE + 8:
        raise SealFormatError("ciphertext members too short")
    size, n, k = struct.unpack_from("<QQQ", members, 33)
    (count,) = struct.unpack_from("<Q", members, _MEMBERS + HEADER_SIZE)
    start = _MEMBERS + HEADER_SIZE + 8
    if count > (len(members) - start) // 8:
        raise SealFormatError("ciphertext data truncated")
    data = np.frombuffer(members, dtype="<u8", count=count, offset=start)
    trailing = members[start + 8 * count :]
    if count == size * n * k and not trailing:
        polys = size
    elif size == 2 and count == n * k and 0 < len(trailing) <= _MAX_PRNG_INFO:
        polys = 1
    else:
        raise SealFormatError("unexpected ciphertext data layout")
    return members, data.reshape(polys, k, n), trailing


def residues(blob: bytes) -> np.ndarray:
    """The residues ``(size, primes, N)`` of an unseeded SEAL ciphertext blob, read at numpy
    speed (``obj[i]`` costs a Python call per word)."""
    _, runs, trailing = _parse(blob)
    if trailing:
        raise SealFormatError("a seeded ciphertext has no second polynomial to read")
    return runs


def pack(blob: bytes, widths_of: WidthsOf, keep: Sequence[int] | None = None) -> bytes:
    """SEAL ``save`` output of a ciphertext -> packed form. (``tenseal.sealapi`` binds no choice
    of compression mode, so SEAL's zstd output is inflated here first.) ``keep``: the prime
    indices whose runs are stored (default all; key components use fewer, see ``pack_keys``)."""
    members, runs, trailing = _parse(blob)
    polys, k, _ = runs.shape
    widths = widths_of(tuple(struct.unpack_from("<4Q", members, 0)))
    if widths is None or len(widths) != k:
        raise SealFormatError("ciphertext of an unknown level")
    flags = _SEEDED if trailing else 0
    out = [_PREFIX.pack(MAGIC, flags), members[:_MEMBERS]]
    kept = list(range(k) if keep is None else keep)
    if kept:
        out.append(pack_runs(runs[:, kept].reshape(-1, runs.shape[-1]), [widths[j] for j in kept] * polys))
    if flags & _SEEDED:
        out.append(trailing)
    return b"".join(out)


def unpack(data: bytes, widths_of: WidthsOf, version: tuple[int, int], max_n: int,
           keep: Sequence[int] | None = None) -> bytes:
    """Packed form -> uncompressed SEAL blob (SEAL's ``load`` then validates residues, ids and
    the seed). Refuses wrong magic, unknown levels and any size mismatch. The primes outside
    ``keep`` (default: none) were not stored and read zero."""
    if len(data) < _PREFIX.size + _MEMBERS or not is_packed(data):
        raise SealFormatError("not a packed ciphertext")
    _, flags = _PREFIX.unpack_from(data, 0)
    if flags & ~_SEEDED:
        raise SealFormatError("unknown packed-ciphertext flags")
    members = data[_PREFIX.size : _PREFIX.size + _MEMBERS]
    pid = struct.unpack_from("<4Q", members, 0)
    size, n, k = struct.unpack_from("<QQQ", members, 33)
    widths = widths_of(tuple(pid))
    if widths is None or len(widths) != k or n != max_n:
        raise SealFormatError("packed ciphertext of an unknown level or ring")
    seeded = bool(flags & _SEEDED)
    if seeded and size != 2:
        raise SealFormatError("a seeded ciphertext has two polynomials")
    if not 2 <= size <= 8:
        raise SealFormatError("unsupported ciphertext size")
    polys = 1 if seeded else size
    pos = _PREFIX.size + _MEMBERS
    stored = set(range(k) if keep is None else keep)
    runs = []
    for _ in range(polys):
        for j, w in enumerate(widths):
            if j not in stored:
                runs.append(np.zeros(n, dtype="<u8"))
                continue
            end = pos + run_bytes(n, w)
            if end > len(data):
                raise SealFormatError("packed ciphertext truncated")
            runs.append(unpack_runs(data[pos:end], n, [w])[0][0])
            pos = end
    trailing = data[pos:]
    if seeded != bool(trailing) or len(trailing) > _MAX_PRNG_INFO:
        raise SealFormatError("packed ciphertext has trailing bytes" if not seeded else "bad seed")
    arr = seal_format.dynarray_blob(np.concatenate(runs), version)
    body = members + arr + trailing
    return seal_format._header(version, len(body)) + body


KEYS_MAGIC = b"VPK1"
_KEYS_PREFIX = struct.Struct("<4s4x32sQI")
_ENTRY = struct.Struct("<IHBx")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
FULL = 255


def key_runs(level: int, primes: int, component: int) -> list[int]:
    """The prime indices a key component stores when its key serves levels <= ``level``
    (``primes``: data primes plus the special prime)."""
    if level == FULL or level >= primes - 2:
        return list(range(primes))
    return [*range(level + 1), primes - 1] if component <= level else []


def is_packed_keys(data: bytes) -> bool:
    return data[:4] == KEYS_MAGIC


def pack_keys(blob: bytes, widths_of: WidthsOf, limit: int, levels: dict[int, int] | None = None) -> bytes:
    """SEAL ``save`` output of relinearization or Galois keys -> packed key form. ``levels``:
    the highest level each index's key serves (default: every level)."""
    members = _members(blob, limit=limit)
    if len(members) < 40:
        raise SealFormatError("key members too short")
    (dim1,) = _U64.unpack_from(members, 32)
    pos, entries, levels = 40, [], levels or {}
    n_primes = len(widths_of(tuple(struct.unpack_from("<4Q", members, 0))) or ())
    for index in range(dim1):
        if pos + 8 > len(members):
            raise SealFormatError("key members truncated")
        (dim2,) = _U64.unpack_from(members, pos)
        pos += 8
        cts, level = [], levels.get(index, FULL)
        for j in range(dim2):
            h = seal_format.SealHeader(*seal_format._HEADER.unpack_from(members, pos))
            if h.magic != seal_format.SEAL_MAGIC or pos + h.size > len(members):
                raise SealFormatError("bad key component")
            cts.append(pack(members[pos : pos + h.size], widths_of, key_runs(level, n_primes, j)))
            pos += h.size
        if cts:
            entries.append((index, level, cts))
    if pos != len(members):
        raise SealFormatError("trailing bytes after the keys")
    out = [_KEYS_PREFIX.pack(KEYS_MAGIC, members[:32], dim1, len(entries))]
    for index, level, cts in entries:
        out.append(_ENTRY.pack(index, len(cts), level))
        out += [_U32.pack(len(c)) + c for c in cts]
    return b"".join(out)


def unpack_keys(data: bytes, widths_of: WidthsOf, version: tuple[int, int], n: int, max_keys: int,
                max_digits: int) -> tuple[bytes, dict[int, int]]:
    """Packed key form -> (uncompressed SEAL ``KSwitchKeys`` blob, the level each index's key
    serves). SEAL's ``load`` then validates the blob. At most ``max_keys`` indices of
    ``max_digits`` components each, indices below N."""
    if len(data) < _KEYS_PREFIX.size or not is_packed_keys(data):
        raise SealFormatError("not packed keys")
    _, pid, dim1, count = _KEYS_PREFIX.unpack_from(data, 0)
    if dim1 > n or count > min(max_keys, dim1):
        raise SealFormatError("packed keys: too many keys")
    n_primes = len(widths_of(struct.unpack("<4Q", pid)) or ())
    if not n_primes:
        raise SealFormatError("packed keys of an unknown parameter set")
    pos, by_index, levels = _KEYS_PREFIX.size, {}, {}
    for _ in range(count):
        if pos + _ENTRY.size > len(data):
            raise SealFormatError("packed keys truncated")
        index, dim2, level = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        if index >= dim1 or index in by_index or not 0 < dim2 <= max_digits:
            raise SealFormatError("packed keys: bad key index or component count")
        if level != FULL and level >= n_primes - 1:
            raise SealFormatError(f"packed keys: key level {level} out of range")
        levels[index] = level
        cts = []
        for j in range(dim2):
            if pos + 4 > len(data):
                raise SealFormatError("packed keys truncated")
            (length,) = _U32.unpack_from(data, pos)
            end = pos + 4 + length
            if end > len(data):
                raise SealFormatError("packed keys truncated")
            cts.append(unpack(data[pos + 4 : end], widths_of, version, n, key_runs(level, n_primes, j)))
            pos = end
        by_index[index] = cts
    if pos != len(data):
        raise SealFormatError("trailing bytes after the packed keys")
    body = [pid, _U64.pack(dim1)]
    for index in range(dim1):
        cts = by_index.get(index, [])
        body.append(_U64.pack(len(cts)))
        body += cts
    members = b"".join(body)
    return seal_format._header(version, len(members)) + members, levels

"""SEAL's binary serialization format, the parts the SEAL backend writes itself.

Why: ``tenseal.sealapi`` binds no way to build a ciphertext or an NTT-form plaintext from
coefficient data, and exact masked refresh needs to add integer polynomials and to read the
decrypted polynomial as integers. SEAL's own ``load`` accepts any object that was written in
its documented stream format, and it validates what it loads against the context (parameter
id, sizes, every residue below its prime). So the backend writes uncompressed blobs in that
format (``compr_mode = none``) and lets SEAL load them; no memory is touched behind SEAL's
back. Reading goes through the bound element accessor (``obj[i]``).

Format (SEAL 4.x, little endian), every object ``= SEALHeader || members``:

* ``SEALHeader`` (16 bytes): u16 magic 0xA15E, u8 header size 16, u8 version major, u8 version
  minor, u8 compression mode (0 none, 1 zlib, 2 zstd), u16 reserved, u64 total size.
* ``DynArray<u64>`` members: u64 count, count x u64.
* ``Ciphertext`` members: 4 x u64 parms_id, u8 is_ntt_form, u64 size, u64 poly_modulus_degree,
  u64 coeff_modulus_size, f64 scale, u64 correction_factor (1 for CKKS), then the data as a
  complete DynArray object (its own header). Data layout: ``[poly][prime][coefficient]``.
* ``Plaintext`` members: 4 x u64 parms_id, u64 coeff_count, f64 scale, DynArray object.
  An NTT-form CKKS plaintext has ``coeff_count = N * (level + 1)``, layout ``[prime][coeff]``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

SEAL_MAGIC = 0xA15E
HEADER_SIZE = 16
_HEADER = struct.Struct("<HBBBBHQ")
COMPR_NONE, COMPR_ZLIB, COMPR_ZSTD = 0, 1, 2


class SealFormatError(ValueError):
    """Bytes that are not a well-formed SEAL object header."""


@dataclass(frozen=True)
class SealHeader:
    magic: int
    header_size: int
    version_major: int
    version_minor: int
    compr_mode: int
    reserved: int
    size: int


def parse_header(data: bytes) -> SealHeader:
    if len(data) < HEADER_SIZE:
        raise SealFormatError(f"{len(data)} bytes: shorter than a SEAL header")
    h = SealHeader(*_HEADER.unpack_from(data, 0))
    if h.magic != SEAL_MAGIC:
        raise SealFormatError("bad SEAL magic")
    if h.header_size != HEADER_SIZE:
        raise SealFormatError("bad SEAL header size")
    if h.compr_mode not in (COMPR_NONE, COMPR_ZLIB, COMPR_ZSTD):
        raise SealFormatError(f"unknown compression mode {h.compr_mode}")
    if h.reserved != 0:
        raise SealFormatError("reserved header field is not zero")
    if h.size != len(data):
        raise SealFormatError(f"header declares {h.size} bytes, got {len(data)}")
    return h


def _header(version: tuple[int, int], members_len: int) -> bytes:
    return _HEADER.pack(
        SEAL_MAGIC, HEADER_SIZE, version[0], version[1], COMPR_NONE, 0, HEADER_SIZE + members_len
    )


def dynarray_blob(values: np.ndarray, version: tuple[int, int]) -> bytes:
    arr = np.ascontiguousarray(values, dtype="<u8").ravel()
    members = struct.pack("<Q", arr.size) + arr.tobytes()
    return _header(version, len(members)) + members


def ciphertext_blob(
    polys: np.ndarray,
    parms_id: list[int] | tuple[int, ...],
    scale: float,
    is_ntt_form: bool,
    version: tuple[int, int],
) -> bytes:
    """``polys``: uint64 array ``(size, primes, N)`` of residues."""
    polys = np.asarray(polys, dtype=np.uint64)
    size, primes, n = polys.shape
    members = (
        struct.pack("<4Q", *parms_id)
        + struct.pack("<B", 1 if is_ntt_form else 0)
        + struct.pack("<QQQ", size, n, primes)
        + struct.pack("<d", scale)
        + struct.pack("<Q", 1)
        + dynarray_blob(polys, version)
    )
    return _header(version, len(members)) + members


def plaintext_blob(
    residues: np.ndarray,
    parms_id: list[int] | tuple[int, ...],
    scale: float,
    version: tuple[int, int],
) -> bytes:
    """An NTT-form plaintext; ``residues``: uint64 ``(primes, N)``."""
    residues = np.asarray(residues, dtype=np.uint64)
    members = (
        struct.pack("<4Q", *parms_id)
        + struct.pack("<Q", residues.size)
        + struct.pack("<d", scale)
        + dynarray_blob(residues, version)
    )
    return _header(version, len(members)) + members


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_MAX_BLOCK = 128 * 1024


def _zstd_inflated_bound(payload: bytes) -> int:
    """Upper bound of what a zstd payload inflates to, from its block headers alone.

    Walks the frame(s) without decompressing (RFC 8878): raw and RLE blocks state their
    regenerated size, a compressed block regenerates at most 128 KiB. Raises
    ``SealFormatError`` on anything that is not a well-formed sequence of zstd frames.
    """
    pos, total, n = 0, 0, len(payload)
    if n == 0:
        raise SealFormatError("empty zstd payload")
    while pos < n:
        if pos + 5 > n:
            raise SealFormatError("truncated zstd frame header")
        magic = int.from_bytes(payload[pos : pos + 4], "little")
        if magic != _ZSTD_MAGIC:
            raise SealFormatError("not a zstd frame")
        fhd = payload[pos + 4]
        pos += 5
        fcs_flag, single, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
        if fhd & 0x08:
            raise SealFormatError("reserved zstd header bit set")
        pos += (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
        pos += (1 if single else 0, 2, 4, 8)[fcs_flag]
        while True:
            if pos + 3 > n:
                raise SealFormatError("truncated zstd block header")
            bh = int.from_bytes(payload[pos : pos + 3], "little")
            pos += 3
            last, btype, bsize = bh & 1, (bh >> 1) & 3, bh >> 3
            if btype == 0:  # raw
                pos += bsize
                total += bsize
            elif btype == 1:  # RLE: one byte, repeated bsize times
                pos += 1
                total += bsize
            elif btype == 2:  # compressed
                if bsize > _ZSTD_MAX_BLOCK:
                    raise SealFormatError("zstd block too large")
                pos += bsize
                total += _ZSTD_MAX_BLOCK
            else:
                raise SealFormatError("reserved zstd block type")
            if pos > n:
                raise SealFormatError("truncated zstd block")
            if last:
                break
        pos += 4 if checksum else 0
        if pos > n:
            raise SealFormatError("truncated zstd checksum")
    return total


def inflated_size_bound(data: bytes, limit: int) -> int:
    """Upper bound of the uncompressed member bytes of a SEAL object (after its header).

    For zlib the payload is inflated with an output cap of ``limit + 1`` bytes, so a
    decompression bomb costs at most that much memory; zstd is bounded from block headers.
    The caller rejects the object when the bound exceeds ``limit`` *before* SEAL inflates it.
    """
    h = parse_header(data)
    payload = data[HEADER_SIZE:]
    if h.compr_mode == COMPR_NONE:
        return len(payload)
    if h.compr_mode == COMPR_ZSTD:
        return _zstd_inflated_bound(payload)
    import zlib

    d = zlib.decompressobj()
    try:
        out = d.decompress(payload, limit + 1)
    except zlib.error as e:
        raise SealFormatError(f"bad zlib payload: {e}") from e
    return len(out) if d.unconsumed_tail == b"" else limit + 1

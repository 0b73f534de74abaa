"""Bit-packed runs of residues in C (``bitpack_cpu.c``), built on first use.

* ``pack_runs``: values ``[rows, n]`` (uint64) -> run ``r`` of ``n * widths[r] / 8`` bytes each.
* ``unpack_runs``: the inverse, with the count of values not below their row's bound.

Twins: ``veil.crypto.bitpack._pack_numpy`` and ``_unpack_numpy``, the same bytes and values.
Why C: numpy spreads every residue over 64 bytes of bits to repack them (``np.unpackbits``):
2.4 ms to pack a level-7 ciphertext's c0 and 2.7 ms to load it on this CPU, 0.14 and 0.24 ms
here (``benchmarks/results/2026-11-29-bitpack``), for every upload, whole download and key, on
the client and on the server, and on the host of a GPU server for every session of a batch. Tests: ``tests/test_native_serial.py`` (C = twin).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from veil.kernels import cbuild

__all__ = ["available", "pack_runs", "unpack_runs"]

_SOURCE = Path(__file__).with_name("bitpack_cpu.c")


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = cbuild.load(_SOURCE, ("-O3",))
    if lib is None:
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.veil_pack_runs.argtypes = [p, p, i64, i64, p]
    lib.veil_pack_runs.restype = None
    lib.veil_unpack_runs.argtypes = [p, p, i64, i64, p, p]
    lib.veil_unpack_runs.restype = i64
    return lib


def available() -> bool:
    return cbuild.enabled() and _library() is not None


def pack_runs(values: np.ndarray, widths: np.ndarray) -> bytes:
    """``values`` [rows, n] uint64, ``widths`` [rows] int32 (1..64; ``n * w`` a multiple of 8)."""
    rows, n = values.shape
    x = np.ascontiguousarray(values, dtype=np.uint64)
    w = np.ascontiguousarray(widths, dtype=np.int32)
    out = np.empty(int(n * w.astype(np.int64).sum()) // 8, dtype=np.uint8)
    _library().veil_pack_runs(out.ctypes.data, x.ctypes.data, rows, n, w.ctypes.data)
    return out.tobytes()


def unpack_runs(buf: bytes, n: int, widths: np.ndarray, bounds: np.ndarray | None) -> tuple[np.ndarray, int]:
    """-> (values [rows, n] uint64, how many are not below their row's bound, 0 without
    ``bounds``); ``len(buf)`` exact."""
    w = np.ascontiguousarray(widths, dtype=np.int32)
    b = None if bounds is None else np.ascontiguousarray(bounds, dtype=np.uint64)
    src = np.frombuffer(buf, dtype=np.uint8)
    out = np.empty((w.size, n), dtype=np.uint64)
    bad = _library().veil_unpack_runs(out.ctypes.data, src.ctypes.data, w.size, n, w.ctypes.data,
                                      None if b is None else b.ctypes.data)
    return out, int(bad)

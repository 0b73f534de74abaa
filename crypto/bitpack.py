"""Residues on the wire: each row of values in a run of ``n * width / 8`` bytes, least
significant bit first, the runs one after another (native ciphertexts and keys, SEAL's packed
saves). The C kernel (``kernels/bitpack_cpu``) where it is built, numpy elsewhere; both give the
same bytes (``tests/test_native_serial.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from veil.kernels import bitpack_cpu

__all__ = ["pack_runs", "unpack_runs", "run_bytes"]


def run_bytes(n: int, width: int) -> int:
    return n * width // 8


def _check(n: int, widths: np.ndarray) -> None:
    if n % 8 or widths.size and not (1 <= widths.min() and widths.max() <= 64):
        raise ValueError("runs need n a multiple of 8 and widths in 1..64")


def pack_runs(values: np.ndarray, widths: Sequence[int]) -> bytes:
    """``values`` [rows, n] (below 2^width of their row) -> the packed runs."""
    w = np.asarray(widths, dtype=np.int32)
    values = np.asarray(values).reshape(w.size, -1)
    _check(values.shape[1], w)
    if bitpack_cpu.available():
        return bitpack_cpu.pack_runs(values, w)
    return _pack_numpy(values, w)


def unpack_runs(buf: bytes, n: int, widths: Sequence[int], bounds: Sequence[int] | None = None
                ) -> tuple[np.ndarray, int]:
    """The packed runs -> (values [rows, n] uint64, how many are not below their row's bound;
    0 without ``bounds``). ``len(buf)`` must be exact."""
    w = np.asarray(widths, dtype=np.int32)
    _check(n, w)
    if len(buf) != sum(run_bytes(n, int(x)) for x in w):
        raise ValueError("packed runs of the wrong length")
    b = None if bounds is None else np.array([int(q) for q in bounds], dtype=np.uint64)
    if bitpack_cpu.available():
        return bitpack_cpu.unpack_runs(buf, n, w, b)
    return _unpack_numpy(buf, n, w, b)


def _pack_numpy(values: np.ndarray, widths: np.ndarray) -> bytes:
    a = values.astype("<u8")
    out = []
    for row, w in zip(a, widths, strict=True):
        bits = np.unpackbits(row.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
        out.append(np.packbits(bits[:, :w], bitorder="little").tobytes())
    return b"".join(out)


def _unpack_numpy(buf: bytes, n: int, widths: np.ndarray, bounds: np.ndarray | None) -> tuple[np.ndarray, int]:
    raw = np.frombuffer(buf, dtype=np.uint8)
    out = np.empty((widths.size, n), dtype="<u8")
    pos, bad = 0, 0
    for r, w in enumerate(widths):
        size = run_bytes(n, int(w))
        full = np.zeros((n, 64), dtype=np.uint8)
        full[:, :w] = np.unpackbits(raw[pos : pos + size], bitorder="little").reshape(n, w)
        out[r] = np.packbits(full, axis=1, bitorder="little").view("<u8")[:, 0]
        if bounds is not None:
            bad += int(np.count_nonzero(out[r] >= bounds[r]))
        pos += size
    return out.astype(np.uint64), bad

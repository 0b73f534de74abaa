"""The native CKKS backend's CPU kernels (``ckks_cpu.c``), built on first use and called by ctypes.

* ``ntt_cpu``: the negacyclic NTT / INTT. Twin: ``veil.crypto.native.ntt.NttTables.twin`` (the
  same network and tables; both end canonical, so outputs are equal bit for bit). Why C: the
  twin makes one pass over memory per butterfly stage (compiled, ~600 µs per 16,384-point limb
  on the development VM, 7× SEAL's transform); the kernel keeps a limb in cache across stages,
  and on x86 CPUs with AVX-512 IFMA runs 8 butterflies at a time (52-bit products for primes
  below 2^50, 64-bit ones from 32-bit products for the others; ``ntt_vectorized``;
  ``VEIL_CPU_IFMA=0`` keeps the scalar loops). Without IFMA, on CPUs with AVX2 and FMA, 4
  butterflies at a time: in doubles, exact through FMA, for primes below 2^44 (the chain's
  36-bit ones), on 64-bit integer lanes with products built from 32-bit ones for the others
  (``ntt_path``; ``VEIL_CPU_AVX2=0`` keeps the scalar loops).
* ``mac_cpu``: ``dot_plain``'s sum of ct × pt products, and a single ct × pt as one term
  (twin: ``ckks_ops.mac_torch``); ``mac_many_cpu``: several such sums over the same terms
  (``dot_plain_many``: a product's giant steps), and
  ``key_inner_cpu``: a key switch's digits × key (twin: ``rns._key_inner``). Eager torch
  spends a dozen passes over memory per term; the kernel sums exact 128-bit products in one
  pass, both key halves per read of the digits, and reads each shared weight block once for
  all rows of a batch (a batch's per-session plaintexts, ``row_weights``, row by row); on
  AVX2 without IFMA 4 products at a time, in three 64-bit columns of 32-bit products.
* ``gather_cpu``: the automorphisms of a hoisted set of rotations (twin: ``torch.gather``).

Tests: ``tests/test_ckks_cpu.py``. On CUDA tensors the Triton kernels run instead. Built on
first use by ``cbuild`` (no compiler, a failed build or ``VEIL_CPU_KERNELS=0``: the twin runs,
and ``available()`` says so); the loops are OpenMP loops on torch's own team.
"""

from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path

import numpy as np
import torch

from veil.kernels import cbuild

__all__ = ["available", "gather_cpu", "key_inner_cpu", "mac_cpu", "mac_many_cpu", "ntt_cpu", "ntt_path", "ntt_reduced_cpu", "ntt_vectorized", "row_weights",
           "sub_mul_cpu"]

_SOURCE = Path(__file__).with_name("ckks_cpu.c")
_MAX_Q = 1 << 62  # the lazy bounds need 4q < 2^64
_FLAGS = ("-O3",)  # portable: the IFMA stages carry their own target attribute and are chosen at run time


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The compiled kernel, or None (and one log line) where it cannot be built."""
    lib = cbuild.load(_SOURCE, _FLAGS)
    if lib is None:
        return None
    p = ctypes.c_void_p
    i64 = ctypes.c_int64
    lib.veil_ntt_table.argtypes = [p, p, p, i64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
    lib.veil_ntt_rows.argtypes = [p, p, i64, i64, i64, i64, p, p, ctypes.c_int, ctypes.c_int, p, ctypes.c_int]
    lib.veil_sub_mul.argtypes = [p, p, i64, p, i64, i64, i64, p, p, p, i64, i64]
    lib.veil_sub_mul.restype = None
    lib.veil_mac.argtypes = [p, p, i64, p, i64, i64, i64, i64, i64, i64, i64, p]
    lib.veil_ntt_table.restype = lib.veil_ntt_rows.restype = lib.veil_mac.restype = None
    lib.veil_ntt_ifma.argtypes, lib.veil_ntt_ifma.restype = [], ctypes.c_int
    lib.veil_ntt_path.argtypes, lib.veil_ntt_path.restype = [ctypes.c_uint64, i64], ctypes.c_int
    lib.veil_gather.argtypes, lib.veil_gather.restype = [p, p, p, i64, i64, i64], None
    lib.veil_add_mod.argtypes, lib.veil_add_mod.restype = [p, p, p, i64, i64, i64, p], None
    return lib


def available() -> bool:
    """Whether CPU tensors take the kernel (enabled and built)."""
    return cbuild.enabled() and _library() is not None


def ntt_vectorized() -> bool:
    """Whether the kernels run their AVX-512 lanes: the NTT's stages for every prime, the
    multiply-accumulate and the rescale tail for primes below 2^50 (an x86 CPU with IFMA and DQ,
    and ``VEIL_CPU_IFMA`` not 0: benchmarks compare both)."""
    return available() and bool(_library().veil_ntt_ifma())


def ntt_path(q: int, n: int) -> str:
    """Which loops transform a row of prime ``q`` and degree ``n``: ``"avx512"`` (IFMA's lanes),
    ``"avx2"`` (AVX2 and FMA without IFMA), ``"scalar"`` (neither, or ``n`` below 16); without
    the kernel ``"twin"``. Decided on the first transform (the CPU, ``VEIL_CPU_IFMA``,
    ``VEIL_CPU_AVX2``)."""
    if not available():
        return "twin"
    return ("scalar", "avx2", "avx512")[_library().veil_ntt_path(q, n)]


@functools.lru_cache(maxsize=128)
def _prime_table(q: int, n: int) -> torch.Tensor:
    """One prime's twiddles and their Shoup quotients (the C file's table layout), uint64 bits
    in an int64 tensor."""
    from veil.crypto.native.ntt import _twiddles

    fw, inv, n_inv = _twiddles(q, n)
    w, winv = np.asarray(fw, dtype=np.uint64), np.asarray(inv, dtype=np.uint64)  # alive for the call
    tab = torch.empty(6 * n + 6, dtype=torch.int64)
    _library().veil_ntt_table(tab.data_ptr(), w.ctypes.data, winv.ctypes.data, n, q, n_inv, inv[1] * n_inv % q)
    return tab


@functools.lru_cache(maxsize=256)
def _primes(primes: tuple[int, ...]) -> ctypes.Array:
    """The primes as the C array the kernels take (built once per basis, not per call)."""
    return (ctypes.c_uint64 * len(primes))(*primes)


class _Tables:
    """The NTT tables' addresses for one tuple of primes (the tensors kept alive with them)."""

    def __init__(self, primes: tuple[int, ...], n: int) -> None:
        self.tables = [_prime_table(q, n) for q in primes]
        self.ptrs = (ctypes.c_void_p * len(primes))(*[t.data_ptr() for t in self.tables])


@functools.lru_cache(maxsize=256)
def _tables(primes: tuple[int, ...], n: int) -> _Tables:
    return _Tables(primes, n)


def _polys(x: torch.Tensor, limbs: int) -> torch.Tensor:
    """``x [..., limbs, N]`` as ``[P, limbs, N]`` polynomials of contiguous limbs, one stride
    apart: a view where it can be one (a run of limbs of a wider tensor is read in place), else
    a contiguous copy."""
    n = x.shape[-1]
    try:
        rows = x.view(-1, limbs, n)
    except RuntimeError:  # the leading dims do not merge into one stride
        return x.contiguous().view(-1, limbs, n)
    return rows if rows.stride(-1) == 1 and (limbs == 1 or rows.stride(-2) == n) else rows.contiguous()


def ntt_cpu(primes: tuple[int, ...], x: torch.Tensor, inverse: bool, centre: bool = False) -> torch.Tensor:
    """Forward (coefficients -> NTT form) or inverse NTT of ``x [..., len(primes), N]``, int64 on
    the CPU with ``|x| < q`` per limb; a new tensor, canonical ``[0, q)``, or with ``centre``
    (inverse only) centred, ``(-q/2, q/2]``."""
    n = x.shape[-1]
    _check(primes, [x], n)
    if centre and not inverse:
        raise ValueError("centre is for the inverse transform")
    rows = _polys(x, len(primes))
    out = torch.empty(x.shape, dtype=torch.int64)
    _library().veil_ntt_rows(out.data_ptr(), rows.data_ptr(), rows.stride(0), x.numel() // n, len(primes), n,
                             _primes(primes), _tables(primes, n).ptrs, int(inverse), 0, None, int(centre))
    return out


def ntt_reduced_cpu(primes: tuple[int, ...], x: torch.Tensor, same: torch.Tensor | None = None) -> torch.Tensor:
    """The forward NTT of one integer polynomial ``x [..., 1, N]`` (any ``|x| < 2^62``: a limb
    centred in another basis) in every limb of ``primes``: ``[..., len(primes), N]``, canonical.
    What ``ntt.forward(basis.reduce(x))`` gives, in one pass per limb (rescale, ModDown).
    ``same`` (ModUp): ``x [..., D, 1, N]`` are the centred limbs of the NTT-form ``same``
    ``[..., D, N]`` (canonical) and ``primes`` is ``[p, q_0 .. q_{D-1}]``: digit j's own limb is
    copied from ``same``, not transformed."""
    n = x.shape[-1]
    _check((primes[0],), [x], n)  # one limb: the integers, |x| < 2^62 whatever the prime
    _check(primes, [], n)
    x = x.contiguous()
    if same is not None:
        if same.shape != (*x.shape[:-2], n) or len(primes) != x.shape[-3] + 1:
            raise ValueError(f"same: [..., D, N] for digits [..., D, 1, N] and D + 1 primes, got {tuple(same.shape)}")
        same = same.contiguous()
        _check(primes[1:], [same], n)
    out = torch.empty((*x.shape[:-2], len(primes), n), dtype=torch.int64)
    _library().veil_ntt_rows(out.data_ptr(), x.data_ptr(), n, out.numel() // n, len(primes), n, _primes(primes),
                             _tables(primes, n).ptrs, 0, 1, None if same is None else same.data_ptr(), 0)
    return out


def sub_mul_cpu(primes: tuple[int, ...], x: torch.Tensor, r: torch.Tensor, consts: tuple[int, ...],
                plus: torch.Tensor | None = None) -> torch.Tensor:
    """``(x - r) * c mod q`` in ``[0, q)`` for canonical ``x``, ``r`` ``[..., L, N]`` (one shape)
    and one constant ``c < q`` per limb (``ckks_ops.sub_mul_const_torch``'s contract). ``x`` may
    be a run of limbs of a wider tensor (``y[..., 1:, :]``): read in place, not copied.

    ``plus`` (canonical ``[*rows, C, L, N]``, C = 1 or 2, for ``x [..., *rows, 2, L, N]``): added
    to the first C of each pair of outputs, broadcast over the leading dims (a key switch's
    output pairs meeting the ciphertext's c0, or c0 and c1: ``rns.mod_down``'s ``plus``)."""
    n, limbs = x.shape[-1], len(primes)
    _check(primes, [x, r] + ([] if plus is None else [plus]), n)
    if x.shape != r.shape or len(consts) != limbs or \
            any(not 0 <= c < q for c, q in zip(consts, primes, strict=True)):
        raise ValueError("x and r of one shape, one constant below its prime per limb")
    y_every, y_rows = 1, 1
    if plus is not None:
        lead = plus.shape[:-3]
        if plus.dim() < 3 or plus.shape[-3] not in (1, 2) or x.dim() < plus.dim() or x.shape[-3] != 2 or \
                x.shape[x.dim() - plus.dim():-3] != lead:
            raise ValueError(f"plus [*rows, 1 or 2, L, N] for x [..., *rows, 2, L, N], got {tuple(plus.shape)} "
                             f"for {tuple(x.shape)}")
        y_every = 3 - plus.shape[-3]  # C = 1: every second row (the pair's first); C = 2: every row
        plus = plus.contiguous()
        y_rows = plus.numel() // (limbs * n)
    rows = _polys(x, limbs)
    r = r.contiguous()
    out = torch.empty(x.shape, dtype=torch.int64)
    _library().veil_sub_mul(out.data_ptr(), rows.data_ptr(), rows.stride(0), r.data_ptr(), rows.shape[0], limbs,
                            n, _primes(primes), _primes(tuple(consts)), None if plus is None else plus.data_ptr(),
                            y_every, y_rows)
    return out


def add_cpu(primes: tuple[int, ...], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y mod q`` in ``[0, q)`` for canonical ``x``, ``y`` ``[..., L, N]`` of one shape
    (``Basis.add``'s contract) in one pass."""
    n = x.shape[-1]
    _check(primes, [x, y], n)
    if x.shape != y.shape:
        raise ValueError(f"x {tuple(x.shape)} and y {tuple(y.shape)}: one shape")
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty(x.shape, dtype=torch.int64)
    _library().veil_add_mod(out.data_ptr(), x.data_ptr(), y.data_ptr(), x.numel() // (len(primes) * n),
                            len(primes), n, _primes(primes))
    return out


def gather_cpu(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x [G, ..., N]`` gathered along its last dim, group ``g`` by ``index[g]`` (``[G, N]``, a
    permutation of ``[0, N)``; N a power of two): twin ``torch.gather`` (``ntt.automorphisms``).
    torch's gather and index_select take ~4 ns per int64 here; the kernel's rows stay in cache."""
    n, groups = x.shape[-1], x.shape[0]
    if x.dtype != torch.int64 or index.dtype != torch.int64 or x.device.type != "cpu" or n & (n - 1) \
            or index.shape != (groups, n):
        raise ValueError(f"int64 CPU x [G, ..., N] (N a power of two) and index [G, N], got {tuple(x.shape)} "
                         f"and {tuple(index.shape)}")
    x, index = x.contiguous(), index.contiguous()
    out = torch.empty_like(x)
    _library().veil_gather(out.data_ptr(), x.data_ptr(), index.data_ptr(), groups, x.numel() // (groups * n), n)
    return out


def _check(primes: tuple[int, ...], tensors, n: int) -> None:
    """Int64 CPU residues ``[..., L, N]`` over primes the lazy bounds allow; else ValueError."""
    plane = (len(primes), n)
    for t in tensors:
        if t.dtype != torch.int64 or t.device.type != "cpu" or tuple(t.shape[-2:]) != plane:
            raise ValueError(f"expected int64 CPU residues [..., {plane[0]}, {n}], got {t.dtype} "
                             f"{tuple(t.shape)} on {t.device}")
    if any(not 0 < q < _MAX_Q for q in primes):
        raise ValueError(f"the CPU kernels need primes below 2^62, got {max(primes)}")


def _mac(primes, out: torch.Tensor, a_ptrs: list[int], a_row_stride: int, w_sets: list[list[int]], outs: int,
         group: int | None = None) -> torch.Tensor:
    """``veil_mac`` into ``out`` (contiguous): ``[rows, outs, L, N]``, or with ``group``
    ``[outs / group, rows, group, L, N]`` (a hoisted set's keys: ``[S, rows, 2, L, N]``).
    ``w_sets``: the weights' addresses, ``len(a_ptrs) * outs`` per set (term-major); one set
    that every row shares, or one per equal run of consecutive rows (a batch's sessions)."""
    limbs, n = len(primes), out.shape[-1]
    rows = out.numel() // (outs * limbs * n)
    if not w_sets or rows % len(w_sets) or any(len(ws) != len(a_ptrs) * outs for ws in w_sets):
        raise ValueError(f"{len(w_sets)} weight sets for {rows} rows of {len(a_ptrs)} terms x {outs} outputs")
    a_arr = (ctypes.c_void_p * len(a_ptrs))(*a_ptrs)
    w_arr = (ctypes.c_void_p * (len(w_sets) * len(w_sets[0])))(*[ptr for ws in w_sets for ptr in ws])
    _library().veil_mac(out.data_ptr(), a_arr, a_row_stride, w_arr, rows // len(w_sets), len(a_ptrs), outs,
                        group or outs, rows, limbs, n, _primes(primes))
    return out


def row_weights(a_shape: torch.Size, w_shape: torch.Size) -> tuple[int, int] | None:
    """How the C kernel reads weights of ``w_shape`` against terms of ``a_shape`` (both
    ``[..., L, N]``): ``(0, 1)`` for one ``[L, N]`` plaintext, ``(L * N, rows per weight)`` for
    per-row plaintexts whose leading dims are a's up to some point, then ones (a batch's
    ``[B, 1, L, N]`` against ciphertexts ``[B, 2, L, N]``); None for anything else (the twin)."""
    if len(w_shape) == 2:
        return (0, 1)
    lead_a, lead_w = a_shape[:-2], w_shape[:-2]
    if len(lead_w) != len(lead_a) or w_shape[-2:] != a_shape[-2:]:
        return None
    i = len(lead_w)
    while i and lead_w[i - 1] == 1:
        i -= 1
    if tuple(lead_w[:i]) != tuple(lead_a[:i]):
        return None
    return (w_shape[-2] * w_shape[-1], math.prod(lead_a[i:]))


def mac_cpu(primes: tuple[int, ...], a, w) -> torch.Tensor:
    """``sum_k a[k] * w[k] mod q`` in ``[0, q)``: ``a[k]`` ``[..., L, N]`` (one shape for all k) in
    ``(-q, q)``, ``w[k]`` canonical, one ``[L, N]`` plaintext or a batch's per-row plaintexts
    (``row_weights``; one shape for all k), all int64 CPU residues (``ckks_ops.mac_torch``'s
    contract, which asks for canonical terms). ``mac_many_cpu`` with one row of weights."""
    if not a or len(a) != len(w):
        raise ValueError(f"{len(a)} terms against {len(w)} weights")
    return mac_many_cpu(primes, a, [w])[0]


def mac_many_cpu(primes: tuple[int, ...], a, w) -> torch.Tensor:
    """``mac_cpu`` of the same terms ``a`` against each row of weights ``w[o]`` (``len(a)`` each,
    one shape for all): ``[len(w), ..., L, N]``. A block of the terms is read from memory once
    for all rows (a diagonal product's giant steps share their baby steps)."""
    a = [t.contiguous() for t in a]
    if not a or not w or any(len(row) != len(a) for row in w):
        raise ValueError(f"rows of {len(a)} weights for {len(a)} terms")
    flat = [w[o][k].contiguous() for k in range(len(a)) for o in range(len(w))]
    n = a[0].shape[-1]
    _check(primes, a + flat, n)
    w_rows = row_weights(a[0].shape, flat[0].shape)
    if any(t.shape != a[0].shape for t in a) or any(t.shape != flat[0].shape for t in flat) or w_rows is None:
        raise ValueError("the terms must share one shape, and the weights one shape: [L, N] or per row")
    out = torch.empty((len(w), *a[0].shape), dtype=torch.int64)
    stride, per_set = w_rows
    sets = 1 if stride == 0 else math.prod(a[0].shape[:-2]) // per_set
    w_sets = [[t.data_ptr() + 8 * s * stride for t in flat] for s in range(sets)]
    return _mac(primes, out, [t.data_ptr() for t in a], len(primes) * n, w_sets, len(w), group=1)


def key_inner_cpu(primes: tuple[int, ...], d: torch.Tensor, keys: list) -> torch.Tensor:
    """``sum_j d_j * key_j`` (``rns.key_inner``'s contract) of digits ``d`` ``[..., K, L, N]``
    against each of S keys ``[2, K, L, N]`` (one, or a hoisted set's, in one pass over the
    digits) -> ``[S, ..., 2, L, N]``, canonical. For a batch of sessions (digits ``[B, ..., K,
    L, N]``) a step's key may instead be a sequence of B, one per session, each read where it
    lives (no stack of the sessions' keys: 19 MB a key at level 7)."""
    n, k = d.shape[-1], d.shape[-3]
    if all(torch.is_tensor(key) for key in keys):
        sets = [list(keys)]
    elif d.dim() >= 4 and all(torch.is_tensor(key) or len(key) == d.shape[0] for key in keys):
        sets = [[key if torch.is_tensor(key) else key[b] for key in keys] for b in range(d.shape[0])]
    else:
        raise ValueError("each step's key: one for every row, or one per row of the digits' leading dim")
    flat = [key for keys_b in sets for key in keys_b]
    for key in flat:
        if key.dim() != 4 or key.shape[:2] != (2, k):
            raise ValueError(f"a key [2, {k}, L, N] for {k} digits, got {tuple(key.shape)}")
    d = d.contiguous()
    _check(primes, [d, *flat], n)
    # term j's weights for output 2s + o: key s's half o of digit j, read where it lives (a level's
    # run of limbs of the stored key): its address by the strides, not a view per term (a hoisted
    # set's digits x keys x halves made ~6,000 views of a two-layer step)
    held = [key if key.stride(-1) == 1 and key.stride(-2) == n else key.contiguous() for key in flat]
    at = {id(key): (h.data_ptr(), 8 * h.stride(0), 8 * h.stride(1)) for key, h in zip(flat, held, strict=True)}
    w = [[at[id(key)][0] + o * at[id(key)][1] + j * at[id(key)][2] for j in range(k) for key in keys_b
          for o in range(2)] for keys_b in sets]
    plane = len(primes) * n
    out = torch.empty((len(keys), *d.shape[:-3], 2, len(primes), n), dtype=torch.int64)
    return _mac(primes, out, [d.data_ptr() + 8 * j * plane for j in range(k)], k * plane, w, 2 * len(keys), group=2)

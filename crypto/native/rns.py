"""RNS basis operations: rescale, key-switching ModUp/ModDown, exact CRT composition.

Each function is one batched torch computation over ``[..., limbs, N]`` tensors (leading dims
free), the unit a GPU kernel replaces one for one. Ciphertext polynomials are in NTT form. On
CUDA tensors ``key_inner`` and the ``(x - r) * c`` tail of ``rescale`` / ``mod_down`` run as
Triton kernels (``veil.kernels.ckks_ops``, whose twins compute what the torch code here does).

* ``rescale``: ``round(c / q_l)`` exactly in RNS: the last limb's centred coefficients ``r``
  (``c - r`` is divisible by ``q_l``) are subtracted from the other limbs, which are then
  multiplied by ``q_l^-1`` (SEAL's rounding, so the result equals SEAL's bit for bit).
* ``decompose`` (ModUp): the digits of the hybrid key switch are the centred coefficient
  residues ``[c]_{q_j}`` (one data prime per digit), each lifted to the extended basis
  ``[p, q_0..q_l]`` and put back in NTT form.
* ``mod_down``: ``round(x / p)`` from the extended basis back to the data limbs (as rescale).
* ``balanced_digits``: the exact centred integer of a residue vector as mixed-radix digits
  ``x = sum_k y_k * q_0...q_{k-1}`` with ``|y_k| <= (q_k - 1)/2`` (Garner); from the digits,
  ``digits_to_float`` gives doubles (the top digit dominates, so the sum is accurate to a few
  ulps) and ``digits_to_ntt`` the integers in NTT form over any basis (refresh re-encryption).
"""

from __future__ import annotations

import functools
import math

import torch

from veil.crypto.native.context import RnsContext
from veil.crypto.native.modarith import Basis, MulConst
from veil.crypto.native.ntt import compiled
from veil.kernels import ckks_cpu, ckks_ops
from veil.kernels.ckks_ops import key_inner_sets_triton, key_inner_triton, sub_mul_const, use_triton

__all__ = ["add", "to_residues", "rescale", "decompose", "key_inner", "key_inner_many", "mul_plain", "mac", "mod_down",
           "balanced_digits", "digits_to_float", "digits_to_ints", "digits_to_ntt"]


def to_residues(coeffs: torch.Tensor, basis: Basis) -> torch.Tensor:
    """Integer coefficients ``[..., N]`` (int64) -> residues ``[..., L, N]``."""
    return basis.reduce(coeffs.unsqueeze(-2))


def rescale(x: torch.Tensor, ctx: RnsContext, level: int) -> torch.Tensor:
    """``[..., level+1, N]`` -> ``[..., level, N]``: divide by ``q_level`` and round."""
    basis, ntt = ctx.data(level)
    last = ntt.limbs(slice(level, level + 1))
    r = last.inverse_centred(x[..., level:, :])
    low_basis, low_ntt = ctx.data(level - 1)
    return _drop_limb(x[..., :level, :], r, low_basis, low_ntt, ctx.data_primes[level],
                      lambda: ctx.rescale_const(level))


def _drop_limb(x: torch.Tensor, r: torch.Tensor, basis: Basis, ntt, dropped: int, const,
               plus: torch.Tensor | None = None) -> torch.Tensor:
    """``(x - r) / dropped`` in ``basis`` (NTT form) for the centred coefficients ``r`` ``[..., 1, N]``
    of the limb being dropped: the tail of a rescale and of ModDown (``plus``: ``mod_down``'s). On
    the CPU two C passes per limb (``NttTables.lift``, ``sub_mul_cpu``); elsewhere
    ``sub_mul_const`` after the NTT (``const()``: dropped^-1 per limb as a ``MulConst``)."""
    r = ntt.lift(r.squeeze(-2))
    if x.device.type == "cpu" and ckks_cpu.available():
        return ckks_cpu.sub_mul_cpu(basis.primes, x, r, _inverses(dropped, basis.primes), plus)
    return sub_mul_const(x, r, const(), basis, plus)


@functools.lru_cache(maxsize=64)
def _inverses(value: int, primes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(pow(value, -1, q) for q in primes)


def decompose(c: torch.Tensor, ctx: RnsContext, level: int) -> torch.Tensor:
    """ModUp: ``[..., level+1, N]`` (data limbs, NTT) -> digits ``[..., level+1, level+2, N]``
    (digit ``j`` = the centred ``[c]_{q_j}`` over ``[p, q_0..q_level]``, NTT form)."""
    basis, ntt = ctx.data(level)
    centred, (ext_basis, ext_ntt) = ntt.inverse_centred(c), ctx.ext(level)
    if c.device.type == "cpu" and ckks_cpu.available():  # digit j's own limb is c's limb j: copied
        return ckks_cpu.ntt_reduced_cpu(ext_basis.primes, centred.unsqueeze(-2), same=c)
    return ext_ntt.lift(centred)


def _key_inner(d: torch.Tensor, key: torch.Tensor, basis: Basis) -> torch.Tensor:
    acc = None  # one digit at a time: each step's operands stay in cache
    for j in range(d.shape[-3]):
        p = basis.mul_lazy(d[..., j, None, :, :], key.select(-3, j))  # a batch's per-row keys broadcast
        acc = p if acc is None else acc.add_(p)
    return basis.reduce(acc)


def key_inner(d: torch.Tensor, key: torch.Tensor, basis: Basis, compile: bool = False) -> torch.Tensor:
    """``sum_j d_j * key_j`` for digits ``d`` ``[..., K, L, N]`` and a key ``[2, K, L, N]``
    (its two halves): ``[..., 2, L, N]`` (a batch's per-row keys: ``key_inner_many``). Lazy
    products are summed in int64 and reduced once (``K * q < 2^63``: ``RnsContext`` checks it).
    On CUDA one Triton kernel (``veil.kernels.ckks_ops``), on the CPU one C kernel
    (``veil.kernels.ckks_cpu``), and the code below is their twin. A rotation's automorphism is
    not applied here: its key is held permuted and its output gathered (``keys.rotation_key``)."""
    if use_triton(d):
        return key_inner_triton(d, key, basis)
    if d.device.type == "cpu" and ckks_cpu.available():
        return ckks_cpu.key_inner_cpu(basis.primes, d, [key])[0]
    return (compiled(_key_inner) if compile else _key_inner)(d, key, basis)


def key_inner_many(d: torch.Tensor, keys, basis: Basis, compile: bool = False) -> torch.Tensor:
    """``key_inner`` of the same digits against each step's key: ``[S, ..., 2, L, N]``. A step's
    key is one ``[2, K, L, N]``, or a batch's per-row keys (a sequence of them, for digits
    ``[B, K, L, N]``). On CUDA one Triton launch for every step, row and limb, each key read in
    place; on the CPU one C call writes every key's result in place (no stack of S results: 38
    MB for 16 keys at level 7) and reads each block of digits once for all keys, a batch's
    per-row keys each where it lives; elsewhere a product per key (per row)."""
    if use_triton(d):
        return key_inner_sets_triton(d, [[k] if torch.is_tensor(k) else list(k) for k in keys], basis)
    if d.device.type == "cpu" and ckks_cpu.available():
        return ckks_cpu.key_inner_cpu(basis.primes, d, keys)
    return torch.stack([key_inner(d, k, basis, compile) if torch.is_tensor(k) else
                        torch.stack([key_inner(x, r, basis, compile) for x, r in zip(d.unbind(0), k, strict=True)])
                        for k in keys])


def add(x: torch.Tensor, y: torch.Tensor, basis: Basis) -> torch.Tensor:
    """``x + y`` in ``[0, q)`` for equal shapes: one Triton launch on CUDA (``ckks_ops``), one C
    pass on the CPU (``ckks_cpu``, where it could be built), ``Basis.add`` elsewhere."""
    if use_triton(x) and x.shape == y.shape:
        return ckks_ops.add_triton(x, y, basis)
    if x.device.type == "cpu" and x.shape == y.shape and ckks_cpu.available():
        return ckks_cpu.add_cpu(basis.primes, x, y)
    return basis.add(x, y)


def mul_plain(c: torch.Tensor, m: torch.Tensor, basis: Basis) -> torch.Tensor:
    """ct x pt: ``c`` ``[..., L, N]`` times a plaintext ``m`` (``[L, N]``, or a batch's per-row
    ``[B, 1, L, N]``) in ``[0, q)``: the multiply-accumulate with one term (C on the CPU,
    Triton on CUDA, a batch's per-row plaintexts through the rows kernel: one pass where
    ``Basis.mul`` makes a dozen eager ones); ``Basis.mul`` elsewhere."""
    if ckks_ops.kernel_takes_mac([c], [m]) or ckks_ops.rows_kernel_layout([c], [m]) is not None:
        return ckks_ops.mac(c.unsqueeze(0), m.unsqueeze(0), basis)
    return basis.mul(c, m)


def mac(a, w, basis: Basis, compile: bool = False) -> torch.Tensor:
    """``sum_k a[k] * w[k]`` for ``dot_plain`` (``ckks_ops.mac``: the Triton kernel on CUDA,
    the C kernel on the CPU, its twin elsewhere). ``compile``: off CUDA, where the C kernel does
    not take the terms, the twin through ``torch.compile``, one fused pass over the terms
    instead of a dozen eager operations per term (a graph per number of terms)."""
    if compile and not use_triton(a[0]) and not ckks_ops.kernel_takes_mac(a, w):
        return compiled(ckks_ops.mac_torch)(list(a), list(w), basis)
    return ckks_ops.mac(a, w, basis)


def mac_many(a, rows, basis: Basis, compile: bool = False) -> list[torch.Tensor]:
    """``mac`` of the same terms ``a`` against each row of weights (one per term; None leaves
    the term out of that row). On the CPU one C call (``ckks_cpu.mac_many_cpu``) reads each
    block of the terms once for all rows, an absent weight meeting zeros; on CUDA one launch
    (``ckks_ops.mac_many_triton``) for every row, the terms stacked once and each weight read in
    place, a batch's shared or per-row plaintexts alike; elsewhere a ``mac`` per row."""
    ws = [w for row in rows for w in row if w is not None]
    layout = ckks_ops.rows_kernel_layout(a, ws)
    if layout is not None:
        stacked = a if torch.is_tensor(a) else torch.stack(list(a))
        return list(ckks_ops.mac_many_triton(stacked, rows, basis, layout).unbind(0))
    if a[0].device.type == "cpu" and ckks_ops.kernel_takes_mac(a, ws):
        zero = torch.zeros_like(ws[0]) if len(ws) < len(a) * len(rows) else None
        full = [[zero if w is None else w for w in row] for row in rows]
        return list(ckks_cpu.mac_many_cpu(basis.primes, list(a), full).unbind(0))
    return [mac([t for t, w in zip(a, row, strict=True) if w is not None], [w for w in row if w is not None],
                basis, compile) for row in rows]


def mod_down(x: torch.Tensor, ctx: RnsContext, level: int, plus: torch.Tensor | None = None) -> torch.Tensor:
    """``[..., level+2, N]`` over ``[p, q_0..q_level]`` -> ``[..., level+1, N]``: ``round(x/p)``.
    ``plus`` (``[*rows, C, level+1, N]`` for key-switch outputs ``x [..., *rows, 2, level+2, N]``)
    is added to the first C of each output pair in the same pass: a rotation's c0 (C = 1) or a
    relinearization's c0 and c1 (C = 2), broadcast over a hoisted set's rotations."""
    _, sp_ntt = ctx.special
    r = sp_ntt.inverse_centred(x[..., :1, :])
    basis, ntt = ctx.data(level)
    return _drop_limb(x[..., 1:, :], r, basis, ntt, ctx.special_prime, lambda: ctx.p_inv(level), plus)


@functools.lru_cache(maxsize=32)  # a few elements each, per chain prefix and device
def _garner(primes: tuple[int, ...], device: str) -> tuple[list[MulConst], list[MulConst]]:
    """Mixed-radix constants of ``primes``: for each ``k >= 1``, ``P_j mod q_k`` (``1 <= j < k``;
    ``P_0 = 1`` needs no product; None at ``k = 1``) and ``P_k^-1 mod q_k``."""
    basis = Basis.of(primes, device)
    col = lambda v: torch.tensor(v, dtype=torch.int64, device=device).view(-1, 1)  # noqa: E731
    radix, inv = [], []
    for k in range(1, len(primes)):
        bk = basis.limbs(slice(k, k + 1))
        radix.append(bk.const(col([math.prod(primes[:j]) % primes[k] for j in range(1, k)])) if k > 1 else None)
        inv.append(bk.const(col([pow(math.prod(primes[:k]), -1, primes[k])])))
    return radix, inv


def balanced_digits(coeffs: torch.Tensor, basis: Basis) -> torch.Tensor:
    """Coefficient residues ``[..., L, n]`` over ``basis`` -> balanced mixed-radix digits (same
    shape). Any ring degree: the client's folded downloads (N/2) take it too."""
    radix, inv = _garner(basis.primes, str(basis.device))
    ys = [basis.limbs(slice(0, 1)).center(coeffs[..., :1, :])]
    for k in range(1, len(basis.primes)):
        bk = basis.limbs(slice(k, k + 1))
        acc = bk.reduce(ys[0])  # y_0 P_0, P_0 = 1
        if k > 1:  # + sum_{1 <= j < k} y_j P_j mod q_k
            acc = bk.reduce(radix[k - 1].mul_lazy(bk.reduce(torch.cat(ys[1:], dim=-2))).sum(-2, keepdim=True) + acc)
        ys.append(bk.center(inv[k - 1].mul(bk.sub(coeffs[..., k : k + 1, :], acc))))
    return torch.cat(ys, dim=-2)


def radices(primes: tuple[int, ...]) -> list[int]:
    """``P_k = q_0 ... q_{k-1}`` for each digit."""
    return [math.prod(primes[:k]) for k in range(len(primes))]


def digits_to_float(y: torch.Tensor, primes: tuple[int, ...]) -> torch.Tensor:
    """The integer of balanced digits ``[..., K, N]`` as float64 ``[..., N]``."""
    w = torch.tensor([float(r) for r in radices(primes)], dtype=torch.float64, device=y.device)
    return (y.to(torch.float64) * w.view(-1, 1)).sum(-2)


def digits_to_ints(y: torch.Tensor, primes: tuple[int, ...]):
    """The integers of balanced digits ``[K, N]`` as a numpy object array of Python ints."""
    import numpy as np

    yn = y.cpu().numpy()
    out = np.zeros(yn.shape[-1], dtype=object)
    for k, r in enumerate(radices(primes)):
        out = out + yn[k].astype(object) * r
    return out


def digits_to_ntt(y: torch.Tensor, ctx: RnsContext, level: int, radices: tuple[int, ...]) -> torch.Tensor:
    """The integer polynomials ``sum_k y_k * radices[k]`` of digits ``y [..., K, N]`` (any
    ``|y| < 2^62``) in NTT form over the data limbs of ``level``: each digit reduced and
    transformed in every limb (``NttTables.lift``: on the CPU one C pass a limb), then scaled by
    its radix's residues and summed in one multiply-accumulate (the NTT is linear), where eager
    passes reduced every digit in every limb first (``benchmarks/results/2026-12-07-client-refresh``).
    The client's refresh re-encoding and the server's refresh mask."""
    basis, ntt = ctx.data(level)
    return mac(list(ntt.lift(y).unbind(-3)), list(ctx.radix_planes(level, radices).unbind(0)), basis)

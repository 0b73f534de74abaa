"""Fused RNS-CKKS residue kernels in Triton, each with its torch twin.

* ``key_inner_sets_triton`` (``key_inner_triton``: one set): the key-switch inner product
  ``out[s, ..., r, i, x] = sum_j d[..., j, i, x] * key_s[r, j, i, x] mod q_i`` for each key
  ``s`` of a hoisted set, each digit element read once for both key halves (a rotation's
  automorphism is a gather of the output: ``keys.rotation_key``). Twin: ``rns.key_inner``
  (lazy products summed and reduced once).
* ``mac``: ``out[..., i, x] = sum_k a[k, ..., i, x] * w[k, i, x] mod q_i``, the ct x pt sums
  of the BSGS matvec (``evaluator.dot_plain``), one pass over the terms; ``mac_many_triton``:
  every giant step of a product (rows of weights, absent ones left out) in one launch, the
  weights read in place through a table of addresses, once per tile of a batch's rows. Twin:
  ``mac_torch`` per row.
* ``sub_mul_const``: ``(x - r) * c mod q_i`` with a per-limb constant ``c``, the tail of
  ``rns.rescale`` and ``rns.mod_down`` after their NTT.

Sums of lazy products (each in ``(-q, q)``) are held in int64 and reduced before ``2^63`` is
reached: ``key_inner`` needs ``K * q < 2^63`` (``RnsContext`` checks it for its chain), ``mac``
reduces every ``(2^63 - 1) // q - 1`` terms as ``dot_plain`` does. Products and reductions:
``ckks_arith`` (the bounds of ``modarith``). Outputs are canonical, hence equal to the twins'.
Every kernel launches once for all runs of limbs (the two product schemes: a program reads its
limb's from ``Basis.wide_limbs``; a constant's fields come from ``MulConst.stacked``), ``key_inner`` once for every key and
row too (each key read through a table of addresses: a hoisted set's keys and a batch's per-row
keys in place, not stacked); a program handles one ``(batch row, limb)`` and ``BLOCK``
coefficients. Inputs may have any strides but a unit one on N (others are made contiguous
first).
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch
import triton
import triton.language as tl

from veil.kernels import ckks_cpu
from veil.kernels._utils import check_triton_device
from veil.kernels.ckks_arith import NO_FMA, fix, mul_const_lazy, mul_lazy, reduce_lazy, use_triton
from veil.kernels.host import to_device

__all__ = ["add_triton", "key_inner_sets_triton", "key_inner_triton", "use_triton", "mac", "mac_many_layout", "mac_many_triton", "rows_kernel_layout",
           "mac_torch", "mac_triton", "sub_mul_const",
           "sub_mul_const_torch", "sub_mul_const_triton"]

_BLOCK = 1024


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _grid(rows: int, n: int) -> tuple[tuple[int, int], int]:
    block = min(_BLOCK, triton.next_power_of_2(n))
    return (rows, triton.cdiv(n, block)), block


def _col(t: torch.Tensor) -> torch.Tensor:
    """A per-limb column ``[L]`` / ``[L, 1]`` as the kernels index it (``ptr + limb``): itself
    when contiguous, as built (no view dispatched per launch), else a contiguous copy."""
    return t if t.is_contiguous() else t.reshape(-1).contiguous()


# ---- key switching: sum_j d_j * key_j ---------------------------------------------------
@triton.jit
def _program_tile(limbs, n, BLOCK: tl.constexpr):
    """What a program of the ``(B * L, N / BLOCK)`` grid works on: batch row ``b``, its limb,
    its ``BLOCK`` coefficients and their mask."""
    row = tl.program_id(0).to(tl.int64)
    x = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return row // limbs, row % limbs, x, x < n


@triton.jit
def _key_inner_sum(d_j, k_j, sd_j, sk_j, sk_r, digits, mask, q, qinv, WIDE: tl.constexpr,
                   BLOCK: tl.constexpr):
    acc0 = tl.zeros([BLOCK], dtype=tl.int64)
    acc1 = tl.zeros([BLOCK], dtype=tl.int64)
    for _ in range(digits):  # |acc| < digits * q < 2^63 (checked by the launcher)
        a = tl.load(d_j, mask=mask, other=0)
        acc0 += mul_lazy(a, tl.load(k_j, mask=mask, other=0), q, qinv, WIDE)
        acc1 += mul_lazy(a, tl.load(k_j + sk_r, mask=mask, other=0), q, qinv, WIDE)
        d_j += sd_j
        k_j += sk_j
    return acc0, acc1


@triton.jit
def _key_inner_kernel(d_ptr, keys_ptr, out_ptr, q_ptr, qinv_ptr, wide_ptr, rows, key_rows, limbs,
                      digits, n, sd_b, sd_j, sd_i, sk_r, sk_j, sk_i, so_s, so_b, so_r, so_i,
                      BLOCK: tl.constexpr):
    # program (set s, row b, limb) x BLOCK coefficients; the key of (s, b) is read through the
    # table of addresses ``keys`` (``key_rows`` = 1: one key for every row), so a hoisted set's
    # keys and a batch's per-row keys are read in place, and every run of limbs shares the launch
    pid = tl.program_id(0).to(tl.int64)
    limb = pid % limbs
    b = (pid // limbs) % rows
    s = pid // (limbs * rows)
    x = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = x < n
    key = tl.load(keys_ptr + s * key_rows + b % key_rows).to(tl.pointer_type(tl.int64))
    q = tl.load(q_ptr + limb)
    qinv = tl.load(qinv_ptr + limb)
    d_j = d_ptr + b * sd_b + limb * sd_i + x
    k_j = key + limb * sk_i + x
    if tl.load(wide_ptr + limb) != 0:
        acc0, acc1 = _key_inner_sum(d_j, k_j, sd_j, sk_j, sk_r, digits, mask, q, qinv, True, BLOCK)
    else:
        acc0, acc1 = _key_inner_sum(d_j, k_j, sd_j, sk_j, sk_r, digits, mask, q, qinv, False, BLOCK)
    out = out_ptr + s * so_s + b * so_b + limb * so_i + x
    tl.store(out, fix(reduce_lazy(acc0, q, qinv), q), mask=mask)
    tl.store(out + so_r, fix(reduce_lazy(acc1, q, qinv), q), mask=mask)


def _addresses(tensors: list[torch.Tensor], device) -> torch.Tensor:
    """The data addresses of ``tensors`` as an int64 tensor on ``device`` (a kernel's table of
    operands that are not one tensor), made once per set of addresses: a session's keys are
    long-lived, so a key switch does not pay a host-to-device copy for its table."""
    return _table(tuple(t.data_ptr() for t in tensors), device)


def _table(values: tuple[int, ...], device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``, cached, and held by the graphs being
    captured on this thread (``keep_tables``)."""
    table = _address_table(values, str(device))
    for into in getattr(_keeping, "lists", ()):
        into.append(table)
    return table


_keeping = threading.local()


@contextlib.contextmanager
def keep_tables(into: list):
    """Within it, on this thread, every address table a launch reads is appended to ``into``: a
    CUDA graph captured meanwhile reads those tables at each replay, so it holds them (the
    table cache may drop them; ``veil.crypto.native.graphs``)."""
    lists = _keeping.__dict__.setdefault("lists", [])
    lists.append(into)
    try:
        yield
    finally:
        lists.pop()


@functools.lru_cache(maxsize=4096)
def _address_table(addresses: tuple[int, ...], device: str) -> torch.Tensor:
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():  # a graph would copy from a
        raise RuntimeError("an address table made during a CUDA graph capture")  # host buffer reused later
    # queued through pinned memory (a copy from pageable memory would wait for the stream's work
    # first), as a batch's ct x ct or a shuffled layer's product makes a table of fresh addresses
    # at every call
    return to_device(list(addresses), dev, torch.int64)


def key_inner_sets_triton(d: torch.Tensor, sets, basis) -> torch.Tensor:
    """``rns.key_inner`` of digits ``d`` ``[..., K, L, N]`` (canonical) against each of ``S``
    key sets, in one launch: a set is one key ``[2, K, L, N]`` for every row, or one per row
    of ``d`` ``[B, K, L, N]`` (a batch of sessions); keys canonical, any views with equal
    strides and a unit stride on N (``SwitchKey.at``) -> ``[S, ..., 2, L, N]``."""
    keys = [k for keys in sets for k in keys]
    check_triton_device(d, *keys, basis.q)
    *lead, k, limbs, n = d.shape
    key_rows = len(sets[0]) if sets else 1
    if (not sets or any(len(ks) != key_rows for ks in sets)
            or (key_rows > 1 and lead != [key_rows])
            or any(key.shape != (2, k, limbs, n) or key.dtype != torch.int64 for key in keys)
            or d.dtype != torch.int64):
        raise ValueError(f"digits {tuple(d.shape)} {d.dtype} and keys "
                         f"{[tuple(key.shape) for key in keys]} do not match [..., K, L, N] / "
                         f"sets of one key or one per row [2, K, L, N] int64")
    if k * max(basis.primes) >= 2**63:
        raise ValueError(f"{k} digits overflow the int64 accumulator")
    if len({key.stride() for key in keys}) != 1 or keys[0].stride(-1) != 1:
        keys = [key.contiguous() for key in keys]
    d4 = _unit_last(d.reshape(-1, k, limbs, n))
    rows = d4.shape[0]
    out = torch.empty((len(sets), rows, 2, limbs, n), dtype=torch.int64, device=d.device)
    grid, block = _grid(len(sets) * rows * limbs, n)
    if grid[0]:
        _key_inner_kernel[grid](
            d4, _addresses(keys, d.device), out, _col(basis.q), _col(basis.qinv), basis.wide_limbs,
            rows, key_rows, limbs, k, n, d4.stride(0), d4.stride(1), d4.stride(2), keys[0].stride(0),
            keys[0].stride(1), keys[0].stride(2), out.stride(0), out.stride(1), out.stride(2),
            out.stride(3), BLOCK=block, **NO_FMA)
    return out.view(len(sets), *lead, 2, limbs, n)


def key_inner_triton(d: torch.Tensor, key: torch.Tensor, basis) -> torch.Tensor:
    """``rns.key_inner(d, key, basis)``: digits ``[..., K, L, N]`` (canonical), one key
    ``[2, K, L, N]`` (canonical, any view, e.g. ``SwitchKey.at``) -> ``[..., 2, L, N]``."""
    return key_inner_sets_triton(d, [[key]], basis)[0]


# ---- ct x pt multiply-accumulate: sum_k a_k * w_k ----------------------------------------------
@triton.jit
def _mac_sum(a_k, w_k, sa_k, sw_k, terms, per_reduce, mask, q, qinv, WIDE: tl.constexpr,
             BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    held = 0  # lazy terms in acc (a reduced acc counts as one): |acc| < held * q < 2^63
    for _ in range(terms):
        if held == per_reduce:
            acc = reduce_lazy(acc, q, qinv)
            held = 1
        acc += mul_lazy(tl.load(a_k, mask=mask, other=0), tl.load(w_k, mask=mask, other=0), q,
                        qinv, WIDE)
        held += 1
        a_k += sa_k
        w_k += sw_k
    return acc


@triton.jit
def _mac_kernel(a_ptr, w_ptr, out_ptr, q_ptr, qinv_ptr, wide_ptr, terms, per_reduce, limbs, n,
                sa_k, sa_b, sa_i, sw_k, sw_i, so_b, so_i, BLOCK: tl.constexpr):
    # every run of limbs in one launch: a program reads its limb's scheme (``Basis.wide_limbs``)
    b, limb, x, mask = _program_tile(limbs, n, BLOCK)
    q = tl.load(q_ptr + limb)
    qinv = tl.load(qinv_ptr + limb)
    a_k = a_ptr + b * sa_b + limb * sa_i + x
    w_k = w_ptr + limb * sw_i + x
    if tl.load(wide_ptr + limb) != 0:
        acc = _mac_sum(a_k, w_k, sa_k, sw_k, terms, per_reduce, mask, q, qinv, True, BLOCK)
    else:
        acc = _mac_sum(a_k, w_k, sa_k, sw_k, terms, per_reduce, mask, q, qinv, False, BLOCK)
    tl.store(out_ptr + b * so_b + limb * so_i + x, fix(reduce_lazy(acc, q, qinv), q), mask=mask)


def _per_reduce(basis) -> int:
    """Lazy terms an int64 sum holds (``evaluator.dot_plain``'s rule)."""
    return max(1, (2**63 - 1) // max(basis.primes) - 1)


def _check_mac(a: torch.Tensor, w: torch.Tensor, basis) -> None:
    limbs = len(basis)
    if a.dim() < 3 or w.shape != (a.shape[0], limbs, a.shape[-1]) or a.shape[-2] != limbs:
        raise ValueError(f"terms {tuple(a.shape)} and weights {tuple(w.shape)} do not match "
                         f"[K, ..., {limbs}, N] / [K, {limbs}, N]")


def mac_torch(a, w, basis) -> torch.Tensor:
    """``sum_k a[k] * w[k]`` in ``[0, q)`` over K terms: ``a[k]`` ``[..., L, N]``, ``w[k]``
    ``[L, N]`` (or anything that broadcasts against ``a[k]``, e.g. a batch's per-row plaintexts),
    both canonical (``w`` is the split operand of the wide scheme) -> ``[..., L, N]``. ``a``
    and ``w`` are stacked tensors or sequences of the terms (``dot_plain`` passes lists: no
    copy). Lazy products are summed in int64 and reduced once per ``2^63 / q`` terms."""
    acc, held, per = None, 0, _per_reduce(basis)
    for x, y in zip(a, w, strict=True):
        if held == per:
            acc, held = basis.reduce(acc), 1
        term = basis.mul_lazy(x, y)
        acc = term if acc is None else acc.add_(term)
        held += 1
    return basis.reduce(acc)


def mac_triton(a: torch.Tensor, w: torch.Tensor, basis) -> torch.Tensor:
    """Triton launcher; same contract as :func:`mac_torch`."""
    check_triton_device(a, w, basis.q)
    _check_mac(a, w, basis)
    terms, limbs, n = a.shape[0], a.shape[-2], a.shape[-1]
    a4, w = _unit_last(a.reshape(terms, -1, limbs, n)), _unit_last(w)
    out = torch.empty(a4.shape[1:], dtype=torch.int64, device=a.device)
    grid, block = _grid(a4.shape[1] * limbs, n)
    if grid[0]:
        _mac_kernel[grid](
            a4, w, out, _col(basis.q), _col(basis.qinv), basis.wide_limbs, terms, _per_reduce(basis),
            limbs, n, a4.stride(0), a4.stride(1), a4.stride(2), w.stride(0), w.stride(1),
            out.stride(0), out.stride(1), BLOCK=block, **NO_FMA)
    return out.view(a.shape[1:])


def mac(a, w, basis) -> torch.Tensor:
    """:func:`mac_torch`, in one kernel: on CUDA tensors (``use_triton``) ``_mac_kernel`` when
    every weight is one ``[L, N]`` plaintext, ``_mac_rows_kernel`` for a batch's per-row weights
    (``mac_many_layout``); C on CPU tensors (``ckks_cpu``, where it could be built) for both."""
    if kernel_takes_mac(a, w):
        if a[0].device.type == "cpu":
            return ckks_cpu.mac_cpu(basis.primes, list(a), list(w))
        return mac_triton(a if torch.is_tensor(a) else torch.stack(list(a)),
                          w if torch.is_tensor(w) else torch.stack(list(w)), basis)
    layout = rows_kernel_layout(a, w)
    if layout is not None:  # a batch's per-row operands (ct x ct's polynomials, per-session
        # plaintexts): one row of the rows kernel, where the twin would launch a dozen torch kernels per term
        return mac_many_triton(a if torch.is_tensor(a) else torch.stack(list(a)), [list(w)], basis, layout)[0]
    return mac_torch(a, w, basis)


def kernel_takes_mac(a, w) -> bool:
    """Whether :func:`mac` runs a kernel for these terms, not the twin."""
    if use_triton(a[0]):
        return all(x.dim() == 2 for x in w)
    return (a[0].device.type == "cpu" and ckks_cpu.available() and len({x.shape for x in w}) == 1
            and ckks_cpu.row_weights(a[0].shape, w[0].shape) is not None)


# ---- every giant step of a product: rows of weights against the same terms ---------------------
@triton.jit
def _mac_rows_sum(a_ptr, terms_ptr, addr_ptr, start, end, r, wr, limb, x, mask, per_reduce, q, qinv,
                  sa_k, sa_r, sa_i, sw_b, sw_i, WIDE: tl.constexpr, RB: tl.constexpr, BLOCK: tl.constexpr):
    acc = tl.zeros([RB, BLOCK], dtype=tl.int64)
    held = 0  # as in _mac_sum
    for j in range(start, end):
        if held == per_reduce:
            acc = reduce_lazy(acc, q, qinv)
            held = 1
        k = tl.load(terms_ptr + j)
        w_base = tl.load(addr_ptr + j).to(tl.pointer_type(tl.int64))
        w = tl.load(w_base + wr[:, None] * sw_b + limb * sw_i + x[None, :], mask=mask, other=0)
        a = tl.load(a_ptr + k * sa_k + r[:, None] * sa_r + limb * sa_i + x[None, :], mask=mask, other=0)
        acc += mul_lazy(a, w, q, qinv, WIDE)
        held += 1
    return acc


@triton.jit
def _mac_rows_kernel(a_ptr, offs_ptr, terms_ptr, addr_ptr, out_ptr, q_ptr, qinv_ptr, wide_ptr, per_reduce,
                     limbs, n, rows_a, tiles, per_w, sa_k, sa_r, sa_i, sw_b, sw_i, so_o, so_r, so_i,
                     RB: tl.constexpr, BLOCK: tl.constexpr):
    # program (output row o, limb, tile of RB rows of the terms) x BLOCK coefficients: the row's
    # terms are the CSR slice offs[o]..offs[o+1] of (term index, weight address), so an absent
    # weight costs nothing and each weight is read in place, once for the RB rows of a tile; the
    # tiles of one (o, limb) are neighbouring programs, which read the same weights (from L2)
    pid = tl.program_id(0).to(tl.int64)
    tile = pid % tiles
    limb = (pid // tiles) % limbs
    o = pid // (tiles * limbs)
    x = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    r = tile * RB + tl.arange(0, RB)
    mask = (r < rows_a)[:, None] & (x < n)[None, :]
    wr = r // per_w  # the weight's batch row (sw_b = 0: one weight for every row)
    q = tl.load(q_ptr + limb)
    qinv = tl.load(qinv_ptr + limb)
    start = tl.load(offs_ptr + o)
    end = tl.load(offs_ptr + o + 1)
    if tl.load(wide_ptr + limb) != 0:
        acc = _mac_rows_sum(a_ptr, terms_ptr, addr_ptr, start, end, r, wr, limb, x, mask, per_reduce, q, qinv,
                            sa_k, sa_r, sa_i, sw_b, sw_i, True, RB, BLOCK)
    else:
        acc = _mac_rows_sum(a_ptr, terms_ptr, addr_ptr, start, end, r, wr, limb, x, mask, per_reduce, q, qinv,
                            sa_k, sa_r, sa_i, sw_b, sw_i, False, RB, BLOCK)
    out = out_ptr + o * so_o + r[:, None] * so_r + limb * so_i + x[None, :]
    tl.store(out, fix(reduce_lazy(acc, q, qinv), q), mask=mask)


#: A ``_mac_rows_kernel`` tile: RB <= 2 rows of the terms (a session's c0 and c1) x BLOCK
#: coefficients, 1,024 elements in all. ptxas (CUDA 13.4, sm_90a, 4 warps): 64 registers at
#: 2 x 512, no spills, against 114 at 4 x 256 and more for taller tiles
#: (benchmarks/results/2026-12-07-mac-rows), so a batch's further rows are further tiles.
_ROWS_TILE = 1024
_MAX_RB = 2


def mac_many_layout(term: torch.Size, w: torch.Tensor) -> tuple[int, int] | None:
    """``(per_w, sw_b)`` where ``mac_many_triton`` takes weights shaped like ``w`` against terms of
    shape ``term`` ``[*lead, L, N]``: one ``[L, N]`` plaintext for every row (``sw_b`` 0); a batch's
    per-row plaintexts ``[*lead[:-1], 1, L, N]`` (contiguous: ``NativeBatch.stack_plain``), the
    weight of batch row ``b`` serving the ``per_w = lead[-1]`` rows ``b * per_w ..``; or one
    weight per row ``[R, L, N]`` against ``lead = (R,)`` (a batch's ct x ct: each row's
    polynomial, rows ``sw_b`` apart). None for anything else (the twin takes it)."""
    lead = tuple(term[:-2])
    if w.stride(-1) != 1 or w.shape[-2:] != term[-2:]:
        return None
    if w.dim() == 2:
        return 1, 0
    if lead and tuple(w.shape[:-2]) == lead[:-1] + (1,) and w.is_contiguous():
        return lead[-1], w.shape[-2] * w.shape[-1]
    if w.dim() == 3 and tuple(w.shape[:-2]) == lead:  # one per row, any stride between rows (ct x ct's c0s)
        return 1, w.stride(0)
    return None


def _shared_layout(term: torch.Size, ws) -> tuple[int, int] | None:
    """``mac_many_layout`` where every weight of ``ws`` has the first's shape, strides, int64
    and device (one pass over them: a product's giant steps hold ~300)."""
    if len(ws) == 0 or ws[0].dtype != torch.int64:
        return None
    first = (ws[0].shape, ws[0].stride(), ws[0].dtype, ws[0].device)
    if any((w.shape, w.stride(), w.dtype, w.device) != first for w in ws):
        return None
    return mac_many_layout(term, ws[0])


def rows_kernel_layout(a, ws) -> tuple[int, int] | None:
    """The layout ``mac_many_triton`` reads weights ``ws`` in against terms ``a`` (a list of
    ``[*lead, L, N]`` terms, or them stacked) where it takes them: CUDA tensors, weights of one
    layout (``mac_many_layout``); None elsewhere (the caller's other kernel or the twin). The
    dispatch hands it to the launcher, which then checks the weights no second time."""
    first = a if torch.is_tensor(a) else a[0]
    if not use_triton(first):
        return None
    return _shared_layout(a.shape[1:] if torch.is_tensor(a) else first.shape, ws)


def mac_many_triton(a: torch.Tensor, rows, basis, layout: tuple[int, int] | None = None) -> torch.Tensor:
    """``rns.mac_many`` in one launch: terms ``a`` ``[K, *lead, L, N]`` (stacked once for every
    row), ``rows`` of K weights each (``None``: the term is left out of that row; all present
    weights of one shape and strides, ``mac_many_layout``) -> ``[R, *lead, L, N]``. Each row
    reads its weights in place through a table of (term, address) pairs made once per set of
    weights (``_addresses``' cache: a product's encoded diagonals are long-lived), not stacked.
    ``layout``: ``rows_kernel_layout``'s, where the dispatch has checked the weights already.
    Same contract as ``mac_torch`` per row."""
    present = [w for row in rows for w in row if w is not None]
    check_triton_device(a, basis.q, *present[:1])  # the others share its device (the layout's check)
    terms, limbs, n = a.shape[0], a.shape[-2], a.shape[-1]
    if (a.dtype != torch.int64 or a.dim() < 3 or a.shape[-2] != len(basis) or not rows or not present
            or any(len(row) != terms for row in rows)):
        raise ValueError(f"terms {tuple(a.shape)} and {len(rows)} rows of weights do not match [K, ..., "
                         f"{len(basis)}, N] / rows of K")
    layout = layout or _shared_layout(a.shape[1:], present)
    if layout is None:
        raise ValueError(f"weights {sorted({tuple(w.shape) for w in present})} do not share one layout "
                         f"mac_many_triton reads against terms {tuple(a.shape)}")
    per_w, sw_b = layout
    a4 = _unit_last(a.reshape(terms, -1, limbs, n))
    rows_a = a4.shape[1]
    offs, idx = [0], []
    for row in rows:
        idx.extend(k for k, w in enumerate(row) if w is not None)
        offs.append(len(idx))
    table = _table(tuple(offs) + tuple(idx), a.device)
    addrs = _addresses(present, a.device)
    out = torch.empty((len(rows), rows_a, limbs, n), dtype=torch.int64, device=a.device)
    rb = min(_MAX_RB, triton.next_power_of_2(rows_a))
    block = min(triton.next_power_of_2(n), max(16, _ROWS_TILE // rb))
    tiles = triton.cdiv(rows_a, rb)
    grid = (len(rows) * limbs * tiles, triton.cdiv(n, block))
    _mac_rows_kernel[grid](
        a4, table, table[len(offs):], addrs, out, _col(basis.q), _col(basis.qinv), basis.wide_limbs,
        _per_reduce(basis), limbs, n, rows_a, tiles, per_w, a4.stride(0), a4.stride(1), a4.stride(2), sw_b,
        present[0].stride(-2), out.stride(0), out.stride(1), out.stride(2), RB=rb, BLOCK=block, **NO_FMA)
    return out.view(len(rows), *a.shape[1:])


# ---- ciphertext addition: x + y --------------------------------------------------------------
@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, q_ptr, limbs, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = x < n
    q = tl.load(q_ptr + row % limbs)
    a = tl.load(x_ptr + row * n + x, mask=mask, other=0)
    b = tl.load(y_ptr + row * n + x, mask=mask, other=0)
    tl.store(out_ptr + row * n + x, fix(a + b - q, q), mask=mask)  # Basis.add


def add_triton(x: torch.Tensor, y: torch.Tensor, basis) -> torch.Tensor:
    """``basis.add(x, y)`` (``[..., L, N]`` canonical, equal shapes) in one launch, where the
    twin takes five torch kernels: the evaluator's additions on a GPU."""
    check_triton_device(x, y, basis.q)
    if x.shape != y.shape or x.dim() < 2 or x.shape[-2] != len(basis) or x.dtype != torch.int64 \
            or y.dtype != torch.int64:
        raise ValueError(f"x {tuple(x.shape)} and y {tuple(y.shape)} do not match [..., {len(basis)}, N]")
    limbs, n = x.shape[-2:]
    xc, yc = x.contiguous(), y.contiguous()
    out = torch.empty_like(xc)
    grid, block = _grid(xc.numel() // n, n)
    if grid[0]:
        _add_kernel[grid](xc, yc, out, _col(basis.q), limbs, n, BLOCK=block, **NO_FMA)
    return out


# ---- rescale / ModDown tail: (x - r) * c (+ plus) -----------------------------------------------
@triton.jit
def _sub_mul_kernel(x_ptr, r_ptr, out_ptr, q_ptr, w_ptr, wq_ptr, w0_ptr, w0q_ptr, c_ptr, wide_ptr,
                    plus_ptr, limbs, n, sx_b, sx_i, sr_b, sr_i, so_b, so_i,
                    polys, plus_polys, plus_rows, sp_b, sp_c, sp_i,
                    PLUS: tl.constexpr, BLOCK: tl.constexpr):
    # every run of limbs in one launch: a program reads its limb's scheme (``Basis.wide_limbs``)
    b, limb, x, mask = _program_tile(limbs, n, BLOCK)
    q = tl.load(q_ptr + limb)
    y = fix(tl.load(x_ptr + b * sx_b + limb * sx_i + x, mask=mask, other=0)
            - tl.load(r_ptr + b * sr_b + limb * sr_i + x, mask=mask, other=0), q)  # Basis.sub
    w = tl.load(w_ptr + limb)
    wq = tl.load(wq_ptr + limb)
    if tl.load(wide_ptr + limb) != 0:
        p = mul_const_lazy(y, w, wq, tl.load(w0_ptr + limb), tl.load(w0q_ptr + limb),
                           tl.load(c_ptr + limb), q, True)
    else:
        p = mul_const_lazy(y, w, wq, w, wq, wq, q, False)
    out = fix(p, q)
    if PLUS:  # row b is polynomial b % polys of ciphertext b // polys (cycling over plus's rows)
        poly = b % polys
        if poly < plus_polys:
            row = (b // polys) % plus_rows
            more = tl.load(plus_ptr + row * sp_b + poly * sp_c + limb * sp_i + x, mask=mask, other=0)
            out = fix(out + more - q, q)  # Basis.add
    tl.store(out_ptr + b * so_b + limb * so_i + x, out, mask=mask)


def _check_sub_mul(x: torch.Tensor, r: torch.Tensor, const, plus) -> None:
    if x.shape != r.shape or x.dim() < 2 or x.shape[-2] != const.limbs_ or const.ndim != 2:
        raise ValueError(f"x {tuple(x.shape)}, r {tuple(r.shape)} and a per-limb constant of "
                         f"{const.limbs_} limbs ({const.ndim} dims) do not match [..., L, N]")
    if plus is not None:
        lead = plus.shape[:-3]
        if (x.dim() < 3 or plus.shape[-2:] != x.shape[-2:] or plus.shape[-3] > x.shape[-3]
                or x.shape[:-3][len(x.shape) - 3 - len(lead):] != lead):
            raise ValueError(f"plus {tuple(plus.shape)} does not match the first polynomials of "
                             f"x {tuple(x.shape)}")


def sub_mul_const_torch(x: torch.Tensor, r: torch.Tensor, const, basis, plus=None) -> torch.Tensor:
    """``(x - r) * c`` in ``[0, q)``: ``x``, ``r`` ``[..., L, N]`` canonical, ``const`` a
    ``MulConst`` ``[L, 1]`` of ``basis`` (``RnsContext.rescale_const`` / ``p_inv``). ``plus``
    (``[*rows, C, L, N]`` for ``x`` ``[..., *rows, P, L, N]``, canonical) is added to the first
    ``C`` polynomials of each ciphertext (``rns.mod_down``'s)."""
    _check_sub_mul(x, r, const, plus)
    out = const.mul(basis.sub(x, r))
    if plus is not None:
        c = plus.shape[-3]
        out[..., :c, :, :] = basis.add(out[..., :c, :, :], plus)
    return out


def sub_mul_const_triton(x: torch.Tensor, r: torch.Tensor, const, basis, plus=None) -> torch.Tensor:
    """Triton launcher; same contract as :func:`sub_mul_const_torch` (``plus`` added in the
    same pass)."""
    check_triton_device(x, r, const.q, *(() if plus is None else (plus,)))
    _check_sub_mul(x, r, const, plus)
    limbs, n = x.shape[-2:]
    x3, r3 = _unit_last(x.reshape(-1, limbs, n)), _unit_last(r.reshape(-1, limbs, n))
    out = torch.empty(x3.shape, dtype=torch.int64, device=x.device)
    if plus is None:
        p4, polys = x3, 1  # never read
    else:
        p4, polys = _unit_last(plus.reshape(-1, plus.shape[-3], limbs, n)), x.shape[-3]
    grid, block = _grid(x3.shape[0] * limbs, n)
    if grid[0]:
        _sub_mul_kernel[grid](
            x3, r3, out, _col(const.q), *map(_col, const.stacked), basis.wide_limbs, p4, limbs, n,
            x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1), out.stride(0), out.stride(1), polys,
            p4.shape[-3] if plus is not None else 0, p4.shape[0], p4.stride(0),
            p4.stride(-3) if plus is not None else 0, p4.stride(-2),
            PLUS=plus is not None, BLOCK=block, **NO_FMA)
    return out.view(x.shape)


def sub_mul_const(x: torch.Tensor, r: torch.Tensor, const, basis, plus=None) -> torch.Tensor:
    """:func:`sub_mul_const_torch`, one Triton launch on CUDA tensors."""
    return (sub_mul_const_triton if use_triton(x) else sub_mul_const_torch)(x, r, const, basis, plus)

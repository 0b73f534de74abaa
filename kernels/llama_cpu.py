"""The engine's CPU kernels (``llama_cpu.c``), built on first use by ``cbuild`` and called by ctypes.

Twins (the torch code that runs without a compiler, with ``VEIL_CPU_KERNELS=0``, or on tensors
these do not take) and why each kernel exists, from the CPU step profile (16 sequences decoding
at context 300, bf16, 2 threads: benchmarks/results/2026-11-26-cpu-fastpath):

* ``paged_attention``: decode attention over the paged cache, read in place. Twin:
  ``paged_decode_attention_torch``, which first copies every sequence's context out of the pool
  (``index_select``, 14% of the step) and then runs torch's attention on the copy (19%).
  ``prefill_attention``: the same kernel with a row per new token, each reading its sequence's
  table up to its own position (twin: ``paged_prefill_attention_torch``, a gather and torch's
  attention per sequence; 2-2.5x as long as the kernel on the chunk shapes of
  benchmarks/results/2026-11-27-cpu-engine-kernels/attention_micro.txt).
* ``add_rms_norm``, ``rope``, ``silu_and_mul``, ``store_kv``: the twins of ``rmsnorm``,
  ``rope``, ``activation`` and ``kv_store``, whose casts (kept so that the CPU path rounds where
  transformers does) and checks cost ~300 small torch calls per layer (30% of the step). Each
  kernel does the same roundings in one pass.

Built with ``-march=native`` (the loops are fp32 vector code; the cache key holds the CPU's
flags), ``-ffp-contract=off``, so the elementwise kernels round exactly as eager torch, and
``-fno-trapping-math``, without which GCC keeps ``floorf`` and compare-selects scalar (no
value changes: nothing here reads the floating-point exception flags).
Tests: ``tests/test_llama_cpu.py`` (each kernel against its twin). On CUDA tensors the Triton
kernels run instead (``ops``).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from veil.kernels import cbuild

__all__ = ["add_rms_norm", "available", "paged_attention", "prefill_attention", "rope", "silu_and_mul", "store_kv",
           "takes"]

_SOURCE = Path(__file__).with_name("llama_cpu.c")
_FLAGS = ("-O3", "-ffp-contract=off", "-fno-trapping-math")
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_MAX_GROUP = 64  # query heads per KV head (the kernel's stack array)


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = cbuild.load(_SOURCE, _FLAGS, native=True)
    return None if lib is None else _declare(lib)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.veil_paged_attention.argtypes = [p, p, i64, i64, i32, p, p, i32, p, i64, i64, p, p, i64, i64, i64, i64,
                                         i64, i64, f32]
    lib.veil_paged_attention.restype = lib.veil_store_kv.restype = i32
    lib.veil_add_rms_norm.argtypes = [p, p, p, i64, p, i64, p, i32, i32, i64, i64, f32]
    lib.veil_rope.argtypes = [p, i64, i64, i64, p, i64, i64, i64, i32, p, p, p, i64, i64]
    lib.veil_silu_and_mul.argtypes = [p, p, i64, i32, i64, i64]
    lib.veil_store_kv.argtypes = [p, p, p, i64, p, i64, p, i64, i64, i32, i64]
    for f in (lib.veil_add_rms_norm, lib.veil_rope, lib.veil_silu_and_mul):
        f.restype = None
    return lib


def available() -> bool:
    """Whether CPU tensors can take the kernels (enabled and built)."""
    return cbuild.enabled() and _library() is not None


def takes(*tensors: torch.Tensor) -> bool:
    """Whether the kernels take these tensors: CPU, fp32 or bf16, unit stride in the last
    dimension, and the library built. Anything else goes to the twin."""
    return (all(t.device.type == "cpu" and t.dtype in _DTYPES and t.stride(-1) == 1 for t in tensors)
            and available())


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x as [rows, last] with a unit last stride, and its row stride (a view where the rows are
    evenly spaced: the engine's slices of wider rows are read in place)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2, x2.stride(0)


def _attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
            row_table: torch.Tensor | None, row_len: torch.Tensor, scale: float) -> torch.Tensor:
    """``veil_paged_attention``: row t of q [T, Hq, D] attends positions [0, row_len[t]) of
    table row ``row_table[t]`` (t when None); int32 tables are read in place, lengths are checked
    in C."""
    rows, hq, d = q.shape
    blocks, bs, hkv, _ = k_cache.shape
    if hq % hkv or hq // hkv > _MAX_GROUP:
        raise ValueError(f"{hq} query heads over {hkv} KV heads")
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    tables = block_tables if block_tables.dtype == torch.int32 and block_tables.stride(1) == 1 \
        else block_tables.to(torch.int32).contiguous()
    out = torch.empty((rows, hq, d), dtype=q.dtype)
    status = _library().veil_paged_attention(
        out.data_ptr(), q.data_ptr(), q.stride(0), q.stride(1), _DTYPES[q.dtype], k_cache.data_ptr(),
        v_cache.data_ptr(), _DTYPES[k_cache.dtype], tables.data_ptr(), tables.stride(0), tables.shape[1],
        None if row_table is None else row_table.data_ptr(), row_len.data_ptr(), rows, hq, hkv, d, bs, blocks, scale)
    if status == 2:
        raise ValueError("a context length outside its block table")
    if status:
        raise ValueError("a block table entry within a context names no cache block")
    return out


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """``paged_decode_attention_torch``'s contract: q [B, Hq, D], caches [blocks, bs, Hkv, D],
    block_tables [B, W] int, context_lens [B] int -> [B, Hq, D] in q's dtype. The engine's
    tables (an int32 column slice of its block-table buffer) and lengths are read without a
    copy: this runs once per layer, where per-call copies and host checks showed."""
    lens = context_lens if context_lens.dtype == torch.int32 and context_lens.is_contiguous() \
        else context_lens.to(torch.int32).contiguous()
    return _attend(q, k_cache, v_cache, block_tables, None, lens, scale)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                      cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """``paged_prefill_attention_torch``'s contract: the packed new tokens of B sequences
    (rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``), new token i of sequence b at position
    ``context_lens[b] - q_len + i``, attending to the positions up to its own: the decode
    kernel with one row per new token, row t reading its sequence's table up to its own length."""
    total = q.shape[0]
    cu, ctx = cu_seqlens_q.to(torch.int64), context_lens.to(torch.int64)
    q_lens = cu[1:] - cu[:-1]
    if int(cu[-1]) != total or bool((q_lens < 0).any()) or bool((q_lens > ctx).any()):
        raise ValueError("cu_seqlens_q must split the rows into chunks no longer than their contexts")
    seq = torch.repeat_interleave(torch.arange(len(q_lens)), q_lens, output_size=total)
    lens = ctx[seq] - q_lens[seq] + torch.arange(total) - cu[:-1][seq] + 1
    return _attend(q, k_cache, v_cache, block_tables, seq.to(torch.int32), lens.to(torch.int32), scale)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_rms_norm_torch``'s contract (residual in x's dtype, weight [hidden])."""
    hidden = x.shape[-1]
    if weight.shape != (hidden,) or (residual is not None and residual.shape != x.shape):
        raise ValueError(f"weight {tuple(weight.shape)} / residual shapes do not fit x {tuple(x.shape)}")
    x2, x_st = _rows(x)
    r2, r_st = _rows(residual) if residual is not None else (None, 0)
    normed = torch.empty(x2.shape, dtype=x.dtype)
    new_res = torch.empty_like(normed) if residual is not None else None
    weight = weight.contiguous()  # held: a temporary's memory would be freed before the call reads it
    _library().veil_add_rms_norm(normed.data_ptr(), None if new_res is None else new_res.data_ptr(), x2.data_ptr(),
                                 x_st, None if r2 is None else r2.data_ptr(), r_st, weight.data_ptr(),
                                 _DTYPES[weight.dtype], _DTYPES[x.dtype], x2.shape[0], hidden, eps)
    return normed.view(x.shape), (x if new_res is None else new_res.view(x.shape))


def rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """``apply_rope_torch``'s contract: q [T, Hq, D], k [T, Hkv, D] rotated in place."""
    n, hq, d = q.shape
    if cos.dtype != torch.float32 or sin.dtype != torch.float32 or cos.shape != sin.shape:
        raise ValueError("cos and sin must be fp32 [max_positions, D/2]")
    pos = positions.to(torch.int64).contiguous()
    if n and (int(pos.min()) < 0 or int(pos.max()) >= cos.shape[0]):
        raise ValueError(f"a position outside the RoPE tables' {cos.shape[0]}")
    cos, sin = cos.contiguous(), sin.contiguous()  # held for the call
    _library().veil_rope(q.data_ptr(), q.stride(0), q.stride(1), hq, k.data_ptr(), k.stride(0), k.stride(1),
                         k.shape[1], _DTYPES[q.dtype], pos.data_ptr(), cos.data_ptr(), sin.data_ptr(), n, d)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu_and_mul_torch``'s contract: x [..., 2I] -> [..., I]."""
    if x.shape[-1] % 2:
        raise ValueError(f"gate and up halves of equal width, got {x.shape[-1]}")
    inter = x.shape[-1] // 2
    x2, x_st = _rows(x)
    out = torch.empty((x2.shape[0], inter), dtype=x.dtype)
    _library().veil_silu_and_mul(out.data_ptr(), x2.data_ptr(), x_st, _DTYPES[x.dtype], x2.shape[0], inter)
    return out.view(*x.shape[:-1], inter)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """``store_kv_torch``'s contract for k, v [T, Hkv, D] in the caches' dtype, heads contiguous
    (the engine's slices of the qkv rows): rows copied into slots >= 0 of the caches."""
    rows, hkv, d = k.shape
    if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype or k.dtype != v.dtype:
        raise ValueError("k, v and the caches must share one dtype")
    if any(t.stride(1) != d or t.stride(2) != 1 for t in (k, v)):
        raise ValueError("k and v need contiguous heads")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the caches must be contiguous")
    slots = slot_mapping.to(torch.int64).contiguous()
    bad = _library().veil_store_kv(k_cache.data_ptr(), v_cache.data_ptr(), k.data_ptr(), k.stride(0), v.data_ptr(),
                                   v.stride(0), slots.data_ptr(), rows, hkv * d * k.element_size(),
                                   k.element_size(), k_cache.shape[0] * k_cache.shape[1])
    if bad:
        raise ValueError(f"{bad} slots past the cache's {k_cache.shape[0] * k_cache.shape[1]}")

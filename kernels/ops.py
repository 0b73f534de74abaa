"""Public kernel API: each op runs its Triton kernel on CUDA tensors, its C kernel
(``llama_cpu``, where a C compiler built it) on fp32/bf16 CPU tensors, and its torch twin
otherwise (``VEIL_CPU_KERNELS=0`` keeps the twins on the CPU).

``force_triton=True`` runs the Triton kernel whatever the device; on CPU tensors that needs
``TRITON_INTERPRET=1`` set before ``veil.kernels`` is imported (the tests do this). The choice
is made per call from the tensors, so there is no global device state.

Tensor layouts (T = tokens, B = sequences, Hq / Hkv = query / KV heads, D = head_dim):

* hidden states ``[..., hidden]``; MLP gate+up ``[..., 2*I]``
* q ``[T, Hq, D]``, k/v ``[T, Hkv, D]`` (ragged batches packed along T, delimited by
  ``cu_seqlens_q [B + 1]``); decode q ``[B, Hq, D]``
* KV cache ``[num_blocks, block_size, Hkv, D]`` (one pair per layer)
* RoPE tables cos, sin ``[max_positions, D/2]`` fp32 (from :func:`build_rope_cache`)
"""

from __future__ import annotations

import functools

import torch

from veil.kernels import llama_cpu
from veil.kernels.activation import silu_and_mul_torch, silu_and_mul_triton
from veil.kernels.kv_store import _check_store_args, store_kv_torch, store_kv_triton
from veil.kernels.paged_attention import (
    DEFAULT_PARTITION_SIZE,
    _check_decode_args,
    paged_decode_attention_torch,
    paged_decode_attention_triton,
)
from veil.kernels.prefill_attention import (
    _check_prefill_args,
    paged_prefill_attention_torch,
    paged_prefill_attention_triton,
)
from veil.kernels.rmsnorm import add_rms_norm_torch, add_rms_norm_triton
from veil.kernels.rope import (
    _check_rope_args,
    apply_rope_torch,
    apply_rope_triton,
    build_rope_cache,
)

__all__ = [
    "DEFAULT_PARTITION_SIZE",
    "add_rms_norm",
    "apply_rope",
    "bf16_is_fast",
    "bf16_is_fast_on_cpu",
    "build_rope_cache",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "silu_and_mul",
    "store_kv",
]


def _use_triton(t: torch.Tensor, force_triton: bool) -> bool:
    return force_triton or t.is_cuda


def _use_c(*tensors: torch.Tensor) -> bool:
    """CPU tensors of one activation dtype that the C kernels take (``llama_cpu.takes``)."""
    return all(t.dtype == tensors[0].dtype for t in tensors) and llama_cpu.takes(*tensors)


@functools.cache
def bf16_is_fast(device: str = "cpu") -> bool:
    """Whether bf16 attention (and the bf16 KV cache it reads) is at least as fast as fp32 on
    ``device``: on CUDA; on CPUs with AMX-BF16 (oneDNN's tile units, torch's own attention
    included); and on CPUs with AVX512-BF16 where the engine's C kernels run, whose attention
    takes q·k as bf16 pairs (``vdpbf16ps``). Measured: the 2-core Xeon with AMX, the attention of
    16 decode rows at context 304 0.33 ms against 0.58 ms in fp32; the 2-core EPYC with
    AVX512-BF16 and no AMX, bf16 weights served 1.28x faster with a bf16 cache than with an fp32
    one (benchmarks/results/2026-12-02-epyc-fastpath), while torch's bf16 attention there, the
    twins' (``VEIL_CPU_KERNELS=0``), was several times slower than fp32."""
    if torch.device(device).type == "cuda":
        return True
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return bf16_is_fast_on_cpu(flags, llama_cpu.available())


def bf16_is_fast_on_cpu(flags, c_kernels: bool) -> bool:
    """``bf16_is_fast`` for a CPU with these /proc/cpuinfo ``flags``, with or without the C kernels."""
    return "amx_bf16" in flags or ("avx512_bf16" in flags and c_kernels)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    force_triton: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``new_residual = x + residual; normed = rms_norm(new_residual) * weight``.

    x, residual: [..., hidden] (residual None -> plain RMSNorm and new_residual is x);
    weight: [hidden]. Returns (normed, new_residual) in x's dtype; fp32 math inside.
    """
    if _use_triton(x, force_triton):
        return add_rms_norm_triton(x, residual, weight, eps)
    if _use_c(x, *(() if residual is None else (residual,))) and llama_cpu.takes(weight):
        return llama_cpu.add_rms_norm(x, residual, weight, eps)
    return add_rms_norm_torch(x, residual, weight, eps)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, force_triton: bool = False
) -> torch.Tensor:
    """Plain RMSNorm (e.g. the final norm): [..., hidden] -> [..., hidden]."""
    return add_rms_norm(x, None, weight, eps, force_triton=force_triton)[0]


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    force_triton: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] **in place** (HF rotate_half convention).

    positions: [T] int; cos, sin: [max_positions, D/2]. Returns (q, k) for chaining.
    """
    if _use_triton(q, force_triton):
        apply_rope_triton(q, k, positions, cos, sin)
    elif _use_c(q, k):
        _check_rope_args(q, k, positions, cos, sin)
        llama_cpu.rope(q, k, positions, cos, sin)
    else:
        apply_rope_torch(q, k, positions, cos, sin)
    return q, k


def silu_and_mul(x: torch.Tensor, *, force_triton: bool = False) -> torch.Tensor:
    """SwiGLU activation: x [..., 2*I] (gate then up) -> [..., I] = silu(gate) * up."""
    if _use_triton(x, force_triton):
        return silu_and_mul_triton(x)
    if _use_c(x):
        return llama_cpu.silu_and_mul(x)
    return silu_and_mul_torch(x)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    force_triton: bool = False,
) -> None:
    """Write k, v [T, Hkv, D] into the paged caches [num_blocks, block_size, Hkv, D] in place.

    slot_mapping: [T] int, slot = block_id * block_size + offset; -1 skips the token.
    """
    if _use_triton(k, force_triton):
        store_kv_triton(k, v, k_cache, v_cache, slot_mapping)
        return
    _check_store_args(k, v, k_cache, v_cache, slot_mapping)
    if (_use_c(k, v, k_cache, v_cache) and k_cache.is_contiguous() and v_cache.is_contiguous()
            and all(t.stride(1) == t.shape[2] for t in (k, v))):
        llama_cpu.store_kv(k, v, k_cache, v_cache, slot_mapping)
    else:
        store_kv_torch(k, v, k_cache, v_cache, slot_mapping)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    partition_size: int = DEFAULT_PARTITION_SIZE,
    max_context_len: int | None = None,
    force_triton: bool = False,
) -> torch.Tensor:
    """Decode attention of one new token per sequence over its paged KV cache (GQA).

    q: [B, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D];
    block_tables: [B, max_blocks_per_seq] int32; context_lens: [B] int32, cached tokens
    including the current one (already stored with store_kv). Returns [B, Hq, D].
    partition_size / max_context_len only affect the Triton path (split-KV grid).
    """
    if _use_triton(q, force_triton):
        return paged_decode_attention_triton(
            q,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            scale,
            partition_size=partition_size,
            max_context_len=max_context_len,
        )
    if _use_c(k_cache, v_cache) and llama_cpu.takes(q):
        _check_decode_args(q, k_cache, v_cache, block_tables, context_lens)
        return llama_cpu.paged_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
    return paged_decode_attention_torch(q, k_cache, v_cache, block_tables, context_lens, scale)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    max_seqlen_q: int | None = None,
    force_triton: bool = False,
) -> torch.Tensor:
    """Causal attention of packed new tokens over their sequences' paged KV cache (GQA).

    q: [T, Hq, D], sequence b's new tokens at rows cu_seqlens_q[b]:cu_seqlens_q[b+1];
    caches: [num_blocks, block_size, Hkv, D], the new tokens' K/V already stored;
    block_tables: [B, max_blocks_per_seq] int32; cu_seqlens_q: [B + 1] int32;
    context_lens: [B] int32, all cached tokens per sequence including the new ones (so a
    chunk with a cached prefix, or a decode token, works). Returns [T, Hq, D].
    max_seqlen_q (the longest chunk) only sizes the Triton grid; pass it to avoid a sync.
    """
    if _use_triton(q, force_triton):
        return paged_prefill_attention_triton(
            q,
            k_cache,
            v_cache,
            block_tables,
            cu_seqlens_q,
            context_lens,
            scale,
            max_seqlen_q=max_seqlen_q,
        )
    if _use_c(k_cache, v_cache) and llama_cpu.takes(q):
        _check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
        return llama_cpu.prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)
    return paged_prefill_attention_torch(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale
    )

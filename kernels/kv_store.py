"""Write new keys/values into the paged KV cache.

Cache layout (per layer): ``k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]``.
A token's slot is ``block_id * block_size + offset``; the scheduler computes one slot per new
token (``slot_mapping``), and ``-1`` marks a token whose KV must not be stored (padding of a
CUDA-graph batch, or a prefix already cached and shared).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from veil.kernels._utils import check_triton_device, next_pow2


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    num_kv_heads,
    head_dim,
    block_size,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per token copies all of its KV heads.
    t = tl.program_id(0).to(tl.int64)
    # int64: block_id * stride overflows int32 for caches over 2 GiB.
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    block_id = slot // block_size
    offset = slot % block_size
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_kv_heads) & (d < head_dim)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    kc = k_cache_ptr + block_id * stride_kc_block + offset * stride_kc_slot + h * stride_kc_head + d
    vc = v_cache_ptr + block_id * stride_vc_block + offset * stride_vc_slot + h * stride_vc_head + d
    tl.store(kc, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _check_store_args(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError("k and v must both be [tokens, kv_heads, head_dim]")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [blocks, block_size, kv_heads, head_dim]"
        )
    if k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"cache heads/dim {tuple(k_cache.shape[2:])} != {tuple(k.shape[1:])}")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError("slot_mapping must be [tokens]")


def store_kv_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton launcher; same contract as :func:`store_kv_torch`."""
    _check_store_args(k, v, k_cache, v_cache, slot_mapping)
    check_triton_device(k, v, k_cache, v_cache, slot_mapping)
    if k.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("head_dim must be the contiguous dimension of k, v and the caches")
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        num_kv_heads,
        head_dim,
        k_cache.shape[1],
        BLOCK_H=next_pow2(num_kv_heads),
        BLOCK_D=next_pow2(head_dim),
    )


def store_kv_torch(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Reference twin: ``cache[slot // bs, slot % bs] = kv[t]`` for every slot >= 0.

    k, v: [T, Hkv, D]; caches: [num_blocks, block_size, Hkv, D]; slot_mapping: [T] int.
    """
    _check_store_args(k, v, k_cache, v_cache, slot_mapping)
    slots = slot_mapping.long()
    if bool((slots < 0).any()):
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]
    # A slot indexes the cache viewed as [num_blocks * block_size, Hkv, D]: one row copy each.
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))

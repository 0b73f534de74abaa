"""Paged decode attention with grouped-query attention (GQA), split-KV ("flash-decoding").

Decode has one query token per sequence, so a grid over (sequence, head) alone leaves most of
the GPU idle when the batch is small and the context long. The context is therefore split into
partitions of ``partition_size`` tokens:

1. ``_paged_decode_partition_kernel``: grid (sequence, kv_head, partition). Each program
   attends all the query heads that share one KV head (GQA: K/V are read once per group) to
   its partition's tokens with an online softmax, and writes a normalised partial output plus
   the partition's log-sum-exp of scores.
2. ``_merge_partitions_kernel``: grid (sequence, query head). Combines the partitions:
   ``out = sum_p exp(lse_p - lse) * out_p`` with ``lse = logsumexp_p(lse_p)``.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]``; ``block_tables[b, i]`` is
the physical block holding tokens ``[i*block_size, (i+1)*block_size)`` of sequence ``b``.
Query head ``h`` reads KV head ``h // (num_q_heads // num_kv_heads)`` (HF's repeat_kv order).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from veil.kernels._utils import (
    attention_dot_config,
    check_triton_device,
    load_paged_tile,
    next_pow2,
    online_softmax_step,
)

DEFAULT_PARTITION_SIZE = 256


@triton.jit
def _paged_decode_partition_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    part_out_ptr,
    part_lse_ptr,
    scale,
    stride_qb,
    stride_qh,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_op,
    stride_lb,
    stride_lh,
    head_dim,
    block_size,
    QUERIES_PER_KV: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr,
    PARTITION_SIZE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    ctx_len = tl.load(context_lens_ptr + seq)
    start = part * PARTITION_SIZE
    # The grid is sized for the longest possible context (no host sync on context_lens), so
    # most sequences own fewer partitions than the grid has: those programs have nothing to do.
    if start >= ctx_len:
        return
    end = tl.minimum(start + PARTITION_SIZE, ctx_len)

    # Rows of the tile = the query heads of this KV head's group, padded to BLOCK_G (>= 16, the
    # smallest tensor-core MMA tile) and masked; padding rows compute values never stored.
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < QUERIES_PER_KV
    d_mask = d < head_dim
    heads = kv_head * QUERIES_PER_KV + g
    q = tl.load(
        q_ptr + seq.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)  # running max of scores
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)  # running sum of exp(score - m_i)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)  # running sum of p * V
    n = tl.arange(0, TILE_N)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile_start in range(start, end, TILE_N):
        tok = tile_start + n
        tok_mask = tok < end
        # Look the block up per token: tiles need not align with cache blocks, so any
        # block_size works (and one tile may span several small blocks).
        block_ids = tl.load(bt_row + tok // block_size, mask=tok_mask, other=0).to(tl.int64)
        offsets = tok % block_size
        kv_mask = tok_mask[:, None] & d_mask[None, :]
        k = load_paged_tile(k_cache_ptr, block_ids, offsets, kv_head, stride_kc_block, stride_kc_slot,
                            stride_kc_head, d, kv_mask, DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale  # [BLOCK_G, TILE_N]
        s = tl.where(tok_mask[None, :], s, float("-inf"))
        # Every tile holds at least one valid token (tile_start < end), so the max stays finite.
        v = load_paged_tile(v_cache_ptr, block_ids, offsets, kv_head, stride_vc_block, stride_vc_slot,
                            stride_vc_head, d, kv_mask, DOT_DTYPE)
        m_i, l_i, acc = online_softmax_step(s, m_i, l_i, acc, v, DOT_DTYPE, INPUT_PRECISION)

    out = acc / l_i[:, None]
    lse = m_i + tl.log(l_i)
    out_ptrs = (
        part_out_ptr
        + seq.to(tl.int64) * stride_ob
        + heads[:, None] * stride_oh
        + part * stride_op
        + d[None, :]
    )
    tl.store(out_ptrs, out, mask=g_mask[:, None] & d_mask[None, :])
    lse_ptrs = part_lse_ptr + seq.to(tl.int64) * stride_lb + heads * stride_lh + part
    tl.store(lse_ptrs, lse, mask=g_mask)


@triton.jit
def _merge_partitions_kernel(
    part_out_ptr,
    part_lse_ptr,
    context_lens_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    stride_op,
    stride_lb,
    stride_lh,
    stride_out_b,
    stride_out_h,
    head_dim,
    PARTITION_SIZE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    ctx_len = tl.load(context_lens_ptr + seq)
    # Only the partitions this sequence actually has were written; the rest are garbage.
    num_parts = tl.cdiv(ctx_len, PARTITION_SIZE)
    p = tl.arange(0, BLOCK_P)
    d = tl.arange(0, BLOCK_D)
    p_mask = p < num_parts
    d_mask = d < head_dim
    base_lse = part_lse_ptr + seq.to(tl.int64) * stride_lb + head * stride_lh
    lse = tl.load(base_lse + p, mask=p_mask, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    # An empty sequence (context_len 0, e.g. batch padding) has no partition at all: keep the
    # arithmetic finite so its output is 0 rather than NaN.
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    w = tl.exp(lse - lse_max)
    denom = tl.sum(w, axis=0)
    denom = tl.where(denom == 0.0, 1.0, denom)
    base_out = part_out_ptr + seq.to(tl.int64) * stride_ob + head * stride_oh
    parts = tl.load(
        base_out + p[:, None] * stride_op + d[None, :],
        mask=p_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    out = tl.sum(parts * w[:, None], axis=0) / denom
    tl.store(
        out_ptr + seq.to(tl.int64) * stride_out_b + head * stride_out_h + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def _check_decode_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    if q.dim() != 3:
        raise ValueError("q must be [batch, num_q_heads, head_dim]")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [blocks, block_size, kv_heads, head_dim]"
        )
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"cache head_dim {k_cache.shape[3]} != q head_dim {head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads not a multiple of {num_kv_heads} KV heads")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError("block_tables must be [batch, max_blocks_per_seq]")
    if context_lens.shape != (batch,):
        raise ValueError("context_lens must be [batch]")


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    partition_size: int = DEFAULT_PARTITION_SIZE,
    max_context_len: int | None = None,
    tile_n: int | None = None,
) -> torch.Tensor:
    """Triton launcher; same contract as :func:`paged_decode_attention_torch`.

    partition_size: tokens per split-KV partition, a power of two >= 16.
    tile_n: K/V tokens per inner step, a power of two >= 16 dividing partition_size
    (default min(64, partition_size)).
    max_context_len: an upper bound on context_lens that sizes the grid; by default the
    capacity of block_tables, which needs no device->host sync (CUDA-graph friendly).
    """
    _check_decode_args(q, k_cache, v_cache, block_tables, context_lens)
    check_triton_device(q, k_cache, v_cache, block_tables, context_lens)
    if partition_size < 16 or partition_size & (partition_size - 1):
        raise ValueError(f"partition_size must be a power of two >= 16, got {partition_size}")
    tile_n = min(64, partition_size) if tile_n is None else tile_n
    if tile_n < 16 or tile_n & (tile_n - 1) or tile_n > partition_size:
        raise ValueError(f"tile_n must be a power of two in [16, partition_size], got {tile_n}")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("head_dim must be the contiguous dimension of q and the caches")
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    batch, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    queries_per_kv = num_q_heads // num_kv_heads
    out = torch.empty_like(q)
    if batch == 0:
        return out
    if max_context_len is None:
        max_context_len = block_tables.shape[1] * block_size
    num_partitions = max(triton.cdiv(max_context_len, partition_size), 1)
    # Partial results in fp32: the merge reweights them, so rounding them to half precision
    # first would add a second rounding error per partition.
    part_out = torch.empty(
        (batch, num_q_heads, num_partitions, head_dim), dtype=torch.float32, device=q.device
    )
    part_lse = torch.empty(
        (batch, num_q_heads, num_partitions), dtype=torch.float32, device=q.device
    )
    dot_dtype, input_precision = attention_dot_config(q.dtype)
    _paged_decode_partition_kernel[(batch, num_kv_heads, num_partitions)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        part_out,
        part_lse,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        head_dim,
        block_size,
        QUERIES_PER_KV=queries_per_kv,
        BLOCK_G=max(16, next_pow2(queries_per_kv)),
        BLOCK_D=max(16, next_pow2(head_dim)),
        TILE_N=tile_n,
        PARTITION_SIZE=partition_size,
        DOT_DTYPE=dot_dtype,
        INPUT_PRECISION=input_precision,
    )
    _merge_partitions_kernel[(batch, num_q_heads)](
        part_out,
        part_lse,
        context_lens,
        out,
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        out.stride(0),
        out.stride(1),
        head_dim,
        PARTITION_SIZE=partition_size,
        BLOCK_P=next_pow2(num_partitions),
        BLOCK_D=next_pow2(head_dim),
    )
    return out


@functools.lru_cache(maxsize=64)
def _length_groups(context_lens: tuple[int, ...], block_size: int,
                   call_cost_blocks: int = 24) -> tuple[tuple[int, ...], ...]:
    """Split a decode batch into groups of similar context length.

    The CPU twin gathers every sequence's KV up to the longest table of its group and attends
    over that padded width, so one long sequence makes a whole batch pay for its length. A
    dynamic programme over the sequences sorted by length minimises the padded work
    (sequences × blocks of the group's longest) plus a fixed cost per extra group (one more
    gather and attention call, worth about `call_cost_blocks` blocks of work on this CPU).
    Cached (every layer of an engine step asks again with the same lengths), hence tuples.
    """
    order = sorted(range(len(context_lens)), key=lambda i: context_lens[i])
    blocks = [max(1, -(-context_lens[i] // block_size)) for i in order]
    n = len(order)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            cost = best[i] + (j - i) * blocks[j - 1] + call_cost_blocks
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(tuple(order[cut[j]:j]))
        j = cut[j]
    return tuple(groups)


def paged_decode_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Reference twin (batched, vectorised; the engine's CPU path).

    q: [B, Hq, D], one new token per sequence; k_cache, v_cache: [num_blocks, block_size,
    Hkv, D]; block_tables: [B, max_blocks_per_seq] int; context_lens: [B] int, the number of
    cached tokens including the current one (already stored). Entries of block_tables past a
    sequence's last block may hold anything. Returns [B, Hq, D] in q's dtype; a sequence
    with context_len 0 gets zeros. Sequences of very different lengths are attended in
    separate groups (`_length_groups`), each padded only to its own longest.
    """
    _check_decode_args(q, k_cache, v_cache, block_tables, context_lens)
    lens = context_lens.tolist()
    groups = _length_groups(tuple(lens), k_cache.shape[1]) if len(lens) > 1 else [list(range(len(lens)))]
    if len(groups) == 1:
        return _decode_group(q, k_cache, v_cache, block_tables, context_lens, scale)
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    for g in groups:
        idx = torch.tensor(g, device=q.device)
        width = max(1, -(-max(lens[i] for i in g) // block_size))
        out[idx] = _decode_group(q[idx], k_cache, v_cache, block_tables[idx, :width], context_lens[idx], scale)
    return out


def _gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """cache [num_blocks, block_size, Hkv, D] rows `blocks` -> [len(blocks), block_size * Hkv * D]."""
    return cache.reshape(cache.shape[0], -1).index_select(0, blocks)


def _decode_group(q, k_cache, v_cache, block_tables, context_lens, scale) -> torch.Tensor:
    batch, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    # Unused table entries may be garbage: clamp them to a valid index; they are masked below.
    tables = block_tables.long().clamp(0, num_blocks - 1)
    max_tokens = tables.shape[1] * block_size
    # One gather per cache (index_select: a block copy per table entry, several times faster
    # than advanced indexing on CPU), then torch's fused attention in the cache's dtype (the
    # engine keeps a bf16 cache only where bf16 attention is fast: ops.bf16_is_fast):
    # [B * max_blocks, block_size, Hkv, D] -> [B, Hkv, N, D]
    # The gather runs on 2-D views [num_blocks, block elements]: on the AMD CPU torch's fp32
    # index_select of the 4-D pool took a path several times slower than the row copy.
    flat = tables.flatten()
    k = _gather_blocks(k_cache, flat).view(batch, max_tokens, num_kv_heads, head_dim).transpose(1, 2)
    v = _gather_blocks(v_cache, flat).view(batch, max_tokens, num_kv_heads, head_dim).transpose(1, 2)
    valid = torch.arange(max_tokens, device=q.device)[None, :] < context_lens.long()[:, None]  # [B, N]
    out = F.scaled_dot_product_attention(
        q.to(k.dtype).view(batch, num_q_heads, 1, head_dim), k, v, attn_mask=valid[:, None, None, :], scale=scale,
        enable_gqa=num_q_heads != num_kv_heads,
    ).view(batch, num_q_heads, head_dim)
    # A sequence with context_len 0 has nothing to attend to: define its output as 0.
    out = torch.where(valid.any(dim=-1)[:, None, None], out, torch.zeros_like(out))
    return out.to(q.dtype)

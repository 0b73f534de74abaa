"""Paged causal attention for prefill chunks (and mixed prefill/decode batches), with GQA.

The batch is ragged: the new tokens of ``B`` sequences are packed along one axis,
``q: [T, Hq, D]``, sequence ``b`` owning rows ``cu_seqlens_q[b] : cu_seqlens_q[b + 1]``.
Their keys/values have already been written to the paged cache (``store_kv``), after
the sequence's earlier tokens, so ``context_lens[b]`` counts all of them. New token ``i`` of
sequence ``b`` sits at position ``context_lens[b] - q_len_b + i`` and attends to every cached
position up to and including its own. This covers a whole prompt (no prefix), a chunk of a
long prompt or a shared prefix (earlier tokens cached), and decode (``q_len = 1``), so one
launch serves a batch that mixes all three.

Kernel grid: (sequence, query tile, kv_head). A program takes ``BLOCK_M`` query tokens times
the query heads sharing one KV head (GQA), folded into the rows of one tile so K/V are read
once per group, and streams K/V tiles with an online softmax (flash attention), stopping at
the causal frontier of its last query token.
"""

from __future__ import annotations

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
from veil.kernels.paged_attention import _gather_blocks


@triton.jit
def _paged_prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    cu_seqlens_q_ptr,
    context_lens_ptr,
    out_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    stride_bt,
    stride_ot,
    stride_oh,
    head_dim,
    block_size,
    QUERIES_PER_KV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    m_tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    tile_start = m_tile * BLOCK_M
    # The grid is sized for the longest chunk of the batch; shorter ones skip surplus tiles.
    if tile_start >= q_len:
        return
    ctx_len = tl.load(context_lens_ptr + seq)
    prefix_len = ctx_len - q_len  # tokens cached before this chunk

    # Row r of the tile = (query token tile_start + r // BLOCK_G, group member r % BLOCK_G).
    r = tl.arange(0, BLOCK_M * BLOCK_G)
    tok = tile_start + r // BLOCK_G
    g = r % BLOCK_G
    row_mask = (tok < q_len) & (g < QUERIES_PER_KV)
    heads = kv_head * QUERIES_PER_KV + g
    d = tl.arange(0, BLOCK_D)
    d_mask = d < head_dim
    rows = (q_start + tok).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(DOT_DTYPE)
    q_pos = prefix_len + tok

    m_i = tl.full([BLOCK_M * BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M * BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], dtype=tl.float32)
    n = tl.arange(0, TILE_N)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # Causal frontier: no query of this tile sees past its last token's position.
    kv_end = tl.minimum(prefix_len + tile_start + BLOCK_M, ctx_len)
    for kv_start in range(0, kv_end, TILE_N):
        kv_pos = kv_start + n
        kv_valid = kv_pos < kv_end
        block_ids = tl.load(bt_row + kv_pos // block_size, mask=kv_valid, other=0).to(tl.int64)
        offsets = kv_pos % block_size
        kv_mask = kv_valid[:, None] & d_mask[None, :]
        k = load_paged_tile(k_cache_ptr, block_ids, offsets, kv_head, stride_kc_block, stride_kc_slot,
                            stride_kc_head, d, kv_mask, DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale
        # Every row, padding rows included, has q_pos >= 0, so position 0 (in the first
        # tile) is visible to it: the running max is finite from the first tile on.
        visible = kv_valid[None, :] & (kv_pos[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        v = load_paged_tile(v_cache_ptr, block_ids, offsets, kv_head, stride_vc_block, stride_vc_slot,
                            stride_vc_head, d, kv_mask, DOT_DTYPE)
        m_i, l_i, acc = online_softmax_step(s, m_i, l_i, acc, v, DOT_DTYPE, INPUT_PRECISION)

    out = acc / l_i[:, None]
    tl.store(
        out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & d_mask[None, :],
    )


def _check_prefill_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
) -> None:
    if q.dim() != 3:
        raise ValueError("q must be [tokens, num_q_heads, head_dim]")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [blocks, block_size, kv_heads, head_dim]"
        )
    if k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"cache head_dim {k_cache.shape[3]} != q head_dim {q.shape[2]}")
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"{q.shape[1]} query heads not a multiple of {k_cache.shape[2]}")
    batch = context_lens.shape[0]
    if context_lens.dim() != 1 or cu_seqlens_q.shape != (batch + 1,):
        raise ValueError("need context_lens [B] and cu_seqlens_q [B + 1]")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError("block_tables must be [B, max_blocks_per_seq]")


def paged_prefill_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_seqlen_q: int | None = None,
    tile_n: int = 32,
) -> torch.Tensor:
    """Triton launcher; same contract as :func:`paged_prefill_attention_torch`.

    max_seqlen_q: the longest chunk in the batch (sizes the grid); computed from cu_seqlens_q
    (one device->host sync) when not given. tile_n: K/V tokens per inner step (power of 2).
    """
    _check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    check_triton_device(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("head_dim must be the contiguous dimension of q and the caches")
    if tile_n < 16 or tile_n & (tile_n - 1):
        raise ValueError(f"tile_n must be a power of two >= 16, got {tile_n}")
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    num_tokens, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    queries_per_kv = num_q_heads // num_kv_heads
    batch = context_lens.shape[0]
    out = torch.empty_like(q)
    if num_tokens == 0 or batch == 0:
        return out
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item())
    block_g = next_pow2(queries_per_kv)
    # 64 rows (tokens x group) per tile whatever the group size: >= 16, tl.dot's minimum.
    block_m = max(64 // block_g, 1)
    dot_dtype, input_precision = attention_dot_config(q.dtype)
    grid = (batch, triton.cdiv(max_seqlen_q, block_m), num_kv_heads)
    _paged_prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        out,
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
        out.stride(0),
        out.stride(1),
        head_dim,
        block_size,
        QUERIES_PER_KV=queries_per_kv,
        BLOCK_M=block_m,
        BLOCK_G=block_g,
        BLOCK_D=max(16, next_pow2(head_dim)),
        TILE_N=tile_n,
        DOT_DTYPE=dot_dtype,
        INPUT_PRECISION=input_precision,
    )
    return out


def paged_prefill_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Reference twin (one sequence at a time; the engine's CPU path).

    q: [T, Hq, D], the new tokens of B sequences packed in order; k_cache, v_cache:
    [num_blocks, block_size, Hkv, D], already holding the new tokens' K/V;
    block_tables: [B, max_blocks_per_seq] int; cu_seqlens_q: [B + 1] int (0, then cumulative
    new-token counts); context_lens: [B] int, all cached tokens of each sequence including the
    new ones (>= its new-token count). Returns [T, Hq, D] in q's dtype.
    """
    _check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    num_q_heads = q.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros_like(q)
    bounds = cu_seqlens_q.tolist()
    for b, ctx_len in enumerate(context_lens.tolist()):
        start, end = bounds[b], bounds[b + 1]
        q_len = end - start
        if q_len == 0:
            continue
        blocks = block_tables[b, : -(-ctx_len // block_size)].long()
        # attention in the cache's dtype (bf16 only where it is fast: ops.bf16_is_fast)
        k = _gather_blocks(k_cache, blocks).view(-1, num_kv_heads, k_cache.shape[3])[:ctx_len].transpose(0, 1)
        v = _gather_blocks(v_cache, blocks).view(-1, num_kv_heads, v_cache.shape[3])[:ctx_len].transpose(0, 1)
        # New token i sits at position ctx_len - q_len + i and sees positions up to its own.
        q_pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
        visible = torch.arange(ctx_len, device=q.device)[None, :] <= q_pos[:, None]  # [t, n]
        ob = F.scaled_dot_product_attention(q[start:end].transpose(0, 1).to(k.dtype), k, v, attn_mask=visible, scale=scale,
                                            enable_gqa=num_q_heads != num_kv_heads)  # [Hq, t, D]
        out[start:end] = ob.transpose(0, 1).to(q.dtype)
    return out

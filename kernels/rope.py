"""Rotary position embedding (RoPE), Hugging Face Llama convention, applied in place.

HF's ``rotate_half`` pairs dimension ``i`` with ``i + D/2`` (not the interleaved ``2i, 2i+1`` of
the original paper / GPT-J): for ``i < D/2``

    out[i]       = x[i] * cos[i] - x[i + D/2] * sin[i]
    out[i + D/2] = x[i + D/2] * cos[i] + x[i] * sin[i]

HF's cos/sin tables are ``cat(freqs, freqs)``, i.e. both halves equal, so only ``D/2`` columns
are cached. The rotation is computed in fp32 and rounded once to the tensor's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from veil.kernels._utils import check_triton_device, next_pow2


def build_rope_cache(
    head_dim: int,
    max_positions: int,
    theta: float = 10000.0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Build (cos, sin), each [max_positions, head_dim // 2] fp32, exactly as HF Llama.

    HF: ``inv_freq = 1 / theta ** (arange(0, D, 2) / D)`` in fp32, ``freqs = pos * inv_freq``
    in fp32 (a single product, so the outer product below rounds identically to HF's matmul).
    Only the default rope type is supported (SmolLM2 and Llama 2 use it; Llama 3.1's
    frequency scaling would be applied to inv_freq here).
    """
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)
    positions = torch.arange(max_positions, dtype=torch.int64, device=device).float()
    freqs = torch.outer(positions, inv_freq)
    return freqs.cos(), freqs.sin()


@triton.jit
def _rope_kernel(
    q_ptr,
    k_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cos,
    stride_sin,
    num_q_heads,
    num_kv_heads,
    HALF_DIM: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    # One program per token: it loads that position's cos/sin row once and rotates every
    # query and key head of the token with it.
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    d_mask = d < HALF_DIM
    cos = tl.load(cos_ptr + pos * stride_cos + d, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_sin + d, mask=d_mask, other=0.0).to(tl.float32)
    cos = cos[None, :]
    sin = sin[None, :]

    hq = tl.arange(0, BLOCK_HQ)
    q_mask = (hq < num_q_heads)[:, None] & d_mask[None, :]
    q_lo_ptrs = q_ptr + t * stride_qt + hq[:, None] * stride_qh + d[None, :]
    q_lo = tl.load(q_lo_ptrs, mask=q_mask, other=0.0).to(tl.float32)
    q_hi = tl.load(q_lo_ptrs + HALF_DIM, mask=q_mask, other=0.0).to(tl.float32)
    tl.store(q_lo_ptrs, (q_lo * cos - q_hi * sin).to(q_ptr.dtype.element_ty), mask=q_mask)
    tl.store(
        q_lo_ptrs + HALF_DIM, (q_hi * cos + q_lo * sin).to(q_ptr.dtype.element_ty), mask=q_mask
    )

    hk = tl.arange(0, BLOCK_HK)
    k_mask = (hk < num_kv_heads)[:, None] & d_mask[None, :]
    k_lo_ptrs = k_ptr + t * stride_kt + hk[:, None] * stride_kh + d[None, :]
    k_lo = tl.load(k_lo_ptrs, mask=k_mask, other=0.0).to(tl.float32)
    k_hi = tl.load(k_lo_ptrs + HALF_DIM, mask=k_mask, other=0.0).to(tl.float32)
    tl.store(k_lo_ptrs, (k_lo * cos - k_hi * sin).to(k_ptr.dtype.element_ty), mask=k_mask)
    tl.store(
        k_lo_ptrs + HALF_DIM, (k_hi * cos + k_lo * sin).to(k_ptr.dtype.element_ty), mask=k_mask
    )


def _check_rope_args(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError("q and k must be [tokens, heads, head_dim]")
    if q.shape[0] != k.shape[0] or q.shape[0] != positions.shape[0]:
        raise ValueError("q, k and positions must have the same number of tokens")
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim or head_dim % 2:
        raise ValueError("q and k must share an even head_dim")
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != head_dim // 2:
        raise ValueError(f"cos/sin must be [max_positions, {head_dim // 2}]")


def apply_rope_triton(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """Triton launcher; same contract as :func:`apply_rope_torch`.

    q and k may be strided views (e.g. slices of a fused QKV projection output) as long as
    head_dim is contiguous: the kernel writes through their strides.
    """
    _check_rope_args(q, k, positions, cos, sin)
    check_triton_device(q, k, positions, cos, sin)
    if q.stride(-1) != 1 or k.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError("the last dimension of q, k, cos and sin must be contiguous")
    num_tokens, num_q_heads, head_dim = q.shape
    if num_tokens == 0:
        return
    _rope_kernel[(num_tokens,)](
        q,
        k,
        positions,
        cos,
        sin,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        sin.stride(0),
        num_q_heads,
        k.shape[1],
        HALF_DIM=head_dim // 2,
        BLOCK_HQ=next_pow2(num_q_heads),
        BLOCK_HK=next_pow2(k.shape[1]),
        BLOCK_HALF=next_pow2(head_dim // 2),
    )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x = x.float()
    lo, hi = x[..., :half], x[..., half:]
    return torch.cat((lo * cos - hi * sin, hi * cos + lo * sin), dim=-1)


def apply_rope_torch(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """Reference twin: rotate q [T, Hq, D] and k [T, Hkv, D] in place.

    positions: [T] integer positions; cos, sin: [max_positions, D/2] from build_rope_cache.
    """
    _check_rope_args(q, k, positions, cos, sin)
    # [T, 1, D/2]: broadcast over heads.
    c = cos[positions.long()].float().unsqueeze(1)
    s = sin[positions.long()].float().unsqueeze(1)
    q.copy_(_rotate(q, c, s))
    k.copy_(_rotate(k, c, s))

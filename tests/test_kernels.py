"""Triton kernels vs their torch twins, under the Triton interpreter on CPU.

conftest.py sets TRITON_INTERPRET=1 before collection. The interpreter handles fp32, fp16
and bf16 (loads, stores, casts and tl.dot), so every kernel is tested in fp32 and in one or
both half types. One caveat (Triton 3.x interpreter): it rounds fp32 -> bf16 by truncation,
where GPUs (and torch) round to nearest even, so bf16 outputs may differ from the twin by one
bf16 ulp under the interpreter; bf16 tolerances allow for that. The interpreter runs each program in Python, so shapes are kept small; the
model's real sizes (hidden 576, 9/3 heads of dim 64) appear where they are cheap.

Each twin is itself checked against an independent formulation (HF's formulas written out,
or a per-sequence dense attention), so a kernel matching its twin means something.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from veil.kernels import ops
from veil.kernels.activation import silu_and_mul_torch, silu_and_mul_triton
from veil.kernels.kv_store import store_kv_torch, store_kv_triton
from veil.kernels.paged_attention import (
    paged_decode_attention_torch,
    paged_decode_attention_triton,
)
from veil.kernels.prefill_attention import (
    paged_prefill_attention_torch,
    paged_prefill_attention_triton,
)
from veil.kernels.rmsnorm import add_rms_norm_torch, add_rms_norm_triton
from veil.kernels.rope import apply_rope_torch, apply_rope_triton, build_rope_cache

# Kernel and twin do the same fp32 math, so they differ by accumulation order and at most one
# rounding of the output: tolerances are a few ulps of the output dtype.
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}
HALF_DTYPES = [torch.float16, torch.bfloat16]
ALL_DTYPES = [torch.float32, *HALF_DTYPES]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).to(dtype)


# --------------------------------------------------------------------------- RMSNorm


def _hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm.forward, written out."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (5, 576), (2, 3, 100)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_twin(dtype, shape, with_residual):
    x = _randn(*shape, dtype=dtype, seed=1)
    residual = _randn(*shape, dtype=dtype, seed=2) if with_residual else None
    weight = (1.0 + 0.1 * _randn(shape[-1], seed=3)).to(dtype)
    out, new_res = add_rms_norm_triton(x, residual, weight, 1e-5)
    ref_out, ref_res = add_rms_norm_torch(x, residual, weight, 1e-5)
    assert out.dtype == dtype and new_res.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    # The residual is one rounded add in both: exact, but for the interpreter's bf16
    # truncation (one ulp, i.e. at most 2**-7 relative).
    exact = dict(atol=0.0, rtol=2**-7 if dtype == torch.bfloat16 else 0.0)
    torch.testing.assert_close(new_res, ref_res, **exact)
    if residual is None:
        assert new_res is x


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_add_rms_norm_twin_matches_hf(dtype):
    x = _randn(4, 576, dtype=dtype, seed=4)
    residual = _randn(4, 576, dtype=dtype, seed=5)
    weight = (1.0 + 0.1 * _randn(576, seed=6)).to(dtype)
    out, new_res = add_rms_norm_torch(x, residual, weight, 1e-5)
    assert torch.equal(new_res, x + residual)
    torch.testing.assert_close(out, _hf_rms_norm(x + residual, weight, 1e-5), **TOL[dtype])


# --------------------------------------------------------------------------- RoPE


def _hf_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """HF LlamaRotaryEmbedding + apply_rotary_pos_emb (default rope), in fp32, written out."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = (inv_freq[None, :, None] @ positions[None, None, :].float()).transpose(1, 2)[0]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    xf = x.float()
    rotated = torch.cat((-xf[..., dim // 2 :], xf[..., : dim // 2]), dim=-1)  # rotate_half
    return xf * cos + rotated * sin


def test_rope_cache_and_twin_match_hf():
    theta, head_dim = 100000.0, 64
    cos, sin = build_rope_cache(head_dim, 4096, theta)
    assert cos.shape == (4096, 32) and cos.dtype == torch.float32
    positions = torch.tensor([0, 1, 7, 100, 4095])
    q = _randn(5, 3, head_dim, seed=7)
    k = _randn(5, 1, head_dim, seed=8)
    q_ref, k_ref = _hf_rope(q, positions, theta), _hf_rope(k, positions, theta)
    apply_rope_torch(q, k, positions, cos, sin)
    torch.testing.assert_close(q, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, k_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize(
    "num_tokens,num_q_heads,num_kv_heads,head_dim",
    [(1, 1, 1, 16), (6, 9, 3, 64), (4, 4, 2, 32)],
)
def test_rope_matches_twin(dtype, num_tokens, num_q_heads, num_kv_heads, head_dim):
    cos, sin = build_rope_cache(head_dim, 512, 10000.0)
    positions = torch.randint(0, 512, (num_tokens,), generator=_gen(9))
    q = _randn(num_tokens, num_q_heads, head_dim, dtype=dtype, seed=10)
    k = _randn(num_tokens, num_kv_heads, head_dim, dtype=dtype, seed=11)
    q_ref, k_ref = q.clone(), k.clone()
    apply_rope_triton(q, k, positions, cos, sin)
    apply_rope_torch(q_ref, k_ref, positions, cos, sin)
    torch.testing.assert_close(q, q_ref, **TOL[dtype])
    torch.testing.assert_close(k, k_ref, **TOL[dtype])


def test_rope_in_place_on_fused_qkv_views():
    # The engine slices q and k out of one QKV projection output: strided views, written in
    # place, and the V columns between/after them must stay untouched.
    num_tokens, hq, hkv, d = 3, 4, 2, 16
    qkv = _randn(num_tokens, (hq + 2 * hkv) * d, seed=12)
    ref = qkv.clone()
    positions = torch.tensor([5, 0, 42], dtype=torch.int32)
    cos, sin = build_rope_cache(d, 64, 10000.0)
    for buf, fn in ((qkv, apply_rope_triton), (ref, apply_rope_torch)):
        q = buf[:, : hq * d].view(num_tokens, hq, d)
        k = buf[:, hq * d : (hq + hkv) * d].view(num_tokens, hkv, d)
        fn(q, k, positions, cos, sin)
    torch.testing.assert_close(qkv, ref, atol=1e-5, rtol=1e-5)
    v_cols = slice((hq + hkv) * d, None)
    assert torch.equal(qkv[:, v_cols], _randn(num_tokens, (hq + 2 * hkv) * d, seed=12)[:, v_cols])


# --------------------------------------------------------------------------- SiLU-and-mul


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(1, 32), (5, 2 * 1536), (2, 3, 200)])
def test_silu_and_mul_matches_twin(dtype, shape):
    x = _randn(*shape, dtype=dtype, seed=13) * 3
    out = silu_and_mul_triton(x)
    ref = silu_and_mul_torch(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    torch.testing.assert_close(out, ref, **TOL[dtype])
    gate, up = x.float().chunk(2, dim=-1)
    torch.testing.assert_close(ref.float(), gate / (1 + torch.exp(-gate)) * up, **TOL[dtype])


def test_silu_and_mul_column_blocks():
    # A block narrower than the row exercises the second grid axis and its masked tail.
    x = _randn(3, 2 * 100, seed=14)
    torch.testing.assert_close(silu_and_mul_triton(x, block=32), silu_and_mul_torch(x))


# --------------------------------------------------------------------------- KV store


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size,num_kv_heads,head_dim", [(4, 2, 32), (16, 3, 64)])
def test_store_kv_matches_twin(dtype, block_size, num_kv_heads, head_dim):
    num_blocks, num_tokens = 5, 9
    k = _randn(num_tokens, num_kv_heads, head_dim, dtype=dtype, seed=15)
    v = _randn(num_tokens, num_kv_heads, head_dim, dtype=dtype, seed=16)
    slots = torch.randperm(num_blocks * block_size, generator=_gen(17))[:num_tokens]
    slots[[2, 5]] = -1  # skipped tokens
    caches = [
        torch.full((num_blocks, block_size, num_kv_heads, head_dim), 7.0, dtype=dtype)
        for _ in range(4)
    ]
    store_kv_triton(k, v, caches[0], caches[1], slots)
    store_kv_torch(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    # Twin vs the definition: each kept token at its slot, every other slot untouched.
    expected_k = torch.full_like(caches[2], 7.0)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_k[slot // block_size, slot % block_size] = k[t]
    assert torch.equal(caches[2], expected_k)


def test_store_kv_from_strided_views():
    # k and v sliced out of a fused QKV output, as the engine does.
    t, hq, hkv, d, bs = 4, 2, 1, 16, 4
    qkv = _randn(t, (hq + 2 * hkv) * d, seed=18)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    slots = torch.tensor([3, 4, 9, 0])
    caches = [torch.zeros(3, bs, hkv, d) for _ in range(4)]
    store_kv_triton(k, v, caches[0], caches[1], slots)
    store_kv_torch(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


# --------------------------------------------------------------------------- paged decode attention


def _make_paged_case(
    context_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, ...]:
    """Random caches, and block tables that scatter each sequence over shuffled blocks.

    Unused table entries hold -1 (garbage that must never be read).
    """
    gen = _gen(seed)
    blocks_per_seq = [math.ceil(n / block_size) for n in context_lens]
    max_blocks = max(max(blocks_per_seq), 1) + 1  # one spare column of garbage
    num_blocks = sum(blocks_per_seq) + 2
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.full((len(context_lens), max_blocks), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks_per_seq):
        block_tables[b, :n] = perm[used : used + n].to(torch.int32)
        used += n
    q = torch.randn(len(context_lens), num_q_heads, head_dim, generator=gen).to(dtype)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return q, k_cache, v_cache, block_tables, lens


def _naive_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One sequence at a time: gather its blocks into dense K/V, repeat KV heads, softmax."""
    block_size = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32)
    for b, n in enumerate(context_lens.tolist()):
        if n == 0:
            continue
        blocks = block_tables[b, : math.ceil(n / block_size)].long()
        k = k_cache[blocks].flatten(0, 1)[:n].float()  # [n, Hkv, D]
        v = v_cache[blocks].flatten(0, 1)[:n].float()
        k = k.repeat_interleave(group, dim=1)  # [n, Hq, D], HF repeat_kv order
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)
    return out.to(q.dtype)


# (context_lens, Hq, Hkv, D, block_size, partition_size): single- and multi-partition
# contexts, lengths that are not multiples of the block size or the partition, a block size
# smaller than the kernel's tile, the SmolLM2 head layout, and an empty (padding) sequence.
# The kernel's tile is 16 tokens, so partitions of 32+ also run several online-softmax steps.
PAGED_CASES = [
    ([1, 7, 45], 4, 2, 32, 4, 16),
    ([16, 33, 5], 9, 3, 64, 16, 32),
    ([100, 3], 2, 1, 16, 8, 32),
    ([0, 20], 4, 4, 16, 4, 64),
]


@pytest.mark.parametrize("case", PAGED_CASES)
def test_paged_decode_twin_matches_naive(case):
    lens, hq, hkv, d, bs, _ = case
    q, k_cache, v_cache, tables, ctx = _make_paged_case(lens, hq, hkv, d, bs, torch.float32, 19)
    scale = d**-0.5
    got = paged_decode_attention_torch(q, k_cache, v_cache, tables, ctx, scale)
    ref = _naive_decode_attention(q, k_cache, v_cache, tables, ctx, scale)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_paged_decode_twin_groups_by_length():
    """Very different context lengths are attended in separate groups (the CPU twin pads each
    group only to its own longest); the result is the same as sequence by sequence."""
    from veil.kernels.paged_attention import _length_groups

    lens = [3, 700, 9, 0, 650, 5, 690]
    groups = _length_groups(tuple(lens), 4)
    assert len(groups) >= 2 and sorted(i for g in groups for i in g) == list(range(len(lens)))
    q, k_cache, v_cache, tables, ctx = _make_paged_case(lens, 9, 3, 64, 4, torch.float32, 23)
    got = paged_decode_attention_torch(q, k_cache, v_cache, tables, ctx, 0.125)
    torch.testing.assert_close(got, _naive_decode_attention(q, k_cache, v_cache, tables, ctx, 0.125),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", PAGED_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_paged_decode_matches_twin(case, dtype):
    lens, hq, hkv, d, bs, partition = case
    q, k_cache, v_cache, tables, ctx = _make_paged_case(lens, hq, hkv, d, bs, dtype, 20)
    scale = d**-0.5
    got = paged_decode_attention_triton(
        q, k_cache, v_cache, tables, ctx, scale, partition_size=partition, tile_n=16
    )
    ref = paged_decode_attention_torch(q, k_cache, v_cache, tables, ctx, scale)
    assert got.dtype == dtype and got.shape == q.shape
    # Half precision: P is rounded to fp16 before the P@V dot (as in flash attention).
    tol = TOL[torch.float32] if dtype == torch.float32 else dict(atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(got, ref, **tol)
    if 0 in lens:
        assert torch.all(got[lens.index(0)] == 0)


def test_paged_decode_bf16_and_explicit_max_context_len():
    lens = [40, 9]
    q, k_cache, v_cache, tables, ctx = _make_paged_case(lens, 4, 2, 32, 8, torch.bfloat16, 21)
    got = paged_decode_attention_triton(
        q, k_cache, v_cache, tables, ctx, 0.125, partition_size=16, max_context_len=max(lens)
    )
    ref = paged_decode_attention_torch(q, k_cache, v_cache, tables, ctx, 0.125)
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


def test_paged_decode_partition_size_does_not_change_result():
    q, k_cache, v_cache, tables, ctx = _make_paged_case([70, 31], 2, 1, 16, 4, torch.float32, 22)
    outs = [
        paged_decode_attention_triton(q, k_cache, v_cache, tables, ctx, 0.25, partition_size=p)
        for p in (16, 128)
    ]
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- paged prefill attention


def _make_prefill_case(
    chunks: list[tuple[int, int]],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, ...]:
    """chunks: (new tokens, all cached tokens incl. the new ones) per sequence."""
    q_lens = [q_len for q_len, _ in chunks]
    ctx_lens = [ctx for _, ctx in chunks]
    _, k_cache, v_cache, tables, lens = _make_paged_case(
        ctx_lens, num_q_heads, num_kv_heads, head_dim, block_size, dtype, seed
    )
    q = _randn(sum(q_lens), num_q_heads, head_dim, dtype=dtype, seed=seed + 1)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return q, k_cache, v_cache, tables, cu, lens


def _naive_prefill_attention(q, k_cache, v_cache, tables, cu, lens, scale) -> torch.Tensor:
    """Per sequence: dense K/V, repeated KV heads, SDPA with an explicit causal-offset mask."""
    block_size = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32)
    for b, ctx in enumerate(lens.tolist()):
        start, end = int(cu[b]), int(cu[b + 1])
        if end == start:
            continue
        blocks = tables[b, : math.ceil(ctx / block_size)].long()
        k = k_cache[blocks].flatten(0, 1)[:ctx].float().repeat_interleave(group, dim=1)
        v = v_cache[blocks].flatten(0, 1)[:ctx].float().repeat_interleave(group, dim=1)
        q_pos = torch.arange(ctx - (end - start), ctx)
        mask = torch.arange(ctx)[None, :] <= q_pos[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(
            q[start:end].float().transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            attn_mask=mask,
            scale=scale,
        )
        out[start:end] = o.transpose(0, 1)
    return out.to(q.dtype)


# (chunks, Hq, Hkv, D, block_size): a fresh prompt, a chunk after a cached prefix, a decode
# token and an empty sequence in one batch; a chunk longer than one query tile (BLOCK_M = 32
# for groups of 2); the SmolLM2 head layout (group 3, padded to 4).
PREFILL_CASES = [
    ([(5, 5), (3, 20), (1, 9), (0, 4)], 4, 2, 32, 4),
    ([(40, 40), (7, 50)], 2, 1, 16, 8),
    ([(6, 6), (2, 13)], 9, 3, 64, 16),
]


@pytest.mark.parametrize("case", PREFILL_CASES)
def test_paged_prefill_twin_matches_naive(case):
    chunks, hq, hkv, d, bs = case
    args = _make_prefill_case(chunks, hq, hkv, d, bs, torch.float32, 30)
    got = paged_prefill_attention_torch(*args, d**-0.5)
    ref = _naive_prefill_attention(*args, d**-0.5)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_paged_prefill_twin_matches_decode_twin_for_single_tokens():
    q, k_cache, v_cache, tables, lens = _make_paged_case([1, 7, 45], 4, 2, 32, 4, torch.float32, 31)
    cu = torch.arange(4, dtype=torch.int32)
    got = paged_prefill_attention_torch(q, k_cache, v_cache, tables, cu, lens, 0.2)
    ref = paged_decode_attention_torch(q, k_cache, v_cache, tables, lens, 0.2)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_twins_attend_in_the_cache_dtype():
    """The CPU twins compute in their cache's dtype (the engine keeps a bf16 cache only where
    bf16 attention is fast): on a bf16 cache they return bf16 within bf16 rounding of the same
    numbers attended in fp32, for decode and prefill alike."""
    chunks = [(6, 6), (2, 13), (1, 40)]
    q, kc, vc, tables, cu, lens = _make_prefill_case(chunks, 9, 3, 64, 16, torch.bfloat16, 33)
    f32 = [t.float() for t in (q, kc, vc)]
    got = paged_prefill_attention_torch(q, kc, vc, tables, cu, lens, 0.125)
    ref = paged_prefill_attention_torch(*f32, tables, cu, lens, 0.125)
    assert got.dtype == torch.bfloat16 and ref.dtype == torch.float32
    torch.testing.assert_close(got.float(), ref, atol=2e-2, rtol=2e-2)
    dq, dk, dv, dt, dl = _make_paged_case([5, 33, 70], 9, 3, 64, 16, torch.bfloat16, 34)
    got = paged_decode_attention_torch(dq, dk, dv, dt, dl, 0.125)
    ref = paged_decode_attention_torch(dq.float(), dk.float(), dv.float(), dt, dl, 0.125)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("case", PREFILL_CASES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_paged_prefill_matches_twin(case, dtype):
    chunks, hq, hkv, d, bs = case
    args = _make_prefill_case(chunks, hq, hkv, d, bs, dtype, 32)
    got = paged_prefill_attention_triton(*args, d**-0.5, tile_n=16)
    ref = paged_prefill_attention_torch(*args, d**-0.5)
    assert got.dtype == dtype and got.shape == args[0].shape
    tol = {
        torch.float32: TOL[torch.float32],
        torch.float16: dict(atol=5e-3, rtol=5e-3),
        torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    }[dtype]
    torch.testing.assert_close(got, ref, **tol)


# --------------------------------------------------------------------------- dispatch


def test_ops_dispatch_cpu_twin_and_forced_triton(monkeypatch):
    # the torch twins on the CPU: where the C kernels are built (``llama_cpu``, a compiler and a
    # warm cache) they would take these tensors instead, close to the twins but not bit-equal
    # (tests/test_llama_cpu.py compares them)
    monkeypatch.setenv("VEIL_CPU_KERNELS", "0")
    x = _randn(3, 64, seed=23)
    w = torch.ones(64)
    assert torch.equal(ops.rms_norm(x, w, 1e-6), add_rms_norm_torch(x, None, w, 1e-6)[0])
    torch.testing.assert_close(
        ops.rms_norm(x, w, 1e-6, force_triton=True), ops.rms_norm(x, w, 1e-6)
    )
    g = _randn(2, 40, seed=24)
    torch.testing.assert_close(ops.silu_and_mul(g, force_triton=True), ops.silu_and_mul(g))

    q, k_cache, v_cache, tables, ctx = _make_paged_case([5, 18], 2, 1, 16, 4, torch.float32, 25)
    args = (q, k_cache, v_cache, tables, ctx, 0.25)
    torch.testing.assert_close(
        ops.paged_decode_attention(*args, partition_size=16, force_triton=True),
        ops.paged_decode_attention(*args),
    )

    # A decode step end to end through the public API: rope, store, attend.
    cos, sin = build_rope_cache(16, 64, 10000.0)
    new_k = _randn(2, 1, 16, seed=26)
    new_v = _randn(2, 1, 16, seed=27)
    # Sequence 0 holds 5 tokens (new one at position 5 = block 1, offset 1); sequence 1
    # holds 18 (new one at position 18 = block 4, offset 2). Block size is 4.
    slots = torch.stack([tables[0, 1] * 4 + 1, tables[1, 4] * 4 + 2]).long()
    positions = torch.tensor([5, 18])
    results = []
    for force in (True, False):
        qq, kk = q.clone(), new_k.clone()
        kc, vc = k_cache.clone(), v_cache.clone()
        ops.apply_rope(qq, kk, positions, cos, sin, force_triton=force)
        ops.store_kv(kk, new_v, kc, vc, slots, force_triton=force)
        lens = ctx + 1
        results.append(
            ops.paged_decode_attention(
                qq, kc, vc, tables, lens, 0.25, partition_size=16, force_triton=force
            )
        )
    torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=1e-5)


def test_triton_path_rejects_cpu_tensors_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        silu_and_mul_triton(torch.zeros(2, 8))


def test_kernels_compile_for_gpu():
    """The interpreter cannot see GPU-only compile errors: compile every launch for sm_90.

    Runs in a subprocess because TRITON_INTERPRET is read when kernels are defined; uses
    Triton's bundled ptxas, needs no GPU, and launches nothing.
    """
    nvidia = pytest.importorskip("triton.backends.nvidia")
    bundled = Path(nvidia.__file__).parent / "bin" / "ptxas"
    if not bundled.exists() and not os.environ.get("TRITON_PTXAS_PATH"):
        pytest.skip("no ptxas available to Triton")
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "veil.kernels.compile_check", "--arch", "90"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- fixed-weight GEMM
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("onednn", [True, False])
def test_linear_layouts_equal_the_plain_product(dtype, onednn, monkeypatch):
    """`Linear` (a weight laid out once: oneDNN-prepacked where oneDNN takes it, else an
    [in, out] fp32 copy or the plain view on CPU) equals `x @ W.T` on the weight as given, for
    every row count a step may bring, with leading dims kept; the prepack is made for 16 rows."""
    from veil.kernels import linear

    if not onednn:  # a CPU whose oneDNN refuses the dtype, e.g. bf16 on an AVX2-only CPU
        monkeypatch.setattr(linear, "onednn_prepacks", lambda dtype: False)
    elif not linear.onednn_prepacks(dtype):
        pytest.skip(f"oneDNN does not prepack {dtype} on this CPU")
    gen = _gen(40)
    w = torch.randn(96, 64, generator=gen).to(dtype)
    lin = linear.Linear(w, "cpu")
    fallback = "in-out copy" if dtype == torch.float32 else "view"
    assert lin.layout == ("onednn-packed" if onednn else fallback)
    for shape in ((1, 64), (5, 64), (16, 64), (17, 64), (64, 64), (300, 64), (2, 3, 64)):
        x = torch.randn(*shape, generator=gen).to(dtype)
        got = lin(x)
        assert got.shape == (*shape[:-1], 96) and got.dtype == dtype
        torch.testing.assert_close(got, x @ w.T, **TOL[dtype])

"""The engine's C kernels (``veil.kernels.llama_cpu``) against their torch twins.

Elementwise kernels (RoPE, SwiGLU, residual + RMSNorm) round where their twins round; the
reductions (the norm's sum of squares, attention) sum in another order, so they are compared
within a few units of the last place of the dtype. Without a C compiler (or with
``VEIL_CPU_KERNELS=0``) the kernel tests skip and the dispatch test checks that the twins run.
"""

from __future__ import annotations

import pytest
import torch

from veil.kernels import cbuild, llama_cpu, ops
from veil.kernels.activation import silu_and_mul_torch
from veil.kernels.kv_store import store_kv_torch
from veil.kernels.paged_attention import paged_decode_attention_torch
from veil.kernels.prefill_attention import paged_prefill_attention_torch
from veil.kernels.rmsnorm import add_rms_norm_torch
from veil.kernels.rope import apply_rope_torch, build_rope_cache

needs_c = pytest.mark.skipif(not llama_cpu.available(),
                             reason="no C compiler (or VEIL_CPU_KERNELS=0): the twins run")
DTYPES = [torch.float32, torch.bfloat16]
# The reductions' tolerances: a few ulps of the dtype at these magnitudes.
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _paged(dtype, *, hq=9, hkv=3, d=64, bs=16, blocks=40, lens=(0, 1, 17, 33, 64), seed=0):
    """q [batch, hq, d] as a strided view (the engine's q is a slice of the qkv rows), caches,
    block tables with garbage (negative, huge) entries past each context."""
    g, batch = _gen(seed), len(lens)
    qkv = torch.randn(batch, hq * d + 2 * hkv * d, generator=g).to(dtype)
    q = qkv[:, :hq * d].view(batch, hq, d)
    kc = torch.randn(blocks, bs, hkv, d, generator=g).to(dtype)
    vc = torch.randn(blocks, bs, hkv, d, generator=g).to(dtype)
    width = -(-max(lens) // bs) + 1
    perm = torch.randperm(blocks, generator=g)[: batch * width].view(batch, width).to(torch.int32)
    tables = perm.clone()
    for b, n in enumerate(lens):
        used = -(-n // bs)
        tables[b, used:] = torch.tensor([-7, 10**6] * width, dtype=torch.int32)[: width - used]
    return q, kc, vc, tables, torch.tensor(lens, dtype=torch.int32)


@needs_c
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv", [(9, 3), (4, 4), (8, 1)])
def test_paged_attention_matches_twin(dtype, hq, hkv):
    q, kc, vc, tables, lens = _paged(dtype, hq=hq, hkv=hkv)
    assert not q.is_contiguous()
    got = llama_cpu.paged_attention(q, kc, vc, tables, lens, 0.125)
    want = paged_decode_attention_torch(q, kc, vc, tables, lens, 0.125)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    assert torch.equal(got[0], torch.zeros_like(got[0]))  # context 0: nothing to attend to


@needs_c
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_attention_matches_twin(dtype):
    """Chunks of new tokens over contexts with a cached prefix (chunked prefill), a whole prompt,
    a one-token chunk and an empty one; each new token sees the positions up to its own."""
    chunks, ctxs = [5, 0, 17, 1, 33], [5, 9, 40, 20, 33]
    q, kc, vc, tables, lens = _paged(dtype, lens=tuple(ctxs), seed=7)
    q = torch.randn(sum(chunks), *q.shape[1:], generator=_gen(8)).to(dtype)
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
    got = llama_cpu.prefill_attention(q, kc, vc, tables, cu, lens, 0.125)
    want = paged_prefill_attention_torch(q, kc, vc, tables, cu, lens, 0.125)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    assert torch.equal(ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, 0.125), got)  # dispatched
    with pytest.raises(ValueError, match="no longer than their contexts"):
        llama_cpu.prefill_attention(q, kc, vc, tables, cu, torch.tensor([4, 9, 40, 20, 33]), 0.125)


def _has_cpu_flags(*names: str) -> bool:
    return set(names) <= set(cbuild._cpu_flags().split())


# Builds other than -march=native, what other CPUs run: the portable build takes the generic
# attention loop in both dtypes; the AVX2 build takes the row kernel at 8 lanes for fp32.
BUILDS = [pytest.param((), id="portable"),
          pytest.param(("-mavx2", "-mfma"), id="avx2",
                       marks=pytest.mark.skipif(not _has_cpu_flags("avx2", "fma"), reason="no AVX2 + FMA"))]


@needs_c
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hkv", [(9, 3), (8, 1)])
def test_other_builds_match_twin(monkeypatch, build, dtype, hq, hkv):
    lib = llama_cpu._declare(cbuild.load(llama_cpu._SOURCE, (*llama_cpu._FLAGS, *build)))
    monkeypatch.setattr(llama_cpu, "_library", lambda: lib)
    q, kc, vc, tables, lens = _paged(dtype, hq=hq, hkv=hkv)
    torch.testing.assert_close(llama_cpu.paged_attention(q, kc, vc, tables, lens, 0.125).float(),
                               paged_decode_attention_torch(q, kc, vc, tables, lens, 0.125).float(), **TOL[dtype])
    x = torch.randn(4, 2 * 96).to(dtype)
    torch.testing.assert_close(llama_cpu.silu_and_mul(x), silu_and_mul_torch(x), atol=1e-6, rtol=8e-3)


@needs_c
def test_paged_attention_long_context_and_large_scores():
    """Scores far from 0 (the softmax's max subtraction and exp range) over 1000 positions."""
    q, kc, vc, tables, lens = _paged(torch.float32, lens=(1000, 999, 3), blocks=200, seed=1)
    q = q * 8
    got = llama_cpu.paged_attention(q, kc, vc, tables, lens, 0.125)
    want = paged_decode_attention_torch(q, kc, vc, tables, lens, 0.125)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@needs_c
def test_paged_attention_refuses_a_block_outside_the_cache():
    q, kc, vc, tables, lens = _paged(torch.float32)
    tables[3, 0] = kc.shape[0]  # inside row 3's context
    with pytest.raises(ValueError, match="names no cache block"):
        llama_cpu.paged_attention(q, kc, vc, tables, lens, 0.125)
    with pytest.raises(ValueError, match="outside its block table"):
        llama_cpu.paged_attention(q, kc, vc, tables, lens + 10**4, 0.125)


@needs_c
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_twin(dtype, with_residual):
    g = _gen(2)
    x = (torch.randn(7, 3, 576, generator=g) * 4).to(dtype)
    res = (torch.randn(7, 3, 576, generator=g) * 30).to(dtype) if with_residual else None
    w = torch.randn(576, generator=g).to(dtype)
    got, got_res = llama_cpu.add_rms_norm(x, res, w, 1e-5)
    want, want_res = add_rms_norm_torch(x, res, w, 1e-5)
    assert torch.equal(got_res, want_res)  # the residual sum rounds exactly as the twin's
    if dtype is torch.bfloat16:  # one bf16 ulp where the sum of squares lands across a rounding
        assert (got.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()
        assert (got != want).float().mean() < 0.01
    else:
        torch.testing.assert_close(got, want, **TOL[dtype])


@needs_c
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_equals_twin(dtype):
    """Strided q and k (views of the qkv rows) rotated in place, bit for bit."""
    g = _gen(3)
    cos, sin = build_rope_cache(64, 4096)
    qkv = torch.randn(6, 15 * 64, generator=g).to(dtype)
    positions = torch.tensor([0, 1, 5, 300, 4095, 77])
    q, k = qkv[:, :9 * 64].view(6, 9, 64), qkv[:, 9 * 64:12 * 64].view(6, 3, 64)
    ref = qkv.clone()
    rq, rk = ref[:, :9 * 64].view(6, 9, 64), ref[:, 9 * 64:12 * 64].view(6, 3, 64)
    llama_cpu.rope(q, k, positions, cos, sin)
    apply_rope_torch(rq, rk, positions, cos, sin)
    assert torch.equal(qkv, ref)  # v (the last 3 heads) untouched by both
    with pytest.raises(ValueError, match="outside the RoPE tables"):
        llama_cpu.rope(q, k, torch.tensor([0, 1, 2, 3, 4, 4096]), cos, sin)


@needs_c
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_twin(dtype):
    g = _gen(4)
    x = (torch.randn(2, 5, 2 * 1536, generator=g) * 6).to(dtype)
    x[0, 0, :4] = torch.tensor([-200.0, 200.0, 0.0, -0.0])  # exp's clamps
    got, want = llama_cpu.silu_and_mul(x), silu_and_mul_torch(x)
    assert got.shape == want.shape == (2, 5, 1536)
    # SiLU's exp is not torch's: equal to the last bit or one ulp of the dtype apart.
    torch.testing.assert_close(got, want, atol=1e-6, rtol=2e-6 if dtype is torch.float32 else 8e-3)
    with pytest.raises(ValueError, match="equal width"):
        llama_cpu.silu_and_mul(x[..., :-1])


@needs_c
@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_equals_twin(dtype):
    """k, v as slices of the qkv rows; slot -1 skips a token; a slot past the cache is refused
    and nothing is written."""
    g = _gen(6)
    qkv = torch.randn(5, 15 * 64, generator=g).to(dtype)
    k, v = qkv[:, 9 * 64:12 * 64].view(5, 3, 64), qkv[:, 12 * 64:].view(5, 3, 64)
    caches = [torch.randn(4, 16, 3, 64, generator=g).to(dtype) for _ in range(2)]
    caches += [c.clone() for c in caches]
    slots = torch.tensor([3, -1, 17, 63, 40])
    llama_cpu.store_kv(k, v, caches[0], caches[1], slots)
    store_kv_torch(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    before = caches[0].clone()
    with pytest.raises(ValueError, match="past the cache"):
        llama_cpu.store_kv(k, v, caches[0], caches[1], torch.tensor([5, 6, 7, 8, 64]))
    assert torch.equal(caches[0], before)


def test_ops_dispatch_to_the_kernels_or_the_twins(monkeypatch):
    """With kernels built, the CPU ops call them (fp32 and bf16); with VEIL_CPU_KERNELS=0, or for
    dtypes they do not take, the ops call none of them. The kernels are replaced here by
    recorders around the twins (a stand-in inside this dispatch test only)."""
    calls = []
    twins = {"paged_attention": paged_decode_attention_torch, "silu_and_mul": silu_and_mul_torch,
             "store_kv": store_kv_torch}
    for name, twin in twins.items():
        monkeypatch.setattr(llama_cpu, name, lambda *a, _n=name, _t=twin: calls.append(_n) or _t(*a))
    q, kc, vc, tables, lens = _paged(torch.float32, seed=5)
    k = torch.randn(2, 3, 64)

    def run(dtype=torch.float32):
        ops.paged_decode_attention(q.to(dtype), kc.to(dtype), vc.to(dtype), tables, lens, 0.125)
        ops.silu_and_mul(torch.randn(3, 8).to(dtype))
        ops.store_kv(k.to(dtype), k.to(dtype), kc.to(dtype), vc.to(dtype), torch.tensor([0, 5]))

    run()
    assert calls == (list(twins) if llama_cpu.available() else [])
    calls.clear()
    run(torch.float16)  # a dtype the kernels do not take
    assert calls == []
    monkeypatch.setenv("VEIL_CPU_KERNELS", "0")
    assert not llama_cpu.available()
    run()
    run(torch.bfloat16)
    assert calls == []


def test_without_a_compiler_the_twins_run(monkeypatch, tmp_path):
    """No working compiler: nothing is built, ``available()`` is false and the ops still work."""
    monkeypatch.setenv("VEIL_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    llama_cpu._library.cache_clear()
    try:
        assert not llama_cpu.available()
        x = torch.randn(4, 16)
        w = torch.randn(16)
        got, _ = ops.add_rms_norm(x, None, w, 1e-5)
        torch.testing.assert_close(got, add_rms_norm_torch(x, None, w, 1e-5)[0])
    finally:
        llama_cpu._library.cache_clear()  # the next caller loads the real build again

"""The native CKKS backend's Triton kernels (``veil.kernels.ckks_*``) vs their torch twins, bit for
bit, under the Triton interpreter on CPU (conftest sets TRITON_INTERPRET=1).

Bases cover both product schemes and every lazy-reduction pattern of the NTT plan: the
production chain (57/55-bit wide run, 36-bit narrow run: no reduction inside a forward
transform), 60-bit wide primes (limit 2^62 ~ 4q: a reduction every few stages) and a 50-bit
narrow prime (limit 2^50 < 2q: a reduction before nearly every stage). The interpreter runs
each program in Python, so N is small (256 and 2048: an even and an odd stage count) and
batches are a few rows; ``test_native_cuda`` repeats the comparisons at N=16384 on a GPU. Where
a twin is not already checked against Python integers elsewhere (``test_native_arith``), the
kernel is checked against them here too.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from veil.crypto import ring_switch
from veil.crypto.native import ntt as ntt_module
from veil.crypto.native import rns
from veil.crypto.native.context import RnsContext
from veil.crypto.native.modarith import Basis
from veil.crypto.native.ntt import NttTables
from veil.crypto.native.sampling import Stream
from veil.crypto.params import PROTECTED_PARAMS, TEST_PARAMS_ID, get_params
from veil.kernels import ckks_ntt, ckks_ops
from veil.kernels.ckks_arith import NO_FMA
from veil.kernels.ckks_ntt import ntt_triton

PROT = PROTECTED_PARAMS.primes  # [q_0 57, q_1 55, 36 x 6, p 57]
MASTER = (PROT[-1],) + PROT[:-1]  # the backend's limb order [p, q_0, ...]: wide run, narrow run
P60 = get_params("ckks-n16384-l6-v1").primes
MIXED = (P60[0], P60[-1], P60[1], get_params(TEST_PARAMS_ID, allow_test_params=True).primes[1])
BASES = {"protected": MASTER, "60-50-40": MIXED}  # MIXED: two 60-bit wide, 50- and 40-bit narrow


def _residues(primes, lead: tuple[int, ...], n: int, seed: int, signed: bool = False) -> torch.Tensor:
    """Uniform residues ``[*lead, L, N]`` in ``[0, q)`` (``(-q, q)`` when ``signed``)."""
    rng = np.random.default_rng(seed)
    lo = (lambda q: -q + 1) if signed else (lambda q: 0)
    cols = [rng.integers(lo(q), q, (*lead, n), dtype=np.int64) for q in primes]
    return torch.from_numpy(np.stack(cols, axis=-2))


# ---- the wrap-around arithmetic the kernels rely on ---------------------------------------------
@triton.jit
def _wrap_probe(a_ptr, b_ptr, out_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + i)
    b = tl.load(b_ptr + i)
    tl.store(out_ptr + i, a * b)
    tl.store(out_ptr + BLOCK + i, a << 30)
    tl.store(out_ptr + 2 * BLOCK + i, a >> 63)


def test_interpreter_int64_wraps_like_the_gpu():
    """Products and left shifts wrap modulo 2^64 and ``>>`` is arithmetic, as ``mul.lo.s64``,
    ``shl.b64`` and ``shr.s64`` do on the GPU (``test_ckks_kernels_compile_for_sm90`` checks
    that those are what the kernels compile to)."""
    rng = np.random.default_rng(0)
    a = rng.integers(-(2**63), 2**63 - 1, 256, dtype=np.int64)
    b = rng.integers(-(2**63), 2**63 - 1, 256, dtype=np.int64)
    out = torch.empty(3 * 256, dtype=torch.int64)
    _wrap_probe[(1,)](torch.from_numpy(a), torch.from_numpy(b), out, BLOCK=256)
    au, bu = a.view(np.uint64), b.view(np.uint64)
    got = out.numpy().reshape(3, 256)
    assert np.array_equal(got[0].view(np.uint64), au * bu)
    assert np.array_equal(got[1].view(np.uint64), au << np.uint64(30))
    assert np.array_equal(got[2], np.where(a < 0, -1, 0))


# ---- NTT -------------------------------------------------------------------------------------------
@pytest.fixture(params=["launches", "one launch"])
def ntt_mode(request, monkeypatch):
    """Each transform as a launch per group of stages, or all of a row's stages in one program
    (``ckks_ntt.ONE_LAUNCH_ROWS``: the small transforms)."""
    monkeypatch.setattr(ckks_ntt, "ONE_LAUNCH_ROWS", 0 if request.param == "launches" else 10**6)
    return request.param


# launches by stage count (``ckks_ntt._launches``): 5 = 4+1, 6 = 4+2, 8 = 4+4, 11 = 4+4+2+1
@pytest.mark.parametrize("n", [32, 64, 256, 2048])
@pytest.mark.parametrize("name", list(BASES))
def test_ntt_equals_tables(name, n, ntt_mode):
    if ntt_mode == "one launch" and n in (64, 256):
        pytest.skip("the row program's passes: 32 (4+1) and 2048 (4+4+2+1) here, 64 (4+2) below")
    primes = BASES[name] if n == 256 else BASES[name][:4]  # elsewhere: the wide run, a narrow limb
    tables = NttTables(Basis.of(primes), n)
    # a non-contiguous [2, 2, L, N] input, lazy (-q, q) like the transforms accept
    x = _residues(primes, (2, 2), n, seed=n, signed=True).transpose(0, 1)
    fw = ntt_triton(tables, x, inverse=False)
    assert torch.equal(fw, tables.twin(x, inverse=False))
    back = ntt_triton(tables, fw, inverse=True)
    assert torch.equal(back, tables.twin(fw, inverse=True))
    assert torch.equal(back, torch.where(x < 0, x + tables.basis.q, x))  # the round trip


@pytest.mark.parametrize("name", list(BASES))
def test_ntt_lifted_and_centred_equal_tables(name, ntt_mode):
    """The forward from integer coefficients (``NttTables.lift``: each limb's reduction in the
    first launch) and the inverse centred in its last launch (``inverse_centred``)."""
    primes, n = BASES[name], 64
    tables = NttTables(Basis.of(primes), n)
    rng = np.random.default_rng(11)
    coeffs = torch.from_numpy(rng.integers(-(2**62) + 1, 2**62, (3, n), dtype=np.int64))
    coeffs[0, :4] = torch.tensor([2**62 - 1, -(2**62) + 1, 0, -1])
    fw = ntt_triton(tables, coeffs, inverse=False, lift=True)
    assert fw.shape == (3, len(primes), n)
    assert torch.equal(fw, tables.twin(tables.basis.reduce(coeffs.unsqueeze(-2)), inverse=False))
    centred = ntt_triton(tables, fw, inverse=True, centre=True)
    assert torch.equal(centred, tables.basis.center(tables.twin(fw, inverse=True)))
    with pytest.raises(ValueError, match="expected"):
        ntt_triton(tables, coeffs, inverse=True, lift=True)


def test_ntt_of_a_level_view(ntt_mode):
    """``RnsContext`` hands out tables of limb runs (views of the master tables with offsets):
    a data level's run starts inside the wide run."""
    tables = NttTables(Basis.of(PROT[-1:] + PROT[:-1]), 2048).limbs(slice(1, 4))
    x = _residues(tables.basis.primes, (1,), 2048, seed=3)
    fw = ntt_triton(tables, x, inverse=False)
    assert torch.equal(fw, tables.twin(x, inverse=False))
    assert torch.equal(ntt_triton(tables, fw, inverse=True), x)


# ---- key switching ---------------------------------------------------------------------------------
def _key_view(primes, digits: int, n: int, seed: int) -> torch.Tensor:
    """A key ``[2, digits, L, N]`` as ``SwitchKey.at`` gives it: a strided view of a larger key."""
    full = _residues(primes + primes[:1], (2, digits + 1), n, seed)
    return full[:, :digits, : len(primes)]


@pytest.mark.parametrize("name", list(BASES))
def test_key_inner_equals_twin(name):
    primes, n, digits = BASES[name][:5], 256, 4
    basis = Basis.of(primes)
    d = _residues(primes, (2, digits), n, seed=1)
    key = _key_view(primes, digits, n, seed=2)
    assert not key.is_contiguous()
    want = rns._key_inner(d, key, basis)
    assert torch.equal(ckks_ops.key_inner_triton(d, key, basis), want)
    assert torch.equal(rns.key_inner(d, key, basis), want)  # the CPU dispatch
    strided = d.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    assert not strided.is_contiguous()
    assert torch.equal(ckks_ops.key_inner_triton(strided, key, basis), want)


@pytest.mark.parametrize("name", list(BASES))
def test_key_inner_with_a_key_per_row_equals_each_row_alone(name):
    """A batch of sessions (``NativeBatch``): row b's digits meet row b's key, and each of a
    hoisted set's steps its own row keys, in one launch; each key read in place."""
    primes, n, digits, rows = BASES[name][:4], 256, 3, 3
    basis = Basis.of(primes)
    d = _residues(primes, (rows, digits), n, seed=3)
    sets = [[_key_view(primes, digits, n, seed=10 + 3 * s + b) for b in range(rows)] for s in range(2)]
    want = torch.stack([torch.stack([rns._key_inner(d[b], keys[b], basis) for b in range(rows)])
                        for keys in sets])
    assert torch.equal(ckks_ops.key_inner_sets_triton(d, sets, basis), want)
    assert torch.equal(rns.key_inner_many(d, sets, basis), want)  # the CPU dispatch, row by row
    with pytest.raises(ValueError, match="do not match"):
        ckks_ops.key_inner_sets_triton(d[:2], sets, basis)


def test_key_inner_refuses_an_overflowing_digit_count():
    basis = Basis.of([P60[0]])
    d = torch.zeros(9, 1, 64, dtype=torch.int64)  # 9 * q > 2^63 > 8 * q
    with pytest.raises(ValueError, match="overflow"):
        ckks_ops.key_inner_triton(d, torch.zeros(2, 9, 1, 64, dtype=torch.int64), basis)


def _edges(q: int) -> list[int]:
    """Operands where a quotient estimate, a half-up tie or the 2^30 split is likeliest to slip."""
    s = 1 << 30
    vals = [0, 1, 2, q - 1, q - 2, (q - 1) // 2, (q + 1) // 2, s - 1, s, s + 1, q - s, q - s - 1,
            (q // s) * s, (q // s) * s - 1, math.isqrt(q), q // 3]
    return [v % q for v in vals]


@pytest.mark.parametrize("q", [PROT[0], PROT[2], P60[0], P60[1]], ids=lambda q: f"{q.bit_length()}bit")
def test_products_at_edges_equal_python_integers(q):
    """One-digit ``key_inner`` and one-term ``mac`` are element-wise products (the variable
    scheme); ``sub_mul_const`` with ``r = 0`` is the constant one. Reference: Python ints."""
    basis = Basis.of([q])
    e = _edges(q)
    rng = np.random.default_rng(q % 2**32)
    a = np.concatenate([np.repeat(e, len(e)), rng.integers(0, q, 256)]).astype(np.int64)
    b = np.concatenate([np.tile(e, len(e)), rng.integers(0, q, 256)]).astype(np.int64)
    want = (a.astype(object) * b.astype(object)) % q
    ta, tb = torch.from_numpy(a).view(1, 1, -1), torch.from_numpy(b).view(1, 1, -1)
    got = ckks_ops.key_inner_triton(ta, torch.stack([tb, tb]), basis)
    assert np.array_equal(got[0, 0].numpy().astype(object), want)
    assert np.array_equal(ckks_ops.mac_triton(ta, tb, basis)[0].numpy().astype(object), want)
    for w in e[1:6]:
        const = basis.const(torch.tensor([[w]]))
        got = ckks_ops.sub_mul_const_triton(ta[0], torch.zeros_like(ta[0]), const, basis)
        assert np.array_equal(got[0].numpy().astype(object), (a.astype(object) * w) % q)


# ---- multiply-accumulate and the rescale tail ------------------------------------------------------
@pytest.mark.parametrize("name", list(BASES))
def test_mac_equals_twin_and_the_sum_of_products(name):
    """9 terms: more than the 6 lazy 60-bit products an int64 holds, so the 60-bit limbs reduce
    their sum mid-way."""
    primes, n, terms = BASES[name][:4], 256, 9
    basis = Basis.of(primes)
    a = _residues(primes, (terms, 2, 2), n, seed=4)
    w = _residues(primes, (terms,), n, seed=5)
    got = ckks_ops.mac_triton(a, w, basis)
    assert torch.equal(got, ckks_ops.mac_torch(a, w, basis))
    want = torch.zeros_like(a[0])
    for k in range(terms):
        want = basis.add(want, basis.mul(a[k], w[k]))
    assert torch.equal(got, want)
    # a non-contiguous batch of terms (every other row of a larger stack)
    assert torch.equal(ckks_ops.mac_triton(a[:, :, ::2], w, basis), want[:, ::2])


@pytest.mark.parametrize("name", list(BASES))
@pytest.mark.parametrize("lead", [(2,), (3, 2)], ids=["session", "batch3"])
def test_mac_many_equals_twin_per_row(name, lead):
    """Every giant step of a product in one launch (``mac_many_triton``) = ``mac_torch`` per row:
    rows with terms left out (one row with a single term, one with all), against shared ``[L, N]``
    weights (some views into one larger tensor, as a product's encoded diagonals) and against a
    batch's per-row ``[B, 1, L, N]`` weights, or one polynomial per row (a batch's ct x ct); 9
    terms, so the 60-bit limbs reduce mid-way; 3 sessions are 3 tiles of rows."""
    primes, n, terms = BASES[name][:4], 256, 9
    basis = Basis.of(primes)
    a = _residues(primes, (terms, *lead), n, seed=11)
    big = _residues(primes, (2 * terms,), n, seed=12)
    shared = [big[2 * k] if k % 2 else _residues(primes, (), n, seed=20 + k) for k in range(terms)]
    holes = [[w if k % 3 != r else None for k, w in enumerate(shared)] for r in range(3)]
    rows = [*holes, [None] * (terms - 1) + [shared[-1]], shared]
    per_row = [_residues(primes, (*lead[:-1], 1), n, seed=40 + k) for k in range(terms)] if len(lead) > 1 else None
    cases = [rows] + ([[[w if k != 4 else None for k, w in enumerate(per_row)], per_row]] if per_row else [])
    for case in cases:
        got = ckks_ops.mac_many_triton(a, case, basis)
        assert got.shape == (len(case), *a.shape[1:])
        for o, row in enumerate(case):
            keep = [k for k, w in enumerate(row) if w is not None]
            want = ckks_ops.mac_torch(a[keep], [row[k] for k in keep], basis)
            assert torch.equal(got[o], want), (o, keep)
    assert torch.equal(ckks_ops.mac_many_triton(a, [shared], basis)[0], ckks_ops.mac_triton(a, torch.stack(shared), basis))
    # 20 lazy products of (q-1)/2 each, all of one sign: without the mid-way reductions the
    # int64 sum would pass 2^63 on the 60-bit limbs (random terms cancel and would not show it)
    q = torch.tensor(primes).view(-1, 1)
    half = ((q - 1) // 2).expand(len(primes), n).expand(20, *lead, len(primes), n)
    got = ckks_ops.mac_many_triton(half, [[torch.ones(len(primes), n, dtype=torch.int64)] * 20], basis)[0]
    exact = torch.tensor([(p - 1) // 2 * 20 % p for p in primes]).view(-1, 1)  # Python ints: no wrap
    assert torch.equal(got, exact.expand_as(got))
    with pytest.raises(ValueError, match="layout"):  # one weight of another shape
        ckks_ops.mac_many_triton(a, [shared[:-1] + [big[:2]]], basis)
    if len(lead) == 1:  # one weight per row, rows apart by a stride (a batch's ct x ct: its c0s)
        pair = _residues(primes, (lead[0] + 1, 2), n, seed=60)[1:]  # [R, 2, L, N], offset in its storage
        polys = list(pair.unbind(1))
        ct = _residues(primes, (2, lead[0]), n, seed=61)
        assert ckks_ops.mac_many_layout(ct.shape[1:], polys[0]) == (1, polys[0].stride(0))
        assert torch.equal(ckks_ops.mac_many_triton(ct, [polys], basis)[0], ckks_ops.mac_torch(ct, polys, basis))


@pytest.mark.parametrize("name", list(BASES))
def test_sub_mul_const_equals_twin(name):
    primes, n = BASES[name], 256
    basis = Basis.of(primes)
    const = basis.const(torch.tensor([[pow(7, -1, q)] for q in primes]))
    full = _residues(primes + primes[:1], (3,), n, seed=6)
    x = full[..., : len(primes), :]  # a strided slice, as rescale passes it
    r = _residues(primes, (3,), n, seed=7)
    got = ckks_ops.sub_mul_const_triton(x, r, const, basis)
    assert torch.equal(got, ckks_ops.sub_mul_const_torch(x, r, const, basis))
    # ModDown's plus: c0 of two ciphertexts added to the first polynomial of each, for a
    # hoisted set of 3 rotations ([3, 2 rows, 2 polys, L, N])
    xs = _residues(primes, (3, 2, 2), n, seed=8)
    rs = _residues(primes, (3, 2, 2), n, seed=9)
    plus = _residues(primes, (2, 2), n, seed=10)[:, :1]
    with_plus = ckks_ops.sub_mul_const_triton(xs, rs, const, basis, plus)
    assert torch.equal(with_plus, ckks_ops.sub_mul_const_torch(xs, rs, const, basis, plus))
    plain = ckks_ops.sub_mul_const_torch(xs, rs, const, basis)
    assert torch.equal(with_plus[:, :, 1], plain[:, :, 1])
    assert torch.equal(with_plus[:, :, 0], basis.add(plain[:, :, 0], plus[None, :, 0]))
    with pytest.raises(ValueError, match="plus"):
        ckks_ops.sub_mul_const_triton(xs, rs, const, basis, plus[:1])
    want = [[((int(u) - int(v)) * pow(7, -1, q)) % q for u, v in zip(xi, ri, strict=True)]
            for q, xi, ri in zip(primes, x[1].tolist(), r[1].tolist(), strict=True)]
    assert got[1].tolist() == want


@pytest.mark.parametrize("name", list(BASES))
def test_add_equals_twin(name):
    primes, n = BASES[name], 256
    basis = Basis.of(primes)
    full = _residues(primes, (2, 3), n, seed=12)
    x, y = full[:, :2], _residues(primes, (2, 2), n, seed=13)  # x a strided view
    edge = torch.tensor(primes).view(-1, 1) - 1  # q - 1 + q - 1: the largest sum
    x[0, 0], y[0, 0] = edge, edge
    got = ckks_ops.add_triton(x, y, basis)
    assert torch.equal(got, basis.add(x, y))
    with pytest.raises(ValueError, match="do not match"):
        ckks_ops.add_triton(x, y[:1], basis)


# ---- dispatch --------------------------------------------------------------------------------------
def test_cpu_tensors_take_the_twins_with_the_interpreter_off(monkeypatch):
    """With TRITON_INTERPRET=0 a kernel launch on CPU tensors raises (the control below), so the
    native backend's CPU operations working at all shows they never reach a kernel."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    p = get_params(TEST_PARAMS_ID, allow_test_params=True)
    ctx = RnsContext(p)
    basis, ntt = ctx.ext(1)
    x = _residues(basis.primes, (2,), ctx.n, seed=8)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        ntt_triton(ntt, x, inverse=False)
    fw = ntt.forward(x)
    assert torch.equal(ntt.inverse(fw), x)
    key = _residues(basis.primes, (2, 2), ctx.n, seed=9)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        ckks_ops.key_inner_triton(fw, key, basis)
    assert torch.equal(rns.key_inner(fw, key, basis), rns._key_inner(fw, key, basis))
    out = rns.mod_down(fw, ctx, 1)  # the sub_mul_const dispatch
    assert out.shape == (2, 2, ctx.n)
    assert not ckks_ops.use_triton(x)


# ---- the real compiler ------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
from veil.crypto.native.modarith import Basis
from veil.crypto.native.sampling import Stream
from veil.crypto.native.ntt import NttTables
from veil.crypto.params import PROTECTED_PARAMS, get_params
from veil.kernels import ckks_ntt, ckks_ops

launches = []
JITFunction.run = lambda self, *a, grid, warmup, **kw: launches.append((self, {**dict(zip(self.arg_names, a)), **kw}))
ckks_ntt.check_triton_device = ckks_ops.check_triton_device = lambda *t: None  # CPU stands in
primes = (PROTECTED_PARAMS.primes[-1],) + PROTECTED_PARAMS.primes[:3]
basis, n = Basis.of(primes), 2048
z = torch.zeros(2, 3, 4, n, dtype=torch.int64)
tables = NttTables(basis, n)
wide60 = Basis.of(get_params("ckks-n16384-l6-v1").primes[:2])  # reductions inside both runs
for one_launch in (0, 10**6):  # launches per group of stages, then a program per row
    ckks_ntt.ONE_LAUNCH_ROWS = one_launch
    ckks_ntt.ntt_triton(tables, z[0, :2, 0], False, lift=True)
    ckks_ntt.ntt_triton(tables, z[0, :2], True, centre=True)
    for inverse in (False, True):
        ckks_ntt.ntt_triton(tables, z[0, :2], inverse)
        ckks_ntt.ntt_triton(NttTables(wide60, n), z[0, :2, :2], inverse)
ckks_ops.key_inner_triton(z[:1], z, basis)
ckks_ops.mac_triton(z, z[0, :2].expand(2, 4, n), basis)
ckks_ops.mac_many_triton(z[:, :2], [[z[0, 0], None], [z[1, 0], z[1, 1]]], basis)  # a session: 2 rows of terms
rows16 = torch.zeros(2, 16, 2, 4, n, dtype=torch.int64)  # 16 sessions' per-row weights: 32 rows of terms
ckks_ops.mac_many_triton(rows16, [[torch.zeros(16, 1, 4, n, dtype=torch.int64)] * 2], basis)
ckks_ops.sub_mul_const_triton(z[0], z[0], basis.const(torch.ones(4, 1, dtype=torch.int64)), basis)
ckks_ops.sub_mul_const_triton(z[0], z[0], basis.const(torch.ones(4, 1, dtype=torch.int64)), basis, z[0, :1])
ckks_ops.add_triton(z[0], z[0], basis)
types = {torch.int64: "*i64", torch.int32: "*i32", torch.float64: "*fp64"}
seen = set()
for kernel, bound in launches:
    cx = {p.name: bound[p.name] for p in kernel.params if p.is_constexpr}
    key = (kernel.fn.__name__, tuple(sorted(cx.items())))
    if key in seen:
        continue
    seen.add(key)
    sig = {name: "constexpr" if name in cx else types[bound[name].dtype]
           if isinstance(bound[name], torch.Tensor) else "i64" for name in kernel.arg_names}
    ptx = triton.compile(ASTSource(kernel, sig, cx), target=GPUTarget("cuda", 90, 32),
                         options={"enable_fp_fusion": bound["enable_fp_fusion"],
                                  "num_warps": bound.get("num_warps", 4), "num_stages": bound.get("num_stages", 3)}).asm["ptx"]
    products = key[0] != "_add_kernel"  # the addition has no modular product
    assert "fma.rn.f64" not in ptx and (not products or "mul.lo.s64" in ptx and "cvt.rmi.f64.f64" in ptx), key
    print("ok", key)
assert {k[0] for k in seen} == {"_ntt_kernel", "_ntt_row_kernel", "_key_inner_kernel", "_mac_kernel",
                                "_mac_rows_kernel", "_sub_mul_kernel", "_add_kernel"}
ntt = [dict(k[1]) for k in seen if k[0] == "_ntt_kernel"]
assert {c["STAGES"] for c in ntt} == {1, 2, 4} and {c["LAST"] for c in ntt} == {0, 1, 2}
assert {c["LIFT"] for c in ntt} == {False, True}
print("compiled", len(seen), "variants")
"""


def test_ckks_kernels_compile_for_sm90():
    """Real Triton (no GPU needed: the bundled ptxas) compiles every kernel variant the launchers
    use, with int64 products as ``mul.lo.s64`` (wrapping, as the interpreter's), the rounding as
    ``cvt.rmi`` (floor) and no FMA contraction (``NO_FMA``)."""
    nvidia = pytest.importorskip("triton.backends.nvidia")
    if not (Path(nvidia.__file__).parent / "bin" / "ptxas").exists() \
            and not os.environ.get("TRITON_PTXAS_PATH"):
        pytest.skip("no ptxas available to Triton")
    assert NO_FMA == {"enable_fp_fusion": False}
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "compiled" in result.stdout, result.stdout


# ---- the CUDA code path of whole operations, on the CPU --------------------------------------------
def test_cuda_code_path_of_whole_operations_equals_the_cpu_path(he_pair, monkeypatch):
    """Rotations (single, hoisted, and a two-session batch's per-row keys), ct x ct with its
    relinearization and rescale, an addition, a ct x pt product and a product's giant steps
    (``dot_plain_many``: one session's, a batch's with shared and per-row plaintexts), a batch's
    ct x ct and ct x pt with per-row operands, and folded downloads (one session's, a batch's)
    take the Triton kernels (interpreted) through the backend, as on
    a GPU: every NTT over all runs of limbs in one launch per group of stages, a hoisted set's
    keys (and a batch's per-row keys) read in place by one key-switch launch, the tables of
    each level's view. Bit for bit what the CPU path gives. Test-only N=8192 set."""
    from veil.crypto.native.batch import NativeBatch

    p = get_params(TEST_PARAMS_ID, allow_test_params=True)
    steps = [1, -3, 100]
    pairs = [he_pair("native", p, steps) for _ in range(2)]
    rng = np.random.default_rng(5)
    cts = [s.deserialize(c.encrypt_to_bytes(rng.standard_normal(p.slot_count))) for c, s in pairs]
    server, batch = pairs[0][1], NativeBatch([s for _, s in pairs])

    def run():
        a, b = cts
        pt = server.encode(np.linspace(-1, 1, p.slot_count), level=server.level(a))
        ops = [server.rotate(a, 1), *server.rotate_many(a, steps), server.multiply(a, b),
               server.add(a, b), server.multiply_plain(a, pt)]
        ops += batch.unstack(batch.rotate_many(batch.stack(cts), steps[:2])[1])
        # a product's giant steps (rows with terms left out), one session's and a batch's
        # against shared and per-row plaintexts: one _mac_rows_kernel launch each
        pts = [server.encode(np.linspace(-1, 1, p.slot_count) * (k + 1) / 4, level=server.level(a)) for k in range(3)]
        ops += server.dot_plain_many([a, *server.rotate_many(a, steps[:2])], [[pts[0], None, pts[2]], [None, pts[1], None]])
        sb = batch.stack(cts)
        terms = [sb, *batch.rotate_many(sb, steps[:2])]
        rows = batch.stack_plain(pts[:2]), batch.stack_plain(pts[1:])
        for out in (*batch.dot_plain_many(terms, [[rows[0], None, rows[1]], [None, rows[1], rows[0]]]),
                    *batch.dot_plain_many(terms, [[pts[2], pts[0], None]]),
                    batch.multiply(sb, terms[1]), batch.multiply_plain(sb, rows[0])):  # per-row operands
            ops += batch.unstack(out)
        # folded downloads, one session's and a batch's (each row under its own fold key), their
        # randomness reproducible in this test only (a fixed-key stream for every fold)
        folds = [server.serialize_folded(a, 20.0), *batch.serialize_folded(sb, 20.0)]
        return [server._unwrap(ct).data for ct in ops], folds

    monkeypatch.setattr(ring_switch, "Stream", lambda: Stream(key=bytes(32)))
    want = run()
    launches = []
    real_run = triton.runtime.interpreter.InterpretedFunction.run
    monkeypatch.setattr(triton.runtime.interpreter.InterpretedFunction, "run",
                        lambda self, *a, **kw: launches.append(self.fn.__name__) or real_run(self, *a, **kw))
    for module in (rns, ntt_module, ckks_ops):
        monkeypatch.setattr(module, "use_triton", lambda t: True)
    monkeypatch.setattr(ckks_ntt, "check_triton_device", lambda *t: None)
    monkeypatch.setattr(ckks_ops, "check_triton_device", lambda *t: None)
    got = run()
    # rotate, the hoisted sets (3), relinearize (2), the batch's set; the two folds' key switches
    assert launches.count("_key_inner_kernel") == 7 + 2
    # the products; the batch's ct x ct and ct x pt; the batch's fold (each row's public key)
    assert launches.count("_mac_rows_kernel") == 3 + 3 + 1 + 1
    # and the batch's first row (session 0's ciphertext, key and stream) is the single fold's
    assert got[1] == want[1] and got[1][0] == got[1][1] != got[1][2]
    for w, g in zip(want[0], got[0], strict=True):
        assert torch.equal(w, g)

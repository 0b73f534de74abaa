"""The CPU kernels in C (``veil.kernels.ckks_cpu``) vs their torch twins, bit for bit: the NTT vs
``NttTables.twin``, the multiply-accumulate vs ``ckks_ops.mac_torch``; and the dispatch around them.

Bases as in ``test_ckks_kernels``: the production chain (57/55-bit and 36-bit primes), 60-bit
primes next to 50- and 40-bit ones (the kernel's lazy bounds need 4q < 2^64: 60 bits is the
widest the project uses), at a small N, at N=2048 and at the production N=16384 on a data
level's view of the master tables. The kernels are compiled on first use; without a C compiler
the module is skipped (the twins then run in production: the last test fakes a missing
compiler to check that).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from veil.crypto.native import rns
from veil.crypto.native.context import RnsContext
from veil.crypto.native.modarith import Basis
from veil.crypto.native.ntt import NttTables, automorphism_index
from veil.crypto.params import PROTECTED_PARAMS, TEST_PARAMS_ID, get_params
from veil.kernels import ckks_cpu, ckks_ops

PROT = PROTECTED_PARAMS.primes
MASTER = (PROT[-1],) + PROT[:-1]  # the backend's limb order [p, q_0, ...]
P60 = get_params("ckks-n16384-l6-v1").primes
MIXED = (P60[0], P60[-1], P60[1], get_params(TEST_PARAMS_ID, allow_test_params=True).primes[1])

pytestmark = pytest.mark.skipif(not ckks_cpu.available(),
                                reason="no C compiler (or VEIL_CPU_KERNELS=0): the twin runs")


def _signed(primes, lead: tuple[int, ...], n: int, seed: int) -> torch.Tensor:
    """Residues ``[*lead, L, N]`` in ``(-q, q)``, the lazy range both transforms accept, with the
    edges ``-(q-1)``, 0 and ``q-1`` in every limb."""
    rng = np.random.default_rng(seed)
    cols = [rng.integers(-q + 1, q, (*lead, n), dtype=np.int64) for q in primes]
    for c, q in zip(cols, primes, strict=True):
        c[..., :3] = (-q + 1, 0, q - 1)
    return torch.from_numpy(np.stack(cols, axis=-2))


@pytest.mark.parametrize("n", [16, 2048])
@pytest.mark.parametrize("primes", [MASTER, MIXED], ids=["protected", "60-50-40"])
def test_ntt_kernel_equals_twin(primes, n):
    tables = NttTables(Basis.of(primes), n)
    x = _signed(primes, (2, 3), n, seed=n).transpose(0, 1)  # non-contiguous, 6 rows per limb
    fw = ckks_cpu.ntt_cpu(primes, x, inverse=False)
    assert torch.equal(fw, tables.twin(x, inverse=False))
    back = ckks_cpu.ntt_cpu(primes, fw, inverse=True)
    assert torch.equal(back, tables.twin(fw, inverse=True))
    assert torch.equal(back, torch.where(x < 0, x + tables.basis.q, x))  # the round trip
    signed_ntt = torch.where(fw % 3 == 0, fw - tables.basis.q, fw)  # inverse of a lazy input
    assert torch.equal(ckks_cpu.ntt_cpu(primes, signed_ntt, inverse=True), back)
    # centred on the way out (ModUp's digits, ModDown's and the rescale's dropped limb)
    centred = ckks_cpu.ntt_cpu(primes, fw, inverse=True, centre=True)
    assert torch.equal(centred, tables.basis.center(back))
    assert torch.equal(tables.inverse_centred(fw), centred)  # dispatched
    half = (tables.basis.q >> 1).view(-1, 1)
    assert bool(((centred > -half - 1) & (centred <= half)).all()) and bool((centred < 0).any())
    with pytest.raises(ValueError, match="inverse"):
        ckks_cpu.ntt_cpu(primes, x, inverse=False, centre=True)


@pytest.mark.parametrize("start,stop", [(1, 4), (4, 5), (0, 5)])
def test_ntt_of_a_run_of_limbs_is_read_in_place(start, stop):
    """A run of limbs of a wider tensor (ModDown's and the rescale's dropped limb, a level's data
    limbs): the transform reads the view at its stride and equals the transform of a copy."""
    primes = MASTER[:5]
    wide = _signed(primes, (3, 2), 64, seed=start)
    x, run = wide[..., start:stop, :], primes[start:stop]
    assert not x.is_contiguous() or stop - start == len(primes)
    assert ckks_cpu._polys(x, stop - start).data_ptr() == x.data_ptr()  # a view, no copy
    for inverse in (False, True):
        assert torch.equal(ckks_cpu.ntt_cpu(run, x, inverse), ckks_cpu.ntt_cpu(run, x.contiguous(), inverse))
    assert torch.equal(ckks_cpu.ntt_cpu(run, x, False), NttTables(Basis.of(run), 64).twin(x.contiguous(), inverse=False))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_production_size_on_a_level_view_any_thread_count(threads):
    """A level's tables are a view into the master tables; the 12 rows (3 polynomials of 4
    limbs) split across 1-3 OpenMP threads, in chunks that start inside a polynomial."""
    ctx = RnsContext(PROTECTED_PARAMS)
    basis, tables = ctx.data(3)
    x = _signed(basis.primes, (3,), ctx.n, seed=threads)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fw = tables.forward(x)
        back = tables.inverse(fw)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(fw, tables.twin(x, inverse=False))
    assert torch.equal(back, tables.twin(fw, inverse=True))


def test_tables_dispatch_cpu_tensors_to_the_kernel(monkeypatch):
    tables = NttTables(Basis.of(MIXED), 64)
    x = _signed(MIXED, (1,), 64, seed=1)
    calls = []
    real = ckks_cpu.ntt_cpu
    monkeypatch.setattr(ckks_cpu, "ntt_cpu", lambda *a: calls.append(a[2]) or real(*a))
    tables.inverse(tables.forward(x))
    assert calls == [False, True]
    monkeypatch.setenv("VEIL_CPU_KERNELS", "0")  # the switch benchmarks use: the twin runs
    assert torch.equal(tables.forward(x), real(MIXED, x, False)) and calls == [False, True]


def _canonical(primes, lead, n, seed):
    x = _signed(primes, lead, n, seed)
    return torch.where(x < 0, x + torch.tensor(primes).view(-1, 1), x)


@pytest.mark.parametrize(("primes", "terms", "lead"), [
    (MASTER, 1, (2,)), (MASTER, 16, (2,)), (MASTER, 5, (3, 2)),
    (MIXED, 7, (2,)),
    (MIXED[:1], 300, (1,)),  # a 60-bit prime: past 256 products the 128-bit sum is reduced on the way
], ids=["protected-1", "protected-16", "protected-batch", "60-50-40", "60-bit-300-terms"])
def test_mac_equals_twin(primes, terms, lead):
    n = 1024 if terms < 100 else 16  # 1024: positions split across threads, blocks across limbs
    a = [_canonical(primes, lead, n, seed=k) for k in range(terms)]
    w = [_canonical(primes, (), n, seed=1000 + k) for k in range(terms)]
    want = ckks_ops.mac_torch(a, w, Basis.of(primes))
    assert torch.equal(ckks_cpu.mac_cpu(primes, a, w), want)
    assert torch.equal(ckks_ops.mac(a, w, Basis.of(primes)), want)  # the dispatch takes the kernel


@pytest.mark.parametrize("lead,w_lead", [((2,), ()), ((3, 2), (3, 1))], ids=["shared", "per-row"])
def test_mac_of_many_rows_equals_a_mac_per_row(lead, w_lead, monkeypatch):
    """``mac_many_cpu`` (a product's giant steps: the same 16 baby steps against 5 rows of
    plaintexts) equals ``mac_torch`` row by row, bit for bit, at N=16384 and on the lazy
    ``(-q, q)`` terms; ``rns.mac_many`` leaves a row's None terms out (zeros in the kernel, a
    shorter sum in the twin). Rows of the wrong length are refused."""
    ctx = RnsContext(PROTECTED_PARAMS)
    basis, _ = ctx.data(4)
    primes, n = basis.primes, ctx.n
    a = [_signed(primes, lead, n, seed=k) for k in range(16)]
    w = [[_canonical(primes, w_lead, n, seed=100 * o + k) for k in range(16)] for o in range(5)]
    got = ckks_cpu.mac_many_cpu(primes, a, w)
    assert got.shape == (5, *lead, len(primes), n)
    canon = [torch.where(t < 0, t + basis.q, t) for t in a]
    for o in range(5):
        assert torch.equal(got[o], ckks_ops.mac_torch(canon, w[o], basis))
    holes = [[None if (o + k) % 4 == 0 else w[o][k] for k in range(16)] for o in range(5)]
    want = [ckks_ops.mac_torch([t for t, x in zip(canon, row, strict=True) if x is not None],
                               [x for x in row if x is not None], basis) for row in holes]
    for got_o, want_o in zip(rns.mac_many(a, holes, basis), want, strict=True):
        assert torch.equal(got_o, want_o)
    monkeypatch.setattr(ckks_cpu, "available", lambda: False)  # the twin: a mac per row
    for got_o, want_o in zip(rns.mac_many(canon, holes, basis), want, strict=True):
        assert torch.equal(got_o, want_o)
    with pytest.raises(ValueError, match="rows of 16"):
        ckks_cpu.mac_many_cpu(primes, a, [w[0][:15]])


def test_ct_times_pt_is_the_one_term_kernel():
    """``rns.mul_plain`` (ct x pt) takes the kernel with one term and equals ``Basis.mul``, also on
    lazy ``(-q, q)`` ciphertext residues and with a batch's per-row plaintexts."""
    basis = Basis.of(MASTER)
    c, m = _signed(MASTER, (2, 2), 256, seed=8), _canonical(MASTER, (), 256, seed=9)
    assert torch.equal(rns.mul_plain(c, m, basis), basis.mul(c, m))
    assert torch.equal(ckks_cpu.mac_cpu(MASTER, [c], [m]), basis.mul(c, m))
    rows = _canonical(MASTER, (2, 1), 256, seed=10)
    assert torch.equal(rns.mul_plain(c, rows, basis), basis.mul(c, rows))


def test_mac_edges_and_shapes():
    for q in (MIXED[0], PROT[0], PROT[1]):  # 60, 57, 55 bits: the three columns, carried every 1024 terms
        top = torch.full((1, 1, 16), q - 1, dtype=torch.int64)
        for terms in (1, 600, 1024, 1025, 2100):
            got = ckks_cpu.mac_cpu((q,), [top] * terms, [top[0]] * terms)
            assert got.flatten().tolist() == [terms * (q - 1) ** 2 % q] * 16, (q, terms)
    for q in (MIXED[2], MIXED[3], PROT[2]):  # below 2^50 (the IFMA halves, reduced every 8 terms): 50, 40, 36 bits
        top = torch.full((1, 1, 16), q - 1, dtype=torch.int64)
        for terms in (7, 8, 9, 600):
            got = ckks_cpu.mac_cpu((q,), [top] * terms, [top[0]] * terms)
            assert got.flatten().tolist() == [terms * (q - 1) ** 2 % q] * 16, (q, terms)
    view = _canonical(MASTER, (2,), 64, seed=5)[:, :, ::2]  # non-contiguous terms are copied
    w = _canonical(MASTER, (), 32, seed=6)
    assert torch.equal(ckks_cpu.mac_cpu(MASTER, [view], [w]), ckks_ops.mac_torch([view], [w], Basis.of(MASTER)))
    with pytest.raises(ValueError, match="one shape"):
        ckks_cpu.mac_cpu(MIXED, [torch.zeros(2, 4, 16, dtype=torch.int64), torch.zeros(1, 4, 16, dtype=torch.int64)],
                         [torch.zeros(4, 16, dtype=torch.int64)] * 2)
    with pytest.raises(ValueError, match="terms against"):
        ckks_cpu.mac_cpu(MIXED, [torch.zeros(4, 16, dtype=torch.int64)], [])


@pytest.mark.parametrize("lead", [(), (3,)], ids=["one", "rows"])
def test_key_inner_equals_twin(lead):
    """A key's view for a lower level (a run of limbs of the master key, as ``SwitchKey.at``
    hands out), digits with leading rows; 8 digits at the production N (the IFMA path's flush)."""
    for n, digits in ((1024, 3), (16384, 9)):
        master = torch.stack([_canonical(MASTER, (digits,), n, seed=20 + o) for o in range(2)])  # [2, K, 9, N]
        run = slice(0, 5)
        primes, key = MASTER[run], master[:, :, run]
        d = _canonical(primes, (*lead, digits), n, seed=7)
        want = rns._key_inner(d, key, Basis.of(primes))
        assert torch.equal(ckks_cpu.key_inner_cpu(primes, d, [key])[0], want)
        assert torch.equal(rns.key_inner(d, key, Basis.of(primes)), want)  # dispatched
        strided = key.transpose(-1, -2).contiguous().transpose(-1, -2)  # coefficients not adjacent: copied first
        assert strided.stride(-1) != 1 and torch.equal(ckks_cpu.key_inner_cpu(primes, d, [strided])[0], want)


@pytest.mark.parametrize("lead", [(), (3,)], ids=["one", "rows"])
def test_key_inner_of_a_hoisted_set_equals_twin_key_by_key(lead):
    """A hoisted set's keys in one call (each block of digits read once for every key): key s's
    result lands at ``[s, *rows, 2, L, N]``, equal to the twin's product with that key alone;
    three keys, so the last pair of outputs is the kernel's third, and level views of the keys."""
    for n, digits in ((1024, 3), (16384, 9)):
        run = slice(0, 5)
        primes = MASTER[run]
        keys = [torch.stack([_canonical(MASTER, (digits,), n, seed=40 + 2 * s + o) for o in range(2)])[:, :, run]
                for s in range(3)]
        d = _canonical(primes, (*lead, digits), n, seed=8)
        want = torch.stack([rns._key_inner(d, key, Basis.of(primes)) for key in keys])
        assert torch.equal(ckks_cpu.key_inner_cpu(primes, d, keys), want)
        assert torch.equal(rns.key_inner_many(d, keys, Basis.of(primes)), want)  # dispatched
        assert torch.equal(ckks_cpu.key_inner_cpu(primes, d, keys[1:2])[0], want[1])  # one key alone


@pytest.mark.parametrize("lead", [(3,), (3, 2)], ids=["rows", "rows-inner"])
def test_key_inner_of_per_row_keys_equals_twin_row_by_row(lead):
    """A batch of sessions (``RowKeys``): each step's key is one per row, each its own tensor
    (read in place, not stacked); row b's result is the twin's product of row b's digits with
    row b's key, for every step of a hoisted set. A step whose key every row shares may sit
    beside per-row ones (``rns.key_inner_many`` repeats it per row)."""
    for n, digits in ((1024, 3), (16384, 9)):
        run = slice(0, 5)
        primes, basis = MASTER[run], Basis.of(MASTER[run])
        keys = [[torch.stack([_canonical(MASTER, (digits,), n, seed=60 + 6 * s + 2 * b + o) for o in range(2)])[:, :, run]
                 for b in range(lead[0])] for s in range(2)]
        d = _canonical(primes, (*lead, digits), n, seed=9)
        want = torch.stack([torch.stack([rns._key_inner(d[b], key[b], basis) for b in range(lead[0])]) for key in keys])
        assert torch.equal(ckks_cpu.key_inner_cpu(primes, d, keys), want)
        shared = keys[0][1]
        for mixed in (ckks_cpu.key_inner_cpu(primes, d, [keys[1], shared]),
                      rns.key_inner_many(d, [keys[1], shared], basis)):  # direct, dispatched
            assert torch.equal(mixed[0], want[1])
            assert torch.equal(mixed[1], rns._key_inner(d, shared, basis))
    with pytest.raises(ValueError, match="one per row"):
        ckks_cpu.key_inner_cpu(primes, d, [keys[0][:2]])


@pytest.mark.parametrize(("lead", "w_lead"), [((3, 2), (3, 1)), ((2,), (2,)), ((2, 2), (1, 1))],
                         ids=["batch-ct", "rows", "ones"])
def test_mac_per_row_weights_equal_twin(lead, w_lead):
    """A batch's per-row plaintexts (``[B, 1, L, N]`` against ciphertexts ``[B, 2, L, N]``: the
    first protected layer's shuffled weights, per-row RoPE factors and masks) take the kernel,
    each row reading its own session's weights; ct x pt (``rns.mul_plain``) too."""
    basis = Basis.of(MASTER)
    a = [_canonical(MASTER, lead, 256, seed=k) for k in range(5)]
    w = [_canonical(MASTER, w_lead, 256, seed=30 + k) for k in range(5)]
    assert ckks_ops.kernel_takes_mac(a, w)
    want = ckks_ops.mac_torch(a, w, basis)
    assert torch.equal(ckks_cpu.mac_cpu(MASTER, a, w), want)
    assert torch.equal(ckks_ops.mac(a, w, basis), want)
    assert torch.equal(rns.mul_plain(a[0], w[0], basis), basis.mul(a[0], w[0]))


def test_mac_weights_the_kernel_cannot_read_take_the_twin(monkeypatch):
    """Weights that broadcast other than per row (``[1, 2, L, N]`` against ``[3, 2, L, N]``),
    or of mixed shapes, go to the twin."""
    a = [_canonical(MIXED, (3, 2), 16, seed=k) for k in range(2)]
    cols = [_canonical(MIXED, (1, 2), 16, seed=10 + k) for k in range(2)]
    assert ckks_cpu.row_weights(a[0].shape, cols[0].shape) is None
    assert not ckks_ops.kernel_takes_mac(a, cols)
    assert not ckks_ops.kernel_takes_mac(a, [cols[0][0, 0], cols[1]])
    with pytest.raises(ValueError, match="one shape"):
        ckks_cpu.mac_cpu(MIXED, a, cols)
    monkeypatch.setattr(ckks_cpu, "mac_cpu", lambda *x: pytest.fail("the kernel took weights it cannot read"))
    assert torch.equal(ckks_ops.mac(a, cols, Basis.of(MIXED)), ckks_ops.mac_torch(a, cols, Basis.of(MIXED)))


def test_refuses_what_it_cannot_transform():
    with pytest.raises(ValueError, match="below 2\\^62"):
        ckks_cpu.ntt_cpu((2**62 + 1,), torch.zeros(1, 16, dtype=torch.int64), inverse=False)
    with pytest.raises(ValueError, match="int64 CPU residues"):
        ckks_cpu.ntt_cpu(MIXED, torch.zeros(3, 16, dtype=torch.int64), inverse=False)  # 3 limbs, 4 primes
    with pytest.raises(ValueError, match="int64 CPU residues"):
        ckks_cpu.ntt_cpu(MIXED[:1], torch.zeros(1, 16, dtype=torch.int32), inverse=False)


def test_without_a_compiler_the_twin_runs(monkeypatch, tmp_path):
    """A machine without a working ``cc``: the build fails, ``available()`` is false, and the
    tables still transform (through the twin)."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("VEIL_KERNEL_CACHE", str(tmp_path / "cache"))
    ckks_cpu._library.cache_clear()
    try:
        assert not ckks_cpu.available()
        tables = NttTables(Basis.of(MIXED), 16)
        x = _signed(MIXED, (1,), 16, seed=2)
        assert torch.equal(tables.inverse(tables.forward(x)), torch.where(x < 0, x + tables.basis.q, x))
        a, w = [_canonical(MIXED, (2,), 16, seed=3)], [_canonical(MIXED, (), 16, seed=4)]
        assert not ckks_ops.kernel_takes_mac(a, w)
        ckks_ops.mac(a, w, Basis.of(MIXED))  # the twin
    finally:
        ckks_cpu._library.cache_clear()  # the next caller loads the real build again


def test_the_vector_lanes_run_where_the_cpu_has_them():
    """On an x86 CPU with AVX-512 IFMA and DQ the kernels run their 8-lane code (the NTT for every
    prime of the bases above, 52-bit products below 2^50 and 64-bit ones above; the
    multiply-accumulate below 2^50), so the tests above check it against the twin there; without
    IFMA (or with VEIL_CPU_IFMA=0) the NTT runs on AVX2's 4 lanes where the CPU has AVX2 and FMA
    (not with VEIL_CPU_AVX2=0): in doubles for primes below 2^44, on 64-bit integers built from
    32-bit products above; the rest, the scalar loops."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        flags = set()
    ifma = {"avx512f", "avx512dq", "avx512ifma"} <= flags and os.environ.get("VEIL_CPU_IFMA", "1") != "0"
    avx2 = {"avx2", "fma"} <= flags and os.environ.get("VEIL_CPU_AVX2", "1") != "0"
    ckks_cpu.ntt_cpu(PROT[2:3], torch.zeros(1, 16, dtype=torch.int64), inverse=False)  # the choice is made
    assert ckks_cpu.ntt_vectorized() == ifma
    n = PROTECTED_PARAMS.poly_modulus_degree
    for q in (PROT[2], MIXED[3], MIXED[2], PROT[0], MIXED[0]):  # 36, 40, 50, 57, 60 bits
        assert ckks_cpu.ntt_path(q, n) == ("avx512" if ifma else "avx2" if avx2 else "scalar")
    assert ckks_cpu.ntt_path(PROT[2], 8) == "scalar"


# The transforms' and the multiply-accumulate's tests: what test_the_slower_lanes_equal_the_twin_too runs again
_TRANSFORMS = ("ntt_kernel or run_of_limbs or production_size or dropping or mod_down or modup or vector_lanes or mac or "
               "key_inner")


@pytest.mark.parametrize("off", [("VEIL_CPU_IFMA",), ("VEIL_CPU_IFMA", "VEIL_CPU_AVX2")], ids=["no-ifma", "scalar"])
def test_the_slower_lanes_equal_the_twin_too(off):
    """A process takes the fastest lanes its CPU has, once, so the tests above check only those;
    here the transforms' tests run again in a fresh interpreter with the faster lanes turned off:
    the AVX2 lanes on a CPU with IFMA, and the scalar loops on any CPU (where this process runs
    the lanes asked for already, the tests above were that run)."""
    lanes = ckks_cpu.ntt_path(PROT[2], PROTECTED_PARAMS.poly_modulus_degree)
    if lanes == ("avx2" if len(off) == 1 else "scalar"):
        pytest.skip(f"this process runs the {lanes} lanes: the tests above checked them")
    env = {**os.environ, **dict.fromkeys(off, "0")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", _TRANSFORMS],
                       cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and " passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


@pytest.mark.parametrize("level", [7, 1])
def test_dropping_a_limb_equals_the_twin(level):
    """The tail of a rescale and of ModDown: the dropped limb's centred coefficients, reduced
    and transformed in every remaining limb in one pass (``ntt_reduced_cpu``), and
    ``(x - r) * c`` (``sub_mul_cpu``) equal the torch reduction, NTT and ``sub_mul_const_torch``
    bit for bit (57/55-bit limbs scalar, 36-bit ones IFMA where the CPU has it)."""
    ctx = RnsContext(PROTECTED_PARAMS)
    basis, tables = ctx.data(level)
    p = ctx.special_prime
    rng = np.random.default_rng(level)
    r = torch.from_numpy(rng.integers(-(p // 2), p // 2 + 1, (3, 2, 1, ctx.n), dtype=np.int64))
    r[0, 0, 0, :2] = torch.tensor([-(p // 2), p // 2])
    got = ckks_cpu.ntt_reduced_cpu(basis.primes, r)
    assert torch.equal(got, tables.twin(basis.reduce(r), inverse=False))
    x = _canonical(basis.primes, (3, 2), ctx.n, seed=level)
    want = ckks_ops.sub_mul_const_torch(x, got, ctx.p_inv(level), basis)
    consts = tuple(pow(p, -1, q) for q in basis.primes)
    assert torch.equal(ckks_cpu.sub_mul_cpu(basis.primes, x, got, consts), want)
    wider = torch.cat((torch.zeros_like(x[..., :1, :]), x), dim=-2)  # ModDown's [p, q_0..]: read in place
    assert torch.equal(ckks_cpu.sub_mul_cpu(basis.primes, wider[..., 1:, :], got, consts), want)
    assert torch.equal(ckks_cpu.sub_mul_cpu(basis.primes, x.transpose(0, 1), got.transpose(0, 1), consts),
                       want.transpose(0, 1))  # rows not at one stride: copied
    with pytest.raises(ValueError, match="one shape"):
        ckks_cpu.sub_mul_cpu(basis.primes, x, got[:1], consts)
    with pytest.raises(ValueError, match="\\[..., 1,"):
        ckks_cpu.ntt_reduced_cpu(basis.primes, x)


@pytest.mark.parametrize("level", [7, 1])
def test_mod_down_adds_c0_in_its_last_pass(level, monkeypatch):
    """``sub_mul_cpu(plus=)``: a key switch's output pairs meet the ciphertext's c0 (C = 1, the
    pairs' first: a rotation, broadcast over a hoisted set) or c0 and c1 (C = 2: a
    relinearization) in ModDown's last pass, bit for bit what the twin's separate addition gives;
    ``rns.mod_down(plus=)`` dispatches to it, the twin path adds after. Shapes that do not pair
    up are refused."""
    ctx = RnsContext(PROTECTED_PARAMS)
    basis, _ = ctx.data(level)
    p = ctx.special_prime
    consts = tuple(pow(p, -1, q) for q in basis.primes)
    x = _canonical(basis.primes, (3, 2, 2), ctx.n, seed=40 + level)  # [S=3, rows=2, pair, L, N]
    r = _canonical(basis.primes, (3, 2, 2), ctx.n, seed=50 + level)
    base = ckks_cpu.sub_mul_cpu(basis.primes, x, r, consts)
    for c in (1, 2):
        plus = _canonical(basis.primes, (2, c), ctx.n, seed=60 + c)
        want = base.clone()
        want[..., :c, :, :] = basis.add(base[..., :c, :, :], plus)
        assert torch.equal(ckks_cpu.sub_mul_cpu(basis.primes, x, r, consts, plus), want)
        assert torch.equal(ckks_cpu.sub_mul_cpu(basis.primes, x, r, consts, plus.transpose(0, 1).transpose(0, 1)),
                           want)
    with pytest.raises(ValueError, match="plus"):
        ckks_cpu.sub_mul_cpu(basis.primes, x, r, consts, _canonical(basis.primes, (3, 1), ctx.n, seed=1))
    with pytest.raises(ValueError, match="plus"):
        ckks_cpu.sub_mul_cpu(basis.primes, x, r, consts, _canonical(basis.primes, (2, 3), ctx.n, seed=1))
    ext_basis, _ = ctx.ext(level)
    wide = _canonical(ext_basis.primes, (3, 2, 2), ctx.n, seed=70 + level)  # a key switch's [.., 2, p+Q, N]
    c0 = _canonical(basis.primes, (2, 1), ctx.n, seed=80)
    want = rns.mod_down(wide, ctx, level)
    want[..., :1, :, :] = basis.add(want[..., :1, :, :], c0)
    assert torch.equal(rns.mod_down(wide, ctx, level, plus=c0), want)
    monkeypatch.setattr(ckks_cpu, "available", lambda: False)  # the twin path: ModDown, then the addition
    assert torch.equal(rns.mod_down(wide, ctx, level, plus=c0), want)


@pytest.mark.parametrize("lead", [(), (2,)], ids=["one", "rows"])
def test_modup_copies_each_digits_own_limb_and_equals_the_twin(lead):
    """ModUp (``rns.decompose``): digit j in its own prime q_j is the input's limb j, copied by
    ``ntt_reduced_cpu(..., same=c)`` instead of reduced and transformed; the digits equal the
    twin's (torch reduction and NTT of every limb) bit for bit, at levels 7 and 2."""
    ctx = RnsContext(PROTECTED_PARAMS)
    for level in (7, 2):
        basis, tables = ctx.data(level)
        ext_basis, ext_tables = ctx.ext(level)
        c = _canonical(basis.primes, lead, ctx.n, seed=30 + level)
        centred = basis.center(tables.twin(c, inverse=True))
        want = ext_tables.twin(ext_basis.reduce(centred.unsqueeze(-2)), inverse=False)
        assert torch.equal(ckks_cpu.ntt_reduced_cpu(ext_basis.primes, centred.unsqueeze(-2), same=c), want)
        assert torch.equal(rns.decompose(c, ctx, level), want)  # dispatched
    with pytest.raises(ValueError, match="same"):
        ckks_cpu.ntt_reduced_cpu(ext_basis.primes, centred.unsqueeze(-2), same=c[..., :1, :])


def test_gather_equals_twin_and_stays_inside_its_row():
    """``gather_cpu`` (a hoisted set's automorphisms, one index per group) equals ``torch.gather``;
    an index past N reads inside its row (masked), never past it."""
    from veil.crypto.native.ntt import automorphisms

    n = 2048
    x = _signed(MASTER, (3, 2), n, 7)
    index = torch.stack([automorphism_index(g, n) for g in (3, 5, 2 * n - 1)])
    want = torch.stack([x[i].index_select(-1, index[i]) for i in range(3)])
    assert torch.equal(ckks_cpu.gather_cpu(x, index), want)
    assert torch.equal(automorphisms(x, index), want)  # dispatched
    far = ckks_cpu.gather_cpu(x[:1], torch.full((1, n), n + 5))
    assert torch.equal(far, x[:1, ..., 5:6].expand(far.shape))
    with pytest.raises(ValueError):
        ckks_cpu.gather_cpu(x[..., :1000], index[:, :1000])  # not a power of two


@pytest.mark.parametrize("primes", [MASTER, MIXED], ids=["protected", "60-50-40"])
def test_add_equals_twin_at_the_edges(primes, monkeypatch):
    """``add_cpu`` (the evaluator's additions) equals ``Basis.add`` bit for bit, the sums of the
    edges included (q - 1 + q - 1 lands on q - 2, 1 + q - 1 on 0); ``rns.add`` dispatches to it."""
    basis = Basis.of(primes)
    x, y = _canonical(primes, (2, 3), 64, seed=11), _canonical(primes, (2, 3), 64, seed=12)
    q = basis.q.view(-1, 1)
    x[..., :4] = torch.cat([q - 1, q - 1, q * 0, q * 0 + 1], 1)
    y[..., :4] = torch.cat([q - 1, q * 0, q * 0, q - 1], 1)
    want = basis.add(x, y)
    assert torch.equal(ckks_cpu.add_cpu(primes, x, y), want)
    assert torch.equal(want[..., :4], torch.cat([q - 2, q - 1, q * 0, q * 0], 1).expand(2, 3, -1, -1))
    calls = []
    monkeypatch.setattr(ckks_cpu, "add_cpu", lambda *a: calls.append(a) or basis.add(*a[1:]))
    assert torch.equal(rns.add(x[:, 1:], y[:, 1:], basis), want[:, 1:]) and len(calls) == 1  # dispatched
    monkeypatch.undo()
    with pytest.raises(ValueError):
        ckks_cpu.add_cpu(primes, x, y[:1])

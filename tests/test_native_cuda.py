"""The native backend on CUDA computes the same residues as on the CPU, bit for bit.

Runs only where torch sees a CUDA device (skipped elsewhere). The arithmetic is exact modular
arithmetic (the float64 quotient estimates only choose a representative that the final
reduction fixes), so a server on the GPU must produce byte-identical ciphertexts to a server
on the CPU fed the same upload, the same public keys and the same plaintexts. Encoding is not
exact (a complex FFT on each device, rounded): the tests below encode on the CPU and hand both
servers that plaintext, and ``test_cuda_encoding_matches_cpu`` bounds how far the devices'
encodings differ.
"""

import os

import numpy as np
import pytest
import torch

from veil.crypto.backend import Plaintext, make_backend
from veil.crypto.linear import (
    EncodedMatrix,
    EntryBounds,
    encode_matrices,
    encode_matrix,
    matvec,
    plan_matvec,
    replicate_input,
)
from veil.crypto.native import rns
from veil.crypto.native.context import RnsContext, galois_element
from veil.crypto.native.ntt import automorphisms
from veil.crypto.params import PROTECTED_PARAMS
from veil.kernels import ckks_arith, ckks_ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

P = PROTECTED_PARAMS
SLOTS = P.slot_count
PRODUCT = plan_matvec(64, 64, SLOTS, "bsgs", 8)
STEPS = sorted({1, -3, 100} | set(PRODUCT.rotation_steps))


@pytest.fixture(scope="module")
def servers():
    client = make_backend(P, "native")
    client.generate_keys(STEPS)
    material = client.export_public_material()
    cpu, gpu = make_backend(P, "native"), make_backend(P, "native", device="cuda")
    for s in (cpu, gpu):
        s.import_public_material(material)
    return client, cpu, gpu


def _to(s, pt: Plaintext) -> Plaintext:
    """A plaintext on ``s``'s device."""
    return Plaintext(pt._obj.to(s.device), pt.params_id, pt.level, pt.scale, pt.nbytes)


def _matrix_to(s, m: EncodedMatrix) -> EncodedMatrix:
    return EncodedMatrix(m.params_id, m.level, m.plan, {u: _to(s, pt) for u, pt in m.plaintexts.items()})


def _both(servers, fn):
    client, cpu, gpu = servers
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal(SLOTS) * 0.5, rng.standard_normal(SLOTS) * 0.5
    up_x, up_y = client.encrypt_to_bytes(x), client.encrypt_to_bytes(y)
    out = []
    for s in (cpu, gpu):
        enc = lambda v, level, s=s: _to(s, cpu.encode(v, level=level))  # noqa: E731
        out.append(s.serialize(fn(s, enc, s.deserialize(up_x), s.deserialize(up_y), x, y)))
    return client, out


@pytest.mark.parametrize("op", ["multiply_plain", "rotate", "rotate_many", "rotate_many_wide", "multiply",
                                "relinearize_after_rescale", "dot_plain", "dot_plain_many"])
def test_cuda_server_equals_cpu_server_bit_for_bit(servers, op):
    def fn(s, enc, a, b, x, y):
        if op == "multiply_plain":
            return s.multiply_plain(a, enc(y, s.level(a)))
        if op == "rotate":
            return s.rotate(a, 100)
        if op == "rotate_many":
            return s.add(*s.rotate_many(a, [1, -3]))
        if op == "rotate_many_wide":  # a hoisted set's key products in one call
            rots = s.rotate_many(a, PRODUCT.rotation_steps[:8])
            return s.add(s.add(rots[0], rots[3]), rots[-1])
        if op == "multiply":
            return s.multiply(a, b)
        if op == "relinearize_after_rescale":  # the scores' and h²'s order: one limb fewer
            return s.relinearize(s.multiply(a, b, relinearize=False))
        if op == "dot_plain_many":
            rows = [[enc(x, s.level(a)), None], [enc(y, s.level(a)), enc(x, s.level(a))]]
            return s.add(*(s.rescale(c) for c in s.dot_plain_many([a, b], rows)))
        return s.rescale(s.dot_plain([a, b], [enc(x, s.level(a)), enc(y, s.level(a))]))

    client, (cpu_bytes, gpu_bytes) = _both(servers, fn)
    assert cpu_bytes == gpu_bytes


def test_cuda_matvec_decrypts_to_the_product(servers):
    client, cpu, gpu = servers
    rng = np.random.default_rng(6)
    w, v = rng.standard_normal((64, 64)) / 8, rng.standard_normal(64)
    up = client.encrypt_to_bytes(replicate_input(v, SLOTS))
    outs, enc = [], encode_matrix(cpu, w, P.top_level, n1=8)
    for s in (cpu, gpu):
        outs.append(s.serialize(matvec(s, _matrix_to(s, enc), s.deserialize(up))))
    assert outs[0] == outs[1]
    got = client.decrypt(client.deserialize(outs[1]))[:64]
    np.testing.assert_allclose(got, w @ v, atol=1e-4)


def test_cuda_session_batch_equals_each_cpu_row(servers):
    """A ``NativeBatch`` on the GPU (two rows: the same key set twice) gives each row the bytes
    the CPU server gives it alone: a product, hoisted rotations, a rotation and a ct x ct."""
    client, cpu, gpu = servers
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 64)) / 8
    ups = [client.encrypt_to_bytes(replicate_input(rng.standard_normal(64), SLOTS)) for _ in range(2)]
    enc = encode_matrix(cpu, w, P.top_level, n1=8)

    def fn(s, ct):
        out = matvec(s, _matrix_to(s, enc), ct)
        return s.multiply(s.add(s.rotate(out, 100), s.rotate_many(out, [1, -3])[1]), out)

    batch = gpu.batched([gpu, gpu])
    rows = batch.unstack(fn(batch, batch.stack([gpu.deserialize(u) for u in ups])))
    for up, row in zip(ups, rows, strict=True):
        assert gpu.serialize(row) == cpu.serialize(fn(cpu, cpu.deserialize(up)))


def test_cuda_batch_per_row_plaintexts_equal_each_cpu_row(servers):
    """A batch's giant steps against per-row plaintexts (the shuffled FFN's products, one
    ``mac_many_triton`` launch on the GPU) give each row the bytes the CPU server gives it alone."""
    client, cpu, gpu = servers
    rng = np.random.default_rng(10)
    ups = [client.encrypt_to_bytes(rng.standard_normal(SLOTS) * 0.5) for _ in range(2)]
    level = cpu.level(cpu.deserialize(ups[0]))
    pts = [[cpu.encode(rng.standard_normal(SLOTS) * 0.5, level=level) for _ in range(2)] for _ in range(2)]  # [row][term]

    def fn(s, terms, rows):
        outs = s.dot_plain_many([terms, s.rotate(terms, 1)], rows)
        return s.add(*(s.rescale(c) for c in outs))

    batch = gpu.batched([gpu, gpu])
    per_term = [batch.stack_plain([_to(gpu, pts[b][k]) for b in range(2)]) for k in range(2)]
    got = batch.unstack(fn(batch, batch.stack([gpu.deserialize(u) for u in ups]),
                           [[per_term[0], None], per_term]))
    for b, (up, row) in enumerate(zip(ups, got, strict=True)):
        want = fn(cpu, cpu.deserialize(up), [[pts[b][0], None], pts[b]])
        assert gpu.serialize(row) == cpu.serialize(want)


def test_cuda_encoding_matches_cpu(servers):
    """The two devices' encodings are one polynomial up to their FFTs' rounding: no coefficient
    differs by more than 1, and few differ at all."""
    _, cpu, gpu = servers
    x = np.random.default_rng(8).uniform(-50, 50, SLOTS)
    level = P.top_level
    basis, ntt = cpu._ctx.data(level)
    a, b = (ntt.inverse(s.encode(x, level=level)._obj.cpu()) for s in (cpu, gpu))
    diff = basis.center(basis.sub(a, b))[0]  # a coefficient's difference shows in every limb
    assert int(diff.abs().max()) <= 1 and int((diff != 0).sum()) < P.poly_modulus_degree // 20



def test_cuda_matrices_encoded_together_from_a_device_tensor(servers, monkeypatch):
    """The shuffled FFN's path on a GPU: ``encode_matrices`` gathers the diagonals from the
    weights' device tensor and encodes them in GPU-sized chunks; each equals the same device's
    ``encode_matrix`` of the host array, bit for bit; with the matrix's ``EntryBounds``, the same
    with no read from the device."""
    _, _, gpu = servers
    ws = np.random.default_rng(9).standard_normal((3, 96, 64))
    for m, w in zip(encode_matrices(gpu, gpu.encodable(ws), 4, n1=8), ws, strict=True):
        alone = encode_matrix(gpu, w, 4, n1=8)
        assert m.plaintexts.keys() == alone.plaintexts.keys()
        assert all(torch.equal(m.plaintexts[u]._obj, pt._obj) for u, pt in alone.plaintexts.items())
        assert all(pt.nonzero for pt in m.plaintexts.values())  # checked per chunk, not per product
    # permuted copies of one matrix with its EntryBounds (the shuffled FFN's): the same, unread
    reads = []
    for name in ("cpu", "tolist", "item"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _real=real, _n=name, **k: reads.append(_n) or _real(t, *a, **k))
    rng = np.random.default_rng(10)
    stack = gpu.encodable(ws[0])[torch.from_numpy(np.stack([rng.permutation(96) for _ in range(2)])).cuda()]
    without = encode_matrices(gpu, stack, 4, n1=8)
    reads.clear()
    bounded = encode_matrices(gpu, stack, 4, n1=8, entries=EntryBounds.of(ws[0]))
    assert not reads
    for a, b in zip(without, bounded, strict=True):
        assert a.plaintexts.keys() == b.plaintexts.keys()
        assert all(torch.equal(pt._obj, b.plaintexts[u]._obj) and b.plaintexts[u].nonzero for u, pt in a.plaintexts.items())

def test_the_device_budgets_bound_holds_the_shuffled_ffns_device_memory(ckpt):
    """``EncodedLayer.shuffle_bytes``, what ``--protected-device-gb`` reserves per position of a
    first-layer WEIGHTS step, bounds the device memory its shuffled W_gate|up and W_down keep
    (two rows, as a batch). The step's peak above it (the gathered float64 rows, the chunks being
    encoded) is printed: the budget does not count it."""
    from veil.protected.layouts import dims_of
    from veil.protected.weights import EncodedLayer, ffn_permutation, layer_weights_from_tensors

    gpu = make_backend(P, "native", device="cuda")
    dims = dims_of(ckpt.config, SLOTS)
    layer = EncodedLayer(gpu, layer_weights_from_tensors(ckpt.tensors, ckpt.config, 2, dims), dims, shuffled=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    kept = layer.shuffled_ffn(gpu, [ffn_permutation(dims.ffn) for _ in range(2)])
    torch.cuda.synchronize()
    held, peak = torch.cuda.memory_allocated() - before, torch.cuda.max_memory_allocated() - before
    print(f"figure protected.shuffle_bytes {layer.shuffle_bytes} held_2_rows {held} peak_2_rows {peak}")
    # the allocator rounds each block up (512 B) and the bound is exact for SmolLM2's shapes: 1% slack
    assert 0.99 * sum(m.nbytes for ms in kept for m in ms) <= held <= 1.01 * 2 * layer.shuffle_bytes


# ---- the Triton kernels of the native backend (veil.kernels.ckks_*) vs their CPU twins ------------
# On CUDA the backend's NTTs, key inner products and rescale / ModDown tails run as Triton kernels,
# but only with real Triton: under the interpreter (conftest's default) CUDA tensors take the torch
# twins (``ckks_arith.use_triton``), so these checks need TRITON_INTERPRET=0. The tests above then
# compare whole operations on the kernels with the CPU; these compare each kernel at N=16384.
needs_triton = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
                                  reason="the CKKS kernels run on the GPU with TRITON_INTERPRET=0")


@pytest.fixture(scope="module")
def contexts():
    return RnsContext(P), RnsContext(P, device="cuda")


def _res(primes, lead, seed, signed=False):
    rng = np.random.default_rng(seed)
    cols = [rng.integers(-q + 1 if signed else 0, q, (*lead, P.poly_modulus_degree), dtype=np.int64)
            for q in primes]
    return torch.from_numpy(np.stack(cols, axis=-2))


@needs_triton
def test_cuda_ntt_kernels_equal_cpu_twin(contexts):
    cpu, gpu = contexts
    level = P.top_level
    assert ckks_arith.use_triton(torch.zeros(1, device="cuda"))
    (basis, ntt), (_, ntt_gpu) = cpu.ext(level), gpu.ext(level)  # both schemes
    x = _res(basis.primes, (3,), 11, signed=True)
    fw = ntt.forward(x)
    assert torch.equal(ntt_gpu.forward(x.cuda()).cpu(), fw)
    assert torch.equal(ntt_gpu.inverse(fw.cuda()).cpu(), ntt.inverse(fw))
    (_, data), (_, data_gpu) = cpu.data(3), gpu.data(3)  # a level's view of the tables
    y = _res(data.basis.primes, (2,), 12)
    assert torch.equal(data_gpu.forward(y.cuda()).cpu(), data.forward(y))


@needs_triton
def test_cuda_key_inner_and_automorphisms_equal_cpu(contexts):
    cpu, gpu = contexts
    level = P.top_level
    (basis, _), (basis_gpu, _) = cpu.ext(level), gpu.ext(level)
    digits = level + 1
    d = _res(basis.primes, (digits,), 13)
    key = _res(basis.primes + basis.primes[:1], (2, digits + 1), 14)[:, :digits, : len(basis)]
    assert torch.equal(rns.key_inner(d.cuda(), key.cuda(), basis_gpu).cpu(), rns.key_inner(d, key, basis))
    gs = (galois_element(1, P.poly_modulus_degree), galois_element(-3, P.poly_modulus_degree))
    index = torch.stack([cpu.galois_index(g) for g in gs])
    x = torch.stack([d[:2], d[2:4]])
    got = automorphisms(x.cuda(), torch.stack([gpu.galois_index(g) for g in gs]))
    assert torch.equal(got.cpu(), automorphisms(x, index))


@needs_triton
def test_cuda_mac_and_rescale_tail_equal_cpu_twins(contexts):
    cpu, gpu = contexts
    level = P.top_level
    (basis, _), (basis_gpu, _) = cpu.data(level), gpu.data(level)
    # 70 terms: more than the 63 lazy 57-bit products an int64 holds (a reduction mid-way)
    a, w = _res(basis.primes, (70,), 15), _res(basis.primes, (70,), 16)
    assert torch.equal(ckks_ops.mac(a.cuda(), w.cuda(), basis_gpu).cpu(), ckks_ops.mac_torch(a, w, basis))
    x = _res(basis.primes, (2,), 17)
    assert torch.equal(rns.rescale(x.cuda(), gpu, level).cpu(), rns.rescale(x, cpu, level))
    ext, _ = cpu.ext(level)
    z = _res(ext.primes, (2,), 18)
    assert torch.equal(rns.mod_down(z.cuda(), gpu, level).cpu(), rns.mod_down(z, cpu, level))


def test_cuda_folds_downloads_and_refreshes_where_its_ciphertexts_live(servers):
    """The fold (``crypto/ring_switch.py``) runs on the server's device, its key held there: the
    CUDA server's folded download (level 1) and folded masked refresh (level 1 on 2^27, a
    polynomial in X²) decrypt as the CPU server's do (fresh randomness each: equal within the
    noise), and the refresh comes back exact after the client's re-encryption."""
    client, cpu, gpu = servers
    assert gpu._fold_key.switch[1].device.type == "cuda" and cpu._fold_key.switch[1].device.type == "cpu"
    half, scale = SLOTS // 2, 2.0**27
    v = np.random.default_rng(8).uniform(-10.0, 10.0, SLOTS)
    w = np.tile(v[:half], 2)
    for s in (cpu, gpu):
        down, _ = client.decrypt_folded(s.serialize_folded(s.deserialize(client.encrypt_to_bytes(v, 1), level=1), 18.0))
        assert np.abs(down - (v[:half] + v[half:])).max() < 0.01
        ct = s.deserialize(client.encrypt_to_bytes(w, 1, scale), level=1, scale=scale)
        masked, mask = s.mask_for_refresh(ct, fold=True)
        up = client.refresh_reencrypt_folded_to_bytes(s.serialize_folded_refresh(masked, 3.0))
        back = client.decrypt(cpu.deserialize(s.serialize(s.unmask_refresh(s.deserialize(up, scale=scale), mask))))
        assert np.abs(back - w).max() < 2.0**-10

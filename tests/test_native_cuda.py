"""The native backend on CUDA computes the same residues as on the CPU, bit for bit.

Runs only where torch sees a CUDA device (skipped elsewhere). The arithmetic is exact modular
arithmetic (the float64 quotient estimates only choose a representative that the final
reduction fixes), so a server on the GPU must produce byte-identical ciphertexts to a server
on the CPU fed the same upload and the same public keys.
"""

import numpy as np
import pytest
import torch

from veil.crypto.backend import make_backend
from veil.crypto.linear import encode_matrix, matvec, plan_matvec, replicate_input
from veil.crypto.params import PROTECTED_PARAMS

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


def _both(servers, fn):
    client, cpu, gpu = servers
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal(SLOTS) * 0.5, rng.standard_normal(SLOTS) * 0.5
    up_x, up_y = client.encrypt_to_bytes(x), client.encrypt_to_bytes(y)
    out = []
    for s in (cpu, gpu):
        out.append(s.serialize(fn(s, s.deserialize(up_x), s.deserialize(up_y), x, y)))
    return client, out


@pytest.mark.parametrize("op", ["multiply_plain", "rotate", "rotate_many", "multiply", "dot_plain"])
def test_cuda_server_equals_cpu_server_bit_for_bit(servers, op):
    def fn(s, a, b, x, y):
        if op == "multiply_plain":
            return s.multiply_plain(a, s.encode(y, level=s.level(a)))
        if op == "rotate":
            return s.rotate(a, 100)
        if op == "rotate_many":
            return s.add(*s.rotate_many(a, [1, -3]))
        if op == "multiply":
            return s.multiply(a, b)
        return s.rescale(s.dot_plain([a, b], [s.encode(x, level=s.level(a)), s.encode(y, level=s.level(a))]))

    client, (cpu_bytes, gpu_bytes) = _both(servers, fn)
    assert cpu_bytes == gpu_bytes


def test_cuda_matvec_decrypts_to_the_product(servers):
    client, cpu, gpu = servers
    rng = np.random.default_rng(6)
    w, v = rng.standard_normal((64, 64)) / 8, rng.standard_normal(64)
    up = client.encrypt_to_bytes(replicate_input(v, SLOTS))
    outs = []
    for s in (cpu, gpu):
        ct = s.deserialize(up)
        enc = encode_matrix(s, w, s.level(ct), n1=8)
        outs.append(s.serialize(matvec(s, enc, ct)))
    assert outs[0] == outs[1]
    got = client.decrypt(client.deserialize(outs[1]))[:64]
    np.testing.assert_allclose(got, w @ v, atol=1e-4)

"""``torch.compile`` of the native backend's hot loops gives the same residues as eager.

Opt-in (``VEIL_TEST_COMPILE=1``): compiling the stage kernels from a cold cache takes ~3 min
on the 2-core CI machine, more than the whole native suite. ``benchmarks/he_ops.py --compile``
checks the same equality on every operation it times.
"""

import os

import numpy as np
import pytest
import torch

from veil.crypto.backend import make_backend
from veil.crypto.params import CkksParams

pytestmark = pytest.mark.skipif(os.environ.get("VEIL_TEST_COMPILE") != "1",
                                reason="cold torch.compile takes minutes; VEIL_TEST_COMPILE=1 runs it")

#: Small ring, the production chain's prime sizes (a wide run and a narrow run of limbs).
P = CkksParams(id="test-native-n1024-v1", poly_modulus_degree=1024, coeff_modulus_bits=(57, 36, 36, 57),
               scale_bits=30, security_level=0, mask_lambda=20, mask_value_bits=4, test_only=True)


def test_compiled_operations_equal_eager():
    client = make_backend(P, "native", allow_test_backends=True)
    client.generate_keys([1, -2])
    eager = make_backend(P, "native", allow_test_backends=True, compile=False)
    comp = make_backend(P, "native", allow_test_backends=True, compile=True)
    for be in (eager, comp):
        be.import_public_material(client.export_public_material())
    x = np.linspace(-1, 1, P.slot_count)
    ct = eager.deserialize(client.encrypt_to_bytes(x))
    ct2 = eager.deserialize(client.encrypt_to_bytes(x[::-1].copy()))
    pt, pt2 = eager.encode(x), eager.encode(np.cos(x))
    ops = {
        "multiply": lambda be: [be.multiply(ct, ct, rescale=False)],
        "rescale": lambda be: [be.rescale(ct)],
        "rotate": lambda be: [be.rotate(ct, 1)],
        "rotate_many": lambda be: be.rotate_many(ct, [1, -2]),
        "rotate low": lambda be: [be.rotate(be.mod_switch_to(ct, 0), -2)],
        "dot_plain": lambda be: [be.dot_plain([ct, ct2, ct], [pt, pt, pt2])],
    }
    for name, op in ops.items():
        for a, b in zip(op(eager), op(comp), strict=True):
            assert torch.equal(a._obj.data, b._obj.data), name

"""The native backend's randomness comes from the OS CSPRNG only.

Two checks: (1) with every torch and numpy random generator made to raise, key generation,
encryption (both kinds), masking, re-encryption, re-randomization and folded downloads and refreshes still work: none of them
draws from those generators; (2) with ``os.urandom`` replaced by a fixed byte stream, two
independent runs produce bit-identical keys and ciphertexts: ``os.urandom`` is the only source
of entropy (a time- or generator-seeded draw anywhere would make them differ).
"""

import hashlib
import os

import numpy as np
import pytest
import torch

from veil.crypto.backend import make_backend
from veil.crypto.params import TEST_PARAMS_ID, get_params

P = get_params(TEST_PARAMS_ID, allow_test_params=True)
STEPS = [1, -2]

TORCH_FUNCS = ["rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
               "normal", "bernoulli", "multinomial", "poisson"]
TENSOR_METHODS = ["random_", "uniform_", "normal_", "exponential_", "geometric_", "cauchy_",
                  "log_normal_", "bernoulli_"]
NUMPY_FUNCS = ["default_rng", "random", "rand", "randn", "randint", "random_sample", "standard_normal",
               "normal", "uniform", "choice", "bytes", "shuffle", "permutation", "binomial", "seed"]


def _exercise(x):
    client = make_backend(P, "native", allow_test_backends=True)
    client.generate_keys(STEPS)
    server = make_backend(P, "native", allow_test_backends=True)
    server.import_public_material(client.export_public_material())
    up = client.encrypt_to_bytes(x, level=P.min_mask_level())
    ct = server.deserialize(up)
    pk_ct = server.encrypt(x)  # public-key encryption (the server has no secret key)
    masked, mask = server.mask_for_refresh(ct)
    fresh = server.deserialize(client.refresh_reencrypt_to_bytes(masked), level=P.top_level)
    out = server.rerandomize(server.unmask_refresh(fresh, mask))
    folded = server.serialize_folded(out, 20.0)  # the fold key's secret, the small ring's noise
    masked2, _ = server.mask_for_refresh(ct, fold=True)  # a mask in X², folded, re-encrypted as g(X²)
    folded_refresh = server.serialize_folded_refresh(masked2, 3.0)
    again = client.refresh_reencrypt_folded_to_bytes(folded_refresh)
    return client, server, [up, server.serialize(pk_ct), server.serialize(masked), server.serialize(out), folded,
                            folded_refresh, again]


def test_no_torch_or_numpy_generator_makes_key_noise_mask_or_seed_material(monkeypatch):
    def forbidden(*_a, **_k):
        raise AssertionError("a non-cryptographic generator was used")

    for name in TORCH_FUNCS:
        monkeypatch.setattr(torch, name, forbidden)
    for name in TENSOR_METHODS:
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    for name in NUMPY_FUNCS:
        monkeypatch.setattr(np.random, name, forbidden)
    monkeypatch.setattr(np.random, "Generator", forbidden)
    monkeypatch.setattr(np.random, "RandomState", forbidden)
    with pytest.raises(AssertionError):  # the patches are live
        torch.randn(3)
    x = np.linspace(-1, 1, P.slot_count)
    client, _, _ = _exercise(x)
    assert client.has_secret_key


def test_os_urandom_is_the_only_entropy_source(monkeypatch):
    def fixed_urandom():
        counter = [0]

        def urandom(n: int) -> bytes:
            out = b""
            while len(out) < n:
                counter[0] += 1
                out += hashlib.sha256(counter[0].to_bytes(8, "little")).digest()
            return out[:n]

        return urandom

    x = np.linspace(-1, 1, P.slot_count)
    runs = []
    for _ in range(2):
        monkeypatch.setattr(os, "urandom", fixed_urandom())
        client, _, blobs = _exercise(x)
        runs.append((client.export_public_material(), blobs))
    assert runs[0] == runs[1]
    monkeypatch.undo()
    client, _, blobs = _exercise(x)
    assert client.export_public_material().public_key != runs[0][0].public_key
    assert all(a != b for a, b in zip(blobs, runs[0][1], strict=True))

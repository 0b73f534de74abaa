"""Native backend properties beyond the interface contract (``test_he_interface`` runs that on
every backend): exact ct x ct, key-switching noise within its bound, hoisted = unhoisted bit for
bit, exact masked refresh, flooding statistics, and a server that holds no secret.

Test-only N=8192 set (the properties do not depend on N), client and server separate objects.
Key-switching bound (``keys`` docstring): ``sum_j N * 21 * (q_j - 1) / (2p) + (N + 1)/2`` per
coefficient, ~2^16.4 here; measured noise is ~2^8.
"""

import math

import numpy as np
import pytest
import torch

from veil.crypto.backend import HEError
from veil.crypto.linear import encode_matrix, matvec, plan_matvec, replicate_input
from veil.crypto.native import keys as K
from veil.crypto.native import rns
from veil.crypto.native.context import galois_element
from veil.crypto.native.sampling import CBD_ETA
from veil.crypto.params import TEST_PARAMS_ID, get_params

P = get_params(TEST_PARAMS_ID, allow_test_params=True)
N, SLOTS = P.poly_modulus_degree, P.slot_count
PRODUCT = plan_matvec(64, 64, SLOTS, "bsgs", 8)  # 7 hoisted baby steps, 7 giant steps
STEPS = sorted({1, 3, -5, 100, -1000, 2048} | set(PRODUCT.rotation_steps))


@pytest.fixture(scope="module")
def pair(he_pair):
    return he_pair("native", P, STEPS)


@pytest.fixture()
def rng():
    return np.random.default_rng(99)


def _ks_bound(level: int) -> float:
    p = P.primes[-1]
    return sum(N * CBD_ETA * (q - 1) / (2 * p) for q in P.primes[: level + 1]) + (N + 1) / 2


def _ints(ntt_residues: torch.Tensor, ctx, level: int) -> np.ndarray:
    _, ntt = ctx.data(level)
    y = rns.balanced_digits(ntt.inverse(ntt_residues), ctx.data(level)[0])
    return rns.digits_to_ints(y, ctx.data_primes[: level + 1])


def _negacyclic_mod(a: np.ndarray, b: np.ndarray, modulus: int) -> np.ndarray:
    """Exact negacyclic product of two integer polynomials mod ``modulus`` (centred), by one
    big-integer multiplication (Kronecker substitution on nonnegative representatives)."""
    a, b = a % modulus, b % modulus
    width = (2 * modulus.bit_length() + N.bit_length() + 8) // 8 + 1
    pack = lambda v: int.from_bytes(b"".join(int(x).to_bytes(width, "little") for x in v), "little")  # noqa: E731
    prod = (pack(a) * pack(b)).to_bytes(2 * N * width, "little")
    c = [int.from_bytes(prod[i * width : (i + 1) * width], "little") for i in range(2 * N)]
    out = np.array([(c[k] - c[k + N]) % modulus for k in range(N)], dtype=object)
    return np.where(out > modulus // 2, out - modulus, out)


def test_ct_ct_product_decrypts_to_the_exact_negacyclic_product(pair, rng):
    """Unrelinearized: dec(a x b) = dec(a) * dec(b) mod Q exactly; relinearized: within the
    key-switching bound."""
    client, server = pair
    level = 1
    ca = client.encrypt(rng.standard_normal(SLOTS), level=level)
    cb = client.encrypt(rng.standard_normal(SLOTS), level=level)
    ctx, sk = client._ctx, client._sk
    raw = server.multiply(ca, cb, rescale=False, relinearize=False)
    assert server.size(raw) == 3
    got = _ints(K.decrypt_ntt(ctx, sk, raw._obj.data, level), ctx, level)
    q = ctx.level_modulus(level)
    want = _negacyclic_mod(client.decrypt_poly(ca), client.decrypt_poly(cb), q)
    assert np.array_equal(got, want)
    relin = client.decrypt_poly(server.relinearize(raw))
    noise = max(abs(int(v)) for v in relin - want)
    assert 0 < noise <= _ks_bound(level)


def _automorphism(m: np.ndarray, g: int) -> np.ndarray:
    out = np.zeros(N, dtype=object)
    for i, c in enumerate(m):
        e = i * g % (2 * N)
        out[e % N] = c if e < N else -c
    return out


def test_rotation_noise_within_the_key_switching_bound(pair, rng):
    client, server = pair
    for level in (P.top_level, 0):
        ct = client.encrypt(rng.standard_normal(SLOTS), level=level)
        m = client.decrypt_poly(ct)
        for step in (3, -1000):
            want = _automorphism(m, galois_element(step, N))
            noise = max(abs(int(v)) for v in client.decrypt_poly(server.rotate(ct, step)) - want)
            assert 0 < noise <= _ks_bound(level), (level, step, math.log2(noise))


def test_hoisted_rotations_are_bit_identical_to_single_rotations(pair, rng):
    client, server = pair
    x = rng.standard_normal(SLOTS)
    for level in (P.top_level, 1):
        ct = client.encrypt(x, level=level)
        steps = [*STEPS, 0, SLOTS + 3]  # zero copies; slots + 3 is the step-3 key
        many = server.rotate_many(ct, steps)
        for step, got in zip(steps, many, strict=True):
            assert torch.equal(got._obj.data, server.rotate(ct, step)._obj.data)
        np.testing.assert_allclose(client.decrypt(many[-1]), np.roll(x, -3), atol=1e-6)
    with pytest.raises(HEError, match="Galois"):
        server.rotate_many(ct, [1, 11])


def test_rotation_keys_held_permuted_rotate_as_the_textbook_does(pair, rng):
    """The server holds each Galois key permuted by sigma_g^-1 (``keys.rotation_key``) and
    gathers the key switch's output; bit for bit what gathering ``c`` first and switching with
    the key as made gives, and the client exports the key as made."""
    client, server = pair
    ctx = server._ctx
    ct = client.encrypt(rng.standard_normal(SLOTS), level=P.top_level)
    c, level = ct._obj.data, P.top_level
    for step in (3, -1000):
        g = galois_element(step, N)
        held = server._gks[g]
        made = K.SwitchKey(held.data.index_select(-1, ctx.galois_index(g)), held.seed)
        assert torch.equal(made.data[0], K.galois_b(ctx, g, client._gks[g]))  # what travelled
        cg = c.index_select(-1, ctx.galois_index(g))
        want = rns.mod_down(rns.key_inner(rns.decompose(cg[1], ctx, level), made.at(level),
                                          ctx.ext(level)[0]), ctx, level)
        want[0] = ctx.data(level)[0].add(want[0], cg[0])
        assert torch.equal(server.rotate(ct, step)._obj.data, want)


def test_masked_refresh_is_exact(pair, rng):
    """The re-encryption carries x + rho exactly: after unmasking, the plaintext polynomial
    differs from the input's by the two fresh encryption noises only (no rounding)."""
    client, server = pair
    level = P.min_mask_level()
    ct = client.encrypt(rng.uniform(-100, 100, SLOTS), level=level)
    masked, mask = server.mask_for_refresh(ct)
    m_masked = client.decrypt_poly(masked)
    bits = mask.bits
    assert max(abs(int(v)) for v in m_masked) > 2 ** (bits - 2)  # the mask dominates
    fresh = client.refresh_reencrypt(masked)
    assert server.level(fresh) == P.top_level
    out = server.unmask_refresh(fresh, mask)
    diff = client.decrypt_poly(out) - client.decrypt_poly(ct)
    # two symmetric encryptions (|e| <= 21) and the pk re-randomization's noise (v*e + e0 + e1*s)
    assert max(abs(int(v)) for v in diff) < 2**14


def test_flooding_noise_has_the_requested_spread(pair, rng):
    client, server = pair
    ct = client.encrypt(np.zeros(SLOTS))
    base = client.decrypt_poly(ct)
    flooded = client.decrypt_poly(server.rerandomize(ct, flood_log2_sigma=20.0))
    sd = np.std((flooded - base).astype(np.float64))
    assert 2**20 * 0.95 < sd < 2**20 * 1.05
    none = client.decrypt_poly(server.rerandomize(ct, flood_log2_sigma=float("-inf")))
    assert np.std((none - base).astype(np.float64)) < 2**10


def test_server_holds_no_secret(pair):
    client, server = pair
    assert client.has_secret_key and not server.has_secret_key and server._sk is None
    secret = client._sk.s
    seen = []

    def walk(obj, depth=0):
        if isinstance(obj, torch.Tensor):
            seen.append(obj)
        elif depth < 4 and hasattr(obj, "__dict__"):
            for v in vars(obj).values():
                walk(v, depth + 1)
        elif depth < 4 and isinstance(obj, dict | list | tuple):
            for v in obj.values() if isinstance(obj, dict) else obj:
                walk(v, depth + 1)

    walk(server)
    assert len(seen) > 10  # keys and tables were found
    for t in seen:
        if t.dtype == torch.int64 and t.shape[-1] == N:
            flat = t.reshape(-1, N)
            assert not any(torch.equal(row, s) for row in flat for s in secret)
    with pytest.raises(HEError, match="secret"):
        server.decrypt(server.rotate(client.encrypt(np.ones(4)), 1))


def test_diagonal_product_with_hoisted_baby_steps(pair, rng):
    """A BSGS product of ``veil.crypto.linear`` (its baby steps go through ``rotate_many``)."""
    client, server = pair
    w, x = rng.standard_normal((64, 64)), rng.standard_normal(64)
    mat = encode_matrix(server, w, P.top_level, n1=8)
    assert mat.plan == PRODUCT
    out = matvec(server, mat, client.encrypt(replicate_input(x, SLOTS)))
    np.testing.assert_allclose(client.decrypt(out, 64), w @ x, atol=1e-5)


def test_encode_many_equals_encode_one_by_one(pair, rng, monkeypatch):
    """The batched encoding (chunks of vectors of any lengths) gives ``encode``'s residues."""
    from veil.crypto.native import backend as native_backend

    _, server = pair
    monkeypatch.setattr(native_backend, "ENCODE_CHUNK", 3)  # several chunks, one ragged
    values = [rng.standard_normal(n) for n in (10, SLOTS, 1, 700, SLOTS // 2, 33, 5)]
    many = server.encode_many(values, 1, 2.0**30)
    assert len(many) == len(values)
    for v, pt in zip(values, many, strict=True):
        one = server.encode(v, 1, 2.0**30)
        assert (pt.level, pt.scale, pt.nbytes) == (one.level, one.scale, one.nbytes)
        assert torch.equal(pt._obj, one._obj)
    with pytest.raises(HEError, match="exceed"):
        server.encode_many([np.ones(SLOTS + 1)], 1)
    for bad in ([1.0, np.nan], [np.inf]):  # the encoder's check, before its transform
        with pytest.raises(HEError, match="finite"):
            server.encode(np.array(bad), 1)
        with pytest.raises(HEError, match="finite"):
            server.encode_many([np.ones(4), np.array(bad)], 1)


def test_encodings_checks_from_host_bounds_equal_the_devices(rng, monkeypatch):
    """``Encoder.encode_rows``: for host values its peak and all-zero checks come from the values'
    bounds (no read of the encoding) where those settle them, else from one read of the device
    together; either way the flags equal the encoding's own and a peak past the bound raises.
    The cases: ordinary vectors, all-zero ones, ones too small to settle (rounded to zero, or
    not), tensors (always read), and values whose bound passes the limit although their
    encoding's peak does not (read, then accepted)."""
    from veil.crypto.native.encoding import Encoder

    enc, n = Encoder(256), 256
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or real(t))
    tiny = np.zeros(n // 2)
    tiny[3] = 0.3  # scale 1: coefficients ~0.3 * 2 / 256, all round to zero; the bound cannot tell
    small = np.full(n // 2, 0.9)  # the constant polynomial 0.9: rounds to 1; its sum of squares settles nothing
    cases = [(rng.standard_normal((5, n // 2)), 2.0**20, 0), (np.zeros((2, 7)), 2.0**20, 0),
             (np.stack([tiny, small, 1e3 * rng.standard_normal(n // 2)]), 1.0, 1),
             (torch.from_numpy(rng.standard_normal((3, 9))), 2.0**20, 1)]
    for values, scale, want_reads in cases:
        reads.clear()
        coeffs, flags = enc.encode_rows(values, scale)
        assert len(reads) == want_reads
        assert flags == coeffs.reshape(-1, n).ne(0).any(-1).tolist()
    assert enc.encode_rows(np.stack([tiny, small, 1e3 * small]), 1.0)[1] == [False, True, True]
    # scale * max|v| is only a bound: a lone large value spreads over all coefficients
    spike = np.zeros(n // 2)
    spike[0] = 1.0
    limit = 2.0**40
    coeffs, flags = enc.encode_rows(spike, limit * 1.5, bound=limit)
    assert flags == [True] and coeffs.abs().max() < limit
    with pytest.raises(ValueError, match="too large"):
        enc.encode_rows(np.ones(n // 2), limit * 1.5, bound=limit)
    with pytest.raises(ValueError, match="too large"):
        enc.encode_rows(torch.ones(n // 2, dtype=torch.float64), limit * 1.5, bound=limit)
    for bad in (np.array([1.0, np.nan]), torch.tensor([1.0, np.inf], dtype=torch.float64)):
        with pytest.raises(ValueError, match="finite"):
            enc.encode_rows(bad, 2.0**20)


def test_encodings_checks_from_the_callers_bounds_need_no_read(rng, monkeypatch):
    """Values on the device with the caller's ``ValueBounds`` (the shuffled FFN's: a permutation
    keeps its matrix's entries): where the peak bound and each vector's least sum of squares
    settle the checks, the encoding is not read back, and the flags are the encoding's own;
    where one vector's bound cannot tell, or the peak bound passes the limit, one read, and the
    result is the same; bounds for another number of vectors, or not finite, are refused."""
    from veil.crypto.backend import ValueBounds
    from veil.crypto.native.encoding import Encoder

    enc = Encoder(256)
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or real(t))
    values = torch.from_numpy(rng.standard_normal((4, 100)))
    values[2] = 0.0  # an all-zero vector: its least sum of squares is 0, which settles nothing
    sumsq, peak = values.square().sum(-1).numpy(), float(values.abs().max())
    want, _ = enc.encode_rows(values.numpy(), 2.0**20)
    for bounds, want_reads in ((ValueBounds(peak, np.delete(sumsq, 2)), None),
                               (ValueBounds(peak, np.where(sumsq > 0, sumsq, 0.0)), 1),
                               (ValueBounds(peak, np.ones(4) * 1e-30), 1),  # too small to tell
                               (ValueBounds(peak * 2.0**50, sumsq), 1)):  # past the limit below
        reads.clear()
        if want_reads is None:
            with pytest.raises(ValueError, match="bounds for 3 vectors"):
                enc.encode_rows(values, 2.0**20, bounds=bounds)
            continue
        coeffs, flags = enc.encode_rows(values, 2.0**20, bound=2.0**62 if bounds.peak == peak else 2.0**40,
                                        bounds=bounds)
        assert len(reads) == want_reads and torch.equal(coeffs, want)
        assert flags == [True, True, False, True]
    nonzero = values[[0, 1, 3]]
    reads.clear()
    coeffs, flags = enc.encode_rows(nonzero, 2.0**20, bounds=ValueBounds(peak, np.delete(sumsq, 2) * 0.5))
    assert not reads and flags == [True] * 3 and torch.equal(coeffs, want[[0, 1, 3]])
    with pytest.raises(ValueError, match="bounds for"):
        enc.encode_rows(nonzero, 2.0**20, bounds=ValueBounds(float("nan"), np.delete(sumsq, 2)))


def test_decode_plaintext_gives_the_values_with_their_encoding_error(pair, rng):
    """``decode_plaintext`` (as SEAL's, for the flooding-margin measurements) returns the encoded
    values up to the encoding's rounding (~2^5 / scale), and a 0/1 mask's exact zeros and ones
    up to it; a plaintext of another parameter set is refused."""
    from veil.crypto.backend import Plaintext

    _, server = pair
    v = rng.standard_normal(SLOTS)
    for level, scale in ((0, 2.0**30), (2, 2.0**40)):
        got = server.decode_plaintext(server.encode(v, level, scale))
        err = np.abs(got - v).max()
        assert 0 < err < 2.0**8 / scale, (level, err)
    mask = (np.arange(SLOTS) % 3 == 0).astype(float)
    assert np.abs(server.decode_plaintext(server.encode(mask, 1, 2.0**20)) - mask).max() < 2.0**-12
    pt = server.encode(v, 0)
    with pytest.raises(HEError, match="parameter set"):
        server.decode_plaintext(Plaintext(pt._obj, "ckks-n16384-l7-v2", 0, pt.scale, pt.nbytes))


def test_a_dropped_server_backend_frees_its_tables(pair, rng):
    """A server makes a backend per key upload, and drops the ones it refuses: once dropped, the
    backend and its context (NTT tables, RNS constants, Galois indices: on CUDA, device memory)
    are freed, whatever operations filled the context's caches (a cache on the class would
    hold every context alive)."""
    import gc
    import weakref

    from veil.crypto.backend import make_backend

    client, _ = pair
    server = make_backend(P, "native", allow_test_backends=True)
    server.import_public_material(client.export_public_material())
    ct = server.deserialize(client.encrypt_to_bytes(rng.standard_normal(SLOTS)))
    prod = server.relinearize(server.multiply(ct, ct))
    server.rescale(prod)
    server.rotate_many(ct, [1, 3])
    server.rotate(ct, -5)
    server.mod_switch_to(ct, 1)
    gone = weakref.ref(server._ctx)
    del server, ct, prod
    gc.collect()
    assert gone() is None


def test_a_symmetric_encryption_is_m_plus_a_small_error_in_every_limb(pair, rng):
    """``keys.encrypt_symmetric`` (one multiply-accumulate ``e + m - a s``): ``c0 + a s - m`` is
    the same polynomial in every limb, its centred coefficients within the error's bound
    (``CBD_ETA``), at the top level and at the lowest."""
    client, _ = pair
    ctx, sk = client._ctx, client._sk
    for level in (ctx.top, 0):
        basis, ntt = ctx.data(level)
        m = ntt.forward(torch.stack([torch.from_numpy(rng.integers(0, q, N)) for q in basis.primes]))
        c0, seed = K.encrypt_symmetric(ctx, sk, m, level)
        a = K.expand_a(ctx, seed, level, K.TAG_CT)
        e = _ints(basis.sub(basis.add(c0, basis.mul(a, sk.s[1 : level + 2])), m), ctx, level)
        assert 0 < max(abs(int(v)) for v in e) <= CBD_ETA

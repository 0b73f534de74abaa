"""The native backend against SEAL.

Bit-exact where the computation is deterministic: the NTT, the encoding (coefficients within
one unit: both round a double-precision FFT), and rescale, mod switch, add, ct x pt and the
ct x ct tensor product on the residues of the same SEAL ciphertext. Within stated bounds where
each backend uses its own keys and randomness: every operation of the protocol on the same
plaintext inputs, decrypted by each backend and compared with the exact result.

Bounds (test-only N=8192 set, scale 2^40, inputs |x| <= 1): a slot error is the noise
polynomial's canonical embedding divided by the scale; for a noise of i.i.d. coefficients of
size e that is ~e*sqrt(N) per slot (CLT). Fresh encryption e <= 2^5 and a rescale's round-off
e ~ sqrt(N): ~2^-27 per slot; a key switch e ~ 2^8-2^10 (measured; worst case 2^16.4, see
test_native_backend): ~2^-23. ``TOL = 1e-5`` leaves >= 40x margin over the CLT estimates and
still fails on any wrong slot order, rotation direction, scale or level handling (errors O(1)).
Flooding (sigma 2^24): the real part of a slot is a sum of N coefficients times unit complex
numbers, standard deviation ``sigma * sqrt(N/2) / scale = 2^(24 + 6 - 40)`` for both backends.
"""

import numpy as np
import pytest
import torch

from veil.crypto.backend import make_backend
from veil.crypto.native import rns
from veil.crypto.native.context import RnsContext
from veil.crypto.native.encoding import Encoder
from veil.crypto.params import PROTECTED_PARAMS, TEST_PARAMS_ID, get_params
from veil.crypto.seal import format as seal_format
from veil.crypto.seal.context import SealContext, read_flat

P = get_params(TEST_PARAMS_ID, allow_test_params=True)
SLOTS = P.slot_count
STEPS = [1, -3, 200]
TOL = 1e-5


@pytest.fixture(scope="module")
def backends():
    out = {}
    for name in ("seal", "native"):
        client = make_backend(P, name, allow_test_backends=True)
        client.generate_keys(STEPS)
        server = make_backend(P, name, allow_test_backends=True)
        server.import_public_material(client.export_public_material())
        out[name] = (client, server)
    return out


@pytest.fixture(scope="module")
def seal_ctx():
    return SealContext(P)


def _seal_residues(obj, level, size):
    n = P.poly_modulus_degree
    return torch.from_numpy(read_flat(obj, 0, size * (level + 1) * n).astype(np.int64).reshape(size, level + 1, n))


def _to_seal(sc: SealContext, data: torch.Tensor, level: int, scale: float):
    blob = seal_format.ciphertext_blob(data.numpy().astype(np.uint64), sc.levels[level].parms_id, scale,
                                       True, sc.version)
    return sc.load_ct_blob(blob)


@pytest.mark.parametrize("params", [P, PROTECTED_PARAMS], ids=lambda p: p.id)
def test_ntt_and_encoding_match_seal(params):
    sc, ctx, enc = SealContext(params), RnsContext(params), Encoder(params.poly_modulus_degree)
    rng = np.random.default_rng(1)
    level = params.top_level
    lvl, (basis, ntt) = sc.levels[level], ctx.data(level)
    res = np.stack([rng.integers(0, q, ctx.n, dtype=np.int64) for q in lvl.primes])
    carrier = sc.carrier_from_coeffs(res.astype(np.uint64), lvl, 1.0)
    seal_ntt = read_flat(carrier, 0, res.size).astype(np.int64).reshape(res.shape)
    assert np.array_equal(ntt.forward(torch.from_numpy(res)).numpy(), seal_ntt)
    # encoding: the same plaintext polynomial, and each side decodes the other's
    x = rng.uniform(-50, 50, params.slot_count)
    seal_pt = sc.encode(x, lvl, params.scale)
    theirs = torch.from_numpy(read_flat(seal_pt, 0, res.size).astype(np.int64).reshape(res.shape))
    ours = ntt.forward(rns.to_residues(enc.encode(x, params.scale), basis))
    diff = basis.center(basis.sub(ntt.inverse(ours), ntt.inverse(theirs)))
    assert int(diff.abs().max()) <= 1 and int((diff != 0).sum()) < ctx.n // 100
    digits = rns.balanced_digits(ntt.inverse(theirs), ctx.data(level)[0])
    decoded = enc.decode(rns.digits_to_float(digits, ctx.data_primes[: level + 1]).numpy(), params.scale)
    np.testing.assert_allclose(decoded, x, atol=1e-8)
    pt = sealapi_plaintext(sc, ours.numpy(), lvl, params.scale)
    np.testing.assert_allclose(np.asarray(sc.encoder.decode_double(pt)), x, atol=1e-8)


def sealapi_plaintext(sc: SealContext, ntt_residues: np.ndarray, lvl, scale: float):
    import tenseal.sealapi as sealapi

    pt = sealapi.Plaintext()
    sc.io.load(pt, sc.ctx, seal_format.plaintext_blob(ntt_residues.astype(np.uint64), lvl.parms_id, scale,
                                                      sc.version))
    return pt


def test_deterministic_operations_are_bit_identical_to_seal(backends, seal_ctx):
    """Native evaluation on the residues of SEAL ciphertexts gives SEAL's residues."""
    seal_client, seal_server = backends["seal"]
    native = make_backend(P, "native", allow_test_backends=True)
    rng = np.random.default_rng(2)
    level = P.top_level
    a_s = seal_client.encrypt(rng.standard_normal(SLOTS))
    b_s = seal_client.encrypt(rng.standard_normal(SLOTS))

    def native_ct(ct):
        data = _seal_residues(ct._obj, seal_server.level(ct), seal_server.size(ct))
        return native._wrap(data, seal_server.level(ct), seal_server.scale(ct))

    def same(seal_ct, native_ct_):
        want = _seal_residues(seal_ct._obj, seal_server.level(seal_ct), seal_server.size(seal_ct))
        assert seal_server.scale(seal_ct) == pytest.approx(native.scale(native_ct_), rel=1e-12)
        assert torch.equal(native_ct_._obj.data, want)

    a_n, b_n = native_ct(a_s), native_ct(b_s)
    same(seal_server.rescale(a_s), native.rescale(a_n))
    same(seal_server.mod_switch_to(a_s, 0), native.mod_switch_to(a_n, 0))
    same(seal_server.add(a_s, b_s), native.add(a_n, b_n))
    same(seal_server.multiply(a_s, b_s, rescale=False, relinearize=False),
         native.multiply(a_n, b_n, rescale=False, relinearize=False))
    w = rng.standard_normal(SLOTS)
    pt_s = seal_server.encode(w, level, P.primes[level])
    pt_n = native.encode(w, level, P.primes[level])
    pt_n._obj = _seal_residues(pt_s._obj, level, 1)[0]  # the same plaintext residues
    same(seal_server.multiply_plain(a_s, pt_s), native.multiply_plain(a_n, pt_n))


def _errors(name, backends, rng):
    """Decrypted error of every protocol operation on fixed inputs (same inputs for each name)."""
    client, server = backends[name]
    x, y = rng.uniform(-1, 1, SLOTS), rng.uniform(-1, 1, SLOTS)
    top = P.top_level
    cx, cy = server.deserialize(client.encrypt_to_bytes(x)), client.encrypt(y)
    pt = server.encode(y, top, server.prime(top))
    err = {
        "encrypt": client.decrypt(cx) - x,
        "add": client.decrypt(server.add(cx, cy)) - (x + y),
        "ct x pt": client.decrypt(server.multiply_plain(cx, pt)) - x * y,
        "ct x ct": client.decrypt(server.multiply(cx, cy)) - x * y,
        "mod switch": client.decrypt(server.mod_switch_to(cx, 0)) - x,
        "rotate": client.decrypt(server.rotate(cx, 200)) - np.roll(x, -200),
    }
    for step, got in zip(STEPS, server.rotate_many(cx, STEPS), strict=True):
        err[f"rotate_many {step}"] = client.decrypt(got) - np.roll(x, -step)
    low = client.encrypt(x * 1000, level=P.min_mask_level())
    masked, mask = server.mask_for_refresh(low)
    fresh = server.deserialize(client.refresh_reencrypt_to_bytes(masked), level=top)
    err["refresh"] = (client.decrypt(server.unmask_refresh(fresh, mask)) - x * 1000) / 1000
    err["flooding"] = client.decrypt(server.rerandomize(cx)) - x
    return err


def test_every_operation_against_seal_on_the_same_inputs(backends):
    native = _errors("native", backends, np.random.default_rng(3))
    seal = _errors("seal", backends, np.random.default_rng(3))
    for op in native:
        n_err, s_err = np.abs(native[op]).max(), np.abs(seal[op]).max()
        if op == "flooding":  # same distribution: sd 2^-10 per slot on both
            sd_n, sd_s = np.std(native[op]), np.std(seal[op])
            assert 0.9 < sd_n / sd_s < 1.1 and abs(np.log2(sd_n) + 10) < 0.1, (sd_n, sd_s)
            continue
        assert n_err < TOL and s_err < TOL, (op, n_err, s_err)

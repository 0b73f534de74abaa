"""Parameter sets: 128-bit bound, versioned ids, test-only sets refused by production lookups."""

import dataclasses

import pytest

from veil.crypto.params import (
    DEFAULT_PARAMS,
    DEFAULT_PARAMS_ID,
    HE_STANDARD_MAX_LOG_Q_128,
    PROTECTED_PARAMS,
    TEST_PARAMS,
    TEST_PARAMS_ID,
    CkksParams,
    ParamsError,
    get_params,
    production_param_ids,
)


def test_default_set_is_the_protocol_set():
    p = get_params()
    assert p is DEFAULT_PARAMS and p.id == DEFAULT_PARAMS_ID == "ckks-n16384-l6-v1"
    assert p.poly_modulus_degree == 16384
    assert p.coeff_modulus_bits == (60, 50, 50, 50, 50, 50, 50, 60)
    assert p.scale_bits == 50 and p.scale == 2.0**50
    assert p.log_q == 420 <= HE_STANDARD_MAX_LOG_Q_128[16384] == 438
    assert p.top_level == 6 and p.slot_count == 8192
    assert p.security_level == 128 and not p.test_only


def test_he_standard_bounds():
    assert HE_STANDARD_MAX_LOG_Q_128[8192] == 218
    assert HE_STANDARD_MAX_LOG_Q_128[16384] == 438
    assert HE_STANDARD_MAX_LOG_Q_128[32768] == 881


def test_bound_is_enforced():
    with pytest.raises(ParamsError, match="exceeds"):
        CkksParams("x", 16384, (60,) * 8, 50)  # 480 > 438
    with pytest.raises(ParamsError, match="exceeds"):
        CkksParams("x", 8192, (60, 50, 50, 60), 50)  # 220 > 218
    CkksParams("x", 32768, (60,) * 14, 50)  # 840 <= 881


def test_other_consistency_checks():
    with pytest.raises(ParamsError):
        CkksParams("x", 12000, (60, 60), 50)  # not a power of two we support
    with pytest.raises(ParamsError):
        CkksParams("x", 16384, (61, 50, 60), 50)  # prime too large
    with pytest.raises(ParamsError):
        CkksParams("x", 16384, (50, 50, 60), 50)  # q0 must exceed the scale
    with pytest.raises(ParamsError):
        CkksParams("x", 16384, (60, 50, 40), 40)  # special prime below a data prime
    with pytest.raises(ParamsError):
        CkksParams("x", 16384, (60, 50, 60), 40, security_level=0)  # insecure, not test-only
    with pytest.raises(ParamsError):
        CkksParams("x", 16384, (60, 50, 60), 40, mask_lambda=20)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_PARAMS.scale_bits = 40  # type: ignore[misc]


def test_production_lookup_refuses_test_params():
    assert TEST_PARAMS_ID not in production_param_ids()
    assert TEST_PARAMS.test_only
    with pytest.raises(ParamsError, match="test-only"):
        get_params(TEST_PARAMS_ID)
    assert get_params(TEST_PARAMS_ID, allow_test_params=True) is TEST_PARAMS
    with pytest.raises(ParamsError, match="unknown"):
        get_params("ckks-n16384-l6-v0")
    # production ids still resolve with the flag
    assert get_params(DEFAULT_PARAMS_ID, allow_test_params=True) is DEFAULT_PARAMS


def test_mask_room():
    p = DEFAULT_PARAMS
    # b = 50 + 12 + 2, mask = b + 54
    assert p.mask_coeff_bits() == 64 and p.mask_bits() == 118
    lvl = p.min_mask_level()
    assert lvl == 2 and p.level_log_q(lvl) >= p.mask_bits() + 3
    assert p.level_log_q(lvl - 1) < p.mask_bits() + 3
    # statistical distance of one masked polynomial <= N * 2^-(lambda+1) <= 2^-40
    assert p.poly_modulus_degree * 2.0 ** -(p.mask_lambda + 1) <= 2.0**-40
    t = TEST_PARAMS
    assert t.min_mask_level() == 1
    with pytest.raises(ParamsError):
        p.level_log_q(7)


def test_max_mask_scale_is_min_mask_level_read_the_other_way():
    """A value at ``max_mask_scale(l)`` (or a float rounding step above it, as a rescale leaves
    it) is masked at ``l`` and no lower; twice the scale needs a higher level. The protected set's
    refresh: 2^27 at level 1, with a 109-bit mask and statistical distance <= 2^-51 as before."""
    for p in (DEFAULT_PARAMS, PROTECTED_PARAMS, TEST_PARAMS):
        for level in range(p.top_level + 1):
            s = p.max_mask_scale(level)
            if s < 1:
                continue
            assert p.min_mask_level(s) == p.min_mask_level(s * (1 + 1e-13)) == level
            if level < p.top_level:
                assert p.min_mask_level(2 * s) == level + 1
            else:
                with pytest.raises(ParamsError, match="no level"):
                    p.min_mask_level(2 * s)
    assert PROTECTED_PARAMS.max_mask_scale(1) == 2.0**27 and PROTECTED_PARAMS.mask_bits(2.0**27) == 109
    assert PROTECTED_PARAMS.poly_modulus_degree * 2.0 ** -(PROTECTED_PARAMS.mask_lambda + 1) == 2.0**-51


def test_primes_are_pinned_and_match_seal():
    """Every set pins its primes: NTT-friendly (q ≡ 1 mod 2N), of the stated sizes, the ones
    SEAL's CoeffModulus::Create picks (so every backend builds the same chain)."""
    import tenseal.sealapi as sealapi

    from veil.crypto.params import is_prime, ntt_primes

    for p in (DEFAULT_PARAMS, PROTECTED_PARAMS, TEST_PARAMS):
        n = p.poly_modulus_degree
        assert p.primes == ntt_primes(n, p.coeff_modulus_bits)
        seal = tuple(m.value() for m in sealapi.CoeffModulus.Create(n, list(p.coeff_modulus_bits)))
        assert p.primes == seal
        assert all(is_prime(q) and q % (2 * n) == 1 for q in p.primes)
        assert [p.prime(level) for level in range(p.top_level + 1)] == list(p.primes[:-1])
        assert p.special_prime == p.primes[-1]
    assert [n for n in range(2, 60) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59]
    assert not is_prime(3215031751) and not is_prime((1 << 61) - 3) and is_prime((1 << 61) - 1)


def test_primes_are_validated():
    good = DEFAULT_PARAMS.primes
    with pytest.raises(ParamsError, match="NTT-friendly"):
        CkksParams("x", 16384, DEFAULT_PARAMS.coeff_modulus_bits, 50, primes=(good[0] + 2,) + good[1:])
    with pytest.raises(ParamsError, match="distinct"):
        CkksParams("x", 16384, DEFAULT_PARAMS.coeff_modulus_bits, 50, primes=(good[1],) + good[1:])
    with pytest.raises(ParamsError, match="distinct"):
        CkksParams("x", 16384, DEFAULT_PARAMS.coeff_modulus_bits, 50, primes=good[:-1])

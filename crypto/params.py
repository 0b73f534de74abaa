"""Named, versioned CKKS parameter sets.

A parameter set is identified by its ``id`` string (``ckks-n16384-l6-v1``); both parties
verify the id (and the numbers behind it) at session creation. Changing any number means a
new id: an id never changes meaning.

Security: the bound on ``log2 Q`` (the sum of the coefficient-modulus bit sizes, *including*
the special key-switching prime) for 128-bit classical security with a ternary secret and
error sigma ~3.2 is taken from the Homomorphic Encryption Standard (Albrecht et al., 2018,
Table 1, "classical, uniform/ternary secret"), which is also what SEAL enforces for
``sec_level_type.tc128``.

Levels: the modulus chain ``[q_0, q_1, ..., q_L, p]`` has ``L+1`` data primes and one special
prime ``p`` used only by key switching. A ciphertext at *level* ``l`` has the ``l+1`` primes
``q_0..q_l``; a rescale goes from level ``l`` to ``l-1``. Level numbers equal SEAL's
``chain_index`` of the data levels.

Test-only parameter sets live in a separate registry that production lookups never consult:
``get_params(id)`` refuses them; only ``get_params(id, allow_test_params=True)`` (used by the
test-suite) returns them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "HE_STANDARD_MAX_LOG_Q_128",
    "CkksParams",
    "ParamsError",
    "DEFAULT_PARAMS",
    "DEFAULT_PARAMS_ID",
    "PROTECTED_PARAMS",
    "PROTECTED_PARAMS_V1",
    "TEST_PARAMS",
    "TEST_PARAMS_ID",
    "get_params",
    "is_prime",
    "ntt_primes",
    "production_param_ids",
]


class ParamsError(ValueError):
    """An unknown, refused or inconsistent CKKS parameter set."""


#: HE Standard, 128-bit classical security, ternary secret: N -> max log2(Q) (with the
#: special prime). SEAL's CoeffModulus::MaxBitCount(N, tc128) returns the same numbers.
HE_STANDARD_MAX_LOG_Q_128: dict[int, int] = {
    1024: 27,
    2048: 54,
    4096: 109,
    8192: 218,
    16384: 438,
    32768: 881,
}

#: SEAL's NTT-friendly primes are at most 60 bits.
_MAX_PRIME_BITS = 60


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24 (these bases suffice below that bound)."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for p in bases:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def ntt_primes(n: int, bit_sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Primes ``q ≡ 1 (mod 2n)`` of the given bit sizes, picked the way SEAL's
    ``CoeffModulus::Create`` picks them: for each size, the largest such primes below
    ``2^bits``, handed out smallest first in the order the sizes appear (so ``[57, 36 x 7, 57]``
    gets the second-largest 57-bit prime as ``q_0`` and the largest as the special prime)."""
    wanted: dict[int, int] = {}
    for b in bit_sizes:
        wanted[b] = wanted.get(b, 0) + 1
    pools: dict[int, list[int]] = {}
    for bits, count in wanted.items():
        found, q = [], ((1 << bits) - 1) // (2 * n) * (2 * n) + 1
        while len(found) < count:
            if q.bit_length() < bits:
                raise ParamsError(f"not enough {bits}-bit NTT primes for N={n}")
            if is_prime(q):
                found.append(q)
            q -= 2 * n
        pools[bits] = found  # descending; pop() hands out the smallest first
    return tuple(pools[b].pop() for b in bit_sizes)


@dataclass(frozen=True)
class CkksParams:
    """One named CKKS parameter set.

    Attributes:
        id: the name both parties verify (``ckks-n<N>-l<levels>-v<version>``).
        poly_modulus_degree: ring dimension N; N/2 complex slots.
        coeff_modulus_bits: bit sizes of the RNS primes ``[q_0, q_1..q_L, p]``; the last one is
            the special (key-switching) prime.
        primes: the primes themselves, in the same order: every backend builds its modulus chain
            from these numbers, so ciphertexts of one backend have the moduli of another's.
            Production sets pin them; when left out they are derived by ``ntt_primes``.
        scale_bits: log2 of the default encoding scale Delta.
        security_level: 128 (checked against the HE Standard) or 0 for a set that is *not*
            secure and is only valid with ``test_only=True``.
        mask_lambda: statistical security parameter of the refresh mask: the mask is uniform
            over ``2^(b + lambda + 1)`` integers where ``2^b`` bounds the coefficients of the
            masked plaintext, so each coefficient leaks at most ``2^-(lambda+1)`` in statistical
            distance and a whole polynomial at most ``N * 2^-(lambda+1)``.
        mask_value_bits: assumed bound ``log2 max |slot value|`` of a value that is masked for a
            refresh (the residual stream). Together with the scale it gives ``b``.
        flood_log2_sigma: log2 of the standard deviation (in coefficient units) of the Gaussian
            noise added to every ciphertext that leaves the server (circuit privacy).
        test_only: True for sets that production code must never select.
    """

    id: str
    poly_modulus_degree: int
    coeff_modulus_bits: tuple[int, ...]
    scale_bits: int
    security_level: int = 128
    mask_lambda: int = 54
    mask_value_bits: int = 12
    flood_log2_sigma: float = 30.0
    test_only: bool = False
    primes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.primes:  # frozen: derived once here, then validated like pinned ones
            object.__setattr__(self, "primes", ntt_primes(self.poly_modulus_degree, self.coeff_modulus_bits))
        self.validate()

    # ---- derived numbers -------------------------------------------------------------
    @property
    def slot_count(self) -> int:
        return self.poly_modulus_degree // 2

    @property
    def log_q(self) -> int:
        """Total bits of the coefficient modulus including the special prime."""
        return sum(self.coeff_modulus_bits)

    @property
    def data_prime_bits(self) -> tuple[int, ...]:
        """Bit sizes of the data primes ``q_0..q_L`` (without the special prime)."""
        return self.coeff_modulus_bits[:-1]

    @property
    def top_level(self) -> int:
        """Level of a fresh ciphertext: ``L`` (number of data primes minus one)."""
        return len(self.coeff_modulus_bits) - 2

    @property
    def scale(self) -> float:
        return float(2**self.scale_bits)

    def level_log_q(self, level: int) -> int:
        """Nominal bits of the modulus ``q_0 * ... * q_level`` of a ciphertext at ``level``."""
        if not 0 <= level <= self.top_level:
            raise ParamsError(f"level {level} outside [0, {self.top_level}] for {self.id}")
        return sum(self.data_prime_bits[: level + 1])

    def mask_coeff_bits(self, scale: float | None = None) -> int:
        """``b``: log2 bound of the plaintext coefficients of a masked value.

        A slot vector z encoded at scale s has coefficients ``|m_i| <= 2 s max|z|`` (the
        inverse canonical embedding averages N/2 slot values with weight 2/N), plus the
        encryption/computation noise (far below s). One extra bit of margin.
        """
        s = self.scale if scale is None else scale
        # a scale a rounding step above a power of two (a rescale's float arithmetic) counts as it
        return math.ceil(round(math.log2(s), 9)) + self.mask_value_bits + 2

    def mask_bits(self, scale: float | None = None) -> int:
        """Bits of the refresh mask: ``b + lambda``; mask uniform in ``[-2^bits, 2^bits)``."""
        return self.mask_coeff_bits(scale) + self.mask_lambda

    def mask_room(self, level: int) -> int:
        """Bits of the largest refresh mask ``level`` holds: ``x + rho`` must not wrap around, so
        ``log2 Q_level`` less 1 (the primes are slightly below 2^bits) and less 2 (sign bit plus
        one bit of margin so that the centred lift of ``x + rho`` is exact)."""
        return self.level_log_q(level) - 3

    def min_mask_level(self, scale: float | None = None) -> int:
        """Lowest level whose ``mask_room`` holds the mask of a value at ``scale``."""
        bits = self.mask_bits(scale)
        for level in range(self.top_level + 1):
            if bits <= self.mask_room(level):
                return level
        raise ParamsError(f"{self.id}: no level can carry a {bits}-bit refresh mask")

    def max_mask_scale(self, level: int) -> float:
        """The largest power-of-two scale whose refresh mask ``level`` holds (``min_mask_level``
        read the other way: the mask grows by a bit per bit of scale)."""
        return float(2.0 ** (self.mask_room(level) - self.mask_bits(1.0)))

    # ---- checks ----------------------------------------------------------------------
    def validate(self) -> None:
        n = self.poly_modulus_degree
        if n not in HE_STANDARD_MAX_LOG_Q_128:
            raise ParamsError(f"{self.id}: unsupported poly_modulus_degree {n}")
        bits = self.coeff_modulus_bits
        if len(bits) < 2:
            raise ParamsError(f"{self.id}: need at least one data prime and the special prime")
        if any(b < 20 or b > _MAX_PRIME_BITS for b in bits):
            raise ParamsError(f"{self.id}: prime sizes must be in [20, 60] bits: {bits}")
        if self.security_level == 128:
            bound = HE_STANDARD_MAX_LOG_Q_128[n]
            if self.log_q > bound:
                raise ParamsError(
                    f"{self.id}: log Q = {self.log_q} exceeds the HE Standard 128-bit bound "
                    f"{bound} for N={n}"
                )
        elif self.security_level == 0:
            if not self.test_only:
                raise ParamsError(f"{self.id}: an insecure parameter set must be test_only")
        else:
            raise ParamsError(f"{self.id}: security_level must be 128 (or 0 for test sets)")
        if self.scale_bits >= bits[0]:
            raise ParamsError(f"{self.id}: q_0 ({bits[0]} bits) must exceed the scale")
        if bits[-1] < max(bits[:-1]):
            # SEAL: the special prime should be at least as large as the data primes or
            # key-switching noise grows; allow it only for explicitly test-only sets.
            if not self.test_only:
                raise ParamsError(f"{self.id}: special prime smaller than a data prime")
        if self.mask_lambda < 40 and not self.test_only:
            raise ParamsError(f"{self.id}: mask_lambda below 40 bits")
        self._validate_primes()

    def _validate_primes(self) -> None:
        n, primes = self.poly_modulus_degree, self.primes
        if len(primes) != len(self.coeff_modulus_bits) or len(set(primes)) != len(primes):
            raise ParamsError(f"{self.id}: need one distinct prime per modulus bit size")
        for q, bits in zip(primes, self.coeff_modulus_bits, strict=True):
            if q.bit_length() != bits or q % (2 * n) != 1 or not is_prime(q):
                raise ParamsError(f"{self.id}: {q} is not an NTT-friendly {bits}-bit prime for N={n}")

    def prime(self, level: int) -> int:
        """``q_level``: the prime a rescale at ``level`` divides by."""
        if not 0 <= level <= self.top_level:
            raise ParamsError(f"level {level} outside [0, {self.top_level}] for {self.id}")
        return self.primes[level]

    @property
    def special_prime(self) -> int:
        return self.primes[-1]


# --------------------------------------------------------------------------------------
# Production sets
# --------------------------------------------------------------------------------------

#: Default. N=16384 gives 8192 slots (room for a 576-vector replicated for 1536x576
#: diagonal products) and allows log Q <= 438. Chain [60, 50 x 6, 60] = 420 bits:
#:  * q_0 = 60 bits, scale 2^50: 10 bits of headroom for the integer part of decrypted
#:    values at level 0 (|values| < 2^9);
#:  * six 50-bit primes = six rescales at scale 2^50 (~2^-25 relative precision after a
#:    576-term product) between two refreshes;
#:  * special prime 60 bits >= every data prime (key-switching noise stays below rescale
#:    noise);
#:  * refresh mask: b = 50 + 12 + 2 = 64 bits, lambda = 54 -> 118-bit mask, needs a level with
#:    >= 120 bits, i.e. 3 data primes (level 2; see ``min_mask_level``). Statistical distance
#:    of a masked polynomial <= 16384 * 2^-55 = 2^-41.
#:  * flooding sigma 2^30 coefficient units: slot error ~ 2^30 * sqrt(N) / 2^50 = 2^-13 of
#:    absolute error, against computation noise of ~2^10..2^20 coefficient units.
DEFAULT_PARAMS = CkksParams(
    id="ckks-n16384-l6-v1",
    poly_modulus_degree=16384,
    coeff_modulus_bits=(60, 50, 50, 50, 50, 50, 50, 60),
    scale_bits=50,
    security_level=128,
    mask_lambda=54,
    mask_value_bits=12,
    flood_log2_sigma=30.0,
    primes=(1152921504606683137, 1125899903107073, 1125899903500289, 1125899903795201, 1125899903827969,
            1125899903991809, 1125899904679937, 1152921504606748673),
)
DEFAULT_PARAMS_ID = DEFAULT_PARAMS.id



#: The protected path's first parameter set (kept so that the id keeps its meaning): N=16384,
#: chain [57, 36 x 7, 57] = 366 bits, scale 2^36, eight data levels (0..7). Its level-1 prime
#: is 36 bits, so the 0/1 mask that cleans the MLP download on its way from level 1 to 0 could
#: only be encoded at ~2^36: its encoding error times the folded partial sums it cleaned sat
#: ~3.5 bits under the flooding noise. ``PROTECTED_PARAMS`` replaces it.
PROTECTED_PARAMS_V1 = CkksParams(
    id="ckks-n16384-l7-v1",
    poly_modulus_degree=16384,
    coeff_modulus_bits=(57,) + (36,) * 7 + (57,),
    scale_bits=36,
    security_level=128,
    mask_lambda=64,
    mask_value_bits=16,
    flood_log2_sigma=18.0,
    primes=(144115188075134977, 68713512961, 68713873409, 68714201089, 68714954753, 68716036097, 68717740033,
            68718428161, 144115188075593729),
)

#: The protected path's parameter set. N=16384, chain [57, 55, 36 x 6, 57] = 385 bits (the HE
#: Standard 128-bit bound for N=16384 is 438), scale 2^36, eight data levels (0..7).
#: Why not the default [60, 50 x 6, 60]: the layer circuit of ``veil.protected.circuits`` needs
#: five levels from the layer start (7) to the masked refresh of h'' (level 2) plus two below
#: it for the downloads; with 50-bit primes only four levels lie between the top and the
#: lowest level that can carry a refresh mask. 36-bit primes keep ~2^-28 absolute precision per
#: level on these activations (|h| < 2^15), far below the flooding noise.
#: Why q1 has 55 bits: the MLP download is cleaned by a 0/1 mask from level 1 to 0, and a
#: product with a plaintext rescaled by q1 keeps the ciphertext's scale only if the plaintext is
#: encoded at q1: a 55-bit q1 puts the mask's encoding error (~2^5.2 / 2^55) times the cleaned
#: partial sums ~20 bits under the flooding noise (``benchmarks/flooding_margin.py``), where the
#: 36-bit q1 of ``ckks-n16384-l7-v1`` left 3.5 bits. Nothing else rescales by q1.
#: Why eight data levels and not more: the circuit starts every layer at level 7 (fresh
#: uploads), while every data prime adds key-switching components to every Galois key: in the
#: server's memory the 46 keys take 46 x (10 x 2 x 11) polynomials of 128 KiB = 1.33 GB with ten
#: data levels and 46 x (8 x 2 x 9) = 0.87 GB with eight (arithmetic).
#: Refresh mask: h'' moved to level 1 at scale 2^27, b = 27 + 16 + 2 = 45 coefficient bits
#: (mask_value_bits=16: SmolLM2's residual stream reaches |h| = 22552 < 2^15 at layers 12..28),
#: lambda = 64 -> 109-bit mask, carried at level 1 (57+55 = 112 bits, the mask's 109 plus the 3
#: bits of room min_mask_level asks). Statistical distance of one masked polynomial
#: <= N * 2^-(lambda+1) = 2^-51.
#: Flooding: the protected circuits flood each download at scale * 2^-18 coefficient units
#: (protected/circuits.py, FLOOD_BELOW_SCALE; flood_log2_sigma below is that at scale 2^36):
#: ~2^(18+6.5-36) = 2^-11.5 absolute error per slot.
PROTECTED_PARAMS = CkksParams(
    id="ckks-n16384-l7-v2",
    poly_modulus_degree=16384,
    coeff_modulus_bits=(57, 55) + (36,) * 6 + (57,),
    scale_bits=36,
    security_level=128,
    mask_lambda=64,
    mask_value_bits=16,
    flood_log2_sigma=18.0,
    primes=(144115188075134977, 36028797017456641, 68713873409, 68714201089, 68714954753, 68716036097,
            68717740033, 68718428161, 144115188075593729),
)

_PRODUCTION: dict[str, CkksParams] = {p.id: p for p in (DEFAULT_PARAMS, PROTECTED_PARAMS_V1, PROTECTED_PARAMS)}

# --------------------------------------------------------------------------------------
# Test-only sets (never returned by a production lookup)
# --------------------------------------------------------------------------------------

#: Small and fast, for unit tests of properties that do not depend on N. Within the 128-bit
#: bound (200 <= 218 bits at N=8192) but with a 2^40 scale, only two rescales and a 40-bit mask
#: lambda, hence test-only. 4096 slots hold a 1536 -> 576 product (rows + cols + n1 slots).
#: Chain [60, 40, 40, 60]: the special prime equals the largest data prime (a smaller one
#: multiplies key-switching noise by q_max / p). Mask: b = 40 + 12 + 2 = 54, lambda 40 -> 94
#: bits -> level 1 ([60, 40] = 100 bits).
TEST_PARAMS = CkksParams(
    id="test-ckks-n8192-l2-v1",
    poly_modulus_degree=8192,
    coeff_modulus_bits=(60, 40, 40, 60),
    scale_bits=40,
    security_level=128,
    mask_lambda=40,
    mask_value_bits=12,
    flood_log2_sigma=24.0,
    test_only=True,
    primes=(1152921504606748673, 1099510890497, 1099511480321, 1152921504606830593),
)
TEST_PARAMS_ID = TEST_PARAMS.id

_TEST_ONLY: dict[str, CkksParams] = {TEST_PARAMS.id: TEST_PARAMS}


def production_param_ids() -> list[str]:
    return sorted(_PRODUCTION)


def get_params(
    params_id: str = DEFAULT_PARAMS_ID, *, allow_test_params: bool = False
) -> CkksParams:
    """Look up a parameter set by id.

    Production code calls this without ``allow_test_params``: a test-only id is refused with
    ``ParamsError`` exactly like an unknown id, so a client cannot make a server fall back to
    a small ring.
    """
    if params_id in _PRODUCTION:
        return _PRODUCTION[params_id]
    if params_id in _TEST_ONLY:
        if allow_test_params:
            return _TEST_ONLY[params_id]
        raise ParamsError(f"parameter set {params_id!r} is test-only and refused here")
    raise ParamsError(f"unknown parameter set {params_id!r}")

"""Folded downloads: a level-0 ciphertext sent in the ring of N/2, its two slot halves summed.

Why: a download whose values fit ``S/2`` slots (the MLP download: û in ``[0, 2F)``, 3072 of
8192 slots) still travels as two polynomials of N coefficients. Its fold, the polynomial
``m(X) + m(-X)``, has only even coefficients: it is ``2·m_e(X²)``, a polynomial of the ring of
N/2 in ``Y = X²``, and its slots are ``v_j + v_{j + S/2}``. Slot ``j`` of the big ring is
``m(ζ^(3^j))`` and ``3^(N/4) = 1 + N (mod 2N)``, so slot ``j + S/2`` sits at ``-ζ^(3^j)``;
slot ``j`` of the small ring, at ``ζ^(2·3^j)``, is ``m_e`` there, the mean of the two.

The client keeps a second secret ``s'`` of the small ring and gives the server a key that
switches a level-0 ciphertext from ``s`` to ``s'(X²)`` (``(b, a)`` over ``p·q0`` with
``b = -a·s'(X²) + e + p·s``: one digit, the level-0 key switch). The server switches
``(c0, c1)``, keeps the even coefficients of both components, doubles them (the fold), and
re-randomizes and floods the result in the small ring under ``s'`` (a public key
``(-a'·s' + e', a')`` mod q0 that comes with the switching key), then rounds it as every
flooded download is rounded (``crypto/rounding.py``). The client decrypts with ``s'`` and
decodes N/4 slots. What the server computed is a public function of its ciphertext and the
client's key, followed by a fresh encryption of zero and flooding: circuit privacy holds as for
the full ring's download. The flooding std is ``2^(noise_log2 + 1/2)``: a slot of the small ring
sums N/2 coefficients' noise, so that keeps the noise per slot of the full ring's download.

Security: the switching key is two RLWE samples of the ring of N/2 in ``s'`` (its even and odd
coefficients) over ``p·q0`` (114 bits for ckks-n16384-l7-v2), the public key one over ``q0``;
the HE Standard allows 218 bits at N = 8192. ``s'``, ``e``, ``e'``, the seeds and all
re-randomization and flooding noise come from the OS CSPRNG (``native.sampling``).

Wire forms (little endian)::

    key:      b"VFK1" | 32-byte seed of a | b over [p, q0] (N each, bit-packed)
              | 32-byte seed of a' | b' over [q0] (N/2, bit-packed)
    download: b"VFD1" | a rounded ciphertext of the ring of N/2 at level 0 (rounding's form)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from veil.crypto import rounding
from veil.crypto.native.encoding import Encoder
from veil.crypto.native.modarith import Basis
from veil.crypto.native.ntt import NttTables
from veil.crypto.native.sampling import SEED_BYTES, Stream, expand_uniform, new_seed
from veil.crypto.native.serial import SerialError, pack, unpack
from veil.crypto.params import CkksParams

__all__ = ["KEY_MAGIC", "MAGIC", "FoldKey", "FoldSecret", "FoldError", "is_folded", "make_key", "load_key",
           "fold", "decrypt", "key_bytes"]

KEY_MAGIC, MAGIC = b"VFK1", b"VFD1"
_TAG_KEY, _TAG_PK = 0x464B, 0x4650  # stream nonces of the two seeds' expansions


class FoldError(ValueError):
    """Bytes that are not a well-formed fold key or folded download of this parameter set."""


@dataclass(frozen=True)
class _Rings:
    n: int
    q: int  # q0: the only prime of level 0
    p: int  # the special prime
    big: NttTables  # [p, q0] at N
    small: NttTables  # [q0] at N/2
    encoder: Encoder  # the ring of N/2


@functools.lru_cache(maxsize=4)
def _rings(n: int, q: int, p: int) -> _Rings:
    return _Rings(n, q, p, NttTables(Basis.of((p, q)), n), NttTables(Basis.of((q,)), n // 2), Encoder(n // 2))


def _of(params: CkksParams) -> _Rings:
    return _rings(params.poly_modulus_degree, int(params.primes[0]), int(params.primes[-1]))


@dataclass(frozen=True)
class FoldSecret:
    """Client: ``s'`` in NTT form of the small ring ``[1, N/2]``."""

    s: torch.Tensor


@dataclass(frozen=True)
class FoldKey:
    """Server: the switching key ``(b, a)`` ``[2, 2 limbs (p, q0), N]`` and the small ring's public
    key ``(b', a')`` ``[2, 1, N/2]``, both in NTT form."""

    switch: torch.Tensor
    public: torch.Tensor


def _key_len(r: _Rings) -> int:
    return 4 + 2 * SEED_BYTES + (r.n * (r.p.bit_length() + r.q.bit_length()) + r.n // 2 * r.q.bit_length()) // 8


def key_bytes(params: CkksParams) -> int:
    """The exact length of a fold key of ``params``."""
    return _key_len(_of(params))


def _error(stream: Stream, n: int) -> torch.Tensor:
    return torch.from_numpy(stream.cbd(n))


def make_key(params: CkksParams, s_coeffs: np.ndarray) -> tuple[FoldSecret, bytes]:
    """Client: a fresh ``s'`` and the key bytes, from the big ring's secret coefficients
    (ternary, ``[N]``)."""
    r = _of(params)
    s = torch.as_tensor(np.asarray(s_coeffs, dtype=np.int64))
    if s.shape != (r.n,) or int(s.abs().max()) > 1:
        raise ValueError("the secret must be N ternary coefficients")
    stream = Stream()
    s_small = torch.from_numpy(stream.ternary(r.n // 2))
    s_even = torch.zeros(r.n, dtype=torch.int64)
    s_even[0::2] = s_small  # s'(X²)
    basis = r.big.basis
    seed = new_seed()
    a = torch.from_numpy(expand_uniform(seed, (r.p, r.q), (0, 1), r.n, _TAG_KEY))
    gadget = torch.tensor([[0], [r.p % r.q]], dtype=torch.int64)  # p·s: zero mod p
    ps = basis.mul(r.big.lift(s), gadget.expand(2, r.n))
    b = basis.add(basis.sub(r.big.lift(_error(stream, r.n)), basis.mul(a, r.big.lift(s_even))), ps)
    pk_seed = new_seed()
    a2 = torch.from_numpy(expand_uniform(pk_seed, (r.q,), (0,), r.n // 2, _TAG_PK))
    sb = r.small.basis
    s_ntt = r.small.lift(s_small)
    b2 = sb.sub(r.small.lift(_error(stream, r.n // 2)), sb.mul(a2, s_ntt))
    data = KEY_MAGIC + seed + pack(b, (r.p, r.q)) + pk_seed + pack(b2, (r.q,))
    return FoldSecret(s_ntt), data


def load_key(params: CkksParams, data: bytes) -> FoldKey:
    """Server: parse and validate a fold key (exact length, every residue below its prime)."""
    r = _of(params)
    data = bytes(data)
    if len(data) != _key_len(r) or data[:4] != KEY_MAGIC:
        raise FoldError(f"a fold key of {params.id} is {_key_len(r)} bytes starting {KEY_MAGIC!r}")
    big = r.n * (r.p.bit_length() + r.q.bit_length()) // 8
    pos = 4 + SEED_BYTES
    try:
        b = unpack(data[pos : pos + big], 1, (r.p, r.q), r.n, torch.device("cpu"))[0]
        b2 = unpack(data[pos + big + SEED_BYTES :], 1, (r.q,), r.n // 2, torch.device("cpu"))[0]
    except SerialError as e:
        raise FoldError(f"fold key: {e}") from None
    a = torch.from_numpy(expand_uniform(data[4:pos], (r.p, r.q), (0, 1), r.n, _TAG_KEY))
    a2 = torch.from_numpy(expand_uniform(data[pos + big : pos + big + SEED_BYTES], (r.q,), (0,), r.n // 2, _TAG_PK))
    return FoldKey(torch.stack((b, a)), torch.stack((b2, a2)))


def is_folded(data: bytes) -> bool:
    return bytes(data[:4]) == MAGIC


def fold(params: CkksParams, key: FoldKey, coeffs: np.ndarray, scale: float, noise_log2: float) -> bytes:
    """Server: a level-0 ciphertext's coefficient residues ``[2, N]`` (mod q0, in ``[0, q0)``) ->
    the folded download (see the module docstring)."""
    r = _of(params)
    c = torch.as_tensor(np.asarray(coeffs, dtype=np.int64)).reshape(2, r.n)
    basis, q = r.big.basis, r.q
    # c1 centred, lifted to [p, q0]; times (b, a); back to coefficients; ModDown by p
    c1 = r.big.lift(torch.where(c[1] > q // 2, c[1] - q, c[1]))
    t = r.big.inverse(basis.mul(c1.unsqueeze(0), key.switch))  # [2, 2, N]
    t_p = torch.where(t[:, 0] > r.p // 2, t[:, 0] - r.p, t[:, 0])
    diff = torch.remainder(t[:, 1] - t_p, q).reshape(1, -1)
    down = r.small.basis.mul(diff, torch.full_like(diff, pow(r.p, -1, q))).reshape(2, r.n)  # times p^-1 mod q0
    even = torch.stack((c[0, 0::2] + down[0, 0::2], down[1, 0::2]))
    folded = torch.remainder(2 * even, q)  # m(X) + m(-X) = 2 m_e(X²)
    # a fresh encryption of zero under s', and the flooding, in the small ring
    stream, half = Stream(), r.n // 2
    v = r.small.lift(torch.from_numpy(stream.ternary(half)))
    zero = r.small.inverse(r.small.basis.mul(v.unsqueeze(0), key.public))[:, 0]  # [2, N/2]
    noise = torch.from_numpy(np.stack((stream.cbd(half) + stream.gaussian(half, 2.0 ** (noise_log2 + 0.5)),
                                       stream.cbd(half))))
    out = torch.remainder(folded + zero + noise, q)
    bits = rounding.bits_for((q,), noise_log2 + 0.5)
    return MAGIC + rounding.round_to_bytes(out.numpy().astype(np.uint64).reshape(2, 1, half), (q,), 0, scale, bits)


def decrypt(params: CkksParams, secret: FoldSecret, data: bytes) -> tuple[np.ndarray, float]:
    """Client: a folded download -> (its N/4 slots, decoded; its scale). ``FoldError`` if the bytes
    are not a well-formed folded download of this parameter set."""
    r = _of(params)
    data = bytes(data)
    if not is_folded(data):
        raise FoldError("not a folded download")
    half = r.n // 2
    try:
        _, polys, bits, scale, body = rounding.parse(data[4:], half, lambda lv: (r.q,) if lv == 0 else None)
    except rounding.RoundedError as e:
        raise FoldError(str(e)) from None
    c = torch.from_numpy(rounding.unround(body, polys, half, (r.q,), bits).astype(np.int64))  # [2, 1, N/2]
    sb = r.small.basis
    m = sb.add(c[0], r.small.inverse(sb.mul(r.small.forward(c[1]), secret.s)))
    return r.encoder.decode(sb.center(m)[0].numpy().astype(np.float64), scale), scale

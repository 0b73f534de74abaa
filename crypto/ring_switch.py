"""Folded downloads: a ciphertext at level 0 or 1 sent in the ring of N/2, its two slot halves summed.

Why: a download whose values fit ``S/2`` slots (the MLP download: û in ``[0, 2F)``, 3072 of
8192 slots; the final h_L in ``[0, d)``) or repeat every ``S/2`` slots (the masked refresh of
h'', in the hidden layout's two frames) still travels as two polynomials of N coefficients.
Its fold, the polynomial ``m(X) + m(-X)``, has only even coefficients: it is ``2·m_e(X²)``, a
polynomial of the ring of N/2 in ``Y = X²``, and its slots are ``v_j + v_{j + S/2}``. Slot ``j``
of the big ring is ``m(ζ^(3^j))`` and ``3^(N/4) = 1 + N (mod 2N)``, so slot ``j + S/2`` sits at
``-ζ^(3^j)``; slot ``j`` of the small ring, at ``ζ^(2·3^j)``, is ``m_e`` there, the mean of the
two. A download sends ``2·m_e`` (the sum); a masked refresh sends ``m_e`` itself, which for a
polynomial in X² is the polynomial: the client re-encrypts ``m_e(X²)``, exactly what the server
masked.

The client keeps a second secret ``s'`` of the small ring and gives the server a key that
switches a ciphertext at level ``l <= TOP_LEVEL`` from ``s`` to ``s'(X²)``: one digit per prime
(``(b_i, a_i)`` over ``[p, q0, q1]`` with ``b_i = -a_i·s'(X²) + e_i + p·s·[q_i]``, where ``[q_i]``
is 1 mod q_i and 0 mod the other primes: the hybrid key switch of the backends with single-prime
digits; at level 0 digit 0 over ``[p, q0]`` alone). The server switches ``(c0, c1)``, keeps the
even coefficients of both components, doubles them for a download, and re-randomizes the
result in the small ring under ``s'`` (a public key ``(-a'·s' + e', a')`` mod ``p·q0·q1`` that
comes with the switching key; the encryption of zero joins the key switch before its division by
``p``, which divides its noise too), flooding a download and rounding it as every flooded download is
rounded (``crypto/rounding.py``). The client decrypts with ``s'``. What the server computed is a
public function of its ciphertext and the client's key, followed by a fresh encryption of zero
(and flooding, or the refresh's mask): circuit privacy holds as for the full ring's download. The
flooding std is ``2^(noise_log2 + 1/2)``: a slot of the small ring sums N/2 coefficients' noise,
so that keeps the noise per slot of the full ring's download.

Security: the switching key is, per digit, two RLWE samples of the ring of N/2 in ``s'`` (its
even and odd coefficients) over ``p·q0·q1`` (169 bits for ckks-n16384-l7-v2), the public key one
over the same modulus; the HE Standard allows 218 bits at N = 8192. ``s'``, the ``e``, the
seeds and all re-randomization and flooding noise come from the OS CSPRNG (``native.sampling``).

Wire forms (little endian; ``L = TOP_LEVEL``)::

    key:      b"VFK2" | 32-byte seed of the a_i | b_0 .. b_L, each over [p, q0..qL] (N each,
              bit-packed) | 32-byte seed of a' | b' over [p, q0..qL] (N/2, bit-packed)
    download: b"VFD1" | a rounded ciphertext of the ring of N/2 at its level (rounding's form)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from veil.crypto import rounding
from veil.crypto.native import rns
from veil.crypto.native.encoding import Encoder
from veil.crypto.native.modarith import Basis
from veil.crypto.native.ntt import NttTables
from veil.crypto.native.sampling import SEED_BYTES, Stream, expand_uniform, new_seed
from veil.crypto.native.serial import SerialError, pack, unpack
from veil.crypto.params import CkksParams
from veil.kernels.host import to_device

__all__ = ["KEY_MAGIC", "MAGIC", "TOP_LEVEL", "FoldKey", "FoldSecret", "FoldError", "is_folded", "make_key",
           "load_key", "fold", "decrypt", "decrypt_residues", "key_bytes", "secret_to_bytes", "secret_from_bytes"]

KEY_MAGIC, MAGIC = b"VFK2", b"VFD1"
#: The highest level the key switches from: the masked refresh's and the final download's.
TOP_LEVEL = 1
_TAG_KEY, _TAG_PK = 0x464B, 0x4650  # stream nonces of the two seeds' expansions (+ digit)


class FoldError(ValueError):
    """Bytes that are not a well-formed fold key or folded download of this parameter set."""


@dataclass(frozen=True)
class _Rings:
    n: int
    qs: tuple[int, ...]  # q0 .. q_level
    p: int  # the special prime
    big: NttTables  # [p, *qs] at N
    small: NttTables  # qs at N/2
    small_p: NttTables  # [p, *qs] at N/2: the public key's
    encoder: Encoder  # the ring of N/2
    cols: tuple[torch.Tensor, torch.Tensor]  # [p, *qs] and qs, as [L, 1]
    p_inv: torch.Tensor  # p^-1 mod q_i in every coefficient [L, N/2]: ModDown's constant as the kernels take it

    @property
    def primes(self) -> tuple[int, ...]:
        return (self.p, *self.qs)


@functools.lru_cache(maxsize=8)
def _rings(n: int, qs: tuple[int, ...], p: int, device: str) -> _Rings:
    big, small = Basis.of((p, *qs), device), Basis.of(qs, device)
    col = lambda v: torch.tensor(v, dtype=torch.int64, device=device).view(-1, 1)  # noqa: E731
    p_inv = col([pow(p, -1, q) for q in qs]).expand(-1, n // 2).contiguous()
    return _Rings(n, qs, p, NttTables(big, n), NttTables(small, n // 2), NttTables(big, n // 2), Encoder(n // 2),
                  (col((p, *qs)), col(qs)), p_inv)


def _of(params: CkksParams, level: int = TOP_LEVEL, device: torch.device | str = "cpu") -> _Rings:
    """The rings' tables for a fold from ``level``, on ``device`` (the server folds where its
    ciphertexts live; the client works on the CPU)."""
    if not 0 <= level <= TOP_LEVEL:
        raise FoldError(f"a fold switches levels 0..{TOP_LEVEL}, not {level}")
    return _rings(params.poly_modulus_degree, tuple(int(q) for q in params.primes[: level + 1]), int(params.primes[-1]),
                  str(torch.device(device)))


@dataclass(frozen=True)
class FoldSecret:
    """Client: ``s'`` in NTT form of the small ring ``[TOP_LEVEL + 1, N/2]``."""

    s: torch.Tensor


@dataclass(frozen=True)
class FoldKey:
    """Server: per level ``l`` (0..TOP_LEVEL) what a fold from ``l`` uses, contiguous on the
    fold's device and in NTT form: the switching key's digits ``[l + 1, 2 (b, a), l + 2 limbs
    (p, q0..q_l), N]`` and the small ring's public key ``(b', a')`` ``[2, l + 2, N/2]``."""

    switch: tuple[torch.Tensor, ...]
    public: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        """What it holds on its device (a server's resident bytes per tenant count it)."""
        return sum(t.numel() * t.element_size() for t in (*self.switch, *self.public))


def _bits(primes) -> int:
    return sum(q.bit_length() for q in primes)


def _key_len(r: _Rings) -> int:
    return 4 + 2 * SEED_BYTES + (len(r.qs) * r.n + r.n // 2) * _bits(r.primes) // 8


def key_bytes(params: CkksParams) -> int:
    """The exact length of a fold key of ``params``."""
    return _key_len(_of(params))


def _error(stream: Stream, n: int) -> torch.Tensor:
    return torch.from_numpy(stream.cbd(n))


def _digit_a(seed: bytes, r: _Rings, digit: int) -> torch.Tensor:
    return torch.from_numpy(expand_uniform(seed, r.primes, tuple(range(len(r.primes))), r.n, _TAG_KEY + digit))


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
    seed, s_big, s_x2 = new_seed(), r.big.lift(s), r.big.lift(s_even)
    parts = [KEY_MAGIC, seed]
    for i, q in enumerate(r.qs):
        gadget = torch.zeros(len(r.primes), 1, dtype=torch.int64)
        gadget[1 + i] = r.p % q  # p·s in digit i's own residue only
        a = _digit_a(seed, r, i)
        b = basis.add(basis.sub(r.big.lift(_error(stream, r.n)), basis.mul(a, s_x2)),
                      basis.mul(s_big, gadget.expand(-1, r.n)))
        parts.append(pack(b, r.primes))
    pk_seed = new_seed()
    sp = r.small_p
    b2 = sp.basis.sub(sp.lift(_error(stream, r.n // 2)), sp.basis.mul(_public_a(pk_seed, r), sp.lift(s_small)))
    parts += [pk_seed, pack(b2, r.primes)]
    return FoldSecret(r.small.lift(s_small)), b"".join(parts)


def secret_to_bytes(params: CkksParams, secret: FoldSecret) -> bytes:
    """Client: ``s'``'s N/2 ternary coefficients, one signed byte each (the client's key file)."""
    s = _of(params).small.inverse_centred(secret.s)[0]  # centred mod q0: the coefficients themselves
    return s.to(torch.int8).numpy().tobytes()


def secret_from_bytes(params: CkksParams, data: bytes) -> FoldSecret:
    """Client: ``s'`` back from ``secret_to_bytes``; ``FoldError`` unless N/2 ternary bytes."""
    r = _of(params)
    s = np.frombuffer(data, dtype=np.int8)
    if s.shape != (r.n // 2,) or np.abs(s).max(initial=0) > 1:
        raise FoldError(f"a fold secret is {r.n // 2} ternary coefficients")
    return FoldSecret(r.small.lift(torch.from_numpy(s.astype(np.int64))))


def _public_a(seed: bytes, r: _Rings) -> torch.Tensor:
    return torch.from_numpy(expand_uniform(seed, r.primes, tuple(range(len(r.primes))), r.n // 2, _TAG_PK))


def load_key(params: CkksParams, data: bytes, device: torch.device | str = "cpu") -> FoldKey:
    """Server: parse and validate a fold key (exact length, every residue below its prime); its
    tensors on ``device``, where ``fold`` then runs."""
    r = _of(params)
    data = bytes(data)
    if len(data) != _key_len(r) or data[:4] != KEY_MAGIC:
        raise FoldError(f"a fold key of {params.id} is {_key_len(r)} bytes starting {KEY_MAGIC!r}")
    digit = r.n * _bits(r.primes) // 8
    seed, pos = data[4 : 4 + SEED_BYTES], 4 + SEED_BYTES
    keys = []
    try:
        for i in range(len(r.qs)):
            b = unpack(data[pos : pos + digit], 1, r.primes, r.n, torch.device("cpu"))[0]
            keys.append(torch.stack((b, _digit_a(seed, r, i))))
            pos += digit
        b2 = unpack(data[pos + SEED_BYTES :], 1, r.primes, r.n // 2, torch.device("cpu"))[0]
    except SerialError as e:
        raise FoldError(f"fold key: {e}") from None
    switch = torch.stack(keys).to(device)
    public = torch.stack((b2, _public_a(data[pos : pos + SEED_BYTES], r))).to(device)
    levels = range(TOP_LEVEL + 1)
    return FoldKey(tuple(switch[: lv + 1, :, : lv + 2].contiguous() for lv in levels),
                   tuple(public[:, : lv + 2].contiguous() for lv in levels))


def is_folded(data: bytes) -> bool:
    return bytes(data[:4]) == MAGIC


def _centre(x: torch.Tensor, q: int | torch.Tensor) -> torch.Tensor:
    """Residues in ``[0, q)`` -> centred ``(-q/2, q/2]`` (``q``: one prime, or a column of them)."""
    return torch.where(x > q // 2, x - q, x)


def fold(params: CkksParams, key: FoldKey, coeffs: np.ndarray, level: int, scale: float,
         noise_log2: float | None, round_log2: float | None = None) -> bytes:
    """Server: a ciphertext's coefficient residues ``[2, level + 1, N]`` (in ``[0, q)``; numpy, or
    a tensor, moved to the key's device where the fold runs) -> the folded download.
    ``noise_log2`` (a download): the even part doubled (the slot halves' sum), flooded at
    ``2^(noise_log2 + 1/2)`` and rounded above that floor; ``None`` (a masked refresh): the even
    part itself, not flooded, rounded above ``2^round_log2``."""
    c = coeffs if isinstance(coeffs, torch.Tensor) else torch.from_numpy(np.asarray(coeffs, dtype=np.int64))
    return fold_rows(params, [key], c.unsqueeze(0), level, scale, noise_log2, round_log2)[0]


def fold_rows(params: CkksParams, keys: Sequence[FoldKey], coeffs: torch.Tensor, level: int, scale: float,
              noise_log2: float | None, round_log2: float | None = None) -> list[bytes]:
    """``fold`` of a batch's rows ``[B, 2, level + 1, N]``, row b under ``keys[b]`` (its
    session's), all of them in one pass of batched operations and one copy to the host, as the
    rest of a batched step runs. Each row draws its randomness as a fold of its own would, in
    row order."""
    if noise_log2 is None and round_log2 is None:
        raise ValueError("an unflooded fold needs the floor to round to")
    dev = keys[0].switch[0].device
    r = _of(params, level, dev)
    primes_col, q = r.cols
    rows = len(keys)
    c = coeffs.to(dev, torch.int64).reshape(rows, 2, level + 1, r.n)
    basis, half = r.big.basis, r.n // 2
    # the digits c1 mod q_i, centred, lifted to [p, q0..] in one transform, and their inner product
    # with each row's key (the key switch's: one C pass on the CPU, one Triton launch on CUDA,
    # where a product per digit took a dozen torch kernels); back to coefficients
    digits = r.big.lift(_centre(c[:, 1], q))  # [B, level + 1, level + 2, N]
    switch = [k.switch[level].transpose(0, 1) for k in keys]
    inner = rns.key_inner(digits[0], switch[0], basis)[None] if rows == 1 else \
        rns.key_inner_many(digits, [switch], basis)[0]
    t = r.big.inverse(inner)  # [B, 2, level + 2, N]
    # a fresh encryption of zero under s'(X²) (the small ring's, on the even coefficients), over
    # p·Q like the key switch, so that the ModDown divides its noise by p (as SEAL encrypts at
    # the key level and switches down): it re-randomizes c1 and adds almost no noise
    stream, sp = Stream(), r.small_p
    draws = [(stream.ternary(half), stream.cbd(half), stream.cbd(half),
              stream.gaussian(half, 2.0 ** (noise_log2 + 0.5)) if noise_log2 is not None else None)
             for _ in range(rows)]
    v = sp.lift(to_device(torch.from_numpy(np.stack([d[0] for d in draws])), dev))  # [B, level + 2, N/2]
    if rows == 1:
        zero = rns.mul_plain(keys[0].public[level], v[0], sp.basis)[None]
    else:  # each row's public key times its own v (the rows kernel's per-session layout on CUDA)
        zero = rns.mul_plain(torch.stack([k.public[level] for k in keys]), v.unsqueeze(1), sp.basis)
    zero = sp.inverse(zero)  # [B, 2, level + 2, N/2]
    errors = to_device(torch.from_numpy(np.stack([np.stack(d[1:3]) for d in draws])), dev).unsqueeze(2)
    t[..., 0::2] = torch.remainder(t[..., 0::2] + zero + errors, primes_col)
    # ModDown by p, then keep the even coefficients of c0 + ks0 and ks1
    diff = torch.remainder(t[:, :, 1:, 0::2] - _centre(t[:, :, :1, 0::2], r.p), q)
    down = rns.mul_plain(diff, r.p_inv, r.small.basis)
    even = torch.stack((c[:, 0, :, 0::2] + down[:, 0], down[:, 1]), dim=1)  # [B, 2, level + 1, N/2]
    if noise_log2 is not None:  # a download: m(X) + m(-X) = 2 m_e(X²), flooded
        even = 2 * even
        even[:, 0] += to_device(torch.from_numpy(np.stack([d[3] for d in draws])), dev).unsqueeze(1)
    out = torch.remainder(even, q).cpu().numpy().astype(np.uint64)
    bits = rounding.bits_for(r.qs, noise_log2 + 0.5 if noise_log2 is not None else round_log2)
    return [MAGIC + rounding.round_to_bytes(row, r.qs, level, scale, bits) for row in out]


def decrypt_residues(params: CkksParams, secret: FoldSecret, data: bytes) -> tuple[np.ndarray, int, float]:
    """Client: a folded ciphertext -> (its plaintext polynomial's residues ``[level + 1, N/2]``
    in coefficient form, ``[0, q)``; its level; its scale). ``FoldError`` if the bytes are not a
    well-formed folded ciphertext of this parameter set."""
    data = bytes(data)
    if not is_folded(data):
        raise FoldError("not a folded download")
    half = params.poly_modulus_degree // 2
    primes_of = lambda lv: _of(params, lv).qs if 0 <= lv <= TOP_LEVEL else None  # noqa: E731
    try:
        level, polys, bits, scale, body = rounding.parse(data[4:], half, primes_of)
    except rounding.RoundedError as e:
        raise FoldError(str(e)) from None
    r = _of(params, level)
    if polys != 2:
        raise FoldError("a folded ciphertext has two polynomials")
    c = torch.from_numpy(rounding.unround(body, polys, half, r.qs, bits).astype(np.int64))  # [2, L, N/2]
    sb = r.small.basis
    m = sb.add(c[0], r.small.inverse(rns.mul_plain(r.small.forward(c[1]), secret.s[: level + 1], sb)))
    return m.numpy(), level, scale


def decrypt(params: CkksParams, secret: FoldSecret, data: bytes) -> tuple[np.ndarray, float]:
    """Client: a folded download -> (its N/4 slots, decoded; its scale). ``FoldError`` if the bytes
    are not a well-formed folded download of this parameter set."""
    m, level, scale = decrypt_residues(params, secret, data)
    r = _of(params, level)
    # the centred integers as floats: exact balanced digits summed in floats, not rounding.crt's
    # Python integers (a client decrypts five per layer: benchmarks/results/2026-12-07-client-crt)
    coeffs = rns.digits_to_float(rns.balanced_digits(torch.from_numpy(m), r.small.basis), r.qs)
    return r.encoder.decode(coeffs.numpy(), scale), scale

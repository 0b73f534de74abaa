"""Keys and encryption of the native backend (RLWE over the chain of ``RnsContext``).

* secret key ``s``: ternary, uniform on {-1, 0, 1}; kept in NTT form over all limbs.
* public key ``(b, a) = (-a*s + e, a)`` over the data limbs, ``a`` expanded from a seed.
* key-switching keys (relinearization ``s^2 -> s``, Galois ``s(X^g) -> s``), hybrid with the
  one special prime ``p`` and one data prime per digit (dnum = L+1): for digit ``j``,
  ``(b_j, a_j) = (-a_j*s + e_j + p*s'*[limb == q_j], a_j)`` over ``[p, q_0..q_L]``. A key
  switch (``keyswitch``) of ``d`` sums ``[d]_{q_j} * key_j`` and divides by ``p``, leaving
  ``d*s'`` plus ``sum_j [d]_{q_j} e_j / p + round-off``: with centred digits ``|[d]_{q_j}| <=
  q_j/2`` and ``|e_j| <= 21``, each coefficient is below ``sum_j q_j/2 * 21 * N / p + (1 +
  ||s||_1)/2``: 2^17.8 for ckks-n16384-l7-v2 (the digits of q_0 ~ p and the 55-bit q_1
  dominate; typically ~2^9 by the central limit), against a 2^36 scale.
* encryption: symmetric ``(-a*s + e + m, a)`` with ``a`` from a fresh seed (the upload carries
  ``c0`` and the seed); public-key ``(v*b + e0 + m, v*a + e1)`` with ternary ``v``.
Errors are centred binomial (eta 21, sigma 3.24); all randomness from ``sampling``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from veil.crypto.native import rns
from veil.crypto.native.context import RnsContext
from veil.crypto.native.sampling import Stream, expand_uniform, new_seed
from veil.kernels.host import to_device

__all__ = ["SecretKey", "PublicKey", "SwitchKey", "RowKeys", "gen_secret", "gen_public", "gen_switch_key",
           "rotation_key", "galois_b", "expand_a", "key_a", "encrypt_symmetric", "encrypt_public", "public_zeros", "decrypt_ntt",
           "TAG_PK", "TAG_CT"]

#: Stream tags of seed expansions (digit ``j`` of a key-switching key uses tag ``j``).
TAG_PK = 1 << 16
TAG_CT = 2 << 16


@dataclass
class SecretKey:
    s: torch.Tensor  # NTT form, master limbs [L+2, N]
    neg: torch.Tensor  # -s mod q_i, the same limbs: a weight of an encryption's one multiply-accumulate


@dataclass
class PublicKey:
    b: torch.Tensor  # NTT form, data limbs [L+1, N]
    a: torch.Tensor
    seed: bytes


@dataclass
class SwitchKey:
    """``data[0]`` = the ``b_j``, ``data[1]`` = the ``a_j``: ``[2, L+1 digits, L+2 limbs, N]``."""

    data: torch.Tensor
    seed: bytes
    _views: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def at(self, level: int) -> torch.Tensor:
        """The key for digits and limbs of ``level``: a view ``[2, level+1, level+2, N]``, made
        once per level (every key switch asks, each row of a batch apart: two slicing ops
        apiece, ~300 per session per step)."""
        view = self._views.get(level)
        if view is None:
            view = self._views[level] = self.data[:, : level + 1, : level + 2]
        return view


def rotation_key(ctx: RnsContext, g: int, key: SwitchKey) -> SwitchKey:
    """A Galois key as rotations hold it: ``sigma_g^-1`` applied to every ``(b_j, a_j)`` (NTT
    form, so a gather). The product is pointwise, so ``sum_j sigma_g(d_j) * k_j = sigma_g(sum_j
    d_j * sigma_g^-1(k_j))``, and ModDown commutes with ``sigma_g`` (it permutes coefficients and
    negates some; centring is odd-symmetric): a rotation then meets the digits of ``c1`` as they
    are and gathers only its output, 2(l+1) limbs instead of the (l+1)(l+2) of the digits, which
    every rotation of a hoisted set reads again (``keyswitch``). Bit for bit the same result."""
    inverse = ctx.galois_index(pow(g, -1, 2 * ctx.n))
    return SwitchKey(key.data.index_select(-1, inverse), key.seed)


def galois_b(ctx: RnsContext, g: int, key: SwitchKey) -> torch.Tensor:
    """The ``b_j`` of a rotation key as made (``sigma_g`` undoes ``rotation_key``): what travels."""
    return key.data[0].index_select(-1, ctx.galois_index(g))


@dataclass(frozen=True)
class RowKeys:
    """One switching key per row of a session batch (``NativeBatch``), in row order."""

    rows: tuple[SwitchKey, ...]


def _to_ntt(ctx: RnsContext, coeffs: np.ndarray, ntt) -> torch.Tensor:
    return ntt.lift(torch.from_numpy(np.ascontiguousarray(coeffs)).to(ctx.device))


def _error(ctx: RnsContext, stream: Stream, shape: tuple[int, ...], ntt) -> torch.Tensor:
    e = stream.cbd(int(np.prod(shape)) * ctx.n).reshape(*shape, ctx.n)
    return _to_ntt(ctx, e, ntt)


def gen_secret(ctx: RnsContext) -> SecretKey:
    return secret_from_coefficients(ctx, Stream().ternary(ctx.n))


def secret_from_coefficients(ctx: RnsContext, coeffs: np.ndarray) -> SecretKey:
    """The secret key of N ternary coefficients (int64), in NTT form over the master limbs."""
    basis, ntt = ctx.master
    s = _to_ntt(ctx, coeffs, ntt)
    return SecretKey(s, basis.neg(s))


def expand_a(ctx: RnsContext, seed: bytes, level: int, tag: int) -> torch.Tensor:
    """The uniform polynomial of a seed over the data limbs of ``level`` (NTT form)."""
    primes = ctx.data_primes[: level + 1]
    a = expand_uniform(seed, primes, tuple(range(1, level + 2)), ctx.n, tag)
    return to_device(torch.from_numpy(a), ctx.device)


def key_a(ctx: RnsContext, seed: bytes, digits: int) -> torch.Tensor:
    """The ``a_j`` of a key-switching key: ``[digits, L+2, N]`` over the master limbs."""
    ids = tuple(range(len(ctx.master_primes)))
    a = np.stack([expand_uniform(seed, ctx.master_primes, ids, ctx.n, j) for j in range(digits)])
    return torch.from_numpy(a).to(ctx.device)


def gen_public(ctx: RnsContext, sk: SecretKey) -> PublicKey:
    basis, ntt = ctx.data(ctx.top)
    seed = new_seed()
    a = expand_a(ctx, seed, ctx.top, TAG_PK)
    e = _error(ctx, Stream(), (), ntt)
    b = basis.sub(e, basis.mul(a, sk.s[1:]))
    return PublicKey(b, a, seed)


def gen_switch_key(ctx: RnsContext, sk: SecretKey, target: torch.Tensor) -> SwitchKey:
    """Key switching ``target`` (NTT form, master limbs) to ``sk``."""
    basis, ntt = ctx.master
    digits = ctx.top + 1
    seed = new_seed()
    a = key_a(ctx, seed, digits)
    e = _error(ctx, Stream(), (digits,), ntt)
    b = basis.sub(e, basis.mul(a, sk.s))
    # digit j gains p * target in the limb of q_j (master index j + 1)
    data_basis, _ = ctx.data(ctx.top)
    gadget = ctx.p_mod(ctx.top).mul(target[1:])  # [digits, N]
    j = torch.arange(digits, device=ctx.device)
    b[j, j + 1] = data_basis.add(b[j, j + 1], gadget)
    return SwitchKey(torch.stack((b, a)), seed)


def encrypt_symmetric(ctx: RnsContext, sk: SecretKey, m: torch.Tensor, level: int
                      ) -> tuple[torch.Tensor, bytes]:
    """``m`` (NTT form, data limbs of ``level``) -> ``(c0, seed)``; ``c1 = expand_a(seed)``."""
    basis, ntt = ctx.data(level)
    seed = new_seed()
    a = expand_a(ctx, seed, level, TAG_CT)
    e = _error(ctx, Stream(), (), ntt)
    # e + m - a s as one multiply-accumulate (C on the CPU, Triton on CUDA), one pass where a
    # product and two eager passes were (benchmarks/results/2026-12-07-client-refresh)
    ones = ctx.ones(level)
    c0 = rns.mac([e, m, a], [ones, ones, sk.neg[1 : level + 2]], basis)
    return c0, seed


def public_zeros(ctx: RnsContext, pks: Sequence[PublicKey], level: int) -> torch.Tensor:
    """Fresh public-key encryptions of zero ``[len(pks), 2, level+1, N]``, row b under
    ``pks[b]``: every row's ternary ``v`` and errors come from one CSPRNG stream and are
    transformed together (one NTT for a batch of sessions on a GPU, not one per row)."""
    basis, ntt = ctx.data(level)
    stream, rows = Stream(), len(pks)
    v = _to_ntt(ctx, stream.ternary(rows * ctx.n).reshape(rows, ctx.n), ntt)  # [B, L+1, N]
    e = _error(ctx, stream, (rows, 2), ntt)
    pk = torch.stack([torch.stack((p.b[: level + 1], p.a[: level + 1])) for p in pks])
    return basis.add(basis.mul(v.unsqueeze(1), pk), e)


def encrypt_public(ctx: RnsContext, pk: PublicKey, m: torch.Tensor, level: int) -> torch.Tensor:
    """``m`` (NTT form, data limbs of ``level``) -> ``[2, level+1, N]``."""
    c = public_zeros(ctx, [pk], level)[0]
    c[0] = ctx.data(level)[0].add(c[0], m)
    return c


def decrypt_ntt(ctx: RnsContext, sk: SecretKey, data: torch.Tensor, level: int) -> torch.Tensor:
    """``c0 + c1*s (+ c2*s^2)`` in NTT form over the data limbs of ``level``."""
    basis, _ = ctx.data(level)
    s = sk.s[1 : level + 2]
    acc, power = data[0], s
    for i in range(1, data.shape[0]):
        acc = basis.add(acc, rns.mul_plain(data[i], power, basis))
        if i + 1 < data.shape[0]:
            power = basis.mul(power, s)
    return acc

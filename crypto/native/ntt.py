"""Negacyclic NTT over each limb of ``[..., limbs, N]`` residue tensors, and automorphisms.

Convention (SEAL's, so NTT-form residues equal SEAL's bit for bit): ``psi`` is the smallest
primitive 2N-th root of unity mod q; the forward transform is the merged Cooley-Tukey
butterfly network with twiddles ``psi^brev(k)`` and leaves slot ``j`` holding the evaluation
``a(psi^(2*brev(j) + 1))`` (bit-reversed order); the inverse is the Gentleman-Sande network
with ``psi^-brev(k)``, the factor ``1/N`` folded into its last stage. One stage is one batched
operation over every limb and leading dim (a loop over log N stages, never over coefficients).

In NTT form an automorphism ``X -> X^g`` is a permutation of the evaluation points, the same
for every prime: ``automorphism_index(g)`` gives the gather index.
"""

from __future__ import annotations

import functools

import torch

from veil.crypto.native.modarith import Basis

__all__ = ["NttTables", "bit_reverse", "min_root_2n", "automorphism_index", "coeff_automorphism"]


def bit_reverse(n: int) -> list[int]:
    """``brev`` over ``log2 n`` bits for ``0..n-1``."""
    bits = n.bit_length() - 1
    return [int(f"{i:0{bits}b}"[::-1], 2) if bits else 0 for i in range(n)]


def min_root_2n(q: int, n: int) -> int:
    """The smallest primitive ``2n``-th root of unity mod ``q`` (what SEAL's NTT uses)."""
    if (q - 1) % (2 * n):
        raise ValueError(f"{q} is not 1 mod {2 * n}")
    x, g = 2, None
    while g is None:
        cand = pow(x, (q - 1) // (2 * n), q)
        if pow(cand, n, q) == q - 1:  # order exactly 2n (2n is a power of two)
            g = cand
        x += 1
    best, cur, g2 = g, g, g * g % q
    for _ in range(n):
        best = min(best, cur)
        cur = cur * g2 % q
    return best


@functools.lru_cache(maxsize=64)
def _twiddles(q: int, n: int) -> tuple[list[int], list[int], int]:
    psi = min_root_2n(q, n)
    ipsi = pow(psi, -1, q)
    fw, inv = [1] * n, [1] * n
    for i in range(1, n):
        fw[i] = fw[i - 1] * psi % q
        inv[i] = inv[i - 1] * ipsi % q
    rev = bit_reverse(n)
    return [fw[r] for r in rev], [inv[r] for r in rev], pow(n, -1, q)


class NttTables:
    """Twiddles of one basis at ring degree ``n``, on the basis's device."""

    def __init__(self, basis: Basis, n: int) -> None:
        self.basis, self.n = basis, n
        self.log_n = n.bit_length() - 1
        dev = basis.device
        fw, inv, last_lo, last_hi = [], [], [], []
        for q in basis.primes:
            f, i, n_inv = _twiddles(q, n)
            fw.append(f)
            inv.append(i)
            last_lo.append(n_inv)
            last_hi.append(i[1] * n_inv % q)
        as_t = functools.partial(torch.tensor, dtype=torch.int64, device=dev)
        self.fw = basis.const(as_t(fw).unsqueeze(-1), ndim=3)  # [L, N, 1]
        self.inv = basis.const(as_t(inv).unsqueeze(-1), ndim=3)
        # the inverse's last stage: lo * n^-1, hi * psi^-brev(1) * n^-1
        self.last_lo = basis.const(as_t(last_lo).view(-1, 1, 1), ndim=3)
        self.last_hi = basis.const(as_t(last_hi).view(-1, 1, 1), ndim=3)
        self.q3, _ = basis.cols(3)

    def limbs(self, s: slice) -> NttTables:
        """The tables of a run of limbs (views, no recomputation)."""
        out = object.__new__(NttTables)
        out.basis, out.n, out.log_n = self.basis.limbs(s), self.n, self.log_n
        out.fw, out.inv = self.fw.limbs(s), self.inv.limbs(s)
        out.last_lo, out.last_hi = self.last_lo.limbs(s), self.last_hi.limbs(s)
        out.q3 = self.q3[s]
        return out

    def _check(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.n or x.shape[-2] != len(self.basis):
            raise ValueError(f"expected [..., {len(self.basis)}, {self.n}], got {tuple(x.shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Coefficients ``[0, q)`` -> NTT form (bit-reversed evaluations)."""
        self._check(x)
        lead, L, n, q = x.shape[:-2], x.shape[-2], self.n, self.q3
        m = 1
        while m < n:
            t = n // (2 * m)
            v = x.reshape(*lead, L, m, 2, t)
            u, w = v[..., 0, :], self.fw[:, m : 2 * m].mul(v[..., 1, :])
            lo = u + w - q
            hi = u - w
            x = torch.stack((lo + ((lo >> 63) & q), hi + ((hi >> 63) & q)), dim=-2)
            m *= 2
        return x.reshape(*lead, L, n)

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        """NTT form -> coefficients ``[0, q)``."""
        self._check(x)
        lead, L, n, q = x.shape[:-2], x.shape[-2], self.n, self.q3
        h = n // 2
        while h >= 1:
            t = n // (2 * h)
            v = x.reshape(*lead, L, h, 2, t)
            u, w = v[..., 0, :], v[..., 1, :]
            lo, hi = u + w - q, u - w
            lo = lo + ((lo >> 63) & q)
            if h > 1:
                hi = self.inv[:, h : 2 * h].mul(hi)  # |hi| < q: the product takes it as is
            else:
                lo, hi = self.last_lo.mul(lo), self.last_hi.mul(hi)
            x = torch.stack((lo, hi), dim=-2)
            h //= 2
        return x.reshape(*lead, L, n)


@functools.lru_cache(maxsize=512)
def _automorphism_index_list(g: int, n: int) -> tuple[int, ...]:
    rev = bit_reverse(n)
    pos = {2 * r + 1: j for j, r in enumerate(rev)}  # evaluation exponent -> NTT slot
    return tuple(pos[(2 * rev[j] + 1) * g % (2 * n)] for j in range(n))


def automorphism_index(g: int, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Gather index ``idx`` with ``ntt(a(X^g))[..., j] = ntt(a)[..., idx[j]]`` (odd ``g``)."""
    if g % 2 == 0:
        raise ValueError("a Galois element is odd")
    return torch.tensor(_automorphism_index_list(g % (2 * n), n), dtype=torch.int64, device=device)


def coeff_automorphism(x: torch.Tensor, g: int, basis: Basis) -> torch.Tensor:
    """``a(X) -> a(X^g)`` on coefficients ``[0, q)`` (``X^N = -1``): a signed permutation."""
    n = x.shape[-1]
    e = torch.arange(n, device=x.device) * g % (2 * n)
    out = torch.zeros_like(x)
    src = x.clone()
    neg = e >= n
    src[..., neg] = basis.neg(src[..., neg])
    out[..., e % n] = src
    return out

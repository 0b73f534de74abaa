"""The modulus chain of one parameter set on one device: bases, NTT tables, RNS constants.

Limb order. Every tensor of this backend orders its limbs ``[p, q_0, q_1, ..., q_L]`` (the
special prime first, the data primes by level): the data limbs of a ciphertext at level ``l``
are the run ``[1, l+2)`` and the extended basis a key switch works in is ``[0, l+2)``. Both
are contiguous runs of the same master tables, and of every key-switching key, so a level
never copies a key or a table (views only).
"""

from __future__ import annotations

import functools
import math

import torch

from veil.crypto.native.modarith import Basis, MulConst
from veil.crypto.native.ntt import NttTables, automorphism_index
from veil.crypto.params import CkksParams

__all__ = ["RnsContext", "galois_element"]


def _per_context(method):
    """``functools.cache`` kept in the context itself. A cache on the method would be the
    class's, keyed by ``self``: it would keep every context ever made alive, with its tables
    and constants (on CUDA, device memory), long after its backend is gone. A server makes a
    backend for every key upload, including those it then refuses."""
    name = method.__name__

    @functools.wraps(method)
    def cached(self, *args):
        key = (name, args)
        try:  # one lookup on the hot path: data(level) is asked for hundreds of times a layer
            return self._memo[key]
        except KeyError:
            out = self._memo[key] = method(self, *args)
            return out

    return cached


def galois_element(step: int, n: int) -> int:
    """Galois element of a left rotation of the N/2 slots by ``step``: ``3^step mod 2N``
    (3 has order N/2 mod 2N, so a step and the step minus N/2 are the same rotation)."""
    half = n // 2
    if step % half == 0 or abs(step) >= half:
        raise ValueError(f"rotation step {step} out of range for N={n}")
    return pow(3, step % half, 2 * n)


class RnsContext:
    """Tables of one parameter set on one device (built once, read-only afterwards)."""

    def __init__(self, params: CkksParams, device: torch.device | str = "cpu", compile: bool = False) -> None:
        params.validate()
        self.params = params
        self.n = params.poly_modulus_degree
        self.device = torch.device(device)
        chain = tuple(int(q) for q in params.primes)
        self.data_primes, self.special_prime = chain[:-1], chain[-1]
        self.master_primes = (self.special_prime,) + self.data_primes
        self.top = params.top_level
        # key_inner sums up to L+1 lazy products (each |.| < q) in int64 before reducing
        if (self.top + 1) * max(chain) >= 2**63:
            raise ValueError(f"{params.id}: too many digits for int64 accumulation")
        self._basis = Basis.of(self.master_primes, self.device)
        self.compile = compile
        self._ntt = NttTables(self._basis, self.n, compile)
        self._memo: dict[tuple, object] = {}

    # ---- bases ---------------------------------------------------------------------------------
    def _check_level(self, level: int) -> None:
        if not 0 <= level <= self.top:
            raise ValueError(f"level {level} outside [0, {self.top}]")

    @_per_context  # a handful of levels
    def data(self, level: int) -> tuple[Basis, NttTables]:
        """Basis and NTT tables of the data limbs ``q_0..q_level``."""
        self._check_level(level)
        s = slice(1, level + 2)
        return self._basis.limbs(s), self._ntt.limbs(s)

    @_per_context
    def ext(self, level: int) -> tuple[Basis, NttTables]:
        """``[p, q_0..q_level]``: the basis a key switch at ``level`` works in."""
        self._check_level(level)
        s = slice(0, level + 2)
        return self._basis.limbs(s), self._ntt.limbs(s)

    @functools.cached_property
    def special(self) -> tuple[Basis, NttTables]:
        s = slice(0, 1)
        return self._basis.limbs(s), self._ntt.limbs(s)

    @property
    def master(self) -> tuple[Basis, NttTables]:
        return self._basis, self._ntt

    def level_modulus(self, level: int) -> int:
        return math.prod(self.data_primes[: level + 1])

    # ---- constants -----------------------------------------------------------------------------
    def _const(self, basis: Basis, values: list[int]) -> MulConst:
        w = torch.tensor(values, dtype=torch.int64, device=self.device).view(-1, 1)
        return basis.const(w)

    @_per_context
    def rescale_const(self, level: int) -> MulConst:
        """``q_level^-1 mod q_i`` for ``i < level`` (a rescale at ``level``)."""
        ql = self.data_primes[level]
        basis, _ = self.data(level - 1)
        return self._const(basis, [pow(ql, -1, q) for q in basis.primes])

    @_per_context
    def p_inv(self, level: int) -> MulConst:
        """``p^-1 mod q_i``, ``i <= level`` (ModDown)."""
        basis, _ = self.data(level)
        return self._const(basis, [pow(self.special_prime, -1, q) for q in basis.primes])

    @_per_context
    def p_mod(self, level: int) -> MulConst:
        """``p mod q_i``, ``i <= level`` (the gadget factor of a key-switching key)."""
        basis, _ = self.data(level)
        return self._const(basis, [self.special_prime % q for q in basis.primes])

    @_per_context
    def radix_planes(self, level: int, radices: tuple[int, ...]) -> torch.Tensor:
        """``radix_k mod q_i`` as whole planes ``[K, level+1, N]``: turns digits ``y_k`` of an
        integer ``sum_k y_k * radix_k`` into it, as the weights of ``rns.mac``
        (``rns.digits_to_ntt``)."""
        basis, _ = self.data(level)
        w = torch.tensor([[r % q for q in basis.primes] for r in radices], dtype=torch.int64, device=self.device)
        return w.unsqueeze(-1).expand(-1, -1, self.n).contiguous()

    @_per_context
    def ones(self, level: int) -> torch.Tensor:
        """The constant polynomial 1 in NTT form over the data limbs of ``level`` (all ones): a
        weight of ``rns.mac`` that adds its term as it is."""
        return torch.ones(level + 1, self.n, dtype=torch.int64, device=self.device)

    @_per_context
    def galois_index(self, g: int) -> torch.Tensor:
        return automorphism_index(g, self.n, self.device)

    @_per_context  # a product's baby steps: the same few sets every time
    def galois_indices(self, elements: tuple[int, ...]) -> torch.Tensor:
        """``[len(elements), N]``: the gather indices of a hoisted set of rotations, stacked once."""
        return torch.stack([self.galois_index(g) for g in elements])

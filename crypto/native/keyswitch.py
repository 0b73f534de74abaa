"""Key switching: relinearization, rotation, and hoisted rotations.

A key switch of a polynomial ``d`` at level ``l`` (NTT form): ``decompose`` (INTT, centred
digits ``[d]_{q_j}``, each lifted to ``[p, q_0..q_l]`` and NTT'd), ``key_inner`` with the key's
view for the level, ``mod_down`` (divide by ``p``). Noise bound: ``keys`` module docstring.

Rotation by a Galois element ``g``: in NTT form the automorphism ``sigma_g`` is a gather
(``ntt``), so ``rot(c0, c1) = (c0^g + KS_g(c1^g)_0, KS_g(c1^g)_1)``. The Galois keys are held
permuted by ``sigma_g^-1`` (``keys.rotation_key``), which turns that into
``sigma_g(c0 + KS'_g(c1))``: the key switch meets the digits of ``c1`` as they are, and one
gather of its 2(l+1) output limbs applies the automorphism.

Hoisting (``rotate_many``): the digits of ``c1`` are decomposed and lifted once, and every step
multiplies the same digits by its own key (one session's keys in one pass over the digits:
``rns.key_inner_many``); ModDown and the gathers are batched over the steps.
Hoisted rotations are bit-identical to single ones (a test checks it), and both to the textbook
order that gathers ``c1`` first: ModDown commutes with ``sigma_g`` (a signed permutation of
coefficients; centring is odd-symmetric for odd primes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from veil.crypto.native import ntt, rns
from veil.crypto.native.context import RnsContext
from veil.crypto.native.keys import RowKeys, SwitchKey

__all__ = ["switch", "relinearize", "rotate", "rotate_hoisted"]


def _inner(digits: torch.Tensor, key: SwitchKey | RowKeys, ctx: RnsContext, level: int) -> torch.Tensor:
    """The key inner product of ``digits`` ``[*rows, K, L, N]``; with ``RowKeys`` (a batch of
    sessions) row b meets row b's key. Everything around it (the NTTs of ModUp and ModDown) runs
    on the whole batch at once; only this product reads per-row key material."""
    return _inner_many(digits, [key], ctx, level)[0]


def _inner_many(digits: torch.Tensor, keys: Sequence[SwitchKey | RowKeys], ctx: RnsContext,
                level: int) -> torch.Tensor:
    """``_inner`` against each of several keys (a hoisted set): ``[S, *rows, 2, L, N]``, in one
    pass (``rns.key_inner_many``: one launch on CUDA, each key read in place)."""
    ext_basis, _ = ctx.ext(level)
    views = [[k.at(level) for k in key.rows] if isinstance(key, RowKeys) else key.at(level) for key in keys]
    return rns.key_inner_many(digits, views, ext_basis, ctx.compile)


def switch(d: torch.Tensor, key: SwitchKey | RowKeys, ctx: RnsContext, level: int,
           plus: torch.Tensor | None = None) -> torch.Tensor:
    """``[..., level+1, N]`` -> ``[..., 2, level+1, N]``: the key switch of ``d`` (plus ``plus``,
    ``rns.mod_down``'s, added in ModDown's last pass)."""
    return rns.mod_down(_inner(rns.decompose(d, ctx, level), key, ctx, level), ctx, level, plus)


def relinearize(c: torch.Tensor, key: SwitchKey, ctx: RnsContext, level: int) -> torch.Tensor:
    """``[..., 3, l+1, N]`` -> ``[..., 2, l+1, N]``."""
    return switch(c[..., 2, :, :], key, ctx, level, plus=c[..., :2, :, :])


def rotate(c: torch.Tensor, g: int, key: SwitchKey, ctx: RnsContext, level: int) -> torch.Tensor:
    """Apply ``X -> X^g`` to ``[..., 2, l+1, N]`` and switch back to ``s``; ``key`` is held as
    ``keys.rotation_key`` makes it, so the automorphism is one gather of the result."""
    ks = switch(c[..., 1, :, :], key, ctx, level, plus=c[..., :1, :, :])
    return ntt.automorphisms(ks[None], ctx.galois_indices((g,)))[0]


def rotate_hoisted(c: torch.Tensor, elements: Sequence[int], keys: Sequence[SwitchKey | RowKeys],
                   ctx: RnsContext, level: int) -> torch.Tensor:
    """Rotations of a ciphertext ``[*rows, 2, l+1, N]`` by several Galois elements sharing one
    decomposition: ``[len(elements), *rows, 2, l+1, N]``."""
    digits = rns.decompose(c[..., 1, :, :], ctx, level)  # [*rows, l+1, l+2, N]
    inner = _inner_many(digits, keys, ctx, level)
    out = rns.mod_down(inner, ctx, level, plus=c[..., :1, :, :])  # c0 is the same for every step
    return ntt.automorphisms(out, ctx.galois_indices(tuple(elements)))

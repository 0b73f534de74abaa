"""CKKS encoding by the canonical embedding, in SEAL's slot order.

Slot ``i`` of a plaintext ``m(X)`` (real coefficients, ``X^N = -1``) is ``m(zeta^(3^i)) / Delta``
with ``zeta = exp(i*pi/N)``; its conjugate sits at ``zeta^(-3^i)``. The powers ``+-3^i mod 2N``
run over all odd residues, so the N evaluations at the odd powers of ``zeta`` are a twisted
DFT of the coefficients: ``E_j = sum_k (m_k zeta^k) w^(jk)`` with ``w = zeta^2``; one complex
FFT of length N encodes or decodes. The automorphism ``X -> X^(3^s)`` moves slot ``i + s`` to
slot ``i``: a left rotation by ``s`` with Galois element ``3^s mod 2N``, as in SEAL.

Encoding rounds the coefficients to integers (the encoding error, ~N*2^-53 relative of the
largest coefficient, is far below the encryption noise); decoding takes float64 coefficients
(``rns.digits_to_float``). Plain numpy on the CPU: both ends of the FFT are host data.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Encoder"]

#: Coefficients must fit int64 with room for the residue arithmetic.
MAX_COEFF = 2.0**62


class Encoder:
    def __init__(self, n: int) -> None:
        self.n, self.slots = n, n // 2
        pos = np.array([pow(3, i, 2 * n) for i in range(self.slots)], dtype=np.int64)
        self.at = (pos - 1) // 2  # E index of zeta^(3^i)
        self.conj_at = (2 * n - pos - 1) // 2  # E index of zeta^(-3^i)
        k = np.arange(n)
        self.twist = np.exp(1j * np.pi * k / n)  # zeta^k

    def embed(self, values: np.ndarray, scale: float) -> np.ndarray:
        """Real slot values ``[..., <= N/2]`` -> real coefficients ``[..., N]`` (float64,
        unrounded)."""
        v = np.asarray(values, dtype=np.float64)
        if v.shape[-1] > self.slots:
            raise ValueError(f"{v.shape[-1]} values exceed {self.slots} slots")
        e = np.zeros(v.shape[:-1] + (self.n,), dtype=np.complex128)
        e[..., self.at[: v.shape[-1]]] = v * scale
        e[..., self.conj_at[: v.shape[-1]]] = v * scale
        return (np.fft.fft(e, axis=-1) * self.twist.conj()).real / self.n

    def encode(self, values: np.ndarray, scale: float, bound: float = MAX_COEFF) -> np.ndarray:
        """Slot values -> integer coefficients (int64). ``ValueError`` if a coefficient
        reaches ``bound`` (half the modulus, at most 2^62) or a value is not finite."""
        coeffs = self.embed(values, scale)
        peak = np.max(np.abs(coeffs), initial=0.0)
        if not np.isfinite(peak):
            raise ValueError("values must be finite")
        if peak >= min(bound, MAX_COEFF):
            raise ValueError(f"encoded coefficients reach 2^{np.log2(peak):.1f}: values too large "
                             "for this scale and level")
        return np.rint(coeffs).astype(np.int64)

    def decode(self, coeffs: np.ndarray, scale: float) -> np.ndarray:
        """Coefficients ``[..., N]`` (float64) -> real slot values ``[..., N/2]``."""
        e = np.fft.ifft(np.asarray(coeffs, dtype=np.float64) * self.twist, axis=-1) * self.n
        return e[..., self.at].real / scale

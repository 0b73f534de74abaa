"""CKKS encoding by the canonical embedding, in SEAL's slot order.

Slot ``i`` of a plaintext ``m(X)`` (real coefficients, ``X^N = -1``) is ``m(zeta^(3^i)) / Delta``
with ``zeta = exp(i*pi/N)``; its conjugate sits at ``zeta^(-3^i)``. The powers ``+-3^i mod 2N``
run over all odd residues, so the N evaluations at the odd powers of ``zeta`` are a twisted
DFT of the coefficients: ``E_j = sum_k (m_k zeta^k) w^(jk)`` with ``w = zeta^2``; one complex
FFT of length N encodes or decodes. The automorphism ``X -> X^(3^s)`` moves slot ``i + s`` to
slot ``i``: a left rotation by ``s`` with Galois element ``3^s mod 2N``, as in SEAL.

Encoding rounds the coefficients to integers (the encoding error, ~N*2^-53 relative of the
largest coefficient, is far below the encryption noise); decoding takes float64 coefficients
(``rns.digits_to_float``).

Encoding runs on the backend's device (``torch.fft`` in complex128): a server encodes plaintexts
on its hot path (the first protected layer's W_gate|up and W_down under a fresh permutation for
every position, RoPE tables, masks), and a host FFT there would put a CPU round trip inside
every GPU step. Decoding stays numpy: it ends a client's decryption, whose result is host data.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["Encoder"]

#: Coefficients must fit int64 with room for the residue arithmetic.
MAX_COEFF = 2.0**62


class Encoder:
    def __init__(self, n: int, device: torch.device | str = "cpu") -> None:
        self.n, self.slots, self.device = n, n // 2, torch.device(device)
        pos = np.array([pow(3, i, 2 * n) for i in range(self.slots)], dtype=np.int64)
        # numpy for decoding (host data), tensors on the device for encoding
        self.at = (pos - 1) // 2  # E index of zeta^(3^i)
        self.twist = np.exp(1j * np.pi * np.arange(n) / n)  # zeta^k
        # E index -> the slot it holds (slot i at zeta^(3^i) and at its conjugate zeta^(-3^i)),
        # or ``slots``: a zero column past the values
        slot_of = np.full(n, self.slots, dtype=np.int64)
        slot_of[self.at] = slot_of[(2 * n - pos - 1) // 2] = np.arange(self.slots)
        self._slot_of = torch.from_numpy(slot_of).to(self.device)
        untwist = torch.from_numpy(self.twist.conj() / n).to(self.device)
        self._untwist_re, self._untwist_im = untwist.real.contiguous(), untwist.imag.contiguous()

    def embed(self, values, scale: float) -> torch.Tensor:
        """Real slot values ``[..., <= N/2]`` (array or tensor) -> real coefficients ``[..., N]``
        (float64 on the encoder's device, unrounded).

        The evaluation vector ``E`` is real (each slot's value sits at a root and at its
        conjugate), so its DFT is Hermitian: ``rfft`` gives ``F_0..F_{N/2}`` for half the work of
        a complex FFT, ``F_{N-k} = conj(F_k)`` the rest, and ``E`` is one gather of the values."""
        v = torch.as_tensor(values, dtype=torch.float64).to(self.device)
        width = v.shape[-1]
        if width > self.slots:
            raise ValueError(f"{width} values exceed {self.slots} slots")
        padded = torch.zeros(v.shape[:-1] + (self.slots + 1,), dtype=torch.float64, device=self.device)
        padded[..., :width] = v * scale
        f = torch.fft.rfft(padded[..., self._slot_of], dim=-1)  # [..., N/2 + 1]
        mirrored = f[..., 1 : self.slots].flip(-1)  # F_k for k in (N/2, N): conj(F_{N-k})
        re = torch.cat((f.real, mirrored.real), dim=-1)
        im = torch.cat((f.imag, mirrored.imag.neg()), dim=-1)
        return re * self._untwist_re - im * self._untwist_im  # Re(F_k * conj(zeta^k)) / N

    def encode(self, values, scale: float, bound: float = MAX_COEFF) -> torch.Tensor:
        """Slot values -> integer coefficients (int64, on the encoder's device). ``ValueError``
        if a coefficient reaches ``bound`` (half the modulus, at most 2^62) or a value is not
        finite."""
        coeffs = self.embed(values, scale)
        peak = float(coeffs.abs().max()) if coeffs.numel() else 0.0  # one sync per batch of vectors
        if not np.isfinite(peak):
            raise ValueError("values must be finite")
        if peak >= min(bound, MAX_COEFF):
            raise ValueError(f"encoded coefficients reach 2^{np.log2(peak):.1f}: values too large "
                             "for this scale and level")
        return coeffs.round_().to(torch.int64)

    def decode(self, coeffs: np.ndarray, scale: float) -> np.ndarray:
        """Coefficients ``[..., N]`` (float64) -> real slot values ``[..., N/2]``."""
        e = np.fft.ifft(np.asarray(coeffs, dtype=np.float64) * self.twist, axis=-1) * self.n
        return e[..., self.at].real / scale

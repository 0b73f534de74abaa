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

from typing import TYPE_CHECKING

import numpy as np
import torch

from veil.kernels.host import to_device

if TYPE_CHECKING:  # crypto.backend imports this module (through ring_switch)
    from veil.crypto.backend import ValueBounds

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
        if torch.is_tensor(values):
            v = values.to(self.device, torch.float64)
        else:  # host values: queued behind the device's work, not waiting for it
            v = to_device(torch.from_numpy(np.asarray(values, dtype=np.float64)), self.device)
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
        return self.encode_rows(values, scale, bound)[0]

    def encode_rows(self, values, scale: float, bound: float = MAX_COEFF,
                    bounds: ValueBounds | None = None) -> tuple[torch.Tensor, list[bool]]:
        """``encode``, and for each vector of ``values`` (its leading dimensions flattened)
        whether its encoding is not all zero, with at most one read from the device: none where
        bounds settle both checks, the host values' own (``_host_facts``) or, for values on the
        device, the caller's ``bounds``; else one read of the peak and the rows' checks together
        (on a GPU each read waits for every queued kernel)."""
        on_host = not torch.is_tensor(values)
        rows_in = int(np.prod(np.shape(values)[:-1]))
        if on_host:  # checked before the transform: non-finite values fail without it
            top, nonzero = self._host_facts(values, scale)
            if not np.isfinite(top):
                raise ValueError("values must be finite")
        elif bounds is not None:
            top, nonzero = self._bounded_facts(bounds, scale, rows_in)
        else:
            top, nonzero = np.inf, [None] * rows_in
        coeffs = self.embed(values, scale)
        limit = min(bound, MAX_COEFF)
        rows = coeffs.reshape(-1, coeffs.shape[-1])
        if top < limit and None not in nonzero:
            return coeffs.round_().to(torch.int64), nonzero
        peak = rows.abs().amax(-1).max() if rows.numel() else rows.new_zeros(())
        out = coeffs.round_().to(torch.int64)
        read = torch.cat((peak.reshape(1), out.reshape(rows.shape).ne(0).any(-1).to(peak.dtype))).tolist()
        if not np.isfinite(read[0]):
            raise ValueError("values must be finite")
        if read[0] >= limit:
            raise ValueError(f"encoded coefficients reach 2^{np.log2(read[0]):.1f}: values too large "
                             "for this scale and level")
        return out, [bool(r) if f is None else f for f, r in zip(nonzero, read[1:], strict=True)]

    def _host_facts(self, values, scale: float) -> tuple[float, list[bool | None]]:
        """Host values ``[..., <= N/2]``: a bound on every coefficient of their encodings, and
        for each vector whether its encoding is nonzero (None: too small to tell), from their
        peak and sums of squares (``_facts``); a vector of zeros encodes to zeros."""
        v = np.asarray(values, dtype=np.float64)
        v = v.reshape(-1, v.shape[-1]) if v.ndim else v.reshape(1, 1)
        if not v.size:
            return 0.0, [False] * v.shape[0]
        top, nonzero = self._facts(float(np.abs(v).max()), np.square(v).sum(-1), scale)
        return top, [False if z else f for z, f in zip(~v.any(-1), nonzero, strict=True)]

    def _bounded_facts(self, bounds: ValueBounds, scale: float, rows: int) -> tuple[float, list[bool | None]]:
        """``_facts`` from the caller's ``ValueBounds`` (a lower bound on a sum of squares settles
        only that a vector is nonzero)."""
        sumsq = np.asarray(bounds.sumsq, dtype=np.float64).ravel()
        if sumsq.size != rows or not np.isfinite(bounds.peak) or bounds.peak < 0:
            raise ValueError(f"bounds for {sumsq.size} vectors (peak {bounds.peak}), {rows} to encode")
        return self._facts(float(bounds.peak), sumsq, scale)

    def _facts(self, peak: float, sumsq: np.ndarray, scale: float) -> tuple[float, list[bool | None]]:
        """Values of at most ``peak`` in magnitude, vector i's squares summing to ``sumsq[i]`` (or
        more): a bound on every coefficient of their encodings, and for each vector whether its
        encoding is surely nonzero (True) or too small to tell (None). Each coefficient is an
        average of the N evaluations times roots of unity, so it is at most ``scale * peak``; the
        transform is unitary up to N, so the coefficients' squares sum to
        ``2 * scale^2 * sumsq / N`` (each slot is evaluated twice, at a root and at its
        conjugate). A sum of at least 4N puts a coefficient at 2 or more, which neither rounding
        nor the FFT's error (~N * 2^-53 relative) takes to zero. The bound gets a margin of 1e-9
        relative for that error."""
        energy = np.asarray(sumsq, dtype=np.float64) * (2 * scale * scale / self.n)
        return peak * scale * (1 + 1e-9), [True if e >= 4 * self.n else None for e in energy]

    def decode(self, coeffs: np.ndarray, scale: float) -> np.ndarray:
        """Coefficients ``[..., N]`` (float64) -> real slot values ``[..., N/2]``."""
        e = np.fft.ifft(np.asarray(coeffs, dtype=np.float64) * self.twist, axis=-1) * self.n
        return e[..., self.at].real / scale

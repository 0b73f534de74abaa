"""The server half of ``NativeBackend``: arithmetic, key switching, refresh masks, flooding,
serialization. Split from ``backend`` (keys and the client half) to keep each module to one
side of the protocol; ``NativeBackend`` inherits both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from veil.crypto import rounding
from veil.crypto.backend import Ciphertext, CiphertextError, HEError, Plaintext, RefreshMask
from veil.crypto.native import keys as K
from veil.crypto.native import keyswitch, rns, serial
from veil.crypto.native.context import galois_element
from veil.crypto.native.graphs import Name, OpGraphs, key_storage
from veil.crypto.native.sampling import DIGIT_BITS, Stream
from veil.kernels.host import to_device

__all__ = ["Evaluator"]

#: Rotations ``rotate_many`` evaluates together, over all rows of a batch, by device type (bounds
#: the key products' working memory: a batch of B sessions takes HOIST_CHUNK // B rotations at a
#: time, each chunk decomposing ``c1`` again). A GPU holds 256 (16 rotations of 16 sessions at
#: level 7: 0.6 GB of products), so a batch keeps its hoisting, and its launches stay those of
#: one hoisted set; the CPU takes 64 (16 rotations of 4 sessions, a quarter of that; with 16 a
#: batch of 4 sessions would decompose ``c1`` four times per product's baby steps).
HOIST_CHUNK = {"cuda": 256, "cpu": 64}


class Evaluator:
    """Mixin over ``NativeBackend``'s state (``_ctx``, ``_wrap``/``_unwrap``, the keys)."""

    #: The key switches' and rescales' CUDA graphs (``graphs``), where the backend keeps them.
    _graphs: OpGraphs | None = None

    def _graphed(self, name: tuple, keys: tuple, fn, *inputs: torch.Tensor) -> torch.Tensor:
        """``fn(*inputs)``: replayed from a CUDA graph where this backend keeps them, named by
        ``name`` and the storage of the ``keys`` its kernels read."""
        if self._graphs is None:
            return fn(*inputs)
        return self._graphs.run(name + key_storage(*keys), fn, *inputs)

    def run_product(self, matrix, fn, x: Ciphertext) -> Ciphertext:
        """``fn(x)``, a whole product over ``matrix``'s plaintexts (``linear.matvec``): one CUDA
        graph where this backend graphs whole products (``VEIL_NATIVE_CUDA_GRAPHS=products``),
        named by the plaintexts' storage and flags, x's level and scale, and every key of the
        backend (a batch: every row's); the output's level and scale come back with a replay."""
        graphs = self._graphs
        name = _product_name(matrix) if graphs is not None and graphs.products else None
        if name is None:
            return fn(x)
        c = self._unwrap(x)

        def product(data: torch.Tensor):
            out = self._unwrap(fn(self._wrap(data, c.level, c.scale)))
            return out.data, (out.level, out.scale)

        data, (level, scale) = graphs.run(("product", c.level, c.scale, name, self._key_names()), product, c.data)
        return self._wrap(data, level, scale)

    def _key_names(self) -> tuple:
        """``key_storage`` of every switching key this backend holds, made again only when they
        are replaced (importing or making keys, and a batch's rows, assign new objects)."""
        cached = getattr(self, "_key_names_of", None)
        if cached is None or cached[0] is not self._gks or cached[1] is not self._rlk:
            held = (k for k in (self._rlk, *self._gks.values()) if k is not None)
            cached = self._key_names_of = (self._gks, self._rlk, Name(key_storage(*held)))
        return cached[2]

    # ------------------------------------------------------------------ arithmetic
    def add(self, a: Ciphertext, b: Ciphertext) -> Ciphertext:
        x, y = self._unwrap(a), self._unwrap(b)
        if x.level != y.level:
            raise HEError(f"level mismatch: {x.level} vs {y.level}")
        if not math.isclose(x.scale, y.scale, rel_tol=1e-9):
            raise HEError(f"scale mismatch: {x.scale} vs {y.scale}")
        basis, _ = self._ctx.data(x.level)
        if x.data.shape == y.data.shape:
            return self._wrap(rns.add(x.data, y.data, basis), x.level, x.scale)
        if x.data.shape[-3] < y.data.shape[-3]:
            x, y = y, x
        out = x.data.clone()
        k = y.data.shape[-3]
        out[..., :k, :, :] = basis.add(x.data[..., :k, :, :], y.data)
        return self._wrap(out, x.level, x.scale)

    def _product_scale(self, scale: float, level: int) -> float:
        if not scale < self._ctx.level_modulus(level) / 2:
            raise HEError(f"scale 2^{math.log2(scale):.1f} out of bounds at level {level}")
        return scale

    def _plain_operand(self, pt: Plaintext, c) -> torch.Tensor:
        if not isinstance(pt, Plaintext) or not isinstance(pt._obj, torch.Tensor):
            raise HEError(f"expected an encoded Plaintext, got {type(pt).__name__}")
        if pt.params_id != self.params.id:
            raise HEError("plaintext of another parameter set")
        if pt.level != c.level:
            raise HEError(f"plaintext at level {pt.level}, ciphertext at {c.level}")
        if pt.nonzero is None:  # checked once: a weight diagonal is used by every product
            pt.nonzero = bool(pt._obj.any())
        if not pt.nonzero:
            raise HEError("multiplication by an all-zero plaintext")
        return pt._obj

    def multiply_plain(self, ct: Ciphertext, pt: Plaintext, rescale: bool = True) -> Ciphertext:
        c = self._unwrap(ct)
        m = self._plain_operand(pt, c)
        if rescale and c.level == 0:
            raise HEError("no level left to rescale")
        scale = self._product_scale(c.scale * pt.scale, c.level)
        basis, _ = self._ctx.data(c.level)
        out = self._wrap(rns.mul_plain(c.data, m, basis), c.level, scale)
        return self.rescale(out) if rescale else out

    def dot_plain(self, cts: Sequence[Ciphertext], pts: Sequence[Plaintext]) -> Ciphertext:
        """``sum_i cts[i] * pts[i]`` (not rescaled), fused: lazy products accumulated in int64
        and reduced once per ``2^63 / q`` terms (63 for the 57-bit primes); one Triton kernel
        on CUDA, one C kernel on the CPU (``veil.kernels.ckks_ops.mac``, whose twin is the torch
        loop), the loop compiled elsewhere when the backend compiles (``rns.mac``)."""
        if len(cts) != len(pts) or not cts:
            raise HEError(f"dot_plain of {len(cts)} ciphertexts and {len(pts)} plaintexts")
        return self.dot_plain_many(cts, [pts])[0]

    def dot_plain_many(self, cts: Sequence[Ciphertext],
                       rows: Sequence[Sequence[Plaintext | None]]) -> list[Ciphertext]:
        """Every row's ``dot_plain`` over the same ciphertexts (``rns.mac_many``: on the CPU one C
        call reads each block of the ciphertexts once for all rows, where a call per row streams
        them again: W_gate|up has 18 giant steps over 16 baby steps)."""
        if not cts or not rows or any(len(row) != len(cts) for row in rows):
            raise HEError(f"rows of {len(cts)} plaintexts for {len(cts)} ciphertexts")
        cs = [self._unwrap(ct) for ct in cts]
        level, size = cs[0].level, cs[0].data.shape
        if any(c.level != level or c.data.shape != size for c in cs):
            raise HEError(f"level or shape mismatch in dot_plain: {[c.level for c in cs]}")
        ms, scales = [], []
        for row in rows:
            terms = [(c, pt) for c, pt in zip(cs, row, strict=True) if pt is not None]
            if not terms:
                raise HEError("an empty sum of products")
            scale = terms[0][0].scale * terms[0][1].scale
            if any(not math.isclose(c.scale * pt.scale, scale, rel_tol=1e-9) for c, pt in terms):
                raise HEError(f"scale mismatch in dot_plain: {[c.scale * pt.scale for c, pt in terms]}")
            ms.append([None if pt is None else self._plain_operand(pt, c) for c, pt in zip(cs, row, strict=True)])
            scales.append(self._product_scale(scale, level))
        basis, _ = self._ctx.data(level)
        outs = rns.mac_many([c.data for c in cs], ms, basis, self._ctx.compile)
        return [self._wrap(o, level, sc) for o, sc in zip(outs, scales, strict=True)]

    def multiply(self, a: Ciphertext, b: Ciphertext, rescale: bool = True,
                 relinearize: bool = True) -> Ciphertext:
        x, y = self._unwrap(a), self._unwrap(b)
        if relinearize:
            self._require(self._rlk, "relinearization keys")
        if x.level != y.level:
            raise HEError(f"level mismatch: {x.level} vs {y.level}")
        if x.data.shape[-3] != 2 or y.data.shape[-3] != 2:
            raise HEError("multiply needs relinearized (two-polynomial) operands")
        if rescale and x.level == 0:
            raise HEError("no level left to rescale")
        if relinearize:
            self._check_relin(x.level)
        scale = self._product_scale(x.scale * y.scale, x.level)
        basis, _ = self._ctx.data(x.level)

        def mac(*terms):
            return rns.mac([t for t, _ in terms], [w for _, w in terms], basis, self._ctx.compile)

        def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            # the tensor product as three multiply-accumulates (one kernel pass each: C on the
            # CPU, Triton on CUDA), each sum exact and reduced once
            (a0, a1), (b0, b1) = a.unbind(-3), b.unbind(-3)
            out = torch.stack((mac((a0, b0)), mac((a0, b1), (a1, b0)), mac((a1, b1))), dim=-3)
            return keyswitch.relinearize(out, self._rlk, self._ctx, x.level) if relinearize else out

        keys = (self._rlk,) if relinearize else ()
        out = self._wrap(self._graphed(("multiply", x.level, relinearize), keys, product, x.data, y.data),
                         x.level, scale)
        return self.rescale(out) if rescale else out

    def relinearize(self, ct: Ciphertext) -> Ciphertext:
        self._require(self._rlk, "relinearization keys")
        c = self._unwrap(ct)
        if c.data.shape[-3] == 2:
            return self._wrap(c.data.clone(), c.level, c.scale)
        self._check_relin(c.level)
        out = self._graphed(("relinearize", c.level), (self._rlk,),
                            lambda d: keyswitch.relinearize(d, self._rlk, self._ctx, c.level), c.data)
        return self._wrap(out, c.level, c.scale)

    def rescale(self, ct: Ciphertext) -> Ciphertext:
        c = self._unwrap(ct)
        if c.level == 0:
            raise HEError("no level left to rescale")
        out = self._graphed(("rescale", c.level), (), lambda d: rns.rescale(d, self._ctx, c.level), c.data)
        return self._wrap(out, c.level - 1, c.scale / self._ctx.data_primes[c.level])

    def mod_switch_to(self, ct: Ciphertext, level: int) -> Ciphertext:
        c = self._unwrap(ct)
        level = self._level(level)
        if level > c.level:
            raise HEError(f"cannot switch up from level {c.level} to {level}")
        return self._wrap(c.data[..., : level + 1, :].clone(), level, c.scale)

    # ------------------------------------------------------------------ rotations
    @staticmethod
    def _require(key, what: str):
        if key is None:
            raise HEError(f"no {what}: import public material first")
        return key

    def _galois_key(self, step: int, level: int) -> tuple[int, K.SwitchKey] | None:
        if int(step) % self._slots == 0:
            return None
        g = galois_element(self._key_step(step, level), self._n)
        return g, self._gks[g]

    def rotate(self, ct: Ciphertext, step: int) -> Ciphertext:
        c = self._unwrap(ct)
        gk = self._galois_key(step, c.level)
        if gk is None:
            return self._wrap(c.data.clone(), c.level, c.scale)
        if c.data.shape[-3] != 2:
            raise HEError("rotate expects a relinearized (size 2) ciphertext")
        g, key = gk
        out = self._graphed(("rotate", c.level, g), (key,),
                            lambda d: keyswitch.rotate(d, g, key, self._ctx, c.level), c.data)
        return self._wrap(out, c.level, c.scale)

    def rotate_many(self, ct: Ciphertext, steps: Sequence[int]) -> list[Ciphertext]:
        """Hoisted: one decomposition of ``c1`` for all steps (``keyswitch.rotate_hoisted``)."""
        c = self._unwrap(ct)
        found = [self._galois_key(s, c.level) for s in steps]  # validates every step first
        if c.data.shape[-3] != 2:
            raise HEError("rotate expects a relinearized (size 2) ciphertext")
        out: list[Ciphertext | None] = [None] * len(found)
        todo = [i for i, gk in enumerate(found) if gk is not None]
        for i, gk in enumerate(found):
            if gk is None:
                out[i] = self._wrap(c.data.clone(), c.level, c.scale)
        chunk = max(1, HOIST_CHUNK.get(c.data.device.type, HOIST_CHUNK["cpu"]) // math.prod(self._rows))
        for start in range(0, len(todo), chunk):
            part = todo[start : start + chunk]
            elements, keys = tuple(found[i][0] for i in part), tuple(found[i][1] for i in part)
            rot = self._graphed(("rotate_many", c.level, elements), keys,
                                lambda d, e=elements, k=keys: keyswitch.rotate_hoisted(d, e, k, self._ctx, c.level),
                                c.data)
            for j, i in enumerate(part):
                out[i] = self._wrap(rot[j], c.level, c.scale)
        return out

    # ------------------------------------------------------------------ refresh and privacy
    #: Leading dims of this backend's ciphertexts: ``()`` for one key set, ``(B,)`` for a
    #: ``NativeBatch`` of B sessions (row b under row b's keys).
    _rows: tuple[int, ...] = ()

    def _public_zero(self, level: int) -> torch.Tensor:
        """A fresh public-key encryption of zero ``[*rows, 2, level+1, N]``."""
        return K.public_zeros(self._ctx, [self._require(self._pk, "public key")], level)[0]

    def _add_integer(self, data: torch.Tensor, level: int, coeffs: torch.Tensor) -> torch.Tensor:
        """``data + (m, 0)`` for residues ``coeffs`` ``[*rows, level+1, N]`` of integer polynomials."""
        return self._add_ntt(data, level, self._ctx.data(level)[1].forward(coeffs))

    def _add_ntt(self, data: torch.Tensor, level: int, m: torch.Tensor) -> torch.Tensor:
        """``data + (m, 0)`` for ``m`` in NTT form ``[*rows, level+1, N]``."""
        basis, _ = self._ctx.data(level)
        out = data.clone()
        out[..., 0, :, :] = basis.add(out[..., 0, :, :], m)
        return out

    def _mask_ntt(self, digits: np.ndarray, bits: int, level: int) -> torch.Tensor:
        """``rho = sum_k d_k 2^(40k) - 2^bits`` at ``level`` in NTT form (digits ``[*rows, K, N]``)."""
        y = torch.from_numpy(np.concatenate([digits, -np.ones(digits.shape[:-2] + (1, self._n), np.int64)], axis=-2))
        radices = tuple(1 << (DIGIT_BITS * k) for k in range(digits.shape[-2])) + (1 << bits,)
        return rns.digits_to_ntt(to_device(y, self.device), self._ctx, level, radices)

    def mask_for_refresh(self, ct: Ciphertext, fold: bool = False) -> tuple[Ciphertext, RefreshMask]:
        """Server: ``ct + (rho, 0)``, rho uniform on ``[-2^bits, 2^bits)`` per coefficient
        (``bits = params.mask_bits(scale)``), after a re-randomization without flooding (the
        mask hides the plaintext and its noise statistically; the fresh encryption of zero
        makes ``c1`` independent of the computation). A batch's mask holds one row per session.
        ``fold``: see ``HEBackend.mask_for_refresh`` (rho's odd coefficients zero, their digits
        spelling 2^bits; no re-randomization here)."""
        c = self._unwrap(ct)
        need = self.params.min_mask_level(c.scale)
        if c.level < need:
            raise HEError(f"level {c.level} cannot carry the refresh mask (needs >= {need})")
        if not fold:
            c = self._unwrap(self.rerandomize(ct, flood_log2_sigma=float("-inf")))
        bits = self.params.mask_bits(c.scale)
        rows = math.prod(self._rows)
        digits = np.stack([Stream().uniform_digits(self._n, bits + 1) for _ in range(rows)])
        if fold:  # rho = sum_k d_k 2^(40k) - 2^bits is zero where the digits spell 2^bits
            digits[..., 1::2] = 0
            digits[:, bits // DIGIT_BITS, 1::2] = 1 << (bits % DIGIT_BITS)
        digits = digits.reshape(self._rows + digits.shape[1:])
        masked = self._add_ntt(c.data, c.level, self._mask_ntt(digits, bits, c.level))
        return self._wrap(masked, c.level, c.scale), RefreshMask(self.params.id, bits, digits, c.scale)

    def unmask_refresh(self, ct: Ciphertext, mask: RefreshMask) -> Ciphertext:
        c = self._unwrap(ct)
        if not isinstance(mask, RefreshMask) or mask.params_id != self.params.id:
            raise HEError("mask from another parameter set")
        if not math.isclose(c.scale, mask.scale, rel_tol=1e-12):
            raise HEError("re-encrypted ciphertext has another scale than the masked one")
        if mask.coeffs.shape[:-2] != self._rows:
            raise HEError(f"mask rows {mask.coeffs.shape[:-2]} do not match the ciphertext's {self._rows}")
        basis, _ = self._ctx.data(c.level)
        neg = basis.neg(self._mask_ntt(mask.coeffs, mask.bits, c.level))
        return self._wrap(self._add_ntt(c.data, c.level, neg), c.level, c.scale)

    def rerandomize(self, ct: Ciphertext, flood_log2_sigma: float | None = None) -> Ciphertext:
        c = self._unwrap(ct)
        if c.data.shape[-3] != 2:
            raise HEError("rerandomize expects a size-2 ciphertext")
        basis, _ = self._ctx.data(c.level)
        out = basis.add(c.data, self._public_zero(c.level))
        log_sigma = self.params.flood_log2_sigma if flood_log2_sigma is None else flood_log2_sigma
        if math.isfinite(log_sigma):
            rows = math.prod(self._rows)
            noise = Stream().gaussian(self._n * rows, 2.0**log_sigma).reshape(self._rows + (self._n,))
            out = self._add_integer(out, c.level, rns.to_residues(to_device(torch.from_numpy(noise), self.device), basis))
        return self._wrap(out, c.level, c.scale)

    # ------------------------------------------------------------------ serialization
    def serialize(self, ct: Ciphertext, noise_log2: float | None = None) -> bytes:
        c = self._unwrap(ct)
        if c.data.dim() != 3:
            raise HEError("serialize one ciphertext at a time (a batch's rows: NativeBatch.serialize)")
        if noise_log2 is None:
            return serial.ct_to_bytes(self._ctx, c.data, c.level, c.scale)
        return self._rounded(c.data, c.level, c.scale, noise_log2)[0]

    def _rounded(self, data: torch.Tensor, level: int, scale: float, noise_log2: float) -> list[bytes]:
        """The rounded form of size-2 ciphertexts ``[..., 2, L, N]``, one per leading row: one
        inverse NTT and one copy to the host for all of them (a batch of sessions on a GPU)."""
        if data.shape[-3] != 2:
            raise HEError("only a size-2 ciphertext is sent rounded")
        primes = self._ctx.data_primes[: level + 1]
        _, ntt = self._ctx.data(level)
        coeffs = ntt.inverse(data).cpu().numpy().view(np.uint64)  # canonical: the same bits
        bits = rounding.bits_for(primes, noise_log2)
        return [rounding.round_to_bytes(row, primes, level, scale, bits) for row in coeffs.reshape(-1, *data.shape[-3:])]

    def _load_rounded(self, data: bytes, level: int | None, size: int, scale: float | None) -> Ciphertext:
        top = self.params.top_level
        try:
            got_level, polys, bits, got_scale, body = rounding.parse(
                data, self._n, lambda lv: self._ctx.data_primes[: lv + 1] if lv <= top else None)
            serial.check_header(self._ctx, got_level, polys, got_scale, level=level, size=size, scale=scale)
        except (rounding.RoundedError, serial.SerialError) as e:
            raise CiphertextError(str(e)) from e
        coeffs = rounding.unround(body, polys, self._n, self._ctx.data_primes[: got_level + 1], bits)
        _, ntt = self._ctx.data(got_level)
        data_t = ntt.forward(to_device(torch.from_numpy(coeffs.view(np.int64)), self.device))
        return self._wrap(data_t, got_level, got_scale)

    def deserialize(self, data: bytes, *, level: int | None = None, size: int = 2,
                    scale: float | None = None) -> Ciphertext:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise CiphertextError("ciphertext must be bytes")
        if rounding.is_rounded(bytes(data[:4])):
            return self._load_rounded(bytes(data), level, size, scale)
        try:
            polys, seed, got_level, got_scale = serial.ct_from_bytes(
                self._ctx, bytes(data), level=level, size=size, scale=scale)
        except serial.SerialError as e:
            raise CiphertextError(str(e)) from e
        return self._wrap(self._expand(polys, seed, got_level), got_level, got_scale)


def _product_name(matrix) -> tuple | None:
    """What a whole product over ``matrix`` reads besides its input and the keys: its plan, and
    each diagonal's storage (address, shape, strides), level, scale and all-zero flags (a
    replay skips the checks ``_plain_operand`` makes; a name differs where their outcome could).
    None while a flag is unknown (the first product computes it). Kept on the matrix
    (``EncodedMatrix.graph_name``)."""
    if matrix.graph_name is None:
        pts = sorted(matrix.plaintexts.items())
        if any(pt.nonzero is None or not isinstance(pt._obj, torch.Tensor) for _, pt in pts):
            return None
        matrix.graph_name = Name((matrix.plan, matrix.pack, *(
            (u, pt._obj.data_ptr(), tuple(pt._obj.shape), pt._obj.stride(), pt.level, pt.scale, pt.nonzero,
             pt.row_nonzero) for u, pt in pts)))
    return matrix.graph_name

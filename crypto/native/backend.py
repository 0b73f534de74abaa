"""``NativeBackend``: RNS-CKKS on torch tensors, on any device (``make_backend(params, "native")``).

A ciphertext is an int64 tensor ``[size, level+1, N]`` in NTT form on the backend's device,
with its level and scale; the modules underneath are one concept each: exact modular
arithmetic (``modarith``), NTT and automorphisms (``ntt``), the modulus chain (``context``),
RNS basis operations (``rns``), encoding (``encoding``), randomness (``sampling``), keys and
encryption (``keys``), key switching with hoisting (``keyswitch``), wire formats (``serial``).
Level and scale rules follow the SEAL backend (same error cases, same messages' keywords).

Masked refresh: the mask ``rho`` is uniform on ``[-2^bits, 2^bits)``; ``RefreshMask.coeffs``
holds ``rho + 2^bits`` as base-2^40 digits ``[K, N]`` (int64), turned into any level's NTT form
exactly (``rns.digits_to_ntt``). The client's exact decryption goes through balanced
mixed-radix digits, so re-encryption never builds Python integers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from veil.crypto.backend import (
    Ciphertext,
    HEBackend,
    HEError,
    KeyMaterialError,
    Plaintext,
    PublicMaterial,
    ValueBounds,
)
from veil.crypto.native import keys as K
from veil.crypto.native import rns, serial
from veil.crypto.native.context import RnsContext, galois_element
from veil.crypto.native.encoding import Encoder
from veil.crypto.native.evaluator import Evaluator
from veil.crypto.native.graphs import OpGraphs
from veil.crypto.params import CkksParams
from veil.kernels import ckks_cpu, heap

__all__ = ["NativeBackend"]

#: Vectors ``encode_many`` transforms together (bounds its working memory: 64 x 9 limbs x N).
ENCODE_CHUNK = 64
#: On a GPU a chunk is one launch sequence: larger chunks, fewer launches (256 x 8 limbs x N
#: int64 is 268 MB at the top level).
ENCODE_CHUNK_GPU = 256


class _Ct:
    __slots__ = ("data", "level", "scale")

    def __init__(self, data: torch.Tensor, level: int, scale: float) -> None:
        self.data, self.level, self.scale = data, level, float(scale)


class NativeBackend(Evaluator, HEBackend):
    name = "native"
    supports_batch = True
    hoists_rotations = True

    @classmethod
    def batched(cls, rows):
        from veil.crypto.native.batch import NativeBatch  # it subclasses this one

        return NativeBatch(rows)

    def __init__(self, params: CkksParams, device: torch.device | str = "cpu",
                 compile: bool | None = None, cuda_graphs: bool | str | None = None) -> None:
        self.params = params
        if compile is None:
            compile = os.environ.get("VEIL_NATIVE_COMPILE", "") == "1"
        if cuda_graphs is None:  # off until measured on a GPU (benchmarks/device/issue19.sh)
            cuda_graphs = {"1": True, "products": "products"}.get(os.environ.get("VEIL_NATIVE_CUDA_GRAPHS", ""), False)
        self._ctx = RnsContext(params, device, compile)
        if cuda_graphs and self._ctx.device.type == "cuda":  # "products": whole products too
            self._graphs = OpGraphs(self._ctx.device, products=cuda_graphs == "products")
        if self._ctx.device.type == "cpu":
            heap.keep_freed_memory()  # a key switch allocates tens of MB: reuse the pages
        self._n, self._slots = params.poly_modulus_degree, params.slot_count
        self._encoder = Encoder(self._n, self.device)
        self._sk: K.SecretKey | None = None
        self._pk: K.PublicKey | None = None
        self._rlk: K.SwitchKey | None = None
        self._gks: dict[int, K.SwitchKey] = {}
        self._export: PublicMaterial | None = None

    @property
    def device(self) -> torch.device:
        return self._ctx.device

    @property
    def batch_pays(self) -> bool:
        # one ciphertext leaves a GPU mostly idle (16 sessions as one batch on an H200: 3.3-4.05x
        # one session's throughput, 2026-11-26). On the CPU the C kernels' sums in registers
        # left the key inner product waiting on memory, and a span's rows read each key and
        # weight block once: 1.17x and 1.24x (two runs) for the four products of a span of 8
        # in sum (benchmarks/results/2026-11-27-rotations; 1.01x before, 2026-11-27-span-rows).
        # The torch twins (no C compiler) keep one product after another: not measured batched.
        return self.device.type == "cuda" or ckks_cpu.available()

    # ------------------------------------------------------------------ handles
    def _wrap(self, data: torch.Tensor, level: int, scale: float) -> Ciphertext:
        return Ciphertext(_Ct(data, level, scale), self.params.id)

    def _unwrap(self, ct: Ciphertext) -> _Ct:
        if not isinstance(ct, Ciphertext) or not isinstance(ct._obj, _Ct):
            raise HEError(f"expected a native Ciphertext handle, got {type(ct).__name__}")
        if ct.params_id != self.params.id:
            raise HEError(f"ciphertext of {ct.params_id!r}, backend is {self.params.id!r}")
        return ct._obj

    def _level(self, level: int | None) -> int:
        level = self.params.top_level if level is None else int(level)
        if not 0 <= level <= self.params.top_level:
            raise HEError(f"level {level} outside [0, {self.params.top_level}]")
        return level

    def _check_scale(self, scale: float, level: int) -> float:
        scale = float(scale)
        if not (math.isfinite(scale) and 1.0 <= scale < self._ctx.level_modulus(level)):
            raise HEError(f"scale {scale} out of bounds at level {level}")
        return scale

    # ------------------------------------------------------------------ keys
    def generate_keys(self, rotation_steps: Sequence[int] | Mapping[int, int] = (),
                      relin_level: int | None = None) -> None:
        steps = self._set_steps(rotation_steps)
        self._set_relin_level(relin_level)
        elements = sorted({galois_element(s, self._n) for s in steps})  # validates the steps
        ctx = self._ctx
        sk = K.gen_secret(ctx)
        basis, _ = ctx.master
        self._sk, self._pk = sk, K.gen_public(ctx, sk)
        self._rlk = K.gen_switch_key(ctx, sk, basis.mul(sk.s, sk.s))
        self._gks = {g: K.rotation_key(ctx, g, K.gen_switch_key(ctx, sk, sk.s.index_select(-1, ctx.galois_index(g))))
                     for g in elements}
        self._new_fold_key()
        self._export = None

    @property
    def has_secret_key(self) -> bool:
        return self._sk is not None

    def export_public_material(self) -> PublicMaterial:
        if self._sk is None:
            raise HEError("no keys generated")
        if self._export is None:
            ctx = self._ctx
            data, master = ctx.data_primes, ctx.master_primes
            pk = serial.keys_to_bytes(ctx, serial.KIND_PUBLIC, [(self._pk.seed, self._pk.b[None])], data)
            rk = serial.keys_to_bytes(ctx, serial.KIND_RELIN, [(self._rlk.seed, self._rlk.data[0])], master,
                                      levels=(self.relin_level,))
            gk = b""
            if self._gks:
                elements = tuple(sorted(self._gks))
                level_of = {galois_element(st, self._n): lv for st, lv in self._key_levels.items()}
                gk = serial.keys_to_bytes(ctx, serial.KIND_GALOIS,
                                          [(self._gks[g].seed, K.galois_b(ctx, g, self._gks[g])) for g in elements],
                                          master, elements, tuple(level_of[g] for g in elements))
            steps = self.rotation_steps
            self._export = PublicMaterial(self.params.id, pk, rk, gk, steps, tuple(self._key_levels[st] for st in steps),
                                          self.relin_level, self._fold_key_bytes)
        return self._export

    def import_public_material(self, material: PublicMaterial) -> None:
        if not isinstance(material, PublicMaterial):
            raise KeyMaterialError("not a PublicMaterial")
        if material.params_id != self.params.id:
            raise KeyMaterialError(
                f"public material is for {material.params_id!r}, backend is {self.params.id!r}")
        ctx, digits = self._ctx, self.params.top_level + 1
        try:
            steps = tuple(sorted({int(s) for s in material.rotation_steps}))
            if len(steps) != len(material.rotation_steps):
                raise ValueError("repeated rotation steps")
            declared = material.key_levels(self.params.top_level)
            elements = sorted({galois_element(s, self._n) for s in steps})
            _, _, [(pk_seed, pk_b)] = serial.keys_from_bytes(
                ctx, bytes(material.public_key), serial.KIND_PUBLIC, 1, 1, ctx.data_primes)
            _, (rk_held,), [(rk_seed, rk_b)] = serial.keys_from_bytes(
                ctx, bytes(material.relin_keys), serial.KIND_RELIN, 1, digits, ctx.master_primes)
            relin_level = self.params.top_level if material.relin_level is None else material.relin_level
            if not isinstance(relin_level, int) or not 0 <= relin_level <= rk_held:
                raise ValueError(f"the relinearization key holds level {rk_held}, declared {relin_level}")
            gks = {}
            if elements:
                got, held, raw = serial.keys_from_bytes(ctx, bytes(material.galois_keys), serial.KIND_GALOIS,
                                                        len(elements), digits, ctx.master_primes)
                if list(got) != elements:
                    raise ValueError("Galois keys do not match the rotation steps")
                held_by = dict(zip(got, held, strict=True))
                for st, lv in declared.items():  # what a key holds is what it serves
                    if not 0 <= lv <= held_by[galois_element(st, self._n)]:
                        raise ValueError(f"the key of rotation step {st} holds fewer levels than {lv}")
                gks = {g: K.rotation_key(ctx, g, self._switch_key(seed, b)) for g, (seed, b) in zip(got, raw, strict=True)}
            elif material.galois_keys:
                raise ValueError("Galois keys without rotation steps")
            self._import_fold_key(material.fold_key)
        except (ValueError, TypeError) as e:  # serial.SerialError is a ValueError
            raise KeyMaterialError(f"invalid public material: {e}") from e
        pk_a = K.expand_a(ctx, pk_seed, ctx.top, K.TAG_PK)
        self._pk = K.PublicKey(pk_b[0], pk_a, pk_seed)
        self._rlk, self._gks = self._switch_key(rk_seed, rk_b), gks
        self._key_levels, self._relin_level = declared, relin_level
        self._export = None

    def _switch_key(self, seed: bytes, b: torch.Tensor) -> K.SwitchKey:
        """``b`` ``[digits, limbs, N]``: a key for lower levels has fewer of both (a prefix)."""
        a = K.key_a(self._ctx, seed, b.shape[0])[:, : b.shape[1]]
        return K.SwitchKey(torch.stack((b, a)), seed)

    # ------------------------------------------------------------------ encode / encrypt
    def _encode(self, values, level: int, scale: float) -> torch.Tensor:
        """Slot vectors ``[..., <= slots]`` (array, or a tensor: ``encodable``) -> NTT-form
        residues ``[..., level+1, N]``."""
        return self._encode_rows(values, level, scale)[0]

    def _encode_rows(self, values, level: int, scale: float,
                     bounds: ValueBounds | None = None) -> tuple[torch.Tensor, list[bool]]:
        """``_encode``, and whether each vector's encoding is not all zero (``Encoder.encode_rows``:
        the products' check, found with the encoder's own at most one read from the device, none
        where ``bounds`` settle it)."""
        # finiteness and the peak: the encoder's checks (host values' before their FFT)
        v = values.to(self.device, torch.float64) if torch.is_tensor(values) else np.asarray(values, dtype=np.float64)
        if v.shape[-1] > self._slots:
            raise HEError(f"{v.shape[-1]} values exceed {self._slots} slots")
        bound = self._ctx.level_modulus(level) / 2
        try:
            coeffs, nonzero = self._encoder.encode_rows(v, scale, bound, bounds)
        except ValueError as e:
            raise HEError(str(e)) from e
        return self._ctx.data(level)[1].lift(coeffs), nonzero

    def encodable(self, a: np.ndarray) -> torch.Tensor:
        """Weights the server re-encodes on its hot path are kept as float64 on the device."""
        return torch.as_tensor(np.asarray(a, dtype=np.float64)).to(self.device)

    def encode(self, values, level=None, scale=None) -> Plaintext:
        level = self._level(level)
        scale = self._check_scale(self.params.scale if scale is None else scale, level)
        m, (nonzero,) = self._encode_rows(np.ravel(values), level, scale)
        pt = Plaintext(m, self.params.id, level, scale, m.numel() * 8)
        pt.nonzero = nonzero
        return pt

    def encode_many(self, values, level=None, scale=None, bounds: ValueBounds | None = None) -> list[Plaintext]:
        """One FFT and one NTT per chunk of vectors instead of one per vector (measured on the
        2-core CPU: 64 vectors at level 4 in 1.6 s instead of 2.4 s); the residues equal
        ``encode``'s. ``values``: a sequence of vectors, or a 2-D array or tensor of them."""
        level = self._level(level)
        scale = self._check_scale(self.params.scale if scale is None else scale, level)
        step = ENCODE_CHUNK if self.device.type == "cpu" else ENCODE_CHUNK_GPU
        out = []
        for start in range(0, len(values), step):
            part = values[start : start + step]
            if not (torch.is_tensor(part) or isinstance(part, np.ndarray) and part.ndim == 2):
                chunk = [np.ravel(v) for v in part]
                part = np.zeros((len(chunk), max(v.size for v in chunk)))
                for i, v in enumerate(chunk):
                    part[i, : v.size] = v
            # the products' all-zero check comes with the encoding (at most one host sync per
            # chunk on a GPU; none for host values, nor where the caller's bounds settle it: the
            # shuffled FFN, encoded afresh every step) instead of one per plaintext at its first
            # product
            part_bounds = None if bounds is None else ValueBounds(bounds.peak, bounds.sumsq[start : start + step])
            m, nonzero = self._encode_rows(part, level, scale, part_bounds)
            rows = [Plaintext(row, self.params.id, level, scale, row.numel() * 8) for row in m.unbind(0)]
            for pt, flag in zip(rows, nonzero, strict=True):
                pt.nonzero = flag
            out += rows
        return out

    def _encrypt(self, m: torch.Tensor, level: int) -> tuple[torch.Tensor, bytes | None]:
        """Symmetric (seeded: ``(c0[None], seed)``) with the secret key, else public-key."""
        if self._sk is not None:
            c0, seed = K.encrypt_symmetric(self._ctx, self._sk, m, level)
            return c0[None], seed
        if self._pk is None:
            raise HEError("no key to encrypt with")
        return K.encrypt_public(self._ctx, self._pk, m, level), None

    def _expand(self, c: torch.Tensor, seed: bytes | None, level: int) -> torch.Tensor:
        if seed is None:
            return c
        return torch.cat((c, K.expand_a(self._ctx, seed, level, K.TAG_CT)[None]))

    def encrypt(self, values, level=None, scale=None) -> Ciphertext:
        level = self._level(level)
        scale = self._check_scale(self.params.scale if scale is None else scale, level)
        c, seed = self._encrypt(self._encode(values, level, scale), level)
        return self._wrap(self._expand(c, seed, level), level, scale)

    def encrypt_to_bytes(self, values, level=None, scale=None) -> bytes:
        level = self._level(level)
        scale = self._check_scale(self.params.scale if scale is None else scale, level)
        c, seed = self._encrypt(self._encode(values, level, scale), level)
        return serial.ct_to_bytes(self._ctx, c, level, scale, seed)

    # ------------------------------------------------------------------ decrypt
    def _decrypt_digits(self, ct: Ciphertext) -> tuple[torch.Tensor, _Ct]:
        """Balanced mixed-radix digits of the decrypted plaintext polynomial."""
        if self._sk is None:
            raise HEError("no secret key: this backend cannot decrypt")
        c = self._unwrap(ct)
        if c.data.shape[0] != 2:
            raise HEError("decrypt expects a relinearized (size 2) ciphertext")
        return self._digits(K.decrypt_ntt(self._ctx, self._sk, c.data, c.level), c.level), c

    def _digits(self, m: torch.Tensor, level: int) -> torch.Tensor:
        """Balanced mixed-radix digits of a plaintext polynomial held in NTT form at ``level``."""
        _, ntt = self._ctx.data(level)
        return rns.balanced_digits(ntt.inverse(m), self._ctx.data(level)[0])

    def _decode(self, y: torch.Tensor, level: int, scale: float) -> np.ndarray:
        return self._encoder.decode(rns.digits_to_float(y, self._ctx.data_primes[: level + 1]).cpu().numpy(), scale)

    def decrypt(self, ct: Ciphertext, length: int | None = None) -> np.ndarray:
        y, c = self._decrypt_digits(ct)
        out = self._decode(y, c.level, c.scale)
        return out if length is None else out[:length]

    def decrypt_poly(self, ct: Ciphertext) -> np.ndarray:
        """Client: the decrypted plaintext polynomial as centred Python ints (no decoding)."""
        y, c = self._decrypt_digits(ct)
        return rns.digits_to_ints(y, self._ctx.data_primes[: c.level + 1])

    def _secret_coefficients(self) -> np.ndarray:
        _, ntt = self._ctx.data(0)
        return ntt.inverse_centred(self._sk.s[1:2])[0].cpu().numpy()

    def _secret_bytes(self) -> bytes:
        return self._secret_coefficients().astype(np.int8).tobytes()  # ternary: one byte each

    def _load_secret(self, data: bytes) -> None:
        s = np.frombuffer(data, dtype=np.int8)
        if s.shape != (self._n,) or np.abs(s).max(initial=0) > 1:
            raise KeyMaterialError(f"a native secret key is {self._n} ternary coefficients, one byte each")
        sk = K.secret_from_coefficients(self._ctx, s.astype(np.int64))
        self._sk, self._pk, self._rlk, self._gks, self._export = sk, K.gen_public(self._ctx, sk), None, {}, None

    def _fold_coefficients(self, ct: Ciphertext) -> np.ndarray:
        c = self._unwrap(ct)
        if c.data.dim() != 3 or c.data.shape[0] != 2:
            raise HEError("folding takes one size-2 ciphertext")
        _, ntt = self._ctx.data(c.level)
        return ntt.inverse(c.data)  # stays on the device: the fold runs there (``_fold_device``)

    @property
    def _fold_device(self) -> str:
        return str(self.device)

    def _encrypt_residues_to_bytes(self, residues: np.ndarray, from_level: int, level: int | None,
                                   scale: float) -> bytes:
        y = rns.balanced_digits(torch.from_numpy(residues).to(self.device), self._ctx.data(from_level)[0])
        m, level = self._reencode(y, self._ctx.data_primes[: from_level + 1], self._level(level))
        c, seed = self._encrypt(m, level)
        return serial.ct_to_bytes(self._ctx, c, level, scale, seed)

    def decode_plaintext(self, pt: Plaintext) -> np.ndarray:
        """The slots an encoded plaintext holds, decoded (its values plus their encoding error),
        as SEAL's: for measurements of encoding error (``benchmarks/flooding_margin.py``)."""
        if not isinstance(pt, Plaintext) or pt.params_id != self.params.id or pt._obj.dim() != 2:
            raise HEError("expected a Plaintext of this parameter set (one row)")
        return self._decode(self._digits(pt._obj, pt.level), pt.level, pt.scale)

    # ------------------------------------------------------------------ refresh (client side)
    def _refresh_plain(self, ct: Ciphertext, level: int | None) -> tuple[torch.Tensor, int, float]:
        y, c = self._decrypt_digits(ct)
        m, level = self._reencode(y, self._ctx.data_primes[: c.level + 1], self._level(level))
        return m, level, c.scale

    def _reencode(self, y: torch.Tensor, primes: tuple[int, ...], level: int) -> tuple[torch.Tensor, int]:
        """Balanced digits of an integer polynomial (over ``primes``) -> its NTT form at ``level``."""
        peak = float(rns.digits_to_float(y, primes).abs().max())
        if peak >= self._ctx.level_modulus(level) / 4:
            raise HEError(f"the plaintext does not fit level {level}")
        return rns.digits_to_ntt(y, self._ctx, level, tuple(rns.radices(primes))), level

    def refresh_reencrypt(self, ct: Ciphertext, level: int | None = None) -> Ciphertext:
        m, level, scale = self._refresh_plain(ct, level)
        c, seed = self._encrypt(m, level)
        return self._wrap(self._expand(c, seed, level), level, scale)

    def refresh_reencrypt_to_bytes(self, ct: Ciphertext, level: int | None = None) -> bytes:
        m, level, scale = self._refresh_plain(ct, level)
        c, seed = self._encrypt(m, level)
        return serial.ct_to_bytes(self._ctx, c, level, scale, seed)

    # ------------------------------------------------------------------ metadata
    def level(self, ct: Ciphertext) -> int:
        return self._unwrap(ct).level

    def scale(self, ct: Ciphertext) -> float:
        return self._unwrap(ct).scale

    def size(self, ct: Ciphertext) -> int:
        return int(self._unwrap(ct).data.shape[0])

    def resident_bytes(self) -> int:
        """The public, relinearization, Galois and fold keys as held on the device (seeded halves
        expanded), and with CUDA graphs what they may come to hold (``OpGraphs.reserved_bytes``)."""
        tensors = [k.data for k in (self._rlk, *self._gks.values()) if k is not None]
        if self._pk is not None:
            tensors += [self._pk.b, self._pk.a]
        fold = self._fold_key.nbytes if self._fold_key is not None else 0
        graphs = self._graphs.reserved_bytes if self._graphs is not None else 0
        return sum(t.numel() * t.element_size() for t in tensors) + fold + graphs

    def nbytes(self, ct: Ciphertext) -> int:
        return self._unwrap(ct).data.numel() * 8

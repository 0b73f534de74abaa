"""CKKS backend on Microsoft SEAL through ``tenseal.sealapi``.

Randomness: every SEAL operation (keys, encryption, encryption of zero) uses SEAL's default
PRNG factory (Blake2xb seeded from the OS via ``random_device``). The masks and flooding noise
this module samples itself come from ``os.urandom`` (``veil.crypto.sampling``).

The modulus chain is built from the primes ``CkksParams`` pins (the ones SEAL's
``CoeffModulus::Create`` picks for the same bit sizes), so every backend shares the moduli.
Plumbing (context, file-based (de)serialization, exact integer polynomials inside SEAL objects)
lives in ``veil.crypto.seal.context``; ciphertexts travel bit-packed (``veil.crypto.seal.packing``).

Concurrency: key generation and ``import_public_material`` replace the backend's keys and must
not overlap other calls; the evaluation, encryption and (de)serialization methods only read
shared state (SEAL's Evaluator/Encryptor/Decryptor are safe for concurrent use on distinct
ciphertexts), and every file name is unique.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import tenseal.sealapi as sealapi

from veil.crypto import rounding
from veil.crypto.backend import (
    Ciphertext,
    CiphertextError,
    HEBackend,
    HEError,
    KeyMaterialError,
    Plaintext,
    PublicMaterial,
    RefreshMask,
)
from veil.crypto.params import CkksParams
from veil.crypto.sampling import gaussian_int_poly, uniform_int_poly
from veil.crypto.seal import format as seal_format
from veil.crypto.seal import packing as seal_packing
from veil.crypto.seal.context import SealContext, galois_element, read_flat

__all__ = ["SealBackend", "galois_element"]

_CIPHERTEXT_MAX_SIZE = 3  # what deserialize accepts at most (2 normally, 3 unrelinearized)


class SealBackend(HEBackend):
    """SEAL CKKS backend (build it with ``make_backend(params, "seal")``); client:
    ``generate_keys``; server: ``import_public_material``."""

    name = "seal"

    def __init__(self, params: CkksParams) -> None:
        params.validate()
        self.params = params
        self._c = SealContext(params)
        self._sk = None
        self._pk = None
        self._rk = None
        self._gk = None
        self._encryptor_sk = None
        self._encryptor_pk = None
        self._decryptor = None
        self._export_cache: PublicMaterial | None = None

    # ------------------------------------------------------------------ helpers
    def _wrap(self, obj) -> Ciphertext:
        return Ciphertext(obj, self.params.id)

    def _unwrap(self, ct: Ciphertext):
        if not isinstance(ct, Ciphertext):
            raise HEError(f"expected a Ciphertext handle, got {type(ct).__name__}")
        if ct.params_id != self.params.id:
            raise HEError(f"ciphertext of {ct.params_id!r}, backend is {self.params.id!r}")
        return ct._obj

    def _require_eval_keys(self, what: str):
        if what == "relin" and self._rk is None:
            raise HEError("no relinearization keys: import public material first")
        if what == "galois" and self._gk is None:
            raise HEError("no Galois keys: import public material first")
        if what == "pk" and self._encryptor_pk is None:
            raise HEError("no public key")

    # ------------------------------------------------------------------ keys
    def generate_keys(self, rotation_steps: Sequence[int] | Mapping[int, int] = (),
                      relin_level: int | None = None) -> None:
        self._set_relin_level(relin_level)
        kg = sealapi.KeyGenerator(self._c.ctx)
        self._sk = kg.secret_key()
        self._pk = sealapi.PublicKey()
        kg.create_public_key(self._pk)
        self._keygen = kg
        for s in self._set_steps(rotation_steps):
            galois_element(s, self._c.n)  # validates
        self._encryptor_sk = sealapi.Encryptor(self._c.ctx, self._pk, self._sk)
        self._encryptor_pk = self._encryptor_sk
        self._decryptor = sealapi.Decryptor(self._c.ctx, self._sk)
        self._new_fold_key()
        self._export_cache = None

    @property
    def has_secret_key(self) -> bool:
        return self._sk is not None

    @property
    def _dnum(self) -> int:
        """Key-switching decomposition size: SEAL uses one component per data prime."""
        return len(self.params.coeff_modulus_bits) - 1

    def _key_limit(self, n_steps: int) -> int:
        """Largest inflated key object accepted: every step's components plus the index table."""
        return max(1, n_steps) * self._dnum * self._c.key_raw_size() + 8 * self._c.n + 4096

    def export_public_material(self) -> PublicMaterial:
        if self._sk is None:
            raise HEError("no keys generated")
        if self._export_cache is None:
            kg = self._keygen
            # every key bit-packed at its primes' widths (``seal.packing``); relinearization and
            # Galois keys seeded (half size; tenseal does not bind SEAL's seeded public key) and
            # made for the levels they serve
            steps = self.rotation_steps
            widths, limit = self._c.key_prime_widths, self._key_limit(len(steps))
            pk_bytes = seal_packing.pack(self._c.io.save(self._pk), widths)
            relin = {} if self.relin_level == self.params.top_level else {0: self.relin_level}  # s^2: index 0
            rk_bytes = seal_packing.pack_keys(self._c.io.save(kg.create_relin_keys()), widths, limit, relin)
            if steps:
                elts = [galois_element(s, self._c.n) for s in steps]
                # each Galois key travels for the levels it serves only (SEAL keeps its index at elt >> 1)
                by_index = {e >> 1: self._key_levels[s] for s, e in zip(steps, elts, strict=True)}
                gk_bytes = seal_packing.pack_keys(self._c.io.save(kg.create_galois_keys(elts)), widths, limit, by_index)
            else:
                gk_bytes = b""
            levels = tuple(self._key_levels[s] for s in steps)
            self._export_cache = PublicMaterial(self.params.id, pk_bytes, rk_bytes, gk_bytes, steps, levels,
                                                self.relin_level, self._fold_key_bytes)
        return self._export_cache

    def import_public_material(self, material: PublicMaterial) -> None:
        if not isinstance(material, PublicMaterial):
            raise KeyMaterialError("not a PublicMaterial")
        if material.params_id != self.params.id:
            raise KeyMaterialError(
                f"public material is for {material.params_id!r}, backend is {self.params.id!r}"
            )
        pk = sealapi.PublicKey()
        rk = sealapi.RelinKeys()
        gk = sealapi.GaloisKeys()
        one = self._c.key_raw_size()
        dnum = self._dnum
        n_steps = len(material.rotation_steps)
        try:
            key_levels = material.key_levels(self.params.top_level)
        except (TypeError, ValueError) as e:
            raise KeyMaterialError(f"rotation levels do not match the rotation steps: {e}") from None
        packed_levels: dict[int, int] = {}
        relin_held = seal_packing.FULL
        for name, obj, data, raw_limit, keys in (
            ("public key", pk, material.public_key, one, 0),
            ("relin keys", rk, material.relin_keys, dnum * one, 1),
            ("Galois keys", gk, material.galois_keys, max(1, n_steps) * dnum * one, n_steps),
        ):
            if name == "Galois keys" and not data and not material.rotation_steps:
                gk = None
                continue
            try:
                data = bytes(data)
                if len(data) > 2 * raw_limit:
                    raise seal_format.SealFormatError("larger than the expected key size")
                if keys and seal_packing.is_packed_keys(data):
                    data, found = seal_packing.unpack_keys(data, self._c.key_prime_widths, self._c.version,
                                                           self._c.n, keys, dnum)
                    if name == "Galois keys":
                        packed_levels = found
                    else:
                        relin_held = found.get(0, seal_packing.FULL)
                elif not keys and seal_packing.is_packed(data):
                    data = seal_packing.unpack(data, self._c.key_prime_widths, self._c.version, self._c.n)
                seal_format.parse_header(data)
                self._c.check_inflated(data, raw_limit)
                self._c.io.load(obj, self._c.ctx, data)
            except Exception as e:  # SEAL raises RuntimeError/ValueError on bad input
                raise KeyMaterialError(f"invalid {name}: {e}") from e
            if not sealapi.is_valid_for(obj, self._c.ctx):
                raise KeyMaterialError(f"{name} not valid for {self.params.id}")
            # Relin and Galois keys share SEAL's serialized form: a Galois-key blob loads as
            # "relin keys" (found by fuzzing). Relinearization keys hold exactly the s^2 key.
            if name == "relin keys" and (obj.size() != 1 or not obj.has_key(2)):
                raise KeyMaterialError("relin keys must hold exactly the key for s^2")
        top = self.params.top_level
        relin_held = top if relin_held == seal_packing.FULL else relin_held
        relin_level = top if material.relin_level is None else material.relin_level
        if not isinstance(relin_level, int) or not 0 <= relin_level <= relin_held:
            raise KeyMaterialError(f"the relinearization key holds level {relin_held}, declared {relin_level}")
        for s in key_levels:
            try:
                elt = galois_element(s, self._c.n)
            except ValueError as e:
                raise KeyMaterialError(str(e)) from e
            if gk is None or not gk.has_key(elt):
                raise KeyMaterialError(f"Galois keys lack rotation step {s}")
            # what the key holds is what it serves: a declared level above it would compute garbage
            held = packed_levels.get(elt >> 1, seal_packing.FULL)
            held = top if held == seal_packing.FULL else held
            if not 0 <= key_levels[s] <= held:
                raise KeyMaterialError(f"the key of rotation step {s} holds level {held}, declared {key_levels[s]}")
        try:
            self._import_fold_key(material.fold_key)
        except ValueError as e:
            raise KeyMaterialError(f"invalid fold key: {e}") from None
        self._pk, self._rk, self._gk = pk, rk, gk
        self._key_levels, self._relin_level = key_levels, relin_level
        if self._sk is not None:
            self._encryptor_sk = sealapi.Encryptor(self._c.ctx, pk, self._sk)
            self._encryptor_pk = self._encryptor_sk
        else:
            self._encryptor_pk = sealapi.Encryptor(self._c.ctx, pk)

    # ------------------------------------------------------------------ encrypt / decrypt
    def _encrypt_pt(self, pt):
        ct = self._c.new_ct()
        if self._encryptor_sk is not None:
            self._encryptor_sk.encrypt_symmetric(pt, ct)
        elif self._encryptor_pk is not None:
            self._encryptor_pk.encrypt(pt, ct)
        else:
            raise HEError("no key to encrypt with")
        return ct

    def encrypt_to_bytes(self, values, level=None, scale=None) -> bytes:
        lvl = self._c.lvl(level)
        pt = self._c.encode(values, lvl, self.params.scale if scale is None else scale)
        if self._encryptor_sk is not None:
            return self._c.pack(self._c.io.save(self._encryptor_sk.encrypt_symmetric(pt)))
        return self._c.pack(self._c.io.save(self._encrypt_pt(pt)))

    def _decrypt_pt(self, ct: Ciphertext):
        if self._decryptor is None:
            raise HEError("no secret key: this backend cannot decrypt")
        obj = self._unwrap(ct)
        if obj.size() != 2:
            raise HEError("decrypt expects a relinearized (size 2) ciphertext")
        pt = sealapi.Plaintext()
        self._decryptor.decrypt(obj, pt)
        return pt

    def decrypt(self, ct: Ciphertext, length: int | None = None) -> np.ndarray:
        pt = self._decrypt_pt(ct)
        out = np.asarray(self._c.encoder.decode_double(pt), dtype=np.float64)
        return out if length is None else out[:length]

    # ------------------------------------------------------------------ metadata
    def level(self, ct: Ciphertext) -> int:
        return self._c.level_of(self._unwrap(ct))

    def scale(self, ct: Ciphertext) -> float:
        return float(self._unwrap(ct).scale)

    def decode_plaintext(self, pt: Plaintext) -> np.ndarray:
        """The slots an encoded plaintext holds, decoded (its values plus their encoding error):
        SEAL-specific, for measurements of encoding error (``benchmarks/flooding_margin.py``)."""
        if not isinstance(pt, Plaintext) or pt.params_id != self.params.id:
            raise HEError("expected a Plaintext of this parameter set")
        return np.asarray(self._c.encoder.decode_double(pt._obj), dtype=np.float64)

    def size(self, ct: Ciphertext) -> int:
        return int(self._unwrap(ct).size())

    def nbytes(self, ct: Ciphertext) -> int:
        obj = self._unwrap(ct)
        return int(obj.size()) * (self._c.level_of(obj) + 1) * self._c.n * 8

    # ------------------------------------------------------------------ arithmetic
    def _operands(self, a, b):
        x, y = self._unwrap(a), self._unwrap(b)
        la, lb = self._c.level_of(x), self._c.level_of(y)
        if la != lb:
            raise HEError(f"level mismatch: {la} vs {lb}")
        if not math.isclose(x.scale, y.scale, rel_tol=1e-9):
            raise HEError(f"scale mismatch: {x.scale} vs {y.scale}")
        return x, y

    def add(self, a, b) -> Ciphertext:
        x, y = self._operands(a, b)
        out = self._c.new_ct()
        self._c.ev.add(x, y, out)
        return self._wrap(out)

    def encode(self, values, level=None, scale=None) -> Plaintext:
        lvl = self._c.lvl(level)
        s = self.params.scale if scale is None else float(scale)
        pt = self._c.encode(values, lvl, s)
        return Plaintext(pt, self.params.id, lvl.index, s, 8 * pt.coeff_count())

    def _plain_operand(self, pt: Plaintext, obj):
        if pt.params_id != self.params.id:
            raise HEError("plaintext of another parameter set")
        if pt.level != self._c.level_of(obj):
            raise HEError(f"plaintext at level {pt.level}, ciphertext at {self._c.level_of(obj)}")
        return pt._obj

    def multiply_plain(self, ct, pt: Plaintext, rescale: bool = True) -> Ciphertext:
        obj = self._unwrap(ct)
        if rescale and self._c.level_of(obj) == 0:
            raise HEError("no level left to rescale")
        if not isinstance(pt, Plaintext):
            raise HEError(f"expected an encoded Plaintext, got {type(pt).__name__}")
        pt = self._plain_operand(pt, obj)
        if pt.is_zero():
            raise HEError("multiplication by an all-zero plaintext")
        out = self._c.new_ct()
        self._c.ev.multiply_plain(obj, pt, out)
        if rescale:
            self._c.ev.rescale_to_next_inplace(out)
        return self._wrap(out)

    def dot_plain(self, cts, pts) -> Ciphertext:
        """Products accumulated in place (one ciphertext allocated per product, none per sum)."""
        if not cts or len(cts) != len(pts):
            raise HEError("dot_plain needs as many plaintexts as ciphertexts, at least one")
        ev, acc = self._c.ev, None
        for ct, pt in zip(cts, pts, strict=True):
            obj = self._unwrap(ct)
            if not isinstance(pt, Plaintext):
                raise HEError(f"expected an encoded Plaintext, got {type(pt).__name__}")
            p = self._plain_operand(pt, obj)
            if p.is_zero():
                raise HEError("multiplication by an all-zero plaintext")
            if acc is None:
                acc = self._c.new_ct()
                ev.multiply_plain(obj, p, acc)
            else:
                t = self._c.new_ct()
                ev.multiply_plain(obj, p, t)
                ev.add_inplace(acc, t)
        return self._wrap(acc)

    def multiply(self, a, b, rescale: bool = True, relinearize: bool = True) -> Ciphertext:
        self._require_eval_keys("relin")
        x, y = self._unwrap(a), self._unwrap(b)
        if self._c.level_of(x) != self._c.level_of(y):
            raise HEError("level mismatch")
        if x.size() != 2 or y.size() != 2:
            raise HEError("multiply needs relinearized (two-polynomial) operands")
        if rescale and self._c.level_of(x) == 0:
            raise HEError("no level left to rescale")
        if relinearize:
            self._check_relin(self._c.level_of(x))
        out = self._c.new_ct()
        self._c.ev.multiply(x, y, out)
        if relinearize:
            self._c.ev.relinearize_inplace(out, self._rk)
        if rescale:
            self._c.ev.rescale_to_next_inplace(out)
        return self._wrap(out)

    def relinearize(self, ct) -> Ciphertext:
        self._require_eval_keys("relin")
        obj = self._unwrap(ct)
        if obj.size() == 2:
            return self._wrap(self._c.copy(obj))
        self._check_relin(self._c.level_of(obj))
        out = self._c.new_ct()
        self._c.ev.relinearize(obj, self._rk, out)
        return self._wrap(out)

    def _rotate_obj(self, obj, step: int):
        step = int(step) % self._c.slots
        if step == 0:
            return self._c.copy(obj)
        self._require_eval_keys("galois")
        signed = self._key_step(step, self._c.level_of(obj))
        out = self._c.new_ct()
        self._c.ev.rotate_vector(obj, signed, self._gk, out)
        return out

    def rotate(self, ct, step: int) -> Ciphertext:
        return self._wrap(self._rotate_obj(self._unwrap(ct), step))

    def rescale(self, ct) -> Ciphertext:
        obj = self._unwrap(ct)
        if self._c.level_of(obj) == 0:
            raise HEError("no level left to rescale")
        out = self._c.new_ct()
        self._c.ev.rescale_to_next(obj, out)
        return self._wrap(out)

    def mod_switch_to(self, ct, level: int) -> Ciphertext:
        obj = self._unwrap(ct)
        cur = self._c.level_of(obj)
        target = self._c.lvl(level)
        if target.index > cur:
            raise HEError(f"cannot switch up from level {cur} to {level}")
        out = self._c.new_ct()
        self._c.ev.mod_switch_to(obj, target.parms_id, out)
        return self._wrap(out)

    # ------------------------------------------------------------------ folded downloads
    def _secret_coefficients(self, sk=None) -> np.ndarray:
        lvl = self._c.levels[0]  # the secret's first residue run is mod q0 (NTT form)
        ntt = read_flat((sk or self._sk).data(), 0, self._c.n).reshape(1, self._c.n)
        return self._c.centered_ints(self._c.ntt_to_coeff(ntt, lvl), lvl).astype(np.int64)

    def _secret_bytes(self) -> bytes:
        return self._c.io.save(self._sk)  # SEAL's own form: NTT residues at the key level

    def _load_secret(self, data: bytes) -> None:
        raw_limit = self._c.key_raw_size()  # one polynomial at the key level: half a key component
        sk = sealapi.SecretKey()
        try:
            if len(data) > 2 * raw_limit:
                raise seal_format.SealFormatError("larger than a secret key")
            seal_format.parse_header(data)
            self._c.check_inflated(data, raw_limit)
            self._c.io.load(sk, self._c.ctx, data)
            valid = sealapi.is_valid_for(sk, self._c.ctx) and np.abs(self._secret_coefficients(sk)).max() <= 1
        except Exception as e:  # SEAL raises RuntimeError/ValueError on bad input
            raise KeyMaterialError(f"invalid secret key: {e}") from e
        if not valid:
            raise KeyMaterialError(f"not a ternary secret key of {self.params.id}")
        kg = sealapi.KeyGenerator(self._c.ctx, sk)
        pk = sealapi.PublicKey()
        kg.create_public_key(pk)
        self._sk, self._pk, self._keygen, self._export_cache = sk, pk, kg, None
        self._encryptor_sk = self._encryptor_pk = sealapi.Encryptor(self._c.ctx, pk, sk)
        self._decryptor = sealapi.Decryptor(self._c.ctx, sk)

    def _fold_coefficients(self, ct) -> np.ndarray:
        obj = self._unwrap(ct)
        if obj.size() != 2:
            raise HEError("folding takes a size-2 ciphertext")
        return self._c.coeff_residues(obj)

    def _encrypt_residues_to_bytes(self, residues: np.ndarray, from_level: int, level: int | None,
                                   scale: float) -> bytes:
        coeffs = self._c.centered_ints(residues, self._c.levels[from_level])
        if self._encryptor_sk is None:
            raise HEError("no secret key")
        pt = self._c.plaintext_from_coeffs(coeffs, self._c.lvl(level), scale)
        return self._c.pack(self._c.io.save(self._encryptor_sk.encrypt_symmetric(pt)))

    # ------------------------------------------------------------------ integer polynomials
    def decrypt_poly(self, ct: Ciphertext) -> np.ndarray:
        """Client: the decrypted plaintext polynomial as centred Python ints (no decoding)."""
        pt = self._decrypt_pt(ct)
        lvl = self._c.levels[self._c.level_of(self._unwrap(ct))]
        ntt = read_flat(pt, 0, len(lvl.primes) * self._c.n).reshape(len(lvl.primes), self._c.n)
        return self._c.centered_ints(self._c.ntt_to_coeff(ntt, lvl), lvl)

    # ------------------------------------------------------------------ refresh
    def mask_for_refresh(self, ct, fold: bool = False, rerandomize: bool = True) -> tuple[Ciphertext, RefreshMask]:
        """Server: ``ct + (rho, 0)`` with rho uniform in ``[-2^bits, 2^bits)`` per coefficient,
        ``bits = params.mask_bits(scale)``. The mask hides the plaintext and its noise
        statistically (``<= N 2^-(lambda+1)``), so no flooding is needed; but the ciphertext
        is re-randomized with a fresh public-key encryption of zero (default) so that its
        ``c1`` carries nothing of the computation. ``fold``: see ``HEBackend.mask_for_refresh``
        (rho's odd coefficients zero, no re-randomization here)."""
        if rerandomize and not fold:
            ct = self.rerandomize(ct, flood_log2_sigma=float("-inf"))
        obj = self._unwrap(ct)
        level = self._c.level_of(obj)
        scale = float(obj.scale)
        need = self.params.min_mask_level(scale)
        if level < need:
            raise HEError(f"level {level} cannot carry the refresh mask (needs >= {need})")
        bits = self.params.mask_bits(scale)
        rho = uniform_int_poly(self._c.n, bits)
        if fold:
            rho[1::2] = 0
        masked = self._c.add_int_poly(obj, rho)
        return self._wrap(masked), RefreshMask(self.params.id, bits, rho, scale)

    def _refresh_plaintext(self, ct, level: int | None):
        scale = float(self._unwrap(ct).scale)
        coeffs = self.decrypt_poly(ct)
        return self._c.plaintext_from_coeffs(coeffs, self._c.lvl(level), scale)

    def refresh_reencrypt_to_bytes(self, ct, level: int | None = None) -> bytes:
        """As ``refresh_reencrypt``, serialized in the seeded (half-size) upload form."""
        pt = self._refresh_plaintext(ct, level)
        if self._encryptor_sk is None:
            raise HEError("no secret key")
        return self._c.pack(self._c.io.save(self._encryptor_sk.encrypt_symmetric(pt)))

    def unmask_refresh(self, ct, mask: RefreshMask) -> Ciphertext:
        obj = self._unwrap(ct)
        if mask.params_id != self.params.id:
            raise HEError("mask from another parameter set")
        if not math.isclose(float(obj.scale), mask.scale, rel_tol=1e-12):
            raise HEError("re-encrypted ciphertext has another scale than the masked one")
        return self._wrap(self._c.add_int_poly(obj, -mask.coeffs))

    def rerandomize(self, ct, flood_log2_sigma: float | None = None) -> Ciphertext:
        self._require_eval_keys("pk")
        obj = self._unwrap(ct)
        lvl = self._c.levels[self._c.level_of(obj)]
        if obj.size() != 2:
            raise HEError("rerandomize expects a size-2 ciphertext")
        zero = self._c.new_ct()
        self._encryptor_pk.encrypt_zero(lvl.parms_id, zero)
        zero.scale = float(obj.scale)
        out = self._c.new_ct()
        self._c.ev.add(obj, zero, out)
        log_sigma = self.params.flood_log2_sigma if flood_log2_sigma is None else flood_log2_sigma
        if math.isfinite(log_sigma):
            noise = gaussian_int_poly(self._c.n, 2.0**log_sigma)
            out = self._c.add_int_poly(out, noise)
        return self._wrap(out)

    # ------------------------------------------------------------------ serialization
    def serialize(self, ct, noise_log2: float | None = None) -> bytes:
        obj = self._unwrap(ct)
        if noise_log2 is None:
            return self._c.pack(self._c.io.save(obj))
        if obj.size() != 2:
            raise HEError("only a size-2 ciphertext is sent rounded")
        lvl = self._c.levels[self._c.level_of(obj)]
        bits = rounding.bits_for(lvl.primes, noise_log2)
        return rounding.round_to_bytes(self._c.coeff_residues(obj), lvl.primes, lvl.index, float(obj.scale), bits)

    def _load_rounded(self, data: bytes):
        levels = self._c.levels
        try:
            level, polys, bits, scale, body = rounding.parse(
                data, self._c.n, lambda lv: levels[lv].primes if lv in levels else None)
        except rounding.RoundedError as e:
            raise CiphertextError(str(e)) from e
        lvl = levels[level]
        coeffs = rounding.unround(body, polys, self._c.n, lvl.primes, bits)
        try:
            obj = self._c.load_ct_blob(seal_format.ciphertext_blob(coeffs, lvl.parms_id, scale, False, self._c.version))
            self._c.ev.transform_to_ntt_inplace(obj)
        except Exception as e:  # SEAL refuses what its own checks do not accept (scale, sizes)
            raise CiphertextError(f"invalid rounded ciphertext for {self.params.id}: {e}") from e
        return obj

    def deserialize(self, data, *, level=None, size: int = 2, scale=None) -> Ciphertext:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise CiphertextError("ciphertext must be bytes")
        data = bytes(data)
        if not 2 <= size <= _CIPHERTEXT_MAX_SIZE:
            raise CiphertextError(f"unsupported expected size {size}")
        if len(data) > self._c.max_blob_size(size):
            raise CiphertextError("ciphertext too large for this parameter set")
        if rounding.is_rounded(data):
            obj = self._load_rounded(data)
        else:
            obj = self._load_blob(data, size)
        pid = tuple(obj.parms_id())
        if pid not in self._c.level_by_pid or not sealapi.is_valid_for(obj, self._c.ctx):
            raise CiphertextError(f"ciphertext not valid for {self.params.id}")
        if not obj.is_ntt_form():
            raise CiphertextError("CKKS ciphertext must be in NTT form")
        got_level = self._c.level_by_pid[pid]
        if level is not None and got_level != level:
            raise CiphertextError(f"ciphertext at level {got_level}, expected {level}")
        if obj.size() != size:
            raise CiphertextError(f"ciphertext has size {obj.size()}, expected {size}")
        s = float(obj.scale)
        lvl = self._c.levels[got_level]
        if not (math.isfinite(s) and 1.0 <= s < float(lvl.q_product)):
            raise CiphertextError(f"ciphertext scale {s} out of range")
        if scale is not None and not math.isclose(s, scale, rel_tol=1e-9):
            raise CiphertextError(f"ciphertext scale {s}, expected {scale}")
        return self._wrap(obj)

    def _load_blob(self, data: bytes, size: int):
        try:
            if seal_packing.is_packed(data):
                data = seal_packing.unpack(data, self._c.prime_widths, self._c.version, self._c.n)
            seal_format.parse_header(data)
            self._c.check_inflated(data, self._c.max_blob_size(size))
        except seal_format.SealFormatError as e:
            raise CiphertextError(f"not a ciphertext: {e}") from e
        obj = self._c.new_ct()
        try:
            self._c.io.load(obj, self._c.ctx, data)
        except Exception as e:  # SEAL: RuntimeError / ValueError for bad or foreign data
            raise CiphertextError(f"invalid ciphertext for {self.params.id}: {e}") from e
        return obj

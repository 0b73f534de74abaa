"""``plain``: the HE interface over plaintext slot vectors — a test double, never a production path.

It plays the role the torch twins play for the kernels: the protected protocol's layouts,
masks, level plan and message flow run on it in seconds, while real CKKS (SEAL, native) stays
for what needs real cryptography. ``make_backend`` refuses it unless a test asks with
``allow_test_backends=True``; it encrypts nothing (a "ciphertext" is the slot vector itself).

What it keeps of CKKS, so that protocol bugs surface here as they would on SEAL:

* levels and scales exactly as SEAL books them (same primes): ct×pt and ct×ct multiply the
  scales, ``rescale`` divides by ``prime(level)`` and drops a level, ``mod_switch_to`` only
  goes down, operands of ``add`` must agree in level and scale, level 0 cannot rescale, a scale
  too large for the level's modulus is refused, and so is a multiplication by an all-zero
  plaintext (SEAL refuses transparent results);
* wrap-around: a value whose ``|value| * scale`` reaches half the level's modulus would wrap in
  CKKS and corrupt the whole ciphertext, so it raises here;
* keys: decryption needs the secret key (the server's imported copy has none), a rotation
  needs the Galois key of its step, ct×ct needs the relinearization key, and a three-polynomial
  product must be relinearized before it is rotated, re-randomized or decrypted;
* the refresh mask's level room (``params.min_mask_level``), and the mask is subtracted exactly;
* with ``noise=True``, encryption noise (σ = 3.2 coefficient units) and the flooding noise of
  ``rerandomize``, as slot errors of std ``σ_coeff * sqrt(N/2) / scale``, from the OS CSPRNG.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence

import numpy as np

from veil.crypto import ring_switch
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
from veil.crypto.row_batch import RowBatch
from veil.crypto.sampling import standard_normal, urandom_u64

__all__ = ["PlainBackend"]

_MAGIC = b"VPLN"
_HEADER = struct.Struct("<4s8sBBd")  # magic, parameter-set tag, level, size, scale
_ENC_SIGMA = 3.2  # coefficient units, as SEAL's encryption error
_MASK_SLOT_BITS = 20  # the slot-domain mask: uniform in [-2^20, 2^20)
_FOLD_KEY, _FOLD_MAGIC = b"plain-fold-key", b"VPLF"  # a fold "key" and download (slot vectors)


class _Slots:
    __slots__ = ("values", "level", "scale", "size")

    def __init__(self, values: np.ndarray, level: int, scale: float, size: int = 2) -> None:
        self.values, self.level, self.scale, self.size = values, level, scale, size


class PlainBackend(HEBackend):
    name = "plain"
    supports_batch = True
    _rows: tuple[int, ...] = ()  # ``PlainBatch``: (B,), slot vectors [B, slots]

    @classmethod
    def batched(cls, rows):
        return PlainBatch(rows)

    def __init__(self, params: CkksParams, *, noise: bool = False) -> None:
        params.validate()
        self.params = params
        self.noise = noise
        self._slots = params.slot_count
        self._tag = hashlib.sha256(params.id.encode()).digest()[:8]
        self._secret = False
        self._public = self._relin = False
        self._half_q = [math.prod(params.primes[: lv + 1]) / 2 for lv in range(params.top_level + 1)]

    # ---- keys --------------------------------------------------------------------------------
    def generate_keys(self, rotation_steps: Sequence[int] | Mapping[int, int] = (),
                      relin_level: int | None = None) -> None:
        steps = self._set_steps(rotation_steps)
        self._set_relin_level(relin_level)
        if any(s == 0 or abs(s) >= self._slots for s in steps):
            raise ValueError(f"rotation steps must be non-zero and in (-{self._slots}, {self._slots})")
        self._secret = self._public = self._relin = True
        self._fold_key_bytes = _FOLD_KEY

    @property
    def has_secret_key(self) -> bool:
        return self._secret

    def export_public_material(self) -> PublicMaterial:
        if not self._secret:
            raise HEError("no keys generated")
        steps = self.rotation_steps
        return PublicMaterial(self.params.id, b"plain-public-key", b"plain-relin-keys", b"plain-galois-keys",
                              steps, tuple(self._key_levels[s] for s in steps), self.relin_level, self._fold_key_bytes)

    def import_public_material(self, material: PublicMaterial) -> None:
        if not isinstance(material, PublicMaterial) or material.params_id != self.params.id:
            raise KeyMaterialError("public material for another parameter set")
        if (material.public_key, material.relin_keys, material.galois_keys) != (
                b"plain-public-key", b"plain-relin-keys", b"plain-galois-keys"):
            raise KeyMaterialError("not plain-backend key material")
        try:
            levels = material.key_levels(self.params.top_level)
            self._set_steps(levels)
            self._set_relin_level(material.relin_level)
        except (TypeError, ValueError, HEError) as e:
            raise KeyMaterialError(f"rotation or relinearization levels are invalid: {e}") from None
        if material.fold_key not in (b"", _FOLD_KEY):
            raise KeyMaterialError("not a plain-backend fold key")
        self._public = self._relin = True
        self._fold_key_bytes = material.fold_key

    # ---- folded downloads: slot j + S/2 added to slot j, as the ring of N/2 does ------------------
    @property
    def can_fold(self) -> bool:
        return not self._secret and self._fold_key_bytes == _FOLD_KEY

    def _folded(self, ct, noise_log2: float | None) -> bytes:
        if not self.can_fold:
            raise HEError("no fold key: the client's public material holds none")
        if self.level(ct) > ring_switch.TOP_LEVEL:
            ct = self.mod_switch_to(ct, ring_switch.TOP_LEVEL)
        # a masked refresh: the halves' mean, i.e. the X²-polynomial itself; a download: each half
        # flooded at 2^-1/2 of the std, so that their sum holds the noise the ring of N/2 gives it
        x = self._unwrap(ct if noise_log2 is None else self.rerandomize(ct, noise_log2 - 0.5))
        half = self._slots // 2
        out = x.values[:half] + x.values[half:]
        if noise_log2 is None:
            out = out / 2
        return _HEADER.pack(_FOLD_MAGIC, self._tag, x.level, 2, x.scale) + out.astype("<f8").tobytes()

    def serialize_folded(self, ct, noise_log2: float) -> bytes:
        return self._folded(ct, noise_log2)

    def serialize_folded_refresh(self, ct, round_log2: float) -> bytes:
        return self._folded(ct, None)

    def refresh_reencrypt_folded_to_bytes(self, data: bytes, level=None) -> bytes:
        values, scale = self.decrypt_folded(data)
        return self.encrypt_to_bytes(np.tile(values, 2), level, scale)

    def is_folded(self, data: bytes) -> bool:
        return bytes(data[:4]) == _FOLD_MAGIC

    def decrypt_folded(self, data: bytes) -> tuple[np.ndarray, float]:
        if not self._secret:
            raise HEError("no secret key: this backend cannot decrypt")
        data = bytes(data)
        if len(data) != _HEADER.size + 4 * self._slots or _HEADER.unpack_from(data)[:2] != (_FOLD_MAGIC, self._tag):
            raise CiphertextError(f"not a folded plain download of {self.params.id}")
        return np.frombuffer(data, dtype="<f8", offset=_HEADER.size).astype(np.float64), _HEADER.unpack_from(data)[4]

    # ---- helpers -----------------------------------------------------------------------------
    def _wrap(self, values: np.ndarray, level: int, scale: float, size: int = 2) -> Ciphertext:
        if values.size and max(values.max(), -values.min()) * scale >= self._half_q[level]:
            raise HEError(f"value overflow at level {level}: |x| * scale reaches the modulus")
        return Ciphertext(_Slots(values, level, scale, size), self.params.id)

    def _unwrap(self, ct: Ciphertext) -> _Slots:
        if not isinstance(ct, Ciphertext) or not isinstance(ct._obj, _Slots) or ct.params_id != self.params.id:
            raise HEError("not a ciphertext of this backend and parameter set")
        return ct._obj

    def _level(self, level: int | None) -> int:
        level = self.params.top_level if level is None else level
        if not 0 <= level <= self.params.top_level:
            raise HEError(f"level {level} outside [0, {self.params.top_level}]")
        return level

    def _vector(self, values) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size > self._slots:
            raise HEError(f"{v.size} values exceed {self._slots} slots")
        if not np.all(np.isfinite(v)):
            raise HEError("values must be finite")
        out = np.zeros(self._slots)
        out[: v.size] = v
        return out

    def _check_scale(self, scale: float, level: int) -> None:
        if math.log2(scale) >= sum(q.bit_length() for q in self.params.primes[: level + 1]):
            raise HEError("scale out of bounds")

    def _slot_noise(self, sigma_coeff: float, scale: float) -> np.ndarray:
        n = self._slots * math.prod(self._rows)
        return standard_normal(n).reshape(self._rows + (self._slots,)) * (sigma_coeff * math.sqrt(self._slots) / scale)

    # ---- client ------------------------------------------------------------------------------
    def encrypt_to_bytes(self, values, level=None, scale=None) -> bytes:
        if not (self._secret or self._public):
            raise HEError("no key to encrypt with")
        level, scale = self._level(level), float(self.params.scale if scale is None else scale)
        v = self._vector(values)
        if self.noise:
            v = v + self._slot_noise(_ENC_SIGMA, scale)
        return self.serialize(self._wrap(v, level, scale))

    def decrypt(self, ct, length=None) -> np.ndarray:
        x = self._unwrap(ct)
        if not self._secret:
            raise HEError("no secret key: this backend cannot decrypt")
        if x.size != 2:
            raise HEError("decrypt expects a relinearized (size 2) ciphertext")
        return x.values.copy() if length is None else x.values[:length].copy()

    def refresh_reencrypt_to_bytes(self, ct, level=None) -> bytes:
        x = self._unwrap(ct)
        return self.encrypt_to_bytes(self.decrypt(ct), level, x.scale)

    # ---- encoding and metadata ---------------------------------------------------------------
    def encode(self, values, level=None, scale=None) -> Plaintext:
        level = self._level(level)
        scale = float(self.params.scale if scale is None else scale)
        v = self._vector(values)  # with whether it is all zero (SEAL refuses such a product)
        return Plaintext((v, bool(np.any(v))), self.params.id, level, scale, 8 * (level + 1) * 2 * self._slots)

    def level(self, ct) -> int:
        return self._unwrap(ct).level

    def scale(self, ct) -> float:
        return self._unwrap(ct).scale

    def nbytes(self, ct) -> int:
        x = self._unwrap(ct)
        return x.size * (x.level + 1) * self.params.poly_modulus_degree * 8 * math.prod(self._rows)

    # ---- arithmetic --------------------------------------------------------------------------
    def add(self, a, b) -> Ciphertext:
        x, y = self._unwrap(a), self._unwrap(b)
        if x.level != y.level:
            raise HEError(f"level mismatch: {x.level} vs {y.level}")
        if not math.isclose(x.scale, y.scale, rel_tol=1e-9):
            raise HEError(f"scale mismatch: {x.scale} vs {y.scale}")
        return self._wrap(x.values + y.values, x.level, x.scale, max(x.size, y.size))

    def multiply_plain(self, ct, pt: Plaintext, rescale=True) -> Ciphertext:
        x = self._unwrap(ct)
        if not isinstance(pt, Plaintext) or pt.params_id != self.params.id:
            raise HEError("expected a Plaintext of this parameter set")
        if pt.level != x.level:
            raise HEError(f"plaintext at level {pt.level}, ciphertext at {x.level}")
        values, nonzero = pt._obj
        if not nonzero:
            raise HEError("multiplication by an all-zero plaintext")
        scale = x.scale * pt.scale
        self._check_scale(scale, x.level)
        out = self._wrap(x.values * values, x.level, scale, x.size)
        return self.rescale(out) if rescale else out

    def multiply(self, a, b, rescale=True, relinearize=True) -> Ciphertext:
        if not self._relin:
            raise HEError("no relinearization keys: import public material first")
        x, y = self._unwrap(a), self._unwrap(b)
        if x.level != y.level:
            raise HEError("level mismatch")
        if x.size != 2 or y.size != 2:
            raise HEError("multiply needs relinearized (two-polynomial) operands")
        if relinearize:
            self._check_relin(x.level)
        scale = x.scale * y.scale
        self._check_scale(scale, x.level)
        out = self._wrap(x.values * y.values, x.level, scale, 2 if relinearize else 3)
        return self.rescale(out) if rescale else out

    def relinearize(self, ct) -> Ciphertext:
        if not self._relin:
            raise HEError("no relinearization keys: import public material first")
        x = self._unwrap(ct)
        if x.size == 3:
            self._check_relin(x.level)
        return self._wrap(x.values, x.level, x.scale, 2)

    def rescale(self, ct) -> Ciphertext:
        x = self._unwrap(ct)
        if x.level == 0:
            raise HEError("no level left to rescale")
        return self._wrap(x.values, x.level - 1, x.scale / self.params.prime(x.level), x.size)

    def mod_switch_to(self, ct, level: int) -> Ciphertext:
        x = self._unwrap(ct)
        if self._level(level) > x.level:
            raise HEError(f"cannot switch up from level {x.level} to {level}")
        return self._wrap(x.values, level, x.scale, x.size)

    def rotate(self, ct, step: int) -> Ciphertext:
        x = self._unwrap(ct)
        step = int(step) % self._slots
        if step:
            if x.size != 2:
                raise HEError("rotate needs a relinearized (two-polynomial) ciphertext")
            self._key_step(step, x.level)  # refuses as a real backend's (smaller) keys would
        return self._wrap(np.roll(x.values, -step, axis=-1), x.level, x.scale, x.size)

    # ---- server: refresh and circuit privacy -------------------------------------------------
    def mask_for_refresh(self, ct, fold: bool = False) -> tuple[Ciphertext, RefreshMask]:
        ct = ct if fold else self.rerandomize(ct, float("-inf"))
        x = self._unwrap(ct)
        need = self.params.min_mask_level(x.scale)
        if x.level < need:
            raise HEError(f"level {x.level} cannot carry the refresh mask (needs >= {need})")
        raw = (urandom_u64(self._slots * math.prod(self._rows)) >> np.uint64(64 - _MASK_SLOT_BITS - 1)).astype(np.float64)
        raw = raw.reshape(self._rows + (self._slots,))
        mask = raw - 2.0**_MASK_SLOT_BITS
        if fold:  # a polynomial in X²: slots that repeat every S/2
            mask[..., self._slots // 2 :] = mask[..., : self._slots // 2]
        return (self._wrap(x.values + mask, x.level, x.scale),
                RefreshMask(self.params.id, self.params.mask_bits(x.scale), mask, x.scale))

    def unmask_refresh(self, ct, mask: RefreshMask) -> Ciphertext:
        x = self._unwrap(ct)
        if mask.params_id != self.params.id:
            raise HEError("mask from another parameter set")
        if not math.isclose(x.scale, mask.scale, rel_tol=1e-12):
            raise HEError("re-encrypted ciphertext has another scale than the masked one")
        return self._wrap(x.values - mask.coeffs, x.level, x.scale, x.size)

    def rerandomize(self, ct, flood_log2_sigma=None) -> Ciphertext:
        if not self._public:
            raise HEError("no public key")
        x = self._unwrap(ct)
        if x.size != 2:
            raise HEError("rerandomize expects a size-2 ciphertext")
        log_sigma = self.params.flood_log2_sigma if flood_log2_sigma is None else flood_log2_sigma
        v = x.values
        if self.noise and math.isfinite(log_sigma):
            v = v + self._slot_noise(2.0**log_sigma, x.scale)
        return self._wrap(v.copy(), x.level, x.scale)

    # ---- serialization -----------------------------------------------------------------------
    def serialize(self, ct, noise_log2=None) -> bytes:
        # slot vectors have no coefficients: nothing to round (noise_log2 is ignored)
        x = self._unwrap(ct)
        if x.values.ndim != 1:
            raise HEError("serialize one ciphertext at a time (a batch's rows: PlainBatch.serialize)")
        return _HEADER.pack(_MAGIC, self._tag, x.level, x.size, x.scale) + x.values.astype("<f8").tobytes()

    def deserialize(self, data, *, level=None, size=2, scale=None) -> Ciphertext:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise CiphertextError("ciphertext must be bytes")
        data = bytes(data)
        if len(data) != _HEADER.size + 8 * self._slots:
            raise CiphertextError("ciphertext has the wrong length for this parameter set")
        magic, tag, got_level, got_size, got_scale = _HEADER.unpack_from(data)
        if magic != _MAGIC or tag != self._tag:
            raise CiphertextError(f"not a plain ciphertext of {self.params.id}")
        if got_level > self.params.top_level or (level is not None and got_level != level):
            raise CiphertextError(f"ciphertext at level {got_level}, expected {level}")
        if got_size != size:
            raise CiphertextError(f"ciphertext has size {got_size}, expected {size}")
        q = math.prod(self.params.primes[: got_level + 1])
        if not (math.isfinite(got_scale) and 1.0 <= got_scale < q):
            raise CiphertextError(f"ciphertext scale {got_scale} out of range")
        if scale is not None and not math.isclose(got_scale, scale, rel_tol=1e-9):
            raise CiphertextError(f"ciphertext scale {got_scale}, expected {scale}")
        values = np.frombuffer(data, dtype="<f8", offset=_HEADER.size).astype(np.float64)
        if not np.all(np.isfinite(values)):
            raise CiphertextError("ciphertext holds non-finite values")
        try:
            return self._wrap(values, got_level, got_scale, got_size)
        except HEError as e:
            raise CiphertextError(str(e)) from None


class PlainBatch(RowBatch, PlainBackend):
    """Several sessions' slot vectors ``[B, slots]`` as one (test double of ``NativeBatch``: the
    protocol's batched steps, tested in seconds)."""

    name = "plain-batch"
    supports_batch = False

    def __init__(self, rows: Sequence[PlainBackend]) -> None:
        rows = self._check_rows(rows, PlainBackend)
        first = rows[0]
        self.params, self.noise, self._slots, self._tag = first.params, first.noise, first._slots, first._tag
        self._half_q, self._secret = first._half_q, False
        self._public, self._relin = all(r._public for r in rows), all(r._relin for r in rows)

    def stack(self, cts: Sequence[Ciphertext | None]) -> Ciphertext:
        xs = [None if ct is None else self._unwrap(ct) for ct in cts]
        real = [x for x in xs if x is not None]
        if len(xs) != self.batch_size or not real or len({(x.level, x.scale, x.size, x.values.ndim) for x in real}) != 1 \
                or real[0].values.ndim != 1:
            raise HEError("a batch stacks one ciphertext per row, of one level, scale and size")
        x0 = real[0]
        return self._wrap(np.stack([np.zeros_like(x0.values) if x is None else x.values for x in xs]),
                          x0.level, x0.scale, x0.size)

    def pick_rows(self, keep: Sequence[bool], ct: Ciphertext, other: Ciphertext | None = None) -> Ciphertext:
        x = self._unwrap(ct)
        o = None if other is None else self._unwrap(other)
        if len(keep) != self.batch_size or (o is not None and (o.level, o.scale, o.values.shape) !=
                                            (x.level, x.scale, x.values.shape)):
            raise HEError("rows are picked between ciphertexts of one batch, level and scale")
        rest = np.zeros_like(x.values) if o is None else o.values
        return self._wrap(np.where(np.asarray(keep)[:, None], x.values, rest), x.level, x.scale, x.size)

    def unstack(self, ct: Ciphertext) -> list[Ciphertext]:
        x = self._unwrap(ct)
        return [Ciphertext(_Slots(v.copy(), x.level, x.scale, x.size), self.params.id) for v in x.values]

    def stack_plain(self, pts: Sequence[Plaintext]) -> Plaintext:
        if len(pts) != self.batch_size or len({(p.level, p.scale) for p in pts}) != 1:
            raise HEError("a batch stacks one plaintext per row, of one level and scale")
        values = np.stack([p._obj[0] for p in pts])
        # all-zero only if every row's is (a row's zero mask of a padded chunk is fine: its row is zero)
        return Plaintext((values, any(p._obj[1] for p in pts)), self.params.id, pts[0].level, pts[0].scale,
                         pts[0].nbytes * len(pts))

    @staticmethod
    def unstack_plain(pt: Plaintext) -> list[Plaintext]:
        values, _ = pt._obj
        return [Plaintext((v, bool(np.any(v))), pt.params_id, pt.level, pt.scale, pt.nbytes // len(values))
                for v in values]

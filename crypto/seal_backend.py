"""CKKS backend on Microsoft SEAL through ``tenseal.sealapi``.

Randomness: every SEAL operation (keys, encryption, encryption of zero) uses SEAL's default
PRNG factory (Blake2xb seeded from the OS via ``random_device``). The masks and flooding
noise this module samples itself come from ``os.urandom``.

``tenseal.sealapi`` binds ``save``/``load`` only to file paths, so (de)serialization goes
through files in a private temporary directory (``/dev/shm`` when it exists). Only public
objects are ever written there: ciphertexts, public/relin/Galois keys and plaintexts of
masked or public data -- never the secret key.

Matrix-vector products (``encode_matrix`` / ``baby_steps`` / ``matvec``): generalized
diagonals ``diag_k[j] = W[j, (j+k) % cols]`` against an input replicated with period ``cols``;
baby steps ``rot(x, b), b < n1`` (shareable across matrices), giant-step rotations
``g * n1`` pre-applied to the plaintexts, so a product costs ``n1 - 1 + n2 - 1`` rotations
(plus ``log2(blocks)`` for the "folded" layout, see ``veil.crypto.backend.MatvecPlan``).
Diagonals are encoded at scale ``q_level`` so the rescaled output keeps the input's scale.

Exact integer polynomials (refresh mask, flooding noise, the client's decrypted ``x + rho``):
SEAL objects are built from numpy residues through SEAL's own stream format
(``veil.crypto.seal_format``) and converted between coefficient and NTT form by SEAL's
``transform_to_ntt`` / ``transform_from_ntt`` on a "carrier" ciphertext ``(m, 1)``, whose
constant second polynomial keeps it from being transparent; the carrier's ``1`` is cancelled
by subtracting the NTT-form ``(0, 1)``. Reading goes through the bound ``obj[i]``. The
integers themselves are Python ints (CRT composition and reduction in object arrays).

Concurrency: key generation and ``import_public_material`` replace the backend's keys and must
not overlap other calls; the evaluation, encryption and (de)serialization methods only read
shared state (SEAL's Evaluator/Encryptor/Decryptor are safe for concurrent use on distinct
ciphertexts), and every file name is unique.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence

import numpy as np
import tenseal.sealapi as sealapi

from veil.crypto import seal_format, seal_packing
from veil.crypto.backend import (
    BabySteps,
    Ciphertext,
    CiphertextError,
    EncodedMatrix,
    HEBackend,
    HEError,
    KeyMaterialError,
    Plaintext,
    PublicMaterial,
    RefreshMask,
    plan_matvec,
)
from veil.crypto.params import CkksParams

__all__ = ["SealBackend", "galois_element"]

_CIPHERTEXT_MAX_SIZE = 3  # what deserialize accepts at most (2 normally, 3 unrelinearized)


def galois_element(step: int, poly_modulus_degree: int) -> int:
    """SEAL's Galois element of a slot rotation by ``step`` (left for positive steps)."""
    n = poly_modulus_degree
    half = n // 2
    if step == 0 or abs(step) >= half:
        raise ValueError(f"rotation step {step} out of range for N={n}")
    return pow(3, step % half, 2 * n)


class _FileIO:
    """Private directory for SEAL's path-based save/load."""

    def __init__(self) -> None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.dir = tempfile.mkdtemp(prefix="veil-seal-", dir=base)
        os.chmod(self.dir, 0o700)
        self._counter = itertools.count()
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.dir, True)

    def _path(self) -> str:
        return os.path.join(self.dir, f"{os.getpid()}-{next(self._counter)}.bin")

    def save(self, obj) -> bytes:
        path = self._path()
        try:
            obj.save(path)
            with open(path, "rb") as f:
                return f.read()
        finally:
            if os.path.exists(path):
                os.unlink(path)

    def load(self, obj, context, data: bytes) -> None:
        path = self._path()
        try:
            with open(path, "wb") as f:
                f.write(data)
            if context is None:
                obj.load(path)
            else:
                obj.load(context, path)
        finally:
            if os.path.exists(path):
                os.unlink(path)


class _Level:
    __slots__ = ("index", "parms_id", "primes", "q_product")

    def __init__(self, index: int, parms_id: list[int], primes: list[int]) -> None:
        self.index = index
        self.parms_id = parms_id
        self.primes = primes
        self.q_product = math.prod(primes)


def _read_flat(obj, start: int, count: int) -> np.ndarray:
    """Read ``count`` u64 words of a SEAL Ciphertext/Plaintext through ``obj[i]``."""
    getter = obj.__getitem__
    return np.fromiter(map(getter, range(start, start + count)), dtype=np.uint64, count=count)


def _urandom_u64(count: int) -> np.ndarray:
    return np.frombuffer(os.urandom(8 * count), dtype="<u8").astype(np.uint64)


def uniform_int_poly(n: int, bits: int) -> np.ndarray:
    """``n`` independent uniform integers in ``[-2^bits, 2^bits)`` from the OS CSPRNG, as an
    object array of Python ints."""
    if bits < 1 or bits > 127:
        raise ValueError("mask bits must be in [1, 127]")
    total = bits + 1
    lo = _urandom_u64(n)
    if total <= 64:
        vals = (lo & np.uint64((1 << total) - 1)).astype(object)
    else:
        hi = _urandom_u64(n) & np.uint64((1 << (total - 64)) - 1)
        vals = (hi.astype(object) << 64) + lo.astype(object)
    return vals - (1 << bits)


def gaussian_int_poly(n: int, sigma: float) -> np.ndarray:
    """``n`` samples of round(N(0, sigma^2)) (Box-Muller on OS-CSPRNG uniforms), int64."""
    if sigma <= 0:
        return np.zeros(n, dtype=np.int64)
    if sigma > 2.0**52:
        raise ValueError("flooding sigma too large for double-precision sampling")
    u = _urandom_u64(2 * n) >> np.uint64(11)  # 53 random bits
    u = (u.astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
    r = np.sqrt(-2.0 * np.log(u[:n]))
    z = r * np.cos(2.0 * np.pi * u[n:])
    return np.rint(z * sigma).astype(np.int64)


class SealBackend(HEBackend):
    """SEAL CKKS backend. ``SealBackend(params)``; client: ``generate_keys``; server:
    ``import_public_material``."""

    def __init__(self, params: CkksParams) -> None:
        params.validate()
        self.params = params
        n = params.poly_modulus_degree
        parms = sealapi.EncryptionParameters(sealapi.SCHEME_TYPE.CKKS)
        parms.set_poly_modulus_degree(n)
        parms.set_coeff_modulus(sealapi.CoeffModulus.Create(n, list(params.coeff_modulus_bits)))
        sec = (
            sealapi.SEC_LEVEL_TYPE.TC128
            if params.security_level == 128
            else sealapi.SEC_LEVEL_TYPE.NONE
        )
        self._ctx = sealapi.SEALContext(parms, True, sec)
        if not self._ctx.parameters_set():
            raise HEError(f"SEAL refused {params.id}: {self._ctx.parameters_error_message()}")
        self._encoder = sealapi.CKKSEncoder(self._ctx)
        self._ev = sealapi.Evaluator(self._ctx)
        self._io = _FileIO()
        self._n = n
        self._slots = self._encoder.slot_count()

        self._levels: dict[int, _Level] = {}
        self._level_by_pid: dict[tuple[int, ...], int] = {}
        cd = self._ctx.first_context_data()
        while cd is not None:
            idx = cd.chain_index()
            pid = list(cd.parms_id())
            primes = [m.value() for m in cd.parms().coeff_modulus()]
            self._levels[idx] = _Level(idx, pid, primes)
            self._level_by_pid[tuple(pid)] = idx
            cd = cd.next_context_data()
        if max(self._levels) != params.top_level:
            raise HEError("SEAL modulus chain does not match the parameter set")
        self._version = self._seal_version()

        self._sk = None
        self._pk = None
        self._rk = None
        self._gk = None
        self._steps: tuple[int, ...] = ()
        self._encryptor_sk = None
        self._encryptor_pk = None
        self._decryptor = None
        self._export_cache: PublicMaterial | None = None
        self._unit_cache: dict[tuple[int, float], object] = {}

    # ------------------------------------------------------------------ helpers
    def _seal_version(self) -> tuple[int, int]:
        m = sealapi.Modulus(3)
        h = seal_format.parse_header(self._io.save(m))
        return h.version_major, h.version_minor

    def _wrap(self, obj) -> Ciphertext:
        return Ciphertext(obj, self.params.id, id(self))

    def _unwrap(self, ct: Ciphertext):
        if not isinstance(ct, Ciphertext):
            raise HEError(f"expected a Ciphertext handle, got {type(ct).__name__}")
        if ct.params_id != self.params.id:
            raise HEError(f"ciphertext of {ct.params_id!r}, backend is {self.params.id!r}")
        return ct._obj

    def _lvl(self, level: int | None) -> _Level:
        if level is None:
            level = self.params.top_level
        if level not in self._levels:
            raise HEError(f"level {level} outside [0, {self.params.top_level}]")
        return self._levels[level]

    def _level_of(self, obj) -> int:
        return self._level_by_pid[tuple(obj.parms_id())]

    def _encode(self, values, level: _Level, scale: float):
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size > self._slots:
            raise HEError(f"{v.size} values exceed {self._slots} slots")
        if not np.all(np.isfinite(v)):
            raise HEError("values must be finite")
        pt = sealapi.Plaintext()
        self._encoder.encode(v.tolist(), level.parms_id, float(scale), pt)
        return pt

    def _new_ct(self):
        return sealapi.Ciphertext(self._ctx)

    def _require_eval_keys(self, what: str):
        if what == "relin" and self._rk is None:
            raise HEError("no relinearization keys: import public material first")
        if what == "galois" and self._gk is None:
            raise HEError("no Galois keys: import public material first")
        if what == "pk" and self._encryptor_pk is None:
            raise HEError("no public key")

    # ------------------------------------------------------------------ keys
    def generate_keys(self, rotation_steps: Sequence[int] = ()) -> None:
        kg = sealapi.KeyGenerator(self._ctx)
        self._sk = kg.secret_key()
        self._pk = sealapi.PublicKey()
        kg.create_public_key(self._pk)
        self._keygen = kg
        steps = tuple(sorted({int(s) for s in rotation_steps}))
        for s in steps:
            galois_element(s, self._n)  # validates
        self._steps = steps
        self._encryptor_sk = sealapi.Encryptor(self._ctx, self._pk, self._sk)
        self._encryptor_pk = self._encryptor_sk
        self._decryptor = sealapi.Decryptor(self._ctx, self._sk)
        self._export_cache = None

    @property
    def has_secret_key(self) -> bool:
        return self._sk is not None

    @property
    def rotation_steps(self) -> tuple[int, ...]:
        return self._steps

    def export_public_material(self) -> PublicMaterial:
        if self._sk is None:
            raise HEError("no keys generated")
        if self._export_cache is None:
            kg = self._keygen
            pk_bytes = self._io.save(self._pk)
            rk_bytes = self._io.save(kg.create_relin_keys())  # seeded (half size)
            if self._steps:
                elts = [galois_element(s, self._n) for s in self._steps]
                gk_bytes = self._io.save(kg.create_galois_keys(elts))  # seeded
            else:
                gk_bytes = b""
            self._export_cache = PublicMaterial(
                params_id=self.params.id,
                public_key=pk_bytes,
                relin_keys=rk_bytes,
                galois_keys=gk_bytes,
                rotation_steps=self._steps,
            )
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
        one = self._key_raw_size()
        dnum = len(self.params.coeff_modulus_bits) - 1  # key-switching decomposition size
        n_steps = len(material.rotation_steps)
        for name, obj, data, raw_limit in (
            ("public key", pk, material.public_key, one),
            ("relin keys", rk, material.relin_keys, dnum * one),
            ("Galois keys", gk, material.galois_keys, max(1, n_steps) * dnum * one),
        ):
            if name == "Galois keys" and not data and not material.rotation_steps:
                gk = None
                continue
            try:
                data = bytes(data)
                if len(data) > 2 * raw_limit:
                    raise seal_format.SealFormatError("larger than the expected key size")
                seal_format.parse_header(data)
                self._check_inflated(data, raw_limit)
                self._io.load(obj, self._ctx, data)
            except Exception as e:  # SEAL raises RuntimeError/ValueError on bad input
                raise KeyMaterialError(f"invalid {name}: {e}") from e
            if not sealapi.is_valid_for(obj, self._ctx):
                raise KeyMaterialError(f"{name} not valid for {self.params.id}")
            # Relin and Galois keys share SEAL's serialized form: a Galois-key blob loads as
            # "relin keys" (found by fuzzing). Relinearization keys hold exactly the s^2 key.
            if name == "relin keys" and (obj.size() != 1 or not obj.has_key(2)):
                raise KeyMaterialError("relin keys must hold exactly the key for s^2")
        steps = tuple(int(s) for s in material.rotation_steps)
        for s in steps:
            try:
                elt = galois_element(s, self._n)
            except ValueError as e:
                raise KeyMaterialError(str(e)) from e
            if gk is None or not gk.has_key(elt):
                raise KeyMaterialError(f"Galois keys lack rotation step {s}")
        self._pk, self._rk, self._gk, self._steps = pk, rk, gk, steps
        if self._sk is not None:
            self._encryptor_sk = sealapi.Encryptor(self._ctx, pk, self._sk)
            self._encryptor_pk = self._encryptor_sk
        else:
            self._encryptor_pk = sealapi.Encryptor(self._ctx, pk)

    # ------------------------------------------------------------------ encrypt / decrypt
    def _encrypt_pt(self, pt):
        ct = self._new_ct()
        if self._encryptor_sk is not None:
            self._encryptor_sk.encrypt_symmetric(pt, ct)
        elif self._encryptor_pk is not None:
            self._encryptor_pk.encrypt(pt, ct)
        else:
            raise HEError("no key to encrypt with")
        return ct

    def encrypt(self, values, level=None, scale=None) -> Ciphertext:
        lvl = self._lvl(level)
        pt = self._encode(values, lvl, self.params.scale if scale is None else scale)
        return self._wrap(self._encrypt_pt(pt))

    def encrypt_to_bytes(self, values, level=None, scale=None) -> bytes:
        lvl = self._lvl(level)
        pt = self._encode(values, lvl, self.params.scale if scale is None else scale)
        if self._encryptor_sk is not None:
            return self._pack(self._io.save(self._encryptor_sk.encrypt_symmetric(pt)))
        return self._pack(self._io.save(self._encrypt_pt(pt)))

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
        out = np.asarray(self._encoder.decode_double(pt), dtype=np.float64)
        return out if length is None else out[:length]

    # ------------------------------------------------------------------ metadata
    def level(self, ct: Ciphertext) -> int:
        return self._level_of(self._unwrap(ct))

    def scale(self, ct: Ciphertext) -> float:
        return float(self._unwrap(ct).scale)

    def size(self, ct: Ciphertext) -> int:
        return int(self._unwrap(ct).size())

    # ------------------------------------------------------------------ arithmetic
    def _operands(self, a, b):
        x, y = self._unwrap(a), self._unwrap(b)
        la, lb = self._level_of(x), self._level_of(y)
        if la != lb:
            raise HEError(f"level mismatch: {la} vs {lb}")
        if not math.isclose(x.scale, y.scale, rel_tol=1e-9):
            raise HEError(f"scale mismatch: {x.scale} vs {y.scale}")
        return x, y

    def add(self, a, b) -> Ciphertext:
        x, y = self._operands(a, b)
        out = self._new_ct()
        self._ev.add(x, y, out)
        return self._wrap(out)

    def sub(self, a, b) -> Ciphertext:
        x, y = self._operands(a, b)
        out = self._new_ct()
        self._ev.sub(x, y, out)
        return self._wrap(out)

    def encode(self, values, level=None, scale=None) -> Plaintext:
        lvl = self._lvl(level)
        s = self.params.scale if scale is None else float(scale)
        return Plaintext(self._encode(values, lvl, s), self.params.id, lvl.index, s)

    def _plain_operand(self, pt: Plaintext, obj):
        if pt.params_id != self.params.id:
            raise HEError("plaintext of another parameter set")
        if pt.level != self._level_of(obj):
            raise HEError(f"plaintext at level {pt.level}, ciphertext at {self._level_of(obj)}")
        return pt._obj

    def add_plain(self, ct, values) -> Ciphertext:
        obj = self._unwrap(ct)
        if isinstance(values, Plaintext):
            pt = self._plain_operand(values, obj)
            if not math.isclose(values.scale, obj.scale, rel_tol=1e-9):
                raise HEError("scale mismatch")
        else:
            pt = self._encode(values, self._levels[self._level_of(obj)], obj.scale)
        out = self._new_ct()
        self._ev.add_plain(obj, pt, out)
        return self._wrap(out)

    def multiply_plain(self, ct, values, rescale: bool = True) -> Ciphertext:
        obj = self._unwrap(ct)
        lvl = self._levels[self._level_of(obj)]
        if rescale and lvl.index == 0:
            raise HEError("no level left to rescale")
        if isinstance(values, Plaintext):
            pt = self._plain_operand(values, obj)
        else:
            pt = self._encode(values, lvl, float(lvl.primes[-1]))
        if pt.is_zero():
            raise HEError("multiplication by an all-zero plaintext")
        out = self._new_ct()
        self._ev.multiply_plain(obj, pt, out)
        if rescale:
            self._ev.rescale_to_next_inplace(out)
        return self._wrap(out)

    def multiply(self, a, b, rescale: bool = True, relinearize: bool = True) -> Ciphertext:
        self._require_eval_keys("relin")
        x, y = self._unwrap(a), self._unwrap(b)
        if self._level_of(x) != self._level_of(y):
            raise HEError("level mismatch")
        if x.size() != 2 or y.size() != 2:
            raise HEError("multiply needs relinearized (two-polynomial) operands")
        if rescale and self._level_of(x) == 0:
            raise HEError("no level left to rescale")
        out = self._new_ct()
        self._ev.multiply(x, y, out)
        if relinearize:
            self._ev.relinearize_inplace(out, self._rk)
        if rescale:
            self._ev.rescale_to_next_inplace(out)
        return self._wrap(out)

    def relinearize(self, ct) -> Ciphertext:
        self._require_eval_keys("relin")
        obj = self._unwrap(ct)
        if obj.size() == 2:
            return self._wrap(self._copy(obj))
        out = self._new_ct()
        self._ev.relinearize(obj, self._rk, out)
        return self._wrap(out)

    def _rotate_obj(self, obj, step: int):
        step = int(step) % self._slots
        if step == 0:
            return self._copy(obj)
        self._require_eval_keys("galois")
        signed = step if step in self._steps else step - self._slots
        if signed not in self._steps:
            raise HEError(f"no Galois key for rotation step {step}")
        out = self._new_ct()
        self._ev.rotate_vector(obj, signed, self._gk, out)
        return out

    def rotate(self, ct, step: int) -> Ciphertext:
        return self._wrap(self._rotate_obj(self._unwrap(ct), step))

    def rescale(self, ct) -> Ciphertext:
        obj = self._unwrap(ct)
        if self._level_of(obj) == 0:
            raise HEError("no level left to rescale")
        out = self._new_ct()
        self._ev.rescale_to_next(obj, out)
        return self._wrap(out)

    def mod_switch_to(self, ct, level: int) -> Ciphertext:
        obj = self._unwrap(ct)
        cur = self._level_of(obj)
        target = self._lvl(level)
        if target.index > cur:
            raise HEError(f"cannot switch up from level {cur} to {level}")
        out = self._new_ct()
        self._ev.mod_switch_to(obj, target.parms_id, out)
        return self._wrap(out)

    def set_scale(self, ct, scale: float) -> Ciphertext:
        obj = self._unwrap(ct)
        if not (scale > 0 and math.isfinite(scale)):
            raise HEError("scale must be positive")
        if abs(math.log2(scale) - math.log2(obj.scale)) > 1.0:
            raise HEError("set_scale is only for rescale drift (less than a factor 2)")
        out = self._copy(obj)
        out.scale = float(scale)
        return self._wrap(out)

    # ------------------------------------------------------------------ matrix-vector
    def encode_matrix(
        self, weight, level: int, n1: int | None = None, layout: str = "bsgs",
        max_input_span: int | None = None,
    ) -> EncodedMatrix:
        w = np.asarray(weight, dtype=np.float64)
        if w.ndim != 2:
            raise HEError("weight must be a 2-D matrix")
        rows, cols = w.shape
        span = self._slots if max_input_span is None else min(max_input_span, self._slots)
        try:
            plan = plan_matvec(rows, cols, span, layout, n1)
        except ValueError as e:
            raise HEError(str(e)) from e
        lvl = self._lvl(level)
        if lvl.index == 0:
            raise HEError("a matrix product needs a level to rescale into")
        if plan.layout == "wide":
            # diagonals of the matrix padded to row_period rows and tiled to cols rows:
            # diag_k[j] = W[j % row_period, (j + k) % cols], j < cols, k < row_period
            wpad = np.zeros((plan.row_period, cols))
            wpad[:rows] = w
            j = np.arange(cols)
            diags = wpad[(j % plan.row_period)[None, :], (j[None, :] + np.arange(plan.row_period)[:, None]) % cols]
        else:
            # generalized diagonals: diag_k[j] = W[j, (j + k) % cols], j < rows, k < cols
            j = np.arange(rows)
            diags = w[j[None, :], (j[None, :] + np.arange(cols)[:, None]) % cols]  # (cols, rows)
        diag_len = plan.diag_len
        pt_scale = float(lvl.primes[-1])
        plaintexts: dict[int, object] = {}
        nbytes = 0
        per_block = plan.diagonals_per_block
        owners = plan.diagonal_owners()  # "bsgs": one block holding every diagonal
        for u in range(per_block):
            g = u // plan.n1
            buf = np.zeros(self._slots, dtype=np.float64)
            for t, row in enumerate(owners):
                if row[u] < 0:
                    continue
                # block t at t*stride; giant-step pre-rotation by -g*n1
                start = t * plan.stride + g * plan.n1
                buf[start : start + diag_len] = diags[row[u]]
            if not np.any(buf):
                continue
            pt = self._encode(buf, lvl, pt_scale)
            if pt.is_zero():
                continue
            plaintexts[u] = pt
            nbytes += 8 * pt.coeff_count()
        if not plaintexts:
            raise HEError("all-zero matrix")
        return EncodedMatrix(
            params_id=self.params.id,
            level=lvl.index,
            plan=plan,
            plaintext_scale=pt_scale,
            plaintexts=plaintexts,
            nbytes=nbytes,
        )

    def baby_steps(self, ct, n1: int) -> BabySteps:
        obj = self._unwrap(ct)
        rots = [obj] + [self._rotate_obj(obj, b) for b in range(1, n1)]
        return BabySteps(
            params_id=self.params.id,
            level=self._level_of(obj),
            n1=n1,
            rotations=rots,
            scale=float(obj.scale),
        )

    def matvec(self, matrix: EncodedMatrix, x, rescale: bool = True) -> Ciphertext:
        if matrix.params_id != self.params.id:
            raise HEError("matrix encoded for another parameter set")
        bs = x if isinstance(x, BabySteps) else self.baby_steps(x, matrix.n1)
        if bs.n1 != matrix.n1:
            raise HEError(f"baby steps have n1={bs.n1}, matrix needs {matrix.n1}")
        if bs.level != matrix.level:
            raise HEError(f"input at level {bs.level}, matrix encoded for {matrix.level}")
        ev = self._ev
        acc = None
        for g in range(matrix.n2):
            inner = None
            for b in range(matrix.n1):
                pt = matrix.plaintexts.get(g * matrix.n1 + b)
                if pt is None:
                    continue
                t = self._new_ct()
                ev.multiply_plain(bs.rotations[b], pt, t)
                if inner is None:
                    inner = t
                else:
                    ev.add_inplace(inner, t)
            if inner is None:
                continue
            if rescale:
                # rescale before the giant-step rotation: a key switch at level l costs
                # ~(l+1)(l+2) NTTs, so rotating one level lower is cheaper than the extra
                # rescales (measured 3-11% faster products at levels 7, 4 and 2)
                ev.rescale_to_next_inplace(inner)
            if g:
                inner = self._rotate_obj(inner, g * matrix.n1)
            if acc is None:
                acc = inner
            else:
                ev.add_inplace(acc, inner)
        plan = matrix.plan
        half = plan.fold_blocks // 2
        while half >= 1:  # fold the blocks onto block 0 (after the rescale: cheaper)
            rot = self._rotate_obj(acc, half * plan.stride)
            ev.add_inplace(acc, rot)
            half //= 2
        for step in plan.row_folds:  # "wide": add the row groups
            ev.add_inplace(acc, self._rotate_obj(acc, step))
        return self._wrap(acc)

    def replicate(self, ct, length: int, copies: int) -> Ciphertext:
        obj = self._unwrap(ct)
        if length < 1 or copies < 1 or length * copies > self._slots:
            raise HEError(f"{copies} copies of {length} slots do not fit {self._slots} slots")
        powers = [obj]  # powers[i]: 2^i copies in [0, 2^i * length)
        while 1 << len(powers) <= copies:
            prev = powers[-1]
            rot = self._rotate_obj(prev, -length * (1 << (len(powers) - 1)))
            out = self._new_ct()
            self._ev.add(prev, rot, out)
            powers.append(out)
        top = len(powers) - 1
        cur, have = powers[top], 1 << top
        for i in range(top - 1, -1, -1):
            if copies >> i & 1:
                rot = self._rotate_obj(powers[i], -length * have)
                out = self._new_ct()
                self._ev.add(cur, rot, out)
                cur, have = out, have + (1 << i)
        return self._wrap(self._copy(cur) if cur is obj else cur)

    # ------------------------------------------------------------------ integer polynomials
    def _residues(self, coeffs: np.ndarray, lvl: _Level) -> np.ndarray:
        """(primes, N) uint64 residues of an integer polynomial (object or int64 array)."""
        out = np.empty((len(lvl.primes), self._n), dtype=np.uint64)
        if coeffs.dtype == object:
            for i, q in enumerate(lvl.primes):
                out[i] = (coeffs % q).astype(np.uint64)
        else:
            c = coeffs.astype(np.int64)
            for i, q in enumerate(lvl.primes):
                out[i] = np.mod(c, np.int64(q)).astype(np.uint64)
        return out

    def _centered_ints(self, residues: np.ndarray, lvl: _Level) -> np.ndarray:
        """CRT-compose (primes, N) residues into centred Python ints (object array)."""
        q = lvl.q_product
        acc = np.zeros(self._n, dtype=object)
        for i, qi in enumerate(lvl.primes):
            m = q // qi
            coef = m * pow(m, -1, qi)
            acc = acc + residues[i].astype(object) * coef
        acc = acc % q
        half = q // 2
        return np.where(acc > half, acc - q, acc)

    def _load_ct_blob(self, blob: bytes):
        ct = self._new_ct()
        self._io.load(ct, self._ctx, blob)
        return ct

    def _unit(self, level: int, scale: float):
        """NTT-form (0, 1) at ``level``: adding then subtracting it is the identity, and a
        ciphertext plus it is never transparent (SEAL refuses transparent results).
        Cached per (level, scale) and never modified after creation."""
        key = (level, float(scale))
        unit = self._unit_cache.get(key)
        if unit is None:
            lvl = self._levels[level]
            polys = np.zeros((2, len(lvl.primes), self._n), dtype=np.uint64)
            polys[1] = 1  # NTT of the constant polynomial 1
            blob = seal_format.ciphertext_blob(polys, lvl.parms_id, scale, True, self._version)
            unit = self._load_ct_blob(blob)
            if len(self._unit_cache) > 256:
                self._unit_cache.clear()
            self._unit_cache[key] = unit
        return unit

    def _copy(self, obj):
        """A new SEAL ciphertext equal to ``obj`` (the binding has no copy constructor)."""
        unit = self._unit(self._level_of(obj), obj.scale)
        out = self._new_ct()
        self._ev.add(obj, unit, out)
        self._ev.sub_inplace(out, self._unit(self._level_of(obj), obj.scale))
        return out

    def _carrier_from_coeffs(self, residues: np.ndarray, lvl: _Level, scale: float):
        """NTT-form ciphertext (NTT(m), 1) for an integer polynomial m given by residues."""
        polys = np.zeros((2, len(lvl.primes), self._n), dtype=np.uint64)
        polys[0] = residues
        polys[1, :, 0] = 1  # the constant polynomial 1, so the carrier is never transparent
        blob = seal_format.ciphertext_blob(polys, lvl.parms_id, scale, False, self._version)
        c = self._load_ct_blob(blob)
        self._ev.transform_to_ntt_inplace(c)
        return c

    def _add_int_poly(self, obj, coeffs: np.ndarray):
        """New ciphertext = obj + (m, 0) where m is an integer polynomial (exact)."""
        lvl = self._levels[self._level_of(obj)]
        carrier = self._carrier_from_coeffs(self._residues(coeffs, lvl), lvl, obj.scale)
        out = self._new_ct()
        self._ev.add(obj, carrier, out)
        self._ev.sub_inplace(out, self._unit(lvl.index, obj.scale))
        return out

    def _ntt_to_coeff(self, ntt_residues: np.ndarray, lvl: _Level) -> np.ndarray:
        polys = np.zeros((2, len(lvl.primes), self._n), dtype=np.uint64)
        polys[0] = ntt_residues
        polys[1] = 1
        blob = seal_format.ciphertext_blob(polys, lvl.parms_id, 1.0, True, self._version)
        c = self._load_ct_blob(blob)
        self._ev.transform_from_ntt_inplace(c)
        return _read_flat(c, 0, len(lvl.primes) * self._n).reshape(len(lvl.primes), self._n)

    def _plaintext_from_coeffs(self, coeffs: np.ndarray, lvl: _Level, scale: float):
        carrier = self._carrier_from_coeffs(self._residues(coeffs, lvl), lvl, scale)
        ntt = _read_flat(carrier, 0, len(lvl.primes) * self._n)
        pt = sealapi.Plaintext()
        blob = seal_format.plaintext_blob(
            ntt.reshape(len(lvl.primes), self._n), lvl.parms_id, scale, self._version
        )
        self._io.load(pt, self._ctx, blob)
        return pt

    def decrypt_poly(self, ct: Ciphertext) -> np.ndarray:
        """Client: the decrypted plaintext polynomial as centred Python ints (no decoding)."""
        pt = self._decrypt_pt(ct)
        lvl = self._levels[self._level_of(self._unwrap(ct))]
        ntt = _read_flat(pt, 0, len(lvl.primes) * self._n).reshape(len(lvl.primes), self._n)
        return self._centered_ints(self._ntt_to_coeff(ntt, lvl), lvl)

    # ------------------------------------------------------------------ refresh
    def mask_for_refresh(self, ct, rerandomize: bool = True) -> tuple[Ciphertext, RefreshMask]:
        """Server: ``ct + (rho, 0)`` with rho uniform in ``[-2^bits, 2^bits)`` per coefficient,
        ``bits = params.mask_bits(scale)``. The mask hides the plaintext and its noise
        statistically (``<= N 2^-(lambda+1)``), so no flooding is needed; but the ciphertext
        is re-randomized with a fresh public-key encryption of zero (default) so that its
        ``c1`` carries nothing of the computation."""
        if rerandomize:
            ct = self.rerandomize(ct, flood_log2_sigma=float("-inf"))
        obj = self._unwrap(ct)
        level = self._level_of(obj)
        scale = float(obj.scale)
        need = self.params.min_mask_level(scale)
        if level < need:
            raise HEError(f"level {level} cannot carry the refresh mask (needs >= {need})")
        bits = self.params.mask_bits(scale)
        rho = uniform_int_poly(self._n, bits)
        masked = self._add_int_poly(obj, rho)
        return self._wrap(masked), RefreshMask(self.params.id, bits, rho, scale)

    def _refresh_plaintext(self, ct, level: int | None):
        scale = float(self._unwrap(ct).scale)
        coeffs = self.decrypt_poly(ct)
        return self._plaintext_from_coeffs(coeffs, self._lvl(level), scale)

    def refresh_reencrypt(self, ct, level: int | None = None) -> Ciphertext:
        return self._wrap(self._encrypt_pt(self._refresh_plaintext(ct, level)))

    def refresh_reencrypt_to_bytes(self, ct, level: int | None = None) -> bytes:
        """As ``refresh_reencrypt``, serialized in the seeded (half-size) upload form."""
        pt = self._refresh_plaintext(ct, level)
        if self._encryptor_sk is None:
            raise HEError("no secret key")
        return self._pack(self._io.save(self._encryptor_sk.encrypt_symmetric(pt)))

    def unmask_refresh(self, ct, mask: RefreshMask) -> Ciphertext:
        obj = self._unwrap(ct)
        if mask.params_id != self.params.id:
            raise HEError("mask from another parameter set")
        if not math.isclose(float(obj.scale), mask.scale, rel_tol=1e-12):
            raise HEError("re-encrypted ciphertext has another scale than the masked one")
        return self._wrap(self._add_int_poly(obj, -mask.coeffs))

    def rerandomize(self, ct, flood_log2_sigma: float | None = None) -> Ciphertext:
        self._require_eval_keys("pk")
        obj = self._unwrap(ct)
        lvl = self._levels[self._level_of(obj)]
        if obj.size() != 2:
            raise HEError("rerandomize expects a size-2 ciphertext")
        zero = self._new_ct()
        self._encryptor_pk.encrypt_zero(lvl.parms_id, zero)
        zero.scale = float(obj.scale)
        out = self._new_ct()
        self._ev.add(obj, zero, out)
        log_sigma = self.params.flood_log2_sigma if flood_log2_sigma is None else flood_log2_sigma
        if math.isfinite(log_sigma):
            noise = gaussian_int_poly(self._n, 2.0**log_sigma)
            out = self._add_int_poly(out, noise)
        return self._wrap(out)

    # ------------------------------------------------------------------ serialization
    def serialize(self, ct) -> bytes:
        return self._pack(self._io.save(self._unwrap(ct)))

    # Ciphertexts travel bit-packed (``seal_packing``): each residue in its prime's width.
    def _prime_widths(self, parms_id: tuple[int, ...]) -> list[int] | None:
        level = self._level_by_pid.get(parms_id)
        return None if level is None else [q.bit_length() for q in self._levels[level].primes]

    def _pack(self, blob: bytes) -> bytes:
        return seal_packing.pack(blob, self._prime_widths)

    def _max_blob_size(self, size: int) -> int:
        top = self._levels[self.params.top_level]
        raw = 16 + 32 + 1 + 8 * 5 + 16 + 8 + 8 * size * self._n * len(top.primes)
        return raw + raw // 64 + 4096  # compression can expand incompressible data slightly

    def _check_inflated(self, data: bytes, raw_limit: int) -> None:
        """Refuse a (compressed) SEAL object before SEAL inflates it if it could inflate to
        more than twice ``raw_limit`` (the zstd bound counts 128 KiB per compressed block)."""
        limit = 2 * raw_limit + (1 << 18)
        if seal_format.inflated_size_bound(data, limit) > limit:
            raise seal_format.SealFormatError("object would inflate beyond its expected size")

    def _key_raw_size(self) -> int:
        """Uncompressed bytes of one key-switching component: a size-2 ciphertext at the key
        level (all data primes plus the special prime)."""
        return 2 * self._n * len(self.params.coeff_modulus_bits) * 8 + 256

    def deserialize(self, data, *, level=None, size: int = 2, scale=None) -> Ciphertext:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise CiphertextError("ciphertext must be bytes")
        data = bytes(data)
        if not 2 <= size <= _CIPHERTEXT_MAX_SIZE:
            raise CiphertextError(f"unsupported expected size {size}")
        if len(data) > self._max_blob_size(size):
            raise CiphertextError("ciphertext too large for this parameter set")
        try:
            if seal_packing.is_packed(data):
                data = seal_packing.unpack(data, self._prime_widths, self._version, self._n)
            seal_format.parse_header(data)
            self._check_inflated(data, self._max_blob_size(size))
        except seal_format.SealFormatError as e:
            raise CiphertextError(f"not a ciphertext: {e}") from e
        obj = self._new_ct()
        try:
            self._io.load(obj, self._ctx, data)
        except Exception as e:  # SEAL: RuntimeError / ValueError for bad or foreign data
            raise CiphertextError(f"invalid ciphertext for {self.params.id}: {e}") from e
        pid = tuple(obj.parms_id())
        if pid not in self._level_by_pid or not sealapi.is_valid_for(obj, self._ctx):
            raise CiphertextError(f"ciphertext not valid for {self.params.id}")
        if not obj.is_ntt_form():
            raise CiphertextError("CKKS ciphertext must be in NTT form")
        got_level = self._level_by_pid[pid]
        if level is not None and got_level != level:
            raise CiphertextError(f"ciphertext at level {got_level}, expected {level}")
        if obj.size() != size:
            raise CiphertextError(f"ciphertext has size {obj.size()}, expected {size}")
        s = float(obj.scale)
        lvl = self._levels[got_level]
        if not (math.isfinite(s) and 1.0 <= s < float(lvl.q_product)):
            raise CiphertextError(f"ciphertext scale {s} out of range")
        if scale is not None and not math.isclose(s, scale, rel_tol=1e-9):
            raise CiphertextError(f"ciphertext scale {s}, expected {scale}")
        return self._wrap(obj)

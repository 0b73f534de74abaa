"""SEAL plumbing shared by the backend: the context and modulus chain, path-based (de)serialization,
and exact integer polynomials inside SEAL objects.

``tenseal.sealapi`` binds ``save``/``load`` only to file paths, so (de)serialization goes through
files in a private temporary directory (``/dev/shm`` when it exists). Only public objects are
ever written there: ciphertexts, public/relin/Galois keys and plaintexts of masked or public
data -- never the secret key.

Exact integer polynomials (refresh mask, flooding noise, the client's decrypted ``x + rho``):
SEAL objects are built from numpy residues through SEAL's own stream format
(``veil.crypto.seal.format``) and converted between coefficient and NTT form by SEAL's
``transform_to_ntt`` / ``transform_from_ntt`` on a "carrier" ciphertext ``(m, 1)``, whose
constant second polynomial keeps it from being transparent; the carrier's ``1`` is cancelled
by subtracting the NTT-form ``(0, 1)``. Reading goes through the bound ``obj[i]``. The
integers themselves are Python ints (CRT composition and reduction in object arrays).
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import tempfile
import weakref

import numpy as np
import tenseal.sealapi as sealapi

from veil.crypto.backend import HEError
from veil.crypto.params import CkksParams
from veil.crypto.rounding import crt
from veil.crypto.seal import format as seal_format
from veil.crypto.seal import packing as seal_packing

__all__ = ["SealContext", "Level", "galois_element", "read_flat"]


def galois_element(step: int, poly_modulus_degree: int) -> int:
    """SEAL's Galois element of a slot rotation by ``step`` (left for positive steps)."""
    n = poly_modulus_degree
    half = n // 2
    if step == 0 or abs(step) >= half:
        raise ValueError(f"rotation step {step} out of range for N={n}")
    return pow(3, step % half, 2 * n)


class FileIO:
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


class Level:
    __slots__ = ("index", "parms_id", "primes", "q_product")

    def __init__(self, index: int, parms_id: list[int], primes: list[int]) -> None:
        self.index = index
        self.parms_id = parms_id
        self.primes = primes
        self.q_product = math.prod(primes)


def read_flat(obj, start: int, count: int) -> np.ndarray:
    """Read ``count`` u64 words of a SEAL Ciphertext/Plaintext through ``obj[i]``."""
    getter = obj.__getitem__
    return np.fromiter(map(getter, range(start, start + count)), dtype=np.uint64, count=count)


class SealContext:
    """One parameter set's SEAL context, encoder, evaluator and modulus chain."""

    def __init__(self, params: CkksParams) -> None:
        n = params.poly_modulus_degree
        parms = sealapi.EncryptionParameters(sealapi.SCHEME_TYPE.CKKS)
        parms.set_poly_modulus_degree(n)
        parms.set_coeff_modulus([sealapi.Modulus(q) for q in params.primes])
        sec = sealapi.SEC_LEVEL_TYPE.TC128 if params.security_level == 128 else sealapi.SEC_LEVEL_TYPE.NONE
        self.ctx = sealapi.SEALContext(parms, True, sec)
        if not self.ctx.parameters_set():
            raise HEError(f"SEAL refused {params.id}: {self.ctx.parameters_error_message()}")
        self.params = params
        self.encoder = sealapi.CKKSEncoder(self.ctx)
        self.ev = sealapi.Evaluator(self.ctx)
        self.io = FileIO()
        self.n = n
        self.slots = self.encoder.slot_count()
        self.levels: dict[int, Level] = {}
        self.level_by_pid: dict[tuple[int, ...], int] = {}
        cd = self.ctx.first_context_data()
        while cd is not None:
            idx, pid = cd.chain_index(), list(cd.parms_id())
            self.levels[idx] = Level(idx, pid, [m.value() for m in cd.parms().coeff_modulus()])
            self.level_by_pid[tuple(pid)] = idx
            cd = cd.next_context_data()
        if max(self.levels) != params.top_level or self.levels[params.top_level].primes != list(params.primes[:-1]):
            raise HEError("SEAL modulus chain does not match the parameter set")
        self.key_parms_id = tuple(self.ctx.key_parms_id())
        header = seal_format.parse_header(self.io.save(sealapi.Modulus(3)))
        self.version = header.version_major, header.version_minor
        self._unit_cache: dict[tuple[int, float], object] = {}

    def lvl(self, level: int | None) -> Level:
        if level is None:
            level = self.params.top_level
        if level not in self.levels:
            raise HEError(f"level {level} outside [0, {self.params.top_level}]")
        return self.levels[level]

    def level_of(self, obj) -> int:
        return self.level_by_pid[tuple(obj.parms_id())]

    def new_ct(self):
        return sealapi.Ciphertext(self.ctx)

    def encode(self, values, level: Level, scale: float):
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size > self.slots:
            raise HEError(f"{v.size} values exceed {self.slots} slots")
        if not np.all(np.isfinite(v)):
            raise HEError("values must be finite")
        pt = sealapi.Plaintext()
        self.encoder.encode(v.tolist(), level.parms_id, float(scale), pt)
        return pt

    # ---- sizes and the packed wire form ------------------------------------------------------
    def prime_widths(self, parms_id: tuple[int, ...]) -> list[int] | None:
        """Bit widths of a level's primes: ciphertexts travel bit-packed (``seal.packing``)."""
        level = self.level_by_pid.get(parms_id)
        return None if level is None else [q.bit_length() for q in self.levels[level].primes]

    def pack(self, blob: bytes) -> bytes:
        return seal_packing.pack(blob, self.prime_widths)

    def key_prime_widths(self, parms_id: tuple[int, ...]) -> list[int] | None:
        """Bit widths of the key level's primes (data primes and the special prime): keys
        travel bit-packed too. Only key material is read at this level."""
        return [q.bit_length() for q in self.params.primes] if parms_id == self.key_parms_id else None

    def max_blob_size(self, size: int) -> int:
        raw = 16 + 32 + 1 + 8 * 5 + 16 + 8 + 8 * size * self.n * len(self.levels[self.params.top_level].primes)
        return raw + raw // 64 + 4096  # compression can expand incompressible data slightly

    def check_inflated(self, data: bytes, raw_limit: int) -> None:
        """Refuse a (compressed) SEAL object before SEAL inflates it if it could inflate to
        more than twice ``raw_limit`` (the zstd bound counts 128 KiB per compressed block)."""
        limit = 2 * raw_limit + (1 << 18)
        if seal_format.inflated_size_bound(data, limit) > limit:
            raise seal_format.SealFormatError("object would inflate beyond its expected size")

    def key_raw_size(self) -> int:
        """Uncompressed bytes of one key-switching component: a size-2 ciphertext at the key
        level (all data primes plus the special prime)."""
        return 2 * self.n * len(self.params.primes) * 8 + 256

    # ---- exact integer polynomials ---------------------------------------------------------
    def residues(self, coeffs: np.ndarray, lvl: Level) -> np.ndarray:
        """(primes, N) uint64 residues of an integer polynomial (object or int64 array)."""
        out = np.empty((len(lvl.primes), self.n), dtype=np.uint64)
        if coeffs.dtype == object:
            for i, q in enumerate(lvl.primes):
                out[i] = (coeffs % q).astype(np.uint64)
        else:
            c = coeffs.astype(np.int64)
            for i, q in enumerate(lvl.primes):
                out[i] = np.mod(c, np.int64(q)).astype(np.uint64)
        return out

    def centered_ints(self, residues: np.ndarray, lvl: Level) -> np.ndarray:
        """CRT-compose (primes, N) residues into centred Python ints (object array)."""
        return crt(residues, lvl.primes, centered=True)

    def load_ct_blob(self, blob: bytes):
        ct = self.new_ct()
        self.io.load(ct, self.ctx, blob)
        return ct

    def unit(self, level: int, scale: float):
        """NTT-form (0, 1) at ``level``: adding then subtracting it is the identity, and a
        ciphertext plus it is never transparent (SEAL refuses transparent results).
        Cached per (level, scale) and never modified after creation."""
        key = (level, float(scale))
        unit = self._unit_cache.get(key)
        if unit is None:
            lvl = self.levels[level]
            polys = np.zeros((2, len(lvl.primes), self.n), dtype=np.uint64)
            polys[1] = 1  # NTT of the constant polynomial 1
            blob = seal_format.ciphertext_blob(polys, lvl.parms_id, scale, True, self.version)
            unit = self.load_ct_blob(blob)
            if len(self._unit_cache) > 256:
                self._unit_cache.clear()
            self._unit_cache[key] = unit
        return unit

    def copy(self, obj):
        """A new SEAL ciphertext equal to ``obj`` (the binding has no copy constructor)."""
        unit = self.unit(self.level_of(obj), obj.scale)
        out = self.new_ct()
        self.ev.add(obj, unit, out)
        self.ev.sub_inplace(out, self.unit(self.level_of(obj), obj.scale))
        return out

    def carrier_from_coeffs(self, residues: np.ndarray, lvl: Level, scale: float):
        """NTT-form ciphertext (NTT(m), 1) for an integer polynomial m given by residues."""
        polys = np.zeros((2, len(lvl.primes), self.n), dtype=np.uint64)
        polys[0] = residues
        polys[1, :, 0] = 1  # the constant polynomial 1, so the carrier is never transparent
        blob = seal_format.ciphertext_blob(polys, lvl.parms_id, scale, False, self.version)
        c = self.load_ct_blob(blob)
        self.ev.transform_to_ntt_inplace(c)
        return c

    def add_int_poly(self, obj, coeffs: np.ndarray):
        """New ciphertext = obj + (m, 0) where m is an integer polynomial (exact)."""
        lvl = self.levels[self.level_of(obj)]
        carrier = self.carrier_from_coeffs(self.residues(coeffs, lvl), lvl, obj.scale)
        out = self.new_ct()
        self.ev.add(obj, carrier, out)
        self.ev.sub_inplace(out, self.unit(lvl.index, obj.scale))
        return out

    def ntt_to_coeff(self, ntt_residues: np.ndarray, lvl: Level) -> np.ndarray:
        polys = np.zeros((2, len(lvl.primes), self.n), dtype=np.uint64)
        polys[0] = ntt_residues
        polys[1] = 1
        blob = seal_format.ciphertext_blob(polys, lvl.parms_id, 1.0, True, self.version)
        c = self.load_ct_blob(blob)
        self.ev.transform_from_ntt_inplace(c)
        return read_flat(c, 0, len(lvl.primes) * self.n).reshape(len(lvl.primes), self.n)

    def coeff_residues(self, obj) -> np.ndarray:
        """(size, primes, N) residues of a ciphertext in coefficient form (``obj`` unchanged)."""
        c = self.new_ct()
        self.ev.transform_from_ntt(obj, c)
        return seal_packing.residues(self.io.save(c))

    def plaintext_from_coeffs(self, coeffs: np.ndarray, lvl: Level, scale: float):
        carrier = self.carrier_from_coeffs(self.residues(coeffs, lvl), lvl, scale)
        ntt = read_flat(carrier, 0, len(lvl.primes) * self.n)
        pt = sealapi.Plaintext()
        blob = seal_format.plaintext_blob(
            ntt.reshape(len(lvl.primes), self.n), lvl.parms_id, scale, self.version
        )
        self.io.load(pt, self.ctx, blob)
        return pt

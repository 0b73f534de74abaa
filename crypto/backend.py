"""The HE layer's interface: what the protected protocol asks of a CKKS backend, and no more.

A backend instance is bound to one parameter set (``veil.crypto.params``: the primes are pinned
there, so every backend builds the same modulus chain). The client creates one, calls
``generate_keys`` and exports the public material; the server creates one for the same set and
imports it. The secret key lives only inside the client's backend object: no export carries
it and no method returns it.

Linear algebra (diagonal products, replication, slot sums) is not part of a backend: it is
written once over this interface in ``veil.crypto.linear``. A backend may make the one entry
point that batches naturally faster: ``rotate_many`` (one ciphertext, many steps) is where a
backend hoists the key-switching decomposition.

Backends by name (``make_backend``): ``seal`` (Microsoft SEAL, production), ``native`` (RNS-CKKS
on torch tensors, any device; ``device=`` option) and ``plain`` (slot vectors with level and
scale bookkeeping, a test double for protocol logic that production selection refuses).
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from veil.crypto import ring_switch
from veil.crypto.params import CkksParams

if TYPE_CHECKING:
    from veil.crypto.row_batch import RowBatch

__all__ = [
    "HEError",
    "CiphertextError",
    "KeyMaterialError",
    "BackendError",
    "Ciphertext",
    "Plaintext",
    "ValueBounds",
    "RefreshMask",
    "PublicMaterial",
    "HEBackend",
    "make_backend",
    "backend_names",
]


class HEError(RuntimeError):
    """An HE operation that cannot be carried out (wrong level, missing key, ...)."""


class CiphertextError(ValueError):
    """A serialized ciphertext that is malformed or does not match what was expected."""


class KeyMaterialError(ValueError):
    """Public key material that is malformed, for another parameter set, or missing a key."""


class BackendError(ValueError):
    """An unknown backend name, or a test-only backend asked for by production code."""


class Ciphertext:
    """Opaque handle of one ciphertext of a backend."""

    __slots__ = ("_obj", "params_id")

    def __init__(self, obj: object, params_id: str) -> None:
        self._obj = obj
        self.params_id = params_id

    def __repr__(self) -> str:
        return f"Ciphertext(params={self.params_id!r})"


class Plaintext:
    """Opaque handle of one encoded plaintext: a slot vector at a level and scale (immutable:
    ``nonzero`` caches a backend's check that it is not all zero, None until checked; a batch's
    stacked plaintext also keeps its rows' checks in ``row_nonzero``, for the rows it gives back)."""

    __slots__ = ("_obj", "params_id", "level", "scale", "nbytes", "nonzero", "row_nonzero")

    def __init__(self, obj: object, params_id: str, level: int, scale: float, nbytes: int) -> None:
        self._obj = obj
        self.params_id = params_id
        self.level = level
        self.scale = scale
        self.nbytes = nbytes
        self.nonzero: bool | None = None
        self.row_nonzero: tuple[bool, ...] | None = None

    def __repr__(self) -> str:
        return f"Plaintext(params={self.params_id!r}, level={self.level}, scale=2^{np.log2(self.scale):.1f})"


@dataclass(frozen=True)
class ValueBounds:
    """What the caller of ``encode_many`` vouches for about values the backend would otherwise
    read back to check (values on a GPU: each read waits for every queued kernel): every
    ``|value|`` is at most ``peak``, and vector ``i``'s sum of squares is at least ``sumsq[i]``.
    Where they settle an encoding's range check and its all-zero check, the native backend takes
    them instead of reading (``Encoder.encode_rows``); where they do not, it reads as before. The
    shuffled FFN's matrices carry them: a permutation keeps a matrix's entries
    (``linear.EntryBounds``)."""

    peak: float
    sumsq: np.ndarray = field(repr=False)  # [vectors], float64


@dataclass
class RefreshMask:
    """Server-side secret of one masked refresh: what was added, to be subtracted later."""

    params_id: str
    bits: int
    coeffs: np.ndarray = field(repr=False)
    scale: float = 0.0


@dataclass(frozen=True)
class PublicMaterial:
    """Everything the server needs to evaluate, and no secret key: each field is the backend's
    serialized object; ``rotation_steps`` lists the steps ``galois_keys`` holds keys for and
    ``rotation_levels`` (same order; empty: all at the top) the highest level each key serves;
    ``relin_level`` the highest level of a ct x ct product (None: the top)."""

    params_id: str
    public_key: bytes
    relin_keys: bytes
    galois_keys: bytes
    rotation_steps: tuple[int, ...]
    rotation_levels: tuple[int, ...] = ()
    #: the highest level the relinearization key serves (None: all)
    relin_level: int | None = None
    #: the key that folds level-0 downloads into the ring of N/2 (``crypto/ring_switch.py``;
    #: empty: none, the downloads stay whole)
    fold_key: bytes = b""

    def key_levels(self, top_level: int) -> dict[int, int]:
        """``{step: highest level its key serves}``."""
        levels = self.rotation_levels or (top_level,) * len(self.rotation_steps)
        return {int(s): int(lv) for s, lv in zip(self.rotation_steps, levels, strict=True)}

    @property
    def nbytes(self) -> int:
        return len(self.public_key) + len(self.relin_keys) + len(self.galois_keys) + len(self.fold_key)


class HEBackend(abc.ABC):
    """CKKS backend bound to one parameter set. Levels run from ``params.top_level`` (fresh
    ciphertexts) down to 0; a rescale at level ``l`` divides by ``prime(l)``."""

    name: str
    params: CkksParams
    #: ``batched(rows)`` evaluates several sessions' ciphertexts as one (a ``RowBatch``)
    supports_batch = False
    #: ``rotate_many`` shares one key-switching decomposition between its rotations, so that
    #: a product's baby steps cost less from their own keys than chained from one
    #: (``linear.baby_steps``); a server on such a backend prefers the client's full key set
    hoists_rotations = False

    @property
    def batch_pays(self) -> bool:
        """Whether several ciphertexts of one session (a span's positions) go faster as the rows
        of one ``batched`` evaluation than one after another: where one ciphertext leaves the
        device mostly idle (a GPU), not where it already keeps every core busy (a CPU)."""
        return False

    @classmethod
    def batched(cls, rows: Sequence[HEBackend]) -> RowBatch:
        """A backend over the sessions ``rows`` (their imported public material): its ciphertexts
        hold one row per session and every operation runs on all rows, row b under row b's keys."""
        raise HEError(f"the {cls.name} backend evaluates one session at a time")

    def resident_bytes(self) -> int | None:
        """Memory the imported public material holds here (None: not known to this backend)."""
        return None

    # ---- keys --------------------------------------------------------------------------------
    @abc.abstractmethod
    def generate_keys(self, rotation_steps: Sequence[int] | Mapping[int, int] = (),
                      relin_level: int | None = None) -> None:
        """Client: secret key, public key, relinearization key and Galois keys for
        ``rotation_steps`` (positive = rotate left, negative = right). A mapping gives each
        step the highest level its key must serve: a backend may then send a smaller key, and
        refuses rotations above that level. ``relin_level`` does the same for the
        relinearization key (None: every level)."""

    @property
    @abc.abstractmethod
    def has_secret_key(self) -> bool: ...

    #: step -> the highest level its Galois key serves; set by ``generate_keys`` (``_set_steps``)
    #: and ``import_public_material``
    _key_levels: dict[int, int] = {}

    def _set_steps(self, rotation_steps: Sequence[int] | Mapping[int, int]) -> tuple[int, ...]:
        """Record the steps (and levels) of ``generate_keys``; returns the sorted steps."""
        top = self.params.top_level
        levels = dict(rotation_steps) if isinstance(rotation_steps, Mapping) else dict.fromkeys(rotation_steps, top)
        levels = {int(s): int(lv) for s, lv in levels.items()}
        if not all(0 <= lv <= top for lv in levels.values()):
            raise HEError(f"key levels must lie in [0, {top}]")
        self._key_levels = levels
        return self.rotation_steps

    #: the highest level the relinearization key serves (``_set_relin_level``; None: the top)
    _relin_level: int | None = None

    def _set_relin_level(self, level: int | None) -> None:
        top = self.params.top_level
        level = top if level is None else int(level)
        if not 0 <= level <= top:
            raise HEError(f"the relinearization key level must lie in [0, {top}]")
        self._relin_level = level

    @property
    def relin_level(self) -> int:
        """The highest level a ct x ct product is relinearized at."""
        return self.params.top_level if self._relin_level is None else self._relin_level

    def _check_relin(self, level: int) -> None:
        """Refuse a relinearization above the key's level: it lacks those residues."""
        if level > self.relin_level:
            raise HEError(f"the relinearization key serves levels <= {self.relin_level}, not {level}")

    def _key_step(self, step: int, level: int) -> int:
        """The Galois key of a left rotation by ``step`` (non-zero mod the slots) at ``level``,
        by the name it was generated under (left or right); refuses a step without a key and a
        level above what the key serves (a key made for lower levels lacks the residues)."""
        signed, key_level = self._held_key(step)
        if key_level is None:
            raise HEError(f"no Galois key for rotation step {int(step) % self.params.slot_count}")
        if level > key_level:
            raise HEError(f"the key of rotation step {signed} serves levels <= {key_level}, not {level}")
        return signed

    def _held_key(self, step: int) -> tuple[int, int | None]:
        """(the name a rotation by ``step`` has its key under, left or right; the highest level
        that key serves, None without one)."""
        slots = self.params.slot_count
        s = int(step) % slots
        signed = s if s in self._key_levels else s - slots
        return signed, self._key_levels.get(signed)

    def can_rotate(self, step: int, level: int) -> bool:
        """Whether one key switch rotates by ``step`` at ``level`` (step 0 always)."""
        if int(step) % self.params.slot_count == 0:
            return True
        key_level = self._held_key(step)[1]
        return key_level is not None and key_level >= level

    @property
    def rotation_steps(self) -> tuple[int, ...]:
        """Steps this backend holds Galois keys for."""
        return tuple(sorted(self._key_levels))

    @abc.abstractmethod
    def export_public_material(self) -> PublicMaterial:
        """Client: the public, relinearization and Galois keys (never the secret key)."""

    @abc.abstractmethod
    def import_public_material(self, material: PublicMaterial) -> None:
        """Server: load and validate public material; raises ``KeyMaterialError``."""

    # ---- client: encrypt, decrypt, re-encrypt ------------------------------------------------
    @abc.abstractmethod
    def encrypt_to_bytes(self, values: np.ndarray, level: int | None = None, scale: float | None = None) -> bytes:
        """Encrypt a real vector (zero-padded to the slot count) at ``level`` (default top) and
        serialize it in the upload form: seeded (half size) where the backend has one."""

    @abc.abstractmethod
    def decrypt(self, ct: Ciphertext, length: int | None = None) -> np.ndarray:
        """Client: decrypt and decode the first ``length`` slots (default all) as float64."""

    @abc.abstractmethod
    def refresh_reencrypt_to_bytes(self, ct: Ciphertext, level: int | None = None) -> bytes:
        """Client: decrypt a masked ciphertext's plaintext polynomial exactly (as integers,
        never decoded) and encrypt the same polynomial at ``level`` (default top) and the same
        scale, in the upload form."""

    def encrypt(self, values: np.ndarray, level: int | None = None, scale: float | None = None) -> Ciphertext:
        return self.deserialize(self.encrypt_to_bytes(values, level, scale))

    def refresh_reencrypt(self, ct: Ciphertext, level: int | None = None) -> Ciphertext:
        return self.deserialize(self.refresh_reencrypt_to_bytes(ct, level))

    # ---- encoding and metadata ---------------------------------------------------------------
    @abc.abstractmethod
    def encode(self, values: np.ndarray, level: int | None = None, scale: float | None = None) -> Plaintext:
        """Encode a real vector at ``level`` (default top) and ``scale`` (default Δ)."""

    def encode_many(self, values: Sequence[np.ndarray], level: int | None = None,
                    scale: float | None = None, bounds: ValueBounds | None = None) -> list[Plaintext]:
        """Encode several vectors at one level and scale (a matrix's diagonals): a sequence of
        vectors, or a 2-D array of them (or of ``encodable``'s kind); a backend may batch them
        (the native one runs one FFT and one NTT per chunk of vectors). ``bounds``: what the
        caller knows of the values (``ValueBounds``); a backend that reads nothing back ignores
        them."""
        return [self.encode(v, level, scale) for v in values]

    def encodable(self, a: np.ndarray):
        """``a`` in the form ``encode_many`` takes fastest, for values kept to be re-encoded
        often (the native backend: a float64 tensor on its device); host backends: ``a``."""
        return a

    @abc.abstractmethod
    def level(self, ct: Ciphertext) -> int: ...

    @abc.abstractmethod
    def scale(self, ct: Ciphertext) -> float: ...

    @abc.abstractmethod
    def nbytes(self, ct: Ciphertext) -> int:
        """Memory the ciphertext holds on the server (what the KV limits count)."""

    def prime(self, level: int) -> int:
        """The prime a rescale at ``level`` divides by."""
        return self.params.prime(level)

    # ---- arithmetic --------------------------------------------------------------------------
    @abc.abstractmethod
    def add(self, a: Ciphertext, b: Ciphertext) -> Ciphertext:
        """Same level and scale; a three-polynomial operand gives a three-polynomial sum."""

    @abc.abstractmethod
    def multiply_plain(self, ct: Ciphertext, pt: Plaintext, rescale: bool = True) -> Ciphertext:
        """Slot-wise product with a plaintext encoded at the ciphertext's level (its scale
        multiplies in), then by default rescaled one level."""

    def dot_plain(self, cts: Sequence[Ciphertext], pts: Sequence[Plaintext]) -> Ciphertext:
        """Σ_i cts[i] ⊙ pts[i], not rescaled: the inner sum of a diagonal product's giant step.
        A backend fuses it (accumulate in place, or one batched kernel over the diagonals)."""
        acc = None
        for ct, pt in zip(cts, pts, strict=True):
            prod = self.multiply_plain(ct, pt, rescale=False)
            acc = prod if acc is None else self.add(acc, prod)
        if acc is None:
            raise HEError("an empty sum of products")
        return acc

    def dot_plain_many(self, cts: Sequence[Ciphertext],
                       rows: Sequence[Sequence[Plaintext | None]]) -> list[Ciphertext]:
        """``[dot_plain(cts, row) for row in rows]`` over the same ciphertexts, a row's None
        terms left out: every giant step's inner sum of a diagonal product at once. A backend
        that reads each ciphertext once for all rows overrides this."""
        out = []
        for row in rows:
            if len(row) != len(cts):
                raise HEError(f"a row of {len(row)} plaintexts for {len(cts)} ciphertexts")
            terms = [(ct, pt) for ct, pt in zip(cts, row, strict=True) if pt is not None]
            if not terms:
                raise HEError("an empty sum of products")
            out.append(self.dot_plain([ct for ct, _ in terms], [pt for _, pt in terms]))
        return out

    @abc.abstractmethod
    def multiply(self, a: Ciphertext, b: Ciphertext, rescale: bool = True, relinearize: bool = True) -> Ciphertext:
        """ct x ct. ``relinearize=False`` keeps the three-polynomial product, so that a sum of
        products needs one key switch (``relinearize``) instead of one per product."""

    @abc.abstractmethod
    def relinearize(self, ct: Ciphertext) -> Ciphertext: ...

    @abc.abstractmethod
    def rescale(self, ct: Ciphertext) -> Ciphertext:
        """Divide by ``prime(level)`` and drop it (level - 1, scale / prime)."""

    @abc.abstractmethod
    def mod_switch_to(self, ct: Ciphertext, level: int) -> Ciphertext:
        """Drop primes down to ``level`` without changing the scale."""

    @abc.abstractmethod
    def rotate(self, ct: Ciphertext, step: int) -> Ciphertext:
        """Cyclic left rotation of the slots by ``step`` (needs its Galois key; 0 copies)."""

    def rotate_many(self, ct: Ciphertext, steps: Sequence[int]) -> list[Ciphertext]:
        """``[rotate(ct, s) for s in steps]``; a backend that can share one key-switching
        decomposition between the rotations of one ciphertext (hoisting) overrides this."""
        return [self.rotate(ct, s) for s in steps]

    def run_product(self, matrix, fn: Callable[[Ciphertext], Ciphertext], x: Ciphertext) -> Ciphertext:
        """``fn(x)``: a whole product over ``matrix``'s plaintexts (``linear.matvec``), which a
        backend may run as one unit (the native backend on CUDA: one graph)."""
        return fn(x)

    # ---- server: refresh and circuit privacy -------------------------------------------------
    @abc.abstractmethod
    def mask_for_refresh(self, ct: Ciphertext, fold: bool = False) -> tuple[Ciphertext, RefreshMask]:
        """Server: add a fresh uniform integer mask polynomial (``params.mask_bits`` bits, from
        the OS CSPRNG) to the plaintext of ``ct`` and re-randomize it: the result may leave.
        ``fold``: it leaves folded (``serialize_folded_refresh``, which re-randomizes in the ring
        of N/2 and drops the odd coefficients): the mask is a polynomial in X² and the big
        ring's re-randomization, whose noise would only add to h'', is left out."""

    @abc.abstractmethod
    def unmask_refresh(self, ct: Ciphertext, mask: RefreshMask) -> Ciphertext:
        """Server: subtract the mask from the client's re-encryption (at its new level)."""

    @abc.abstractmethod
    def rerandomize(self, ct: Ciphertext, flood_log2_sigma: float | None = None) -> Ciphertext:
        """Server: add a fresh public-key encryption of zero and Gaussian flooding noise of
        standard deviation ``2^flood_log2_sigma`` coefficient units (default from params;
        ``-inf`` for none)."""

    # ---- serialization -----------------------------------------------------------------------
    @abc.abstractmethod
    def serialize(self, ct: Ciphertext, noise_log2: float | None = None) -> bytes:
        """The wire form. ``noise_log2``: the ciphertext already carries noise of std
        ``2^noise_log2`` coefficient units (a flooded download), so its coefficients are sent
        rounded to the bits above that floor (``veil.crypto.rounding``); ``deserialize``
        accepts both forms."""

    @abc.abstractmethod
    def deserialize(self, data: bytes, *, level: int | None = None, size: int = 2,
                    scale: float | None = None) -> Ciphertext:
        """Load and validate (parameter set, level, size, scale, well-formedness); anything off
        raises ``CiphertextError`` and nothing of the input is trusted before that."""

    # ---- folded downloads (``veil.crypto.ring_switch``) --------------------------------------
    #: client: the small ring's secret (``_new_fold_key``); server: the client's fold key
    _fold_secret: ring_switch.FoldSecret | None = None
    _fold_key: ring_switch.FoldKey | None = None
    _fold_key_bytes: bytes = b""

    def _new_fold_key(self) -> None:
        """Client (end of ``generate_keys``): a fresh secret of the ring of N/2 and the key that
        switches ciphertexts at levels 0..``ring_switch.TOP_LEVEL`` to it, exported as
        ``PublicMaterial.fold_key``."""
        self._fold_secret, self._fold_key_bytes = ring_switch.make_key(self.params, self._secret_coefficients())

    def _import_fold_key(self, data: bytes) -> None:
        """Server: the client's fold key (empty: none), on the device the backend computes on.
        Raises ``ring_switch.FoldError``."""
        self._fold_key = ring_switch.load_key(self.params, data, self._fold_device) if data else None

    #: where the server's folds run (the native backend: its device)
    _fold_device = "cpu"

    @property
    def can_fold(self) -> bool:
        """Server: whether ``serialize_folded`` can run (the client sent a fold key)."""
        return self._fold_key is not None

    def _fold(self, ct: Ciphertext, noise_log2: float | None, round_log2: float | None = None) -> bytes:
        if self._fold_key is None:
            raise HEError("no fold key: the client's public material holds none")
        if self.level(ct) > ring_switch.TOP_LEVEL:
            ct = self.mod_switch_to(ct, ring_switch.TOP_LEVEL)
        return ring_switch.fold(self.params, self._fold_key, self._fold_coefficients(ct), self.level(ct),
                                self.scale(ct), noise_log2, round_log2)

    def serialize_folded(self, ct: Ciphertext, noise_log2: float) -> bytes:
        """Server: a download (at level ``ring_switch.TOP_LEVEL`` or below, switched there
        otherwise) folded into the ring of N/2 (slot j holds slots j and j + S/2 summed),
        re-randomized and flooded there with the noise per slot a download flooded at
        ``2^noise_log2`` coefficient units holds, rounded: ready to leave."""
        return self._fold(ct, noise_log2)

    def serialize_folded_refresh(self, ct: Ciphertext, round_log2: float) -> bytes:
        """Server: a masked refresh (``mask_for_refresh(fold=True)``: a polynomial in X²) folded
        into the ring of N/2 as the polynomial itself (slot j holds the mean of slots j and
        j + S/2, which are equal), re-randomized there, not flooded (the mask hides it), rounded
        above ``2^round_log2`` coefficient units: ready to leave."""
        return self._fold(ct, None, round_log2)

    def is_folded(self, data: bytes) -> bool:
        """Client: whether a download's bytes are a folded one (``decrypt_folded``)."""
        return ring_switch.is_folded(data)

    def _fold_secret_or_raise(self) -> ring_switch.FoldSecret:
        if self._fold_secret is None:
            raise HEError("no fold secret: this backend made no keys")
        return self._fold_secret

    def decrypt_folded(self, data: bytes) -> tuple[np.ndarray, float]:
        """Client: a folded download's S/2 slots and its scale; ``CiphertextError`` if malformed."""
        try:
            return ring_switch.decrypt(self.params, self._fold_secret_or_raise(), data)
        except ring_switch.FoldError as e:
            raise CiphertextError(str(e)) from None

    def refresh_reencrypt_folded_to_bytes(self, data: bytes, level: int | None = None) -> bytes:
        """Client: a folded masked refresh -> its polynomial g(Y), exactly, re-encrypted as g(X²)
        at ``level`` (default top) and the same scale, in the upload form (the counterpart of
        ``refresh_reencrypt_to_bytes``); ``CiphertextError`` if malformed."""
        try:
            g, from_level, scale = ring_switch.decrypt_residues(self.params, self._fold_secret_or_raise(), data)
        except ring_switch.FoldError as e:
            raise CiphertextError(str(e)) from None
        residues = np.zeros((g.shape[0], self.params.poly_modulus_degree), dtype=np.int64)
        residues[:, 0::2] = g
        return self._encrypt_residues_to_bytes(residues, from_level, level, scale)

    # ---- the client's key file (``veil.client.key_file``) -----------------------------------
    def export_secret(self) -> tuple[bytes, bytes]:
        """Client: (the secret key in this backend's own form, the fold secret), for the client's
        key file only: neither ever goes on the wire. ``import_secret`` takes them back."""
        if not self.has_secret_key:
            raise HEError("no secret key")
        return self._secret_bytes(), ring_switch.secret_to_bytes(self.params, self._fold_secret_or_raise())

    def import_secret(self, secret: bytes, fold: bytes) -> None:
        """Client: a key pair ``export_secret`` made, to encrypt and decrypt with again. The
        backend derives a fresh public key from it and holds no evaluation keys (the server has
        them from the first upload). ``KeyMaterialError`` where the bytes are not a secret of
        this backend and parameter set."""
        try:
            fold_secret = ring_switch.secret_from_bytes(self.params, fold)
        except ring_switch.FoldError as e:
            raise KeyMaterialError(f"fold secret: {e}") from None
        self._load_secret(secret)
        self._fold_secret = fold_secret

    def _secret_bytes(self) -> bytes:
        raise HEError(f"the {self.name} backend keeps no key file")

    def _load_secret(self, data: bytes) -> None:
        """Set the secret key (and a public key derived from it); ``KeyMaterialError``, nothing
        changed, unless ``data`` holds N ternary coefficients of this parameter set."""
        raise HEError(f"the {self.name} backend keeps no key file")

    def _secret_coefficients(self) -> np.ndarray:
        """Client: the secret key's N ternary coefficients (int64), for the fold key and the key
        file's check."""
        raise HEError(f"the {self.name} backend cannot make a fold key")

    def _fold_coefficients(self, ct: Ciphertext) -> np.ndarray:
        """Server: a size-2 ciphertext's coefficient residues ``[2, level + 1, N]`` (numpy, or a
        tensor on the device the fold runs on, ``_fold_device``)."""
        raise HEError(f"the {self.name} backend cannot fold")

    def _encrypt_residues_to_bytes(self, residues: np.ndarray, from_level: int, level: int | None,
                                   scale: float) -> bytes:
        """Client: the integer polynomial with these coefficient residues ``[from_level + 1, N]``
        (centred mod the level's modulus) encrypted at ``level`` (default top), ``scale``, in the
        upload form."""
        raise HEError(f"the {self.name} backend cannot re-encrypt a folded refresh")


#: name -> (module, class, production?). Modules are imported on first use: SEAL's bindings
#: load only where the SEAL backend is asked for.
_BACKENDS: dict[str, tuple[str, str, bool]] = {
    "seal": ("veil.crypto.seal.backend", "SealBackend", True),
    "native": ("veil.crypto.native.backend", "NativeBackend", True),
    "plain": ("veil.crypto.plain_backend", "PlainBackend", False),
}


def backend_names(*, include_test: bool = False) -> list[str]:
    return sorted(n for n, (_, _, prod) in _BACKENDS.items() if prod or include_test)


def server_backend_choices() -> list[str]:
    """What ``--he-backend`` offers a server: ``auto`` (``resolve_backend``) and the production backends."""
    return ["auto", *backend_names()]


def resolve_backend(name: str, device: str = "cpu") -> str:
    """A server's ``--he-backend``: ``auto`` is ``native`` where it runs its kernels (a CUDA
    device, or a CPU where the C kernels built: ``veil.kernels.ckks_cpu``), else ``seal``, whose
    compiled library needs no compiler. Any other name is returned as given. Why native first:
    bit for bit SEAL's results where both are deterministic (``tests/test_native_seal.py``) and,
    measured on a 2-core CPU at k=2, a third of SEAL's time per token; without its kernels its
    torch twins are slower than SEAL."""
    if name != "auto":
        return name
    if device.startswith("cuda"):
        return "native"
    from veil.kernels import ckks_cpu

    return "native" if ckks_cpu.available() else "seal"


def make_backend(params: CkksParams, name: str = "seal", *, allow_test_backends: bool = False,
                 **options) -> HEBackend:
    """The one way to build a backend. Production code never passes ``allow_test_backends``:
    a test-only backend (``plain``) or a test-only parameter set is then refused, so neither a
    flag nor a client's message can put a server on one."""
    entry = _BACKENDS.get(name)
    if entry is None:
        raise BackendError(f"unknown HE backend {name!r}; choose one of {backend_names()}")
    module, cls, production = entry
    if not allow_test_backends:
        if not production:
            raise BackendError(f"HE backend {name!r} is test-only and refused here")
        if params.test_only:
            raise BackendError(f"parameter set {params.id!r} is test-only and refused here")
    return getattr(importlib.import_module(module), cls)(params, **options)

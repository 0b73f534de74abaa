"""The HE backend interface of the protected path.

Backend-neutral: nothing here names a SEAL (or any other library's) type. A backend instance
is bound to one parameter set. The client creates one, calls ``generate_keys`` and exports
the public material; the server creates one for the same parameter set and imports that
material. The secret key lives only inside the client's backend object: it is never part of
an export, and no method returns it.

Layout conventions (slot vectors have ``params.slot_count`` slots):

* A *matrix input* of length ``cols`` is replicated: slot ``k`` holds ``x[k % cols]`` for all
  ``k`` (``replicate_input``). Any ciphertext whose first ``plan.input_span`` slots follow this
  pattern works, so a server-side output that is zero outside ``[0, len)`` can be turned into
  an input with ``replicate`` (rotations, no level).
* A matrix output of length ``rows`` sits in slots ``[0, rows)``; with the "bsgs" layout the
  other slots are zero up to noise, with the "folded" layout they hold partial sums.

Masked refresh (PROTOCOL.md): server ``mask_for_refresh`` -> client ``refresh_reencrypt`` ->
server ``unmask_refresh``. Circuit privacy: server ``rerandomize`` on every ciphertext that
leaves it.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from veil.crypto.params import CkksParams

__all__ = [
    "HEError",
    "CiphertextError",
    "KeyMaterialError",
    "Ciphertext",
    "Plaintext",
    "EncodedMatrix",
    "MatvecPlan",
    "plan_matvec",
    "BabySteps",
    "RefreshMask",
    "PublicMaterial",
    "HEBackend",
    "bsgs_split",
    "matvec_rotation_steps",
    "replicate_input",
    "replicate_rotation_steps",
]


class HEError(RuntimeError):
    """An HE operation that cannot be carried out (wrong level, missing key, ...)."""


class CiphertextError(ValueError):
    """A serialized ciphertext that is malformed or does not match what was expected."""


class KeyMaterialError(ValueError):
    """Public key material that is malformed, for another parameter set, or missing a key."""


class Ciphertext:
    """Opaque handle of one ciphertext of a backend. Read-only metadata only."""

    __slots__ = ("_obj", "params_id", "_backend_id")

    def __init__(self, obj: object, params_id: str, backend_id: int) -> None:
        self._obj = obj
        self.params_id = params_id
        self._backend_id = backend_id

    def __repr__(self) -> str:
        return f"Ciphertext(params={self.params_id!r})"


class Plaintext:
    """Opaque handle of one encoded plaintext (a slot vector at a level and scale)."""

    __slots__ = ("_obj", "params_id", "level", "scale")

    def __init__(self, obj: object, params_id: str, level: int, scale: float) -> None:
        self._obj = obj
        self.params_id = params_id
        self.level = level
        self.scale = scale

    def __repr__(self) -> str:
        return f"Plaintext(params={self.params_id!r}, level={self.level}, scale=2^{np.log2(self.scale):.1f})"


@dataclass(frozen=True)
class MatvecPlan:
    """How a ``rows x cols`` product is laid out in the slots.

    ``layout="bsgs"``: one generalized diagonal per plaintext (``cols`` plaintexts), giant-step
    rotations pre-applied; the output is zero outside ``[0, rows)``.

    ``layout="folded"``: ``blocks`` groups of up to ``per_block`` diagonals share each
    plaintext: block ``t`` sits at slots ``[t*stride, t*stride + rows)``, and with the periodic
    input it sees the diagonals from offset ``o_t = t*stride mod cols`` on (``block_offsets``).
    The windows ``[o_t, o_t + per_block)`` cover all ``cols`` diagonals; each diagonal goes to
    the first block whose window holds it. ``stride = per_block`` (mod cols) gives disjoint
    windows, but any stride whose offsets leave no gap wider than ``per_block`` works, which
    lets more blocks fit: 960x576 takes 7 blocks of 84 diagonals at stride 987 (84
    plaintexts), where stride = per_block allowed only 4 blocks of 144. The blocks are summed
    by ``log2(fold_blocks)`` rotations (the blocks rounded up to a power of two; the empty
    ones read zero slots). About ``blocks`` times fewer plaintexts and multiplications and
    fewer rotations, but the output holds partial sums (garbage) outside ``[0, rows)``: use it
    where the result goes to the client, or clean it with a 0/1 ``multiply_plain`` (one level).

    ``layout="wide"`` (rows < cols, for W_down): the folded layout applied to the matrix tiled
    vertically to ``cols`` rows (row ``j`` is row ``j % row_period`` of the matrix padded to
    ``row_period`` rows, ``row_period`` = cols / 2^i >= rows), keeping only its first
    ``row_period`` diagonals, each ``cols`` slots long; ``log2(cols / row_period)`` more
    rotations by multiples of ``row_period`` add the row groups (Halevi–Shoup's hybrid method).
    Every diagonal slot then carries a weight: for 576x1536 192 plaintexts, half of what the
    folded layout needs at stride = per_block (the general-stride search of "folded" also
    reaches 192 there), with the same output layout (partial sums outside ``[0, rows)``).

    The input must be periodic (``x[k % cols]``) on slots ``[0, input_span)``.
    """

    layout: str
    rows: int
    cols: int
    n1: int
    n2: int
    blocks: int = 1
    per_block: int = 0
    stride: int = 0
    row_period: int = 0  # "wide" only

    @property
    def diag_len(self) -> int:
        """Slots each diagonal occupies."""
        return self.cols if self.layout == "wide" else self.rows

    @property
    def num_diagonals(self) -> int:
        return self.row_period if self.layout == "wide" else self.cols

    @property
    def row_folds(self) -> list[int]:
        """Rotation steps adding the row groups of the "wide" layout (largest first)."""
        if self.layout != "wide":
            return []
        out, h = [], self.cols // self.row_period // 2
        while h >= 1:
            out.append(h * self.row_period)
            h //= 2
        return out

    @property
    def input_span(self) -> int:
        return (self.blocks - 1) * self.stride + self.diag_len + self.n1 * self.n2

    @property
    def fold_blocks(self) -> int:
        """``blocks`` rounded up to a power of two: the fold adds this many block frames."""
        return 1 << (self.blocks - 1).bit_length()

    @property
    def block_offsets(self) -> list[int]:
        """First diagonal each block sees (``wide``: consecutive groups of ``per_block``)."""
        if self.layout == "wide":
            return [t * self.per_block for t in range(self.blocks)]
        return [t * self.stride % self.cols for t in range(self.blocks)]

    def diagonal_owners(self) -> list[list[int]]:
        """``owners[t][u]``: the diagonal block ``t`` carries in its ``u``-th plaintext, or -1.

        Every diagonal below ``num_diagonals`` appears exactly once."""
        n, seen = self.num_diagonals, set()
        owners = []
        for o in self.block_offsets:
            row = []
            for u in range(self.diagonals_per_block):
                k = o + u if self.layout == "wide" else (o + u) % self.cols
                if k >= n or k in seen:
                    row.append(-1)
                else:
                    seen.add(k)
                    row.append(k)
            owners.append(row)
        if len(seen) != n:
            raise ValueError("the blocks do not cover every diagonal")
        return owners

    @property
    def rotation_steps(self) -> list[int]:
        steps = set(range(1, self.n1)) | {g * self.n1 for g in range(1, self.n2)}
        h = self.fold_blocks // 2
        while h >= 1:
            steps.add(h * self.stride)
            h //= 2
        steps.update(self.row_folds)
        return sorted(steps)

    @property
    def rotations(self) -> int:
        """Key switches per product (baby steps included)."""
        return (self.n1 - 1) + (self.n2 - 1) + int(np.log2(self.fold_blocks)) + len(self.row_folds)

    @property
    def diagonals_per_block(self) -> int:
        return self.per_block if self.layout in ("folded", "wide") else self.cols


def plan_matvec(
    rows: int, cols: int, slot_count: int, layout: str = "bsgs", n1: int | None = None
) -> MatvecPlan:
    """Choose the slot layout of a product (see ``MatvecPlan``)."""
    if rows < 1 or cols < 1:
        raise ValueError("empty matrix")
    if layout == "bsgs":
        a, b = bsgs_split(cols, n1)
        plan = MatvecPlan("bsgs", rows, cols, a, b, 1, cols, 0)
        if plan.input_span > slot_count:
            raise ValueError(f"{rows}x{cols} needs {plan.input_span} slots, have {slot_count}")
        return plan
    if layout not in ("folded", "wide"):
        raise ValueError(f"unknown layout {layout!r}")
    plan = _plan_folded(rows, cols, slot_count, n1) if layout == "folded" else _plan_wide(rows, cols, slot_count, n1)
    if plan is None:
        raise ValueError(f"{rows}x{cols} does not fit {slot_count} slots")
    return plan


def _cost(rotations, plaintexts):
    # cost model: a key switch ~ 20 plaintext products (SEAL, N=16384, 7 primes)
    return 20 * rotations + plaintexts


@functools.lru_cache(maxsize=256)
def _plan_folded(rows: int, cols: int, slot_count: int, n1: int | None) -> MatvecPlan | None:
    """Search every block count and stride (vectorized over strides) for the cheapest plan."""
    best = None
    for blocks in range(1, min(cols, slot_count // rows) + 1):
        fold = 1 << (blocks - 1).bit_length()
        if blocks == 1:
            strides = np.array([rows])
        else:
            strides = np.arange(rows, (slot_count - rows) // (blocks - 1) + 1)
            if fold > blocks:  # the empty frames of the fold must read zero slots, no wrap
                strides = strides[(fold - 1) * strides + rows <= slot_count]
        if strides.size == 0:
            break
        offs = np.sort(np.arange(blocks)[None, :] * strides[:, None] % cols, axis=1)
        gaps = np.diff(np.concatenate([offs, offs[:, :1] + cols], axis=1), axis=1)
        k = gaps.max(axis=1)  # diagonals per block: the widest gap between offsets
        a = np.where(k >= n1, n1, np.ceil(np.sqrt(k))) if n1 is not None else np.ceil(np.sqrt(k))
        a = a.astype(np.int64)
        b = -(-k // a)
        span = (blocks - 1) * strides + rows + a * b
        cost = _cost((a - 1) + (b - 1) + (fold.bit_length() - 1), k)
        ok = np.flatnonzero(span <= slot_count)
        if ok.size == 0:
            continue
        i = ok[np.lexsort((span[ok], cost[ok]))[0]]  # cheapest, then the shortest input span
        if best is None or cost[i] < best[0]:
            plan = MatvecPlan("folded", rows, cols, int(a[i]), int(b[i]), blocks, int(k[i]), int(strides[i]))
            best = (int(cost[i]), plan)
    return None if best is None else best[1]


def _plan_wide(rows: int, cols: int, slot_count: int, n1: int | None) -> MatvecPlan | None:
    period = cols
    while period % 2 == 0 and period // 2 >= rows:
        period //= 2
    if period == cols:
        raise ValueError(f"{rows}x{cols}: the wide layout needs cols / 2^i >= rows for some i >= 1")
    best = None
    t = 1
    while t <= period:
        k = -(-period // t)
        stride = k + cols * max(0, -(-(cols - k) // cols))  # >= cols and == k (mod cols)
        a, b = bsgs_split(k, n1 if n1 is not None and n1 <= k else None)
        plan = MatvecPlan("wide", rows, cols, a, b, t, k, stride, period)
        if plan.input_span <= slot_count:
            cost = _cost(plan.rotations, k)
            if best is None or cost < best[0]:
                best = (cost, plan)
        t *= 2
    return None if best is None else best[1]


@dataclass
class EncodedMatrix:
    """A weight matrix pre-encoded for one product layout at one level.

    Built once per (matrix, parameter set, level) and reused for every product. ``rows x
    cols`` is the shape of W in ``y = W x``. ``plaintexts`` is backend-owned.
    """

    params_id: str
    level: int
    plan: MatvecPlan
    plaintext_scale: float
    plaintexts: dict = field(repr=False)
    nbytes: int = 0

    @property
    def rows(self) -> int:
        return self.plan.rows

    @property
    def cols(self) -> int:
        return self.plan.cols

    @property
    def n1(self) -> int:
        return self.plan.n1

    @property
    def n2(self) -> int:
        return self.plan.n2

    @property
    def rotation_steps(self) -> list[int]:
        return self.plan.rotation_steps


@dataclass
class BabySteps:
    """The baby-step rotations ``rot(x, b), b < n1`` of one input ciphertext.

    Shared by every matrix that takes the same input with the same ``n1``.
    """

    params_id: str
    level: int
    n1: int
    rotations: list = field(repr=False)
    scale: float = 0.0


@dataclass
class RefreshMask:
    """Server-side secret of one masked refresh: the integer mask polynomial.

    ``coeffs`` holds Python ints in ``[-2^bits, 2^bits)``, one per coefficient.
    """

    params_id: str
    bits: int
    coeffs: np.ndarray = field(repr=False)  # dtype=object (Python ints)
    scale: float = 0.0


@dataclass(frozen=True)
class PublicMaterial:
    """Everything the server needs to evaluate: no secret key in here.

    Each field is the backend's serialized object; ``rotation_steps`` lists the steps for
    which ``galois_keys`` holds keys.
    """

    params_id: str
    public_key: bytes
    relin_keys: bytes
    galois_keys: bytes
    rotation_steps: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return len(self.public_key) + len(self.relin_keys) + len(self.galois_keys)


# ------------------------------------------------------------------------------------------
# Layout helpers (pure numpy, shared by every backend)
# ------------------------------------------------------------------------------------------


def bsgs_split(cols: int, n1: int | None = None) -> tuple[int, int]:
    """Baby/giant step counts for ``cols`` generalized diagonals: ``n1 * n2 >= cols``."""
    if cols < 1:
        raise ValueError("cols must be positive")
    if n1 is None:
        n1 = max(1, int(np.ceil(np.sqrt(cols))))
    n1 = min(n1, cols)
    n2 = -(-cols // n1)
    return n1, n2


def matvec_rotation_steps(cols: int, n1: int | None = None) -> list[int]:
    """Rotation steps (Galois keys) a BSGS product over ``cols`` diagonals needs."""
    n1, n2 = bsgs_split(cols, n1)
    return sorted(set(range(1, n1)) | {g * n1 for g in range(1, n2)})


def replicate_rotation_steps(length: int, copies: int) -> list[int]:
    """Rotation steps ``HEBackend.replicate(ct, length, copies)`` uses (all negative)."""
    if length < 1 or copies < 1:
        raise ValueError("length and copies must be positive")
    top = copies.bit_length() - 1
    steps = {-length * (1 << i) for i in range(top)}
    have = 1 << top
    for i in range(top - 1, -1, -1):
        if copies >> i & 1:
            steps.add(-length * have)
            have += 1 << i
    return sorted(steps)


def replicate_input(x: np.ndarray, slot_count: int) -> np.ndarray:
    """The matrix-input layout: slot ``k`` holds ``x[k % len(x)]``."""
    x = np.asarray(x, dtype=np.float64).ravel()
    if x.size == 0 or x.size > slot_count:
        raise ValueError(f"input length {x.size} does not fit {slot_count} slots")
    reps = -(-slot_count // x.size)
    return np.tile(x, reps)[:slot_count]


# ------------------------------------------------------------------------------------------
# The interface
# ------------------------------------------------------------------------------------------


class HEBackend(abc.ABC):
    """CKKS backend bound to one parameter set.

    Levels: ``params.top_level`` for fresh ciphertexts down to 0; see ``veil.crypto.params``.
    """

    params: CkksParams

    # ---- keys ----------------------------------------------------------------------------
    @abc.abstractmethod
    def generate_keys(self, rotation_steps: Sequence[int] = ()) -> None:
        """Client: create the secret key, public key, relinearization keys and Galois keys
        for ``rotation_steps`` (positive = rotate left, negative = right)."""

    @property
    @abc.abstractmethod
    def has_secret_key(self) -> bool: ...

    @property
    @abc.abstractmethod
    def rotation_steps(self) -> tuple[int, ...]:
        """Steps for which this backend holds Galois keys."""

    @abc.abstractmethod
    def export_public_material(self) -> PublicMaterial:
        """Client: serialize the public key, relin keys and Galois keys (never the secret)."""

    @abc.abstractmethod
    def import_public_material(self, material: PublicMaterial) -> None:
        """Server: load and validate public material; raises ``KeyMaterialError``."""

    # ---- encode / encrypt / decrypt ------------------------------------------------------
    @abc.abstractmethod
    def encrypt(
        self, values: np.ndarray, level: int | None = None, scale: float | None = None
    ) -> Ciphertext:
        """Encrypt a real vector (zero-padded to the slot count) at ``level`` (default top).
        Symmetric (secret-key) when the secret key is present, else under the public key."""

    @abc.abstractmethod
    def encrypt_to_bytes(
        self, values: np.ndarray, level: int | None = None, scale: float | None = None
    ) -> bytes:
        """Client: encrypt and serialize in the seeded (half-size) form when the backend has
        one: the upload format."""

    @abc.abstractmethod
    def encode(
        self, values: np.ndarray, level: int | None = None, scale: float | None = None
    ) -> Plaintext:
        """Encode a real vector at ``level`` (default top) and ``scale`` (default Delta)."""

    @abc.abstractmethod
    def decrypt(self, ct: Ciphertext, length: int | None = None) -> np.ndarray:
        """Client: decrypt and decode the first ``length`` slots (default all) as float64."""

    # ---- metadata --------------------------------------------------------------------------
    @abc.abstractmethod
    def level(self, ct: Ciphertext) -> int: ...

    @abc.abstractmethod
    def scale(self, ct: Ciphertext) -> float: ...

    @abc.abstractmethod
    def size(self, ct: Ciphertext) -> int:
        """Number of polynomials (2 for a fresh / relinearized ciphertext)."""

    # ---- arithmetic ------------------------------------------------------------------------
    @abc.abstractmethod
    def add(self, a: Ciphertext, b: Ciphertext) -> Ciphertext: ...

    @abc.abstractmethod
    def sub(self, a: Ciphertext, b: Ciphertext) -> Ciphertext: ...

    @abc.abstractmethod
    def add_plain(self, ct: Ciphertext, values: np.ndarray | Plaintext) -> Ciphertext:
        """Add a plaintext vector (encoded here at the ciphertext's level and scale, or a
        pre-encoded ``Plaintext`` of the same level and scale)."""

    @abc.abstractmethod
    def multiply_plain(
        self, ct: Ciphertext, values: np.ndarray | Plaintext, rescale: bool = True
    ) -> Ciphertext:
        """Slot-wise product with a plaintext vector. Raw vectors are encoded at scale
        ``q_level`` so that the rescaled result keeps the input scale; a pre-encoded
        ``Plaintext`` must be at the ciphertext's level (its scale multiplies in)."""

    @abc.abstractmethod
    def multiply(
        self, a: Ciphertext, b: Ciphertext, rescale: bool = True, relinearize: bool = True
    ) -> Ciphertext:
        """ct x ct, relinearized, then (by default) rescaled one level. ``relinearize=False``
        leaves the three-polynomial product: a sum of such products needs one ``relinearize``
        (a key switch) instead of one per product."""

    @abc.abstractmethod
    def relinearize(self, ct: Ciphertext) -> Ciphertext:
        """A three-polynomial ciphertext back to two (needs the relinearization key)."""

    @abc.abstractmethod
    def rotate(self, ct: Ciphertext, step: int) -> Ciphertext:
        """Cyclic left rotation of the slots by ``step`` (needs its Galois key)."""

    @abc.abstractmethod
    def rescale(self, ct: Ciphertext) -> Ciphertext:
        """Divide by the last prime and drop it (level - 1, scale / q_level)."""

    @abc.abstractmethod
    def mod_switch_to(self, ct: Ciphertext, level: int) -> Ciphertext:
        """Drop primes down to ``level`` without changing the scale."""

    @abc.abstractmethod
    def set_scale(self, ct: Ciphertext, scale: float) -> Ciphertext:
        """Relabel the scale (for scales that differ by rescale drift only)."""

    # ---- matrix-vector products ------------------------------------------------------------
    @abc.abstractmethod
    def encode_matrix(
        self, weight: np.ndarray, level: int, n1: int | None = None, layout: str = "bsgs",
        max_input_span: int | None = None,
    ) -> EncodedMatrix:
        """Pre-encode the generalized diagonals of ``weight`` (rows x cols) for inputs at
        ``level``, giant-step rotations pre-applied (``plan_matvec`` for the layouts).
        ``max_input_span``: the input is periodic on fewer slots than the slot count (the
        plan must read no further)."""

    @abc.abstractmethod
    def baby_steps(self, ct: Ciphertext, n1: int) -> BabySteps:
        """Rotations ``rot(ct, b)`` for ``b < n1`` (shareable across matrices)."""

    @abc.abstractmethod
    def matvec(
        self, matrix: EncodedMatrix, x: Ciphertext | BabySteps, rescale: bool = True
    ) -> Ciphertext:
        """``W x`` for an input in the replicated layout; output in slots ``[0, rows)``
        (zero elsewhere for the "bsgs" layout, partial sums elsewhere for "folded")."""

    @abc.abstractmethod
    def replicate(self, ct: Ciphertext, length: int, copies: int) -> Ciphertext:
        """Turn a vector in slots ``[0, length)`` (zero elsewhere) into ``copies``
        consecutive copies by doubling (steps: ``replicate_rotation_steps``). No level used."""

    # ---- refresh and circuit privacy -------------------------------------------------------
    @abc.abstractmethod
    def mask_for_refresh(
        self, ct: Ciphertext, rerandomize: bool = True
    ) -> tuple[Ciphertext, RefreshMask]:
        """Server: add a fresh uniform integer mask polynomial to the plaintext of ``ct`` (and,
        by default, re-randomize it: the result may leave the server as it is)."""

    @abc.abstractmethod
    def refresh_reencrypt(self, ct: Ciphertext, level: int | None = None) -> Ciphertext:
        """Client: decrypt the masked plaintext polynomial exactly (integers) and encrypt the
        same polynomial at ``level`` (default top) and the same scale."""

    @abc.abstractmethod
    def refresh_reencrypt_to_bytes(self, ct: Ciphertext, level: int | None = None) -> bytes:
        """Client: as ``refresh_reencrypt``, serialized in the upload (seeded) form."""

    @abc.abstractmethod
    def decrypt_poly(self, ct: Ciphertext) -> np.ndarray:
        """Client: the decrypted plaintext polynomial as centred integers (object array of
        Python ints, one per coefficient); no decoding."""

    @abc.abstractmethod
    def unmask_refresh(self, ct: Ciphertext, mask: RefreshMask) -> Ciphertext:
        """Server: subtract the mask from the re-encrypted ciphertext (at its new level)."""

    @abc.abstractmethod
    def rerandomize(self, ct: Ciphertext, flood_log2_sigma: float | None = None) -> Ciphertext:
        """Server: add a fresh public-key encryption of zero and Gaussian flooding noise of
        standard deviation ``2^flood_log2_sigma`` coefficient units (default from params;
        ``float('-inf')`` for none)."""

    # ---- serialization ---------------------------------------------------------------------
    @abc.abstractmethod
    def serialize(self, ct: Ciphertext) -> bytes: ...

    @abc.abstractmethod
    def deserialize(
        self,
        data: bytes,
        *,
        level: int | None = None,
        size: int = 2,
        scale: float | None = None,
    ) -> Ciphertext:
        """Load and validate; any mismatch or malformed input raises ``CiphertextError``."""

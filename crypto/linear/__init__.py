"""Linear algebra on CKKS slot vectors, written once over the ``HEBackend`` interface.

Everything here is backend-neutral: it calls ``encode``, ``dot_plain_many``, ``multiply_plain``,
``add``, ``rescale``, ``rotate``, ``rotate_many`` and ``can_rotate`` and nothing else, so SEAL,
the native backend and the slot-vector test double all run the same products (as Lattigo keeps
its linear transformations generic over its evaluator).

Matrix-vector products: generalized diagonals ``diag_k[j] = W[j, (j+k) % cols]`` against an
input replicated with period ``cols``; baby steps ``rot(x, b), b < n1`` from one
``rotate_many`` (a backend may hoist them; ``baby_steps`` chains them from step 1 when the
client made the compact key set), giant-step rotations ``g * n1`` pre-applied to the
plaintexts and undone by Horner's rule (every giant rotation is by ``n1``: one Galois key), so a
product costs ``n1 - 1 + n2 - 1`` rotations plus the folds of its layout (``MatvecPlan``).
Diagonals are encoded at scale ``prime(level)``, so the rescaled output keeps the input's scale.

Layout conventions (``S = params.slot_count`` slots):

* A *matrix input* of length ``cols`` is periodic: slot ``k`` holds ``x[k % cols]`` on the
  first ``plan.input_span`` slots (``replicate_input``); a server-side output that is zero
  outside ``[0, len)`` becomes one with ``replicate`` (rotations, no level).
* A matrix output of length ``rows`` sits in slots ``[0, rows)``; with the "bsgs" layout the
  other slots are zero up to noise, with "folded" and "wide" they hold partial sums.

The package: ``plan`` (what a layout is), ``planner`` (choosing one), ``encode`` (weights as
diagonal plaintexts, inputs in the slots) and ``products`` (the products over the interface).
"""

from veil.crypto.linear.encode import (
    EncodedMatrix,
    EntryBounds,
    encode_matrices,
    encode_matrix,
    pack_inputs,
    replicate_input,
    unpack_outputs,
)
from veil.crypto.linear.plan import MatvecPlan, bsgs_split
from veil.crypto.linear.planner import plan_matvec, plan_packed
from veil.crypto.linear.products import (
    baby_steps,
    broadcast_lane,
    composed_rotation,
    matvec,
    replicate,
    replicate_rotation_steps,
    rotate,
    rotation_steps_of,
)

__all__ = [
    "MatvecPlan",
    "bsgs_split",
    "plan_matvec",
    "plan_packed",
    "EncodedMatrix",
    "EntryBounds",
    "encode_matrix",
    "encode_matrices",
    "replicate_input",
    "pack_inputs",
    "unpack_outputs",
    "matvec",
    "rotate",
    "composed_rotation",
    "baby_steps",
    "replicate",
    "replicate_rotation_steps",
    "broadcast_lane",
    "rotation_steps_of",
]

"""The server's weights of the protected layers: folded for the circuits, encoded at their levels.

Per block, the RMSNorm gains fold into the matrices after them (``W diag(γ)``) and every
``1/rms`` is left to the client, so the server's products are the unnormalized projections of
docs/PROTOCOL.md. The query heads are reordered by head slot (``LayoutDims.head_order``) so that
every KV head serves the head slots ``g ≡ its index (mod kv_heads)``.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from veil.crypto.backend import HEBackend
from veil.crypto.linear import EncodedMatrix, EntryBounds, MatvecPlan, encode_matrices, plan_packed
from veil.protected.layouts import HIDDEN_FRAMES, LayoutDims
from veil.protected.protocol import LEVELS, Levels

__all__ = ["N1", "MATRIX_LAYOUTS", "LayerWeights", "EncodedLayer", "layer_weights_from_tensors", "matrix_shapes",
           "input_spans", "product_plan", "rope_cos_sin", "ffn_permutation"]

#: Baby-step count of every product: the baby steps 1..15 rotate a product's input (hoisted
#: where the backend can), their keys are shared by the four products; the giant steps all
#: rotate by 16 one level lower (Horner's rule, ``veil.crypto.linear.matvec``). Fewer baby steps
#: for W_qkv would shrink the keys (its baby-step keys are for level 7, whole keys) but cost the
#: native backend, whose hoisted rotations are cheap, more giant steps: measured in
#: benchmarks/results/2026-11-26-keys.
N1 = 16

#: Slot layout of each product (``veil.crypto.linear.MatvecPlan``). W_down (d x F, wide) uses
#: the hybrid diagonal layout: half the plaintexts and 11 fewer rotations than "folded".
MATRIX_LAYOUTS = {"wqkv": "folded", "wo": "folded", "wgu": "folded", "wdown": "wide"}


@dataclass
class LayerWeights:
    """Plaintext weights of one block with the RMSNorm gains folded in (float64)."""

    index: int
    w_qkv: np.ndarray  # (qdim + 2*kv_dim, d): [Π W_q; W_k; W_v] diag(γ1), Π: head-slot order
    w_o: np.ndarray  # (d, q): W_o Π^T (its input â is in head-slot order)
    w_gu: np.ndarray  # (2F, d): [W_gate; W_up] diag(γ2)
    w_down: np.ndarray  # (d, F)

    def matrices(self) -> dict[str, np.ndarray]:
        return {"wqkv": self.w_qkv, "wo": self.w_o, "wgu": self.w_gu, "wdown": self.w_down}


def layer_weights_from_tensors(tensors: dict, cfg, index: int, dims: LayoutDims) -> LayerWeights:
    p = f"model.layers.{index}."

    def t(name):
        return tensors[p + name].detach().double().numpy()

    g1, g2 = t("input_layernorm.weight"), t("post_attention_layernorm.weight")
    hd = cfg.head_dim
    lanes = (dims.head_order[:, None] * hd + np.arange(hd)[None, :]).ravel()  # head slot g -> query head
    wq, wk, wv = t("self_attn.q_proj.weight"), t("self_attn.k_proj.weight"), t("self_attn.v_proj.weight")
    w_qkv = np.vstack([wq[lanes], wk, wv]) * g1[None, :]
    w_gu = np.vstack([t("mlp.gate_proj.weight"), t("mlp.up_proj.weight")]) * g2[None, :]
    return LayerWeights(index, w_qkv, t("self_attn.o_proj.weight")[:, lanes], w_gu, t("mlp.down_proj.weight"))


def matrix_shapes(dims: LayoutDims) -> dict[str, tuple[int, int]]:
    """(rows, cols) of W_qkv, W_o, W_gate|up and W_down."""
    return {"wqkv": (dims.qdim + 2 * dims.kv_dim, dims.d), "wo": (dims.d, dims.qdim), "wgu": (2 * dims.ffn, dims.d),
            "wdown": (dims.d, dims.ffn)}


def input_spans(dims: LayoutDims) -> dict[str, tuple[int, int]]:
    """(span, frames) of each product's input: periodic on ``span`` slots of each of
    ``frames`` frames. W_o's input (the weighted values) is exact on ``value_span`` slots only
    (``veil.protected.layouts``); h for W_qkv and h' for W_gate|up are in the hidden layout,
    whole copies in each of its frames."""
    hidden = (dims.frame_copies * dims.d, HIDDEN_FRAMES)
    return {"wqkv": hidden, "wo": (dims.value_span, 1), "wgu": hidden, "wdown": (dims.slots, 1)}


def product_plan(dims: LayoutDims, name: str) -> MatvecPlan:
    """The slot layout of product ``name`` (``veil.crypto.linear.MatvecPlan``)."""
    rows, cols = matrix_shapes(dims)[name]
    span, frames = input_spans(dims)[name]
    return plan_packed(rows, cols, dims.slots, MATRIX_LAYOUTS[name], N1, span, 1, frames)


def _encode(be: HEBackend, name: str, ws, dims: LayoutDims, levels: Levels,
            entries: EntryBounds | None = None) -> list[EncodedMatrix]:
    """Product ``name``'s matrices ``[B, rows, cols]`` (an array, or ``be.encodable``'s tensor)."""
    span, frames = input_spans(dims)[name]
    return encode_matrices(be, ws, levels.matrices[name], N1, MATRIX_LAYOUTS[name], max_input_span=span, frames=frames,
                           entries=entries)


class EncodedLayer:
    """The four products of one block, each encoded at the level its input sits at. Encoded
    plaintexts depend on no key: one copy serves every session and tenant.

    ``shuffled=True`` (the first protected layer): the layer also keeps W_gate|up and W_down in
    the clear, so that ``shuffled_ffn`` can encode them under a fresh secret permutation of the
    FFN coordinates for every position (docs/PROTOCOL.md, "The first protected layer")."""

    def __init__(self, be: HEBackend, weights: LayerWeights, dims: LayoutDims, levels: Levels = LEVELS,
                 shuffled: bool = False):
        self.index, self.dims, self.levels = weights.index, dims, levels
        mats = {name: _encode(be, name, np.asarray(w, dtype=np.float64)[None], dims, levels)[0]
                for name, w in weights.matrices().items()}
        self.wqkv, self.wo, self.wgu, self.wdown = mats["wqkv"], mats["wo"], mats["wgu"], mats["wdown"]
        self.ffn = (be.encodable(weights.w_gu), be.encodable(weights.w_down)) if shuffled else None
        # what every permutation of them keeps, so that their encodings need no read from the
        # device (on a GPU each read waits for the queue: ``benchmarks/results/2026-12-07-shuffle-bounds``)
        self.ffn_entries = (EntryBounds.of(weights.w_gu), EntryBounds.of(weights.w_down)) if shuffled else None

    @property
    def nbytes(self) -> int:
        """Encoded products, and the clear FFN weights the shuffle re-encodes (float64 on the
        native backend's device: 21 MB for SmolLM2)."""
        clear = sum(w.nbytes for w in self.ffn) if self.ffn is not None else 0
        return clear + sum(m.nbytes for m in (self.wqkv, self.wo, self.wgu, self.wdown))

    @functools.cached_property
    def shuffle_bytes(self) -> int:
        """An upper bound on one position's shuffled W_gate|up and W_down together: every
        plaintext of their plans present, each as large as the largest of this layer's (a
        permutation may fill a diagonal that the weights' own order leaves all zero)."""
        return sum(m.plan.diagonals_per_block * max((pt.nbytes for pt in m.plaintexts.values()), default=0)
                   for m in (self.wgu, self.wdown))

    def shuffled_ffn(self, be: HEBackend, perms: Sequence[np.ndarray]) -> tuple[list[EncodedMatrix], list[EncodedMatrix]]:
        """For each permutation ``perm`` of ``perms`` (one per row of a batch): W_gate|up with its
        rows and W_down with its columns in the order ``perm`` (the same permutation of the F
        coordinates for gate and up): û comes out permuted, SiLU and ⊙ act coordinate by
        coordinate, so the client's m is permuted the same way and W_down's permuted columns
        undo it. The client never learns the order. All rows are gathered and encoded
        together, where the weights live (the device, for the native backend)."""
        if self.ffn is None:
            raise ValueError(f"layer {self.index} keeps no FFN weights to shuffle")
        w_gu, w_down = self.ffn
        f = w_down.shape[1]
        rows = np.stack([np.concatenate([p, f + p]) for p in perms])
        cols = np.stack(perms)
        if not isinstance(w_gu, np.ndarray):  # a tensor: index it with one of its own
            rows, cols = (w_gu.new_tensor(rows, dtype=torch.int64), w_gu.new_tensor(cols, dtype=torch.int64))
        gu, down = w_gu[rows], w_down[:, cols].swapaxes(0, 1)  # [B, 2F, D], [B, D, F]
        gu_entries, down_entries = self.ffn_entries
        return (_encode(be, "wgu", gu, self.dims, self.levels, gu_entries),
                _encode(be, "wdown", down, self.dims, self.levels, down_entries))


def ffn_permutation(n: int) -> np.ndarray:
    """A uniformly random permutation of ``range(n)`` from the OS CSPRNG (Fisher-Yates over
    ``secrets``): secret material, never from numpy's or torch's generators."""
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = secrets.randbelow(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return np.array(perm, dtype=np.int64)


def rope_cos_sin(cfg, position: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of one position over head_dim lanes, exactly as ``LlamaModel`` computes them."""
    from veil.engine.model import RotaryEmbedding

    rot = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
    cos, sin = rot.cos_sin(torch.tensor([position]), torch.float32)
    return cos[0].double().numpy(), sin[0].double().numpy()

"""Protected executor: the server half of PROTOCOL.md on CKKS ciphertexts.

``ProtectedExecutor`` runs Llama blocks ``[first, last)`` for sessions whose residual stream is
encrypted under a key only the client holds. It is independent of the plaintext paged cache:
each ``ProtectedSession`` owns its encrypted KV cache (per layer, packed chunks of 8
positions, byte-accounted and bounded). Backend-neutral: only ``veil.crypto.backend`` calls.

Message flow of one token (decode step at position ``t``), ``n = last - first`` layers:

=====  ===========================================  =============================================
 #      client -> server                             server -> client
=====  ===========================================  =============================================
 0      TOKEN: ct(h_t) (layer ``first`` input)        SCORES(first): ct[ŝ_t·/sqrt(hd), σ_t/d]
 1      WEIGHTS(l): ct(w_t·) compact                  MLP(l): ct[û_g, û_u, σ'/(8d)]
 2      MLP_IN(l): ct(m_t)                            REFRESH(l): ct(h''+ρ) ... or FINAL: ct(h_L)
 3      REFRESHED(l): ct(h''+ρ) re-encrypted          SCORES(l+1)
=====  ===========================================  =============================================

Messages 1-3 repeat per layer; the last layer's MLP_IN is answered with FINAL and has no
message 3: ``3n`` round trips per token.

Prefill spans: a TOKEN message may carry up to ``MAX_SPAN`` consecutive positions (one
ciphertext each, ``CtPayload.token`` = index in the span), and every later message of the step
carries the span's ciphertexts together: ``3n`` round trips per span instead of per position.
Each position still has its own ciphertexts (no several-positions-per-ciphertext packing yet),
so the server's HE work per position is the same as in decode, with one exception: at the last
layer only the span's last position goes past its KV append (its h_L is the only one the client
needs; the others send σ alone, for the client's r_j, and skip scores, weights, W_o and the MLP).
The span's keys and values are all appended before any score is computed; position t's class
masks (``shared_lane_sums``) and weight-expansion masks drop the positions after t, so the causal
order holds without the client's help.

Why three round trips per layer where PROTOCOL.md sketches two: the refresh sits *after*
W_down (on h'' = h' + W_down m) instead of on h'. Refreshing h' forced h'' to be born at the
top of the chain (its clean + replicate must end at the layer-start level 7), hence m uploaded
and W_down evaluated at level 9 with 10 primes (the chain then had ten data levels): 28% of
the layer's server time and 252 MB of encoded plaintexts per layer. Refreshing h'' lets W_down
run at level 4 (measured 3.9x faster, half the plaintext bytes) and m go up at level 4; the client uploads the refreshed h'' already
clean and replicated at level 7, so the layer start needs no clean + replicate either. The
price is one more round trip per layer but the last (27 more per token at k=2: 84 instead of
57; at 20 ms of round-trip latency that is 27 x 20 ms = 0.54 s per token, arithmetic). What each party sees is unchanged: the client
decrypts h'' + ρ instead of h' + ρ (uniformly masked either way).

Levels (``PROTECTED_PARAMS``: top level 7, scale 2^36; a refresh mask fits at level >= 2):

* layer start: h (clean, replicated: ``hidden_layout``) at 7, uploaded by the client (TOKEN or
  REFRESHED); y = [Π W_q; W_k; W_v] γ1 h at 6 (960 rows; Π orders the query heads by head
  slot, see ``veil.crypto.layouts``, so that every KV head serves head slots g = its index mod
  kv_heads); RoPE on ciphertexts q̂ = cos ⊙ y_q + (-sin) ⊙ rot(y,32) + sin ⊙ rot(y,-32)
  (masks also clean the folded output; their plaintexts depend on the position only, so the
  layers of a token share them), k̂ likewise on the 192 KV lanes, v̂ = 1_v ⊙ y: all at 5; k̂
  is switched to 4, the only level keys are used at (values stay at 5), before any of its
  rotations; k̂ and v̂ repeated 3 times (period 192, three rotations each) for the 9 head
  slots, then appended to the KV cache (chunk j//8, key block j%8 of 1024 slots, value block
  j%8 of q slots).
  Unrepeated W_k and W_v keep W_qkv at 960 rows, which folds into 7 blocks of 84 plaintexts
  (``MatvecPlan``) where [W_q; K_exp W_k; K_exp W_v] (1728 rows) needed 144.
  Scores (``shared_lane_sums``): switch q̂ to 4, replicate it into the 8 blocks, ct x ct with
  each key chunk (3); the 64-lane sums per head are shared between the chunks of a group of
  C (2^j >= C; groups of 2-4 chunks, ``score_lane_groups``): j halvings per chunk, a mask
  keeping lanes that are multiples of 2^j (2), chunk c moved to lane offset c, the chunks
  added and the last 6-j halvings done once per group; each group masked to its lanes (1),
  the groups joined at 1 by rotations of their sizes. σ = Σh² from h
  switched to 3 (2) by a window sum over one period d (10 rotations: 576 = 512 + 64), masked
  into slot d (1), whose window [d, 2d) is one whole copy.
  Download masks are encoded at scale ~2^56 (``DOWNLOAD_SCALE``) so that their encoding error
  times the masked-out partial sums stays ~2^-26 absolute, far below the flooding noise.
  Download switched to level 1, re-randomized and flooded.
* WEIGHTS (uploaded at 6): chunk c expanded by a mask (5) and log2 P signed doublings;
  â = Σ_c E_c ⊙ V_c (4) (values in the "value blocks" of ``veil.crypto.layouts``: stride q,
  no gap); 16 right shifts by q summed (4 rotations) -> â with period q on [0, 5q); o = W_o â
  (3, folded, 144 plaintexts); cleaned (2) and replicated; h' = h + o at 2.
  σ' by a cyclic sum (1) times the constant 1/(14*8d) in every slot (0), û = [W_gate; W_up] γ2 h'
  (1), cleaned (0), added: one download at level 0 (slot 2F holds σ'/(8d), slots [0, 2F) hold
  û + σ'/(8d)).
* MLP_IN (m uploaded at 4): W_down m at 3 (the "wide" hybrid diagonal layout, 192 plaintexts;
  partial sums outside [0, d)), cleaned (2) and replicated; h'' = h' + W_down m at 2, masked
  for refresh there (uniform integer mask, ``HEBackend.mask_for_refresh``) and sent down; the
  client re-encrypts the masked polynomial at 7. After the last layer instead: h' and W_down m
  are each cleaned at scale 2^56 (h' 2 -> 1, W_down m 3 -> 2 -> switched to 1) and h_L is
  downloaded at level 1.

Circuit privacy: every ciphertext that leaves is ``rerandomize``d (fresh encryption of zero +
Gaussian flooding of std ``scale * 2^-FLOOD_BELOW_SCALE`` coefficient units, ~2^-11.5 absolute
per slot); the masked h'' is re-randomized and hidden by the mask. Every server-side output that
leaves is cleaned by a 0/1 mask first, so the client decrypts flooding noise outside the
documented slots. Known margin gap: a CKKS 0/1 mask leaves its encoding error (~2^5.2 / its
plaintext scale) times the masked-out values; at the level-0 MLP download the plaintext scale
is only ~2^36, so the folded partial sums of W_gate/W_up leave a residue ~2^-15 absolute, only
~3.5 bits under the flooding noise (the scores and h_L downloads use masks at ~2^56: ~2^-26).
Closing it needs one more level under û (the MLP download at level 1).
"""

from __future__ import annotations

import functools
import secrets
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from veil.crypto.backend import (
    Ciphertext,
    EncodedMatrix,
    HEBackend,
    RefreshMask,
    replicate_rotation_steps,
)
from veil.crypto.layouts import (
    BLOCK,
    PROTECTED_PARAMS,
    SIGMA2_DIV,
    LayoutDims,
)
from veil.crypto.wire import MAX_SPAN, CtPayload, ProtectedMessage, WireError

__all__ = [
    "PROTOCOL_VERSION",
    "MAX_SPAN",
    "MsgKind",
    "CtPayload",
    "ProtectedMessage",
    "ProtocolError",
    "MessageError",
    "UnknownSession",
    "LimitExceeded",
    "CapacityExceeded",
    "Levels",
    "LayerWeights",
    "ProtectedLayer",
    "ProtectedSession",
    "ProtectedExecutor",
    "TimedBackend",
    "layer_weights_from_tensors",
    "rope_cos_sin",
    "required_rotation_steps",
    "active_positions",
    "broadcast_lane",
    "window_sum",
    "ciphertext_bytes",
]

PROTOCOL_VERSION = 1
N1 = 16  # shared baby-step count of every product (few Galois keys)
#: Scale of the scores download after its masks (plaintext masks encoded at ~2^56: their
#: encoding error, which multiplies the masked-out partial sums, is ~2^-50.8 relative).
DOWNLOAD_SCALE = 2.0**56
#: Flooding std in coefficient units = scale * 2^-FLOOD_BELOW_SCALE (~2^-11.5 absolute per slot
#: after decoding; equals params.flood_log2_sigma = 18 at scale 2^36).
FLOOD_BELOW_SCALE = 18.0


class ProtocolError(ValueError):
    """A message that does not fit the session's state (kind, step, layer, position).

    ``status`` is the HTTP status a server answers with: 409 for a state conflict (replayed or
    out-of-order step, wrong kind), 400 for a malformed message (wrong parameter set or level),
    404 for an unknown session, 413 for an exhausted limit. The session is unchanged."""

    status = 409


class MessageError(ProtocolError):
    status = 400


class UnknownSession(ProtocolError):
    status = 404


class LimitExceeded(ProtocolError):
    """A limit of this session (context, encrypted KV cache bytes)."""

    status = 413


class CapacityExceeded(ProtocolError):
    """A limit of the whole server (encrypted KV cache bytes of all sessions): retry later."""

    status = 429


class MsgKind:
    TOKEN = "token"  # c->s: ct(h) input of layer `first`
    SCORES = "scores"  # s->c: ct[ŝ, σ]
    WEIGHTS = "weights"  # c->s: ct(w)
    MLP = "mlp"  # s->c: ct[û, σ']
    MLP_IN = "mlp_in"  # c->s: ct(m)
    REFRESH = "refresh"  # s->c: ct(h'' + ρ), masked for the refresh
    REFRESHED = "refreshed"  # c->s: ct(h'' + ρ) re-encrypted at the layer-start level
    FINAL = "final"  # s->c: ct(h_L)


class Tag:
    H_IN = "h_in"
    SCORES_SIGMA = "scores_sigma"
    SIGMA = "sigma"  # σ alone: a prefill position that ends at the last layer's KV append
    W = "softmax_w"
    U_SIGMA2 = "u_sigma2"
    MASKED_H = "masked_h"
    M = "m"
    H_REFRESHED = "h_refreshed"
    H_FINAL = "h_final"


@dataclass(frozen=True)
class Levels:
    """Where each value lives (see the module docstring)."""

    m: int = 4
    h: int = 7
    kv: int = 5  # values (multiplied by the expanded weights at 5)
    w: int = 6
    h_prime: int = 2  # h' and h'' (the refresh mask level)
    scores_download: int = 1
    mlp_download: int = 0
    final_download: int = 1

    @property
    def keys(self) -> int:
        """Keys are only ever used one level under the values (against q̂ switched to 4):
        stored there, each chunk is 5/6 of the bytes and needs no switch per use."""
        return self.kv - 1

    @property
    def wqkv(self) -> int:
        return self.h

    @property
    def wo(self) -> int:
        return self.kv - 1

    @property
    def wgu(self) -> int:
        return self.h_prime

    @property
    def wdown(self) -> int:
        return self.m


LEVELS = Levels()


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


@dataclass
class LayerWeights:
    """Plaintext weights of one block with the RMSNorm gains folded in (float64)."""

    index: int
    w_qkv: np.ndarray  # (qdim + 2*kv_dim, d): [Π W_q; W_k; W_v] diag(γ1), Π: head-slot order
    w_o: np.ndarray  # (d, q): W_o Π^T (its input â is in head-slot order)
    w_gu: np.ndarray  # (2F, d): [W_gate; W_up] diag(γ2)
    w_down: np.ndarray  # (d, F)


def layer_weights_from_tensors(tensors: dict, cfg, index: int) -> LayerWeights:
    p = f"model.layers.{index}."

    def t(name):
        return tensors[p + name].detach().double().numpy()

    g1, g2 = t("input_layernorm.weight"), t("post_attention_layernorm.weight")
    hd = cfg.head_dim
    order = dims_of(cfg, PROTECTED_PARAMS.slot_count).head_order  # head slot g -> query head
    lanes = (order[:, None] * hd + np.arange(hd)[None, :]).ravel()
    wq, wk, wv = t("self_attn.q_proj.weight"), t("self_attn.k_proj.weight"), t("self_attn.v_proj.weight")
    w_qkv = np.vstack([wq[lanes], wk, wv]) * g1[None, :]
    w_gu = np.vstack([t("mlp.gate_proj.weight"), t("mlp.up_proj.weight")]) * g2[None, :]
    return LayerWeights(index, w_qkv, t("self_attn.o_proj.weight")[:, lanes], w_gu, t("mlp.down_proj.weight"))


def rope_cos_sin(cfg, position: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of one position over head_dim lanes, exactly as ``LlamaModel`` computes them."""
    import torch

    from veil.engine.model import RotaryEmbedding

    rot = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
    cos, sin = rot.cos_sin(torch.tensor([position]), torch.float32)
    return cos[0].double().numpy(), sin[0].double().numpy()


def active_positions(layer: int, last: int, count: int) -> list[int]:
    """The span positions (0..count-1) that go past their KV append at ``layer`` of a protected
    range ending at ``last``: all of them, except at the last layer, where only the span's last
    position does (the others' outputs feed no later layer and no logits; their keys, values and
    σ are all the future needs). Server and client both follow this rule."""
    return list(range(count)) if layer + 1 < last else [count - 1]


@functools.cache
def score_lane_groups(n_chunks: int, log_hd: int) -> tuple[tuple[int, int], ...]:
    """Groups ``(chunks, j)`` of the shared lane sums of the scores (``shared_lane_sums``),
    in lane order: a group of ``C`` chunks with ``2^j >= C`` costs ``C*j`` rotations at level 3
    and ``(C-1) + (log_hd-j)`` at level 2, and each group after the first a join at level 1.
    Every group but the last is a power of two (the joins rotate by its size). The cheapest
    split by a time model, by exhaustive recursion (8 chunks: 4 + 4, 9: 2 + 4 + 3)."""

    def single(n: int) -> tuple[int, int]:
        return n, max(0, (n - 1).bit_length())

    def cost(groups) -> float:
        # ms, measured on the 2-core dev CPU (N=16384, a throwaway microbench): a rotation at level
        # 3 (halvings before the class mask) 6.5, at level 2 (chunk joins, last halvings) 4.4,
        # a mask + rescale 1.4, a group join at level 1 2.7
        return sum(6.5 * n * j + 4.4 * ((n - 1) + (log_hd - j)) + 1.4 for n, j in groups) + 2.7 * (len(groups) - 1)

    best = (single(n_chunks),)
    e = 0
    while (1 << e) < n_chunks:
        cand = ((1 << e, e),) + score_lane_groups(n_chunks - (1 << e), log_hd)
        if cost(cand) < cost(best):
            best = cand
        e += 1
    return best


def score_lane_rotations(n_chunks: int, log_hd: int) -> int:
    """Rotations of the scores' lane sums for ``n_chunks`` key chunks."""
    groups = score_lane_groups(n_chunks, log_hd)
    return sum(n * j + (n - 1) + (log_hd - j) for n, j in groups) + len(groups) - 1


def shared_lane_sums(be, prods: list, valid: list[int], dims: LayoutDims, select, download_scale: float):
    """Scores download from the chunk products ``q ⊙ K_c`` (one level): ``Σ_lanes / sqrt(hd)``
    of chunk ``c`` at lane ``c`` of each head, every other slot zero; two levels.

    The 64-lane sums are shared between the chunks of a group: each chunk's product gets the
    first j halvings of its lane sum (rotations 1..2^(j-1)), a 0/1 mask keeps the lanes that
    are multiples of 2^j (2^j >= chunks in the group; also zero for positions > t: ``valid``
    blocks) and chunk c moves to lane offset c; after adding the chunks the last 6-j halvings
    (rotations 2^j..32) finish every chunk at once: lane c only ever meets lanes of its own
    residue class mod 2^j. A group of C chunks costs C*j + (C-1) + (6-j) rotations instead of
    6C + (C-1). ``score_lane_groups`` splits the chunks into groups where that is cheaper;
    each group is masked at ``download_scale`` on its own and the groups are joined one level
    lower. ``select(ct, make_mask, target_scale, cache_key)`` applies a 0/1 mask (one level).
    """
    hd, heads = dims.head_dim, dims.heads
    log_hd = hd.bit_length() - 1
    if len(prods) > hd:
        raise ValueError(f"{len(prods)} chunks exceed {hd} lanes")  # max_positions prevents it
    groups = score_lane_groups(len(prods), log_hd)
    parts, base = [], 0
    for n, j in groups:
        kept = []
        for ci in range(base, base + n):
            prod = prods[ci]
            for st in range(j):
                prod = be.add(prod, be.rotate(prod, 1 << st))

            def class_mask(v=valid[ci], j=j):
                mask = np.zeros(dims.slots)
                for bi in range(v):
                    mask[BLOCK * bi + hd * np.arange(heads)[:, None] + np.arange(0, hd, 1 << j)[None, :]] = 1.0
                return mask

            kept.append(select(prod, class_mask, None, ("lane_class", j, valid[ci])))
        part = kept[-1]
        for i in range(n - 2, -1, -1):  # chunk base+i at lane offset i
            part = be.add(be.rotate(part, -1), kept[i])
        for st in range(j, log_hd):
            part = be.add(part, be.rotate(part, 1 << st))

        def score_mask(n=n):  # every block: the class masks already zeroed positions > t
            mask = np.zeros(dims.slots)
            for bi in range(dims.per_chunk):
                mask[BLOCK * bi + hd * np.arange(heads)[:, None] + np.arange(n)[None, :]] = 1 / np.sqrt(hd)
            return mask

        parts.append(select(part, score_mask, download_scale, ("scores", n)))
        base += n
    scores = parts[-1]
    for i in range(len(parts) - 2, -1, -1):  # group i+1 starts groups[i][0] lanes after group i
        scores = be.add(parts[i], be.rotate(scores, -groups[i][0]))
    return scores


def window_sum(be, ct, width: int):
    """Slot i gets Σ ct[i .. i+width) (cyclic): doubling windows (log2 of width's top bit
    rotations), joined at each further set bit of ``width`` by one more (576 = 512 + 64: 10).
    Slots whose window runs past the data hold partial sums: callers keep whole windows only."""
    if width < 1:
        raise ValueError(f"window width must be at least 1, got {width}")
    run, acc, st = ct, None, 1  # run: windows of length st; acc: of width's bits below st
    while True:
        if width & st:  # run followed by acc: windows of length width mod 2st
            acc = run if acc is None else be.add(run, be.rotate(acc, st))
        if 2 * st > width:
            return acc
        run = be.add(run, be.rotate(run, st))
        st *= 2


def broadcast_lane(be, e, lane: int, period: int):
    """``e`` zero outside the lanes ``≡ lane (mod period)`` (``lane < period``, a power of two)
    -> every slot holds the value of that lane of its period: log2(period) doublings with
    signed steps, ``+2^i`` where bit i of ``lane`` is set, else ``-2^i``. The offsets the sums
    reach are then exactly ``[lane - period + 1, lane]``: every slot of a period reads its lane
    and nothing crosses into the next period (or head), with no rotation to lane 0 first."""
    st = 1
    while st < period:
        e = be.add(e, be.rotate(e, st if lane & st else -st))
        st *= 2
    return e


def dims_of(cfg, slots: int) -> LayoutDims:
    dims = LayoutDims(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, slots)
    dims.check()
    return dims


#: Slot layout of each product (``veil.crypto.backend.MatvecPlan``). W_down (d x F, wide) uses
#: the hybrid diagonal layout: half the plaintexts and 11 fewer rotations than "folded".
MATRIX_LAYOUTS = {"wqkv": "folded", "wo": "folded", "wgu": "folded", "wdown": "wide"}


def matrix_shapes(dims: LayoutDims) -> dict[str, tuple[int, int]]:
    """(rows, cols) of W_qkv, W_o, W_gate|up and W_down."""
    return {"wqkv": (dims.qdim + 2 * dims.kv_dim, dims.d), "wo": (dims.d, dims.qdim), "wgu": (2 * dims.ffn, dims.d),
            "wdown": (dims.d, dims.ffn)}


def input_spans(dims: LayoutDims) -> dict[str, int]:
    """Slots over which each product's input is periodic: W_o's input (the weighted values)
    is exact on ``value_span`` slots only (see ``veil.crypto.layouts``), and the inputs the
    server replicates itself (h for W_qkv, h' for W_gate|up) hold whole copies only."""
    whole = dims.copies * dims.d
    return {"wqkv": whole, "wo": dims.value_span, "wgu": whole, "wdown": dims.slots}


def required_rotation_steps(cfg, params=PROTECTED_PARAMS) -> list[int]:
    """Every Galois step the executor uses (the client generates exactly these keys)."""
    from veil.crypto.backend import plan_matvec

    dims = dims_of(cfg, params.slot_count)
    steps: set[int] = set()
    for name, (rows, cols) in matrix_shapes(dims).items():
        steps |= set(plan_matvec(rows, cols, input_spans(dims)[name], MATRIX_LAYOUTS[name], N1).rotation_steps)
    hd = dims.head_dim
    steps |= {hd // 2, -(hd // 2)}  # RoPE
    steps |= {dims.kv_dim, 2 * dims.kv_dim - dims.value_offset}  # KV lanes -> head slots, alignment
    steps |= {-dims.qdim * (1 << i) for i in range(dims.value_shifts.bit_length() - 1)}  # value blocks
    steps |= {-BLOCK * (1 << i) for i in range((dims.per_chunk - 1).bit_length())}  # blocks
    steps |= {1 << i for i in range(hd.bit_length() - 1)}  # lane sums, weight broadcast
    steps |= {-(1 << i) for i in range(hd.bit_length() - 1)}  # weight broadcast, score lanes
    steps |= {1 << i for i in range(BLOCK.bit_length() - 1)}  # cyclic slot sums (with -BLOCK*2^i)
    steps |= {1 << i for i in range(dims.d.bit_length())}  # σ window sum (window_sum of width d)
    steps |= set(replicate_rotation_steps(dims.d, dims.copies))
    steps |= set(replicate_rotation_steps(BLOCK, dims.per_chunk))
    half = dims.slots // 2
    return sorted({s % dims.slots if s % dims.slots < half else s % dims.slots - dims.slots for s in steps})


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

_OP_KIND = {
    "matvec": "matvec",
    "baby_steps": "matvec",
    "multiply": "ctct",
    "relinearize": "ctct",
    "rotate": "rotations",
    "replicate": "rotations",
    "mask_for_refresh": "refresh",
    "unmask_refresh": "refresh",
    "rerandomize": "flooding",
    "serialize": "serialization",
    "deserialize": "serialization",
}


class TimedBackend:
    """Wraps a backend; accumulates wall time per op kind (matvec, ctct, rotations, refresh,
    flooding, serialization, other)."""

    def __init__(self, backend: HEBackend, share: TimedBackend | None = None) -> None:
        self._be = backend
        self.times: dict[str, float] = share.times if share else defaultdict(float)
        self.counts: dict[str, int] = share.counts if share else defaultdict(int)
        self.matvec_by_shape: dict[str, float] = share.matvec_by_shape if share else defaultdict(float)

    @property
    def inner(self) -> HEBackend:
        return self._be

    def sharing(self, backend: HEBackend) -> TimedBackend:
        """Another backend (a session's key set) whose time adds to these counters."""
        return TimedBackend(backend, share=self)

    def __getattr__(self, name):
        attr = getattr(self._be, name)
        if not callable(attr):
            return attr
        kind = _OP_KIND.get(name, "other")

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return attr(*a, **kw)
            finally:
                dt = time.perf_counter() - t
                self.times[kind] += dt
                self.counts[name] += 1
                if name == "matvec":  # per product, e.g. matvec_by_shape["576x1536@9"]
                    m = a[0]
                    self.matvec_by_shape[f"{m.rows}x{m.cols}@{m.level}"] += dt

        return timed

    def reset(self) -> None:
        self.times.clear()
        self.counts.clear()
        self.matvec_by_shape.clear()


# ---------------------------------------------------------------------------------------------
# Per-layer prepared state
# ---------------------------------------------------------------------------------------------


class ProtectedLayer:
    """The encoded matrices of one block, each at the level where it is used."""

    def __init__(self, backend: HEBackend, weights: LayerWeights, dims: LayoutDims, levels: Levels = LEVELS):
        self.index = weights.index
        be = backend
        spans = input_spans(dims)

        def encode(name: str, w: np.ndarray, level: int) -> EncodedMatrix:
            return be.encode_matrix(w, level, N1, MATRIX_LAYOUTS[name], max_input_span=spans[name])

        self.wqkv: EncodedMatrix = encode("wqkv", weights.w_qkv, levels.wqkv)
        self.wo: EncodedMatrix = encode("wo", weights.w_o, levels.wo)
        self.wgu: EncodedMatrix = encode("wgu", weights.w_gu, levels.wgu)
        self.wdown: EncodedMatrix = encode("wdown", weights.w_down, levels.wdown)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in (self.wqkv, self.wo, self.wgu, self.wdown))


def ciphertext_bytes(backend, ct: Ciphertext) -> int:
    """Server memory of a two-polynomial ciphertext at its level (the KV cache's accounting)."""
    return 2 * (backend.level(ct) + 1) * backend.params.poly_modulus_degree * 8


@dataclass
class LayerKV:
    keys: list = field(default_factory=list)  # chunk ciphertexts at Levels.keys
    values: list = field(default_factory=list)  # at Levels.kv


@dataclass
class ProtectedSession:
    """One conversation: encrypted KV cache per layer and the protocol state machine.

    A step covers a *span* of ``count`` consecutive positions from ``position`` (one for a
    decode step, up to ``MAX_SPAN`` for a prefill step). Per-position state is keyed by the
    position's index in the span."""

    id: str
    kv: dict[int, LayerKV]
    max_positions: int
    max_kv_bytes: int
    length: int = 0  # positions fully processed
    step: int = -1  # last accepted client step id
    expect: str = MsgKind.TOKEN
    layer: int = 0
    position: int = 0  # first position of the span in flight
    count: int = 1  # positions in the span
    # clean replicated h (level 7), after WEIGHTS h' (level 2), of the span's active positions
    h: dict[int, Ciphertext] = field(default_factory=dict)
    refresh_mask: dict[int, RefreshMask] = field(default_factory=dict)  # ρ of h'' awaiting REFRESHED
    kv_bytes: int = 0
    be: TimedBackend | None = field(default=None, repr=False)  # evaluates with this session's keys


# ---------------------------------------------------------------------------------------------
# The executor
# ---------------------------------------------------------------------------------------------


class ProtectedExecutor:
    """Server half of the protected protocol for layers ``[first, last)``."""

    def __init__(
        self,
        backend: HEBackend,
        cfg,
        weights: Iterable[LayerWeights],
        *,
        levels: Levels = LEVELS,
        max_positions: int | None = None,
        max_kv_bytes: int = 8 << 30,
        max_kv_bytes_total: int = 32 << 30,
    ) -> None:
        if backend.has_secret_key:
            raise ValueError("the server's backend must not hold a secret key")
        self.be = TimedBackend(backend)
        self.cfg = cfg
        self.levels = levels
        self.dims = dims_of(cfg, backend.params.slot_count)
        # one layer's float64 weights at a time: a generator keeps 0.9 GB of them (28 layers)
        # from sitting next to the encoded plaintexts at the peak
        self.layers = [ProtectedLayer(backend, w, self.dims, levels) for w in weights]
        if not self.layers:
            raise ValueError("no layers")
        self.first = self.layers[0].index
        self.last = self.layers[-1].index + 1
        if [layer.index for layer in self.layers] != list(range(self.first, self.last)):
            raise ValueError("layers must be contiguous")
        self.max_positions = min(max_positions or self.dims.max_positions, self.dims.max_positions)
        self.max_kv_bytes = max_kv_bytes
        self.max_kv_bytes_total = max_kv_bytes_total
        self.sessions: dict[str, ProtectedSession] = {}
        self.scale = backend.params.scale
        self.params_id = backend.params.id
        self._primes: dict[int, float] = {}
        # encoded 0/1 masks and constants, keyed by (what, level, scale): they depend on no
        # key and no session, and encoding one costs an FFT and an NTT per prime
        self._plains: dict[tuple, object] = {}
        # RoPE's cos/±sin plaintexts by position: every layer of a token (or of a prefill span)
        # multiplies by the same six, so the last MAX_SPAN positions' stay encoded (~5.5 MB
        # each at level 6) instead of 6 encodes per layer (least recently used dropped first)
        self._rope_plains: OrderedDict[tuple, dict] = OrderedDict()

    @classmethod
    def from_checkpoint(cls, backend: HEBackend, ckpt, first: int, last: int, **kw) -> ProtectedExecutor:
        ws = (layer_weights_from_tensors(ckpt.tensors, ckpt.config, i) for i in range(first, last))
        return cls(backend, ckpt.config, ws, **kw)

    @property
    def encoded_bytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    # ---- sessions --------------------------------------------------------------------------
    def new_session(self, backend: HEBackend | None = None, session_id: str | None = None) -> ProtectedSession:
        """A session evaluated under ``backend``'s public material (the client's evaluation keys;
        default: the executor's own backend). Any backend of the same parameter set works: the
        encoded weights do not depend on keys, so tenants with different keys share them."""
        if backend is not None:
            if backend.has_secret_key:
                raise ValueError("the server's backend must not hold a secret key")
            if backend.params.id != self.params_id:
                raise ValueError(f"session backend is {backend.params.id!r}, executor {self.params_id!r}")
        sid = session_id or secrets.token_urlsafe(16)
        if sid in self.sessions:
            raise ValueError("session id in use")
        be = self.be if backend is None else self.be.sharing(backend)
        s = ProtectedSession(sid, {i: LayerKV() for i in range(self.first, self.last)}, self.max_positions,
                             self.max_kv_bytes, be=be)
        self.sessions[sid] = s
        return s

    def drop_session(self, session_id: str) -> None:
        """Forget a session: its encrypted KV cache and refresh masks are released."""
        self.sessions.pop(session_id, None)

    @property
    def kv_bytes_total(self) -> int:
        return sum(s.kv_bytes for s in self.sessions.values())

    def handle(self, msg: ProtectedMessage) -> ProtectedMessage:
        """Process one client message and return the server's reply."""
        s = self.sessions.get(msg.session_id)
        if s is None:
            raise UnknownSession("unknown session")
        if msg.version != PROTOCOL_VERSION:
            raise MessageError(f"protocol version {msg.version} not supported")
        if msg.params_id != self.params_id:
            raise MessageError(f"message for parameter set {msg.params_id!r}, session uses {self.params_id!r}")
        if msg.step <= s.step:
            raise ProtocolError(f"step {msg.step} replayed or out of order (last {s.step})")
        if msg.kind != s.expect:
            raise ProtocolError(f"expected a {s.expect!r} message, got {msg.kind!r}")
        if msg.kind == MsgKind.TOKEN:
            if msg.position != s.length or msg.layer != self.first:
                raise ProtocolError("token message for the wrong position or layer")
            if not 1 <= msg.count <= MAX_SPAN:
                raise MessageError(f"a step carries 1..{MAX_SPAN} positions, not {msg.count}")
            if s.length + msg.count > s.max_positions:
                raise LimitExceeded(f"context would exceed max_protected_context={s.max_positions} positions")
        elif msg.layer != s.layer or msg.position != s.position or msg.count != s.count:
            raise ProtocolError("message for the wrong layer or positions")
        be = s.be
        if msg.kind == MsgKind.TOKEN:
            hs = self._load_all(be, msg, Tag.H_IN, range(msg.count), self.levels.h)
            reply = self._start_layer(s, self.first, msg.position, hs, msg.step)
        elif msg.kind == MsgKind.WEIGHTS:
            reply = self._attend(s, msg)
        elif msg.kind == MsgKind.MLP_IN:
            reply = self._finish_layer(s, msg)
        else:
            reply = self._next_layer(s, msg)
        s.step = msg.step
        return reply

    def active(self, layer: int, count: int) -> list[int]:
        return active_positions(layer, self.last, count)

    def _load(self, be, payload: CtPayload, level: int) -> Ciphertext:
        if payload.level != level:
            raise MessageError(f"{payload.tag}: level {payload.level}, expected {level}")
        return be.deserialize(payload.data, level=level, scale=self.scale)

    def _load_all(self, be, msg: ProtectedMessage, tag: str, tokens, level: int) -> dict[int, Ciphertext]:
        """Every ``tag`` ciphertext of the span, validated before any work (a bad one leaves the
        session as it was)."""
        try:
            payloads = msg.payloads({i: tag for i in tokens})
        except WireError as e:
            raise MessageError(str(e)) from None
        return {p.token: self._load(be, p, level) for p in payloads}

    def _send(self, be, ct: Ciphertext, tag: str, level: int, token: int = 0) -> CtPayload:
        """Mod-switch to the download level, re-randomize and flood: noise std
        ``scale * 2^-FLOOD_BELOW_SCALE`` coefficient units, i.e. ~2^-11.5 absolute per slot."""
        ct = be.mod_switch_to(ct, level) if be.level(ct) > level else ct
        ct = be.rerandomize(ct, float(np.log2(be.scale(ct))) - FLOOD_BELOW_SCALE)
        return CtPayload(tag, level, be.serialize(ct), token)

    # ---- helpers -----------------------------------------------------------------------------
    def _prime(self, be, ct: Ciphertext) -> float:
        """The prime a rescale at ``ct``'s level divides by (probed once per level through the
        backend interface: a product with the constant 1 encoded at scale 1)."""
        level = be.level(ct)
        q = self._primes.get(level)
        if q is None:
            one = be.encode(np.ones(self.dims.slots), level, 1.0)
            q = be.scale(ct) / be.scale(be.multiply_plain(ct, one))
            self._primes[level] = q
        return q

    def _plain(self, be, key, level: int, scale: float, make):
        """The plaintext ``make()`` encoded at ``level`` and ``scale``, encoded once."""
        k = (key, level, scale)
        pt = self._plains.get(k)
        if pt is None:
            pt = self._plains[k] = be.encode(make(), level, scale)
        return pt

    def _select(self, be, ct: Ciphertext, values, target: float | None = None, key=None) -> Ciphertext:
        """``values ⊙ ct`` (one level), landing on scale ``target`` (default Δ).

        The plaintext is encoded at scale ``target * q / scale(ct)``: the larger the target,
        the smaller its encoding error ε (~2^5.2 / plaintext scale), which multiplies whatever
        the masked-out slots held. Download masks use ``DOWNLOAD_SCALE`` so that this residue
        sits far below the flooding noise."""
        target = self.scale if target is None else target
        level, scale = be.level(ct), target * self._prime(be, ct) / be.scale(ct)
        if key is None:
            return be.multiply_plain(ct, be.encode(values, level, scale))
        make = values if callable(values) else (lambda: values)
        return be.multiply_plain(ct, self._plain(be, key, level, scale, make))

    def _sum_all(self, be, ct: Ciphertext) -> Ciphertext:
        """Cyclic sum of all slots into every slot (log2(slots) rotations): no partial sums."""
        st = 1
        while st < self.dims.slots:
            ct = be.add(ct, be.rotate(ct, st if st < BLOCK else -st))
            st *= 2
        return ct

    def _rotate_blocks(self, be, ct: Ciphertext, blocks: int, width: int = BLOCK) -> Ciphertext:
        """Rotate right by ``blocks * width`` slots (power-of-two steps)."""
        i = 0
        while blocks:
            if blocks & 1:
                ct = be.rotate(ct, -width * (1 << i))
            blocks >>= 1
            i += 1
        return ct

    def _mask(self, ranges: list[tuple[int, int]], value: float = 1.0) -> np.ndarray:
        v = np.zeros(self.dims.slots)
        for a, b in ranges:
            v[a:b] = value
        return v

    def _repeat_kv(self, be, x: Ciphertext) -> Ciphertext:
        """``x`` zero outside ``[lo, lo + kv_dim)`` -> ``group`` copies on ``[lo - (group-1)*kv_dim,
        lo + kv_dim)``, by left rotations of one step (a key the executor needs anyway)."""
        acc = cur = x
        for _ in range(self.dims.group - 1):
            cur = be.rotate(cur, self.dims.kv_dim)
            acc = be.add(acc, cur)
        return acc

    # ---- segment A: layer start -> scores download -----------------------------------------
    def _start_layer(self, s: ProtectedSession, layer: int, t0: int, hs: dict[int, Ciphertext],
                     step: int) -> ProtectedMessage:
        """``hs``: the layer inputs of the span positions ``t0 + i``, clean and replicated
        (``hidden_layout``) at level 7. Every position's key and value are appended before any
        score is computed, so position ``t0 + i`` sees its span predecessors; the class masks
        of the score sums drop the positions after it (the causal mask)."""
        be, L, count = s.be, self.layers[layer - self.first], len(hs)
        kv = s.kv[layer]
        keys, values = list(kv.keys), list(kv.values)
        added = 0
        active = self.active(layer, count)
        q_hats = {}
        for i, h in hs.items():
            q_hat, k_hat, v_hat = self._qkv(be, L, h, t0 + i, want_q=i in active)
            if q_hat is not None:
                q_hats[i] = q_hat
            c, b = divmod(t0 + i, self.dims.per_chunk)
            k_hat, v_hat = self._rotate_blocks(be, k_hat, b), self._rotate_blocks(be, v_hat, b, self.dims.qdim)
            if c < len(keys):
                keys[c], values[c] = be.add(keys[c], k_hat), be.add(values[c], v_hat)
            else:
                keys.append(k_hat)
                values.append(v_hat)
                added += ciphertext_bytes(be, k_hat) + ciphertext_bytes(be, v_hat)
        if s.kv_bytes + added > s.max_kv_bytes:
            raise LimitExceeded(f"encrypted KV cache of this session would exceed max_protected_kv_bytes="
                                f"{s.max_kv_bytes}")
        if added and self.kv_bytes_total + added > self.max_kv_bytes_total:
            raise CapacityExceeded(f"encrypted KV cache of all sessions would exceed max_protected_kv_bytes_total="
                                   f"{self.max_kv_bytes_total}")
        payloads = []
        for i, h in hs.items():
            scores = self._scores(be, q_hats[i], keys, t0 + i) if i in active else None
            out = self._sigma(be, h, scores)
            tag = Tag.SCORES_SIGMA if scores is not None else Tag.SIGMA
            payloads.append(self._send(be, out, tag, self.levels.scores_download, token=i))

        # commit
        kv.keys, kv.values = keys, values
        s.kv_bytes += added
        s.h = {i: hs[i] for i in active}
        s.layer, s.position, s.count, s.expect = layer, t0, count, MsgKind.WEIGHTS
        return ProtectedMessage(MsgKind.SCORES, s.id, step, layer, t0, tuple(payloads), self.params_id, count=count)

    def _qkv(self, be, L: ProtectedLayer, h: Ciphertext, t: int, want_q: bool):
        """q̂ (or None), k̂ and v̂ of position ``t``: k̂ at [0, q), v̂ in the value frame, both
        repeated for the head slots and not yet moved to their block of the KV chunk."""
        dims = self.dims
        hd, q, kvd = dims.head_dim, dims.qdim, dims.kv_dim
        y = be.matvec(L.wqkv, h)  # 6, folded: y_q at [0, q), y_k at [q, q + kvd), y_v after
        y_up, y_dn = be.rotate(y, hd // 2), be.rotate(y, -(hd // 2))
        plains = self._rope(be, t, be.level(y), self._prime(be, y))

        def rope(off: int) -> Ciphertext:
            acc = None
            for src, pt in zip((y, y_up, y_dn), plains[off], strict=True):
                if pt is None:  # sin = 0 at position 0
                    continue
                prod = be.multiply_plain(src, pt, rescale=False)
                acc = prod if acc is None else be.add(acc, prod)
            return be.rescale(acc)

        q_hat = rope(0) if want_q else None  # [0, q), level 5
        # KV lanes repeated for the head slots (slot g reads KV head g % kv_heads), then moved
        # to [0, q) (keys) and to the value block frame (values): 3 rotations each, after the
        # switch to the keys' level (a rotation at 4 costs ~3/4 of one at 5)
        k_hat = be.rotate(self._repeat_kv(be, be.mod_switch_to(rope(q), self.levels.keys)), kvd)
        v_mask = self._plain(be, "v_lanes", be.level(y), self._prime(be, y), lambda: self._mask([(q + kvd, q + 2 * kvd)]))
        v_hat = be.rotate(self._repeat_kv(be, be.multiply_plain(y, v_mask)), 2 * kvd - dims.value_offset)
        return q_hat, k_hat, v_hat

    def _rope(self, be, t: int, level: int, scale: float) -> dict[int, list]:
        """RoPE's factors of position ``t`` encoded at ``level`` and ``scale``: lane offset (0
        for q, q for k) -> [cos (with y), -sin on the low half-heads (with rot(y, +hd/2)), sin on
        the high half-heads (with rot(y, -hd/2))], None where all zero (sin at position 0).
        Kept for the last MAX_SPAN positions: the layers of a token (or span) all use them."""
        key = (t, level, scale)
        plains = self._rope_plains.get(key)
        if plains is not None:
            self._rope_plains.move_to_end(key)
            return plains
        dims = self.dims
        hd, q = dims.head_dim, dims.qdim
        cos, sin = rope_cos_sin(self.cfg, t)
        lane = np.arange(q) % hd
        factors = (np.tile(cos, q // hd),
                   np.where(lane < hd // 2, -np.tile(sin, q // hd), 0.0),
                   np.where(lane >= hd // 2, np.tile(sin, q // hd), 0.0))
        plains = {}
        for off, n in ((0, q), (q, dims.kv_dim)):
            plains[off] = []
            for vals in factors:
                v = np.zeros(dims.slots)
                v[off : off + n] = vals[:n]
                plains[off].append(be.encode(v, level, scale) if np.any(v) else None)
        self._rope_plains[key] = plains
        while len(self._rope_plains) > MAX_SPAN:
            self._rope_plains.popitem(last=False)
        return plains

    def _scores(self, be, q_hat: Ciphertext, keys: list, t: int) -> Ciphertext:
        """ŝ_tj / sqrt(hd) for all cached j <= t, chunk c at lane c of each head (level 1)."""
        dims = self.dims
        # switched before its 3 replicating rotations: cheaper at the keys' level
        q_rep = be.replicate(be.mod_switch_to(q_hat, self.levels.keys), BLOCK, dims.per_chunk)
        n_chunks = t // dims.per_chunk + 1
        valid = [min(dims.per_chunk, t + 1 - ci * dims.per_chunk) for ci in range(n_chunks)]
        prods = [be.multiply(q_rep, keys[ci]) for ci in range(n_chunks)]  # 3

        def select(ct, make, target, key):
            return self._select(be, ct, make, target, key=key)

        return shared_lane_sums(be, prods, valid, dims, select, DOWNLOAD_SCALE)  # 1

    def _sigma(self, be, h: Ciphertext, scores: Ciphertext | None) -> Ciphertext:
        """σ_t / d at slot ``sigma_slot`` (added to the scores when there are any), from a window
        sum of one period of h²: 10 rotations instead of the 13 of a cyclic sum. Only slot
        ``sigma_slot`` is kept, so the partial sums elsewhere are masked away (at DOWNLOAD_SCALE)."""
        dims = self.dims
        h_low = be.mod_switch_to(h, self.levels.scores_download + 2)
        sq = window_sum(be, be.multiply(h_low, h_low), dims.d)  # 2
        def sig():  # built once: _select caches the encoded mask under its key
            v = np.zeros(dims.slots)
            v[dims.sigma_slot] = 1.0 / dims.d
            return v

        out = self._select(be, sq, sig, DOWNLOAD_SCALE, key="sigma")  # 1
        return out if scores is None else be.add(scores, out)

    # ---- segment B: weights -> MLP download ----------------------------------------------------
    def _attend(self, s: ProtectedSession, msg: ProtectedMessage) -> ProtectedMessage:
        be, L = s.be, self.layers[s.layer - self.first]
        ws = self._load_all(be, msg, Tag.W, sorted(s.h), self.levels.w)
        h_primes, payloads = {}, []
        for i, w in ws.items():
            h_primes[i], out = self._attend_one(be, L, s.kv[s.layer], s.h[i], w, s.position + i)
            payloads.append(self._send(be, out, Tag.U_SIGMA2, self.levels.mlp_download, token=i))
        s.h, s.expect = h_primes, MsgKind.MLP_IN
        return ProtectedMessage(MsgKind.MLP, s.id, msg.step, s.layer, s.position, tuple(payloads), self.params_id,
                                count=s.count)

    def _attend_one(self, be, L: ProtectedLayer, kv: LayerKV, h: Ciphertext, w: Ciphertext, t: int):
        """Weighted values, W_o and the residual for position ``t``; returns (h', [û, σ'])."""
        dims = self.dims
        d, hd = dims.d, dims.head_dim
        n_chunks = t // dims.per_chunk + 1
        period = 1 << max(0, (n_chunks - 1).bit_length())
        lanes = np.arange(hd)
        acc = None
        for ci in range(n_chunks):
            valid = min(dims.per_chunk, t + 1 - ci * dims.per_chunk)

            def expand_mask(valid=valid, r=ci):  # ci < period: chunk ci sits at lanes ≡ ci
                mask = np.zeros(dims.slots)
                for bi in range(valid):
                    for h in range(dims.heads):
                        mask[dims.value_base(bi) + hd * h + lanes[lanes % period == r]] = 1.0
                return mask

            pt = self._plain(be, ("expand", period, valid, ci), be.level(w), self._prime(be, w), expand_mask)
            e = broadcast_lane(be, be.multiply_plain(w, pt), ci, period)  # 5
            # unrelinearized: the sum needs one key switch instead of one per chunk
            prod = be.multiply(e, kv.values[ci], rescale=False, relinearize=False)
            acc = prod if acc is None else be.add(acc, prod)
        a = be.relinearize(be.rescale(acc))  # 4 (relinearized one level lower: cheaper)
        st = 1
        while st < dims.value_shifts:  # shift sum: â with period q on [0, value_span)
            a = be.add(a, be.rotate(a, -dims.qdim * st))
            st *= 2
        o = be.matvec(L.wo, a)  # 3, folded
        o = be.replicate(self._select(be, o, self._mask([(0, d)]), key="first_d"), d, dims.copies)  # 2
        h_prime = be.add(be.mod_switch_to(h, be.level(o)), o)
        # σ' and û
        f = dims.ffn
        # σ'/(8d) in every slot: a constant factor, no 0/1 mask (a mask's encoding error times
        # the large 14σ' would spill into the û slots); the client subtracts slot 2F from û
        sq = self._sum_all(be, be.multiply(h_prime, h_prime))  # 1

        def sig():  # built once: _select caches the encoded constant under its key
            return np.full(dims.slots, 1.0 / (d * dims.copies * SIGMA2_DIV))

        u = be.matvec(L.wgu, h_prime)  # 1, folded
        out = be.add(self._select(be, u, self._mask([(0, 2 * f)]), key="first_2f"),
                     self._select(be, sq, sig, key="sigma2"))  # 0
        return h_prime, out

    # ---- segment C: m -> h'' masked for its refresh, or h_L ------------------------------------
    def _finish_layer(self, s: ProtectedSession, msg: ProtectedMessage) -> ProtectedMessage:
        be, d = s.be, self.dims.d
        L = self.layers[s.layer - self.first]
        ms = self._load_all(be, msg, Tag.M, sorted(s.h), self.levels.m)
        downs = {i: be.matvec(L.wdown, m) for i, m in ms.items()}  # 3, wide: partial sums outside [0, d)
        if s.layer + 1 < self.last:
            payloads, masks = [], {}
            for i, down in downs.items():
                y = be.replicate(self._select(be, down, self._mask([(0, d)]), key="first_d"), d, self.dims.copies)  # 2
                h2 = be.add(s.h[i], y)  # h'' at 2: clean, replicated
                masked, masks[i] = be.mask_for_refresh(h2)
                payloads.append(CtPayload(Tag.MASKED_H, be.level(masked), be.serialize(masked), i))
            s.h, s.refresh_mask, s.expect = {}, masks, MsgKind.REFRESHED
            return ProtectedMessage(MsgKind.REFRESH, s.id, msg.step, s.layer, s.position, tuple(payloads),
                                    self.params_id, count=s.count)
        # h_L = h' + W_down m, both cleaned at the download scale (see DOWNLOAD_SCALE)
        only_h = self._mask([(0, d)])
        payloads = []
        for i, down in downs.items():
            h_out = self._select(be, s.h[i], only_h, DOWNLOAD_SCALE, key="first_d")  # 1
            down = self._select(be, down, only_h, DOWNLOAD_SCALE, key="first_d")  # 2
            h_out = be.add(h_out, be.mod_switch_to(down, be.level(h_out)))
            payloads.append(self._send(be, h_out, Tag.H_FINAL, self.levels.final_download, token=i))
        s.length = s.position + s.count
        s.h, s.expect, s.layer = {}, MsgKind.TOKEN, self.first
        return ProtectedMessage(MsgKind.FINAL, s.id, msg.step, self.last, s.position, tuple(payloads),
                                self.params_id, count=s.count)

    # ---- segment D: refreshed h'' -> next layer ------------------------------------------------
    def _next_layer(self, s: ProtectedSession, msg: ProtectedMessage) -> ProtectedMessage:
        be = s.be
        hfs = self._load_all(be, msg, Tag.H_REFRESHED, sorted(s.refresh_mask), self.levels.h)
        hs = {i: be.unmask_refresh(hf, s.refresh_mask[i]) for i, hf in hfs.items()}
        reply = self._start_layer(s, s.layer + 1, s.position, hs, msg.step)  # commits
        s.refresh_mask = {}
        return reply

    def kv_bytes(self, s: ProtectedSession) -> int:
        return s.kv_bytes

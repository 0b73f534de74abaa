"""Several sessions' protected steps run as one: their state stacked into a batch session.

``ProtectedExecutor.handle_batch`` takes steps of the same kind, layer and span length from
different sessions (``step_key`` says which may go together) and runs the executor's ordinary
step code once, on a ``ProtectedSession`` whose ciphertexts are the rows' stacked
(``stack_sessions``) and whose backend is a batch of the rows' key sets (``NativeBatch`` on the
native backend): every Circuit method, written over the backend interface, then evaluates all
rows in one batched computation. ``split_advance`` turns the batch's result back into one
``_Advance`` per row, which the executor commits row by row exactly as after a single step (a
batch that fails commits nothing; the executor then runs its rows one at a time, so one row's
bad ciphertext never fails another's step).

**Rows at different positions.** Sessions rarely stand at the same position, so a batch's
rows may not: the batch's span start and length are then a tuple with one entry per row
(``Rows``), and the few position-dependent pieces of a layer go row by row inside the batched
computation. The RoPE factors and the 0/1 masks of the scores and weights are each row's own
plaintexts stacked; a key's move to its block rotates every row and keeps the rotation only
where the row needs it (``RowBatch.pick_rows``); the stacked cache is padded with zero chunks
up to the longest row's, so every row computes the same number of chunk products (a padded
chunk's are zero and its lanes leave the row's scores untouched). The softmax weights' upload
layout depends on the row's chunk count through its period (``layouts.weights_period``), so a
WEIGHTS step batches only rows of one period. Sessions in a speculative span (verify or undo
state) run alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from veil.crypto.backend import Ciphertext
from veil.crypto.linear import EncodedMatrix
from veil.crypto.row_batch import RowBatch
from veil.protected.kv import LayerKV
from veil.protected.layouts import weights_period
from veil.protected.protocol import MsgKind, ProtectedMessage

__all__ = ["BatchMessage", "Rows", "RowOf", "shift", "rows_of", "step_key", "stack_sessions", "split_advance",
           "stack_matrices", "own_matrix", "held_bytes", "row_bytes", "append_rows"]

#: A batch's per-row value where its rows differ (a span start, a length): one entry per row.
#: Where every row agrees the batch holds a plain int, so a single session never sees a tuple.
Rows = tuple


def shift(t: int | Rows, i: int) -> int | Rows:
    """Position ``t + i`` (of every row)."""
    return tuple(x + i for x in t) if isinstance(t, tuple) else t + i


def rows_of(values) -> int | Rows:
    """One int where every row agrees, else the rows' values."""
    values = tuple(values)
    return values[0] if len(set(values)) == 1 else values


def _row(x, b: int):
    return x[b] if isinstance(x, tuple) else x


def step_key(state, kind: str, layer: int, position: int, count: int, verify: bool, per_chunk: int) -> tuple | None:
    """Steps with equal keys run as one batch; None: this step runs alone. A WEIGHTS step's key
    holds the weights' period of each span position (the upload layout depends on it)."""
    if state.verify or state.undo or verify:
        return None
    periods = ()
    if kind == MsgKind.WEIGHTS:
        periods = tuple(weights_period((position + i) // per_chunk + 1) for i in range(count))
    return (kind, layer, count, periods)


@dataclass(frozen=True)
class BatchMessage:
    """The batch's stand-in for a message: the span every row shares, and each row's own message
    and session (whose backend deserializes that row's upload)."""

    kind: str
    layer: int
    position: int | Rows
    count: int
    rows: tuple[tuple[object, ProtectedMessage], ...]  # (session, message) per row
    verify: bool = False
    session_id: str = "batch"
    step: int = 0


def stack_matrices(be: RowBatch, mats: Sequence[EncodedMatrix]) -> EncodedMatrix:
    """Per-row encodings of one matrix layout (each session's permuted W_gate|up, say) as one."""
    first = mats[0]
    if any(m.plan != first.plan or m.level != first.level or m.plaintexts.keys() != first.plaintexts.keys()
           for m in mats):
        raise ValueError("a batch stacks matrices of one plan and level")
    pts = {u: be.stack_plain([m.plaintexts[u] for m in mats]) for u in first.plaintexts}
    return EncodedMatrix(first.params_id, first.level, first.plan, pts)


class _Stacked:
    """A matrix a batch stacked from its rows' own, shared by the rows' states after the step
    (``RowOf``). Its rows are unstacked once, the first time one is needed alone. It holds no
    backend (a batch's refers to every row's keys, which must go with their session)."""

    def __init__(self, kind: type[RowBatch], matrix: EncodedMatrix, rows: int):
        self.kind, self.matrix, self.rows, self._own = kind, matrix, rows, None

    def row(self, b: int) -> EncodedMatrix:
        if self._own is None:
            m = self.matrix
            parts = {u: self.kind.unstack_plain(pt) for u, pt in m.plaintexts.items()}
            self._own = [EncodedMatrix(m.params_id, m.level, m.plan, {u: r[i] for u, r in parts.items()})
                         for i in range(self.rows)]
        return self._own[b]


@dataclass(frozen=True)
class RowOf:
    """Row ``row`` of a matrix a batch stacked: a session's shuffled W_down, kept in its state
    from its WEIGHTS step to its MLP_IN step. A batch of the same rows in the same order takes the
    stacked matrix back as it is (``_restack``); a row used otherwise is unstacked then
    (``own_matrix``). Unstacking every row at every step cost host time that grew with the batch
    (``benchmarks/results/2026-12-07-w-down-rows``)."""

    stacked: _Stacked
    row: int


def own_matrix(m: EncodedMatrix | RowOf) -> EncodedMatrix:
    """A session's own matrix: ``m`` itself, or its row of a batch's stacked matrix."""
    return m.stacked.row(m.row) if isinstance(m, RowOf) else m


def held_bytes(ms: Iterable[EncodedMatrix | RowOf]) -> int:
    """The memory ``ms`` keep alive: each distinct matrix once, a stacked one whole for any of
    its rows (the rows' own are views of it)."""
    distinct = {}
    for m in ms:
        own = m.stacked.matrix if isinstance(m, RowOf) else m
        distinct[id(own)] = own.nbytes
    return sum(distinct.values())


def row_bytes(m: EncodedMatrix | RowOf) -> int:
    """A row's share of what ``m`` keeps alive: a stacked matrix's bytes split evenly among its
    rows (all of them go with the last row that lets go)."""
    return m.stacked.matrix.nbytes // m.stacked.rows if isinstance(m, RowOf) else m.nbytes


def _restack(be: RowBatch, ms: Sequence[EncodedMatrix | RowOf]) -> EncodedMatrix:
    """The rows' matrices as one: the stacked matrix they came from where they are all its rows,
    in order (the same sessions batched again), else stacked anew."""
    first = ms[0]
    if isinstance(first, RowOf) and first.stacked.rows == len(ms) and all(
            isinstance(m, RowOf) and m.stacked is first.stacked and m.row == b for b, m in enumerate(ms)):
        return first.stacked.matrix
    return stack_matrices(be, [own_matrix(m) for m in ms])


class _StackedKV(dict):
    """Each layer's cache stacked on first use; remembers which rows every stacked chunk came
    from, so a chunk the step leaves unchanged goes back to each row as the row's own object."""

    def __init__(self, be: RowBatch, sessions):
        super().__init__()
        self.be, self.sessions, self.origin, self._rows = be, sessions, {}, {}

    def _stack(self, cts: list[Ciphertext]) -> Ciphertext:
        out = self.be.stack(cts)
        self.origin[id(out)] = (out, cts)
        return out

    def __missing__(self, layer: int) -> LayerKV:
        """The rows' caches stacked, shorter ones padded with zero chunks (``None`` rows)."""
        caches = [s.kv[layer] for s in self.sessions]
        n = max(len(c.keys) for c in caches)
        pad = lambda cts, j: [c[j] if j < len(c) else None for c in cts]  # noqa: E731
        kv = LayerKV([self._stack(pad([c.keys for c in caches], j)) for j in range(n)],
                     [self._stack(pad([c.values for c in caches], j)) for j in range(n)])
        self[layer] = kv
        return kv

    def row(self, ct: Ciphertext, b: int) -> Ciphertext:
        """Row ``b`` of a chunk of the step's result (each new chunk is unstacked once)."""
        kept = self.origin.get(id(ct))
        if kept is None or kept[0] is not ct:
            kept = self.origin[id(ct)] = (ct, self.be.unstack(ct))
        return kept[1][b]


def stack_sessions(session_cls, timed, sessions) -> object:
    """A ``ProtectedSession`` of ``rows = len(sessions)`` whose state and caches hold the rows'
    ciphertexts stacked, evaluated under a batch of their key sets (``HEBackend.batched``)."""
    be = type(sessions[0].be.inner).batched([s.be.inner for s in sessions])
    st = sessions[0].state
    for s in sessions:
        if (s.state.expect, s.state.layer, s.state.count) != (st.expect, st.layer, st.count) \
                or set(s.state.h) != set(st.h) or set(s.state.refresh_mask) != set(st.refresh_mask):
            raise ValueError("rows of a batch stand at different steps")
    h = {i: be.stack([s.state.h[i] for s in sessions]) for i in st.h}
    masks = {i: be.stack_masks([s.state.refresh_mask[i] for s in sessions]) for i in st.refresh_mask}
    downs = {i: _restack(be, [s.state.shuffled_down[i] for s in sessions]) for i in st.shuffled_down}
    state = replace(st, h=h, refresh_mask=masks, shuffled_down=downs,
                    position=rows_of(s.state.position for s in sessions),
                    length=rows_of(s.state.length for s in sessions))
    return session_cls("batch", timed.sharing(be), _StackedKV(be, sessions), state=state,
                       kv_bytes=max(s.kv_bytes for s in sessions), rows=len(sessions))


def split_advance(batch, adv, msgs: Sequence[ProtectedMessage], advance_cls, per_chunk: int) -> list:
    """One ``_Advance`` per row from the batch's (``adv.kv_delta``: per row, or the rows' total
    where they agree). A row keeps the chunks its own positions reach (the rest is padding)."""
    be: RowBatch = batch.be.inner
    rows = be.batch_size
    st = adv.state
    deltas = adv.kv_delta if isinstance(adv.kv_delta, tuple) else None
    if deltas is None and adv.kv_delta % rows:
        raise ValueError("rows of a batch changed their caches by different amounts")
    h = {i: be.unstack(ct) for i, ct in st.h.items()}
    masks = {i: be.unstack_mask(m) for i, m in st.refresh_mask.items()}
    downs = {i: _Stacked(type(be), m, rows) for i, m in st.shuffled_down.items()}
    out = []
    for b, msg in enumerate(msgs):
        state = replace(st, h={i: v[b] for i, v in h.items()}, refresh_mask={i: v[b] for i, v in masks.items()},
                        shuffled_down={i: RowOf(v, b) for i, v in downs.items()},
                        position=_row(st.position, b), length=_row(st.length, b))
        chunks = (state.position + state.count - 1) // per_chunk + 1  # what the span's cache holds
        kv = {layer: LayerKV([batch.kv.row(ct, b) for ct in c.keys[:chunks]],
                             [batch.kv.row(ct, b) for ct in c.values[:chunks]])
              for layer, c in adv.kv.items()}
        cts = tuple(replace(p, data=p.data[b]) for p in adv.reply.cts)
        reply = replace(adv.reply, session_id=msg.session_id, step=msg.step, position=msg.position, cts=cts)
        out.append(advance_cls(reply, state, kv, deltas[b] if deltas else adv.kv_delta // rows))
    return out


def append_rows(be: RowBatch, kv: LayerKV, starts: Rows, blocks: list[tuple[Ciphertext, Ciphertext]],
                per_chunk: int) -> tuple[LayerKV, Rows]:
    """``kv.append_span`` for a batch whose rows start their spans at different positions: row
    r's block i goes into chunk ``(starts[r] + i) // per_chunk`` (the other rows get zero there).
    Returns the new cache and the bytes each row's cache grows by (a chunk the row begins)."""
    out, added = LayerKV(list(kv.keys), list(kv.values)), [0] * len(starts)
    for i, (k_b, v_b) in enumerate(blocks):
        chunks = [(t + i) // per_chunk for t in starts]
        row_bytes = (be.nbytes(k_b) + be.nbytes(v_b)) // len(starts)
        for c in sorted(set(chunks)):
            keep = [x == c for x in chunks]
            k, v = (k_b, v_b) if all(keep) else (be.pick_rows(keep, k_b), be.pick_rows(keep, v_b))
            if c < len(out.keys):
                out.keys[c], out.values[c] = be.add(out.keys[c], k), be.add(out.values[c], v)
            elif c == len(out.keys):
                out.keys.append(k)
                out.values.append(v)
            else:
                raise ValueError(f"chunk {c} after a cache of {len(out.keys)}")
            for r, t in enumerate(starts):
                if keep[r] and (t + i) % per_chunk == 0:  # the row's first position in chunk c
                    added[r] += row_bytes
    return out, tuple(added)

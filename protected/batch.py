"""Several sessions' protected steps run as one: their state stacked into a batch session.

``ProtectedExecutor.handle_batch`` takes steps of the same kind, layer and span from different
sessions (``step_key`` says which may go together) and runs the executor's ordinary step code
once, on a ``ProtectedSession`` whose ciphertexts are the rows' stacked (``stack_sessions``)
and whose backend is a batch of the rows' key sets (``NativeBatch`` on the native backend):
every Circuit method, written over the backend interface, then evaluates all rows in one
batched computation. ``split_advance`` turns the batch's result back into one ``_Advance`` per
row, which the executor commits row by row exactly as after a single step (a batch that fails commits nothing; the executor then runs
its rows one at a time, so one row's bad ciphertext never fails another's step).

Only steps whose circuits are the same Python control flow may share a batch: the same message
kind, layer, span start and length (positions decide the chunk count, masks and RoPE factors).
Sessions in a speculative span (verify or undo state) run alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from veil.crypto.backend import Ciphertext, RowBatch
from veil.crypto.linear import EncodedMatrix
from veil.protected.kv import LayerKV
from veil.protected.protocol import ProtectedMessage

__all__ = ["BatchMessage", "step_key", "stack_sessions", "split_advance", "stack_matrices"]


def step_key(session, msg: ProtectedMessage) -> tuple | None:
    """Steps with equal keys run as one batch; None: this step runs alone (so does every step on
    a backend that cannot batch, e.g. SEAL)."""
    st = session.state
    if st.verify or st.undo or msg.verify or not session.be.inner.supports_batch:
        return None
    return (msg.kind, msg.layer, msg.position, msg.count, st.length)


@dataclass(frozen=True)
class BatchMessage:
    """The batch's stand-in for a message: the span every row shares, and each row's own message
    and session (whose backend deserializes that row's upload)."""

    kind: str
    layer: int
    position: int
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


def _unstack_matrix(be: RowBatch, m: EncodedMatrix) -> list[EncodedMatrix]:
    rows = {u: be.unstack_plain(pt) for u, pt in m.plaintexts.items()}
    return [EncodedMatrix(m.params_id, m.level, m.plan, {u: r[b] for u, r in rows.items()})
            for b in range(be.batch_size)]


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
        caches = [s.kv[layer] for s in self.sessions]
        if len({len(c.keys) for c in caches}) != 1:
            raise ValueError("rows of a batch hold caches of different lengths")
        kv = LayerKV([self._stack([c.keys[j] for c in caches]) for j in range(len(caches[0].keys))],
                     [self._stack([c.values[j] for c in caches]) for j in range(len(caches[0].values))])
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
        if (s.state.expect, s.state.layer, s.state.position, s.state.count, s.state.length) != \
                (st.expect, st.layer, st.position, st.count, st.length) or set(s.state.h) != set(st.h):
            raise ValueError("rows of a batch stand at different steps")
    h = {i: be.stack([s.state.h[i] for s in sessions]) for i in st.h}
    masks = {i: be.stack_masks([s.state.refresh_mask[i] for s in sessions]) for i in st.refresh_mask}
    downs = {i: stack_matrices(be, [s.state.shuffled_down[i] for s in sessions]) for i in st.shuffled_down}
    state = replace(st, h=h, refresh_mask=masks, shuffled_down=downs)
    return session_cls("batch", timed.sharing(be), _StackedKV(be, sessions), state=state,
                       kv_bytes=max(s.kv_bytes for s in sessions), rows=len(sessions))


def split_advance(batch, adv, msgs: Sequence[ProtectedMessage], advance_cls) -> list:
    """One ``_Advance`` per row from the batch's (``adv.kv_delta`` is the rows' total)."""
    be: RowBatch = batch.be.inner
    rows = be.batch_size
    if adv.kv_delta % rows:
        raise ValueError("rows of a batch changed their caches by different amounts")
    st = adv.state
    h = {i: be.unstack(ct) for i, ct in st.h.items()}
    masks = {i: be.unstack_mask(m) for i, m in st.refresh_mask.items()}
    downs = {i: _unstack_matrix(be, m) for i, m in st.shuffled_down.items()}
    out = []
    for b, msg in enumerate(msgs):
        state = replace(st, h={i: v[b] for i, v in h.items()}, refresh_mask={i: v[b] for i, v in masks.items()},
                        shuffled_down={i: v[b] for i, v in downs.items()})
        kv = {layer: LayerKV([batch.kv.row(ct, b) for ct in c.keys], [batch.kv.row(ct, b) for ct in c.values])
              for layer, c in adv.kv.items()}
        cts = tuple(replace(p, data=p.data[b]) for p in adv.reply.cts)
        reply = replace(adv.reply, session_id=msg.session_id, step=msg.step, cts=cts)
        out.append(advance_cls(reply, state, kv, adv.kv_delta // rows))
    return out

"""The server half of the protected protocol: layers ``[first, last)`` on CKKS ciphertexts.

Read it beside ``veil.protected.client``, which mirrors it step for step (the table of steps is
in ``veil.protected.protocol``; the protocol, its levels and who learns what in
docs/PROTOCOL.md). ``handle`` checks a message against its session, runs the step it starts
(``on_token``, ``on_weights``, ``on_mlp_in``, ``on_refreshed``) and only then commits: a step
computes its reply and the session's next state without touching the session, so a message that
fails anywhere — a bad ciphertext, a limit, an HE error — leaves the session exactly as it was.

Each session owns its encrypted KV cache (per layer, chunks of 8 positions) and evaluates under
its own evaluation keys; the encoded weights and constants are shared by all sessions. A step
may carry a span of up to ``MAX_SPAN`` positions; each position's key and value are appended
before any score is computed and the class masks of the scores keep the causal order.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from veil.crypto.backend import Ciphertext, HEBackend, RefreshMask
from veil.crypto.linear import EncodedMatrix
from veil.protected.batch import (
    BatchMessage,
    RowOf,
    Rows,
    append_rows,
    held_bytes,
    own_matrix,
    row_bytes,
    rows_of,
    shift,
    split_advance,
    stack_matrices,
    stack_sessions,
    step_key,
)
from veil.protected.circuits import Circuit
from veil.protected.constants import Constants
from veil.protected.kv import LayerKV, SpanUndo, append_span, truncate_span
from veil.protected.layouts import dims_of
from veil.protected.protocol import (
    EXPECT,
    LEVELS,
    MAX_SPAN,
    PROTOCOL_VERSION,
    CapacityExceeded,
    CtPayload,
    DeviceBudgetExceeded,
    DeviceOutOfMemory,
    Levels,
    LimitExceeded,
    MessageError,
    MsgKind,
    ProtectedMessage,
    ProtocolError,
    Tag,
    UnknownSession,
    active_positions,
)
from veil.protected.timing import TimedBackend
from veil.protected.weights import (
    EncodedLayer,
    LayerWeights,
    ffn_permutation,
    layer_weights_from_tensors,
)

__all__ = ["Limits", "SpanState", "ProtectedSession", "ProtectedExecutor"]

log = logging.getLogger("veil.protected")


@dataclass(frozen=True)
class Limits:
    """The executor's bounds; ``ServerConfig.protected_limits()`` is where their values come from."""

    max_positions: int  # context of one session (the layouts cap it too: 512 at N=16384)
    max_kv_bytes: int  # encrypted KV cache of one session (413 above)
    max_kv_bytes_total: int  # encrypted KV cache of all sessions (429 above)
    # weights, key sets and the shuffled FFN's working memory together (429 above); None: no bound
    max_device_bytes: int | None = None


@dataclass(frozen=True)
class SpanState:
    """Where a session stands: replaced as a whole by every accepted step. Per-position values
    are keyed by the position's index in the span ``[position, position + count)``."""

    expect: str = MsgKind.TOKEN
    layer: int = 0
    position: int = 0
    count: int = 1
    length: int = 0  # positions fully processed
    h: Mapping[int, Ciphertext] = field(default_factory=dict)  # residual of the active positions
    refresh_mask: Mapping[int, RefreshMask] = field(default_factory=dict)  # ρ of h'' awaiting REFRESHED
    # the first layer's W_down under each position's secret FFN permutation, awaiting MLP_IN
    shuffled_down: Mapping[int, EncodedMatrix | RowOf] = field(default_factory=dict)  # a batch's row: RowOf
    # a verify step (speculation): every position runs to the end and may be taken back off
    # the KV cache by the next TOKEN, with what each layer's SpanUndo keeps
    verify: bool = False
    undo: Mapping[int, SpanUndo] = field(default_factory=dict)


@dataclass
class ProtectedSession:
    id: str
    be: TimedBackend = field(repr=False)  # evaluates under this session's keys
    kv: dict[int, LayerKV] = field(repr=False)
    step: int = -1  # last accepted client step id
    state: SpanState = field(default_factory=SpanState)
    kv_bytes: int = 0
    rows: int = 1  # a batch of sessions (``veil.protected.batch``): its ciphertexts hold one row each


@dataclass
class _Advance:
    """What an accepted step changes: its reply, the next state, new KV caches of some layers
    and the change in the session's KV bytes (the cache and the undo data it holds)."""

    reply: ProtectedMessage
    state: SpanState
    kv: dict[int, LayerKV] = field(default_factory=dict)
    kv_delta: int = 0


class ProtectedExecutor:
    def __init__(self, backend: HEBackend, cfg, weights: Iterable[LayerWeights], limits: Limits, *,
                 levels: Levels = LEVELS, key_bytes: Callable[[], int] = lambda: 0) -> None:
        """``key_bytes()``: what the tenants' key sets hold, which ``limits.max_device_bytes``
        counts beside the executor's own (``veil.server.key_sets``)."""
        if backend.has_secret_key:
            raise ValueError("the server's backend must not hold a secret key")
        self.be = TimedBackend(backend)
        self.cfg, self.levels, self.params_id = cfg, levels, backend.params.id
        self.dims = dims_of(cfg, backend.params.slot_count)
        # one layer's float64 weights at a time: a generator keeps them (0.9 GB for 28 layers)
        # from sitting next to the encoded plaintexts at the peak; the first layer keeps its FFN
        # weights to encode them under each position's secret permutation
        self.layers = []
        for w in weights:
            self.layers.append(EncodedLayer(backend, w, self.dims, levels, shuffled=not self.layers))
        if not self.layers:
            raise ValueError("no layers")
        # summed once (every plaintext of every layer): the device budget reads it at every
        # first-layer WEIGHTS step, key upload and /metrics scrape
        self.encoded_bytes = sum(layer.nbytes for layer in self.layers)
        self.first, self.last = self.layers[0].index, self.layers[-1].index + 1
        if [layer.index for layer in self.layers] != list(range(self.first, self.last)):
            raise ValueError("layers must be contiguous")
        self.limits = replace(limits, max_positions=min(limits.max_positions, self.dims.max_positions))
        self.consts = Constants(cfg, self.dims)
        self.sessions: dict[str, ProtectedSession] = {}
        self._key_bytes = key_bytes
        # the shuffled FFN of the first-layer step in flight, from its check to its commit: key
        # uploads on other threads meet it in ``device_bytes`` (steps run one at a time)
        self._step_bytes = 0

    @classmethod
    def from_checkpoint(cls, backend: HEBackend, ckpt, first: int, last: int, limits: Limits,
                        **kw) -> ProtectedExecutor:
        dims = dims_of(ckpt.config, backend.params.slot_count)
        ws = (layer_weights_from_tensors(ckpt.tensors, ckpt.config, i, dims) for i in range(first, last))
        return cls(backend, ckpt.config, ws, limits, **kw)

    @property
    def device_bytes(self) -> int:
        """What the executor holds for the device budget: its weights, the sessions' shuffled
        W_down, and the shuffled FFN of a step in flight."""
        return self.encoded_bytes + self.working_bytes + self._step_bytes

    @property
    def working_bytes(self) -> int:
        """The first layer's shuffled W_down the sessions hold from WEIGHTS to MLP_IN (a
        batch's stacked matrix whole while any of its rows holds it)."""
        return held_bytes(m for s in tuple(self.sessions.values()) for m in s.state.shuffled_down.values())

    def session_working_bytes(self, session_id: str) -> int:
        """One session's share of ``working_bytes`` (its row's of a stacked matrix)."""
        s = self.sessions.get(session_id)
        return sum(row_bytes(m) for m in s.state.shuffled_down.values()) if s is not None else 0

    @property
    def kv_bytes_total(self) -> int:
        # a copy: the event loop drops sessions (DELETE, TTL, eviction) while the HE worker sums
        return sum(s.kv_bytes for s in tuple(self.sessions.values()))

    def span_heap_bytes(self, positions: int) -> int:
        """What a server's heap should hold free for its first span of ``positions`` (a CPU
        process, ``kernels/heap.grow``): the first layer's shuffled pairs of the span's WEIGHTS
        step, and as much again for the products' blocks among them. Measured at k=28 (8-token
        first prompt, results 2026-12-07-warmup-span): the heap grown by the pairs alone left
        the prompt 464k fresh pages to fault in (none grown: 650k), grown by twice that 4.5k."""
        return 2 * positions * self.layers[0].shuffle_bytes

    # ---- sessions --------------------------------------------------------------------------
    def new_session(self, backend: HEBackend | None = None, session_id: str | None = None) -> ProtectedSession:
        """A session evaluated under ``backend``'s public material (the client's evaluation keys;
        default: the executor's own backend). Any backend of the same parameter set works: the
        encoded weights depend on no key, so tenants with different keys share them."""
        if backend is not None:
            if backend.has_secret_key:
                raise ValueError("the server's backend must not hold a secret key")
            if backend.params.id != self.params_id:
                raise ValueError(f"session backend is {backend.params.id!r}, executor {self.params_id!r}")
        sid = session_id or secrets.token_urlsafe(16)
        if sid in self.sessions:
            raise ValueError("session id in use")
        be = self.be if backend is None else self.be.sharing(backend)
        s = self.sessions[sid] = ProtectedSession(sid, be, {i: LayerKV() for i in range(self.first, self.last)},
                                                  state=SpanState(layer=self.first))
        return s

    def drop_session(self, session_id: str) -> None:
        """Forget a session: its encrypted KV cache and refresh masks are released."""
        self.sessions.pop(session_id, None)

    # ---- one message -------------------------------------------------------------------------
    def handle(self, msg: ProtectedMessage) -> ProtectedMessage:
        """Run the step ``msg`` starts and return the reply; commit only if it all succeeded."""
        s = self._check(msg)
        with self._running():
            out = self._step(msg.kind)(s, msg, Circuit(s.be, self.dims, self.levels, self.consts))
            self._commit(s, msg, out)
        return out.reply

    def handle_batch(self, msgs: Sequence[ProtectedMessage]) -> list[ProtectedMessage | Exception]:
        """Run steps of different sessions, one reply or exception per message, in order. Steps
        with one ``batch_key`` run as one batched evaluation (``veil.protected.batch``);
        each session still commits alone. If a batch fails, its steps run one at a time (past
        the device budget: its first rows that fit as a batch, then the others)."""
        results: list = [None] * len(msgs)
        groups: dict[tuple, list[int]] = {}
        seen: set[str] = set()
        for i, msg in enumerate(msgs):
            key = self.batch_key(msg) if msg.session_id not in seen else None
            seen.add(msg.session_id)  # a session's later message runs alone, after its earlier one
            groups.setdefault(("alone", i) if key is None else key, []).append(i)
        for idx in groups.values():
            for i in self._batched(msgs, idx, results) if len(idx) > 1 else idx:
                try:
                    results[i] = self.handle(msgs[i])
                except Exception as e:  # noqa: BLE001 (the caller answers each message on its own)
                    results[i] = e
        return results

    def _batched(self, msgs: Sequence[ProtectedMessage], idx: list[int], results: list) -> list[int]:
        """Run ``msgs[idx]`` as one batch into ``results``; returns the indices left to run one at
        a time: none, all where the batch failed (nothing was committed), or those past the
        device budget's room, whose first rows then run as a smaller batch, in arrival order."""
        try:
            for i, reply in zip(idx, self._run_batch([msgs[i] for i in idx]), strict=True):
                results[i] = reply
            return []
        except DeviceBudgetExceeded as e:
            rows = e.rows
            log.info("the device budget holds %d of a batch's %d %s steps", rows, len(idx), msgs[idx[0]].kind)
            return self._batched(msgs, idx[:rows], results) + idx[rows:] if rows > 1 else idx
        except Exception as e:  # noqa: BLE001 (nothing was committed: each step runs alone)
            log.warning("a batch of %d %s steps failed (%s: %s); running them one at a time",
                        len(idx), msgs[idx[0]].kind, type(e).__name__, e)
            return idx

    def batch_key(self, msg: ProtectedMessage) -> tuple | None:
        """Steps with equal keys may run as one batch (``batch.step_key``); None: alone (so does
        every step on a backend that cannot batch, e.g. SEAL)."""
        s = self.sessions.get(msg.session_id)
        if s is None or not s.be.inner.supports_batch:
            return None
        return step_key(s.state, msg.kind, msg.layer, msg.position, msg.count, msg.verify, self.dims.per_chunk)

    def sessions_at(self, key: tuple) -> int:
        """Sessions standing where a step of ``key`` starts: who may still join its batch."""
        kind, _, count, _ = key
        n = 0
        for s in tuple(self.sessions.values()):  # a snapshot: sessions open and close meanwhile
            st = s.state
            position, cnt = (st.length, count) if kind == MsgKind.TOKEN else (st.position, st.count)
            n += st.expect == kind and s.be.inner.supports_batch and \
                step_key(st, kind, st.layer, position, cnt, False, self.dims.per_chunk) == key
        return n

    def _run_batch(self, msgs: Sequence[ProtectedMessage]) -> list[ProtectedMessage]:
        sessions = [self._check(m) for m in msgs]
        rows = stack_sessions(ProtectedSession, self.be, sessions)
        first = msgs[0]
        bmsg = BatchMessage(first.kind, first.layer, rows_of(m.position for m in msgs), first.count,
                            tuple(zip(sessions, msgs, strict=True)))
        with self._running():
            out = self._step(first.kind)(rows, bmsg, Circuit(rows.be, self.dims, self.levels, self.consts))
            advances = split_advance(rows, out, msgs, _Advance, self.dims.per_chunk)
            for s, msg, adv in zip(sessions, msgs, advances, strict=True):
                self._commit(s, msg, adv)
        return [adv.reply for adv in advances]

    def _step(self, kind: str):
        return {MsgKind.TOKEN: self.on_token, MsgKind.WEIGHTS: self.on_weights, MsgKind.MLP_IN: self.on_mlp_in,
                MsgKind.REFRESHED: self.on_refreshed}[kind]

    @contextlib.contextmanager
    def _running(self):
        """A step from its work to its commit. A device out-of-memory error fails it (503, the
        session unchanged: nothing was committed) and gives the cached blocks back, so the next
        step starts from a clean pool. Its shuffled-FFN reservation ends with it: its W_down is
        then the sessions' (``working_bytes``), or gone."""
        try:
            yield
        except torch.OutOfMemoryError:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            raise DeviceOutOfMemory("the device ran out of memory during this step; retry later") from None
        finally:
            self._step_bytes = 0

    @staticmethod
    def _commit(s: ProtectedSession, msg: ProtectedMessage, out: _Advance) -> None:
        """The one place a session changes."""
        s.state, s.step = out.state, msg.step
        s.kv.update(out.kv)
        s.kv_bytes += out.kv_delta

    def _check(self, msg: ProtectedMessage) -> ProtectedSession:
        """The session ``msg`` belongs to, if the message fits where that session stands."""
        s = self.sessions.get(msg.session_id)
        if s is None:
            raise UnknownSession("unknown session")
        if msg.version != PROTOCOL_VERSION:
            raise MessageError(f"protocol version {msg.version} not supported")
        if msg.params_id != self.params_id:
            raise MessageError(f"message for parameter set {msg.params_id!r}, session uses {self.params_id!r}")
        if msg.step <= s.step:
            raise ProtocolError(f"step {msg.step} replayed or out of order (last {s.step})")
        st = s.state
        if msg.kind != st.expect:
            raise ProtocolError(f"expected a {st.expect!r} message, got {msg.kind!r}")
        if msg.kind == MsgKind.TOKEN:
            # the next position, or one inside the last verify step's span (the rest is undone)
            back = bool(st.undo) and st.position <= msg.position < st.length
            if (msg.position != st.length and not back) or msg.layer != self.first:
                raise ProtocolError("token message for the wrong position or layer")
            if not 1 <= msg.count <= MAX_SPAN:
                raise MessageError(f"a step carries 1..{MAX_SPAN} positions, not {msg.count}")
            if msg.position + msg.count > self.limits.max_positions:
                raise LimitExceeded(f"context would exceed max_protected_context={self.limits.max_positions} positions")
        elif (msg.layer, msg.position, msg.count) != (st.layer, st.position, st.count):
            raise ProtocolError("message for the wrong layer or positions")
        return s

    # ---- the four steps ------------------------------------------------------------------------
    def on_token(self, s: ProtectedSession, msg: ProtectedMessage, c: Circuit) -> _Advance:
        """TOKEN -> SCORES: the span's inputs of layer ``first`` (clean, replicated, at 7). A
        TOKEN for a position inside the last verify step's span first takes that span's later
        positions (the drafts the client rejected) back off every layer's cache."""
        st = s.state
        hs = self._load(c, msg, dict.fromkeys(range(msg.count), Tag.H_IN), self.levels.h)
        caches, delta = {}, -sum(u.nbytes for u in st.undo.values())  # undo data is dropped either way
        if st.undo and msg.position < st.length:
            for layer, undo in st.undo.items():
                caches[layer], freed = truncate_span(c.be, s.kv[layer], undo, msg.position - st.position,
                                                     self.dims.per_chunk)
                delta -= freed
        return self._start_layer(s, c, self.first, msg, hs, msg.position, caches, delta)

    def on_weights(self, s: ProtectedSession, msg: ProtectedMessage, c: Circuit) -> _Advance:
        """WEIGHTS -> MLP: attention output, W_o and the residual h'; then σ' and û. At the first
        protected layer, whose input the client knows, each position's û comes out under a fresh
        secret permutation of the FFN coordinates (the client cannot regress W_gate|up on it)."""
        st = s.state
        ws = self._load(c, msg, dict.fromkeys(sorted(st.h), Tag.W), self.levels.w)
        layer, kv = self._layer(st.layer), s.kv[st.layer]
        a = [c.attention(kv.values, w, shift(st.position, i)) for i, w in ws.items()]
        h_primes = {i: c.attention_residual(st.h[i], o) for i, o in zip(ws, c.matvecs(layer.wo, a), strict=True)}
        wgu, shuffled_down = layer.wgu, {}
        if layer.ffn is not None:
            self._reserve_shuffle(layer, len(ws), s.rows)
            wgu = []
            for i in ws:
                with c.be.section("shuffle"):
                    w_i, shuffled_down[i] = self._shuffled(c.be.inner, layer, s.rows)
                wgu.append(w_i)
        us = c.matvecs(wgu, list(h_primes.values()))
        payloads = [CtPayload(Tag.U_SIGMA2, self.levels.mlp_download, c.mlp_download(u, h_primes[i]), i)
                    for i, u in zip(h_primes, us, strict=True)]
        return _Advance(self._reply(MsgKind.MLP, msg, st.layer, payloads),
                        replace(st, h=h_primes, shuffled_down=shuffled_down, expect=EXPECT[MsgKind.MLP]))

    def on_mlp_in(self, s: ProtectedSession, msg: ProtectedMessage, c: Circuit) -> _Advance:
        """MLP_IN -> REFRESH: h'' = h' + W_down m, masked for its refresh; after the last layer
        -> FINAL: h_L."""
        st = s.state
        ms = self._load(c, msg, dict.fromkeys(sorted(st.h), Tag.M), self.levels.m)
        layer = self._layer(st.layer)
        wdown = [own_matrix(st.shuffled_down[i]) for i in ms] if st.shuffled_down else layer.wdown
        downs = dict(zip(ms, c.matvecs(wdown, list(ms.values())), strict=True))
        if st.layer + 1 < self.last:
            payloads, masks = [], {}
            for i, down in downs.items():
                masked, masks[i] = c.mask_for_refresh(c.residual(st.h[i], down))
                payloads.append(CtPayload(Tag.MASKED_H, c.be.level(masked), c.masked_download(masked), i))
            return _Advance(self._reply(MsgKind.REFRESH, msg, st.layer, payloads),
                            replace(st, h={}, shuffled_down={}, refresh_mask=masks, expect=EXPECT[MsgKind.REFRESH]))
        payloads = [CtPayload(Tag.H_FINAL, self.levels.final_download, c.final_download(st.h[i], down), i)
                    for i, down in downs.items()]
        # a verify step keeps its span and undo data: the next TOKEN may take positions back
        return _Advance(self._reply(MsgKind.FINAL, msg, self.last, payloads),
                        SpanState(layer=self.first, position=st.position, count=st.count,
                                  length=shift(st.position, st.count), undo=st.undo))

    def on_refreshed(self, s: ProtectedSession, msg: ProtectedMessage, c: Circuit) -> _Advance:
        """REFRESHED -> SCORES: h'' unmasked at 7 starts the next layer."""
        st = s.state
        hs = self._load(c, msg, dict.fromkeys(sorted(st.refresh_mask), Tag.H_REFRESHED), self.levels.h,
                        c.refresh_scale())
        hs = {i: c.from_refresh(c.be.unmask_refresh(h, st.refresh_mask[i])) for i, h in hs.items()}
        return self._start_layer(s, c, st.layer + 1, msg, hs, st.length, {}, 0, st.undo, st.verify)

    def _start_layer(self, s: ProtectedSession, c: Circuit, index: int, msg: ProtectedMessage,
                     hs: dict[int, Ciphertext], length: int, caches: dict[int, LayerKV], delta: int,
                     undo: Mapping[int, SpanUndo] | None = None, verify: bool | None = None) -> _Advance:
        """Every span position's key and value go into the cache first, then each active
        position's scores: position ``t0 + i`` sees its span predecessors, and the class masks
        of the score sums drop the positions after it (the causal mask). ``caches``/``delta``:
        what this step already changed (a TOKEN's undo of the last span)."""
        layer, t0, count = self._layer(index), msg.position, len(hs)
        verify = msg.verify if verify is None else verify
        active = active_positions(index, self.last, count, verify)
        q_hats, blocks = {}, []
        for i, y in zip(hs, c.matvecs(layer.wqkv, list(hs.values())), strict=True):
            q_hat, k_hat, v_hat = c.qkv(y, shift(t0, i), want_q=i in active)
            if q_hat is not None:
                q_hats[i] = q_hat
            blocks.append(c.kv_blocks(k_hat, v_hat, shift(t0, i)))
        cache = caches.get(index, s.kv[index])
        if isinstance(t0, Rows):  # a batch whose rows stand at different positions (never verify)
            kv, row_added = append_rows(c.be, cache, t0, blocks, self.dims.per_chunk)
        else:
            kv, added, layer_undo = append_span(c.be, cache, t0, blocks, self.dims.per_chunk, undo=verify)
            undo = dict(undo or {})
            if layer_undo is not None:
                undo[index] = layer_undo
                added += layer_undo.nbytes
            row_added = (added // s.rows,) * s.rows
        # a batch holds its largest row's bytes (checked against the largest growth: a batch
        # refused here reruns its rows one at a time, each against its own bytes)
        if s.kv_bytes + delta + max(row_added) > self.limits.max_kv_bytes:
            raise LimitExceeded(f"encrypted KV cache of this session would exceed max_protected_kv_bytes="
                                f"{self.limits.max_kv_bytes}")
        over = self.kv_bytes_total + delta + sum(row_added) - self.limits.max_kv_bytes_total
        if any(row_added) and over > 0:
            raise CapacityExceeded(f"encrypted KV cache of all sessions would exceed "
                                   f"max_protected_kv_bytes_total={self.limits.max_kv_bytes_total}", needed=over)
        payloads = []
        for i, h in hs.items():
            scores = c.scores(q_hats[i], kv.keys, shift(t0, i)) if i in active else None
            tag = Tag.SCORES_SIGMA if scores is not None else Tag.SIGMA
            data = c.scores_download(h, scores, shift(t0, i))
            payloads.append(CtPayload(tag, self.levels.scores_download, data, i))
        state = SpanState(EXPECT[MsgKind.SCORES], index, t0, count, length, {i: hs[i] for i in active},
                          verify=verify, undo=dict(undo or {}))
        kv_delta = delta + sum(row_added) if len(set(row_added)) == 1 else tuple(delta + a for a in row_added)
        return _Advance(self._reply(MsgKind.SCORES, msg, index, payloads), state, {**caches, index: kv}, kv_delta)

    # ---- helpers -------------------------------------------------------------------------------
    def _layer(self, index: int) -> EncodedLayer:
        return self.layers[index - self.first]

    def _reserve_shuffle(self, layer: EncodedLayer, positions: int, rows: int) -> None:
        """Reserve a step's shuffled pairs (positions x rows) until it commits; first, 429
        where they would take weights, key sets and every session's shuffled W_down past
        ``limits.max_device_bytes``: they are the protected path's largest working memory
        (``benchmarks/results/2026-12-07-device-budget``), and a device out of memory would drop
        the step after its work (503). A refused batch runs the rows the room holds as a smaller
        batch, and the rest alone (``_batched``)."""
        budget, row_bytes = self.limits.max_device_bytes, positions * layer.shuffle_bytes
        if budget is not None:
            held = self.device_bytes + self._key_bytes()
            if (over := held + rows * row_bytes - budget) > 0:
                raise DeviceBudgetExceeded(f"this step's shuffled FFN ({positions * rows} x {layer.shuffle_bytes} "
                                           f"bytes) would exceed protected_device_gb={budget / (1 << 30):g} with "
                                           f"the {held} bytes held", needed=over, rows=max(0, budget - held) // row_bytes)
        self._step_bytes = rows * row_bytes

    def _shuffled(self, be: HEBackend, layer: EncodedLayer, rows: int) -> tuple[EncodedMatrix, EncodedMatrix]:
        """The first layer's W_gate|up and W_down under a fresh secret permutation (per row of a batch)."""
        gus, downs = layer.shuffled_ffn(be, [ffn_permutation(self.dims.ffn) for _ in range(rows)])
        if rows == 1:
            return gus[0], downs[0]
        return stack_matrices(be, gus), stack_matrices(be, downs)

    def _load(self, c: Circuit, msg: ProtectedMessage, tags: dict[int, str], level: int,
              scale: float | None = None) -> dict[int, Ciphertext]:
        """The span's ciphertexts, exactly one per expected position with its tag, each
        deserialized and validated (level, and scale: Δ unless named) before any work (a batch's
        rows by their own sessions)."""
        if isinstance(msg, BatchMessage):
            loaded = [self._load(Circuit(s.be, self.dims, self.levels, self.consts), m, tags, level, scale)
                      for s, m in msg.rows]
            return {i: c.be.stack([row[i] for row in loaded]) for i in tags}
        out = {}
        for p in msg.payloads(tags):
            if p.level != level:
                raise MessageError(f"{p.tag}: level {p.level}, expected {level}")
            out[p.token] = c.be.deserialize(p.data, level=level, scale=c.be.params.scale if scale is None else scale)
        return out

    def _reply(self, kind: str, msg: ProtectedMessage, layer: int, payloads: list[CtPayload]) -> ProtectedMessage:
        return ProtectedMessage(kind, msg.session_id, msg.step, layer, msg.position, tuple(payloads), self.params_id,
                                count=msg.count)

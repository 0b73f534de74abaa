"""Iteration-level (continuous) batching.

Each engine step the scheduler picks work from every sequence that has some (a decode token,
a prefill chunk, a client's split step), oldest first (FCFS), until the step's token budget or
sequence cap is reached; long prefills are chunked to what is left of the budget, so they never
stall running decodes for more than one step. When the KV pool cannot hold a chunk, the
scheduler preempts by recompute: it frees a victim's blocks (idle split sessions first,
oldest first; then the newest sequence) and the victim later recomputes its KV from its kept
inputs.

A step's sequences advance when it is prepared (``advance``: positions counted as computed, a
token about to be sampled appended as ``PENDING``), so the engine can schedule the next step
while this one runs; ``postprocess`` then puts the sampled tokens and output rows in place.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from veil.engine.kv_cache import PagedKVCache
from veil.engine.sequence import PENDING, SeqKind, Sequence


@dataclass(frozen=True)
class SchedulerConfig:
    max_tokens_per_step: int = 512  # token budget of one batch (prefill chunks + decodes)
    max_seqs_per_step: int = 64


@dataclass
class Chunk:
    seq: Sequence
    start: int  # first position computed in this step
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, cache: PagedKVCache):
        self.cfg, self.cache = cfg, cache
        self.seqs: dict[int, Sequence] = {}  # every live sequence, in arrival order
        self.num_preemptions = 0
        # sequences of a step that raised (StepFailures.step_failed): while any has work, the oldest
        # runs alone, FCFS set aside, so that a bug one of them meets fails it and only it
        self.suspects: set[int] = set()

    def add(self, seq: Sequence) -> None:
        self.seqs[seq.id] = seq

    def remove(self, seq: Sequence) -> None:
        self.seqs.pop(seq.id, None)
        self.suspects.discard(seq.id)
        self.cache.free_table(seq.table)

    @property
    def num_waiting(self) -> int:
        return sum(1 for s in self.seqs.values() if s.pending and not s.table.blocks)

    @property
    def num_running(self) -> int:
        return sum(1 for s in self.seqs.values() if s.pending and s.table.blocks)

    def has_work(self) -> bool:
        return any(s.pending for s in self.seqs.values())

    def _preempt(self, victim: Sequence) -> None:
        self.cache.free_table(victim.table)
        victim.num_computed = 0
        victim.preemptions += 1
        self.num_preemptions += 1
        if victim.kind is SeqKind.HIDDEN:
            victim.step_out.clear()  # outputs of the pending step are recomputed too

    def _victim(self, protect: set[int]) -> Sequence | None:
        holders = [s for s in self.seqs.values() if s.table.blocks and s.id not in protect]
        idle = [s for s in holders if not s.pending]
        if idle:
            return min(idle, key=lambda s: s.arrival)  # the least recently arrived idle session
        return max(holders, key=lambda s: s.arrival) if holders else None

    def schedule(self) -> list[Chunk]:
        budget = self.cfg.max_tokens_per_step
        chunks: list[Chunk] = []
        scheduled: set[int] = set()
        cache, bs = self.cache, self.cache.block_size
        live = [(s, p) for s in self.seqs.values() if (p := s.pending)]
        live.sort(key=lambda sp: sp[0].arrival)
        if self.suspects:
            live = [sp for sp in live if sp[0].id in self.suspects][:1] or live
        for seq, pending in live:
            if budget == 0 or len(chunks) == self.cfg.max_seqs_per_step:
                break
            start, blocks = seq.num_computed, seq.table.blocks
            if pending == 1 and start // bs < len(blocks) and cache.blocks[blocks[start // bs]].ref_count == 1:
                # a decode into a private block it already holds: nothing to allocate or copy
                # (15 of 16 decodes at block size 16)
                chunks.append(Chunk(seq, start, 1))
                scheduled.add(seq.id)
                budget -= 1
                continue
            if not seq.table.blocks and seq.num_computed == 0 and seq.kind is SeqKind.TOKENS:
                # First allocation: reuse this tenant's cached prefix blocks. At least one input
                # must still be computed to produce logits.
                cached = self.cache.allocate_prefix(seq.table, seq.tenant, seq.token_ids)
                seq.num_computed = min(cached, seq.num_inputs - 1)
            n = min(seq.pending, budget)  # after the prefix lookup, which moves num_computed
            end = seq.num_computed + n
            extra = self.cache.blocks_for(end) - len(seq.table.blocks)
            # Copy-on-write may need one more block if the first written block is shared.
            extra += self._shared_write(seq)
            while extra > self.cache.num_free:
                victim = self._victim(scheduled | {seq.id})
                if victim is None:
                    break
                self._preempt(victim)
            if extra > self.cache.num_free:
                if not chunks and not seq.table.blocks and extra > self.cache.num_blocks:
                    raise MemoryError(f"a sequence of {end} tokens cannot fit the KV pool")
                if seq.table.blocks:
                    self._preempt(seq)  # it cannot progress now; give its blocks to older work
                break  # FCFS: nothing younger jumps ahead
            self.cache.ensure_writable(seq.table, seq.num_computed, end - 1)
            self.cache.grow(seq.table, end)
            chunks.append(Chunk(seq, seq.num_computed, n))
            scheduled.add(seq.id)
            budget -= n
        return chunks

    def _shared_write(self, seq: Sequence) -> int:
        bs = self.cache.block_size
        idx = seq.num_computed // bs
        if idx < len(seq.table.blocks) and self.cache.blocks[seq.table.blocks[idx]].ref_count > 1:
            return 1
        return 0

    def advance(self, chunks: list[Chunk]) -> list[int]:
        """Count the chunks' positions as computed and append a ``PENDING`` token where a chunk
        ends a token sequence's inputs (the step will sample it); returns each sequence's
        preemption count, which ``postprocess`` compares to see whether its blocks survived."""
        for c in chunks:
            seq, end = c.seq, c.start + c.length
            if seq.kind is SeqKind.TOKENS and end == len(seq.token_ids):
                seq.token_ids.append(PENDING)
            seq.num_computed = end
        return [c.seq.preemptions for c in chunks]

    def undo(self, chunks: list[Chunk]) -> None:
        """Take back what ``advance`` did for a step that did not run (the device ran out of
        memory launching it): each sequence's computed count back to its chunk's start, the
        ``PENDING`` token it appended removed. A step still in flight before it is untouched:
        its own ``PENDING`` lies before this step's, which always follows it."""
        for c in chunks:
            seq = c.seq
            if seq.finished:
                continue  # aborted or closed meanwhile: nothing left to undo
            ids = seq.token_ids
            if seq.kind is SeqKind.TOKENS and len(ids) == c.start + c.length + 1 and ids[-1] == PENDING:
                ids.pop()
            seq.num_computed = min(seq.num_computed, c.start)

    def postprocess(self, chunks: list[Chunk], epochs: list[int], tokens: dict[int, int],
                    hidden: dict[int, torch.Tensor], finish: Callable[[Sequence, str], None]
                    ) -> list[tuple[Sequence, Exception]]:
        """A finished step's results: each sampled token in place of its ``PENDING`` (callbacks,
        stop and length checks, ``finish`` on the end), the full blocks published for sharing,
        a split step's output rows handed to its waiter. Returns the sequences whose callback
        raised, each with its exception: the other sequences' results are handed back all the same."""
        broken = []
        for c, epoch in zip(chunks, epochs, strict=True):
            try:
                self._hand_back(c, epoch, tokens, hidden, finish)
            except Exception as e:  # noqa: BLE001 (a receiver's bug ends its own sequence, StepFailures.receiver_failed)
                broken.append((c.seq, e))
        return broken

    def _hand_back(self, c: Chunk, epoch: int, tokens: dict[int, int], hidden: dict[int, torch.Tensor],
                   finish: Callable[[Sequence, str], None]) -> None:
        seq = c.seq
        if seq.finished:
            return  # aborted or closed while the batch ran
        intact = seq.preemptions == epoch  # not preempted since: its blocks hold this step's KV
        if seq.kind is SeqKind.TOKENS:
            end = c.start + c.length
            if intact and end // self.cache.block_size > len(seq.table.hashes):  # a block was completed
                self.cache.register_full_blocks(seq.table, seq.tenant, seq.token_ids, end)
            token = tokens.get(seq.id)
            if token is not None:  # a sample stays valid even if its sequence was preempted since
                seq.token_ids[end] = token
                if seq.first_token_time is None:
                    seq.first_token_time = time.monotonic()
                if seq.on_token:
                    seq.on_token(token)
                if token in seq.stop_ids:
                    finish(seq, "stop")
                elif end + 1 - seq.num_prompt_tokens >= seq.max_new_tokens:
                    finish(seq, "length")
        elif intact:
            rows = hidden[seq.id]
            skip = max(0, seq.step_start - c.start)  # rows recomputed after a preemption
            if skip < rows.shape[0]:
                seq.step_out.append(rows[skip:].clone())
            if c.end == seq.num_hidden:
                out = torch.cat(seq.step_out) if len(seq.step_out) > 1 else seq.step_out[0]
                seq.step_out.clear()
                done, seq.on_step_done = seq.on_step_done, None
                if done:
                    done(out)

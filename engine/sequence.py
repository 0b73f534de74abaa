"""A sequence: the engine's unit of state (one session's or one request's KV and inputs).

Two kinds share the engine:
* token sequences (full-model requests of the fast path): inputs are token ids; after the last
  input is computed the engine samples the next token and appends it;
* hidden sequences (split-plaintext sessions): inputs are hidden-state rows sent by a client
  for the server's layers; each client step appends rows and waits for their outputs.

Both keep every input they were given, so a preempted sequence is recomputed from its inputs
(preemption by recompute) whatever its kind.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch

from veil.engine.kv_cache import BlockTable
from veil.engine.sampling import Sampler, SamplingParams

_ids = itertools.count(1)

#: the id of a token a step in flight is still sampling (the engine overlaps a step's host work
#: with the previous step's GPU work: the next decode is scheduled before its input is known)
PENDING = -1


class SeqKind(Enum):
    TOKENS = "tokens"
    HIDDEN = "hidden"


@dataclass
class Sequence:
    kind: SeqKind
    tenant: str
    # token sequences
    token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    max_new_tokens: int = 0
    sampler: Sampler | None = None
    stop_ids: tuple[int, ...] = ()
    on_token: Callable[[int], None] | None = None  # called on the engine thread
    on_finish: Callable[[str | BaseException], None] | None = None  # reason: "stop" | "length" | "abort"
    # hidden sequences
    hidden_rows: list[torch.Tensor] = field(default_factory=list)  # one [T_i, d] tensor per step
    num_hidden: int = 0
    step_start: int = 0  # first position of the pending step
    step_out: list[torch.Tensor] = field(default_factory=list)
    on_step_done: Callable[[torch.Tensor | BaseException], None] | None = None
    # shared
    id: int = field(default_factory=lambda: next(_ids))
    arrival: float = field(default_factory=time.monotonic)
    num_computed: int = 0  # positions whose KV is in the cache
    table: BlockTable = field(default_factory=BlockTable)
    finished: bool = False
    preemptions: int = 0
    first_token_time: float | None = None

    @classmethod
    def tokens(cls, tenant: str, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
               stop_ids: tuple[int, ...] = (), on_token=None, on_finish=None) -> Sequence:
        return cls(SeqKind.TOKENS, tenant, token_ids=list(prompt_ids), num_prompt_tokens=len(prompt_ids),
                   max_new_tokens=max_new_tokens, sampler=Sampler(sampling), stop_ids=stop_ids,
                   on_token=on_token, on_finish=on_finish)

    @classmethod
    def hidden(cls, tenant: str) -> Sequence:
        return cls(SeqKind.HIDDEN, tenant)

    @property
    def num_inputs(self) -> int:
        return len(self.token_ids) if self.kind is SeqKind.TOKENS else self.num_hidden

    @property
    def pending(self) -> int:
        """Input positions not yet computed (none once every output token is drawn: the last
        one's position is never computed; none for a split session between its client's steps,
        so one preempted while idle recomputes only once its client sends the next step)."""
        # read by every scheduling pass for every live sequence: the properties inlined
        if self.finished:
            return 0
        if self.kind is SeqKind.TOKENS:
            n = len(self.token_ids)
            return 0 if n - self.num_prompt_tokens >= self.max_new_tokens else n - self.num_computed
        return self.num_hidden - self.num_computed if self.on_step_done is not None else 0

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def take_back_step(self) -> Callable[[torch.Tensor | BaseException], None]:
        """Undo a split session's pending client step whole (its rows, its outputs so far): the
        session is as before the step was submitted. Returns the step's waiter."""
        self.hidden_rows.pop()
        self.num_hidden = self.step_start
        self.num_computed = min(self.num_computed, self.step_start)
        self.step_out.clear()
        self.preemptions += 1  # a step still in flight with rows of this client step discards them
        done, self.on_step_done = self.on_step_done, None
        return done

    def hidden_slice(self, start: int, end: int) -> torch.Tensor:
        """Input rows [start, end) across step boundaries."""
        parts, offset = [], 0
        for rows in self.hidden_rows:
            lo, hi = max(start, offset), min(end, offset + rows.shape[0])
            if lo < hi:
                parts.append(rows[lo - offset:hi - offset])
            offset += rows.shape[0]
            if offset >= end:
                break
        return parts[0] if len(parts) == 1 else torch.cat(parts)

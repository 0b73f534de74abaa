"""What one step's forward pass reads: a host snapshot of its sequences (``prepare``), and the
positions, KV slots and attention metadata built from it on the device (``step_meta``).

The snapshot is taken under the engine's lock, so an abort on another thread cannot change a
block table mid-step. The metadata is built on the device from one small per-sequence tensor
(table row, first position, length) and the device block tables (`DeviceBlockTables`), not from
per-token Python lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from veil.engine.block_tables import DeviceBlockTables
from veil.engine.kv_cache import PagedKVCache
from veil.engine.sampling import SamplingParams
from veil.engine.scheduler import Chunk
from veil.engine.sequence import PENDING, SeqKind
from veil.kernels.host import to_device


@dataclass
class PreparedBatch:
    """What the forward pass reads from the sequences, snapshot under the engine's lock."""

    seq_info: torch.Tensor  # [B, 3] int64 on the host: (table row, first position, length)
    lengths: list[int]
    width: int  # block-table columns the step needs
    num_token_seqs: int
    token_ids: torch.Tensor  # [rows of token chunks] int64, host
    hidden: torch.Tensor | None  # [rows of hidden chunks, d], host
    logit_rows: list[int]  # rows whose logits are sampled, one per finished-input token sequence
    logit_seqs: list[int]  # their sequence ids
    sampling: tuple[list[SamplingParams], list[int], list[int]]  # params, seeds, counters
    hidden_out: list[tuple[int, int, int]]  # (seq id, first row among hidden rows, rows)
    # token rows whose id the step in flight is still sampling (an overlapped step's decodes):
    # (row, index among that step's sampled ids), filled in on the device before the forward pass
    pending_rows: list[tuple[int, int]]

    @property
    def num_token_rows(self) -> int:
        return self.token_ids.shape[0]


def prepare(chunks: list[Chunk], tables: DeviceBlockTables, cache: PagedKVCache,
            sampled_index: dict[int, int] | None = None) -> PreparedBatch:
    """Snapshot what the forward pass reads from ``chunks`` (token chunks first) and bring the
    device block tables up to date. A token id not sampled yet (``PENDING``) is the step in
    flight's sample for that sequence, at ``sampled_index[seq id]`` among its sampled ids."""
    # One pass, each sequence's work inlined: at ~134 sequences per step, prepare was ~30% of
    # the loop's host time (benchmarks/results/2026-12-02-engine-host).
    info, lengths, ids, hid, pending_rows = [], [], [], [], []
    logit_rows, logit_seqs, params, seeds, counters, hidden_out = [], [], [], [], [], []
    max_end, row, n_tok_seqs, n_hid_rows = 1, 0, 0, 0
    row_of = tables.row_of
    for c in chunks:
        seq, start, length = c.seq, c.start, c.length
        end = start + length
        table_row = row_of.get(seq.id)
        if table_row is None or seq.table.synced < len(seq.table.blocks):
            table_row = tables.stage(seq.id, seq.table)
        info += (table_row, start, length)
        lengths.append(length)
        max_end = max(max_end, end)
        if seq.kind is SeqKind.TOKENS:
            if hid:
                raise AssertionError("token chunks must come first")
            n_tok_seqs += 1
            token_ids = seq.token_ids
            if length == 1:
                ids.append(token_ids[start])
            else:
                ids += token_ids[start:end]
            if token_ids[end - 1] == PENDING:  # only ever the last input, sampled in flight
                pending_rows.append((row + length - 1, sampled_index[seq.id]))
            if end == len(token_ids):
                logit_rows.append(row + length - 1)
                logit_seqs.append(seq.id)
                params.append(seq.sampler.params)
                seeds.append(seq.sampler.seed)
                counters.append(end - seq.num_prompt_tokens)
        else:
            hid.append(seq.hidden_slice(start, end))
            hidden_out.append((seq.id, n_hid_rows, length))
            n_hid_rows += length
        row += length
    tables.flush()
    return PreparedBatch(torch.tensor(info, dtype=torch.long).view(-1, 3), lengths,
                         cache.blocks_for(max_end), n_tok_seqs,
                         torch.tensor(ids, dtype=torch.long), torch.cat(hid) if hid else None,
                         logit_rows, logit_seqs, (params, seeds, counters), hidden_out, pending_rows)


@dataclass
class AttnPart:
    """The decode or the prefill sequences of a step: their q rows and their metadata."""

    rows: slice | torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    cu_seqlens: torch.Tensor | None  # prefill only, from 0
    max_seqlen_q: int


@dataclass
class StepMeta:
    positions: torch.Tensor  # [N] int64
    slot_mapping: torch.Tensor  # [N] int64
    decode: AttnPart | None
    prefill: AttnPart | None


def rows_index(idx: list[int], device: torch.device) -> slice | torch.Tensor:
    """A slice when the indices are a contiguous run (the usual case), else an index tensor."""
    if idx and idx[-1] - idx[0] + 1 == len(idx):
        return slice(idx[0], idx[-1] + 1)
    return to_device(idx, device, torch.long)


def step_meta(info: torch.Tensor, lengths: list[int], width: int, tables: DeviceBlockTables,
              block_size: int) -> StepMeta:
    """Positions, slots and the decode/prefill parts of the sequences ``info`` [B, 3] (on the
    device) of ``lengths`` rows each, reading ``width`` block-table columns."""
    dev, bs = tables.device, block_size
    rows, starts, lens = info[:, 0], info[:, 1], info[:, 2]
    tab = tables.buf.index_select(0, rows)[:, :width]
    ctx = (starts + lens).to(torch.int32)
    n = sum(lengths)
    if n == len(lengths):  # decode only: one row per sequence
        positions, seq_of = starts, torch.arange(n, device=dev)
    else:
        cu = torch.cumsum(lens, 0)
        seq_of = torch.repeat_interleave(torch.arange(len(lengths), device=dev), lens, output_size=n)
        positions = starts[seq_of] + torch.arange(n, device=dev) - (cu - lens)[seq_of]
    slots = tab[seq_of, positions // bs].long() * bs + positions % bs
    if n == len(lengths):
        return decode_meta(positions, slots, tab, ctx)
    dec = [i for i, length in enumerate(lengths) if length == 1]
    pre = [i for i, length in enumerate(lengths) if length != 1]
    cu_host = [0]
    for length in lengths:
        cu_host.append(cu_host[-1] + length)
    return StepMeta(positions, slots, _part(dec, cu_host, tab, ctx, dev, decode=True),
                    _part(pre, cu_host, tab, ctx, dev, decode=False))


def decode_meta(positions, slots, tables, ctx) -> StepMeta:
    """Metadata of a decode-only batch from its tensors (also the CUDA graphs' static inputs)."""
    return StepMeta(positions, slots, AttnPart(slice(None), tables, ctx, None, 1), None)


def _part(seqs: list[int], cu: list[int], tables, ctx, dev: torch.device, decode: bool) -> AttnPart | None:
    if not seqs:
        return None
    sel = rows_index(seqs, dev)
    if decode:
        return AttnPart(rows_index([cu[b] for b in seqs], dev), tables[sel], ctx[sel], None, 1)
    if isinstance(sel, slice):
        rows = slice(cu[sel.start], cu[sel.stop])
    else:
        rows = torch.cat([torch.arange(cu[b], cu[b + 1], device=dev) for b in seqs])
    q_lens = [cu[b + 1] - cu[b] for b in seqs]
    cu_part = [0]
    for q in q_lens:
        cu_part.append(cu_part[-1] + q)
    return AttnPart(rows, tables[sel], ctx[sel], to_device(cu_part, dev, torch.int32), max(q_lens))

"""One batched forward pass over ragged sequences, reading and writing the paged KV cache.

A batch mixes token chunks (full-model requests: embedding, then every layer) and hidden
chunks (split sessions: the client already ran layers [0, k)). All rows are packed along one
token axis, token chunks first and, within each kind, single-token (decode) chunks first.
Token rows run layers [0, k) alone, then every row runs layers [k, L) together, so the
server's protected-split layers are batched across both kinds of work and all tenants.

Per layer, decode rows go through the split-KV paged decode kernel and prefill rows through
the paged prefill kernel, one call each (the Triton kernels on CUDA tensors, their torch twins
on CPU; veil.kernels.ops chooses per call). Step metadata is built on the device from one small
per-sequence tensor (table row, first position, length) and the device block tables
(`DeviceBlockTables`), not from per-token Python lists. Sampling is one call for the batch and
its token ids reach the host in one copy. On CUDA, pure decode steps of full-model requests
replay CUDA graphs (`veil.engine.cuda_graphs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from veil.engine.block_tables import DeviceBlockTables
from veil.engine.host import to_device
from veil.engine.kv_cache import PagedKVCache
from veil.engine.model import LlamaModel
from veil.engine.sampling import SamplingBatch, SamplingParams, sample
from veil.engine.scheduler import Chunk
from veil.engine.sequence import PENDING, SeqKind
from veil.kernels import ops
from veil.kernels.linear import Linear


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


@dataclass
class StepHandle:
    """A launched step (``ModelRunner.launch``) until ``finish``."""

    batch: PreparedBatch
    sampled_index: dict[int, int]  # sequence id -> its row in ``sampled``
    sampled: torch.Tensor | None = None  # [logit rows] int64 on the device
    host: torch.Tensor | None = None  # the same ids on the host (pinned, being copied on CUDA)
    done: torch.cuda.Event | None = None  # recorded after the copy (CUDA)
    hidden_rows: torch.Tensor | None = None  # the hidden chunks' output rows on the device


@dataclass
class LayerWeights:
    """A layer's norms and matrices; each matrix a `Linear` laid out once for the device's GEMM
    (veil.kernels.linear: oneDNN-prepacked bf16 or an [in, out] fp32 copy on CPU, the
    transposed view on CUDA)."""

    input_norm: torch.Tensor
    qkv: Linear  # [d] -> [q + 2 kv]: one GEMM for the three projections
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # [d] -> [2 I]
    down: Linear


def _rows_index(idx: list[int], device: torch.device) -> slice | torch.Tensor:
    """A slice when the indices are a contiguous run (the usual case), else an index tensor."""
    if idx and idx[-1] - idx[0] + 1 == len(idx):
        return slice(idx[0], idx[-1] + 1)
    return to_device(idx, device, torch.long)


class ModelRunner:
    def __init__(self, model: LlamaModel, k: int, cache: PagedKVCache, device: str | torch.device = "cpu",
                 max_positions: int | None = None, cuda_graph_batch: int = 0):
        cfg = model.cfg
        self.cfg, self.model, self.k, self.cache = cfg, model, k, cache
        self.device = dev = torch.device(device)
        self.first = model.first
        self.has_ends = model.with_ends and model.first == 0
        self.dtype = next(model.parameters()).dtype

        def mat(*ws: torch.Tensor) -> Linear:
            return Linear(torch.cat(ws) if len(ws) > 1 else ws[0].data, dev)

        self.layers: dict[int, LayerWeights] = {}
        for i in range(model.first, model.last):
            b = model.layers[str(i)]
            a, m = b.self_attn, b.mlp
            self.layers[i] = LayerWeights(
                b.input_layernorm.weight.data.to(dev), mat(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                mat(a.o_proj.weight), b.post_attention_layernorm.weight.data.to(dev),
                mat(m.gate_proj.weight, m.up_proj.weight), mat(m.down_proj.weight),
            )
        if self.has_ends:
            self.embed_w = model.embed_tokens.weight.data.to(dev)
            self.norm_w = model.norm.weight.data.to(dev)
            self.head = Linear(model.head_weight().data, dev)  # [d] -> [vocab]
        max_positions = max_positions or cfg.max_position_embeddings
        self.cos, self.sin = ops.build_rope_cache(cfg.head_dim, max_positions, cfg.rope_theta, device=dev)
        self.scale = cfg.head_dim ** -0.5
        self.tables = DeviceBlockTables(cache.blocks_for(max_positions), dev)
        self.graphs = None
        if cuda_graph_batch and dev.type == "cuda" and self.has_ends:
            from veil.engine.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(self, cuda_graph_batch)

    # -- host side: the snapshot -------------------------------------------------------------------
    def prepare(self, chunks: list[Chunk], in_flight: StepHandle | None = None) -> PreparedBatch:
        """Snapshot what the forward pass reads from the sequences and bring the device block
        tables up to date. Called under the engine's lock, so an abort on another thread cannot
        change a block table mid-step. Chunks come ordered: token chunks first. A token id not
        sampled yet (``PENDING``) is the step ``in_flight``'s sample for that sequence."""
        # One pass, each sequence's work inlined: at ~134 sequences per step, prepare was ~30% of
        # the loop's host time (benchmarks/results/2026-12-02-engine-host).
        info, lengths, ids, hid, pending_rows = [], [], [], [], []
        logit_rows, logit_seqs, params, seeds, counters, hidden_out = [], [], [], [], [], []
        max_end, row, n_tok_seqs, n_hid_rows = 1, 0, 0, 0
        tables, row_of = self.tables, self.tables.row_of
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
                    pending_rows.append((row + length - 1, in_flight.sampled_index[seq.id]))
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
        if n_tok_seqs and not self.has_ends:
            raise RuntimeError("this server holds only the server half: no full-model requests")
        return PreparedBatch(torch.tensor(info, dtype=torch.long).view(-1, 3), lengths,
                             self.cache.blocks_for(max_end), n_tok_seqs,
                             torch.tensor(ids, dtype=torch.long), torch.cat(hid) if hid else None,
                             logit_rows, logit_seqs, (params, seeds, counters), hidden_out, pending_rows)

    def release(self, seq_id: int) -> None:
        """A sequence has ended: give its block-table row back."""
        self.tables.release(seq_id)

    # -- device side: metadata ---------------------------------------------------------------------
    def _meta(self, info: torch.Tensor, lengths: list[int], width: int) -> StepMeta:
        """Positions, slots and the decode/prefill parts of sequences `info` [B, 3] (device)."""
        dev, bs = self.device, self.cache.block_size
        rows, starts, lens = info[:, 0], info[:, 1], info[:, 2]
        tables = self.tables.buf.index_select(0, rows)[:, :width]
        ctx = (starts + lens).to(torch.int32)
        n = sum(lengths)
        if n == len(lengths):  # decode only: one row per sequence
            positions, seq_of = starts, torch.arange(n, device=dev)
        else:
            cu = torch.cumsum(lens, 0)
            seq_of = torch.repeat_interleave(torch.arange(len(lengths), device=dev), lens, output_size=n)
            positions = starts[seq_of] + torch.arange(n, device=dev) - (cu - lens)[seq_of]
        slots = tables[seq_of, positions // bs].long() * bs + positions % bs
        if n == len(lengths):
            return StepMeta(positions, slots, AttnPart(slice(0, n), tables, ctx, None, 1), None)
        dec = [i for i, length in enumerate(lengths) if length == 1]
        pre = [i for i, length in enumerate(lengths) if length != 1]
        cu_host = [0]
        for length in lengths:
            cu_host.append(cu_host[-1] + length)
        return StepMeta(positions, slots, self._part(dec, cu_host, tables, ctx, decode=True),
                        self._part(pre, cu_host, tables, ctx, decode=False))

    def _part(self, seqs: list[int], cu: list[int], tables, ctx, decode: bool) -> AttnPart | None:
        if not seqs:
            return None
        dev = self.device
        sel = _rows_index(seqs, dev)
        if decode:
            return AttnPart(_rows_index([cu[b] for b in seqs], dev), tables[sel], ctx[sel], None, 1)
        if isinstance(sel, slice):
            rows = slice(cu[sel.start], cu[sel.stop])
        else:
            rows = torch.cat([torch.arange(cu[b], cu[b + 1], device=dev) for b in seqs])
        q_lens = [cu[b + 1] - cu[b] for b in seqs]
        cu_part = [0]
        for q in q_lens:
            cu_part.append(cu_part[-1] + q)
        return AttnPart(rows, tables[sel], ctx[sel], to_device(cu_part, dev, torch.int32),
                        max(q_lens))

    def decode_meta(self, positions, slots, tables, ctx) -> StepMeta:
        """Metadata of a decode-only batch from its (static) tensors: the CUDA-graph inputs."""
        return StepMeta(positions, slots, AttnPart(slice(None), tables, ctx, None, 1), None)

    # -- layers ------------------------------------------------------------------------------------
    def _attention(self, q: torch.Tensor, layer: int, meta: StepMeta) -> torch.Tensor:
        kc, vc = self.cache.k[layer - self.first], self.cache.v[layer - self.first]
        d, p = meta.decode, meta.prefill

        def decode(qq):
            return ops.paged_decode_attention(qq, kc, vc, d.block_tables, d.context_lens, self.scale)

        def prefill(qq):
            return ops.paged_prefill_attention(qq, kc, vc, p.block_tables, p.cu_seqlens, p.context_lens,
                                               self.scale, max_seqlen_q=p.max_seqlen_q)

        if p is None:
            return decode(q)
        if d is None:
            return prefill(q)
        out = torch.empty_like(q)
        out[d.rows] = decode(q[d.rows])
        out[p.rows] = prefill(q[p.rows])
        return out

    def _layer(self, i: int, x: torch.Tensor, residual: torch.Tensor | None, meta: StepMeta):
        cfg, w = self.cfg, self.layers[i]
        n = x.shape[0]
        h, residual = ops.add_rms_norm(x, residual, w.input_norm, cfg.rms_norm_eps)
        qkv = w.qkv(h)
        q = qkv[:, :cfg.q_size].view(n, cfg.num_heads, cfg.head_dim)
        k = qkv[:, cfg.q_size:cfg.q_size + cfg.kv_size].view(n, cfg.num_kv_heads, cfg.head_dim)
        v = qkv[:, cfg.q_size + cfg.kv_size:].view(n, cfg.num_kv_heads, cfg.head_dim)
        ops.apply_rope(q, k, meta.positions, self.cos, self.sin)
        ops.store_kv(k, v, self.cache.k[i - self.first], self.cache.v[i - self.first], meta.slot_mapping)
        a = self._attention(q, i, meta).reshape(n, cfg.q_size)
        h, residual = ops.add_rms_norm(w.o(a), residual, w.post_norm, cfg.rms_norm_eps)
        return w.down(ops.silu_and_mul(w.gate_up(h))), residual

    def _run_layers(self, x: torch.Tensor, first: int, last: int, meta: StepMeta) -> torch.Tensor:
        residual = None
        for i in range(first, last):
            x, residual = self._layer(i, x, residual, meta)
        return x if residual is None else x + residual

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: [T, d] → [T, vocab] fp32."""
        return self.head(ops.rms_norm(h, self.norm_w, self.cfg.rms_norm_eps)).float()

    def forward_logits(self, ids: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        """The whole model on token rows that all need logits (the CUDA-graph body)."""
        return self.logits(self._run_layers(F.embedding(ids, self.embed_w), 0, self.cfg.num_layers, meta))

    # -- the step ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def launch(self, batch: PreparedBatch, in_flight: StepHandle | None = None) -> StepHandle:
        """Start the step: on CUDA the forward pass and the sampling are queued and the sampled
        ids start their copy to the host, and this returns while the GPU works (``finish``
        waits); on the CPU it computes everything. ``in_flight``: the step still running, whose
        sampled ids this one's ``pending_rows`` read on the device."""
        dev = self.device
        info = to_device(batch.seq_info, dev)
        n_tok = batch.num_token_rows
        ids = to_device(batch.token_ids, dev)
        if batch.pending_rows:  # one copy of the (row, source) pairs
            pairs = to_device(batch.pending_rows, dev, torch.long)
            ids[pairs[:, 0]] = in_flight.sampled[pairs[:, 1]]
        logits, x = None, None
        if self.graphs is not None and batch.hidden is None and n_tok == len(batch.lengths):
            logits = self.graphs.run(ids, info)
        if logits is None:
            meta = self._meta(info, batch.lengths, batch.width)
            parts = []
            if batch.num_token_seqs:
                x = F.embedding(ids, self.embed_w)
                if self.k:
                    tok_meta = meta if batch.hidden is None else self._meta(
                        info[:batch.num_token_seqs], batch.lengths[:batch.num_token_seqs], batch.width)
                    x = self._run_layers(x, 0, self.k, tok_meta)
                parts.append(x)
            if batch.hidden is not None:
                parts.append(to_device(batch.hidden, dev).to(self.dtype))
            x = parts[0] if len(parts) == 1 else torch.cat(parts)
            x = self._run_layers(x, max(self.k, self.first), self.cfg.num_layers, meta)
            if batch.logit_rows:
                logits = self.logits(x[_rows_index(batch.logit_rows, dev)])
        handle = StepHandle(batch, {sid: i for i, sid in enumerate(batch.logit_seqs)})
        if batch.logit_rows:
            if logits.shape[0] != len(batch.logit_rows):  # graph output: every row has logits
                logits = logits[to_device(batch.logit_rows, dev, torch.long)]
            handle.sampled = sample(logits, SamplingBatch.build(*batch.sampling, device=dev))
            if dev.type == "cuda":  # the step's one device-to-host copy, started now, awaited in finish
                handle.host = torch.empty(handle.sampled.shape, dtype=torch.long, pin_memory=True)
                handle.host.copy_(handle.sampled, non_blocking=True)
                handle.done = torch.cuda.Event()
                handle.done.record()
            else:
                handle.host = handle.sampled
        if batch.hidden_out:
            handle.hidden_rows = x[n_tok:]
        return handle

    @torch.inference_mode()
    def finish(self, handle: StepHandle) -> tuple[dict[int, int], dict[int, torch.Tensor]]:
        """Wait for a launched step: (the sampled token of each token sequence whose inputs are
        now all computed, the output hidden rows [T, d] fp32 on the host of each hidden chunk)."""
        batch, tokens, hidden = handle.batch, {}, {}
        if handle.done is not None:
            handle.done.synchronize()
        if handle.host is not None:
            tokens = dict(zip(batch.logit_seqs, handle.host.tolist(), strict=True))
        if batch.hidden_out:
            out = handle.hidden_rows.float().cpu()
            hidden = {sid: out[r:r + n] for sid, r, n in batch.hidden_out}
        return tokens, hidden

    def run(self, batch: PreparedBatch) -> tuple[dict[int, int], dict[int, torch.Tensor]]:
        """``launch`` then ``finish``: one step, start to end."""
        return self.finish(self.launch(batch))

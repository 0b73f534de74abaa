"""One batched forward pass over ragged sequences, reading and writing the paged KV cache.

A batch mixes token chunks (full-model requests: embedding, then every layer) and hidden
chunks (split sessions: the client already ran layers [0, k)). All rows are packed along one
token axis, token chunks first and, within each kind, single-token (decode) chunks first.
Token rows run layers [0, k) alone, then every row runs layers [k, L) together, so the
server's protected-split layers are batched across both kinds of work and all tenants.

Per layer, decode rows go through the split-KV paged decode kernel and prefill rows through
the paged prefill kernel, one call each (the Triton kernels on CUDA tensors, their torch twins
on CPU; veil.kernels.ops chooses per call); what a step reads is `veil.engine.batch`'s. Sampling
is one call for the batch and its token ids reach the host in one copy. On CUDA, pure decode
steps of full-model requests replay CUDA graphs (`veil.engine.cuda_graphs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from veil.engine.batch import PreparedBatch, StepMeta, prepare, rows_index, step_meta
from veil.engine.block_tables import DeviceBlockTables
from veil.engine.kv_cache import PagedKVCache
from veil.engine.model import LlamaModel
from veil.engine.sampling import SamplingBatch, sample
from veil.engine.scheduler import Chunk
from veil.engine.sequence import SeqKind
from veil.kernels import ops
from veil.kernels.host import to_device
from veil.kernels.linear import Linear


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
    (veil.kernels.linear: oneDNN-prepacked bf16 and fp32 on CPU, an [in, out] fp32 copy where
    oneDNN refuses, the transposed view on CUDA)."""

    input_norm: torch.Tensor
    qkv: Linear  # [d] -> [q + 2 kv]: one GEMM for the three projections
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # [d] -> [2 I]
    down: Linear


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
        """The step's snapshot (`batch.prepare`; under the engine's lock). A token id not sampled
        yet is the step ``in_flight``'s sample for that sequence."""
        if not self.has_ends and chunks and chunks[0].seq.kind is SeqKind.TOKENS:
            raise RuntimeError("this server holds only the server half: no full-model requests")
        try:
            return prepare(chunks, self.tables, self.cache, in_flight.sampled_index if in_flight else None)
        except BaseException:  # e.g. out of device memory copying or growing the tables: keep nothing staged
            self.tables.discard()
            raise

    def release(self, seq_id: int) -> None:
        """A sequence has ended: give its block-table row back."""
        self.tables.release(seq_id)

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
            meta = step_meta(info, batch.lengths, batch.width, self.tables, self.cache.block_size)
            parts = []
            if batch.num_token_seqs:
                x = F.embedding(ids, self.embed_w)
                if self.k:
                    tok_meta = meta if batch.hidden is None else step_meta(
                        info[:batch.num_token_seqs], batch.lengths[:batch.num_token_seqs], batch.width,
                        self.tables, self.cache.block_size)
                    x = self._run_layers(x, 0, self.k, tok_meta)
                parts.append(x)
            if batch.hidden is not None:
                parts.append(to_device(batch.hidden, dev).to(self.dtype))
            x = parts[0] if len(parts) == 1 else torch.cat(parts)
            x = self._run_layers(x, max(self.k, self.first), self.cfg.num_layers, meta)
            if batch.logit_rows:
                logits = self.logits(x[rows_index(batch.logit_rows, dev)])
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
            # to the host, then to fp32: converting on the device would allocate there, and only
            # an out-of-memory error in `launch` is undone (engine.failures.StepFailures.step_failed)
            out = handle.hidden_rows.cpu().float()
            hidden = {sid: out[r:r + n] for sid, r, n in batch.hidden_out}
        return tokens, hidden

    def run(self, batch: PreparedBatch) -> tuple[dict[int, int], dict[int, torch.Tensor]]:
        """``launch`` then ``finish``: one step, start to end."""
        return self.finish(self.launch(batch))

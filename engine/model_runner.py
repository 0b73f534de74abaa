"""One batched forward pass over ragged sequences, reading and writing the paged KV cache.

A batch mixes token chunks (full-model requests: embedding, then every layer) and hidden
chunks (split sessions: the client already ran layers [0, k)). All rows are packed along one
token axis. Token rows run layers [0, k) alone, then every row runs layers [k, L) together, so
the server's protected-split layers are batched across both kinds of work and all tenants.

Kernels: the fused Triton kernels on CUDA tensors, their torch twins on CPU (veil.kernels.ops
chooses per call from the tensors' device).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from veil.engine.kv_cache import PagedKVCache
from veil.engine.model import LlamaModel
from veil.engine.scheduler import Chunk
from veil.engine.sequence import SeqKind
from veil.kernels import ops


@dataclass
class BatchMeta:
    positions: torch.Tensor  # [N]
    slot_mapping: torch.Tensor  # [N]
    block_tables: torch.Tensor  # [B, max_blocks] int32
    cu_seqlens: torch.Tensor  # [B + 1] int32
    context_lens: torch.Tensor  # [B] int32
    decode_rows: torch.Tensor | None  # rows of length-1 chunks (CPU fast path)
    decode_seqs: torch.Tensor | None
    prefill_seqs: list[int]

    def prefix(self, num_seqs: int, num_rows: int) -> BatchMeta:
        """Metadata of the first num_seqs sequences (the token chunks, for layers [0, k))."""
        rows = self.decode_rows
        keep = None if rows is None else rows < num_rows
        return BatchMeta(
            self.positions[:num_rows], self.slot_mapping[:num_rows], self.block_tables[:num_seqs],
            self.cu_seqlens[:num_seqs + 1], self.context_lens[:num_seqs],
            None if rows is None else rows[keep], None if rows is None else self.decode_seqs[keep],
            [b for b in self.prefill_seqs if b < num_seqs],
        )


@dataclass
class PreparedBatch:
    meta: BatchMeta
    num_token_seqs: int
    token_ids: torch.Tensor  # [rows of token chunks]
    hidden: torch.Tensor | None  # [rows of hidden chunks, d]
    outputs: list[tuple[int, str, int, int]]


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [q + 2 kv, d]: one matmul for the three projections
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 I, d]
    down: torch.Tensor


class ModelRunner:
    def __init__(self, model: LlamaModel, k: int, cache: PagedKVCache, device: str | torch.device = "cpu",
                 max_positions: int | None = None):
        cfg = model.cfg
        self.cfg, self.model, self.k, self.cache = cfg, model, k, cache
        self.device = torch.device(device)
        self.first = model.first
        self.has_ends = model.with_ends and model.first == 0
        self.dtype = next(model.parameters()).dtype
        self.layers: dict[int, LayerWeights] = {}
        for i in range(model.first, model.last):
            b = model.layers[str(i)]
            a, m = b.self_attn, b.mlp
            self.layers[i] = LayerWeights(
                b.input_layernorm.weight.data,
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous(),
                a.o_proj.weight.data, b.post_attention_layernorm.weight.data,
                torch.cat([m.gate_proj.weight, m.up_proj.weight]).contiguous(), m.down_proj.weight.data,
            )
        self.cos, self.sin = ops.build_rope_cache(cfg.head_dim, max_positions or cfg.max_position_embeddings,
                                                  cfg.rope_theta, device=self.device)
        self.scale = cfg.head_dim ** -0.5

    # -- metadata ------------------------------------------------------------------------------
    def _meta(self, chunks: list[Chunk]) -> BatchMeta:
        bs = self.cache.block_size
        positions, slots, cu, ctx = [], [], [0], []
        width = max(len(c.seq.table.blocks) for c in chunks)
        tables = torch.zeros(len(chunks), width, dtype=torch.int32)
        decode_rows, decode_seqs, prefill = [], [], []
        for b, c in enumerate(chunks):
            blocks = c.seq.table.blocks
            tables[b, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            for p in range(c.start, c.end):
                positions.append(p)
                slots.append(blocks[p // bs] * bs + p % bs)
            if c.length == 1:
                decode_rows.append(cu[-1])
                decode_seqs.append(b)
            else:
                prefill.append(b)
            cu.append(cu[-1] + c.length)
            ctx.append(c.end)
        dev = self.device
        return BatchMeta(
            torch.tensor(positions, device=dev), torch.tensor(slots, device=dev, dtype=torch.long),
            tables.to(dev), torch.tensor(cu, dtype=torch.int32, device=dev),
            torch.tensor(ctx, dtype=torch.int32, device=dev),
            torch.tensor(decode_rows, device=dev, dtype=torch.long) if decode_rows else None,
            torch.tensor(decode_seqs, device=dev, dtype=torch.long) if decode_seqs else None, prefill,
        )

    # -- layers --------------------------------------------------------------------------------
    def _attention(self, q: torch.Tensor, layer: int, meta: BatchMeta) -> torch.Tensor:
        kc, vc = self.cache.k[layer - self.first], self.cache.v[layer - self.first]
        if q.is_cuda or meta.decode_rows is None:
            # One kernel for the whole ragged batch (a decode row is a chunk of length 1).
            return ops.paged_prefill_attention(q, kc, vc, meta.block_tables, meta.cu_seqlens, meta.context_lens,
                                               self.scale)
        if not meta.prefill_seqs:
            return ops.paged_decode_attention(q, kc, vc, meta.block_tables, meta.context_lens, self.scale)
        # CPU, mixed batch: the vectorised decode twin for single-token chunks, the per-sequence
        # prefill twin for the rest.
        out = torch.empty_like(q)
        d_seqs = meta.decode_seqs
        out[meta.decode_rows] = ops.paged_decode_attention(
            q[meta.decode_rows], kc, vc, meta.block_tables[d_seqs], meta.context_lens[d_seqs], self.scale)
        p = torch.tensor(meta.prefill_seqs, device=q.device)
        starts, ends = meta.cu_seqlens[p].long(), meta.cu_seqlens[p + 1].long()
        rows = torch.cat([torch.arange(s, e, device=q.device) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)])
        cu = torch.zeros(len(p) + 1, dtype=torch.int32, device=q.device)
        cu[1:] = torch.cumsum(ends - starts, 0)
        out[rows] = ops.paged_prefill_attention(q[rows], kc, vc, meta.block_tables[p], cu, meta.context_lens[p],
                                                self.scale)
        return out

    def _layer(self, i: int, x: torch.Tensor, residual: torch.Tensor | None, meta: BatchMeta):
        cfg, w = self.cfg, self.layers[i]
        n = x.shape[0]
        h, residual = ops.add_rms_norm(x, residual, w.input_norm, cfg.rms_norm_eps)
        qkv = h @ w.qkv.T
        q = qkv[:, :cfg.q_size].view(n, cfg.num_heads, cfg.head_dim)
        k = qkv[:, cfg.q_size:cfg.q_size + cfg.kv_size].view(n, cfg.num_kv_heads, cfg.head_dim)
        v = qkv[:, cfg.q_size + cfg.kv_size:].view(n, cfg.num_kv_heads, cfg.head_dim)
        ops.apply_rope(q, k, meta.positions, self.cos, self.sin)
        ops.store_kv(k, v, self.cache.k[i - self.first], self.cache.v[i - self.first], meta.slot_mapping)
        a = self._attention(q, i, meta).reshape(n, cfg.q_size)
        h, residual = ops.add_rms_norm(a @ w.o.T, residual, w.post_norm, cfg.rms_norm_eps)
        return ops.silu_and_mul(h @ w.gate_up.T) @ w.down.T, residual

    def _run_layers(self, x: torch.Tensor, first: int, last: int, meta: BatchMeta) -> torch.Tensor:
        residual = None
        for i in range(first, last):
            x, residual = self._layer(i, x, residual, meta)
        return x if residual is None else x + residual

    # -- the step ------------------------------------------------------------------------------
    def prepare(self, chunks: list[Chunk]) -> PreparedBatch:
        """Snapshot everything the forward pass reads from the sequences. Called under the
        engine's lock, so an abort on another thread cannot change a block table mid-step."""
        tok = [c for c in chunks if c.seq.kind is SeqKind.TOKENS]
        hid = [c for c in chunks if c.seq.kind is SeqKind.HIDDEN]
        assert chunks == tok + hid, "token chunks must come first"
        if tok and not self.has_ends:
            raise RuntimeError("this server holds only the server half: no full-model requests")
        ids = torch.tensor([t for c in tok for t in c.seq.token_ids[c.start:c.end]], dtype=torch.long)
        hidden = torch.cat([c.seq.hidden_slice(c.start, c.end) for c in hid]) if hid else None
        outputs = []  # (seq id, kind, first row, rows)
        offset = 0
        for c in chunks:
            if c.seq.kind is SeqKind.HIDDEN:
                outputs.append((c.seq.id, "hidden", offset, c.length))
            elif c.end == c.seq.num_inputs:
                outputs.append((c.seq.id, "logits", offset + c.length - 1, 1))
            offset += c.length
        return PreparedBatch(self._meta(chunks), len(tok), ids, hidden, outputs)

    @torch.inference_mode()
    def run(self, batch: PreparedBatch) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Returns (logits [vocab] per token sequence whose inputs are now all computed,
        output hidden rows per hidden chunk)."""
        meta, parts = batch.meta, []
        if batch.num_token_seqs:
            x = self.model.embed(batch.token_ids.to(self.device))
            n_tok = batch.token_ids.shape[0]
            parts.append(self._run_layers(x, 0, self.k, meta.prefix(batch.num_token_seqs, n_tok)) if self.k else x)
        if batch.hidden is not None:
            parts.append(batch.hidden.to(self.device, self.dtype))
        x = parts[0] if len(parts) == 1 else torch.cat(parts)
        x = self._run_layers(x, max(self.k, self.first), self.cfg.num_layers, meta)
        logits, hidden = {}, {}
        last_rows = [(sid, row) for sid, kind, row, _ in batch.outputs if kind == "logits"]
        for sid, kind, row, n in batch.outputs:
            if kind == "hidden":
                hidden[sid] = x[row:row + n]
        if last_rows:
            lg = self.model.logits(x[torch.tensor([r for _, r in last_rows], device=self.device)])
            logits = {sid: lg[i] for i, (sid, _) in enumerate(last_rows)}
        return logits, hidden

"""CUDA graphs of the full-model decode step, one per batch-size bucket.

A 135M-parameter model's decode step is a few hundred small kernels; launched one by one from
Python, the launches, not the GPU, set the pace. At engine start the whole step (embedding,
every layer, final norm and head) is captured once per bucket on static input buffers; a decode
step of n sequences then copies its inputs into the buffers of the smallest bucket >= n and
replays that graph. Padding rows write no KV (slot -1) and attend to nothing (context length 0,
which the decode kernel answers with zeros). Steps with prefill or split-session rows, and
batches larger than the largest bucket, run eagerly.

Everything inside the graph is free of host synchronisation: the decode kernel sizes its grid
from the block-table capacity, not from the context lengths.
"""

from __future__ import annotations

import torch

from veil.engine.batch import decode_meta

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


class DecodeGraphs:
    def __init__(self, runner, max_batch: int):
        dev = runner.device
        self.runner = runner
        self.buckets = [b for b in BUCKETS if b < max_batch] + [max_batch]
        n = max_batch
        self.ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slots = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.tables = torch.zeros(n, runner.tables.max_blocks, dtype=torch.int32, device=dev)
        self.ctx = torch.zeros(n, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        with torch.inference_mode():
            for b in reversed(self.buckets):  # largest first: the smaller ones reuse its pool
                meta = decode_meta(self.positions[:b], self.slots[:b], self.tables[:b], self.ctx[:b])
                # Warm up on a side stream first (Triton compiles, cuBLAS picks its kernels).
                side = torch.cuda.Stream(device=dev)
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    runner.forward_logits(self.ids[:b], meta)
                torch.cuda.current_stream(dev).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[b] = runner.forward_logits(self.ids[:b], meta)
                pool = graph.pool()
                self.graphs[b] = graph
        torch.cuda.synchronize(dev)

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def run(self, ids: torch.Tensor, info: torch.Tensor) -> torch.Tensor | None:
        """Logits [n, vocab] of a decode step (ids [n], info [n, 3] = (table row, position, 1)),
        or None when n is larger than every bucket (the caller then runs it eagerly)."""
        n = ids.shape[0]
        if n > self.max_batch:
            return None
        b = next(x for x in self.buckets if x >= n)
        bs = self.runner.cache.block_size
        rows, pos = info[:, 0], info[:, 1]
        tables = self.runner.tables.buf.index_select(0, rows)
        self.ids[:n].copy_(ids)
        self.positions[:n].copy_(pos)
        self.tables[:n].copy_(tables)
        self.slots[:n].copy_(tables.gather(1, (pos // bs)[:, None])[:, 0].long() * bs + pos % bs)
        self.ctx[:n].copy_(pos + 1)
        self.slots[n:b].fill_(-1)
        self.ctx[n:b].zero_()
        self.graphs[b].replay()
        return self.outputs[b][:n]

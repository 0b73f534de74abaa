"""Local (single-process) generation with the whole model: the baseline the split paths must
reproduce token for token under greedy decoding."""

from __future__ import annotations

import torch

from veil.engine.model import LayerKV, LlamaModel
from veil.engine.sampling import Sampler, SamplingParams


@torch.inference_mode()
def generate_local(model: LlamaModel, prompt_ids: list[int], max_new_tokens: int,
                   sampling: SamplingParams | None = None, stop_ids: tuple[int, ...] = ()) -> list[int]:
    if model.first != 0 or model.last != model.cfg.num_layers or not model.with_ends:
        raise ValueError("generate_local needs the whole model")
    sampler = Sampler(sampling or SamplingParams())
    kv: list[LayerKV | None] = [None] * model.cfg.num_layers
    ids, pos, out = list(prompt_ids), 0, []
    while len(out) < max_new_tokens:
        positions = torch.arange(pos, pos + len(ids))
        h, kv = model.forward_layers(model.embed(torch.tensor(ids)), positions, kv)
        token = sampler(model.logits(h[-1:])[0])
        out.append(token)
        if token in stop_ids:
            break
        pos, ids = pos + len(ids), [token]
    return out

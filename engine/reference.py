"""The reference implementation: `transformers`' own LlamaForCausalLM on the same weights.
Tests and benchmarks measure our engine against it."""

from __future__ import annotations

import inspect

import torch

from veil.engine.config import ModelConfig
from veil.engine.loader import Checkpoint


def hf_config(cfg: ModelConfig):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=cfg.bos_token_id, eos_token_id=list(cfg.eos_token_ids) or None,
    )


def build_reference(ckpt: Checkpoint, dtype: torch.dtype = torch.float32):
    """A transformers LlamaForCausalLM holding exactly the checkpoint's tensors."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(hf_config(ckpt.config)).to(dtype)
    missing, unexpected = model.load_state_dict(ckpt.tensors, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and ckpt.config.tie_word_embeddings)]
    if missing or unexpected:
        raise KeyError(f"reference model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if ckpt.config.tie_word_embeddings:
        model.tie_weights()
    return model.eval().requires_grad_(False)


@torch.inference_mode()
def reference_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of exactly max_new_tokens (EOS not special), with the HF KV cache."""
    ids = torch.tensor([prompt_ids])
    # transformers names the KV cache `cache` since 5.2x and drops `past_key_values` in 5.40; the
    # releases before (the GPU machines' 5.17) know only `past_key_values`
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out, past = [], None
    for _ in range(max_new_tokens):
        res = model(input_ids=ids, use_cache=True, **{kw: past})
        past = getattr(res, kw)
        token = int(res.logits[0, -1].argmax())
        out.append(token)
        ids = torch.tensor([[token]])
    return out

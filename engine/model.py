"""One Llama implementation for every party.

The same blocks run the client's first layers, the server's plaintext layers and the full
model of the fast path; the protected executor derives its computation from the same weights.
A `LlamaModel` may hold only a contiguous range of layers (a split half), with or without the
embedding and head. Parameter names follow Hugging Face's `LlamaForCausalLM` state dict, so
checkpoints, bundles and the reference implementation line up name for name.

Shapes are single-sequence and token-major: hidden states are [T, d] with explicit integer
positions [T]. The KV cache of one layer is a `LayerKV` (keys after RoPE, values), which a
forward pass never mutates: it returns the extended cache, and the caller commits it only
when the whole step succeeded (so a failed step leaves a session as it was).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from veil.engine.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in fp32 whatever the activation dtype, as the reference does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE in the "rotate half" convention: dimension i pairs with i + D/2."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos/sin: [T, D]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


@dataclass
class LayerKV:
    """Keys (after RoPE) and values of one layer for one sequence: [num_kv_heads, S, head_dim]."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def length(self) -> int:
        return self.k.shape[1]

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.q_size, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.kv_size, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.kv_size, bias=False)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, past: LayerKV | None
    ) -> tuple[torch.Tensor, LayerKV]:
        cfg = self.cfg
        T = x.shape[0]
        q = apply_rope(self.q_proj(x).view(T, cfg.num_heads, cfg.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(T, cfg.num_kv_heads, cfg.head_dim), cos, sin)
        v = self.v_proj(x).view(T, cfg.num_kv_heads, cfg.head_dim)
        k, v = k.transpose(0, 1), v.transpose(0, 1)  # [KV, T, D]
        if past is not None:
            k = torch.cat([past.k, k], dim=1)
            v = torch.cat([past.v, v], dim=1)
        # Causal mask by absolute position: cached keys hold positions 0..S-1 in order.
        key_pos = torch.arange(k.shape[1], device=x.device)
        mask = key_pos[None, :] <= positions[:, None]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k, v, attn_mask=mask, enable_gqa=cfg.num_heads != cfg.num_kv_heads
        )  # [H, T, D]
        out = out.transpose(0, 1).reshape(T, cfg.q_size)
        return self.o_proj(out), LayerKV(k, v)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, cos, sin, positions, past):
        a, kv = self.self_attn(self.input_layernorm(h), cos, sin, positions, past)
        h = h + a
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, kv


class LlamaModel(nn.Module):
    """Layers [first, last) of a Llama decoder, optionally with embedding and final norm/head."""

    def __init__(self, cfg: ModelConfig, first: int = 0, last: int | None = None, with_ends: bool = True):
        super().__init__()
        last = cfg.num_layers if last is None else last
        if not 0 <= first <= last <= cfg.num_layers:
            raise ValueError(f"bad layer range [{first}, {last}) for {cfg.num_layers} layers")
        self.cfg, self.first, self.last, self.with_ends = cfg, first, last, with_ends
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(first, last)})
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        if with_ends:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            if not cfg.tie_word_embeddings:
                self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    # -- weights, under Hugging Face names --------------------------------------------------
    @staticmethod
    def hf_name(local: str) -> str:
        if local.startswith("layers."):
            return "model." + local
        if local.startswith(("embed_tokens.", "norm.")):
            return "model." + local
        return local  # lm_head.weight

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return {self.hf_name(k): v for k, v in self.state_dict().items()}

    def load_hf_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy the tensors this model holds from an HF-named dict; extra tensors are ignored."""
        own = self.hf_state_dict()
        missing = [n for n in own if n not in tensors]
        if missing:
            raise KeyError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
        with torch.no_grad():
            for local, param in self.state_dict().items():
                src = tensors[self.hf_name(local)]
                if src.shape != param.shape:
                    raise ValueError(f"{self.hf_name(local)}: shape {tuple(src.shape)} != {tuple(param.shape)}")
                param.copy_(src.to(param.dtype))

    # -- compute ---------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)

    def forward_layers(
        self, h: torch.Tensor, positions: torch.Tensor, past: list[LayerKV | None]
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        """Run this model's layers on h [T, d]; `past` has one entry per layer held."""
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        new: list[LayerKV] = []
        for i, layer_past in zip(range(self.first, self.last), past, strict=True):
            h, kv = self.layers[str(i)](h, cos, sin, positions, layer_past)
            new.append(kv)
        return h, new

    def run_layers(self, h: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """h [T, d] at positions 0..T-1 through layers [first, last) of this model, causal and
        without a cache: the plaintext reference the protected path is checked against."""
        positions = torch.arange(h.shape[0])
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        for i in range(first, last):
            h, _ = self.layers[str(i)](h, cos, sin, positions, None)
        return h

    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: h [T, d] → logits [T, vocab] in fp32."""
        return (self.norm(h) @ self.head_weight().T).float()

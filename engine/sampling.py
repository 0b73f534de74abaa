"""Next-token sampling: greedy, temperature, top-k, top-p (nucleus)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 → greedy
    top_k: int = 0  # 0 → no top-k cut
    top_p: float = 1.0
    seed: int | None = None  # None → seeded from the OS CSPRNG

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"invalid sampling parameters {self}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    """Stateful (one generator per generation) so a seed reproduces the whole continuation."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.gen = torch.Generator().manual_seed(
            params.seed if params.seed is not None else secrets.randbits(63)
        )

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: [vocab] → token id."""
        if self.params.greedy:
            return int(torch.argmax(logits))
        probs = self.distribution(logits)
        if probs is None:  # degenerate logits: fall back to greedy
            return int(torch.argmax(logits))
        return int(torch.multinomial(probs, 1, generator=self.gen))

    def uniform(self) -> float:
        """One draw from U[0, 1) of this generation's randomness (speculative acceptance)."""
        return float(torch.rand((), generator=self.gen))

    def distribution(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The distribution a non-greedy draw samples from (temperature, top-k, top-p), or None
        for degenerate logits."""
        p = self.params
        logits = logits.float() / p.temperature
        if p.top_k:
            kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            # keep the smallest prefix whose mass reaches top_p (the first token always stays)
            keep = (sorted_p.cumsum(0) - sorted_p) < p.top_p
            keep[0] = True  # also when top_p rounds to 0 in float32 (a denormal top_p did: NaN)
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
            probs = probs / probs.sum()
        if not torch.isfinite(probs).all() or probs.sum() <= 0:
            return None
        return probs

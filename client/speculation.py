"""Speculative decoding on the protected path: drafts by prompt lookup, verified in one step.

A decode step of the protected path costs 3(L-k) round trips whatever it carries, so the client
drafts the next few tokens for free and has the server run them together with the token it just
sampled (a verify step: every position's h_L comes back). It keeps the longest prefix of the
drafts the model agrees with plus one token of its own, and the server takes the rest back off
its encrypted KV cache on the next step.

Drafts come from the text itself (prompt lookup): the tokens that followed the most recent
earlier occurrence of the longest n-gram the text ends with. No second model is needed, and a
rewrite of a given passage or code with repeated structure drafts well.

Acceptance keeps the output distribution exactly: greedily, a draft stays while it equals the
argmax; when sampling, the standard speculative-sampling rule with the draft as a point mass q:
draft x is accepted with probability min(1, p(x)/q(x)) = p(x), and on rejection the token comes
from the residual (p - q)+, i.e. p with x removed and renormalized. Each accepted or corrected
token is therefore distributed as p, the distribution plain decoding samples from.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["prompt_lookup", "accept"]


def prompt_lookup(tokens: list[int], n: int, max_ngram: int = 3) -> list[int]:
    """Up to ``n`` drafted tokens: those that followed the most recent earlier occurrence of the
    longest suffix n-gram of ``tokens`` (n-gram length ``max_ngram`` down to 1); [] when none."""
    if n < 1:
        return []
    for size in range(min(max_ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-size:]
        for start in range(len(tokens) - size - 1, -1, -1):  # most recent match first
            if tokens[start : start + size] == tail:
                return tokens[start + size : start + size + n]
    return []


def accept(drafts: list[int], logits: torch.Tensor, probs: Callable[[torch.Tensor], torch.Tensor] | None,
           uniform: Callable[[], float]) -> tuple[int, int]:
    """Verify ``drafts`` against the model: ``logits[i]`` ([len(drafts) + 1, vocab]) is the model's
    next-token logits after the token before ``drafts[i]`` (the last row: after the last draft).
    Returns (how many drafts stay, the token that follows them). ``probs`` maps a logits row to
    the sampling distribution (temperature, top-k, top-p); None is greedy. ``uniform`` draws
    from U[0, 1) (the request's sampling randomness)."""
    if logits.shape[0] != len(drafts) + 1:
        raise ValueError("one logits row per draft, plus one")
    for i, x in enumerate(drafts):
        if probs is None:
            best = int(torch.argmax(logits[i]))
            if best != x:
                return i, best
            continue
        p = probs(logits[i])
        if uniform() < float(p[x]):
            continue
        rest = p.clone()
        rest[x] = 0.0
        return i, _draw(rest, uniform())
    last = logits[len(drafts)]
    return len(drafts), int(torch.argmax(last)) if probs is None else _draw(probs(last), uniform())


def _draw(p: torch.Tensor, u: float) -> int:
    """The token where ``u`` falls in p's cumulative mass (p need not be normalized)."""
    cdf = torch.cumsum(p.double(), 0)
    if float(cdf[-1]) <= 0:
        raise ValueError("no probability mass left to sample from")
    return int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True)
               .clamp(max=p.numel() - 1))

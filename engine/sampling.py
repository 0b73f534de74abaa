"""Next-token sampling for a whole batch in one call: greedy, temperature, top-k, top-p.

Every row has its own parameters. Randomness is counter-based: row i draws one uniform from a
hash of (its request's seed, the index of the token being sampled), and picks the token where
that uniform falls in the row's kept probability mass (inverse CDF). A seeded request therefore
draws the same numbers whatever else shares its batch, and a step needs no generator state, no
per-row loop and no host round trip (the engine copies the sampled ids to the host once).
These seeds are sampling seeds, not key material; unseeded requests get one from the OS CSPRNG.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch

from veil.kernels.host import to_device

TOP_K_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 → greedy
    top_k: int = 0  # 0 → no top-k cut
    top_p: float = 1.0
    seed: int | None = None  # None → seeded from the OS CSPRNG

    def __post_init__(self):
        # top_k travels in an int64 tensor (SamplingBatch): one past it once crashed the engine
        # loop for every request (found by schemathesis); any k >= the vocabulary cuts nothing
        if not 0 <= self.temperature < math.inf or not 0 < self.top_p <= 1 or not 0 <= self.top_k <= TOP_K_MAX:
            raise ValueError(f"invalid sampling parameters {self}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


_M32 = 0xFFFFFFFF
_UNIFORM_STREAM = 1 << 31  # counters of Sampler.uniform's draws; token counters stay below


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32) held in int64, in 16-bit halves so no product
    overflows int64 (signed overflow is not something to rely on across devices)."""
    hi = (((x >> 16) * c) & 0xFFFF) << 16
    return (hi + (x & 0xFFFF) * c) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds, the "lowbias32" constants)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x21F0AAAD)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x735A2D97)
    return x ^ (x >> 15)


def uniforms(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One float32 uniform in [0, 1) per row from (seed [B] int64 >= 0, counter [B] int64)."""
    h = _mix32((counters & _M32) ^ 0x9E3779B9)
    h = _mix32(h ^ (seeds & _M32))
    h = _mix32(h ^ ((seeds >> 32) & _M32))
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


@dataclass
class SamplingBatch:
    """Per-row sampling parameters of one step, as tensors on the logits' device."""

    temperature: torch.Tensor  # [B] float32, 0 → greedy
    top_k: torch.Tensor  # [B] int64, 0 → no cut
    top_p: torch.Tensor  # [B] float32
    seeds: torch.Tensor  # [B] int64
    counters: torch.Tensor  # [B] int64: tokens this request has sampled before
    all_greedy: bool
    cuts: bool  # some row has a top-k or top-p cut (needs the sorted path)

    @classmethod
    def build(cls, params: list[SamplingParams], seeds: list[int], counters: list[int],
              device: torch.device | str = "cpu") -> SamplingBatch | None:
        """None when every row is greedy (argmax needs no parameters)."""
        if all(p.greedy for p in params):
            return None
        f = torch.tensor([[p.temperature, p.top_p] for p in params], dtype=torch.float32)
        i = torch.tensor([[p.top_k, s, c] for p, s, c in zip(params, seeds, counters, strict=True)],
                         dtype=torch.int64)
        f, i = to_device(f, torch.device(device)), to_device(i, torch.device(device))
        cuts = any(not p.greedy and (p.top_k or p.top_p < 1.0) for p in params)
        return cls(f[:, 0], i[:, 0], f[:, 1], i[:, 1], i[:, 2], False, cuts)


def new_seed(params: SamplingParams) -> int:
    """The request's sampling seed: its own, or 63 bits from the OS CSPRNG."""
    return params.seed % (1 << 63) if params.seed is not None else secrets.randbits(63)


def _kept_probs(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's probabilities after temperature, top-k and top-p (unnormalised after the
    cuts): in vocab order (order None), or sorted by logit with `order` the sort's indices."""
    vocab = logits.shape[-1]
    # Greedy rows divide by 1 (their result is the argmax above); the others by their temperature.
    temp = torch.where(batch.temperature > 0, batch.temperature, torch.ones_like(batch.temperature))
    scaled = logits / temp[:, None]
    if batch.cuts:
        scaled, order = torch.sort(scaled, dim=-1, descending=True)
        k = torch.where(batch.top_k > 0, batch.top_k, torch.full_like(batch.top_k, vocab))
        rank = torch.arange(vocab, device=logits.device)
        # ties at the k-th logit are cut by rank (the sort's order), not kept together
        scaled = scaled.masked_fill(rank[None, :] >= k[:, None], float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        # keep the smallest prefix whose mass reaches top_p; the most likely token always stays
        # (also when top_p rounds to 0 in float32: a denormal top_p once gave NaN)
        keep = (probs.cumsum(-1) - probs) < batch.top_p[:, None]
        keep[:, 0] = True
        probs = probs * keep
    else:
        order = None
        probs = torch.softmax(scaled, dim=-1)
    return probs, order


def sample(logits: torch.Tensor, batch: SamplingBatch | None) -> torch.Tensor:
    """logits [B, vocab] → token ids [B] int64, on the logits' device. batch None: all greedy."""
    greedy = torch.argmax(logits, dim=-1)
    if batch is None:
        return greedy
    vocab = logits.shape[-1]
    probs, order = _kept_probs(logits.float(), batch)
    cdf = probs.cumsum(-1)
    total = cdf[:, -1]
    target = uniforms(batch.seeds, batch.counters) * total
    idx = torch.searchsorted(cdf, target[:, None], right=True).clamp_(max=vocab - 1)
    token = idx[:, 0] if order is None else order.gather(1, idx)[:, 0]
    # degenerate rows (NaN / inf logits, no mass left) fall back to greedy, as do greedy rows
    bad = ~torch.isfinite(total) | (total <= 0) | (batch.temperature <= 0)
    return torch.where(bad, greedy, token)


class Sampler:
    """One request's sampler (the client SDK's and the local generator's): the batch sampler on
    one row, with the request's seed and a count of the tokens drawn so far."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.seed = new_seed(params)
        self.count = 0  # tokens drawn
        self.draws = 0  # uniforms drawn (uniform())

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: [vocab] → token id."""
        batch = SamplingBatch.build([self.params], [self.seed], [self.count], logits.device)
        self.count += 1
        return int(sample(logits[None], batch)[0])

    def uniform(self) -> float:
        """One draw from U[0, 1) of this generation's randomness (speculative acceptance): its
        own counter stream, apart from the token draws'."""
        u = uniforms(torch.tensor([self.seed]), torch.tensor([_UNIFORM_STREAM + self.draws]))
        self.draws += 1
        return float(u[0])

    def distribution(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The distribution a non-greedy draw samples from (temperature, top-k, top-p), in vocab
        order, or None for greedy parameters and degenerate logits."""
        batch = SamplingBatch.build([self.params], [self.seed], [self.count], logits.device)
        if batch is None:
            return None
        probs, order = _kept_probs(logits[None].float(), batch)
        total = probs.sum()
        if not torch.isfinite(total) or total <= 0:
            return None
        p = probs[0] if order is None else torch.zeros_like(probs[0]).scatter_(0, order[0], probs[0])
        return p / p.sum()

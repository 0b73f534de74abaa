"""Sampling units."""

import torch

from veil.engine.sampling import Sampler, SamplingParams


def test_greedy_and_seeded():
    logits = torch.tensor([0.1, 3.0, 0.2, 2.9])
    assert Sampler(SamplingParams())(logits) == 1
    p = SamplingParams(temperature=1.0, seed=3)
    a, b = Sampler(p), Sampler(p)
    assert [a(logits) for _ in range(20)] == [b(logits) for _ in range(20)]


def test_top_k_and_top_p_cut_the_tail():
    logits = torch.tensor([5.0, 4.0, 0.0, -1.0, -2.0])
    s = Sampler(SamplingParams(temperature=1.0, top_k=2, seed=0))
    assert {s(logits) for _ in range(200)} <= {0, 1}
    # softmax mass of token 0 is ~0.71: top_p=0.5 keeps it alone
    s = Sampler(SamplingParams(temperature=1.0, top_p=0.5, seed=0))
    assert {s(logits) for _ in range(100)} == {0}
    s = Sampler(SamplingParams(temperature=1.0, top_p=0.95, seed=0))
    assert {s(logits) for _ in range(300)} == {0, 1}


def test_denormal_top_p_keeps_the_top_token():
    """top_p = 5e-324 rounds to 0 in float32; it used to zero every probability (NaN) and crash
    the engine loop (found by schemathesis). The most likely token must always stay."""
    logits = torch.tensor([0.5, 3.0, 1.0, -2.0])
    s = Sampler(SamplingParams(temperature=1.0, top_p=5e-324, top_k=10**15, seed=1))
    assert all(s(logits) == 1 for _ in range(20))

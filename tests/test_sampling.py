"""Sampling units."""

import pytest
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


# --------------------------------------------------------------------------- the batch sampler
from veil.engine.sampling import SamplingBatch, sample, uniforms  # noqa: E402


def _batch(params, seeds, counters):
    return SamplingBatch.build(params, seeds, counters)


def test_batch_greedy_is_argmax_and_needs_no_parameters():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    assert SamplingBatch.build([SamplingParams()] * 5, [1] * 5, [0] * 5) is None
    assert torch.equal(sample(logits, None), logits.argmax(-1))
    # a greedy row in a mixed batch is still its argmax
    b = _batch([SamplingParams(), SamplingParams(temperature=1.0, seed=1)], [1, 2], [0, 0])
    assert int(sample(logits[:2], b)[0]) == int(logits[0].argmax())


def test_batch_seeded_rows_do_not_depend_on_the_batch():
    """Row i's draw depends on (its seed, its counter, its logits) only: the same request gives
    the same tokens alone or among others, at any row."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 300, generator=gen)
    p = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7)
    others = [SamplingParams(temperature=1.3, seed=3), SamplingParams(), SamplingParams(temperature=0.5, top_p=0.5)]
    for counter in range(20):
        alone = sample(logits[2:3], _batch([p], [7], [counter]))
        mixed = sample(logits[[0, 1, 2, 3]], _batch([others[0], others[1], p, others[2]], [3, 9, 7, 5],
                                                    [counter + 4, 0, counter, 11]))
        assert int(alone[0]) == int(mixed[2])
    # and a different counter or seed gives a different stream
    draws = lambda seed: [int(sample(logits[2:3], _batch([p], [seed], [c]))[0]) for c in range(30)]  # noqa: E731
    assert draws(7) == draws(7) and draws(7) != draws(8)


def test_batch_per_row_cuts():
    logits = torch.tensor([[5.0, 4.0, 0.0, -1.0, -2.0]] * 3)
    params = [SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=1.0, top_p=0.5),
              SamplingParams(temperature=1.0)]
    seen = [set(), set(), set()]
    for c in range(400):
        toks = sample(logits, _batch(params, [11, 12, 13], [c, c, c])).tolist()
        for i, t in enumerate(toks):
            seen[i].add(t)
    assert seen[0] == {0, 1} and seen[1] == {0} and len(seen[2]) >= 3


def test_batch_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None].expand(4000, -1)
    n = logits.shape[0]
    b = _batch([SamplingParams(temperature=1.0)] * n, list(range(n)), [0] * n)
    freq = torch.bincount(sample(logits, b), minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.03), freq


def test_uniforms_range_and_spread():
    u = uniforms(torch.arange(10000, dtype=torch.long) * 7919, torch.zeros(10000, dtype=torch.long))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.02
    big = uniforms(torch.tensor([2**63 - 1, 0]), torch.tensor([2**40, 3]))
    assert ((big >= 0) & (big < 1)).all()


def test_batch_degenerate_rows_fall_back_to_greedy():
    logits = torch.tensor([[0.5, float("nan"), 1.0], [0.1, 3.0, 0.2]])
    b = _batch([SamplingParams(temperature=1.0, seed=1)] * 2, [1, 1], [0, 0])
    assert int(sample(logits, b)[1]) in (0, 1, 2)
    tok = sample(logits, b)
    assert int(tok[0]) == int(torch.argmax(logits[0]))


def test_sampler_distribution_and_uniform_match_its_draws():
    """The SDK's speculative acceptance uses the sampler's distribution and its own uniforms: the
    distribution is the one the sampler draws from, and the uniforms are a reproducible stream."""
    logits = torch.tensor([2.0, 1.5, 0.0, -1.0, 0.5])
    p = SamplingParams(temperature=0.7, top_k=3, seed=5)
    dist = Sampler(p).distribution(logits)
    assert dist[2] == 0 and dist[3] == 0 and abs(float(dist.sum()) - 1) < 1e-6
    s = Sampler(p)
    freq = torch.bincount(torch.tensor([s(logits) for _ in range(3000)]), minlength=5).float() / 3000
    assert torch.allclose(freq, dist, atol=0.03), (freq, dist)
    assert Sampler(SamplingParams()).distribution(logits) is None
    a, b = Sampler(p), Sampler(p)
    us = [a.uniform() for _ in range(5)]
    assert us == [b.uniform() for _ in range(5)] and all(0 <= u < 1 for u in us) and len(set(us)) == 5


def test_sampling_parameters_the_engine_cannot_hold_are_refused():
    """top_k travels in an int64 tensor; a temperature must be a number."""
    import math

    from veil.engine.sampling import TOP_K_MAX

    SamplingParams(temperature=1.0, top_k=TOP_K_MAX)
    for bad in ({"top_k": TOP_K_MAX + 1}, {"top_k": -1}, {"temperature": math.inf}, {"temperature": math.nan},
                {"top_p": math.nan}, {"top_p": 0.0}):
        with pytest.raises(ValueError):
            SamplingParams(**{"temperature": 1.0, **bad})

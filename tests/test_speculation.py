"""Prompt-lookup drafting and the acceptance rule of speculative decoding (client side, no HE)."""

import random

import pytest
import torch

from veil.client.speculation import accept, prompt_lookup


def test_prompt_lookup_continues_the_most_recent_longest_match():
    t = [1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3]
    assert prompt_lookup(t, 2) == [5, 7]  # "1 2 3" last seen before 5 7
    assert prompt_lookup(t, 5) == [5, 7, 1, 2, 3]
    assert prompt_lookup([4, 5, 6, 5], 3) == [6, 5]  # only the 1-gram "5" matches
    assert prompt_lookup([1, 2, 3], 4) == [] and prompt_lookup([], 3) == [] and prompt_lookup([1, 1], 0) == []
    assert prompt_lookup([7, 8, 7], 3, max_ngram=1) == [8, 7]


def test_greedy_acceptance_keeps_the_longest_agreeing_prefix():
    vocab = 10
    rows = torch.full((4, vocab), -5.0)
    for i, tok in enumerate((3, 4, 6, 8)):
        rows[i, tok] = 5.0
    assert accept([3, 4, 6], rows, None, random.random) == (3, 8)  # all stay, then the model's own
    assert accept([3, 5, 6], rows, None, random.random) == (1, 4)  # the second draft differs
    assert accept([], rows[:1], None, random.random) == (0, 3)
    with pytest.raises(ValueError):
        accept([3], rows, None, random.random)


def test_sampled_acceptance_keeps_the_model_distribution():
    """Whatever the draft, the first token out is distributed as p (and the second, when the
    first draft stays, as the next row's p): Monte Carlo over 40k trials, a test-only RNG."""
    torch.manual_seed(0)
    p0, p1 = torch.softmax(torch.randn(6), 0), torch.softmax(torch.randn(6), 0)
    rows = torch.stack([p0.log(), p1.log()])
    rng = random.Random(1)
    for draft in (0, 3):
        counts = torch.zeros(6)
        for _ in range(40000):
            kept, nxt = accept([draft], rows, lambda lg: torch.softmax(lg, 0), rng.random)
            counts[draft if kept else nxt] += 1
        assert torch.allclose(counts / counts.sum(), p0, atol=0.01), (draft, counts / counts.sum(), p0)

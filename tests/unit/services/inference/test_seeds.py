"""Seeds reach the sampler whole: torch's generator keeps only a seed's low 32 bits, so seeds that differ above
them sampled the same tokens (the agent loop's per-task seeds did) until the engines folded the high half in."""

from __future__ import annotations

import asyncio

import torch

from orchard.services.inference.engines.base import SamplingParams, seed_bits
from orchard.services.inference.engines.sampling import Sequence


def draws(seed: int, count: int = 16) -> list[int]:
    """`count` tokens a seeded sequence picks from a flat distribution over 1,000 tokens."""
    sequence = Sequence(0, [1], SamplingParams(max_tokens=count, seed=seed), asyncio.Queue(), frozenset())
    return [sequence.choose(torch.zeros(1000)) for _ in range(count)]


def test_seeds_that_differ_only_above_32_bits_sample_differently() -> None:
    assert draws(7) == draws(7)  # a seed repeats
    assert draws(7) != draws(7 + (1 << 32)) != draws(7 + (5 << 40))
    assert draws(0) != draws(1 << 32)


def test_seed_bits_fold_every_bit_of_an_int64_into_32() -> None:
    assert seed_bits(12345) == 12345  # a small seed is itself: seeded runs before the fold repeat
    assert len({seed_bits(7 + (k << 32)) for k in range(64)}) == 64
    for seed in (0, 1, 2**31, 2**32 - 1, 2**63 - 1, -1, -(2**63)):
        assert 0 <= seed_bits(seed) < 2**32
    assert seed_bits(-1) != seed_bits(-2)

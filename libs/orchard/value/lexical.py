"""The value model's lexical part: a linear score over the hashed words and word pairs of a rendered candidate
(the bag of tokens of docs/training.md §2.6's CPU toy), added to the encoder head's logit — a "wide and deep" model.

Why [I]: on a small store (tens of tasks) the outcome shows in short phrases — a test summary, "still fail", a
revert-and-retry, a patch that only deletes lines — and a pretrained sentence encoder fine-tuned for a few dozen
CPU steps does not pick them out (held-out AUC about 0.5 in bench/value_real_run.py), while a linear model over
word pairs, fitted to convergence in seconds, does. It reads the whole rendering, including the middle the
encoder's context cuts. Its weights are one float per hashed feature (1 MiB).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from itertools import accumulate, pairwise

import torch

FEATURES = 1 << 18
"""Hash buckets of the words and word pairs (collisions are rare at a few thousand distinct n-grams a task)."""
CACHE_TEXTS = 20_000
"""Texts whose buckets are remembered (training shows each candidate many times)."""
_TOKEN = re.compile(r"\w+|[^\w\s]+")


def feature_ids(text: str, features: int = FEATURES) -> list[int]:
    """The sorted, distinct hash buckets of `text`'s lower-cased words (and punctuation runs) and adjacent pairs.
    crc32, not hash(): the buckets must be the same in every process that loads the checkpoint."""
    tokens = _TOKEN.findall(text.lower())
    grams = [*tokens, *(f"{a} {b}" for a, b in pairwise(tokens))]
    return sorted({zlib.crc32(g.encode()) % features for g in grams})


class LexicalHead(torch.nn.Module):
    """A bag-of-features linear score: the sum of the weights of a text's buckets plus a bias, zero-initialised
    (an untrained part adds nothing)."""

    def __init__(self, features: int = FEATURES) -> None:
        super().__init__()
        self.features = features
        self.bag = torch.nn.EmbeddingBag(features, 1, mode="sum")
        torch.nn.init.zeros_(self.bag.weight)
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self._cache: dict[str, list[int]] = {}

    def ids(self, text: str) -> list[int]:
        """`feature_ids` of `text`, remembered (training shows each candidate many times)."""
        found = self._cache.get(text)
        if found is None:
            if len(self._cache) >= CACHE_TEXTS:  # a long-lived value service must not grow without bound
                self._cache.clear()
            found = self._cache[text] = feature_ids(text, self.features)
        return found

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        rows = [self.ids(t) for t in texts]
        flat = torch.tensor([i for r in rows for i in r], dtype=torch.long)
        offsets = torch.tensor(list(accumulate((len(r) for r in rows[:-1]), initial=0)), dtype=torch.long)
        return self.bag(flat, offsets).squeeze(-1) + self.bias

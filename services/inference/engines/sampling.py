"""One sequence being generated: how it picks its next token (temperature, top-k, top-p, its own seeded
generator), and how its tokens become text events (incremental decoding, stop strings, finish reasons)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch

from orchard.services.inference.engines.base import SamplingParams, TokenEvent, seed_bits

Decode = Callable[[list[int]], str]


class Sequence:
    """One choice of one request. The worker thread owns its generation state; the event loop only sets `aborted`."""

    def __init__(
        self,
        index: int,
        prompt_ids: list[int],
        params: SamplingParams,
        queue: asyncio.Queue[TokenEvent | BaseException],
        stop_token_ids: frozenset[int],
    ) -> None:
        self.index = index
        self.prompt_ids = prompt_ids
        self.params = params
        self.queue = queue
        """Where this request's events go (shared by its n sequences)."""
        self.stop_token_ids = stop_token_ids
        self.aborted = False
        """Set by the event loop when the client went away; the batch drops the sequence before its next step."""
        self.finished = False
        self.out_ids: list[int] = []
        self._sent_chars = 0
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        self.generator = torch.Generator()
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed_bits(params.seed + index))

    def choose(self, logits: torch.Tensor) -> int:
        """Sample the next token from this position's raw logits ([vocab], float32)."""
        p = self.params
        if p.temperature == 0:
            return int(torch.argmax(logits))
        scores = logits / p.temperature
        if 0 < p.top_k < scores.shape[-1]:
            kth = torch.topk(scores, p.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=True)
            probs = torch.softmax(sorted_scores, -1)
            # Drop a token when the tokens before it already reach top_p (the first always stays).
            drop = (torch.cumsum(probs, -1) - probs) >= p.top_p
            sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
            scores = torch.full_like(scores, float("-inf")).scatter(0, order, sorted_scores)
        probs = torch.softmax(scores, -1)
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def advance(self, logprobs: torch.Tensor, decode: Decode) -> TokenEvent:
        """Sample from this position (its full-vocabulary log-probs; equal to the raw logits' choice) and
        return the event: the token, the text it completes, and whether the sequence ended."""
        token = self.choose(logprobs)
        self.out_ids.append(token)
        p = self.params
        lps = [float(logprobs[token])] if p.logprobs else []
        tops: list[list[tuple[int, float]]] = []
        if p.top_logprobs:
            values, ids = torch.topk(logprobs, p.top_logprobs)
            tops = [list(zip(ids.tolist(), values.tolist(), strict=True))]
        text = decode(self.out_ids)
        finish, stop_sequence = None, ""
        if token in self.stop_token_ids:
            finish = "stop"
        else:
            hits = [(text.find(s), s) for s in p.stop if s in text]
            if hits:
                cut, stop_sequence = min(hits)
                text, finish = text[:cut], "stop"
            elif len(self.out_ids) >= p.max_tokens:
                finish = "length"
        if finish is None:
            # Hold back an incomplete UTF-8 character and anything that may be the start of a stop string.
            end = len(text.rstrip("\ufffd")) if text.endswith("\ufffd") else len(text)
            end = max(self._sent_chars, min(end, len(text) - self._hold))
        else:
            end = len(text)
            self.finished = True
        delta = text[self._sent_chars : end]
        self._sent_chars = max(self._sent_chars, end)
        return TokenEvent(
            index=self.index,
            token_ids=[token],
            text=delta,
            logprobs=lps,
            top_logprobs=tops,
            finish_reason=finish,
            stop_sequence=stop_sequence,
        )

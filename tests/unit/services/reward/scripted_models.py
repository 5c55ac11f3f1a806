"""A scripted stand-in for the inference service, for unit tests only: it answers the judge with canned text and
the teacher with canned log-probs, and records every call. Integration tests use the real inference service."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from orchard.errors import OrchardError
from orchard.services.reward.models import ChatReply, Scores


@dataclass
class ScriptedModels:
    """FAKE (unit tests only): `chat_reply` is the judge's answer (or an exception to raise); `score_fn` maps
    (context, continuation) to log-probs."""

    chat_reply: str | OrchardError = ""
    chat_delay_s: float = 0.0
    score_fn: Callable[[list[int], list[int]], list[float]] = lambda ctx, cont: [-0.5] * len(cont)
    context: int = 8192
    vocab: int = 1000
    chats: list[tuple[str, str, str]] = field(default_factory=list)
    scores: list[tuple[list[int], list[int]]] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0

    async def chat(
        self, model: str, system: str, user: str, *, temperature: float, max_tokens: int, timeout: float
    ) -> ChatReply:
        self.chats.append((model, system, user))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.chat_delay_s)
        finally:
            self.in_flight -= 1
        if isinstance(self.chat_reply, OrchardError):
            raise self.chat_reply
        return ChatReply(text=self.chat_reply, model=model or "scripted-judge")

    async def score(self, model: str, context_ids: list[int], continuation_ids: list[int], *, timeout: float) -> Scores:
        from orchard.errors import InvalidArgument

        if any(t >= self.vocab for t in context_ids + continuation_ids):
            raise InvalidArgument(
                f"continuation_token_ids holds a token id outside the vocabulary [0, {self.vocab})",
                field="continuation_token_ids",
            )
        self.scores.append((context_ids, continuation_ids))
        return Scores(
            logprobs=self.score_fn(context_ids, continuation_ids),
            model=model or "scripted-teacher",
            weights_version="v0",
        )

    async def context_length(self, model: str, *, timeout: float) -> int:
        return self.context

"""What every front end (gRPC servicer, OpenAI endpoint) does around an engine: check the model name and the
request's limits, build validated SamplingParams, and gather a stream of token events into finished choices."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from orchard.errors import InvalidArgument, NotFound
from orchard.services.inference.engines.base import Engine, FinishReason, SamplingParams, TokenEvent

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16


def check_model(engine: Engine, model: str) -> None:
    """Raise NotFound unless `model` is empty (the default) or the served model's id."""
    if model and model != engine.info.model_id:
        raise NotFound(
            f"model {model!r} is not served here; this service serves {engine.info.model_id!r} "
            "(leave model empty for it)",
            field="model",
        )


def check_token_ids(engine: Engine, ids: list[int], field_name: str) -> None:
    vocab = engine.info.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidArgument(
            f"{field_name} holds token id {bad}, outside the vocabulary [0, {vocab})", field=field_name
        )


def sampling_params(
    engine: Engine,
    prompt_len: int,
    *,
    max_tokens: int,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int = 0,
    stop: list[str] | tuple[str, ...] = (),
    seed: int | None = None,
    n: int = 0,
    logprobs: bool = False,
    top_logprobs: int = 0,
    max_n: int = 16,
) -> SamplingParams:
    """Validate a request's sampling fields (proto semantics: 0/None = default) into SamplingParams.

    Raises InvalidArgument naming the field and the allowed range.
    """
    context = engine.info.max_context_tokens
    if prompt_len == 0:
        raise InvalidArgument("the prompt is empty; give at least one token", field="prompt")
    if prompt_len >= context:
        raise InvalidArgument(
            f"the prompt has {prompt_len} tokens; the model's context is {context}, so it must be shorter",
            field="prompt",
        )
    if max_tokens < 0:
        raise InvalidArgument(
            f"max_tokens must be >= 0 (0 = up to the context), got {max_tokens}", field="sampling.max_tokens"
        )
    room = context - prompt_len
    if max_tokens > room:
        raise InvalidArgument(
            f"max_tokens {max_tokens} plus the prompt's {prompt_len} tokens exceed the model's "
            f"context of {context}; ask for at most {room}",
            field="sampling.max_tokens",
        )
    temperature = 1.0 if temperature is None else temperature
    if not (math.isfinite(temperature) and 0 <= temperature <= 100):
        raise InvalidArgument(
            f"temperature must be between 0 (greedy) and 100, got {temperature}", field="sampling.temperature"
        )
    top_p = 1.0 if top_p is None else top_p
    if not 0 < top_p <= 1:
        raise InvalidArgument(f"top_p must be in (0, 1], got {top_p}", field="sampling.top_p")
    if top_k < 0:
        raise InvalidArgument(f"top_k must be >= 0 (0 = no cut), got {top_k}", field="sampling.top_k")
    n = n or 1
    if not 1 <= n <= max_n:
        raise InvalidArgument(f"n must be between 1 and {max_n}, got {n}", field="sampling.n")
    if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidArgument(
            f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top_logprobs}", field="sampling.top_logprobs"
        )
    if len(stop) > MAX_STOP_STRINGS or any(not s for s in stop):
        raise InvalidArgument(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings", field="sampling.stop")
    return SamplingParams(
        max_tokens=max_tokens or room,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        stop=tuple(stop),
        seed=seed,
        n=n,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )


@dataclass
class Completion:
    """One finished choice, gathered from its token events."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_sequence: str = ""

    def add(self, event: TokenEvent) -> None:
        self.text += event.text
        self.token_ids += event.token_ids
        self.logprobs += event.logprobs
        self.top_logprobs += event.top_logprobs
        if event.finish_reason is not None:
            self.finish_reason, self.stop_sequence = event.finish_reason, event.stop_sequence


async def collect(
    engine: Engine, prompt_ids: list[int], params: SamplingParams, images: Sequence[bytes] = ()
) -> list[Completion]:
    """Run a request to the end; the n choices, ordered by index."""
    choices = [Completion(i) for i in range(params.n)]
    async with contextlib.aclosing(engine.generate(prompt_ids, params, images)) as events:
        async for event in events:
            choices[event.index].add(event)
    return choices


def stream(
    engine: Engine, prompt_ids: list[int], params: SamplingParams, images: Sequence[bytes] = ()
) -> contextlib.aclosing[AsyncGenerator[TokenEvent, None]]:
    """engine.generate wrapped so that leaving the `async with` early aborts the sequences at once."""
    return contextlib.aclosing(engine.generate(prompt_ids, params, images))

"""The vllm engine's request/response mapping. There is no GPU and no vLLM on this machine, so vLLM's output
objects are stood in for by dataclasses with the same attributes (bench/vllm_engine.py runs the real engine)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from orchard.services.inference.engines.base import SamplingParams
from orchard.services.inference.engines.vllm_engine import sampling_kwargs, score_result, token_event


@dataclass
class FakeLogprob:
    """vllm.sequence.Logprob's fields."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FakeCompletionOutput:
    """vllm.outputs.CompletionOutput's fields."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, FakeLogprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: None = None
    extra: dict[str, object] = field(default_factory=dict)


@pytest.mark.parametrize(("params", "expected"), [
    (SamplingParams(max_tokens=8), {"n": 1, "max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                    "stop": [], "seed": None, "logprobs": None, "skip_special_tokens": True}),
    (SamplingParams(max_tokens=3, temperature=0.0, top_p=0.9, top_k=40, stop=("\n",), seed=7, n=4, logprobs=True),
     {"n": 4, "max_tokens": 3, "temperature": 0.0, "top_p": 0.9, "top_k": 40, "stop": ["\n"], "seed": 7,
      "logprobs": 0, "skip_special_tokens": True}),
    (SamplingParams(max_tokens=3, top_logprobs=5),
     {"n": 1, "max_tokens": 3, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "stop": [], "seed": None,
      "logprobs": 5, "skip_special_tokens": True}),
])
def test_sampling_kwargs(params: SamplingParams, expected: dict[str, object]) -> None:
    """Our params map 1:1 onto vllm.SamplingParams; logprobs=0 asks vLLM for the sampled token's only."""
    assert sampling_kwargs(params) == expected


def test_token_event_with_logprobs_and_tops() -> None:
    """A delta output's tokens, sampled log-probs and ranked alternatives come through per position."""
    out = FakeCompletionOutput(index=1, text=" Paris", token_ids=[5, 9], logprobs=[
        {5: FakeLogprob(-0.1, 1), 6: FakeLogprob(-2.5, 2), 7: FakeLogprob(-3.0, 3)},
        {9: FakeLogprob(-1.2, 2), 3: FakeLogprob(-0.4, 1)},
    ])
    event = token_event(out, SamplingParams(max_tokens=4, logprobs=True, top_logprobs=2))
    assert (event.index, event.token_ids, event.text, event.finish_reason) == (1, [5, 9], " Paris", None)
    assert event.logprobs == [-0.1, -1.2]
    assert event.top_logprobs == [[(5, -0.1), (6, -2.5)], [(3, -0.4), (9, -1.2)]]


@pytest.mark.parametrize(("finish", "stop_reason", "expected"), [
    ("stop", None, ("stop", "")), ("stop", "\n\n", ("stop", "\n\n")), ("stop", 2, ("stop", "")),
    ("length", None, ("length", "")), ("abort", None, ("abort", "")),
])
def test_token_event_finish(finish: str, stop_reason: int | str | None, expected: tuple[str, str]) -> None:
    """Finish reasons map through; a stop string (not a stop token id) becomes stop_sequence."""
    out = FakeCompletionOutput(index=0, text="", token_ids=[2], finish_reason=finish, stop_reason=stop_reason)
    event = token_event(out, SamplingParams(max_tokens=4))
    assert (event.finish_reason, event.stop_sequence) == expected and event.logprobs == []


def test_score_result_from_prompt_logprobs() -> None:
    """ScoreTokens reads the continuation's positions of prompt_logprobs (entry 0 is None)."""
    prompt_logprobs = [None, {4: FakeLogprob(-1.0)}, {8: FakeLogprob(-0.5), 1: FakeLogprob(-2.0)},
                       {9: FakeLogprob(-3.0), 2: FakeLogprob(-0.1)}]
    result = score_result(prompt_logprobs, prompt_len=2, continuation=[8, 9], top_logprobs=1)  # type: ignore[arg-type]
    assert result.logprobs == [-0.5, -3.0]
    assert result.top_logprobs == [[(8, -0.5)], [(2, -0.1)]]
    assert all(math.isfinite(x) for x in result.logprobs)

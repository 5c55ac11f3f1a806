"""The transformers engine's scheduler and sampling with the real tiny model (SmolLM2-135M on CPU, loaded once):
sequences joining and leaving the batch mid-flight decode exactly as they would alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import NoReturn

import pytest
import pytest_asyncio

from orchard.services.inference.engines.base import SamplingParams
from orchard.services.inference.engines.transformers_engine import TransformersEngine
from orchard.services.inference.generation import collect
from orchard.services.inference.settings import InferenceSettings

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[TransformersEngine]:
    engine = TransformersEngine(InferenceSettings(port=0, max_batch_size=4))
    await engine.start()
    yield engine
    await engine.close()


def prompt(engine: TransformersEngine, question: str) -> list[int]:
    return engine.tokenize(engine.apply_chat_template([{"role": "user", "content": question}]))


@pytest.mark.slow
async def test_staggered_joins_match_solo_decoding(engine: TransformersEngine) -> None:
    """Requests that join a running batch at different steps (with different prompt lengths, more than
    max_batch_size of them) get the same greedy tokens as alone, and logprobs equal to score's."""
    questions = [
        "What is the capital of France?",
        "Name three colors.",
        "Say hello in Spanish.",
        "What is 2 + 2? Answer with a number only, please.",
        "Who wrote Hamlet?",
    ]
    greedy = SamplingParams(max_tokens=10, temperature=0, logprobs=True)
    solo = [(await collect(engine, prompt(engine, q), greedy))[0] for q in questions]

    async def late(i: int) -> list[int]:
        await asyncio.sleep(0.15 * i)
        return (await collect(engine, prompt(engine, questions[i]), greedy))[0].token_ids

    together = await asyncio.gather(*[late(i) for i in range(len(questions))])
    assert together == [c.token_ids for c in solo]
    assert engine.stats.max_batch_size == 4  # capped by max_batch_size; the fifth waited for a free row
    for q, c in zip(questions, solo, strict=True):
        scored = await engine.score(prompt(engine, q), c.token_ids)
        assert max(abs(a - b) for a, b in zip(scored.logprobs, c.logprobs, strict=True)) < 1e-4


@pytest.mark.slow
async def test_prompts_admitted_together_are_prefilled_together(engine: TransformersEngine) -> None:
    """Prompts of different lengths arriving at once share one left-padded prefill: they decode the tokens they
    decode alone, with logprobs equal to score's (float rounding only), and the engine ran fewer prefills."""
    questions = ["Hi.", "What is the capital of France?", "Name three primary colors, please, in a list."]
    greedy = SamplingParams(max_tokens=8, temperature=0, logprobs=True)
    solo = [(await collect(engine, prompt(engine, q), greedy))[0] for q in questions]
    before = engine.stats.prefill_forwards
    together = await asyncio.gather(*[collect(engine, prompt(engine, q), greedy) for q in questions])
    assert [c[0].token_ids for c in together] == [c.token_ids for c in solo]
    assert engine.stats.prefill_forwards - before < len(questions)
    for q, [c] in zip(questions, together, strict=True):
        scored = await engine.score(prompt(engine, q), c.token_ids)
        assert max(abs(a - b) for a, b in zip(scored.logprobs, c.logprobs, strict=True)) < 1e-4


async def test_top_k_one_is_greedy_and_stop_text(engine: TransformersEngine) -> None:
    """top_k=1 samples the argmax at any temperature; text never includes a stop string."""
    ids = prompt(engine, "What is the capital of France?")
    greedy = (await collect(engine, ids, SamplingParams(max_tokens=8, temperature=0)))[0]
    top1 = (await collect(engine, ids, SamplingParams(max_tokens=8, temperature=1.5, top_k=1)))[0]
    assert top1.token_ids == greedy.token_ids
    stopped = (await collect(engine, ids, SamplingParams(max_tokens=8, temperature=0, stop=("France",))))[0]
    assert "France" not in stopped.text and stopped.stop_sequence == "France"
    assert greedy.text.startswith(stopped.text)


async def test_update_waits_for_requests_in_flight(engine: TransformersEngine) -> None:
    """A weights swap asked for mid-stream lets the stream finish on the old weights, then serves the new."""
    base = engine.info
    stream_events = []

    async def consume() -> None:
        async for event in engine.generate(prompt(engine, "Tell me a story."), SamplingParams(max_tokens=12)):
            stream_events.append(event)

    task = asyncio.create_task(consume())
    while not stream_events:
        await asyncio.sleep(0.01)
    info = await engine.update_weights(base.checkpoint_path, "v2")  # same weights, new version
    assert task.done() and sum(len(e.token_ids) for e in stream_events) == 12
    assert info.weights_version == engine.info.weights_version == "v2"


async def test_a_failed_step_fails_its_requests_and_resets_in_the_worker(
    engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that raises (a model failure, forced here: the real model does not fail on demand) fails the requests
    in it, resets the batch in the worker thread, where every call into the model runs, and the next request is
    served."""
    batch = engine._batch
    real_step, real_reset = batch.step, batch.reset
    reset_in: list[str] = []

    def failing_step(admit: object) -> NoReturn:
        monkeypatch.setattr(batch, "step", real_step)
        raise RuntimeError("the model failed")

    def recorded_reset() -> None:
        reset_in.append(threading.current_thread().name)
        real_reset()

    monkeypatch.setattr(batch, "step", failing_step)
    monkeypatch.setattr(batch, "reset", recorded_reset)
    params = SamplingParams(max_tokens=3, temperature=0)
    with pytest.raises(RuntimeError, match="the model failed"):
        await collect(engine, prompt(engine, "Name three colors."), params)
    assert len((await collect(engine, prompt(engine, "Name three colors."), params))[0].token_ids) == 3
    # The scheduler's reset ran before the next step (the batch's own, when it empties, may follow), all in the worker.
    assert reset_in and all(name.startswith("orchard-torch") for name in reset_in), reset_in

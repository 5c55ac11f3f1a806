"""The value service's batcher: concurrent calls share forwards, texts of different models never do, a cancelled
caller's texts are skipped, a failed forward fails only its callers, and the queue is bounded. The model here is a
deterministic stand-in (a text's logit is its length plus an offset), since the batching logic needs no torch; the
real model runs through it in tests/integration/test_value_service.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from orchard.errors import ResourceExhausted
from orchard.services.value.batcher import Batcher

pytestmark = pytest.mark.timeout(30)


class LengthModel:
    """Scores a text as len(text) + offset and records each forward's texts; `gate` can hold forwards back."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.forwards: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def score(self, texts: list[str], batch_size: int = 16) -> list[float]:
        self.gate.wait(10)
        self.forwards.append(list(texts))
        if self.fail:
            raise RuntimeError("forward failed")
        return [len(t) + self.offset for t in texts]


@pytest_asyncio.fixture
async def batcher() -> AsyncIterator[Batcher]:
    b = Batcher(max_batch=4, wait_s=0.05, max_queued=8)
    b.start()
    yield b
    await b.close()


async def test_concurrent_calls_share_forwards_up_to_max_batch(batcher: Batcher) -> None:
    model = LengthModel()
    results = await asyncio.gather(*(batcher.score(model, ["x" * i]) for i in range(1, 7)))
    assert results == [[float(i)] for i in range(1, 7)]
    assert [len(f) for f in model.forwards] == [4, 2]
    assert (batcher.stats.forwards, batcher.stats.texts, batcher.stats.max_batch) == (2, 6, 4)


async def test_texts_of_different_models_never_share_a_forward(batcher: Batcher) -> None:
    old, new = LengthModel(), LengthModel(offset=100)
    first, second, third = await asyncio.gather(
        batcher.score(old, ["a", "bb"]), batcher.score(new, ["ccc"]), batcher.score(old, ["dddd"])
    )
    assert (first, second, third) == ([1.0, 2.0], [103.0], [4.0])
    assert old.forwards == [["a", "bb", "dddd"]] and new.forwards == [["ccc"]]


async def test_a_cancelled_caller_is_skipped(batcher: Batcher) -> None:
    model = LengthModel()
    model.gate.clear()
    running = asyncio.create_task(batcher.score(model, ["a"]))
    await asyncio.sleep(0.1)  # its forward now waits at the gate
    gone = asyncio.create_task(batcher.score(model, ["gone"]))
    kept = asyncio.create_task(batcher.score(model, ["kept"]))
    await asyncio.sleep(0)
    gone.cancel()
    model.gate.set()
    assert await running == [1.0] and await kept == [4.0]
    assert model.forwards == [["a"], ["kept"]]


async def test_a_failed_forward_fails_its_callers_only(batcher: Batcher) -> None:
    model = LengthModel()
    model.fail = True
    with pytest.raises(RuntimeError, match="forward failed"):
        await batcher.score(model, ["a", "b"])
    model.fail = False
    assert await batcher.score(model, ["abc"]) == [3.0]


async def test_the_queue_is_bounded(batcher: Batcher) -> None:
    model = LengthModel()
    model.gate.clear()
    waiting = [asyncio.create_task(batcher.score(model, ["x"] * 4)) for _ in range(2)]
    await asyncio.sleep(0.1)  # one forward holds 4 at the gate, 4 more wait
    with pytest.raises(ResourceExhausted, match="limit 8"):
        await batcher.score(model, ["y"] * 5)
    model.gate.set()
    assert [len(r) for r in await asyncio.gather(*waiting)] == [4, 4]

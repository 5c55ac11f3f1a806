"""Batched scoring across concurrent requests: texts from every request wait in one queue, and one scheduler task
runs a forward over up to `max_batch` of them (after waiting up to `wait_s` for more) in the one worker thread that
touches torch. Each text carries the model its request took, so texts of an old and a new model never share a
forward and a request in flight during a swap finishes on the model it started with."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Histogram

from orchard.errors import ResourceExhausted

_log = logging.getLogger("orchard.value")

BATCH_SIZE = Histogram(
    "orchard_value_batch_size",
    "Candidates scored together in one value-model forward.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)


class Scorer(Protocol):
    """What the batcher calls: ValueModel.score (the logits of `texts`, in order)."""

    def score(self, texts: list[str], batch_size: int = 16) -> list[float]: ...


@dataclass
class BatcherStats:
    """Counters of the batcher, for tests and benchmarks."""

    forwards: int = 0
    """Forwards run."""
    texts: int = 0
    """Texts scored."""
    max_batch: int = 0
    """Most texts scored in one forward so far."""


@dataclass
class _Item:
    model: Scorer
    text: str
    future: asyncio.Future[float]


class Batcher:
    """Scores texts in shared forwards; `score` is called from request handlers, `start`/`close` by the server."""

    def __init__(self, max_batch: int, wait_s: float, max_queued: int) -> None:
        self._max_batch = max_batch
        self._wait_s = wait_s
        self._max_queued = max_queued
        self._pending: deque[_Item] = deque()
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="orchard-value")
        self._task: asyncio.Task[None] | None = None
        self.stats = BatcherStats()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="value-batcher")

    async def close(self) -> None:
        """Stop the scheduler, fail what still waits, and let a running forward finish in its thread."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for item in self._pending:
            item.future.cancel()
        self._pending.clear()
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    async def score(self, model: Scorer, texts: list[str]) -> list[float]:
        """The logits of `texts` under `model`, in order, from forwards shared with concurrent calls."""
        if len(self._pending) + len(texts) > self._max_queued:
            raise ResourceExhausted(
                f"{len(self._pending)} candidates are waiting to be scored (limit {self._max_queued}); retry later",
                retry_after=1.0,
            )
        loop = asyncio.get_running_loop()
        items = [_Item(model, text, loop.create_future()) for text in texts]
        self._pending.extend(items)
        self._wake.set()
        if len(self._pending) >= self._max_batch:
            self._full.set()
        try:
            return list(await asyncio.gather(*(item.future for item in items)))
        finally:
            for item in items:  # the caller went away or a forward failed: the scheduler skips what is left
                item.future.cancel()

    def _take(self) -> list[_Item]:
        """Up to max_batch waiting texts of the first waiting text's model, in arrival order."""
        batch: list[_Item] = []
        rest: deque[_Item] = deque()
        for item in self._pending:
            if item.future.done():
                continue  # its caller went away
            if len(batch) < self._max_batch and (not batch or item.model is batch[0].model):
                batch.append(item)
            else:
                rest.append(item)
        self._pending = rest
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            if len(self._pending) < self._max_batch and self._wait_s > 0:
                # 1. Give concurrent requests a moment to join this forward (until it is full).
                self._full.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._wait_s):
                        await self._full.wait()
            # 2. One forward in the worker thread; the event loop keeps taking requests meanwhile.
            batch = self._take()
            if not batch:
                continue
            texts = [item.text for item in batch]
            try:
                logits = await loop.run_in_executor(self._executor, batch[0].model.score, texts, len(texts))
            except Exception as err:  # noqa: BLE001 - a torch failure fails this forward only
                _log.exception("value forward of %d candidates failed", len(texts))
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(err)
                continue
            # 3. Hand each request its logits.
            self.stats.forwards += 1
            self.stats.texts += len(texts)
            self.stats.max_batch = max(self.stats.max_batch, len(texts))
            BATCH_SIZE.observe(len(texts))
            for item, logit in zip(batch, logits, strict=True):
                if not item.future.done():
                    item.future.set_result(logit)

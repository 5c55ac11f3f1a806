"""The scheduler every CPU engine shares: continuous batching across requests around one worker thread.

Two halves, with one rule between them: only the worker thread touches the model.
- The scheduler (`_run`, an asyncio task) takes waiting sequences into the batch, hands one step at a time to the
  worker thread, and routes each step's token events to the requests' queues. Between steps it drops sequences
  whose client went away, admits new ones, and swaps weights once the batch has drained.
- The worker thread runs the engine's `StepBatch.step`: one decode step for every running sequence, then the
  prefill of the prompts admitted in that step, whose sequences join the batch. Sequences join and leave between
  any two steps. The transformers engine's batch is batch.py (torch), the llama.cpp engine's llama_cpp_batch.py.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import logging
import time
from collections import abc as cabc
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from orchard.errors import InvalidArgument, ResourceExhausted
from orchard.model_files import check_checkpoint, resolve_model
from orchard.services.inference import metrics
from orchard.services.inference.engines.base import (
    ChatMessage,
    Engine,
    ModelInfo,
    SamplingParams,
    ScoreResult,
    TokenEvent,
    ToolSpec,
    vision_unsupported,
)
from orchard.services.inference.engines.sampling import Sequence
from orchard.services.inference.settings import InferenceSettings

_log = logging.getLogger("orchard.inference")


class StepBatch(Protocol):
    """The worker thread's half of a batching engine: the model, its tokenizer and the running sequences."""

    tokenizer: Any
    """A Hugging Face tokenizer: ids, text and the chat template are the same on every engine."""
    stop_token_ids: frozenset[int]
    seqs: list[Sequence]
    """Sequences it holds now (running, or admitted and waiting for room)."""
    last_batch_size: int
    """Rows decoded together in the last step."""
    max_context_tokens: int
    vocab_size: int

    def step(self, admit: list[Sequence]) -> list[tuple[Sequence, TokenEvent]]:
        """Drop aborted rows, decode one token for every running row, and prefill `admit` (they join the batch)."""
        ...

    def score(self, prompt_ids: list[int], continuation_ids: list[int], top_logprobs: int) -> ScoreResult: ...

    def load_weights(self, path: Path) -> None:
        """Swap in the checkpoint at path (the batch is empty); raises InvalidArgument and keeps serving on error."""
        ...

    def reset(self) -> None:
        """Forget every row (after a failed step)."""
        ...

    def close(self) -> None:
        """Free the model (the engine is closing)."""
        ...


@dataclass
class EngineStats:
    """Counters of the scheduler, for tests and benchmarks (also exported as Prometheus metrics)."""

    steps: int = 0
    """Decode/prefill steps run."""
    max_batch_size: int = 0
    """Most sequences decoded together in one step so far."""
    tokens: int = 0
    """Tokens generated."""
    prefill_forwards: int = 0
    """Prefill forwards run (one per step that admitted prompts, however many it admitted)."""


class BatchingEngine(Engine):
    """An engine whose worker thread owns a `StepBatch`; subclasses name themselves and load the batch."""

    name: ClassVar[str]
    """The engine's name in ModelInfo (the `engine` setting)."""

    def __init__(self, settings: InferenceSettings) -> None:
        self._settings = settings
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="orchard-torch")
        self._waiting: deque[Sequence] = deque()
        self._wake = asyncio.Event()
        self._updates: deque[tuple[Path, str, asyncio.Future[ModelInfo]]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._batch: Any = None  # a StepBatch once loaded (its module imports torch, so lazily)
        self._info: ModelInfo | None = None
        self.stats = EngineStats()

    @property
    def info(self) -> ModelInfo:
        assert self._info is not None, "engine not started"
        return self._info

    @property
    def running(self) -> int:
        """Sequences in the batch now."""
        return len(self._batch.seqs) if self._batch is not None else 0

    async def _in_worker(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def start(self) -> None:
        s = self._settings
        path, model_id = await self._in_worker(resolve_model, s.model, s.cache_dir)
        started = time.monotonic()
        self._batch = await self._in_worker(self._load_batch, path)
        self._info = ModelInfo(
            model_id=s.model_id or model_id,
            engine=self.name,
            checkpoint_path=str(path),
            weights_version=s.model_id or model_id,
            max_context_tokens=self._batch.max_context_tokens,
            vocab_size=self._batch.vocab_size,
            load_time=time.time(),
        )
        _log.info("loaded %s from %s in %.1fs", self._info.model_id, path, time.monotonic() - started)
        self._task = asyncio.create_task(self._run(), name="inference-scheduler")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for seq in [*self._waiting, *(self._batch.seqs if self._batch else [])]:
            seq.queue.put_nowait(TokenEvent(index=seq.index, token_ids=[], finish_reason="abort"))
        self._waiting.clear()
        for _, _, future in self._updates:
            if not future.done():
                future.cancel()
        if self._batch is not None:
            await self._in_worker(self._batch.close)
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    # -- generation ---------------------------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, images: cabc.Sequence[bytes] = ()
    ) -> AsyncGenerator[TokenEvent, None]:
        if images:
            raise vision_unsupported(self.info, "the prompt")
        if not prompt_ids:
            raise InvalidArgument("the prompt is empty; give at least one token", field="prompt")
        if len(self._waiting) + params.n > self._settings.max_queued_sequences:
            raise ResourceExhausted(
                f"{len(self._waiting)} sequences are waiting (limit "
                f"{self._settings.max_queued_sequences}); retry later",
                retry_after=1.0,
            )
        queue: asyncio.Queue[TokenEvent | BaseException] = asyncio.Queue()
        seqs = [Sequence(i, prompt_ids, params, queue, self._batch.stop_token_ids) for i in range(params.n)]
        self._waiting.extend(seqs)
        self._wake.set()
        left = params.n
        try:
            while left:
                event = await queue.get()
                if isinstance(event, BaseException):
                    raise event
                if event.finish_reason is not None:
                    left -= 1
                yield event
        finally:
            # Client gone, deadline or done: the scheduler drops these sequences before its next step.
            for seq in seqs:
                seq.aborted = True
            self._wake.set()

    async def _run(self) -> None:
        """The scheduler: admit, step, route events; swap weights when an update waits and the batch is empty."""
        batch = self._batch
        while True:
            if not (self._waiting or batch.seqs or self._updates):
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._updates and not batch.seqs:
                await self._apply_update()
                continue
            admit: list[Sequence] = []
            if not self._updates:  # new requests wait for a pending swap; running ones finish on the old weights
                room = self._settings.max_batch_size - len(batch.seqs)
                while self._waiting and len(admit) < room:
                    seq = self._waiting.popleft()
                    if not seq.aborted:
                        admit.append(seq)
            if not admit and not batch.seqs:
                continue
            try:
                events = await self._in_worker(batch.step, admit)
            except Exception as err:  # a model failure: fail these sequences, keep serving the next ones
                _log.exception("inference step failed")
                for seq in [*batch.seqs, *admit]:
                    seq.queue.put_nowait(err)
                # In the worker, as every call into the model: a ScoreTokens may be running there (GIL released).
                await self._in_worker(batch.reset)
                continue
            self.stats.steps += 1
            self.stats.max_batch_size = max(self.stats.max_batch_size, batch.last_batch_size)
            self.stats.prefill_forwards += bool(admit)
            metrics.BATCH_SIZE.observe(batch.last_batch_size)
            for seq, event in events:
                self.stats.tokens += len(event.token_ids)
                seq.queue.put_nowait(event)
            metrics.TOKENS.inc(sum(len(e.token_ids) for _, e in events))

    # -- scoring and tokenizer ----------------------------------------------------------------------------------

    async def score(self, prompt_ids: list[int], continuation_ids: list[int], top_logprobs: int = 0) -> ScoreResult:
        return await self._in_worker(self._batch.score, prompt_ids, continuation_ids, top_logprobs)

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._batch.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def token_strings(self, token_ids: list[int]) -> list[str]:
        tok = self._batch.tokenizer
        return [tok.decode([t]) for t in token_ids]

    def detokenize(self, token_ids: list[int]) -> str:
        return str(self._batch.tokenizer.decode(token_ids, skip_special_tokens=True))

    def apply_chat_template(
        self,
        messages: list[ChatMessage],
        tools: list[ToolSpec] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        return str(
            self._batch.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **(template_kwargs or {}),
            )
        )

    # -- weights ------------------------------------------------------------------------------------------------

    async def update_weights(self, checkpoint_path: str, weights_version: str) -> ModelInfo:
        path = Path(checkpoint_path)
        version = weights_version or path.name
        if version == self.info.weights_version and checkpoint_path == self.info.checkpoint_path:
            return self.info  # a retry of the update already served
        await asyncio.to_thread(check_checkpoint, path)
        future: asyncio.Future[ModelInfo] = asyncio.get_running_loop().create_future()
        self._updates.append((path, version, future))
        self._wake.set()
        return await future

    async def _apply_update(self) -> None:
        path, version, future = self._updates.popleft()
        if future.done():  # the caller went away
            return
        try:
            await self._in_worker(self._batch.load_weights, path)
        except Exception as err:
            if not future.done():  # the caller may have gone away while the weights loaded
                future.set_exception(
                    err
                    if isinstance(err, InvalidArgument)
                    else InvalidArgument(f"cannot load checkpoint {path}: {err}", field="checkpoint_path")
                )
            return
        self._info = ModelInfo(
            model_id=self.info.model_id,
            engine=self.name,
            checkpoint_path=str(path),
            weights_version=version,
            max_context_tokens=self.info.max_context_tokens,
            vocab_size=self.info.vocab_size,
            load_time=time.time(),
        )
        _log.info("now serving weights %s from %s", version, path)
        if not future.done():  # a caller that went away mid-load must not kill the scheduler (InvalidStateError)
            future.set_result(self._info)

    @abc.abstractmethod
    def _load_batch(self, path: Path) -> StepBatch:
        """Load the model at path (resolved from the `model` setting) and its tokenizer; runs in the worker thread."""

"""The policy a harness samples from, token-level: render a conversation with the chat template, tokenize, and
generate from exact token ids with per-token log-probs. `InferenceModel` is the inference service over gRPC
(`Generate` on token ids, `ApplyChatTemplate`, `Tokenize`), with a deadline and retries on every call. A
conversation's images travel with the token ids: the ids hold their placeholders, the images the pixels."""

from __future__ import annotations

import abc
import asyncio
import logging
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from orchard import clients
from orchard.errors import OrchardError
from orchard.inference.v1 import inference_pb2 as ipb
from orchard.types.v1 import types_pb2 as tpb

log = logging.getLogger("orchard.harness")

RETRY_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}
)
"""Generation has no side effects, so a call that timed out or found the server busy is retried."""


class ModelError(OrchardError):
    """The model server failed after retries (the rollout stops with MODEL_ERROR)."""


@dataclass(frozen=True)
class Rendered:
    """A conversation rendered by the chat template."""

    text: str
    token_ids: list[int]


@dataclass(frozen=True)
class Sample:
    """One sampled reply."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """"stop", "length" or "abort"."""
    weights_version: str = ""


@dataclass(frozen=True)
class SamplingConfig:
    """How rollouts sample."""

    temperature: float = 0.7
    top_p: float = 1.0
    max_step_tokens: int = 512
    """The most tokens one reply may have (the loop also caps it by the token budget left)."""
    seed: int | None = None
    """Base seed; step s of sample i of a task uses `step_seed(seed, task, i, s)`. Random when None."""


def step_seed(base: int, task_id: str, sample: int, step: int) -> int:
    """The seed of step `step` of sample `sample` of a task: base + crc32(task id) + 1000 * sample + step.

    The task's offset gives each task its own random streams. Without it sample i of every task drew the same
    numbers, so one seed's luck was every task's at once and a run's pass@1 swung with it (the main job's
    distilled student scored 20/24 at seed 0 and 9-13/24 at seeds 1-3, nearly every task alike). The offset is
    32 bits, where torch-backed samplers keep a seed's entropy. `step` stays the last term so that `seed - step`
    names the sample (the reference policy reads it so)."""
    return base + zlib.crc32(task_id.encode()) + 1000 * sample + step


class Model(abc.ABC):
    """A policy the agent loop samples from."""

    name: str

    @abc.abstractmethod
    async def render(
        self, messages: list[tpb.Message], tools: list[tpb.ToolDefinition], add_generation_prompt: bool
    ) -> Rendered:
        """The conversation through the chat template, as text and token ids."""

    @abc.abstractmethod
    async def tokenize(self, text: str) -> list[int]:
        """Token ids of text (no special tokens added; special-token text is recognised)."""

    @abc.abstractmethod
    async def generate(
        self,
        token_ids: list[int],
        max_tokens: int,
        seed: int | None,
        labels: dict[str, str],
        images: Sequence[tpb.Image] = (),
    ) -> Sample:
        """Sample one reply after exactly these token ids, with log-probs.

        `images` are the conversation's images in the order their placeholders appear in token_ids (only a vision
        model takes them).
        """


@dataclass(frozen=True)
class Timeouts:
    """Per-stage deadlines and retries of model calls."""

    generate_s: float = 300.0
    """Deadline of one Generate call (the CPU model makes ~15 tokens/s alone, fewer when batched)."""
    render_s: float = 30.0
    """Deadline of ApplyChatTemplate and Tokenize."""
    attempts: int = 3
    """Tries per call on UNAVAILABLE, RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED, with jittered backoff."""
    backoff_s: float = 1.0


class InferenceModel(Model):
    """The Orchard inference service, over gRPC."""

    def __init__(
        self,
        target: str = "127.0.0.1:50052",
        model: str = "",
        sampling: SamplingConfig | None = None,
        timeouts: Timeouts | None = None,
    ) -> None:
        self.target = target
        self.model = model
        self.name = model or "default"
        self.sampling = sampling or SamplingConfig()
        self.timeouts = timeouts or Timeouts()
        # Calls are retried by _call (a budget per stage), not by the transport.
        self._transport = clients.transport(
            "inference", target, timeout=self.timeouts.render_s, flag="--inference-address"
        )

    async def connect(self) -> None:
        """Learn the served model's name (the default model's when none was given)."""
        response = await self._call("ListModels", ipb.ListModelsRequest(), self.timeouts.render_s)
        chosen = [m for m in response.models if (m.model_id == self.model if self.model else m.is_default)]
        if not chosen:
            raise ModelError(
                f"the inference service at {self.target} does not serve model {self.model!r}; it "
                f"serves {[m.model_id for m in response.models]}"
            )
        self.name = chosen[0].model_id

    async def close(self) -> None:
        await self._transport.close()

    async def _call(self, method: str, request: object, timeout: float) -> Any:
        for attempt in range(self.timeouts.attempts):
            try:
                # idempotent=False: the transport does not retry on its own; this loop does, per stage.
                return await self._transport.unary(method, request, idempotent=False, timeout=timeout)
            except OrchardError as err:
                if err.code not in RETRY_CODES or attempt + 1 == self.timeouts.attempts:
                    raise ModelError(
                        f"inference {method} at {self.target} failed after {attempt + 1} attempt(s): {err}"
                    ) from None
                delay = self.timeouts.backoff_s * 2**attempt * random.uniform(0.75, 1.5)
                log.info("inference %s failed (%s); retry in %.1fs", method, err.code.name, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def render(
        self, messages: list[tpb.Message], tools: list[tpb.ToolDefinition], add_generation_prompt: bool
    ) -> Rendered:
        prompt = ipb.ChatPrompt(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)
        response = await self._call(
            "ApplyChatTemplate", ipb.ApplyChatTemplateRequest(model=self.model, prompt=prompt), self.timeouts.render_s
        )
        return Rendered(response.text, list(response.token_ids))  # type: ignore[attr-defined]

    async def tokenize(self, text: str) -> list[int]:
        response = await self._call(
            "Tokenize", ipb.TokenizeRequest(model=self.model, text=text), self.timeouts.render_s
        )
        return list(response.token_ids)  # type: ignore[attr-defined]

    async def generate(
        self,
        token_ids: list[int],
        max_tokens: int,
        seed: int | None,
        labels: dict[str, str],
        images: Sequence[tpb.Image] = (),
    ) -> Sample:
        params = ipb.SamplingParams(
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_tokens=max_tokens,
            logprobs=True,
            seed=seed,
        )
        request = ipb.GenerateRequest(
            model=self.model, token_ids=ipb.TokenIds(ids=token_ids), sampling=params, labels=labels, images=images
        )
        response = await self._call("Generate", request, self.timeouts.generate_s)
        choice = response.choices[0]  # type: ignore[attr-defined]
        finish = {ipb.FINISH_REASON_STOP: "stop", ipb.FINISH_REASON_LENGTH: "length"}.get(choice.finish_reason, "abort")
        return Sample(choice.text, list(choice.token_ids), list(choice.logprobs), finish, response.weights_version)  # type: ignore[attr-defined]

"""The inference engine interface: what the gRPC servicer and the OpenAI endpoint need from a model server.

An engine serves one model. Generation is token-level and streamed: `generate` yields `TokenEvent`s per choice.
Log-probs everywhere are the model's own distribution: log_softmax of the raw logits over the full vocabulary
(temperature 1, before top-k/top-p), so the log-prob of a sampled token equals what `score` returns for it.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from orchard.chat.tools import ChatMessage, ToolSpec
from orchard.errors import Unimplemented

FinishReason = Literal["stop", "length", "abort"]

# The chat message and tool formats are chat.tools' (one definition for every service and recipe).


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request (already validated: see orchard.services.inference.requests)."""

    max_tokens: int
    """Most tokens to generate per choice."""
    temperature: float = 1.0
    """Softmax temperature; 0 is greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus cut: keep the smallest set of tokens whose probability reaches top_p."""
    top_k: int = 0
    """Keep only the top_k most likely tokens; 0 disables the cut."""
    stop: tuple[str, ...] = ()
    """Generation ends before any of these strings; the text excludes it, token_ids keep the tokens sampled."""
    seed: int | None = None
    """Choice i samples with a generator seeded with seed_bits(seed + i); random when None."""
    n: int = 1
    """Choices sampled from the same prompt."""
    logprobs: bool = False
    """Return the log-prob of each sampled token."""
    top_logprobs: int = 0
    """Also return this many most likely alternatives per position."""


@dataclass(frozen=True)
class TokenEvent:
    """New output of one choice: the tokens sampled since its last event, and the text they completed."""

    index: int
    """The choice, 0 to n - 1."""
    token_ids: list[int]
    """New token ids (the end-of-sequence token included, when sampled)."""
    text: str = ""
    """New text. It can lag the tokens: an incomplete UTF-8 character or a possible stop-string prefix waits."""
    logprobs: list[float] = field(default_factory=list)
    """Log-probs of token_ids, when asked for."""
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per new position, the most likely (token id, log-prob) pairs, most likely first, when asked for."""
    finish_reason: FinishReason | None = None
    """Set on the choice's last event."""
    stop_sequence: str = ""
    """The stop string that ended the choice, when one did."""


@dataclass(frozen=True)
class ScoreResult:
    """Log-probs of a given continuation."""

    logprobs: list[float]
    """One per continuation token."""
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per continuation position, the most likely (token id, log-prob) pairs, when asked for."""


@dataclass(frozen=True)
class ModelInfo:
    """The served model and its current weights."""

    model_id: str
    engine: str
    checkpoint_path: str
    weights_version: str
    max_context_tokens: int
    """The longest prompt plus completion, in tokens."""
    vocab_size: int
    """Token ids run from 0 to vocab_size - 1."""
    load_time: float
    """Unix time its current weights were loaded."""
    vision: bool = False
    """Whether it takes images: image content parts in chat messages, and images with `generate`."""


def vision_unsupported(info: ModelInfo, what: str) -> Unimplemented:
    """The error for an image sent to a text-only model; `what` says where the image was."""
    return Unimplemented(
        f"{what} holds an image, but model {info.model_id!r} on the {info.engine} engine takes text "
        "only; serve a vision-language model on the vllm engine to send images",
        reason="VISION_UNSUPPORTED",
    )


class Engine(abc.ABC):
    """One served model. `start` loads it; `close` aborts what runs and frees it.

    Tokenizer methods are synchronous: they take microseconds to a millisecond, less than a thread hop.
    """

    @property
    @abc.abstractmethod
    def info(self) -> ModelInfo:
        """The model and its current weights version."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model and start the scheduler."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Abort running requests (their streams end with finish_reason "abort") and release the model."""

    @abc.abstractmethod
    def generate(
        self, prompt_ids: list[int], params: SamplingParams, images: Sequence[bytes] = ()
    ) -> AsyncGenerator[TokenEvent, None]:
        """Sample params.n choices after prompt_ids; events of the choices interleave.

        `images` are the encoded images (PNG or JPEG) of the prompt, in the order their placeholders appear;
        a text-only engine (info.vision False) raises `vision_unsupported` when given any.

        Closing or cancelling the iterator (client gone, deadline) removes its sequences from the batch.
        """

    @abc.abstractmethod
    async def score(self, prompt_ids: list[int], continuation_ids: list[int], top_logprobs: int = 0) -> ScoreResult:
        """Log-prob of each continuation token given everything before it (prefill only)."""

    @abc.abstractmethod
    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of text."""

    @abc.abstractmethod
    def token_strings(self, token_ids: list[int]) -> list[str]:
        """Each token as text (a partial UTF-8 character shows as replacement characters)."""

    @abc.abstractmethod
    def detokenize(self, token_ids: list[int]) -> str:
        """Text of token ids, special tokens skipped."""

    @abc.abstractmethod
    def apply_chat_template(
        self,
        messages: list[ChatMessage],
        tools: list[ToolSpec] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Render a conversation with the model's chat template."""

    async def update_weights(self, checkpoint_path: str, weights_version: str) -> ModelInfo:
        """Swap in the weights of a checkpoint folder between steps: running requests finish first, new ones wait.

        Raises NotFound/InvalidArgument for a bad checkpoint; the old weights keep serving.
        """
        raise Unimplemented(f"the {self.info.engine} engine cannot update weights")


def seed_bits(seed: int) -> int:
    """The 32 bits a torch generator keeps of a seed, with every bit of the 64 given counted.

    torch's generator (and so vLLM's) seeds its Mersenne Twister with the low 32 bits only: seeds that differ
    above them would sample the same tokens. Folding the high half in keeps distinct int64 seeds distinct."""
    seed &= 0xFFFFFFFFFFFFFFFF  # a negative int64 as its two's complement
    return (seed ^ (seed >> 32)) & 0xFFFFFFFF

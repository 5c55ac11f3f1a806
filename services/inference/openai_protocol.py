"""Wire types of the OpenAI-compatible endpoint: request bodies (pydantic) and the JSON shapes of responses.

Fields the OpenAI API has and this server does not act on (frequency_penalty, user, ...) are accepted and ignored,
so third-party harnesses work unmodified. Extensions, as vLLM spells them: top_k, return_token_ids (adds
`token_ids` to each choice and `prompt_token_ids` to the response) and chat_template_kwargs.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchard.chat.tools import ParsedToolCall
from orchard.services.inference.engines.base import ChatMessage, ToolSpec

FINISH = {"stop": "stop", "length": "length", "abort": "stop", None: None}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
"""The chat roles OpenAI's API defines (`function` is its deprecated name for `tool`, refused)."""
SEED_MAX = (1 << 63) - 1
"""The largest seed (a signed 64-bit integer, as OpenAI documents it)."""
MAX_TOP_LOGPROBS = 20
"""The most alternatives per token, as OpenAI caps top_logprobs."""


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = "text"

    @field_validator("type")
    @classmethod
    def _only_text(cls, value: str) -> str:
        if value != "text":
            raise ValueError(
                f"response_format type {value!r} is not supported by this server (no constrained "
                "decoding); use 'text' and parse the reply, or point the client at a server that does"
            )
        return value


class _Sampling(BaseModel):
    """The sampling fields chat and completion requests share."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str = ""
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int = 0
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-SEED_MAX - 1, le=SEED_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None

    @field_validator("messages")
    @classmethod
    def _roles(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, m in enumerate(messages):
            role = m.get("role")
            if role not in ROLES:
                raise ValueError(f"messages[{i}].role {role!r} is not one of {', '.join(sorted(ROLES))}")
        return messages

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def chat_messages(self) -> list[ChatMessage]:
        """The messages as chat templates take them: text content (content parts joined), never None."""
        out = []
        for m in self.messages:
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            out.append({**m, "content": content or ""})
        return out

    def tool_specs(self) -> list[ToolSpec]:
        return [] if self.tool_choice == "none" else list(self.tools or [])

    def image_message(self) -> int | None:
        """The index of the first message with an image content part, if any."""
        for i, m in enumerate(self.messages):
            content = m.get("content")
            if isinstance(content, list) and any(
                isinstance(part, dict) and part.get("type") in IMAGE_PARTS for part in content
            ):
                return i
        return None


IMAGE_PARTS = frozenset({"image_url", "image", "input_image"})
"""Content part types that carry an image in the OpenAI chat format (and its common variants)."""


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _echo_without_logprobs(self) -> CompletionRequest:
        if self.echo and self.logprobs is not None:
            raise ValueError(
                "echo with logprobs (the prompt's own token logprobs) is not supported by this "
                "server; use ScoreTokens over gRPC for prompt logprobs, or drop one of the two"
            )
        return self


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def token_logprob(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def tool_calls_json(calls: list[ParsedToolCall]) -> list[dict[str, Any]]:
    return [
        {"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for i, c in enumerate(calls)
    ]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


ErrorKind = Literal["invalid_request_error", "not_found_error", "rate_limit_error", "server_error"]

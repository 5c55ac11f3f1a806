"""The models the reward service calls: a judge that chats and a teacher that scores tokens. `Models` is the
variation point; `InferenceModels` is the real one, any model behind the inference service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from orchard import clients
from orchard.errors import NotFound, OrchardError
from orchard.inference.v1 import inference_pb2 as ipb
from orchard.types.v1 import types_pb2 as tpb


@dataclass(frozen=True)
class ChatReply:
    """The judge's answer text and the model that wrote it."""

    text: str
    model: str


@dataclass(frozen=True)
class Scores:
    """A teacher's log-prob of each continuation token, and which weights scored them."""

    logprobs: list[float]
    model: str
    weights_version: str


class Models(Protocol):
    """What the judge and the teacher need from a model server. Failures raise OrchardError."""

    async def chat(
        self, model: str, system: str, user: str, *, temperature: float, max_tokens: int, timeout: float
    ) -> ChatReply: ...

    async def score(
        self, model: str, context_ids: list[int], continuation_ids: list[int], *, timeout: float
    ) -> Scores: ...

    async def context_length(self, model: str, *, timeout: float) -> int: ...


class InferenceModels:
    """Models served by an Orchard inference service (its Chat, ScoreTokens and ListModels RPCs)."""

    def __init__(self, address: str, max_message_bytes: int = 64 * 1024 * 1024) -> None:
        self.address = address
        self._transport = clients.transport(
            "inference",
            address,
            options=[
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.max_receive_message_length", max_message_bytes),
            ],
        )
        self._context: dict[str, int] = {}

    async def chat(
        self, model: str, system: str, user: str, *, temperature: float, max_tokens: int, timeout: float
    ) -> ChatReply:
        request = ipb.ChatRequest(
            model=model,
            messages=[tpb.Message(role=tpb.ROLE_SYSTEM, content=system), tpb.Message(role=tpb.ROLE_USER, content=user)],
            sampling=ipb.SamplingParams(temperature=temperature, max_tokens=max_tokens),
            labels={"caller": "orchard.reward.judge"},
        )
        reply = await self._call("Chat", request, timeout)
        return ChatReply(text=reply.choices[0].message.content if reply.choices else "", model=reply.model)

    async def score(self, model: str, context_ids: list[int], continuation_ids: list[int], *, timeout: float) -> Scores:
        request = ipb.ScoreTokensRequest(
            model=model,
            token_ids=ipb.TokenIds(ids=context_ids),
            continuation_token_ids=continuation_ids,
            labels={"caller": "orchard.reward.teacher"},
        )
        reply = await self._call("ScoreTokens", request, timeout)
        return Scores(logprobs=list(reply.logprobs), model=reply.model, weights_version=reply.weights_version)

    async def context_length(self, model: str, *, timeout: float) -> int:
        """The model's context in tokens (asked once per model, then remembered)."""
        if model not in self._context:
            reply = await self._call("ListModels", ipb.ListModelsRequest(), timeout)
            found = [m for m in reply.models if (m.model_id == model if model else m.is_default)]
            if not found:
                served = ", ".join(m.model_id for m in reply.models)
                raise NotFound(
                    f"the inference service at {self.address} serves no model {model!r} (it serves "
                    f"{served}); set the teacher model to one of them",
                    field="teacher_model",
                )
            self._context[model] = found[0].max_context_tokens
        return self._context[model]

    async def _call(self, method: str, request: object, timeout: float) -> Any:
        """One call (idempotent: a judge or teacher call changes nothing), its error saying where it came from."""
        try:
            return await self._transport.unary(method, request, idempotent=True, timeout=timeout)
        except OrchardError as err:
            err.message = f"inference service {self.address} {method}: {err.message}"
            err.args = (err.message,)
            raise

    async def close(self) -> None:
        await self._transport.close()

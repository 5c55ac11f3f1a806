"""InferenceService servicer: translates protos to engine calls and back, nothing else.
Errors raised below are OrchardErrors; the runtime's interceptor maps them to status codes."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from google.protobuf import json_format

from orchard.chat import templates as chat
from orchard.chat.tools import parse_tool_calls, tool_spec
from orchard.errors import InvalidArgument, Unimplemented
from orchard.inference.v1 import inference_pb2 as pb
from orchard.inference.v1 import inference_pb2_grpc
from orchard.prototime import duration, timestamp
from orchard.services.inference import generation
from orchard.services.inference.engines.base import (
    ChatMessage,
    Engine,
    ModelInfo,
    SamplingParams,
    vision_unsupported,
)
from orchard.services.inference.generation import Completion
from orchard.types.v1 import types_pb2 as tpb

_log = logging.getLogger("orchard.inference")

ROLES = {
    tpb.ROLE_SYSTEM: "system",
    tpb.ROLE_DEVELOPER: "system",
    tpb.ROLE_USER: "user",
    tpb.ROLE_ASSISTANT: "assistant",
    tpb.ROLE_TOOL: "tool",
}
FINISH = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
    None: pb.FINISH_REASON_UNSPECIFIED,
}

ChatLike = pb.ChatRequest | pb.StreamChatRequest
GenerateLike = pb.GenerateRequest | pb.StreamGenerateRequest


def message_dict(m: tpb.Message, i: int, info: ModelInfo) -> ChatMessage:
    """A proto message in the OpenAI chat format; with images (for a vision model), content is a list of parts
    ({"type": "image"} placeholders and {"type": "text"} runs), which the model's chat template renders."""
    if m.role not in ROLES:
        raise InvalidArgument(f"messages[{i}] has no role; set role", field=f"messages[{i}].role")
    content: str | list[dict[str, str]] = m.content or "".join(p.text for p in m.parts)
    if any(p.HasField("image") for p in m.parts):
        if not info.vision:
            raise vision_unsupported(info, f"messages[{i}]")
        content = [{"type": "text", "text": m.content}] if m.content else []
        content += [{"type": "image"} if p.HasField("image") else {"type": "text", "text": p.text} for p in m.parts]
    out: ChatMessage = {"role": ROLES[m.role], "content": content}
    if m.name:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    return out


def image_bytes(image: tpb.Image, where: str) -> bytes:
    """The encoded bytes of an image; the engine decodes them."""
    if not image.HasField("data") or not image.data:
        raise InvalidArgument(
            f"{where} has no data; send the encoded PNG or JPEG bytes (URLs are not fetched)", field=where
        )
    return image.data


def message_images(messages: Sequence[tpb.Message]) -> list[bytes]:
    """The images of a conversation in the order their placeholders render: by message, then by part."""
    return [
        image_bytes(p.image, f"messages[{i}].parts[{j}].image")
        for i, m in enumerate(messages)
        for j, p in enumerate(m.parts)
        if p.HasField("image")
    ]


def _template_kwargs(s: Any) -> dict[str, Any]:
    return json_format.MessageToDict(s) if s.fields else {}


def _params(engine: Engine, sampling: pb.SamplingParams, prompt_len: int, max_n: int) -> SamplingParams:
    return generation.sampling_params(
        engine,
        prompt_len,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature if sampling.HasField("temperature") else None,
        top_p=sampling.top_p if sampling.HasField("top_p") else None,
        top_k=sampling.top_k,
        stop=list(sampling.stop),
        seed=sampling.seed if sampling.HasField("seed") else None,
        n=sampling.n,
        logprobs=sampling.logprobs,
        top_logprobs=sampling.top_logprobs,
        max_n=max_n,
    )


def _tops(engine: Engine, tops: list[list[tuple[int, float]]]) -> list[pb.TopLogprobs]:
    out = []
    for candidates in tops:
        strings = engine.token_strings([t for t, _ in candidates])
        out.append(
            pb.TopLogprobs(
                candidates=[
                    pb.TokenLogprob(token_id=t, token=s, logprob=lp)
                    for (t, lp), s in zip(candidates, strings, strict=True)
                ]
            )
        )
    return out


def model_pb(info: ModelInfo) -> pb.Model:
    load_time = timestamp(info.load_time)
    return pb.Model(
        name=f"models/{info.model_id}",
        model_id=info.model_id,
        engine=info.engine,
        checkpoint_path=info.checkpoint_path,
        weights_version=info.weights_version,
        max_context_tokens=info.max_context_tokens,
        vision=info.vision,
        is_default=True,
        load_time=load_time,
    )


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    """gRPC face of one engine."""

    def __init__(self, engine: Engine, max_n: int) -> None:
        self.engine = engine
        self.max_n = max_n

    # -- shared by the unary and streaming twins ----------------------------------------------------------------

    def _chat_prompt(self, request: ChatLike) -> tuple[list[int], set[str], list[bytes]]:
        """The prompt ids of a chat request, the names of the tools offered (empty when tool_choice is NONE) and
        the conversation's images."""
        generation.check_model(self.engine, request.model)
        messages = [message_dict(m, i, self.engine.info) for i, m in enumerate(request.messages)]
        tools = [tool_spec(t, i) for i, t in enumerate(request.tools)]
        if request.tool_choice == pb.TOOL_CHOICE_NONE:
            tools = []
        text = chat.render(self.engine, messages, tools, True, _template_kwargs(request.chat_template_kwargs))
        if request.labels:
            _log.debug("chat call", extra={"labels": dict(request.labels)})
        return (self.engine.tokenize(text), {t["function"]["name"] for t in tools}, message_images(request.messages))

    def _generate_prompt(self, request: GenerateLike) -> tuple[list[int], list[bytes]]:
        """The prompt ids of a generate request and its images."""
        generation.check_model(self.engine, request.model)
        if request.images and not self.engine.info.vision:
            raise vision_unsupported(self.engine.info, "images")
        images = [image_bytes(image, f"images[{k}]") for k, image in enumerate(request.images)]
        which = request.WhichOneof("prompt")
        if which == "text":
            return self.engine.tokenize(request.text), images
        if which == "token_ids":
            ids = list(request.token_ids.ids)
            generation.check_token_ids(self.engine, ids, "token_ids")
            return ids, images
        raise InvalidArgument("the prompt is missing; set text or token_ids", field="prompt")

    def _message(self, text: str, finish: str | None, tool_names: set[str]) -> tuple[tpb.Message, pb.FinishReason]:
        """The assistant message of a finished chat choice, and its finish reason."""
        content, calls = parse_tool_calls(text, tool_names) if tool_names else (text, [])
        message = tpb.Message(
            role=tpb.ROLE_ASSISTANT,
            content=content,
            tool_calls=[tpb.ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls],
        )
        return message, pb.FINISH_REASON_TOOL_CALLS if calls else FINISH[finish]

    def _choice(self, c: Completion, tool_names: set[str] | None) -> pb.Choice:
        choice = pb.Choice(
            index=c.index,
            text=c.text,
            token_ids=c.token_ids,
            logprobs=c.logprobs,
            top_logprobs=_tops(self.engine, c.top_logprobs),
            finish_reason=FINISH[c.finish_reason],
            stop_sequence=c.stop_sequence,
        )
        if tool_names is not None:
            message, finish = self._message(c.text, c.finish_reason, tool_names)
            choice.message.CopyFrom(message)
            choice.finish_reason = finish
        return choice

    def _usage(self, prompt_len: int, completion_tokens: int) -> pb.Usage:
        return pb.Usage(
            prompt_tokens=prompt_len, completion_tokens=completion_tokens, total_tokens=prompt_len + completion_tokens
        )

    async def _stream(
        self,
        prompt_ids: list[int],
        images: list[bytes],
        params: SamplingParams,
        tool_names: set[str] | None,
        return_prompt: bool,
    ) -> AsyncIterator[tuple[pb.ChoiceDelta | None, pb.StreamSummary | None]]:
        texts = [""] * params.n
        info = self.engine.info  # the version that generates: swaps wait for running requests
        produced = 0
        async with generation.stream(self.engine, prompt_ids, params, images) as events:
            async for event in events:
                produced += len(event.token_ids)
                delta = pb.ChoiceDelta(
                    index=event.index,
                    text=event.text,
                    token_ids=event.token_ids,
                    logprobs=event.logprobs,
                    top_logprobs=_tops(self.engine, event.top_logprobs),
                    finish_reason=FINISH[event.finish_reason],
                )
                texts[event.index] += event.text
                if event.finish_reason is not None and tool_names is not None:
                    message, delta.finish_reason = self._message(texts[event.index], event.finish_reason, tool_names)
                    delta.message.CopyFrom(message)
                yield delta, None
        yield (
            None,
            pb.StreamSummary(
                usage=self._usage(len(prompt_ids), produced),
                model=info.model_id,
                weights_version=info.weights_version,
                prompt_token_ids=prompt_ids if return_prompt else [],
            ),
        )

    # -- RPCs ---------------------------------------------------------------------------------------------------

    async def Chat(self, request: pb.ChatRequest, context: grpc.aio.ServicerContext) -> pb.ChatResponse:
        prompt_ids, tool_names, images = self._chat_prompt(request)
        params = _params(self.engine, request.sampling, len(prompt_ids), self.max_n)
        info = self.engine.info
        choices = await generation.collect(self.engine, prompt_ids, params, images)
        return pb.ChatResponse(
            choices=[self._choice(c, tool_names) for c in choices],
            usage=self._usage(len(prompt_ids), sum(len(c.token_ids) for c in choices)),
            model=info.model_id,
            weights_version=info.weights_version,
            prompt_token_ids=prompt_ids if request.return_prompt_token_ids else [],
        )

    async def StreamChat(
        self, request: pb.StreamChatRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamChatResponse]:
        prompt_ids, tool_names, images = self._chat_prompt(request)
        params = _params(self.engine, request.sampling, len(prompt_ids), self.max_n)
        async for delta, summary in self._stream(
            prompt_ids, images, params, tool_names, request.return_prompt_token_ids
        ):
            yield pb.StreamChatResponse(delta=delta) if delta else pb.StreamChatResponse(summary=summary)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        prompt_ids, images = self._generate_prompt(request)
        params = _params(self.engine, request.sampling, len(prompt_ids), self.max_n)
        info = self.engine.info
        choices = await generation.collect(self.engine, prompt_ids, params, images)
        return pb.GenerateResponse(
            choices=[self._choice(c, None) for c in choices],
            usage=self._usage(len(prompt_ids), sum(len(c.token_ids) for c in choices)),
            model=info.model_id,
            weights_version=info.weights_version,
            prompt_token_ids=prompt_ids if request.return_prompt_token_ids else [],
        )

    async def StreamGenerate(
        self, request: pb.StreamGenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamGenerateResponse]:
        prompt_ids, images = self._generate_prompt(request)
        params = _params(self.engine, request.sampling, len(prompt_ids), self.max_n)
        async for delta, summary in self._stream(prompt_ids, images, params, None, request.return_prompt_token_ids):
            yield pb.StreamGenerateResponse(delta=delta) if delta else pb.StreamGenerateResponse(summary=summary)

    async def ScoreTokens(
        self, request: pb.ScoreTokensRequest, context: grpc.aio.ServicerContext
    ) -> pb.ScoreTokensResponse:
        generation.check_model(self.engine, request.model)
        which = request.WhichOneof("prompt")
        if which == "text":
            prompt_ids = self.engine.tokenize(request.text)
        elif which == "token_ids":
            prompt_ids = list(request.token_ids.ids)
        elif which == "chat":
            prompt_ids = self.engine.tokenize(self._render(request.chat))
            if message_images(request.chat.messages):  # a vision model renders them; score takes no images yet
                raise Unimplemented(
                    "ScoreTokens does not take images yet; score a conversation without image parts",
                    reason="VISION_UNSUPPORTED",
                )
        else:
            raise InvalidArgument("the prompt is missing; set text, token_ids or chat", field="prompt")
        if not prompt_ids:
            raise InvalidArgument("the prompt is empty; the first continuation token needs context", field="prompt")
        continuation = list(request.continuation_token_ids)
        if not continuation:
            raise InvalidArgument(
                "continuation_token_ids is empty; give the tokens to score", field="continuation_token_ids"
            )
        generation.check_token_ids(self.engine, prompt_ids, "token_ids")
        generation.check_token_ids(self.engine, continuation, "continuation_token_ids")
        context_len = self.engine.info.max_context_tokens
        if len(prompt_ids) + len(continuation) > context_len:
            raise InvalidArgument(
                f"prompt ({len(prompt_ids)}) plus continuation ({len(continuation)}) tokens exceed "
                f"the model's context of {context_len}; truncate",
                field="continuation_token_ids",
            )
        if not 0 <= request.top_logprobs <= generation.MAX_TOP_LOGPROBS:
            raise InvalidArgument(
                f"top_logprobs must be between 0 and {generation.MAX_TOP_LOGPROBS}", field="top_logprobs"
            )
        info = self.engine.info
        result = await self.engine.score(prompt_ids, continuation, request.top_logprobs)
        return pb.ScoreTokensResponse(
            logprobs=result.logprobs,
            top_logprobs=_tops(self.engine, result.top_logprobs),
            prompt_token_ids=prompt_ids,
            model=info.model_id,
            weights_version=info.weights_version,
        )

    def _render(self, prompt: pb.ChatPrompt) -> str:
        messages = [message_dict(m, i, self.engine.info) for i, m in enumerate(prompt.messages)]
        tools = [tool_spec(t, i) for i, t in enumerate(prompt.tools)]
        return chat.render(
            self.engine, messages, tools, prompt.add_generation_prompt, _template_kwargs(prompt.chat_template_kwargs)
        )

    async def Tokenize(self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        generation.check_model(self.engine, request.model)
        ids = self.engine.tokenize(request.text, request.add_special_tokens)
        return pb.TokenizeResponse(token_ids=ids, tokens=self.engine.token_strings(ids))

    async def ApplyChatTemplate(
        self, request: pb.ApplyChatTemplateRequest, context: grpc.aio.ServicerContext
    ) -> pb.ApplyChatTemplateResponse:
        generation.check_model(self.engine, request.model)
        text = self._render(request.prompt)
        return pb.ApplyChatTemplateResponse(text=text, token_ids=self.engine.tokenize(text))

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        if request.page_size < 0:
            raise InvalidArgument("page_size must not be negative", field="page_size")
        if request.page_token:
            raise InvalidArgument(
                "page_token is not from this service (it serves one model, on one page)", field="page_token"
            )
        return pb.ListModelsResponse(models=[model_pb(self.engine.info)])

    async def UpdateWeights(
        self, request: pb.UpdateWeightsRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateWeightsResponse:
        generation.check_model(self.engine, request.model)
        if not request.checkpoint_path:
            raise InvalidArgument(
                "checkpoint_path is empty; give the checkpoint folder the trainer wrote", field="checkpoint_path"
            )
        previous = self.engine.info.weights_version
        t0 = time.monotonic()
        info = await self.engine.update_weights(request.checkpoint_path, request.weights_version)
        took = duration(time.monotonic() - t0)
        return pb.UpdateWeightsResponse(model=model_pb(info), previous_weights_version=previous, load_duration=took)

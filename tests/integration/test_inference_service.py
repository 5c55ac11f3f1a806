"""The inference service over real gRPC on a loopback port, with the real embedded model (SmolLM2-135M-Instruct on
CPU, loaded once for the module from the cached converted folder)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from orchard.errors import from_rpc_error
from orchard.inference.v1 import inference_pb2 as pb
from orchard.inference.v1 import inference_pb2_grpc
from orchard.runtime import GrpcServer
from orchard.services.inference.engines.transformers_engine import TransformersEngine
from orchard.services.inference.server import build
from orchard.services.inference.settings import InferenceSettings
from orchard.types.v1 import types_pb2 as tpb

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

FRANCE = [tpb.Message(role=tpb.ROLE_USER, content="What is the capital of France?")]
STORY = "Once upon a time, in a small village,"


@dataclass
class Service:
    stub: inference_pb2_grpc.InferenceServiceStub
    engine: TransformersEngine
    server: GrpcServer
    channel: grpc.aio.Channel


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def svc() -> AsyncIterator[Service]:
    """One real inference server for the module (the model loads once, in 2-4 s from the cached folder)."""
    settings = InferenceSettings(port=0, log_format="text", grace_period_s=1.0, max_batch_size=8)
    server, engine = await build(settings)
    port = await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    assert isinstance(engine, TransformersEngine)
    yield Service(inference_pb2_grpc.InferenceServiceStub(channel), engine, server, channel)
    await channel.close()
    await server.stop()


def sampling(**fields: object) -> pb.SamplingParams:
    return pb.SamplingParams(**{"max_tokens": 16, "temperature": 0.0, **fields})  # type: ignore[arg-type]


async def wait_idle(engine: TransformersEngine, seconds: float = 10) -> None:
    """Until no sequence is running (the batch drops a cancelled sequence before its next step)."""
    end = time.monotonic() + seconds
    while engine.running:
        assert time.monotonic() < end, f"{engine.running} sequences still running"
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_chat_is_coherent_with_token_ids_and_logprobs(svc: Service) -> None:
    """Greedy chat answers the question; token ids, logprobs and usage line up."""
    reply = await svc.stub.Chat(
        pb.ChatRequest(messages=FRANCE, sampling=sampling(logprobs=True, top_logprobs=3), return_prompt_token_ids=True),
        timeout=60,
    )
    choice = reply.choices[0]
    assert "Paris" in choice.message.content and choice.message.role == tpb.ROLE_ASSISTANT
    assert choice.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    assert len(choice.token_ids) == len(choice.logprobs) == len(choice.top_logprobs) > 0
    assert all(lp <= 0 for lp in choice.logprobs)
    # Greedy: the sampled token is the most likely one at every position.
    assert [t.candidates[0].token_id for t in choice.top_logprobs] == list(choice.token_ids)
    assert reply.usage.prompt_tokens == len(reply.prompt_token_ids)
    assert reply.usage.completion_tokens == len(choice.token_ids)
    assert reply.model == "SmolLM2-135M-Instruct" and reply.weights_version == "SmolLM2-135M-Instruct"


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_score_tokens_matches_sampled_logprobs(svc: Service, temperature: float) -> None:
    """ScoreTokens of a sampled continuation gives the logprobs sampling reported (same model distribution)."""
    reply = await svc.stub.Chat(
        pb.ChatRequest(
            messages=FRANCE,
            return_prompt_token_ids=True,
            sampling=sampling(temperature=temperature, seed=5, logprobs=True),
        ),
        timeout=60,
    )
    choice = reply.choices[0]
    scored = await svc.stub.ScoreTokens(
        pb.ScoreTokensRequest(
            token_ids=pb.TokenIds(ids=reply.prompt_token_ids), continuation_token_ids=choice.token_ids
        ),
        timeout=60,
    )
    assert len(scored.logprobs) == len(choice.logprobs)
    assert max(abs(a - b) for a, b in zip(scored.logprobs, choice.logprobs, strict=True)) < 1e-4
    # The same prompt given as a conversation scores the same.
    by_chat = await svc.stub.ScoreTokens(
        pb.ScoreTokensRequest(
            chat=pb.ChatPrompt(messages=FRANCE, add_generation_prompt=True),
            continuation_token_ids=choice.token_ids,
            top_logprobs=2,
        ),
        timeout=60,
    )
    assert list(by_chat.prompt_token_ids) == list(reply.prompt_token_ids)
    assert len(by_chat.top_logprobs) == len(choice.token_ids)


async def test_score_discriminates(svc: Service) -> None:
    """Paris is far likelier than Berlin as the capital of France."""

    async def total(answer: str) -> float:
        ids = (await svc.stub.Tokenize(pb.TokenizeRequest(text=answer), timeout=10)).token_ids
        scored = await svc.stub.ScoreTokens(
            pb.ScoreTokensRequest(
                chat=pb.ChatPrompt(messages=FRANCE, add_generation_prompt=True), continuation_token_ids=ids
            ),
            timeout=60,
        )
        return sum(scored.logprobs)

    assert await total("The capital of France is Paris.") > await total("The capital of France is Berlin.") + 3


@pytest.mark.slow
async def test_stream_chat_matches_unary(svc: Service) -> None:
    """StreamChat's deltas add up to the unary reply, then one summary ends the stream."""
    unary = await svc.stub.Chat(pb.ChatRequest(messages=FRANCE, sampling=sampling(max_tokens=12)), timeout=60)
    deltas: list[pb.StreamChatResponse] = []
    summaries: list[pb.StreamChatResponse] = []
    async for msg in svc.stub.StreamChat(
        pb.StreamChatRequest(messages=FRANCE, sampling=sampling(max_tokens=12), return_prompt_token_ids=True),
        timeout=60,
    ):
        (deltas if msg.WhichOneof("event") == "delta" else summaries).append(msg)
    assert len(summaries) == 1 and msg.WhichOneof("event") == "summary"
    text = "".join(d.delta.text for d in deltas)
    ids = [t for d in deltas for t in d.delta.token_ids]
    assert text == unary.choices[0].text and ids == list(unary.choices[0].token_ids)
    assert deltas[-1].delta.finish_reason == unary.choices[0].finish_reason
    assert deltas[-1].delta.message.content == unary.choices[0].message.content
    assert summaries[0].summary.usage.completion_tokens == len(ids)
    assert summaries[0].summary.prompt_token_ids


@pytest.mark.slow
async def test_generate_n_samples_and_seed(svc: Service) -> None:
    """n choices come back indexed; a seed makes sampling reproducible; streams interleave choices."""
    request = pb.GenerateRequest(text=STORY, sampling=sampling(temperature=1.0, seed=11, n=3, max_tokens=8))
    first = await svc.stub.Generate(request, timeout=60)
    second = await svc.stub.Generate(request, timeout=60)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [list(c.token_ids) for c in first.choices] == [list(c.token_ids) for c in second.choices]
    assert len({tuple(c.token_ids) for c in first.choices}) > 1  # choices are seeded apart
    assert first.usage.completion_tokens == sum(len(c.token_ids) for c in first.choices)
    streamed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    async for msg in svc.stub.StreamGenerate(
        pb.StreamGenerateRequest(text=STORY, sampling=sampling(temperature=1.0, seed=11, n=3, max_tokens=8)), timeout=60
    ):
        if msg.WhichOneof("event") == "delta":
            streamed[msg.delta.index] += msg.delta.token_ids
    assert [streamed[i] for i in range(3)] == [list(c.token_ids) for c in first.choices]


async def test_generate_from_token_ids_and_stop(svc: Service) -> None:
    """A token-id prompt is used exactly; a stop string ends the text before it."""
    ids = (await svc.stub.Tokenize(pb.TokenizeRequest(text=STORY), timeout=10)).token_ids
    by_text = await svc.stub.Generate(
        pb.GenerateRequest(text=STORY, sampling=sampling(max_tokens=6), return_prompt_token_ids=True), timeout=60
    )
    by_ids = await svc.stub.Generate(
        pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=sampling(max_tokens=6)), timeout=60
    )
    assert list(by_text.prompt_token_ids) == list(ids)
    assert by_ids.choices[0].token_ids == by_text.choices[0].token_ids
    text = by_text.choices[0].text
    word = text.split()[1]
    stopped = await svc.stub.Generate(
        pb.GenerateRequest(text=STORY, sampling=sampling(max_tokens=6, stop=[word])), timeout=60
    )
    choice = stopped.choices[0]
    assert choice.text == text[: text.index(word)]
    assert choice.finish_reason == pb.FINISH_REASON_STOP and choice.stop_sequence == word


@pytest.mark.slow
async def test_concurrent_requests_are_batched(svc: Service) -> None:
    """Four concurrent calls decode together: the batch-size histogram records steps with more than one row."""

    def multi_row_steps() -> float:
        count = REGISTRY.get_sample_value("orchard_inference_batch_size_count") or 0.0
        single = REGISTRY.get_sample_value("orchard_inference_batch_size_bucket", {"le": "1.0"}) or 0.0
        return count - single

    before = multi_row_steps()
    replies = await asyncio.gather(
        *[
            svc.stub.Generate(pb.GenerateRequest(text=f"{STORY} {name}", sampling=sampling(max_tokens=8)), timeout=60)
            for name in ("Tom", "Ann", "Bob", "Eve")
        ]
    )
    assert all(len(r.choices[0].token_ids) == 8 for r in replies)
    assert multi_row_steps() - before >= 4
    assert svc.engine.stats.max_batch_size >= 3


async def test_tokenize_apply_chat_template_list_models(svc: Service) -> None:
    """The template renders ChatML; its ids are what Tokenize gives; ListModels names the model."""
    rendered = await svc.stub.ApplyChatTemplate(
        pb.ApplyChatTemplateRequest(prompt=pb.ChatPrompt(messages=FRANCE, add_generation_prompt=True)), timeout=10
    )
    assert rendered.text.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    tokens = await svc.stub.Tokenize(pb.TokenizeRequest(text=rendered.text), timeout=10)
    assert list(tokens.token_ids) == list(rendered.token_ids)
    assert len(tokens.tokens) == len(tokens.token_ids) and "<|im_start|>" in tokens.tokens
    models = (await svc.stub.ListModels(pb.ListModelsRequest(), timeout=10)).models
    assert [(m.name, m.engine, m.is_default, m.max_context_tokens) for m in models] == [
        ("models/SmolLM2-135M-Instruct", "transformers", True, 8192)
    ]


async def test_cancelled_stream_leaves_the_batch(svc: Service) -> None:
    """A client that goes away mid-stream frees its row at once."""
    call = svc.stub.StreamGenerate(pb.StreamGenerateRequest(text=STORY, sampling=sampling(max_tokens=2000)), timeout=60)
    async for _ in call:
        break
    assert svc.engine.running == 1
    call.cancel()
    await wait_idle(svc.engine)


async def test_deadline_is_honoured(svc: Service) -> None:
    """A call past its deadline fails with DEADLINE_EXCEEDED and its sequence stops."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await svc.stub.Generate(pb.GenerateRequest(text=STORY, sampling=sampling(max_tokens=2000)), timeout=1.0)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await wait_idle(svc.engine)


@pytest.mark.parametrize(
    ("request_", "code", "needle"),
    [
        (pb.ChatRequest(), grpc.StatusCode.INVALID_ARGUMENT, "messages is empty"),
        (
            pb.ChatRequest(messages=FRANCE, sampling=pb.SamplingParams(max_tokens=10**6)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "exceed the model's context",
        ),
        (
            pb.ChatRequest(messages=FRANCE, sampling=pb.SamplingParams(n=100)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "n must be between 1 and 16",
        ),
        (
            pb.ChatRequest(messages=FRANCE, sampling=pb.SamplingParams(top_logprobs=50)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "top_logprobs",
        ),
        (
            pb.ChatRequest(messages=FRANCE, sampling=pb.SamplingParams(temperature=-1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "temperature",
        ),
        (pb.ChatRequest(model="gpt-9", messages=FRANCE), grpc.StatusCode.NOT_FOUND, "not served here"),
        (pb.ChatRequest(messages=[tpb.Message(content="no role")]), grpc.StatusCode.INVALID_ARGUMENT, "no role"),
        (pb.GenerateRequest(), grpc.StatusCode.INVALID_ARGUMENT, "prompt is missing"),
        (
            pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 10**7])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "outside the vocabulary",
        ),
        (pb.ScoreTokensRequest(text="Hello"), grpc.StatusCode.INVALID_ARGUMENT, "continuation_token_ids is empty"),
        (pb.UpdateWeightsRequest(checkpoint_path="/nonexistent/ckpt-1"), grpc.StatusCode.NOT_FOUND, "not found"),
        (pb.UpdateWeightsRequest(checkpoint_path="/tmp"), grpc.StatusCode.INVALID_ARGUMENT, "no config.json"),
    ],
)
async def test_bad_input(svc: Service, request_: object, code: grpc.StatusCode, needle: str) -> None:
    """Bad requests get a clear status and message; the service keeps serving."""
    method = {
        pb.ChatRequest: svc.stub.Chat,
        pb.GenerateRequest: svc.stub.Generate,
        pb.ScoreTokensRequest: svc.stub.ScoreTokens,
        pb.UpdateWeightsRequest: svc.stub.UpdateWeights,
    }
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await method[type(request_)](request_, timeout=30)
    assert err.value.code() == code and needle in (err.value.details() or ""), err.value.details()


@pytest.mark.slow
async def test_update_weights_swaps_checkpoint(svc: Service, tmp_path: Path) -> None:
    """A checkpoint with changed weights swaps in without a restart: version and outputs change; back again."""
    import torch
    from transformers import AutoModelForCausalLM

    base = svc.engine.info
    model = AutoModelForCausalLM.from_pretrained(base.checkpoint_path, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(-1)  # negated logits: greedy picks what was least likely
    model.save_pretrained(tmp_path / "ckpt-7")
    del model
    request = pb.GenerateRequest(text=STORY, sampling=sampling(max_tokens=4, logprobs=True))
    before = (await svc.stub.Generate(request, timeout=60)).choices[0]

    updated = await svc.stub.UpdateWeights(
        pb.UpdateWeightsRequest(checkpoint_path=str(tmp_path / "ckpt-7")), timeout=60
    )
    assert updated.model.weights_version == "ckpt-7" and updated.previous_weights_version == base.weights_version
    assert updated.model.checkpoint_path == str(tmp_path / "ckpt-7") and updated.load_duration.ToNanoseconds() > 0
    after = await svc.stub.Generate(request, timeout=60)
    assert after.weights_version == "ckpt-7" and after.choices[0].token_ids != before.token_ids
    again = await svc.stub.UpdateWeights(pb.UpdateWeightsRequest(checkpoint_path=str(tmp_path / "ckpt-7")), timeout=60)
    assert again.previous_weights_version == "ckpt-7"  # a retry is a no-op

    restored = await svc.stub.UpdateWeights(
        pb.UpdateWeightsRequest(checkpoint_path=base.checkpoint_path, weights_version="base"), timeout=60
    )
    assert restored.model.weights_version == "base"
    assert (await svc.stub.Generate(request, timeout=60)).choices[0].token_ids == before.token_ids


@pytest.mark.slow
async def test_chat_tool_call(svc: Service) -> None:
    """Offered tools, the reply is parsed into the message's tool calls (one earlier call shows the tiny model
    the format; it does not call tools zero-shot)."""
    weather = tpb.ToolDefinition(
        name="get_weather",
        description="Get the current weather in a city.",
        parameters='{"type": "object", "properties": {"city": {"type": "string"}}}',
    )
    messages = [
        tpb.Message(role=tpb.ROLE_USER, content="What is the weather in Berlin?"),
        tpb.Message(
            role=tpb.ROLE_ASSISTANT,
            tool_calls=[tpb.ToolCall(id="call_1", name="get_weather", arguments='{"city": "Berlin"}')],
        ),
        tpb.Message(role=tpb.ROLE_USER, content="What is the weather in Paris?"),
    ]
    reply = await svc.stub.Chat(
        pb.ChatRequest(messages=messages, tools=[weather], sampling=sampling(max_tokens=24)), timeout=60
    )
    choice = reply.choices[0]
    assert choice.finish_reason == pb.FINISH_REASON_TOOL_CALLS, choice.text
    assert [(c.name, c.arguments) for c in choice.message.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    assert "<tool_call>" in choice.text and not choice.message.content
    plain = await svc.stub.Chat(
        pb.ChatRequest(
            messages=messages, tools=[weather], tool_choice=pb.TOOL_CHOICE_NONE, sampling=sampling(max_tokens=8)
        ),
        timeout=60,
    )
    assert not plain.choices[0].message.tool_calls


SCREENSHOT = tpb.Image(data=b"\x89PNG\r\n\x1a\n", mime_type="image/png", width=1, height=1)
LOOK = tpb.Message(
    role=tpb.ROLE_USER, parts=[tpb.ContentPart(text="What is on the screen?"), tpb.ContentPart(image=SCREENSHOT)]
)


@pytest.mark.parametrize(
    ("method", "request_", "where"),
    [
        ("Generate", pb.GenerateRequest(text=STORY, images=[SCREENSHOT]), "images holds an image"),
        ("StreamGenerate", pb.StreamGenerateRequest(text=STORY, images=[SCREENSHOT]), "images holds an image"),
        ("Chat", pb.ChatRequest(messages=[*FRANCE, LOOK]), "messages[1] holds an image"),
        (
            "ApplyChatTemplate",
            pb.ApplyChatTemplateRequest(prompt=pb.ChatPrompt(messages=[LOOK])),
            "messages[0] holds an image",
        ),
    ],
)
async def test_images_are_refused_by_the_text_only_model(
    svc: Service, method: str, request_: object, where: str
) -> None:
    """The CPU model takes text only: images answer UNIMPLEMENTED VISION_UNSUPPORTED saying what to serve instead,
    ListModels says vision is false, and the service keeps serving."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        call = getattr(svc.stub, method)(request_, timeout=30)
        if method.startswith("Stream"):
            _ = [m async for m in call]
        else:
            await call
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.value.details() == (
        f"{where}, but model 'SmolLM2-135M-Instruct' on the transformers engine takes "
        "text only; serve a vision-language model on the vllm engine to send images"
    )
    assert from_rpc_error(err.value).reason == "VISION_UNSUPPORTED"
    models = (await svc.stub.ListModels(pb.ListModelsRequest(), timeout=10)).models
    assert [m.vision for m in models] == [False]
    reply = await svc.stub.Generate(pb.GenerateRequest(text=STORY, sampling=sampling(max_tokens=2)), timeout=30)
    assert len(reply.choices[0].token_ids) == 2

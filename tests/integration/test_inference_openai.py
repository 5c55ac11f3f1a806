"""The OpenAI-compatible endpoint driven by the real `openai` Python client, in front of the real embedded model
(SmolLM2-135M-Instruct on CPU, loaded once for the module)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import grpc
import openai
import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from orchard.inference.v1 import inference_pb2 as pb
from orchard.inference.v1 import inference_pb2_grpc
from orchard.runtime import GrpcServer
from orchard.services.inference.engines.base import Engine
from orchard.services.inference.server import build, start_gateway
from orchard.services.inference.settings import InferenceSettings

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

MODEL = "SmolLM2-135M-Instruct"
FRANCE: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@dataclass
class Endpoint:
    client: openai.AsyncOpenAI
    engine: Engine
    stub: inference_pb2_grpc.InferenceServiceStub
    server: GrpcServer


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api() -> AsyncIterator[Endpoint]:
    """The inference service with its HTTP endpoint on loopback ports, and an openai client pointed at it."""
    settings = InferenceSettings(port=0, http_port=0, log_format="text", grace_period_s=1.0)
    server, engine = await build(settings)
    gateway = await start_gateway(settings, server, engine)
    assert gateway is not None
    port = await server.start()
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{gateway.port}/v1", api_key="unused", max_retries=0, timeout=60
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield Endpoint(client, engine, inference_pb2_grpc.InferenceServiceStub(channel), server)
    await client.close()
    await channel.close()
    await server.stop()


async def test_models(api: Endpoint) -> None:
    models = await api.client.models.list()
    assert [m.id for m in models.data] == [MODEL]


@pytest.mark.slow
async def test_chat_with_logprobs_and_token_ids(api: Endpoint) -> None:
    """A greedy chat answers; logprobs and (vLLM-style) token ids match what gRPC ScoreTokens says."""
    reply = await api.client.chat.completions.create(
        model=MODEL,
        messages=FRANCE,
        max_tokens=16,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True},
    )
    choice = reply.choices[0]
    assert "Paris" in (choice.message.content or "")
    assert choice.finish_reason in ("stop", "length") and reply.usage is not None
    assert choice.logprobs is not None and choice.logprobs.content
    entries = choice.logprobs.content
    assert "".join(e.token for e in entries).startswith(choice.message.content or "")
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in entries)
    token_ids = choice.model_extra["token_ids"]  # type: ignore[index]
    prompt_ids = reply.model_extra["prompt_token_ids"]  # type: ignore[index]
    assert len(token_ids) == len(entries) == reply.usage.completion_tokens
    scored = await api.stub.ScoreTokens(
        pb.ScoreTokensRequest(token_ids=pb.TokenIds(ids=prompt_ids), continuation_token_ids=token_ids), timeout=60
    )
    assert max(abs(a - e.logprob) for a, e in zip(scored.logprobs, entries, strict=True)) < 1e-4


@pytest.mark.slow
async def test_chat_streaming(api: Endpoint) -> None:
    """Streamed chunks add up to the non-streamed reply, and the usage chunk comes last."""
    whole = await api.client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=12, temperature=0)
    stream = await api.client.chat.completions.create(
        model=MODEL, messages=FRANCE, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert whole.usage is not None
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.slow
async def test_completions(api: Endpoint) -> None:
    """Raw completion, with logprobs, n samples and a stream."""
    reply = await api.client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=1
    )
    choice = reply.choices[0]
    assert "Paris" in choice.text
    assert reply.usage is not None
    assert choice.logprobs is not None and len(choice.logprobs.tokens or []) == reply.usage.completion_tokens
    assert "".join(choice.logprobs.tokens or []) == choice.text
    several = await api.client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=1.0, n=2, seed=3
    )
    assert [c.index for c in several.choices] == [0, 1]
    stream = await api.client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
    )
    assert "".join([c.choices[0].text async for c in stream]) == choice.text


@pytest.mark.slow
async def test_tool_call(api: Endpoint) -> None:
    """The model is offered a tool; its reply is parsed into an OpenAI tool call (streamed the same way).

    SmolLM2-135M does not call tools zero-shot; one earlier call in the conversation is enough for it to follow
    the format, and that earlier call also exercises rendering calls for a template without tool support.
    """
    example: ChatCompletionMessageParam = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'}}
        ],
    }
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "What is the weather in Berlin?"},
        example,
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    reply = await api.client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=24, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert not choice.message.content
    assert choice.message.tool_calls, choice.message
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    stream = await api.client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=24, temperature=0, stream=True
    )
    chunks = [c async for c in stream]
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [(tc.function.name, tc.function.arguments) for tc in calls] == [  # type: ignore[union-attr]
        ("get_weather", call.function.arguments)
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The call's result goes back into the conversation; the model answers in text.
    follow: list[ChatCompletionMessageParam] = messages + [
        cast(ChatCompletionMessageParam, choice.message.model_dump(exclude_none=True)),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18}'},
    ]
    answer = await api.client.chat.completions.create(
        model=MODEL, messages=follow, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=8, temperature=0
    )
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.choices[0].message.content


@pytest.mark.parametrize(
    ("kwargs", "status", "needle"),
    [
        ({"model": "gpt-9", "messages": FRANCE}, 404, "not served here"),
        ({"model": MODEL, "messages": []}, 400, "messages is empty"),
        ({"model": MODEL, "messages": FRANCE, "n": 99}, 400, "n must be between"),
        ({"model": MODEL, "messages": FRANCE, "max_tokens": 10**6}, 400, "exceed the model's context"),
        (
            {
                "model": MODEL,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                        ],
                    }
                ],
            },
            501,
            "messages[0] holds an image, but model 'SmolLM2-135M-Instruct' on the transformers engine takes text only",
        ),
    ],
)
async def test_errors(api: Endpoint, kwargs: dict[str, object], status: int, needle: str) -> None:
    """Bad requests get OpenAI-shaped errors with the right HTTP status."""
    with pytest.raises(openai.APIStatusError) as err:
        await api.client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    assert err.value.status_code == status and needle in err.value.message


CHAT = "/chat/completions"
COMPLETION = "/completions"


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        (CHAT, {"model": MODEL, "messages": FRANCE, "seed": 1 << 63}, "seed"),
        (CHAT, {"model": MODEL, "messages": FRANCE, "seed": 1 << 63, "stream": True}, "seed"),
        (CHAT, {"model": MODEL, "messages": FRANCE, "max_tokens": 0}, "max_tokens"),
        (CHAT, {"model": MODEL, "messages": FRANCE, "n": 0}, "n"),
        (CHAT, {"model": MODEL, "messages": FRANCE, "top_logprobs": 3}, "top_logprobs needs logprobs"),
        (CHAT, {"model": MODEL, "messages": FRANCE, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (CHAT, {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role 'wizard'"),
        (CHAT, {"model": MODEL, "messages": FRANCE, "response_format": {"type": "json_object"}}, "json_object"),
        (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "\ud800"}]}, "lone surrogate"),
        (CHAT, {"model": MODEL, "messages": FRANCE, "temperature": float("nan")}, "temperature"),
        (COMPLETION, {"model": MODEL, "prompt": "Hi", "max_tokens": 0}, "max_tokens"),
        (COMPLETION, {"model": MODEL, "prompt": "Hi", "echo": True, "logprobs": 1}, "echo with logprobs"),
        (COMPLETION, {"model": MODEL, "prompt": "Hi", "seed": -(1 << 64)}, "seed"),
    ],
)
async def test_bad_requests_are_400_before_anything_is_sent(
    api: Endpoint, path: str, body: dict[str, object], needle: str
) -> None:
    """Each answer is a 400 in OpenAI's error shape (never a 500, never an error inside a started stream)."""
    raw = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    status, answer = await _post(api, path, raw)
    assert status == 400, answer
    assert set(answer) == {"error"} and needle in answer["error"]["message"], answer


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b'{"model": "x", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
    ],
)
async def test_bodies_that_are_not_json_objects_are_400(api: Endpoint, raw: bytes, needle: str) -> None:
    status, answer = await _post(api, CHAT, raw)
    assert status == 400 and needle in answer["error"]["message"], answer


async def _post(api: Endpoint, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{api.client.base_url}".rstrip("/") + path, data=raw, headers={"Content-Type": "application/json"}
        ) as response:
            return response.status, await response.json(content_type=None)


async def test_model_retrieve_and_echo(api: Endpoint) -> None:
    """models.retrieve answers for the served model and 404s in OpenAI's shape for another; echo prepends the
    prompt (streamed first when streaming)."""
    assert (await api.client.models.retrieve(MODEL)).id == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        await api.client.models.retrieve("gpt-9")
    assert "does not exist" in err.value.message
    done = await api.client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, echo=True
    )
    assert done.choices[0].text.startswith("The capital of France is") and len(done.choices[0].text) > 24
    streamed = [
        c.choices[0].text
        async for c in await api.client.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, echo=True, stream=True
        )
        if c.choices
    ]
    assert "".join(streamed) == done.choices[0].text


async def test_a_tool_result_renders_into_the_prompt_as_sent(api: Endpoint) -> None:
    """The prompt of a conversation with a tool result holds that result verbatim and nothing the server made
    up (a template error is a 400, never text in the prompt)."""
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 18}'},
    ]
    body = {
        "model": MODEL,
        "messages": messages,
        "tools": [WEATHER_TOOL],
        "max_tokens": 1,
        "temperature": 0,
        "return_token_ids": True,
    }
    status, answer = await _post(api, CHAT, json.dumps(body).encode())
    assert status == 200, answer
    prompt = api.engine.detokenize(answer["prompt_token_ids"])  # type: ignore[arg-type]
    assert '{"temp_c": 18}' in prompt and '"city": "Paris"' in prompt and "error" not in prompt.lower()

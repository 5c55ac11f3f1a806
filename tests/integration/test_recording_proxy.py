"""The recording proxy between the real `openai` client and real OpenAI-compatible backends: the inference
service's endpoint with the embedded model, and a second proxy in front of the first (any OpenAI-compatible
backend will do). Every call is recorded by rollout id, streamed calls assembled like unstreamed ones."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletionMessageParam

from orchard.services.inference.server import build, start_gateway
from orchard.services.inference.settings import InferenceSettings
from orchard.services.proxy.records import read_records
from orchard.services.proxy.server import RecordingProxy
from orchard.services.proxy.settings import ProxySettings

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

MODEL = "SmolLM2-135M-Instruct"
FRANCE: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]


@dataclass
class Stack:
    upstream: str  # the inference service's OpenAI base URL
    proxy: RecordingProxy
    records: Path

    def client(self, api_key: str = "unused", **headers: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{self.proxy.port}/v1",
            api_key=api_key,
            default_headers=headers,
            max_retries=0,
            timeout=60,
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    settings = InferenceSettings(port=0, http_port=0, log_format="text", grace_period_s=1.0)
    server, engine = await build(settings)
    gateway = await start_gateway(settings, server, engine)
    assert gateway is not None
    await server.start()
    upstream = f"http://127.0.0.1:{gateway.port}/v1"
    records = tmp_path_factory.mktemp("records")
    proxy = RecordingProxy(
        ProxySettings(port=0, upstream_url=upstream, records_dir=records, log_format="text", grace_period_s=1.0)
    )
    await proxy.start()
    yield Stack(upstream, proxy, records)
    await proxy.stop()
    await server.stop()


@pytest.mark.slow
async def test_calls_pass_through_and_are_recorded_by_rollout(stack: Stack) -> None:
    """A chat keyed by API key and a streamed chat keyed by header reach the model unchanged; each record holds
    the request and the answer the client saw (the stream assembled), in order, with seq numbers."""
    async with stack.client(api_key="rollout-run7-task3:unused") as client:
        reply = await client.chat.completions.create(
            model=MODEL, messages=FRANCE, max_tokens=12, temperature=0, logprobs=True
        )
        assert "Paris" in (reply.choices[0].message.content or "")
        models = await client.models.list()  # passes through; GETs are not recorded
        assert [m.id for m in models.data] == [MODEL]
    async with stack.client(**{"X-Orchard-Rollout-Id": "run7-task3"}) as client:
        stream = await client.chat.completions.create(
            model=MODEL, messages=FRANCE, max_tokens=12, temperature=0, stream=True
        )
        streamed = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert streamed == reply.choices[0].message.content  # greedy: the same answer both ways

    first, second = read_records(stack.records, "run7-task3")
    assert (first["seq"], second["seq"]) == (0, 1)
    assert first["path"] == second["path"] == "/v1/chat/completions"
    assert first["request"]["messages"] == FRANCE and first["request"]["max_tokens"] == 12
    assert first["status"] == 200 and not first["stream"] and first["error"] is None
    assert first["response"]["choices"][0]["message"]["content"] == reply.choices[0].message.content
    logprobs = first["response"]["choices"][0]["logprobs"]["content"]
    assert len(logprobs) == reply.usage.completion_tokens  # type: ignore[union-attr]
    assert second["stream"] and second["response"]["choices"][0]["message"]["content"] == streamed
    assert second["response"]["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.slow
async def test_any_openai_backend_and_completions(stack: Stack, tmp_path: Path) -> None:
    """A second proxy in front of the first: both record the same completion call, under the key's rollout."""
    outer = RecordingProxy(
        ProxySettings(
            port=0, upstream_url=f"http://127.0.0.1:{stack.proxy.port}/v1", records_dir=tmp_path, log_format="text"
        )
    )
    await outer.start()
    try:
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{outer.port}/v1", api_key="rollout-chain-1", max_retries=0, timeout=60
        ) as client:
            done = await client.completions.create(
                model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0
            )
    finally:
        await outer.stop()
    [outer_record] = read_records(tmp_path, "chain-1")
    # The outer proxy sent no key upstream (rollout-chain-1 carries none), so the inner one recorded "unkeyed".
    inner = [r for r in read_records(stack.records, "unkeyed") if r["path"] == "/v1/completions"]
    assert (
        outer_record["response"]["choices"][0]["text"]
        == done.choices[0].text
        == inner[-1]["response"]["choices"][0]["text"]
    )


async def test_bad_input_and_a_dead_upstream_get_openai_errors(stack: Stack, tmp_path: Path) -> None:
    """Bad rollout ids and bodies are 400s in the OpenAI error shape; a dead upstream is a 502 that is recorded."""
    async with stack.client(api_key="rollout-../../etc") as client:
        with pytest.raises(openai.BadRequestError, match="invalid rollout id"):
            await client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=2)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{stack.proxy.port}/v1/chat/completions",
            data=b"{not json",
            headers={"Content-Type": "application/json"},
        ) as response:
            assert response.status == 400
            assert "not valid JSON" in (await response.json())["error"]["message"]

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    proxy = RecordingProxy(
        ProxySettings(
            port=0,
            upstream_url=f"http://127.0.0.1:{dead}/v1",
            records_dir=tmp_path,
            log_format="text",
            require_rollout_id=True,
        )
    )
    await proxy.start()
    try:
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{proxy.port}/v1", api_key="sk-x", max_retries=0, timeout=30
        ) as client:
            with pytest.raises(openai.BadRequestError, match="no rollout id"):
                await client.chat.completions.create(model=MODEL, messages=FRANCE)
            with pytest.raises(openai.APIStatusError, match="upstream") as info:
                await client.chat.completions.create(
                    model=MODEL, messages=FRANCE, extra_headers={"X-Orchard-Rollout-Id": "dead-1"}
                )
            assert info.value.status_code == 502
    finally:
        await proxy.stop()
    [record] = read_records(tmp_path, "dead-1")
    assert record["status"] == 502 and "upstream" in record["error"] and record["response"] is None

"""The recording proxy's pure parts: rollout ids from headers and API keys, folding SSE streams back into one
response, and the JSON-lines records (seq continues across restarts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request

from orchard.services.proxy.records import JsonlRecords, check_rollout_id, read_records
from orchard.services.proxy.server import rollout_of
from orchard.services.proxy.settings import ProxySettings
from orchard.services.proxy.streams import StreamAssembler


def settings(**kw: object) -> ProxySettings:
    return ProxySettings(records_dir=Path("/nonexistent"), **kw)  # type: ignore[arg-type]


def request(**headers: str) -> object:
    return make_mocked_request("POST", "/v1/chat/completions", headers=headers)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-Orchard-Rollout-Id": "r1", "Authorization": "Bearer sk-real"}, ("r1", "sk-real")),
        ({"Authorization": "Bearer rollout-r2"}, ("r2", None)),
        ({"Authorization": "Bearer rollout-r3:sk-up"}, ("r3", "sk-up")),
        ({"X-Orchard-Rollout-Id": "hdr", "Authorization": "Bearer rollout-key:sk-up"}, ("hdr", "sk-up")),
        ({"Authorization": "Bearer sk-plain"}, (None, "sk-plain")),
        ({}, (None, None)),
    ],
)
def test_rollout_id_from_header_or_key(headers: dict[str, str], expected: tuple[str | None, str | None]) -> None:
    assert rollout_of(request(**headers), settings()) == expected  # type: ignore[arg-type]


def test_configured_upstream_key_wins() -> None:
    got = rollout_of(request(Authorization="Bearer rollout-r:sk-client"), settings(upstream_api_key="sk-conf"))  # type: ignore[arg-type]
    assert got == ("r", "sk-conf")


@pytest.mark.parametrize("bad", ["", "../etc", ".hidden", "a/b", "x" * 129, "sp ace"])
def test_rollout_ids_that_cannot_name_a_file_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid rollout id"):
        check_rollout_id(bad)


def sse(*chunks: object) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n" for c in chunks)


def test_chat_stream_assembles_content_tool_calls_logprobs_and_usage() -> None:
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    stream = sse(
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": "Hel"},
                    "logprobs": {"content": [{"token": "Hel", "logprob": -0.1}]},
                }
            ],
        },
        {
            **base,
            "choices": [
                {"index": 0, "delta": {"content": "lo"}, "logprobs": {"content": [{"token": "lo", "logprob": -0.2}]}}
            ],
        },
        {
            **base,
            "choices": [
                {
                    "index": 1,
                    "delta": {
                        "tool_calls": [{"index": 0, "id": "t1", "function": {"name": "get_", "arguments": '{"a"'}}]
                    },
                }
            ],
        },
        {
            **base,
            "choices": [
                {
                    "index": 1,
                    "delta": {"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": ": 1}"}}]},
                    "finish_reason": "tool_calls",
                }
            ],
        },
        {
            **base,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        },
        b"[DONE]",
    )
    assembler = StreamAssembler()
    for i in range(0, len(stream), 7):  # arbitrary network chunking, splitting lines
        assembler.feed(stream[i : i + 7])
    result = assembler.result()
    assert assembler.done and assembler.chunks == 5
    assert result["object"] == "chat.completion" and result["id"] == "c1"
    first, second = result["choices"]
    assert first["message"] == {"role": "assistant", "content": "Hello"} and first["finish_reason"] == "stop"
    assert [t["logprob"] for t in first["logprobs"]["content"]] == [-0.1, -0.2]
    assert second["message"]["tool_calls"] == [
        {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": '{"a": 1}'}}
    ]
    assert result["usage"]["total_tokens"] == 5


def test_completion_stream_assembles_text_and_ignores_noise() -> None:
    assembler = StreamAssembler()
    assembler.feed(
        b": keep-alive comment\n\n"
        + sse(
            {"object": "text_completion", "choices": [{"index": 0, "text": "a"}]},
            b"not json",
            {"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]},
        )
    )
    assert assembler.result()["choices"] == [{"index": 0, "finish_reason": "length", "text": "ab"}]
    assert assembler.result()["object"] == "text_completion" and not assembler.done


async def test_records_count_per_rollout_and_continue_after_a_restart(tmp_path: Path) -> None:
    records = JsonlRecords(tmp_path)
    for rollout in ("a", "b", "a"):
        await records.write({"rollout_id": rollout, "request": {"n": rollout}})
    again = JsonlRecords(tmp_path)  # a restarted proxy
    await again.write({"rollout_id": "a", "request": {}})
    assert [r["seq"] for r in read_records(tmp_path, "a")] == [0, 1, 2]
    assert [r["seq"] for r in read_records(tmp_path, "b")] == [0]
    assert read_records(tmp_path, "never") == []

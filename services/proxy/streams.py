"""Folding an OpenAI server-sent-event stream back into the one response object the same call would have
returned unstreamed, so a streamed call and a plain one are recorded alike."""

from __future__ import annotations

import json
from typing import Any


class StreamAssembler:
    """Feed it the raw SSE bytes as they pass; `result()` is the assembled chat.completion / text_completion."""

    def __init__(self) -> None:
        self._buffer = b""
        self._base: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: Any = None
        self.chunks = 0
        self.done = False

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._line(line.strip())

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return  # blank separators, comments, event: lines
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            return  # not ours to judge: the bytes still reached the client unchanged
        if not isinstance(chunk, dict):
            return
        self.chunks += 1
        if not self._base:
            self._base = {k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if k in chunk}
            self._base["object"] = str(chunk.get("object", "")).removesuffix(".chunk")
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        index = int(choice.get("index", 0))
        out = self._choices.setdefault(index, {"index": index, "finish_reason": None})
        if choice.get("finish_reason") is not None:
            out["finish_reason"] = choice["finish_reason"]
        if "text" in choice:  # a completions stream
            out["text"] = out.get("text", "") + (choice["text"] or "")
        delta = choice.get("delta")
        if isinstance(delta, dict):
            message = out.setdefault("message", {"role": "assistant", "content": None})
            if delta.get("role"):
                message["role"] = delta["role"]
            if delta.get("content"):
                message["content"] = (message["content"] or "") + delta["content"]
            for call in delta.get("tool_calls") or []:
                self._tool_call(message, call)
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            merged = out.setdefault("logprobs", {})
            for key, value in logprobs.items():
                if isinstance(value, list):
                    merged[key] = merged.get(key, []) + value
                else:
                    merged[key] = value

    @staticmethod
    def _tool_call(message: dict[str, Any], call: dict[str, Any]) -> None:
        calls = message.setdefault("tool_calls", [])
        index = int(call.get("index", len(calls)))
        while len(calls) <= index:
            calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        out = calls[index]
        if call.get("id"):
            out["id"] = call["id"]
        function = call.get("function") or {}
        out["function"]["name"] += function.get("name") or ""
        out["function"]["arguments"] += function.get("arguments") or ""

    def result(self) -> dict[str, Any]:
        response = dict(self._base)
        response["choices"] = [self._choices[i] for i in sorted(self._choices)]
        if self._usage is not None:
            response["usage"] = self._usage
        return response

"""The OpenAI-compatible HTTP endpoint (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, with streaming,
tool calls and logprobs) in front of the same engine the gRPC servicer uses, so the `openai` client and
third-party harnesses work unmodified. Like servicer.py it translates, nothing else. Started by
`orchard serve inference --http-port N`, in the gRPC server's process.

A client that disconnects cancels its handler (aiohttp's handler_cancellation), which aborts its sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pydantic
from aiohttp import web

from orchard.chat import templates as chat
from orchard.chat.tools import parse_tool_calls
from orchard.errors import (
    InvalidArgument,
    OrchardError,
    Unauthenticated,
    Unimplemented,
)
from orchard.runtime.http import HttpSite
from orchard.services.inference import generation
from orchard.services.inference import openai_protocol as p
from orchard.services.inference.engines.base import Engine, SamplingParams, vision_unsupported
from orchard.services.inference.generation import Completion
from orchard.services.inference.settings import InferenceSettings

log = logging.getLogger("orchard.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "invalid_request_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error"),
}


class OpenAIGateway:
    """aiohttp server speaking the OpenAI API over one engine."""

    def __init__(self, engine: Engine, settings: InferenceSettings) -> None:
        self.engine = engine
        self.settings = settings
        self._site = HttpSite()
        self._tokens = settings.auth_tokens()  # token -> tenant; empty when auth is off

    @property
    def port(self) -> int:
        """The bound HTTP port (useful with http_port=0); only valid after `start`."""
        return self._site.port

    async def start(self) -> int:
        app = web.Application(client_max_size=self.settings.max_message_bytes, middlewares=[self._middleware])
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model_id:.+}", self.model)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", self.health)
        # handler_cancellation: a client that goes away cancels its handler, which aborts its sequences.
        port = await self._site.start(
            app,
            self.settings.host,
            self.settings.http_port or 0,
            self.settings.grace_period_s,
            handler_cancellation=True,
        )
        log.info(
            "OpenAI-compatible endpoint on http://%s:%d/v1",
            self.settings.host,
            port,
            extra={"service": "inference", "http_port": port},
        )
        return port

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish for grace_period_s, then close; safe to repeat."""
        await self._site.stop()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.monotonic()
        request_id = uuid.uuid4().hex[:16]
        try:
            if self._tokens and request.path != "/health":
                sent = request.headers.get("Authorization", "")
                if not sent.startswith("Bearer ") or sent.removeprefix("Bearer ") not in self._tokens:
                    raise Unauthenticated("missing or invalid API key; send the service's auth token as the key")
            response = await handler(request)
        except _StreamEnded as ended:
            response = ended.response
            await response.write_eof()
        except web.HTTPException as exc:
            response = web.json_response(p.error_body(exc.reason, "invalid_request_error"), status=exc.status)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(x) for x in first["loc"])
            response = web.json_response(
                p.error_body(f"{param}: {first['msg']}", "invalid_request_error", param), status=400
            )
        except OrchardError as err:
            status, kind = _HTTP_STATUS.get(err.code, (500, "server_error"))
            response = web.json_response(p.error_body(err.message, kind, err.field), status=status)
        except Exception as exc:
            log.error(
                "unexpected error in %s %s (request id %s)",
                request.method,
                request.path,
                request_id,
                exc_info=exc,
                extra={"request_id": request_id},
            )
            response = web.json_response(
                p.error_body(f"internal error (request id {request_id})", "server_error"), status=500
            )
        log.info(
            "http %s %s %d",
            request.method,
            request.path,
            response.status,
            extra={
                "method": request.method,
                "route": request.path,
                "status": response.status,
                "duration_ms": round((time.monotonic() - started) * 1000, 2),
                "request_id": request_id,
            },
        )
        return response

    async def _body(self, request: web.Request) -> Any:
        """The JSON body, checked before anything is generated or sent: UTF-8, not nested past what the parser
        takes, and no lone surrogate (\\ud800) in any string, which no tokenizer can encode."""
        raw = await request.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InvalidArgument(f"the body is not UTF-8: {err}") from None
        try:
            body = json.loads(text)
        except json.JSONDecodeError as err:
            raise InvalidArgument(f"the body is not JSON: {err}") from None
        except RecursionError:
            raise InvalidArgument("the body's JSON is nested too deeply") from None
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                "the body holds a lone surrogate (e.g. \\ud800), which is not text; send valid UTF-16 pairs"
            ) from None
        except RecursionError:
            raise InvalidArgument("the body's JSON is nested too deeply") from None
        if not isinstance(body, dict):
            raise InvalidArgument("the body must be a JSON object")
        return body

    # -- routes -------------------------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _model_card(self) -> dict[str, Any]:
        info = self.engine.info
        return {
            "id": info.model_id,
            "object": "model",
            "created": int(info.load_time),
            "owned_by": "orchard",
            "max_model_len": info.max_context_tokens,
            "weights_version": info.weights_version,
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        """GET /v1/models/{id}: the served model's card, 404 in OpenAI's shape for any other id."""
        card = self._model_card()
        if request.match_info["model_id"] != card["id"]:
            return web.json_response(
                p.error_body(
                    f"The model '{request.match_info['model_id']}' does not exist; this server serves '{card['id']}'",
                    "invalid_request_error",
                    "model",
                    "model_not_found",
                ),
                status=404,
            )
        return web.json_response(card)

    def _params(
        self, req: p._Sampling, prompt_len: int, max_tokens: int | None, logprobs: bool, top_logprobs: int
    ) -> SamplingParams:
        generation.check_model(self.engine, req.model)
        return generation.sampling_params(
            self.engine,
            prompt_len,
            max_tokens=max_tokens or 0,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stop=req.stop_list(),
            seed=req.seed,
            n=req.n,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            max_n=self.settings.max_n,
        )

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        req = p.ChatCompletionRequest.model_validate(await self._body(request))
        if (index := req.image_message()) is not None:  # refused, never silently dropped
            if not self.engine.info.vision:
                raise vision_unsupported(self.engine.info, f"messages[{index}]")
            raise Unimplemented(
                f"messages[{index}] holds an image: this endpoint takes text only so far; send "
                "images through the gRPC Chat or Generate RPCs",
                reason="VISION_UNSUPPORTED",
            )
        tools = req.tool_specs()
        prompt = chat.render(self.engine, req.chat_messages(), tools, True, req.chat_template_kwargs)
        prompt_ids = self.engine.tokenize(prompt)
        want_logprobs = req.logprobs or req.top_logprobs > 0
        params = self._params(
            req, len(prompt_ids), req.max_completion_tokens or req.max_tokens, want_logprobs, req.top_logprobs
        )
        names = {t["function"]["name"] for t in tools if "function" in t}
        meta = {"id": p.new_id("chatcmpl"), "created": p.now(), "model": self.engine.info.model_id}
        if req.stream:
            return await self._stream_chat(request, req, prompt_ids, params, names, meta)
        choices = await generation.collect(self.engine, prompt_ids, params)
        body: dict[str, Any] = {
            **meta,
            "object": "chat.completion",
            "choices": [self._chat_choice(c, names, req) for c in choices],
            "usage": p.usage(len(prompt_ids), sum(len(c.token_ids) for c in choices)),
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = prompt_ids
        return web.json_response(body)

    def _chat_logprobs(
        self, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]], req: p.ChatCompletionRequest
    ) -> dict[str, Any] | None:
        if not req.logprobs:
            return None
        strings = self.engine.token_strings(ids)
        content = []
        for i, (tok, lp) in enumerate(zip(strings, lps, strict=True)):
            entry = p.token_logprob(tok, lp)
            alternatives = tops[i] if i < len(tops) else []
            alt_strings = self.engine.token_strings([t for t, _ in alternatives])
            entry["top_logprobs"] = [p.token_logprob(s, v) for s, (_, v) in zip(alt_strings, alternatives, strict=True)]
            content.append(entry)
        return {"content": content}

    def _chat_message(self, text: str, finish: str | None, names: set[str]) -> tuple[dict[str, Any], str | None]:
        content, calls = parse_tool_calls(text, names) if names else (text, [])
        message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in p.tool_calls_json(calls)]
        reason = "tool_calls" if calls else p.FINISH[finish]
        return message, reason

    def _chat_choice(self, c: Completion, names: set[str], req: p.ChatCompletionRequest) -> dict[str, Any]:
        message, reason = self._chat_message(c.text, c.finish_reason, names)
        choice: dict[str, Any] = {
            "index": c.index,
            "message": message,
            "finish_reason": reason,
            "logprobs": self._chat_logprobs(c.token_ids, c.logprobs, c.top_logprobs, req),
        }
        if req.return_token_ids:
            choice["token_ids"] = c.token_ids
        return choice

    async def _stream_chat(
        self,
        request: web.Request,
        req: p.ChatCompletionRequest,
        prompt_ids: list[int],
        params: SamplingParams,
        names: set[str],
        meta: dict[str, Any],
    ) -> web.StreamResponse:
        response = await _sse(request)
        texts = [""] * params.n
        produced = 0
        chunk = {**meta, "object": "chat.completion.chunk"}
        for i in range(params.n):
            await _send(
                response,
                {
                    **chunk,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                },
            )
        async with _stream_errors(response), generation.stream(self.engine, prompt_ids, params) as events:
            async for ev in events:
                produced += len(ev.token_ids)
                texts[ev.index] += ev.text
                delta: dict[str, Any] = {}
                reason = p.FINISH[ev.finish_reason]
                if not names:
                    if ev.text:
                        delta["content"] = ev.text
                elif ev.finish_reason is not None:
                    # With tools offered, text is held back: calls parse only from the whole reply.
                    message, reason = self._chat_message(texts[ev.index], ev.finish_reason, names)
                    if message["content"]:
                        delta["content"] = message["content"]
                    if "tool_calls" in message:
                        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
                choice: dict[str, Any] = {
                    "index": ev.index,
                    "delta": delta,
                    "finish_reason": reason,
                    "logprobs": self._chat_logprobs(ev.token_ids, ev.logprobs, ev.top_logprobs, req),
                }
                if req.return_token_ids:
                    choice["token_ids"] = ev.token_ids
                await _send(response, {**chunk, "choices": [choice]})
        if req.stream_options and req.stream_options.include_usage:
            await _send(response, {**chunk, "choices": [], "usage": p.usage(len(prompt_ids), produced)})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = p.CompletionRequest.model_validate(await self._body(request))
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise InvalidArgument("this server takes one prompt per request; send a list of one", field="prompt")
            prompt = prompt[0]  # type: ignore[assignment]
        if isinstance(prompt, str):
            prompt_ids = self.engine.tokenize(prompt)
        else:
            prompt_ids = [int(t) for t in prompt]  # type: ignore[union-attr]
            generation.check_token_ids(self.engine, prompt_ids, "prompt")
        top = req.logprobs or 0
        params = self._params(
            req, len(prompt_ids), req.max_tokens if req.max_tokens is not None else 16, req.logprobs is not None, top
        )
        echoed = (prompt if isinstance(prompt, str) else self.engine.detokenize(prompt_ids)) if req.echo else ""
        meta = {"id": p.new_id("cmpl"), "created": p.now(), "model": self.engine.info.model_id}
        if req.stream:
            response = await _sse(request)
            produced = 0
            if echoed:  # the prompt first, as OpenAI's legacy endpoint streams it
                for i in range(params.n):
                    await _send(
                        response,
                        {
                            **meta,
                            "object": "text_completion",
                            "choices": [{"index": i, "text": echoed, "finish_reason": None, "logprobs": None}],
                        },
                    )
            async with _stream_errors(response), generation.stream(self.engine, prompt_ids, params) as events:
                async for ev in events:
                    produced += len(ev.token_ids)
                    choice = {
                        "index": ev.index,
                        "text": ev.text,
                        "finish_reason": p.FINISH[ev.finish_reason],
                        "logprobs": self._completion_logprobs(ev.token_ids, ev.logprobs, ev.top_logprobs, req),
                    }
                    if req.return_token_ids:
                        choice["token_ids"] = ev.token_ids
                    await _send(response, {**meta, "object": "text_completion", "choices": [choice]})
            if req.stream_options and req.stream_options.include_usage:
                await _send(
                    response,
                    {**meta, "object": "text_completion", "choices": [], "usage": p.usage(len(prompt_ids), produced)},
                )
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        choices = await generation.collect(self.engine, prompt_ids, params)
        out = []
        for c in choices:
            choice = {
                "index": c.index,
                "text": echoed + c.text,
                "finish_reason": p.FINISH[c.finish_reason],
                "logprobs": self._completion_logprobs(c.token_ids, c.logprobs, c.top_logprobs, req),
            }
            if req.return_token_ids:
                choice["token_ids"] = c.token_ids
            out.append(choice)
        body: dict[str, Any] = {
            **meta,
            "object": "text_completion",
            "choices": out,
            "usage": p.usage(len(prompt_ids), sum(len(c.token_ids) for c in choices)),
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = prompt_ids
        return web.json_response(body)

    def _completion_logprobs(
        self, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]], req: p.CompletionRequest
    ) -> dict[str, Any] | None:
        if req.logprobs is None:
            return None
        strings = self.engine.token_strings(ids)
        offsets, at = [], 0
        for s in strings:
            offsets.append(at)
            at += len(s)
        top_maps = (
            [
                dict(zip(self.engine.token_strings([t for t, _ in alt]), [v for _, v in alt], strict=True))
                for alt in tops
            ]
            if tops
            else None
        )
        return {"tokens": strings, "token_logprobs": lps, "top_logprobs": top_maps, "text_offset": offsets}


@contextlib.asynccontextmanager
async def _stream_errors(response: web.StreamResponse) -> AsyncIterator[None]:
    """Inside a started (200) stream a status can no longer be sent: an error ends the stream with an error event
    in OpenAI's shape and [DONE], as vLLM does, instead of breaking the connection."""
    try:
        yield
    except OrchardError as err:
        _, kind = _HTTP_STATUS.get(err.code, (500, "server_error"))
        await _send(response, p.error_body(err.message, kind, err.field))
        await response.write(b"data: [DONE]\n\n")
        raise _StreamEnded(response) from err
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as err:
        request_id = uuid.uuid4().hex[:16]
        log.error("unexpected error in a stream (request id %s)", request_id, exc_info=err)
        await _send(response, p.error_body(f"internal error (request id {request_id})", "server_error"))
        await response.write(b"data: [DONE]\n\n")
        raise _StreamEnded(response) from err


class _StreamEnded(Exception):
    """A stream that ended on an error event: the response to return as it is."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__("stream ended on an error")
        self.response = response


async def _sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def _send(response: web.StreamResponse, chunk: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

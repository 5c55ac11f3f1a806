"""The recording proxy (`orchard serve proxy`): an OpenAI-compatible HTTP proxy in front of any OpenAI-compatible
backend (the inference service's HTTP port, vLLM, a hosted API) that records every request/response pair,
keyed by rollout id, so the trajectories of any CLI harness become training samples.

A harness points its base URL at the proxy and names its rollout either with a header (X-Orchard-Rollout-Id)
or with its API key, `rollout-<id>` or `rollout-<id>:<upstream key>` (most harnesses let you set only the base
URL and the key). Bytes pass through unchanged, streams included; a streamed answer is recorded assembled,
like an unstreamed one. The record is stored before the client gets the end of its answer, so a harness that
saw an answer can rely on it being recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from orchard.runtime.http import HttpSite
from orchard.runtime.main import run_service
from orchard.services.proxy.records import (
    UNKEYED,
    JsonlRecords,
    NatsRecords,
    RecordSink,
    check_rollout_id,
)
from orchard.services.proxy.settings import ProxySettings
from orchard.services.proxy.streams import StreamAssembler

log = logging.getLogger("orchard.proxy")

KEY_PREFIX = "rollout-"
# Headers that describe one hop, not the message; aiohttp sets its own. Accept-Encoding goes too, so the
# upstream answers uncompressed and streams can be read as they pass.
HOP_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "authorization",
        "accept-encoding",
        "content-encoding",
    }
)


def openai_error(status: int, message: str, kind: str) -> web.Response:
    """An error in the OpenAI API's shape, so clients raise their usual exceptions with our message."""
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": None}}, status=status)


def rollout_of(request: web.Request, settings: ProxySettings) -> tuple[str | None, str | None]:
    """(rollout id or None, the API key to send upstream or None) from the request's header and key."""
    header = request.headers.get(settings.rollout_header, "").strip()
    auth = request.headers.get("Authorization", "")
    key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    upstream_key: str | None = key or None
    rollout_id = header or None
    if key.startswith(KEY_PREFIX):
        key_rollout, _, rest = key[len(KEY_PREFIX) :].partition(":")
        rollout_id = rollout_id or key_rollout
        upstream_key = rest or None
    if settings.upstream_api_key is not None:
        upstream_key = settings.upstream_api_key
    return rollout_id, upstream_key


class RecordingProxy:
    def __init__(self, settings: ProxySettings, sink: RecordSink | None = None) -> None:
        self.settings = settings
        self._own_sink = sink is None
        self.sink: RecordSink = sink if sink is not None else JsonlRecords(settings.records_dir)
        self._site = HttpSite("--port", "port")
        self._session: aiohttp.ClientSession | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0); only valid after `start`."""
        return self._site.port

    async def start(self) -> int:
        if self._own_sink and self.settings.nats_url:
            # Connect before listening: an unreachable bus is a start-up error, not a lost first record.
            self.sink = await NatsRecords.connect(self.settings.nats_url, self.settings.run_id)
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        app.router.add_get("/health", self._health)
        app.router.add_route("*", "/v1/{tail:.*}", self._forward)
        timeout = aiohttp.ClientTimeout(total=self.settings.upstream_timeout_s, sock_connect=10)
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        try:
            await self._site.start(app, self.settings.host, self.settings.port, self.settings.grace_period_s)
        except BaseException:
            await self._session.close()
            await self.sink.close()
            raise
        where = (
            f"NATS {self.settings.nats_url} (run {self.settings.run_id})"
            if isinstance(self.sink, NatsRecords)
            else getattr(self.sink, "directory", type(self.sink).__name__)
        )
        log.info(
            "proxy listening on %s:%d, upstream %s, records to %s",
            self.settings.host,
            self.port,
            self.settings.upstream_url,
            where,
        )
        return self.port

    async def stop(self) -> None:
        """Finish in-flight calls (up to grace_period_s), then close the upstream session and the sink."""
        await self._site.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.sink.close()

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "upstream": self.settings.upstream_url})

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        rollout_id, upstream_key = rollout_of(request, self.settings)
        if rollout_id is not None:
            try:
                check_rollout_id(rollout_id)
            except ValueError as err:
                return openai_error(400, str(err), "invalid_request_error")
        elif self.settings.require_rollout_id:
            return openai_error(
                400,
                f"no rollout id: send the {self.settings.rollout_header} header or use the "
                f"API key {KEY_PREFIX}<id>[:<upstream key>]",
                "invalid_request_error",
            )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return openai_error(413, f"request body over {self.settings.max_body_bytes} bytes", "invalid_request_error")
        payload: Any = None
        if request.method == "POST":
            try:
                payload = await request.json() if body else None
            except ValueError:
                return openai_error(400, "the request body is not valid JSON", "invalid_request_error")
            if not isinstance(payload, dict):
                return openai_error(400, "the request body must be a JSON object", "invalid_request_error")
        record = (
            None
            if request.method != "POST"
            else {
                "rollout_id": rollout_id or UNKEYED,
                "time": datetime.now(UTC).isoformat(),
                "path": request.path,
                "request": payload,
                "upstream": self.settings.upstream_url,
            }
        )
        return await self._relay(request, body, upstream_key, record)

    async def _relay(
        self, request: web.Request, body: bytes, upstream_key: str | None, record: dict[str, Any] | None
    ) -> web.StreamResponse:
        assert self._session is not None
        url = f"{self.settings.upstream_url}/{request.match_info['tail']}"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if upstream_key:
            headers["Authorization"] = f"Bearer {upstream_key}"
        started = time.monotonic()
        try:
            async with self._session.request(
                request.method, url, params=request.query, data=body, headers=headers
            ) as upstream:
                if upstream.content_type == "text/event-stream":
                    return await self._relay_stream(request, upstream, record, started)
                data = await upstream.read()
                response = web.Response(
                    body=data, status=upstream.status, content_type=upstream.content_type or "application/json"
                )
                if record is not None:
                    await self._record(record, started, upstream.status, _json_or_text(data), stream=False)
                return response
        except (TimeoutError, aiohttp.ClientError) as err:
            message = f"upstream {self.settings.upstream_url} failed: {type(err).__name__}: {err}".rstrip(": ")
            log.warning("%s", message)
            if record is not None:
                await self._record(record, started, 502, None, stream=False, error=message)
            return openai_error(502, message, "upstream_error")

    async def _relay_stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, record: dict[str, Any] | None, started: float
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=upstream.status, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        assembler = StreamAssembler()
        error = None
        pending = b""
        async for data in upstream.content.iter_any():
            assembler.feed(data)
            # Hold back the last event until the record is stored: a client that saw the end was recorded.
            pending += data
            cut = pending.rfind(b"\n\n")
            if cut < 0 or assembler.done:
                continue
            try:
                await response.write(pending[: cut + 2])
            except ConnectionResetError:
                error = "the client went away mid-stream"
                break
            pending = pending[cut + 2 :]
        if record is not None:
            result = assembler.result() if assembler.chunks else None
            await self._record(record, started, upstream.status, result, stream=True, error=error)
        if error is None:
            try:
                await response.write(pending)
                await response.write_eof()
            except ConnectionResetError:
                pass
        return response

    async def _record(
        self,
        record: dict[str, Any],
        started: float,
        status: int,
        response: Any,
        *,
        stream: bool,
        error: str | None = None,
    ) -> None:
        record.update(
            status=status,
            latency_ms=round((time.monotonic() - started) * 1000, 2),
            stream=stream,
            response=response,
            error=error,
        )
        try:
            await self.sink.write(record)
        except Exception:  # never fail the harness's call over a record; say so loudly instead
            log.exception("could not store the record of rollout %s", record["rollout_id"])


def _json_or_text(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


async def serve(settings: ProxySettings) -> None:
    proxy = RecordingProxy(settings)
    await proxy.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("proxy stopping: finishing in-flight calls")
    await proxy.stop()


def main(argv: Sequence[str] | None = None) -> None:
    run_service("proxy", ProxySettings, serve, argv)


if __name__ == "__main__":
    main()

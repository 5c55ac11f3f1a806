"""EgressProxy: the HTTP proxy on 127.0.0.1 that one browser sandbox's context sends all its traffic through
(http, https and WebSocket, redirects and workers included), admitting only what its network policy allows.

Page-level request routing cannot enforce a policy alone: Chromium follows redirects without asking it. The
proxy sees every connection, and connects to the address it checked (no second DNS lookup to rebind)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import Callable

from orchard.services.env.backends.base import EgressRule
from orchard.services.env.browser_policy import (
    Target,
    admits,
    admitted_addresses,
    authority_target,
    needs_addresses,
    url_target,
)

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 15.0
MAX_HEADERS = 200
HOP_HEADERS = (b"proxy-connection:", b"proxy-authorization:", b"connection:", b"keep-alive:")


def blocked_message(sandbox_id: str, target: Target) -> str:
    return (
        f"the network policy of sandbox {sandbox_id!r} does not admit {target}; allow it when creating the "
        "sandbox (e.g. create_browser(allow=[...])) or with SetNetworkPolicy"
    )


class EgressProxy:
    """A forward proxy for one browser sandbox; rules() is read per connection, so policy changes apply at once."""

    def __init__(self, sandbox_id: str, rules: Callable[[], tuple[EgressRule, ...]]) -> None:
        self.sandbox_id = sandbox_id
        self.rules = rules
        """The sandbox's egress rules in force."""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.blocked: deque[tuple[float, Target]] = deque(maxlen=32)
        """Recently refused destinations with the time they were refused, newest last."""

    async def start(self) -> int:
        """Listen on 127.0.0.1; returns the port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()

    def blocked_since(self, since: float) -> Target | None:
        """The last destination refused at or after `since` (a time.monotonic() value)."""
        for when, target in reversed(self.blocked):
            if when >= since:
                return target
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        up_writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(HEADER_TIMEOUT_S):
                line = await reader.readline()
                headers = []
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    headers.append(header)
                    if len(headers) > MAX_HEADERS:
                        raise ValueError("too many headers")
            method, uri, _ = line.decode("latin-1").split()
            target = authority_target(uri) if method == "CONNECT" else url_target(uri)
            if target is None:
                raise ValueError(f"{uri!r} is not an http URL")
            address = await self._admit(target)
            if address is None:
                self.blocked.append((time.monotonic(), target))
                log.info("browser egress refused", extra={"sandbox_id": self.sandbox_id, "target": str(target)})
                body = blocked_message(self.sandbox_id, target).encode()
                writer.write(
                    b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
                return
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    up_reader, up_writer = await asyncio.open_connection(address, target.port)
            except (OSError, TimeoutError):
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                return
            self._writers.add(up_writer)
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                # One request per connection: the next one may be for another destination, checked anew.
                path = uri.split("://", 1)[1].partition("/")
                up_writer.write(f"{method} /{path[2]} HTTP/1.1\r\n".encode("latin-1"))
                up_writer.writelines(h for h in headers if not h.lower().startswith(HOP_HEADERS))
                up_writer.write(b"Connection: close\r\n\r\n")
            await _splice(reader, writer, up_reader, up_writer)
        except (ValueError, UnicodeDecodeError, TimeoutError):
            with contextlib.suppress(OSError):
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            pass
        finally:
            writer.close()
            self._writers.discard(writer)
            if up_writer is not None:
                up_writer.close()
                self._writers.discard(up_writer)

    async def _admit(self, target: Target) -> str | None:
        """The address to connect to for target, or None when the policy does not admit it."""
        rules = self.rules()
        if admits(rules, target):
            return target.host
        if not needs_addresses(rules, target):
            return None
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except OSError:
            return None
        addresses = admitted_addresses(rules, target, [str(info[4][0]) for info in infos])
        return addresses[0] if addresses else None


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Copy bytes both ways until either side closes, then close both."""

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while data := await src.read(1 << 16):
            dst.write(data)
            await dst.drain()

    tasks = [asyncio.create_task(pipe(reader, up_writer)), asyncio.create_task(pipe(up_reader, writer))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

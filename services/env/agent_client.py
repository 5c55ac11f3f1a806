"""The manager's side of the in-sandbox agent's protocol (agent-rs/PROTOCOL.md): frames to and from the native
agent of every backend, multiplexed by request id."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import json
import logging
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from orchard.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OrchardError,
    ResourceExhausted,
    Unavailable,
)

log = logging.getLogger(__name__)

HEAD = struct.Struct(">II")
"""A frame's prefix: its total length (4 + header + body) and its header's length, big-endian."""
PTY_WINDOW = 1 << 20
"""A terminal's output bytes the agent sends before it waits for a pty_ack."""

MAX_TERMINAL_SIZE = 1000
PTY_CLOSE_TIMEOUT_S = 5.0

_ERRNO_ERRORS: dict[int, type[OrchardError]] = {
    errno.ENOENT: NotFound,
    errno.ENOTDIR: FailedPrecondition,
    errno.EISDIR: FailedPrecondition,
    errno.EEXIST: FailedPrecondition,
    errno.EACCES: FailedPrecondition,
    errno.EPERM: FailedPrecondition,
    errno.EROFS: FailedPrecondition,
    errno.ENOSPC: ResourceExhausted,
    errno.EDQUOT: ResourceExhausted,
    errno.ENAMETOOLONG: InvalidArgument,
    errno.ENODEV: FailedPrecondition,  # the agents' answer to reading what is not a regular file
}


def encode(header: dict[str, Any], body: bytes = b"") -> bytes:
    """One frame, ready to write."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    return HEAD.pack(4 + len(raw) + len(body), len(raw)) + raw + body


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes] | None:
    """The next (header, body), or None at the end of the stream (asyncio.IncompleteReadError mid-frame)."""
    try:
        prefix = await reader.readexactly(HEAD.size)
    except asyncio.IncompleteReadError as err:
        if err.partial:
            raise
        return None
    total, head_len = HEAD.unpack(prefix)
    data = await reader.readexactly(total - 4)
    return json.loads(data[:head_len]), data[head_len:]


@dataclass(frozen=True)
class ExecEvent:
    """One event of a running command: out (fd 1/2 with data) or exit."""

    kind: str
    fd: int = 0
    data: bytes = b""
    exit_code: int = 0
    totals: tuple[int, int] = (0, 0)
    reason: str | None = None
    error: str | None = None


def terminal_size(rows: int, cols: int) -> tuple[int, int]:
    """(rows, cols) when both are within 1..1000, else InvalidArgument."""
    if not (1 <= rows <= MAX_TERMINAL_SIZE and 1 <= cols <= MAX_TERMINAL_SIZE):
        raise InvalidArgument(
            f"terminal size {rows}x{cols} is out of range: rows and cols must be between 1 and {MAX_TERMINAL_SIZE}",
            field="rows",
        )
    return rows, cols


class PtySession:
    """A program on a pseudo-terminal in a sandbox. Iterate it (one task) for its output events, then its exit
    event; send input and resize from any task; close() when done with it."""

    def __init__(
        self, client: AgentClient, rid: int, queue: asyncio.Queue[tuple[dict[str, Any], bytes] | None]
    ) -> None:
        self._client = client
        self._rid = rid
        self._queue = queue
        self._consumed = 0
        self._acked = 0
        self._ended = False  # the exit came, or the agent failed or went away
        self._stashed: tuple[dict[str, Any], bytes] | None = None  # a frame read by started(), not yet taken
        self.exit_code: int | None = None
        """The program's exit code once its exit event was taken (128 + n when killed by signal n)."""
        self.signal: int | None = None
        """The signal that killed the program, once its exit event was taken (None: it exited)."""
        self.pid: int | None = None
        """The program's pid in the sandbox, once started() saw it."""

    async def started(self) -> int | None:
        """Wait until the program started; its pid (None when it could not start: its output says why)."""
        frame = await self._next_frame()
        if frame is not None and frame[0]["ev"] == "started":
            self.pid = int(frame[0]["pid"])
        else:
            self._stashed = frame if frame is not None else None
            if frame is None:
                self._queue.put_nowait(None)
        return self.pid

    async def _next_frame(self) -> tuple[dict[str, Any], bytes] | None:
        if self._stashed is not None:
            frame, self._stashed = self._stashed, None
            return frame
        return await self._queue.get()

    async def send_input(self, data: bytes) -> None:
        """Type data into the terminal; waits while the program is not reading. A no-op once it ended."""
        if not self._ended and data:
            await self._client.call("pty_input", data, target=self._rid)

    async def resize(self, rows: int, cols: int) -> None:
        """Change the terminal's size; the program gets SIGWINCH."""
        rows, cols = terminal_size(rows, cols)
        if not self._ended:
            await self._client.call("pty_resize", target=self._rid, rows=rows, cols=cols)

    def __aiter__(self) -> PtySession:
        return self

    async def __anext__(self) -> ExecEvent:
        """The next event: "out" with data, or finally "exit" with exit_code; Unavailable if the sandbox went."""
        if self._ended:
            raise StopAsyncIteration
        frame = await self._next_frame()
        while frame is not None and frame[0]["ev"] == "started":  # started() was not asked for it
            self.pid = int(frame[0]["pid"])
            frame = await self._next_frame()
        if frame is None:
            self._ended = True
            self._client._waiters.pop(self._rid, None)
            raise Unavailable(f"sandbox {self._client._label} is gone: {self._client._closed_reason}")
        head, data = frame
        if head["ev"] == "out":
            self._consumed += len(data)
            if self._consumed - self._acked >= PTY_WINDOW // 4:
                # The agent stops reading the terminal while PTY_WINDOW bytes are unacknowledged: output
                # waits in the program, not in memory here, when the consumer is slow.
                self._acked = self._consumed
                await self._client.call("pty_ack", target=self._rid, consumed=self._consumed)
            return ExecEvent("out", fd=1, data=data)
        self._ended = True
        self._client._waiters.pop(self._rid, None)
        if head["ev"] == "error":
            raise self._client._error(head)
        self.exit_code = head["code"]
        self.signal = head.get("signal")
        return ExecEvent("exit", exit_code=head["code"])

    async def kill(self) -> None:
        """Kill the program's whole process tree if it still runs; iterating then ends with its exit event."""
        if not self._ended:
            with contextlib.suppress(Unavailable):  # the sandbox is gone, and its processes with it
                await self._client.cancel(self._rid, "closed")

    async def close(self) -> None:
        """Kill the program's whole process tree if it still runs and wait (briefly) for its end; idempotent.
        Call it once no task iterates the session any more."""
        if self._ended:
            return
        try:
            await self.kill()
            async with asyncio.timeout(PTY_CLOSE_TIMEOUT_S):
                async for _ in self:
                    pass
        except (OrchardError, TimeoutError):
            pass  # the sandbox is gone or its agent failed: the session is over either way
        finally:
            self._client._waiters.pop(self._rid, None)


class AgentClient:
    """Multiplexes requests to one sandbox agent over its byte stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, label: str) -> None:
        self._reader = reader
        self._writer = writer
        self._label = label
        self._ids = itertools.count(1)
        self._waiters: dict[int, asyncio.Queue[tuple[dict[str, Any], bytes] | None]] = {}
        self._reader_task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._closed_reason: str | None = None

    async def start(self, timeout: float) -> None:
        """Wait for the agent's ready frame, then dispatch its replies in the background."""
        try:
            frame = await asyncio.wait_for(read_frame(self._reader), timeout)
        except (TimeoutError, asyncio.IncompleteReadError) as err:
            raise Unavailable(f"agent of {self._label} did not start within {timeout:.0f}s") from err
        if frame is None or frame[0].get("ev") != "ready":
            raise Unavailable(f"agent of {self._label} exited before it was ready")
        self._reader_task = asyncio.create_task(self._dispatch(), name=f"agent-reader-{self._label}")

    @property
    def alive(self) -> bool:
        return self._closed_reason is None and self._reader_task is not None and not self._reader_task.done()

    async def _dispatch(self) -> None:
        try:
            while (frame := await read_frame(self._reader)) is not None:
                queue = self._waiters.get(frame[0].get("id", -1))
                if queue is not None:
                    queue.put_nowait(frame)
        except (ConnectionError, asyncio.IncompleteReadError) as err:
            log.warning("agent stream of %s broke: %s", self._label, err)
        finally:
            self._closed_reason = self._closed_reason or "the sandbox's agent exited"
            for queue in self._waiters.values():
                queue.put_nowait(None)

    async def _send(self, header: dict[str, Any], body: bytes = b"") -> None:
        if self._closed_reason is not None:
            raise Unavailable(f"sandbox {self._label} is gone: {self._closed_reason}")
        async with self._write_lock:
            self._writer.write(encode(header, body))
            await self._writer.drain()

    async def call(self, op: str, body: bytes = b"", **fields: Any) -> tuple[dict[str, Any], bytes]:
        """Send one request and return its single reply; agent errors become OrchardErrors."""
        rid = next(self._ids)
        queue: asyncio.Queue[tuple[dict[str, Any], bytes] | None] = asyncio.Queue()
        self._waiters[rid] = queue
        try:
            await self._send({"id": rid, "op": op, **fields}, body)
            frame = await queue.get()
        finally:
            del self._waiters[rid]
        if frame is None:
            raise Unavailable(f"sandbox {self._label} is gone: {self._closed_reason}")
        header, data = frame
        if header["ev"] == "error":
            raise self._error(header)
        return header, data

    def _error(self, header: dict[str, Any]) -> OrchardError:
        if header.get("kind") == "os":
            cls = _ERRNO_ERRORS.get(header.get("errno", 0), FailedPrecondition)
            return cls(header["message"])
        return OrchardError(f"agent of {self._label} failed: {header['message']}")

    async def exec(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        stdin: bytes,
        timeout: float,
        max_output: int,
        on_id: Any = None,
    ) -> AsyncIterator[ExecEvent]:
        """Run a command; yields its events until (and including) exit.

        on_id(rid) is called with the agent-side id at once, so the caller can cancel it.
        """
        rid = next(self._ids)
        queue: asyncio.Queue[tuple[dict[str, Any], bytes] | None] = asyncio.Queue()
        self._waiters[rid] = queue
        if on_id is not None:
            on_id(rid)
        try:
            header = {
                "id": rid,
                "op": "exec",
                "argv": argv,
                "cwd": cwd,
                "env": env,
                "timeout": timeout,
                "max_output": max_output,
            }
            await self._send(header, stdin)
            while True:
                frame = await queue.get()
                if frame is None:
                    raise Unavailable(f"sandbox {self._label} is gone: {self._closed_reason}")
                head, data = frame
                ev = head["ev"]
                if ev == "out":
                    yield ExecEvent("out", fd=head["fd"], data=data)
                elif ev == "exit":
                    yield ExecEvent(
                        "exit",
                        exit_code=head["code"],
                        totals=tuple(head["totals"]),
                        reason=head.get("reason"),
                        error=head.get("error"),
                    )
                    return
                elif ev == "error":
                    raise self._error(head)
        finally:
            del self._waiters[rid]

    async def open_pty(self, argv: list[str], *, cwd: str, env: dict[str, str], rows: int, cols: int) -> PtySession:
        """Start argv on a new terminal of rows x cols; the session streams its output until it exits."""
        rid = next(self._ids)
        queue: asyncio.Queue[tuple[dict[str, Any], bytes] | None] = asyncio.Queue()
        self._waiters[rid] = queue
        try:
            await self._send({"id": rid, "op": "pty", "argv": argv, "cwd": cwd, "env": env, "rows": rows, "cols": cols})
        except BaseException:
            del self._waiters[rid]
            raise
        return PtySession(self, rid, queue)

    async def cancel(self, rid: int, reason: str) -> None:
        """Kill the process tree of the agent-side exec rid (no-op once it ended)."""
        await self.call("cancel", target=rid, reason=reason)

    async def close(self, reason: str) -> None:
        """Stop dispatching; pending and later calls fail with Unavailable naming reason."""
        self._closed_reason = self._closed_reason or reason
        self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            try:
                await self._reader_task
            except asyncio.CancelledError:
                pass
        for queue in self._waiters.values():
            queue.put_nowait(None)


async def connect_tcp(host: str, port: int, token: str, *, label: str, timeout: float) -> AgentClient:
    """A started client of an agent serving `--listen-tcp` at host:port, after proving the shared token.

    Retries refused connections until timeout (the agent may not have bound yet); a wrong token makes the
    agent close the connection unanswered: Unavailable.
    """
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
                    break
                except ConnectionRefusedError:
                    await asyncio.sleep(0.02)
    except (TimeoutError, OSError) as err:
        raise Unavailable(
            f"agent of {label} at {host}:{port} is not reachable within {timeout:.0f}s: {err or 'connection refused'}"
        ) from None
    writer.write(encode({"op": "hello", "token": token}))
    client = AgentClient(reader, writer, label=label)
    try:
        await client.start(timeout)
    except BaseException:
        writer.close()
        raise
    return client

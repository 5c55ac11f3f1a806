"""One sandbox (AsyncSandbox), a command running in it (AsyncExecHandle) and an interactive terminal in it
(AsyncPtySession), for the async client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

import grpc

from orchard import prototime
from orchard.env.v1 import env_pb2 as pb
from orchard.errors import DeadlineExceeded, FailedPrecondition, NotFound
from orchard.sdk.results import (
    ActResult,
    FileEntry,
    JobResult,
    PageContent,
    PatchError,
    PatchResult,
    SandboxInfo,
    Screenshot,
    SnapshotInfo,
    UploadResult,
    file_entry,
    job_result,
    sandbox_info,
    snapshot_info,
)
from orchard.sdk.transport import Transport

if TYPE_CHECKING:
    from orchard.sdk.aio import AsyncSandboxClient

log = logging.getLogger("orchard.sdk")

CHUNK = 1 << 20
"""Upload and download chunk size: 1 MiB."""
MAX_WAIT_S = 60.0
"""The longest one WaitExec blocks (the service caps it at its max_wait_s, 60 s by default)."""
EXEC_MARGIN_S = 60.0
"""How much longer than a command's timeout exec() waits before giving up on it (queueing, transport)."""
RPC_MARGIN_S = 10.0
"""Slack on a WaitExec deadline beyond the wait itself."""
PTY_STARTED_KEY = "orchard-pty-started"
"""Initial metadata the service sends once a terminal session's program runs."""

Command = str | Sequence[str]
ACTIONS = {
    "click": pb.ACTION_TYPE_CLICK,
    "double_click": pb.ACTION_TYPE_DOUBLE_CLICK,
    "type": pb.ACTION_TYPE_TYPE,
    "key_press": pb.ACTION_TYPE_KEY_PRESS,
    "scroll": pb.ACTION_TYPE_SCROLL,
    "navigate": pb.ACTION_TYPE_NAVIGATE,
    "back": pb.ACTION_TYPE_BACK,
    "wait": pb.ACTION_TYPE_WAIT,
}
"""The browser actions act() takes."""
DONE_STATES = frozenset(
    {pb.EXEC_STATE_SUCCEEDED, pb.EXEC_STATE_FAILED, pb.EXEC_STATE_TIMED_OUT, pb.EXEC_STATE_CANCELLED}
)


duration = prototime.duration
"""A protobuf Duration of seconds (kept here: the SDK's modules import it from this one)."""


async def complete_output(transport: Transport, ex: pb.Exec) -> JobResult:
    """The result of `ex` with all of its kept output: a stream that did not fit in one message
    (stdout_partial / stderr_partial) is read to its end with ReadExecOutput."""
    for name, stream in (("stdout", pb.OUTPUT_STREAM_STDOUT), ("stderr", pb.OUTPUT_STREAM_STDERR)):
        if not getattr(ex, f"{name}_partial"):
            continue
        parts = [getattr(ex, name)]
        offset = len(parts[0])
        while True:
            response = await transport.unary(
                "ReadExecOutput",
                pb.ReadExecOutputRequest(exec_id=ex.exec_id, stream=stream, offset=offset),
                idempotent=True,
            )
            parts.append(response.data)
            offset += len(response.data)
            if not response.data or offset >= response.kept_bytes:
                break
        whole = pb.Exec()
        whole.CopyFrom(ex)
        setattr(whole, name, b"".join(parts))
        setattr(whole, f"{name}_partial", False)
        ex = whole
    return job_result(ex)


class AsyncExecHandle:
    """A command started in a sandbox: wait for it, stream its output, describe or cancel it."""

    def __init__(self, transport: Transport, ex: pb.Exec) -> None:
        self._transport = transport
        self.job_id: str = ex.exec_id
        self.sandbox_id: str = ex.sandbox_id
        self.command: str = ex.command
        self.timeout: float = prototime.seconds_of(ex.timeout)
        """The command's timeout in seconds, as the service applies it."""
        self.last: pb.Exec = ex
        """The command as the service last reported it."""

    async def describe(self) -> JobResult:
        """The command's current state, with its output so far."""
        response = await self._transport.unary("GetExec", pb.GetExecRequest(exec_id=self.job_id), idempotent=True)
        return await complete_output(self._transport, response.exec)

    async def wait(self, timeout: float | None = None) -> JobResult:
        """Wait until the command ends and return its result.

        Raises DeadlineExceeded (a TimeoutError) if it has not ended after `timeout` seconds
        (None waits as long as it takes); the command keeps running then.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            wait_s = MAX_WAIT_S
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise DeadlineExceeded(
                        f"command {self.job_id} in sandbox {self.sandbox_id} did not end within "
                        f"{timeout:g}s; it may still be queued or running (cancel() stops it)"
                    )
                wait_s = min(wait_s, remaining)
            request = pb.WaitExecRequest(exec_id=self.job_id, timeout=duration(wait_s))
            response = await self._transport.unary("WaitExec", request, idempotent=True, timeout=wait_s + RPC_MARGIN_S)
            if response.done:
                return await complete_output(self._transport, response.exec)

    async def cancel(self) -> JobResult:
        """Kill the command (and its whole process tree) if it is queued or running; returns its final state."""
        response = await self._transport.unary("CancelExec", pb.CancelExecRequest(exec_id=self.job_id), idempotent=True)
        return await complete_output(self._transport, response.exec)

    async def stream(self) -> AsyncGenerator[tuple[str, bytes], None]:
        """Yield ("stdout" | "stderr", chunk) from the first byte on, as the command writes; ends when it ends."""
        request = pb.StreamExecRequest(exec_id=self.job_id)
        async for event in self._transport.server_stream("StreamExec", request, timeout=self.timeout + EXEC_MARGIN_S):
            kind = event.WhichOneof("event")
            if kind in ("stdout", "stderr"):
                yield kind, getattr(event, kind)

    def __repr__(self) -> str:
        return f"AsyncExecHandle(job_id={self.job_id!r}, sandbox_id={self.sandbox_id!r})"


class AsyncPtySession:
    """An interactive terminal in a sandbox: `async for chunk in session` yields its output bytes until the
    program ends (exit_code is set then); send() types into it and resize() changes its size."""

    def __init__(self, transport: Transport, call: grpc.aio.StreamStreamCall, sandbox_id: str, timeout: float) -> None:
        self._transport = transport
        self._call = call
        self._timeout = timeout
        self.sandbox_id = sandbox_id
        self.exit_code: int | None = None
        """The program's exit code once its output ended (128 + n when killed by signal n)."""

    async def send(self, data: bytes | str) -> None:
        """Type into the terminal (str is UTF-8 encoded), e.g. "ls\\n"."""
        await self._write(pb.OpenPtyRequest(input=data.encode() if isinstance(data, str) else data))

    async def resize(self, rows: int, cols: int) -> None:
        """Change the terminal's size (1..1000 each); the program gets SIGWINCH."""
        await self._write(pb.OpenPtyRequest(resize=pb.PtyResize(rows=rows, cols=cols)))

    async def _write(self, request: pb.OpenPtyRequest) -> None:
        try:
            await self._call.write(request)
        except asyncio.InvalidStateError:  # the call is over: say how it ended
            await self._read()
            raise FailedPrecondition(
                f"the terminal session in sandbox {self.sandbox_id} has ended (exit code "
                f"{self.exit_code}); open a new one"
            ) from None
        except grpc.aio.AioRpcError as err:
            raise self._transport.error(err, "OpenPty", self._timeout) from None

    async def _read(self) -> pb.OpenPtyResponse | None:
        """The next message, None at the end; the call's error as an orchard error."""
        try:
            message = await self._call.read()
        except grpc.aio.AioRpcError as err:
            raise self._transport.error(err, "OpenPty", self._timeout) from None
        return None if message is grpc.aio.EOF else message

    async def _output(self) -> AsyncIterator[bytes]:
        while self.exit_code is None and (message := await self._read()) is not None:
            if message.WhichOneof("part") == "output":
                yield message.output
            else:
                self.exit_code = message.exit_code

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._output()

    def __repr__(self) -> str:
        return f"AsyncPtySession(sandbox_id={self.sandbox_id!r}, exit_code={self.exit_code!r})"


class AsyncSandbox:
    """A live sandbox. `async with` deletes it on exit."""

    def __init__(self, client: AsyncSandboxClient, info: SandboxInfo) -> None:
        self._client = client
        self._transport: Transport = client._transport
        self.info = info
        """The sandbox as last reported (refreshed by refresh() and heartbeat())."""

    @property
    def sandbox_id(self) -> str:
        return self.info.sandbox_id

    @property
    def image(self) -> str:
        return self.info.image

    async def refresh(self) -> SandboxInfo:
        """Fetch the sandbox's current state."""
        request = pb.GetSandboxRequest(sandbox_id=self.sandbox_id)
        self.info = sandbox_info((await self._transport.unary("GetSandbox", request, idempotent=True)).sandbox)
        return self.info

    async def heartbeat(self) -> SandboxInfo:
        """Extend the sandbox's liveness lease now."""
        request = pb.HeartbeatRequest(sandbox_id=self.sandbox_id)
        self.info = sandbox_info((await self._transport.unary("Heartbeat", request, idempotent=True)).sandbox)
        return self.info

    async def start(
        self,
        command: Command,
        timeout: float | None = 300,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        login_shell: bool = False,
        stdin: bytes | str | None = None,
        *,
        max_output: int | None = None,
    ) -> AsyncExecHandle:
        """Queue a command and return its handle at once.

        A string runs as `bash -c <command>`; a list is an argv, run with no shell (as subprocess runs it;
        one that cannot start gets bash's answer, e.g. "command not found" and exit code 127). Commands
        of one sandbox run one at a time, in the order they were started. The whole process tree
        is killed after `timeout` seconds (None: the service default). `max_output` caps the bytes kept of
        each of stdout and stderr (None: the service default, 16 MiB).
        """
        return await self._start(command, timeout, cwd, env, login_shell, stdin, wait_s=0.0, max_output=max_output)

    async def _start(
        self,
        command: Command,
        timeout: float | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        login_shell: bool,
        stdin: bytes | str | None,
        *,
        wait_s: float,
        max_output: int | None = None,
    ) -> AsyncExecHandle:
        request = pb.StartExecRequest(
            sandbox_id=self.sandbox_id,
            cwd=cwd or "",
            env=dict(env or {}),
            timeout=duration(timeout or 0),
            login_shell=login_shell,
            stdin=stdin.encode() if isinstance(stdin, str) else stdin or b"",
            max_output_bytes=max_output or 0,
        )
        if isinstance(command, str):
            request.shell = command
        else:
            request.argv.args.extend(command)
        if wait_s > 0:
            request.wait.CopyFrom(duration(wait_s))
        response = await self._transport.unary(
            "StartExec", request, idempotent=False, timeout=wait_s + RPC_MARGIN_S if wait_s > 0 else None
        )
        return AsyncExecHandle(self._transport, response.exec)

    exec_async = start

    async def exec(
        self,
        command: Command,
        timeout: float | None = 300,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        login_shell: bool = False,
        stdin: bytes | str | None = None,
        *,
        max_output: int | None = None,
    ) -> JobResult:
        """Run a command to its end and return its result; a failing command is a result, not an error.
        `max_output` caps the bytes kept of each of stdout and stderr (None: the service default, 16 MiB).

        Raises DeadlineExceeded if it has not ended `timeout` + 60 s after it was queued (it is
        cancelled then). Cancelling the caller cancels the command too.
        """
        # Start and wait in one call: a short command's result comes back without a WaitExec round trip.
        handle = await self._start(
            command, timeout, cwd, env, login_shell, stdin, wait_s=MAX_WAIT_S, max_output=max_output
        )
        if handle.last.state in DONE_STATES:
            return await complete_output(self._transport, handle.last)
        try:
            return await handle.wait(handle.timeout + EXEC_MARGIN_S)
        except (DeadlineExceeded, asyncio.CancelledError):
            # Give up on the command for real: no orphan keeps running after the caller stopped waiting.
            try:
                await asyncio.shield(handle.cancel())
            except Exception as err:  # the original error matters more
                log.warning("could not cancel command %s after giving up on it: %s", handle.job_id, err)
            raise

    async def get_job(self, job_id: str) -> JobResult:
        """The state (and output so far) of a command of this service, by id."""
        response = await self._transport.unary("GetExec", pb.GetExecRequest(exec_id=job_id), idempotent=True)
        return await complete_output(self._transport, response.exec)

    async def attach(self, job_id: str) -> AsyncExecHandle:
        """A handle on a command of this sandbox by id, e.g. one started by another process; its stream()
        starts from the command's first byte."""
        response = await self._transport.unary("GetExec", pb.GetExecRequest(exec_id=job_id), idempotent=True)
        if response.exec.sandbox_id != self.sandbox_id:
            raise NotFound(
                f"command {job_id!r} belongs to sandbox {response.exec.sandbox_id!r}, not to "
                f"{self.sandbox_id!r}; attach through that sandbox"
            )
        return AsyncExecHandle(self._transport, response.exec)

    @contextlib.asynccontextmanager
    async def pty(
        self,
        argv: Sequence[str] | None = None,
        rows: int = 24,
        cols: int = 80,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 3600,
    ) -> AsyncIterator[AsyncPtySession]:
        """An interactive terminal running argv (an interactive bash by default) until the program exits or
        the block is left, which kills its whole process tree. It ends with DeadlineExceeded after `timeout` s.

            async with sandbox.pty() as term:
                await term.send("echo hi; exit\\n")
                output = b"".join([chunk async for chunk in term])
        """
        call = await self._transport.bidi_stream("OpenPty", timeout=timeout)
        session = AsyncPtySession(self._transport, call, self.sandbox_id, timeout)
        try:
            start = pb.PtyStart(
                sandbox_id=self.sandbox_id,
                argv=list(argv or ()),
                rows=rows,
                cols=cols,
                cwd=cwd or "",
                env=dict(env or {}),
            )
            await session._write(pb.OpenPtyRequest(start=start))
            try:
                started = await call.initial_metadata()
            except grpc.aio.AioRpcError as err:
                raise self._transport.error(err, "OpenPty", timeout) from None
            if PTY_STARTED_KEY not in started:
                await session._read()  # raises the error that stopped the session from starting
            yield session
        finally:
            call.cancel()

    async def apply_patch(self, patch: str, timeout: float = 30, cwd: str | None = None) -> PatchResult:
        """Apply a unified (git) diff, all or nothing; raises PatchError when it does not apply."""
        request = pb.ApplyPatchRequest(
            sandbox_id=self.sandbox_id, patch=patch, cwd=cwd or "", timeout=duration(timeout)
        )
        try:
            # The patch waits behind the sandbox's earlier commands, hence the client timeout on top.
            response = await self._transport.unary(
                "ApplyPatch", request, idempotent=False, timeout=timeout + self._transport.timeout
            )
        except FailedPrecondition as err:
            if err.field != "patch":
                raise
            raise PatchError(err.message, field=err.field, reason=err.reason) from None
        return PatchResult(files=list(response.files), output=response.output)

    async def upload_content(self, content: bytes | str, remote_path: str, mode: int | None = None) -> UploadResult:
        """Write bytes (or UTF-8 text) to remote_path; parent folders are created."""
        data = content.encode() if isinstance(content, str) else content

        async def chunks() -> AsyncIterator[bytes]:
            for offset in range(0, len(data), CHUNK):
                yield data[offset : offset + CHUNK]

        return await self._upload(remote_path, mode, chunks())

    async def upload_file(
        self, local_path: str | os.PathLike[str], remote_path: str, mode: int | None = None
    ) -> UploadResult:
        """Stream a local file of any size to remote_path, 1 MiB at a time."""
        file = await asyncio.to_thread(open, local_path, "rb")  # fails here, before the call, if unreadable

        async def chunks() -> AsyncIterator[bytes]:
            while chunk := await asyncio.to_thread(file.read, CHUNK):
                yield chunk

        try:
            return await self._upload(remote_path, mode, chunks())
        finally:
            file.close()

    async def _upload(self, remote_path: str, mode: int | None, chunks: AsyncIterator[bytes]) -> UploadResult:
        header = pb.FileHeader(sandbox_id=self.sandbox_id, path=remote_path, mode=mode or 0)

        async def requests() -> AsyncIterator[pb.UploadFileRequest]:
            yield pb.UploadFileRequest(header=header)
            async for chunk in chunks:
                yield pb.UploadFileRequest(chunk=chunk)

        response = await self._transport.client_stream("UploadFile", requests())
        return UploadResult(path=response.path, size=response.size_bytes)

    async def _download(self, remote_path: str) -> AsyncIterator[bytes]:
        request = pb.DownloadFileRequest(sandbox_id=self.sandbox_id, path=remote_path)
        async for message in self._transport.server_stream("DownloadFile", request):
            if message.WhichOneof("part") == "chunk":
                yield message.chunk

    async def download_content(self, remote_path: str) -> bytes:
        """The content of a file in the sandbox."""
        return b"".join([chunk async for chunk in self._download(remote_path)])

    async def download_file(self, remote_path: str, local_path: str | os.PathLike[str]) -> int:
        """Stream a sandbox file of any size to local_path (whole or not at all); returns its size."""
        target = Path(local_path)
        partial = target.with_name(target.name + ".part")
        size = 0
        file = await asyncio.to_thread(open, partial, "wb")
        try:
            async for chunk in self._download(remote_path):
                await asyncio.to_thread(file.write, chunk)
                size += len(chunk)
            file.close()
            await asyncio.to_thread(os.replace, partial, target)
        except BaseException:
            file.close()
            partial.unlink(missing_ok=True)
            raise
        return size

    async def list_files(self, path: str = "") -> list[FileEntry]:
        """The entries of a directory (the sandbox's workdir by default), ordered by name."""
        request = pb.ListFilesRequest(sandbox_id=self.sandbox_id, path=path)
        response = await self._transport.unary("ListFiles", request, idempotent=True)
        return [file_entry(info) for info in response.files]

    async def snapshot(
        self, labels: Mapping[str, str] | None = None, snapshot_id: str | None = None, *, keep: bool = False
    ) -> SnapshotInfo:
        """Freeze the sandbox's files into a snapshot, taken after the commands started before this call and
        before those started after it; `client.create_sandbox(from_snapshot=snap.snapshot_id)` starts copies of
        it, cheaply and as many as you like. Processes still running in the background are not paused. A kept
        snapshot outlives this client (no auto-cleanup) and restarts of the service, until it is deleted."""
        request = pb.SnapshotSandboxRequest(
            sandbox_id=self.sandbox_id,
            snapshot_id=snapshot_id or "",
            labels=dict(labels or {}),
            request_id=uuid.uuid4().hex,
            keep=keep,
        )
        response = await self._transport.unary("SnapshotSandbox", request, idempotent=True)
        if not keep:
            self._client._snapshots.add(response.snapshot.snapshot_id)
        return snapshot_info(response.snapshot)

    async def screenshot(self, full_page: bool = False) -> Screenshot:
        """A PNG of a browser sandbox's page: the viewport, or the whole page with full_page."""
        request = pb.ScreenshotRequest(sandbox_id=self.sandbox_id, full_page=full_page)
        response = await self._transport.unary("Screenshot", request, idempotent=True)
        return Screenshot(
            png=response.png, width=response.width, height=response.height, url=response.url, title=response.title
        )

    async def act(
        self,
        action: str,
        *,
        selector: str = "",
        x: float | None = None,
        y: float | None = None,
        text: str = "",
        key: str = "",
        delta_x: float = 0.0,
        delta_y: float = 0.0,
        url: str = "",
        timeout: float | None = None,
        screenshot: bool = False,
    ) -> ActResult:
        """Do one thing in a browser sandbox's page, in order with its other actions.

        Args:
            action: "click" / "double_click" (on selector, or at x, y in CSS pixels), "type" (text, into selector
                or the focused element), "key_press" (key, e.g. "Enter" or "Control+A"), "scroll" (by delta_x,
                delta_y pixels, with the mouse at x, y when given), "navigate" (url: http, https, about or data),
                "back", or "wait" (for selector to be visible, else for timeout seconds).
            selector: a CSS or Playwright selector ("#go", "text=Sign in", "role=button[name='OK']").
            timeout: seconds the action may take; the service default (10 s) when None.
            screenshot: also return a PNG taken after the action.

        Raises ValueError for an unknown action; DeadlineExceeded when nothing matched selector in time;
        FailedPrecondition when the sandbox's network policy does not admit the url (reason EGRESS_DENIED),
        the page could not load, or the sandbox failed (its browser crashed).
        """
        kind = ACTIONS.get(action)
        if kind is None:
            raise ValueError(f"action {action!r} is not one of {', '.join(ACTIONS)}")
        request = pb.ActRequest(
            sandbox_id=self.sandbox_id,
            action=kind,
            x=x or 0.0,
            y=y or 0.0,
            selector=selector,
            text=text,
            key=key,
            delta_x=delta_x,
            delta_y=delta_y,
            url=url,
            timeout=duration(timeout or 0),
            screenshot=screenshot,
        )
        # Actions change the page: never retried. The deadline leaves room for the action's own timeout.
        response = await self._transport.unary(
            "Act", request, idempotent=False, timeout=timeout + RPC_MARGIN_S if timeout else None
        )
        return ActResult(url=response.url, title=response.title, png=response.png)

    async def page_content(self) -> PageContent:
        """A browser sandbox's page as text: its accessibility tree and its visible text."""
        request = pb.GetPageContentRequest(sandbox_id=self.sandbox_id)
        response = await self._transport.unary("GetPageContent", request, idempotent=True)
        return PageContent(
            url=response.url, title=response.title, accessibility_tree=response.accessibility_tree, text=response.text
        )

    async def delete(self) -> None:
        """Delete the sandbox: its processes are killed and its files removed. Deleting twice is fine."""
        await self._client.delete_sandbox(self.sandbox_id)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.delete()

    def __repr__(self) -> str:
        return f"AsyncSandbox(sandbox_id={self.sandbox_id!r}, image={self.image!r}, state={self.info.state!r})"

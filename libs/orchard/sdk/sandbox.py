"""One sandbox (AsyncSandbox) and one command running in it (AsyncExecHandle), for the async client."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from google.protobuf.duration_pb2 import Duration

from orchard.env.v1 import env_pb2 as pb
from orchard.errors import DeadlineExceeded, FailedPrecondition
from orchard.sdk.results import (
    FileEntry,
    JobResult,
    PatchError,
    PatchResult,
    SandboxInfo,
    UploadResult,
    file_entry,
    job_result,
    sandbox_info,
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

Command = str | Sequence[str]
DONE_STATES = frozenset({pb.EXEC_STATE_SUCCEEDED, pb.EXEC_STATE_FAILED, pb.EXEC_STATE_TIMED_OUT,
                         pb.EXEC_STATE_CANCELLED})


def duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


class AsyncExecHandle:
    """A command started in a sandbox: wait for it, stream its output, describe or cancel it."""

    def __init__(self, transport: Transport, ex: pb.Exec) -> None:
        self._transport = transport
        self.job_id: str = ex.exec_id
        self.sandbox_id: str = ex.sandbox_id
        self.command: str = ex.command
        self.timeout: float = ex.timeout.ToNanoseconds() / 1e9
        """The command's timeout in seconds, as the service applies it."""
        self.last: pb.Exec = ex
        """The command as the service last reported it."""

    async def describe(self) -> JobResult:
        """The command's current state, with its output so far."""
        response = await self._transport.unary("GetExec", pb.GetExecRequest(exec_id=self.job_id), idempotent=True)
        return job_result(response.exec)

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
                    raise DeadlineExceeded(f"command {self.job_id} in sandbox {self.sandbox_id} did not end within "
                                           f"{timeout:g}s; it may still be queued or running (cancel() stops it)")
                wait_s = min(wait_s, remaining)
            request = pb.WaitExecRequest(exec_id=self.job_id, timeout=duration(wait_s))
            response = await self._transport.unary("WaitExec", request, idempotent=True,
                                                   timeout=wait_s + RPC_MARGIN_S)
            if response.done:
                return job_result(response.exec)

    async def cancel(self) -> JobResult:
        """Kill the command (and its whole process tree) if it is queued or running; returns its final state."""
        response = await self._transport.unary("CancelExec", pb.CancelExecRequest(exec_id=self.job_id),
                                               idempotent=True)
        return job_result(response.exec)

    async def stream(self) -> AsyncIterator[tuple[str, bytes]]:
        """Yield ("stdout" | "stderr", chunk) from the first byte on, as the command writes; ends when it ends."""
        request = pb.StreamExecRequest(exec_id=self.job_id)
        async for event in self._transport.server_stream("StreamExec", request,
                                                         timeout=self.timeout + EXEC_MARGIN_S):
            kind = event.WhichOneof("event")
            if kind in ("stdout", "stderr"):
                yield kind, getattr(event, kind)

    def __repr__(self) -> str:
        return f"AsyncExecHandle(job_id={self.job_id!r}, sandbox_id={self.sandbox_id!r})"


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

    async def start(self, command: Command, timeout: float | None = 300, cwd: str | None = None,
                    env: Mapping[str, str] | None = None, login_shell: bool = False,
                    stdin: bytes | str | None = None) -> AsyncExecHandle:
        """Queue a command and return its handle at once.

        A string runs as `bash -c <command>`; a list is argv, quoted by the service. Commands
        of one sandbox run one at a time, in the order they were started. The whole process tree
        is killed after `timeout` seconds (None: the service default).
        """
        return await self._start(command, timeout, cwd, env, login_shell, stdin, wait_s=0.0)

    async def _start(self, command: Command, timeout: float | None, cwd: str | None,
                     env: Mapping[str, str] | None, login_shell: bool, stdin: bytes | str | None,
                     *, wait_s: float) -> AsyncExecHandle:
        request = pb.StartExecRequest(
            sandbox_id=self.sandbox_id, cwd=cwd or "", env=dict(env or {}), timeout=duration(timeout or 0),
            login_shell=login_shell, stdin=stdin.encode() if isinstance(stdin, str) else stdin or b"",
        )
        if isinstance(command, str):
            request.shell = command
        else:
            request.argv.args.extend(command)
        if wait_s > 0:
            request.wait.CopyFrom(duration(wait_s))
        response = await self._transport.unary("StartExec", request, idempotent=False,
                                               timeout=wait_s + RPC_MARGIN_S if wait_s > 0 else None)
        return AsyncExecHandle(self._transport, response.exec)

    exec_async = start

    async def exec(self, command: Command, timeout: float | None = 300, cwd: str | None = None,
                   env: Mapping[str, str] | None = None, login_shell: bool = False,
                   stdin: bytes | str | None = None) -> JobResult:
        """Run a command to its end and return its result; a failing command is a result, not an error.

        Raises DeadlineExceeded if it has not ended `timeout` + 60 s after it was queued (it is
        cancelled then). Cancelling the caller cancels the command too.
        """
        # Start and wait in one call: a short command's result comes back without a WaitExec round trip.
        handle = await self._start(command, timeout, cwd, env, login_shell, stdin, wait_s=MAX_WAIT_S)
        if handle.last.state in DONE_STATES:
            return job_result(handle.last)
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
        return job_result(response.exec)

    async def apply_patch(self, patch: str, timeout: float = 30, cwd: str | None = None) -> PatchResult:
        """Apply a unified (git) diff, all or nothing; raises PatchError when it does not apply."""
        request = pb.ApplyPatchRequest(sandbox_id=self.sandbox_id, patch=patch, cwd=cwd or "",
                                       timeout=duration(timeout))
        try:
            # The patch waits behind the sandbox's earlier commands, hence the client timeout on top.
            response = await self._transport.unary("ApplyPatch", request, idempotent=False,
                                                   timeout=timeout + self._transport.timeout)
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
                yield data[offset:offset + CHUNK]

        return await self._upload(remote_path, mode, chunks())

    async def upload_file(self, local_path: str | os.PathLike[str], remote_path: str,
                          mode: int | None = None) -> UploadResult:
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

    async def delete(self) -> None:
        """Delete the sandbox: its processes are killed and its files removed. Deleting twice is fine."""
        await self._client.delete_sandbox(self.sandbox_id)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.delete()

    def __repr__(self) -> str:
        return f"AsyncSandbox(sandbox_id={self.sandbox_id!r}, image={self.image!r}, state={self.info.state!r})"


"""The blocking SDK: SandboxClient, Sandbox and ExecHandle wrap their async twins, which run on a private
event loop in a background thread (so they also work where a loop already runs, e.g. Jupyter)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from orchard.sdk.aio import AsyncSandboxClient
from orchard.sdk.config import ClientConfig
from orchard.sdk.results import (
    ActResult,
    FileEntry,
    JobResult,
    PageContent,
    PatchResult,
    SandboxInfo,
    Screenshot,
    SnapshotInfo,
    UploadResult,
)
from orchard.sdk.sandbox import AsyncExecHandle, AsyncPtySession, AsyncSandbox, Command

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread; `run` executes a coroutine on it and blocks."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="orchard-sdk-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking SDK call was made from the SDK's own event loop; use AsyncSandboxClient")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()  # cancels the task on the loop, which cancels the remote work (e.g. the command)
            raise

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """Bridge an async iterator living on the loop to a blocking one."""
        done = object()

        async def step() -> Any:
            return await anext(agen, done)

        try:
            while (item := self.run(step())) is not done:
                yield item
        finally:
            close = getattr(agen, "aclose", None)  # async generators: run their cleanup (cancel the stream)
            if close is not None and self._thread.is_alive():
                self.run(close())


_shared: _LoopThread | None = None
_shared_lock = threading.Lock()


def _loop_thread() -> _LoopThread:
    """The one SDK loop of this process: grpc.aio binds its poller to the first loop that uses it, so every
    sync client shares one loop instead of each starting its own."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared._thread.is_alive():
            _shared = _LoopThread()
        return _shared


class ExecHandle:
    """A command started in a sandbox: wait(), stream(), describe(), cancel()."""

    def __init__(self, handle: AsyncExecHandle, runner: _LoopThread) -> None:
        self._handle = handle
        self._run = runner
        self.job_id = handle.job_id
        self.sandbox_id = handle.sandbox_id
        self.command = handle.command

    def describe(self) -> JobResult:
        """The command's current state, with its output so far."""
        return self._run.run(self._handle.describe())

    def wait(self, timeout: float | None = None) -> JobResult:
        """Wait until it ends; raises DeadlineExceeded (a TimeoutError) after `timeout` seconds."""
        return self._run.run(self._handle.wait(timeout))

    def cancel(self) -> JobResult:
        """Kill it (and its process tree) if still queued or running; returns its final state."""
        return self._run.run(self._handle.cancel())

    def stream(self) -> Iterator[tuple[str, bytes]]:
        """Yield ("stdout" | "stderr", chunk) as the command writes; ends when it ends."""
        return self._run.iterate(self._handle.stream())

    def __repr__(self) -> str:
        return f"ExecHandle(job_id={self.job_id!r}, sandbox_id={self.sandbox_id!r})"


class PtySession:
    """An interactive terminal in a sandbox: iterate it for output bytes until the program ends (exit_code is
    set then); send() types into it and resize() changes its size."""

    def __init__(self, session: AsyncPtySession, runner: _LoopThread) -> None:
        self._session = session
        self._run = runner
        self.sandbox_id = session.sandbox_id

    @property
    def exit_code(self) -> int | None:
        """The program's exit code once its output ended."""
        return self._session.exit_code

    def send(self, data: bytes | str) -> None:
        """Type into the terminal (str is UTF-8 encoded)."""
        self._run.run(self._session.send(data))

    def resize(self, rows: int, cols: int) -> None:
        """Change the terminal's size (1..1000 each)."""
        self._run.run(self._session.resize(rows, cols))

    def __iter__(self) -> Iterator[bytes]:
        return self._run.iterate(aiter(self._session))

    def __repr__(self) -> str:
        return f"PtySession(sandbox_id={self.sandbox_id!r}, exit_code={self.exit_code!r})"


class Sandbox:
    """A live sandbox. `with` deletes it on exit."""

    def __init__(self, sandbox: AsyncSandbox, runner: _LoopThread) -> None:
        self._sandbox = sandbox
        self._run = runner

    @property
    def sandbox_id(self) -> str:
        return self._sandbox.sandbox_id

    @property
    def image(self) -> str:
        return self._sandbox.image

    @property
    def info(self) -> SandboxInfo:
        """The sandbox as last reported (refreshed by refresh() and heartbeat())."""
        return self._sandbox.info

    def refresh(self) -> SandboxInfo:
        return self._run.run(self._sandbox.refresh())

    def heartbeat(self) -> SandboxInfo:
        """Extend the sandbox's liveness lease now."""
        return self._run.run(self._sandbox.heartbeat())

    def exec(
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
        """Run a command to its end (string: `bash -c`; list: an argv, run with no shell)."""
        return self._run.run(self._sandbox.exec(command, timeout, cwd, env, login_shell, stdin, max_output=max_output))

    def start(
        self,
        command: Command,
        timeout: float | None = 300,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        login_shell: bool = False,
        stdin: bytes | str | None = None,
        *,
        max_output: int | None = None,
    ) -> ExecHandle:
        """Queue a command and return its handle at once."""
        return ExecHandle(
            self._run.run(self._sandbox.start(command, timeout, cwd, env, login_shell, stdin, max_output=max_output)),
            self._run,
        )

    exec_async = start

    def get_job(self, job_id: str) -> JobResult:
        return self._run.run(self._sandbox.get_job(job_id))

    def attach(self, job_id: str) -> ExecHandle:
        """A handle on a command of this sandbox by id; its stream() starts from the command's first byte."""
        return ExecHandle(self._run.run(self._sandbox.attach(job_id)), self._run)

    @contextlib.contextmanager
    def pty(
        self,
        argv: Sequence[str] | None = None,
        rows: int = 24,
        cols: int = 80,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 3600,
    ) -> Iterator[PtySession]:
        """An interactive terminal running argv (an interactive bash by default); leaving the block kills it."""
        context = self._sandbox.pty(argv, rows, cols, cwd, env, timeout)
        session = self._run.run(context.__aenter__())
        try:
            yield PtySession(session, self._run)
        finally:
            self._run.run(context.__aexit__(None, None, None))

    def apply_patch(self, patch: str, timeout: float = 30, cwd: str | None = None) -> PatchResult:
        """Apply a unified (git) diff, all or nothing; raises PatchError when it does not apply."""
        return self._run.run(self._sandbox.apply_patch(patch, timeout, cwd))

    def upload_file(
        self, local_path: str | os.PathLike[str], remote_path: str, mode: int | None = None
    ) -> UploadResult:
        return self._run.run(self._sandbox.upload_file(local_path, remote_path, mode))

    def upload_content(self, content: bytes | str, remote_path: str, mode: int | None = None) -> UploadResult:
        return self._run.run(self._sandbox.upload_content(content, remote_path, mode))

    def download_file(self, remote_path: str, local_path: str | os.PathLike[str]) -> int:
        return self._run.run(self._sandbox.download_file(remote_path, local_path))

    def download_content(self, remote_path: str) -> bytes:
        return self._run.run(self._sandbox.download_content(remote_path))

    def list_files(self, path: str = "") -> list[FileEntry]:
        return self._run.run(self._sandbox.list_files(path))

    def snapshot(
        self, labels: Mapping[str, str] | None = None, snapshot_id: str | None = None, *, keep: bool = False
    ) -> SnapshotInfo:
        """Freeze the sandbox's files into a snapshot (between its commands); see AsyncSandbox.snapshot."""
        return self._run.run(self._sandbox.snapshot(labels, snapshot_id, keep=keep))

    def screenshot(self, full_page: bool = False) -> Screenshot:
        """A PNG of a browser sandbox's page; see AsyncSandbox.screenshot."""
        return self._run.run(self._sandbox.screenshot(full_page))

    def act(
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
        """Do one thing in a browser sandbox's page; see AsyncSandbox.act."""
        return self._run.run(
            self._sandbox.act(
                action,
                selector=selector,
                x=x,
                y=y,
                text=text,
                key=key,
                delta_x=delta_x,
                delta_y=delta_y,
                url=url,
                timeout=timeout,
                screenshot=screenshot,
            )
        )

    def page_content(self) -> PageContent:
        """A browser sandbox's accessibility tree and visible text; see AsyncSandbox.page_content."""
        return self._run.run(self._sandbox.page_content())

    def delete(self) -> None:
        """Delete the sandbox; deleting twice is fine."""
        self._run.run(self._sandbox.delete())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.delete()

    def __repr__(self) -> str:
        return f"Sandbox(sandbox_id={self.sandbox_id!r}, image={self.image!r}, state={self.info.state!r})"


class SandboxClient:
    """Blocking client of the Orchard env service; same arguments as AsyncSandboxClient.

    With auto_cleanup, the sandboxes it created are deleted when it closes, and at process exit
    if it was never closed.
    """

    def __init__(
        self,
        target: str | None = None,
        timeout: float = 300.0,
        auto_cleanup: bool = True,
        api_key: str | None = None,
        prefix: str | None = None,
        *,
        connect_timeout: float = 3.0,
    ) -> None:
        self._run = _loop_thread()
        self._client = AsyncSandboxClient(
            target, timeout, auto_cleanup, api_key, prefix, connect_timeout=connect_timeout
        )
        self._closed = False
        if auto_cleanup:
            atexit.register(self.close)

    @classmethod
    def connect(
        cls,
        target: str | None = None,
        timeout: float = 300.0,
        auto_cleanup: bool = True,
        api_key: str | None = None,
        prefix: str | None = None,
        *,
        connect_timeout: float = 3.0,
    ) -> SandboxClient:
        """A client whose connection is already up; raises Unavailable (a ConnectionError) fast if it cannot be."""
        client = cls(target, timeout, auto_cleanup, api_key, prefix, connect_timeout=connect_timeout)
        try:
            client._run.run(client._client._transport.connect())
        except BaseException:
            client.close()
            raise
        return client

    @property
    def config(self) -> ClientConfig:
        return self._client.config

    @property
    def target(self) -> str:
        return self._client.target

    def create_sandbox(
        self,
        image: str = "",
        block_network: bool = True,
        sandbox_id: str | None = None,
        cpu: str | float | None = None,
        memory: str | int | None = None,
        timeout: float | None = 3600,
        wait_ready: bool = True,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        from_snapshot: str | None = None,
        isolation: str | None = None,
    ) -> Sandbox:
        """Create a sandbox (from an image or a snapshot) and return it ready; see AsyncSandboxClient.create_sandbox."""
        sandbox = self._run.run(
            self._client.create_sandbox(
                image,
                block_network,
                sandbox_id,
                cpu,
                memory,
                timeout,
                wait_ready,
                env,
                labels,
                from_snapshot,
                isolation,
            )
        )
        return Sandbox(sandbox, self._run)

    def create_browser(
        self,
        allow: Sequence[str] = (),
        *,
        sandbox_id: str | None = None,
        timeout: float | None = 3600,
        labels: Mapping[str, str] | None = None,
    ) -> Sandbox:
        """Create a browser sandbox and return it ready; see AsyncSandboxClient.create_browser."""
        return Sandbox(
            self._run.run(self._client.create_browser(allow, sandbox_id=sandbox_id, timeout=timeout, labels=labels)),
            self._run,
        )

    def get_sandbox(self, sandbox_id: str) -> Sandbox:
        """An existing sandbox; raises NotFound."""
        return Sandbox(self._run.run(self._client.get_sandbox(sandbox_id)), self._run)

    def delete_sandbox(self, sandbox_id: str) -> bool:
        """Delete a sandbox; returns False if it was already gone."""
        return self._run.run(self._client.delete_sandbox(sandbox_id))

    def list_sandboxes(self, labels: Mapping[str, str] | None = None, page_size: int = 100) -> Iterator[Sandbox]:
        """Every sandbox carrying all of `labels`, ordered by id, fetched a page at a time."""
        pager = self._client.list_sandboxes(labels, page_size)
        return (Sandbox(sandbox, self._run) for sandbox in self._run.iterate(aiter(pager)))

    def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        """A snapshot; raises NotFound."""
        return self._run.run(self._client.get_snapshot(snapshot_id))

    def list_snapshots(self, labels: Mapping[str, str] | None = None) -> list[SnapshotInfo]:
        """Every snapshot carrying all of `labels`, ordered by id."""
        return self._run.run(self._client.list_snapshots(labels))

    def delete_snapshot(self, snapshot_id: str) -> bool:
        """Delete a snapshot; returns False if it was already gone. Sandboxes made from it keep running."""
        return self._run.run(self._client.delete_snapshot(snapshot_id))

    def cleanup_all(self) -> list[str]:
        """Delete every sandbox this client created and has not deleted yet; returns the ids deleted now."""
        return self._run.run(self._client.cleanup_all())

    def close(self) -> None:
        """Delete the sandboxes it created (with auto_cleanup) and close the connection."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._run.run(self._client.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SandboxClient(target={self.target!r})"

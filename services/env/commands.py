"""Commands in sandboxes: execs (queued per sandbox, bounded globally, recorded with their output), interactive
terminals and patches. The manager owns the sandboxes; this owns what runs in them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

from orchard.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OrchardError,
    ResourceExhausted,
    Unavailable,
)
from orchard.runtime import tenancy
from orchard.services.env import metrics
from orchard.services.env.agent_client import ExecEvent, PtySession, terminal_size
from orchard.services.env.backends.base import SandboxBackend
from orchard.services.env.exec_output import ExecOutput, StreamPosition
from orchard.services.env.files import resolve_path
from orchard.services.env.models import Exec, ExecState, Sandbox, SandboxDirectory, SandboxState
from orchard.services.env.settings import EnvSettings

log = logging.getLogger(__name__)

DEFAULT_PTY_ARGV = ("bash",)  # interactive: its stdin is a terminal
PATCH_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ExecRequest:
    """A StartExec request: argv (joined with shell quoting) or a bash string."""

    sandbox_id: str
    argv: list[str] | None = None
    shell: str | None = None
    cwd: str = ""
    env: Mapping[str, str] | None = None
    stdin: bytes = b""
    timeout_s: float = 0.0
    login_shell: bool = False
    max_output: int = 0


def _bash_argv(req: ExecRequest, command: str) -> list[str]:
    return ["bash", "-lc" if req.login_shell else "-c", command]


class Commands:
    """Every exec and terminal session of one env service."""

    def __init__(self, settings: EnvSettings, backend: SandboxBackend, directory: SandboxDirectory) -> None:
        self._directory = directory
        self.settings = settings
        self.backend = backend
        self.execs: dict[str, Exec] = {}
        self._queued = 0  # execs in state QUEUED, kept as a count: StartExec must not scan every exec
        self._ptys = 0  # terminal sessions open
        self._exec_slots = asyncio.Semaphore(self.settings.max_concurrent_execs)
        self._spool = self.settings.state_dir / "execs"
        # Ended execs in the order they ended, and the bytes their output holds on disk: what retention drops.
        self._ended: dict[str, None] = {}
        self._ended_spooled = 0

    def start(self) -> None:
        """Remove the output files a previous run left (its records lived in its memory)."""
        shutil.rmtree(self._spool, ignore_errors=True)
        self._spool.mkdir(parents=True, exist_ok=True)

    @property
    def queued(self) -> int:
        """Commands waiting for their sandbox's earlier commands or a global slot."""
        return self._queued

    async def cancel_all(self, key: str, reason: str) -> None:
        """End every unfinished exec of a sandbox (by its key) that is going away."""
        for ex in list(self.execs.values()):
            if ex.sandbox_key == key and not ex.state.done:
                await self._finish(ex, ExecState.CANCELLED, error=f"the sandbox was {reason}")

    def forget_ended_before(self, horizon: float) -> None:
        """Drop the records of execs that ended before horizon (epoch seconds), and their output."""
        for exec_id in list(self._ended):
            ex = self.execs[exec_id]
            if ex.end_time is not None and ex.end_time >= horizon:
                break
            self._forget(ex)

    def _forget(self, ex: Exec) -> None:
        del self._ended[ex.exec_id]
        self._ended_spooled -= ex.out.spooled_bytes
        del self.execs[ex.exec_id]
        ex.out.close()

    def _retain(self, ex: Exec) -> None:
        """Keep an ended exec's record; forget the oldest ones while their output on disk is over the bound."""
        self._ended[ex.exec_id] = None
        self._ended_spooled += ex.out.spooled_bytes
        while self._ended_spooled > self.settings.max_retained_output_bytes and len(self._ended) > 1:
            oldest = self.execs[next(iter(self._ended))]
            log.info(
                "forgot a finished command early: finished output on disk is over max_retained_output_bytes",
                extra={"exec_id": oldest.exec_id, "spooled_bytes": oldest.out.spooled_bytes},
            )
            self._forget(oldest)

    def get_exec(self, exec_id: str) -> Exec:
        ex = self.execs.get(exec_id)
        if ex is None or not tenancy.may_access(ex.tenant):
            raise NotFound(
                f"exec {exec_id!r} not found (finished commands are kept "
                f"{self.settings.exec_retention_s:g}s, or until their output passes "
                f"{self.settings.max_retained_output_bytes >> 20} MiB on disk)"
            )
        return ex

    def start_exec(self, req: ExecRequest) -> Exec:
        """Queue a command behind the sandbox's earlier ones and return it at once."""
        s = self.settings
        sandbox = self._directory.ready_sandbox(req.sandbox_id)
        if req.argv is not None:
            if not req.argv:
                raise InvalidArgument("argv must not be empty", field="argv")
            command = shlex.join(req.argv)
        elif req.shell:
            command = req.shell
        else:
            raise InvalidArgument("a command is required: set argv or shell", field="command")
        if "\x00" in command:
            raise InvalidArgument("the command contains a NUL byte", field="command")
        for key, value in (req.env or {}).items():
            if not key or "=" in key or "\x00" in key or "\x00" in value:
                raise InvalidArgument(
                    f"invalid env variable {key!r}: names must be non-empty without '=' and "
                    "neither names nor values may contain a NUL byte",
                    field="env",
                )
        if req.timeout_s < 0 or req.timeout_s > s.max_exec_timeout_s:
            raise InvalidArgument(f"timeout must be between 0 and {s.max_exec_timeout_s:g}s", field="timeout")
        if req.max_output < 0 or req.max_output > s.max_output_bytes:
            raise InvalidArgument(
                f"max_output_bytes must be between 0 and {s.max_output_bytes}", field="max_output_bytes"
            )
        if self._queued >= s.max_queued_execs:
            raise ResourceExhausted(f"{self._queued} commands are already waiting; retry later", retry_after=1.0)
        exec_id = f"ex-{uuid.uuid4().hex[:16]}"
        ex = Exec(
            exec_id=exec_id,
            sandbox_id=sandbox.sandbox_id,
            command=command,
            # An argv runs as it is (no shell to start); a string, or a login shell's environment, needs bash.
            argv=list(req.argv) if req.argv is not None and not req.login_shell else _bash_argv(req, command),
            cwd=resolve_path(sandbox.workdir, req.cwd),
            env=dict(req.env or {}),
            stdin=req.stdin,
            timeout_s=req.timeout_s or s.default_exec_timeout_s,
            max_output=req.max_output or s.default_output_bytes,
            out=ExecOutput(self._spool / exec_id, s.exec_output_memory_bytes),
            tenant=sandbox.tenant,
            sandbox_key=sandbox.key,
        )
        self.execs[ex.exec_id] = ex
        self._queued += 1
        self._directory.spawn(self._run(sandbox, ex), name=f"exec-{ex.exec_id}")
        return ex

    async def _run(self, sandbox: Sandbox, ex: Exec) -> None:
        async with sandbox.exec_order, self._exec_slots:
            if ex.state.done or sandbox.client is None:
                return
            ex.state = ExecState.RUNNING
            self._queued -= 1
            ex.start_time = time.time()
            oom_kills = await self.backend.oom_kills(sandbox.key)
            try:
                exit_ = await self._agent_exec(sandbox, ex, ex.argv)
                if exit_.error and ex.argv[0] != "bash":
                    # An argv that cannot start (no such program, a shell builtin like cd, not executable): nothing
                    # ran, so run it as bash would have, for bash's own answer ("command not found", 127) and its
                    # builtins.
                    exit_ = await self._agent_exec(sandbox, ex, ["bash", "-c", ex.command])
                ex.totals = exit_.totals
                ex.exit_code = exit_.exit_code
                ex.oom_killed = ex.exit_code != 0 and await self.backend.oom_kills(sandbox.key) > oom_kills
                state, error = self._outcome(ex, exit_.reason, exit_.error, sandbox.resources.memory_bytes)
                await self._finish(ex, state, error=error)
            except OrchardError as err:
                if isinstance(err, Unavailable) and sandbox.state is SandboxState.READY:
                    reason = err.message
                    if await self.backend.oom_kills(sandbox.key) > oom_kills:
                        reason = (
                            f"the sandbox ran out of memory (limit {sandbox.resources.memory_bytes >> 20} MiB) "
                            "and the kernel killed its agent"
                        )
                    self._directory.mark_failed(sandbox, reason)
                await self._finish(ex, ExecState.FAILED, error=err.message)
            except asyncio.CancelledError:
                await self._finish(ex, ExecState.CANCELLED, error="the env service stopped")
                raise

    async def _agent_exec(self, sandbox: Sandbox, ex: Exec, argv: list[str]) -> ExecEvent:
        """Run argv for ex in its sandbox's agent, keeping its output; its exit event."""
        assert sandbox.client is not None
        async for event in sandbox.client.exec(
            argv,
            cwd=ex.cwd,
            env=ex.env,
            stdin=ex.stdin,
            timeout=ex.timeout_s,
            max_output=ex.max_output,
            on_id=lambda rid: setattr(ex, "agent_id", rid),
        ):
            if event.kind == "out":
                ex.out.append(event.fd, event.data)
                await ex.notify()
            elif event.kind == "exit":
                return event
        raise Unavailable(f"the agent of sandbox {sandbox.sandbox_id!r} ended a command without its exit")

    def _outcome(self, ex: Exec, reason: str | None, error: str | None, memory_bytes: int) -> tuple[ExecState, str]:
        if error:
            return ExecState.FAILED, error
        if reason == "timeout":
            return ExecState.TIMED_OUT, f"command timed out after {ex.timeout_s:g}s; its whole process tree was killed"
        if reason:
            return ExecState.CANCELLED, f"command {reason}; its whole process tree was killed"
        if ex.oom_killed:
            limit = f"limit {memory_bytes / (1 << 20):g} MiB" if memory_bytes else "no limit: the machine ran out"
            return ExecState.FAILED, (
                f"command ran out of memory ({limit}) and the kernel killed it; use less memory "
                "or create the sandbox with a larger resources.memory_bytes"
            )
        return (ExecState.SUCCEEDED if ex.exit_code == 0 else ExecState.FAILED), ""

    async def _finish(self, ex: Exec, state: ExecState, *, error: str = "") -> None:
        if ex.state.done:
            return
        if ex.state is ExecState.QUEUED:
            self._queued -= 1
        ex.state, ex.error = state, error
        ex.end_time = time.time()
        self._retain(ex)
        ex.ended.set()
        metrics.observe_exec(ex)
        await ex.notify()

    async def wait_exec(self, exec_id: str, timeout_s: float) -> Exec:
        """Wait until the exec ends or timeout_s (capped by max_wait_s) passes; return it either way."""
        ex = self.get_exec(exec_id)
        if timeout_s < 0:
            raise InvalidArgument("timeout must not be negative", field="timeout")
        limit = min(timeout_s or self.settings.max_wait_s, self.settings.max_wait_s)
        try:
            async with asyncio.timeout(limit):
                await ex.ended.wait()
        except TimeoutError:
            pass
        return ex

    async def stream_exec(self, exec_id: str) -> AsyncIterator[tuple[int, bytes]]:
        """Yield (fd, chunk) from the first byte on, as they come, until the exec ends."""
        ex = self.get_exec(exec_id)
        at = StreamPosition()
        while True:
            async with ex.changed:
                await ex.changed.wait_for(lambda at=at: ex.out.has_more(at) or ex.state.done)  # type: ignore[misc]
            while ex.out.has_more(at):
                chunks, at = await ex.out.read_stream(at)
                for chunk in chunks:
                    yield chunk
            if ex.state.done and not ex.out.has_more(at):
                return

    async def read_output(self, exec_id: str, fd: int, offset: int, limit: int) -> tuple[bytes, int, bool]:
        """Up to `limit` bytes of a stream from `offset`: (data, bytes kept so far, whether that is all)."""
        ex = self.get_exec(exec_id)
        if fd not in (1, 2):
            raise InvalidArgument("stream must be OUTPUT_STREAM_STDOUT or OUTPUT_STREAM_STDERR", field="stream")
        if offset < 0:
            raise InvalidArgument("offset must not be negative", field="offset")
        if limit < 0:
            raise InvalidArgument("limit must not be negative", field="limit")
        done = ex.state.done  # before the read: output that arrives during it is read next time
        data = await ex.out.read(fd, offset, min(limit or self.read_cap, self.read_cap))
        kept = ex.out.kept[fd - 1]
        return data, kept, done and offset + len(data) >= kept

    @property
    def read_cap(self) -> int:
        """Most bytes of output one response carries per stream: two of them fit in one gRPC message."""
        return max(1 << 20, (self.settings.max_message_bytes - (1 << 20)) // 2)

    async def cancel_exec(self, exec_id: str) -> Exec:
        ex = self.get_exec(exec_id)
        if ex.state is ExecState.QUEUED:
            await self._finish(ex, ExecState.CANCELLED, error="cancelled before it started")
        elif ex.state is ExecState.RUNNING:
            sandbox = self._directory.sandboxes.get(ex.sandbox_key)
            if sandbox is not None and sandbox.client is not None and ex.agent_id is not None:
                await sandbox.client.cancel(ex.agent_id, "cancelled")
            try:
                async with asyncio.timeout(10):
                    await ex.ended.wait()
            except TimeoutError:
                raise Unavailable(
                    f"exec {exec_id!r} did not confirm its cancellation within 10s; its sandbox "
                    "may be unhealthy: check it with GetSandbox, or delete it"
                ) from None
        return ex

    @contextlib.asynccontextmanager
    async def open_pty(
        self,
        sandbox_id: str,
        argv: Sequence[str] = (),
        rows: int = 0,
        cols: int = 0,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
    ) -> AsyncIterator[PtySession]:
        """Run argv (an interactive bash when empty) on a terminal of rows x cols (0: 24 x 80) for as long as
        the caller stays in the block; leaving it kills the program's whole process tree.

        A session is long-lived and mostly idle, so it neither waits behind the sandbox's commands nor takes
        one of the max_concurrent_execs slots (it would starve them); max_pty_sessions bounds sessions instead.
        The sandbox's deletion ends its sessions with Unavailable.
        """
        sandbox = self._directory.ready_sandbox(sandbox_id)
        argv = list(argv) or list(DEFAULT_PTY_ARGV)
        if any("\x00" in arg for arg in argv):
            raise InvalidArgument("argv contains a NUL byte", field="argv")
        for key, value in (env or {}).items():
            if not key or "=" in key or "\x00" in key or "\x00" in value:
                raise InvalidArgument(
                    f"invalid env variable {key!r}: names must be non-empty without '=' and "
                    "neither names nor values may contain a NUL byte",
                    field="env",
                )
        rows, cols = terminal_size(rows or 24, cols or 80)
        if self._ptys >= self.settings.max_pty_sessions:
            raise ResourceExhausted(
                f"{self._ptys} terminal sessions are already open (the service's limit); close some or retry later",
                retry_after=5.0,
            )
        assert sandbox.client is not None
        session = await sandbox.client.open_pty(
            argv, cwd=resolve_path(sandbox.workdir, cwd), env=dict(env or {}), rows=rows, cols=cols
        )
        self._ptys += 1
        try:
            yield session
        finally:
            self._ptys -= 1
            await asyncio.shield(session.close())  # a second cancellation must not leave the program running

    async def run_to_end(self, sandbox_id: str, argv: list[str], *, stdin: bytes, cwd: str, timeout_s: float) -> Exec:
        """Run an internal command in the sandbox's order and wait for it (patches use this)."""
        ex = self.start_exec(
            ExecRequest(sandbox_id=sandbox_id, shell=shlex.join(argv), stdin=stdin, cwd=cwd, timeout_s=timeout_s)
        )
        await ex.ended.wait()
        return ex

    async def apply_patch(self, sandbox_id: str, patch: str, cwd: str, timeout_s: float) -> tuple[list[str], str]:
        """Apply a unified diff with `git apply` (all or nothing); returns the files and git's output."""
        if not patch.strip():
            raise InvalidArgument("patch is empty", field="patch")
        ex = await self.run_to_end(
            sandbox_id,
            ["git", "apply", "--verbose", "--numstat", "--apply", "-"],
            stdin=patch.encode(),
            cwd=cwd,
            timeout_s=timeout_s or PATCH_TIMEOUT_S,
        )
        output = (await ex.output(2)).decode(errors="replace").strip()
        if ex.state is not ExecState.SUCCEEDED:
            detail = output or ex.error or f"git apply exited with {ex.exit_code}"
            if ex.exit_code == 127:
                detail = "git is not installed in this sandbox's image"
            raise FailedPrecondition(f"patch does not apply; no file was changed: {detail}", field="patch")
        files = [
            line.split("\t", 2)[2]
            for line in (await ex.output(1)).decode(errors="replace").splitlines()
            if line.count("\t") >= 2
        ]
        return files, output

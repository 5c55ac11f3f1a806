"""Interactive terminals (OpenPty) and reattaching to a running command's output, through the raw gRPC API and
the SDK, with real sandboxes on the "host" image."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeAlias

import grpc
import pytest
from env_helpers import EnvServer, create, needs_sandboxes, run, start

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.errors import NotFound
from orchard.sdk import AsyncSandboxClient, SandboxClient

pytestmark = [needs_sandboxes, pytest.mark.timeout(120)]  # a slow host's shells: see shell_wait_s

Code: TypeAlias = grpc.StatusCode
SLOW = "echo first; sleep 0.5; echo between; sleep 0.5; echo last"
WAIT_S = 10.0
"""How long one step on a terminal may take; a step that waits for an interactive shell to start allows more
(shell_wait_s)."""


@pytest.fixture(scope="module")
def measured() -> dict[str, float]:
    """What shell_wait_s measured, for the module's other tests."""
    return {}


@pytest.fixture
async def shell_wait_s(stub: env_pb2_grpc.EnvServiceStub, sandbox: pb.Sandbox, measured: dict[str, float]) -> float:
    """How long a step that waits for an interactive bash to start may take: WAIT_S and three times the start-up of
    one, measured in a sandbox once per module. It runs the image's rc files: on the "host" image this machine's
    /root/.bashrc, whose `pyenv init` starts ~100 processes, under 1 s on this host and 4-30 s in the user-mode Linux
    VM of test_env_cgroup_v2_vm.py, where every fork is slow; there one shell's start varies by a factor of three
    from the next, and a test's polling execs compete with it for the VM's one CPU."""
    if "shell_start_s" not in measured:
        began = time.monotonic()
        ex = await run(stub, sandbox.sandbox_id, ["bash", "-ic", "exit"], timeout=110)
        assert ex.state == pb.EXEC_STATE_SUCCEEDED, ex
        measured["shell_start_s"] = time.monotonic() - began
    return WAIT_S + 3 * measured["shell_start_s"]


class Term:
    """A raw OpenPty call and what its terminal printed so far."""

    def __init__(self, call: grpc.aio.StreamStreamCall, wait_s: float) -> None:
        self.call = call
        self.wait_s = wait_s
        self.seen = b""
        self.exit_code: int | None = None

    async def send(self, data: bytes) -> None:
        await self.call.write(pb.OpenPtyRequest(input=data))

    async def resize(self, rows: int, cols: int) -> None:
        await self.call.write(pb.OpenPtyRequest(resize=pb.PtyResize(rows=rows, cols=cols)))

    async def _read(self) -> bool:
        message = await self.call.read()
        if message is grpc.aio.EOF:
            return False
        if message.WhichOneof("part") == "output":
            self.seen += message.output
        else:
            self.exit_code = message.exit_code
        return True

    async def until(self, pattern: bytes) -> bytes:
        """Read until the regex matches the output; returns the match and forgets the output up to it."""
        async with asyncio.timeout(self.wait_s):
            while (match := re.search(pattern, self.seen)) is None:
                assert await self._read(), f"ended before {pattern!r} appeared: {self.seen!r}"
        self.seen = self.seen[match.end() :]
        return match.group(0)

    async def until_end(self) -> int | None:
        """Read everything up to the end of the call; returns the exit code."""
        async with asyncio.timeout(self.wait_s):
            while await self._read():
                pass
        return self.exit_code


async def open_term(stub: env_pb2_grpc.EnvServiceStub, sandbox_id: str, wait_s: float = WAIT_S, **start: Any) -> Term:
    """An OpenPty call, started; its waits for output allow wait_s."""
    call = stub.OpenPty(timeout=20 + wait_s)
    await call.write(pb.OpenPtyRequest(start=pb.PtyStart(sandbox_id=sandbox_id, **start)))
    return Term(call, wait_s)


async def test_shell_session(stub: env_pb2_grpc.EnvServiceStub, sandbox: pb.Sandbox, shell_wait_s: float) -> None:
    """bash on a terminal: input runs, tty is a /dev/pts device, resizes show in stty, `exit 3` ends it with 3."""
    term = await open_term(stub, sandbox.sandbox_id, shell_wait_s, rows=30, cols=100)
    await term.send(b"echo hi-$((1+1))\n")
    await term.until(rb"hi-2")
    await term.send(b"tty; stty size\n")
    await term.until(rb"/dev/pts/\d+")
    await term.until(rb"[\r\n]30 100\r")
    await term.resize(50, 132)
    await term.send(b"stty size\n")
    await term.until(rb"[\r\n]50 132\r")
    await term.send(b"exit 3\n")
    assert await term.until_end() == 3
    assert await term.call.code() is Code.OK


@pytest.mark.parametrize(
    ("argv", "printed", "code"),
    [
        (["bash", "-c", "echo term=$TERM; exit 5"], rb"term=xterm-256color", 5),
        (["no-such-program"], rb"cannot start 'no-such-program'", 127),
    ],
)
async def test_program_and_exit_code(
    stub: env_pb2_grpc.EnvServiceStub, sandbox: pb.Sandbox, argv: list[str], printed: bytes, code: int
) -> None:
    """A given argv runs on the terminal (TERM set); one that cannot start prints why and exits 127."""
    term = await open_term(stub, sandbox.sandbox_id, argv=argv)
    await term.until(printed)
    assert await term.until_end() == code


async def _marked_processes(stub: env_pb2_grpc.EnvServiceStub, sandbox_id: str, marker: str) -> int:
    pattern = marker.replace(".", "[.]")  # matches the sleeps, not this grep's own command line
    ex = await run(stub, sandbox_id, f"grep -las -- '{pattern}' /proc/[0-9]*/cmdline | wc -l")
    return int(ex.stdout)


async def test_client_cancel_kills_the_process_tree(
    stub: env_pb2_grpc.EnvServiceStub, sandbox: pb.Sandbox, shell_wait_s: float
) -> None:
    """Cancelling the call kills everything the session started, including a process that left its session;
    commands run meanwhile (the session does not hold the sandbox's command order)."""
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.5"
    term = await open_term(stub, sandbox.sandbox_id, shell_wait_s)
    await term.send(f"sleep {marker} & setsid sleep {marker} & sleep {marker}\n".encode())
    async with asyncio.timeout(shell_wait_s):
        while await _marked_processes(stub, sandbox.sandbox_id, marker) < 3:
            await asyncio.sleep(0.05)
    term.call.cancel()
    async with asyncio.timeout(WAIT_S):
        while await _marked_processes(stub, sandbox.sandbox_id, marker):
            await asyncio.sleep(0.05)


async def test_deleting_the_sandbox_ends_the_session(stub: env_pb2_grpc.EnvServiceStub, shell_wait_s: float) -> None:
    """A session whose sandbox is deleted ends with UNAVAILABLE saying so."""
    sb = await create(stub)
    term = await open_term(stub, sb.sandbox_id, shell_wait_s)
    await term.send(b"echo hi-$((1+1))\n")
    await term.until(rb"hi-2")
    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sb.sandbox_id), timeout=30)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await term.until_end()
    assert info.value.code() is Code.UNAVAILABLE and "deleted" in (info.value.details() or "")


def _start(sid: str, **fields: Any) -> pb.OpenPtyRequest:
    return pb.OpenPtyRequest(start=pb.PtyStart(sandbox_id=sid, **fields))


BAD_STREAMS: list[Any] = [
    pytest.param(lambda sid: [pb.OpenPtyRequest(input=b"ls\n")], Code.INVALID_ARGUMENT, "start", id="input-first"),
    pytest.param(lambda sid: [], Code.INVALID_ARGUMENT, "start", id="no-message"),
    pytest.param(lambda sid: [_start("sb-nope")], Code.NOT_FOUND, "sb-nope", id="unknown-sandbox"),
    pytest.param(lambda sid: [_start(sid, rows=5000)], Code.INVALID_ARGUMENT, "terminal size", id="too-big"),
    pytest.param(lambda sid: [_start(sid, argv=["a\0b"])], Code.INVALID_ARGUMENT, "NUL", id="nul-argv"),
    pytest.param(lambda sid: [_start(sid), _start(sid)], Code.INVALID_ARGUMENT, "first message", id="two-starts"),
    pytest.param(
        lambda sid: [_start(sid), pb.OpenPtyRequest(resize=pb.PtyResize(rows=0, cols=80))],
        Code.INVALID_ARGUMENT,
        "terminal size",
        id="bad-resize",
    ),
]


@pytest.mark.parametrize(("requests", "code", "fragment"), BAD_STREAMS)
async def test_bad_stream_gets_a_clear_status(
    stub: env_pb2_grpc.EnvServiceStub,
    sandbox: pb.Sandbox,
    requests: Callable[[str], list[pb.OpenPtyRequest]],
    code: Code,
    fragment: str,
) -> None:
    """A stream that does not open with a valid start, or sends a bad message later, gets its status code."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.OpenPty(iter(requests(sandbox.sandbox_id)), timeout=10):
            pass
    assert info.value.code() is code and fragment in (info.value.details() or ""), info.value


async def test_stream_exec_reattaches_from_the_start(stub: env_pb2_grpc.EnvServiceStub, sandbox: pb.Sandbox) -> None:
    """StreamExec broken off after the first chunk, then called again, yields the whole output (also what was
    written in between) and the exit."""
    ex = await start(stub, sandbox.sandbox_id, SLOW)
    call = stub.StreamExec(pb.StreamExecRequest(exec_id=ex.exec_id), timeout=10)
    assert (await call.read()).stdout == b"first\n"
    call.cancel()
    async with asyncio.timeout(5):
        while b"between" not in (await stub.GetExec(pb.GetExecRequest(exec_id=ex.exec_id), timeout=5)).exec.stdout:
            await asyncio.sleep(0.05)
    again = [m async for m in stub.StreamExec(pb.StreamExecRequest(exec_id=ex.exec_id), timeout=10)]
    assert b"".join(m.stdout for m in again[:-1]) == b"first\nbetween\nlast\n"
    assert again[-1].exit.state == pb.EXEC_STATE_SUCCEEDED


# ---- the SDK ----


def _address(env: EnvServer) -> str:
    return f"127.0.0.1:{env.server.port}"


async def test_sdk_pty(env: EnvServer) -> None:
    """AsyncSandbox.pty(): resize, send, iterate the output to the end, exit_code; NotFound once the sandbox went."""
    async with await AsyncSandboxClient.connect(_address(env)) as client:
        sandbox = await client.create_sandbox("host")
        async with sandbox.pty(rows=30, cols=100) as term:
            await term.resize(40, 120)
            await term.send("echo hi-$((1+1)); stty size; exit 3\n")
            output = b"".join([chunk async for chunk in term])
        assert b"hi-2" in output and b"40 120" in output and term.exit_code == 3
        await sandbox.delete()
        with pytest.raises(NotFound, match="deleted"):
            async with sandbox.pty():
                pass


async def test_sdk_reattach(env: EnvServer) -> None:
    """handle.stream() broken off and restarted, and attach(job_id) from a new client, see the whole output."""
    async with await AsyncSandboxClient.connect(_address(env)) as client:
        sandbox = await client.create_sandbox("host")
        handle = await sandbox.start(SLOW)
        async with contextlib.aclosing(handle.stream()) as chunks:
            assert await anext(chunks) == ("stdout", b"first\n")
        async with asyncio.timeout(5):
            while "between" not in (await handle.describe()).stdout:
                await asyncio.sleep(0.05)
        async with await AsyncSandboxClient.connect(_address(env), auto_cleanup=False) as other:
            attached = await (await other.get_sandbox(sandbox.sandbox_id)).attach(handle.job_id)
            assert b"".join([data async for _, data in attached.stream()]) == b"first\nbetween\nlast\n"
            assert (await attached.wait()).exit_code == 0
            with pytest.raises(NotFound):
                await (await other.get_sandbox(sandbox.sandbox_id)).attach("ex-nope")
        assert b"".join([data async for _, data in handle.stream()]) == b"first\nbetween\nlast\n"


def _sync_session(address: str, sandbox_id: str, job_id: str) -> tuple[bytes, int | None, bytes]:
    with SandboxClient.connect(address, auto_cleanup=False) as client:
        sandbox = client.get_sandbox(sandbox_id)
        with sandbox.pty(["bash"]) as term:
            term.send("echo hi-$((1+1)); exit 4\n")
            output = b"".join(term)
        attached = b"".join(data for _, data in sandbox.attach(job_id).stream())
        return output, term.exit_code, attached


async def test_sync_sdk_pty_and_attach(env: EnvServer, sandbox: pb.Sandbox) -> None:
    """The blocking Sandbox.pty() and attach() (run in a thread: the server shares this test's loop)."""
    ex = await start(env.stub, sandbox.sandbox_id, "echo a; echo b")
    output, code, attached = await asyncio.to_thread(_sync_session, _address(env), sandbox.sandbox_id, ex.exec_id)
    assert b"hi-2" in output and code == 4 and attached == b"a\nb\n"

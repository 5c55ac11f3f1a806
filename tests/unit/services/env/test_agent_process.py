"""The in-sandbox agent (agent-rs/: one static binary, built by scripts/build_agent.sh) as a real process, with no
sandbox: started as the local backend starts it (requests on its stdin, replies on its stdout) and driven by the
manager's AgentClient. Every op and frame here is in agent-rs/PROTOCOL.md."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orchard.errors import FailedPrecondition, NotFound, OrchardError
from orchard.services.env import agent_client
from orchard.services.env.agent_client import AgentClient, ExecEvent, encode, read_frame
from orchard.services.env.backends.agent_binary import BUILT_AGENT

PRIVATE_DIRTY_BOUND_KIB = 2 * 1024
REPO = Path(__file__).resolve().parents[4]
BUILD_AGENT = REPO / "scripts" / "build_agent.sh"


@functools.cache
def native_agent() -> Path | str:
    """The agent's binary, built (or found up to date) by scripts/build_agent.sh; else why not."""
    if shutil.which("cargo") is None:
        if BUILT_AGENT.exists():
            return BUILT_AGENT
        return "the native agent needs cargo to build (scripts/build_agent.sh): cargo is not installed"
    done = subprocess.run(["bash", str(BUILD_AGENT)], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        return f"scripts/build_agent.sh failed: {done.stderr.strip()[-2000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


def native_or_fail() -> Path:
    """The binary; the test fails saying why when it cannot be built (every backend needs it: no skipping)."""
    binary = native_agent()
    if isinstance(binary, str):
        pytest.fail(binary)
    return binary


class Agent:
    def __init__(self, proc: asyncio.subprocess.Process, client: AgentClient) -> None:
        self.proc = proc
        self.client = client

    async def run(
        self,
        argv: list[str],
        *,
        stdin: bytes = b"",
        timeout: float = 30,
        max_output: int = 1 << 30,
        cwd: str = "/",
        env: dict[str, str] | None = None,
        on_id: Any = None,
    ) -> tuple[bytes, bytes, ExecEvent]:
        """(stdout, stderr, exit event) of one command; checks that no event follows the exit."""
        out: list[bytes] = [b"", b""]
        last = None
        async for event in self.client.exec(
            argv, cwd=cwd, env=env or {}, stdin=stdin, timeout=timeout, max_output=max_output, on_id=on_id
        ):
            assert last is None, "an event after the exit"
            if event.kind == "out":
                out[event.fd - 1] += event.data
            else:
                last = event
        assert last is not None
        return out[0], out[1], last

    async def info(self) -> dict[str, Any]:
        head, _ = await self.client.call("info")
        return head


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    proc = await asyncio.create_subprocess_exec(
        str(native_or_fail()),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    client = AgentClient(proc.stdout, proc.stdin, label="test-agent")
    try:
        await client.start(10)
        yield Agent(proc, client)
    finally:
        await client.close("the test ended")
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def state_of(pid: int) -> str | None:
    """A process's state letter, or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


async def test_agent_is_lean(agent: Agent) -> None:
    """The agent answers info about itself, and stays small after a few commands and a terminal (what they
    allocated goes back to the system once they end)."""
    for _ in range(5):
        assert (await agent.run(["sh", "-c", "head -c 2000000 /dev/zero; echo hi"], stdin=b"x" * 100_000))[0][
            -3:
        ] == b"hi\n"
    session = await agent.client.open_pty(["sh", "-c", "head -c 2000000 /dev/zero"], cwd="/", env={}, rows=24, cols=80)
    await pty_output(session)
    info = await agent.info()
    assert info["pid"] == agent.proc.pid and info["agent"] == "native"
    assert 0 < info["private_dirty_kib"] < PRIVATE_DIRTY_BOUND_KIB, info


async def test_exec_stdin_stdout_stderr_and_code(agent: Agent) -> None:
    """stdin reaches the command; stdout and stderr come apart; the exit code and totals come with the exit."""
    out, err, exit_ = await agent.run(["sh", "-c", "cat; echo oops >&2; exit 3"], stdin=b"abc" * 100_000)
    assert out == b"abc" * 100_000 and err == b"oops\n"
    assert (exit_.exit_code, exit_.totals, exit_.reason, exit_.error) == (3, (300_000, 5), None, None)


async def test_exec_env_cwd_and_own_path(agent: Agent, tmp_path: Path) -> None:
    """The request's env (with the exec mark added) and cwd apply; a program is looked up on the request's PATH."""
    tool = tmp_path / "bin" / "my-tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho tool in $(pwd) $FOO $ORCHARD_EXEC\n")
    tool.chmod(0o755)
    env = {"FOO": "bar", "PATH": f"{tool.parent}:/usr/bin:/bin"}
    calls: list[int] = []
    out, _, exit_ = await agent.run(["my-tool"], cwd=str(tmp_path), env=env, on_id=calls.append)
    words = out.decode().split()
    assert words[:4] == ["tool", "in", str(tmp_path), "bar"] and exit_.exit_code == 0
    assert words[4].endswith(f"-{calls[0]}")  # the mark: this agent's random tag, then the request id
    out, _, _ = await agent.run(["pwd"], cwd="")  # no cwd: the agent's own, unchanged by the one before
    assert out == f"{Path.cwd()}\n".encode()


@pytest.mark.parametrize(
    ("argv", "cwd", "message"),
    [
        (["no-such-program"], "/", "cannot start: No such file or directory: no-such-program"),
        (["/no/such/path"], "/", "cannot start: No such file or directory: /no/such/path"),
        (["true"], "/no-such-dir", "cannot start: No such file or directory: /no-such-dir"),
        (["/dev/null"], "/", "cannot start: Permission denied: /dev/null"),
        (["true", "a\0b"], "/", "cannot start: embedded null byte"),
    ],
)
async def test_exec_cannot_start(agent: Agent, argv: list[str], cwd: str, message: str) -> None:
    """A command that cannot start exits 127 with why; the agent carries on."""
    _, _, exit_ = await agent.run(argv, cwd=cwd)
    assert (exit_.exit_code, exit_.error) == (127, message)
    assert (await agent.run(["echo", "still here"]))[0] == b"still here\n"


async def test_output_cap_counts_everything(agent: Agent) -> None:
    """Output beyond max_output is not sent but is counted in the totals."""
    out, err, exit_ = await agent.run(
        ["sh", "-c", "head -c 300000 /dev/zero; head -c 7 /dev/zero >&2"], max_output=1000
    )
    assert (len(out), len(err), exit_.totals) == (1000, 7, (300_000, 7))


async def test_unread_stdin_does_not_hurt_the_agent(agent: Agent) -> None:
    """A command that ignores a large stdin ends normally, and the agent survives the broken pipe."""
    _, _, exit_ = await agent.run(["true"], stdin=b"x" * (4 << 20))
    assert exit_.exit_code == 0
    await agent.client.call("ping")


async def test_concurrent_execs_keep_their_output_apart(agent: Agent) -> None:
    """Many commands writing a lot at once: every byte arrives, in order, on the right exec and stream."""
    lines = 60_000

    def expected(tag: str) -> bytes:
        return "".join(f"{tag}-{n}\n" for n in range(1, lines + 1)).encode()

    results = await asyncio.gather(
        *(
            agent.run(["sh", "-c", f"seq -f 'o{i}-%g' 1 {lines} & seq -f 'e{i}-%g' 1 {lines} >&2; wait"])
            for i in range(16)
        )
    )
    for i, (out, err, exit_) in enumerate(results):
        assert out == expected(f"o{i}") and err == expected(f"e{i}")
        assert exit_.exit_code == 0 and exit_.totals == (len(out), len(err))


async def test_timeout_and_cancel_kill_the_tree(agent: Agent) -> None:
    """A timeout or a cancel kills the command's whole tree, including what left its session."""
    start = time.monotonic()
    _, _, exit_ = await agent.run(["sh", "-c", "setsid sleep 60 & sleep 60"], timeout=0.3)
    assert exit_.reason == "timeout" and exit_.exit_code == 137 and time.monotonic() - start < 20

    ids: list[int] = []
    task = asyncio.create_task(agent.run(["sh", "-c", "echo started; sleep 60"], on_id=ids.append))
    await asyncio.sleep(0.3)
    await agent.client.cancel(ids[0], "cancelled")
    _, _, exit_ = await asyncio.wait_for(task, 20)
    assert exit_.reason == "cancelled"
    leftovers = [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit()
        and state_of(int(pid)) not in (None, "Z")
        and f"-{ids[0]}\0".encode() in _environ(pid)
        and b"ORCHARD_EXEC=" in _environ(pid)
    ]
    assert leftovers == []


def _environ(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


async def test_background_holders_do_not_hold_the_exit(agent: Agent) -> None:
    """A background child keeping the pipes open does not delay the exit beyond a short drain, and dies."""
    start = time.monotonic()
    out, _, exit_ = await agent.run(["sh", "-c", "sleep 30 & echo done"])
    assert out == b"done\n" and exit_.exit_code == 0 and time.monotonic() - start < 15  # not the sleep 30


async def test_files(agent: Agent, tmp_path: Path) -> None:
    """write (chunked, renamed into place), read at an offset, stat, list; errors carry their errno."""
    target = tmp_path / "sub" / "f.bin"
    await agent.client.call("write", b"a" * 10, path=str(target), upload="u1", offset=0, mode=0o640, last=False)
    await agent.client.call("write", b"b" * 5, path=str(target), upload="u1", offset=10, mode=0o640, last=True)
    assert target.read_bytes() == b"a" * 10 + b"b" * 5 and target.stat().st_mode & 0o777 == 0o640
    head, data = await agent.client.call("read", path=str(target), offset=8, length=4)
    assert data == b"aabb" and head["size"] == 15
    head, _ = await agent.client.call("stat", path=str(target))
    assert head["info"]["type"] == "file" and head["info"]["size"] == 15
    head, _ = await agent.client.call("list", path=str(tmp_path))
    assert [(f["name"], f["type"]) for f in head["files"]] == [("sub", "directory")]
    with pytest.raises(NotFound):
        await agent.client.call("stat", path=str(tmp_path / "missing"))
    with pytest.raises(FailedPrecondition, match="Is a directory"):
        await agent.client.call("read", path=str(tmp_path), offset=0, length=10)


async def test_reading_a_fifo_does_not_hang_the_agent(agent: Agent, tmp_path: Path) -> None:
    """Files open non-blocking: a FIFO with no writer fails at once instead of stopping the agent."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FailedPrecondition, match=f"^not a regular file: {fifo}$"):
        await asyncio.wait_for(agent.client.call("read", path=str(fifo), offset=0, length=10), 5)
    with pytest.raises(FailedPrecondition, match="^not a regular file: /dev/zero$"):
        await agent.client.call("read", path="/dev/zero", offset=0, length=10)
    await agent.client.call("ping")


async def test_pty_is_the_controlling_terminal(agent: Agent) -> None:
    """A pty program has its terminal as controlling tty, gets typed input, and reports its exit."""
    session = await agent.client.open_pty(
        ["sh", "-c", "read x; echo got=$x > /dev/tty; exit 4"], cwd="/", env={}, rows=24, cols=80
    )
    await session.send_input(b"hello\n")
    output = b""
    async for event in session:
        output += event.data
    assert b"got=hello" in output and session.exit_code == 4


async def pty_output(session: agent_client.PtySession) -> bytes:
    output = b""
    async for event in session:
        output += event.data
    return output


async def test_pty_size_resize_and_env(agent: Agent) -> None:
    """The terminal starts at the requested size, a resize shows (the program gets SIGWINCH), TERM is set,
    and the request's env and cwd apply."""
    session = await agent.client.open_pty(
        ["sh", "-c", "stty size; echo $TERM $FOO $(pwd); read x; stty size"],
        cwd="/tmp",
        env={"FOO": "bar"},
        rows=30,
        cols=100,
    )
    assert isinstance(await session.started(), int)
    output = b""
    async for event in session:
        output += event.data
        if output.endswith(b"/tmp\r\n"):
            break
    assert output == b"30 100\r\nxterm-256color bar /tmp\r\n", output
    await session.resize(40, 120)
    await session.send_input(b"\n")
    assert (await pty_output(session)).endswith(b"40 120\r\n")
    assert (session.exit_code, session.signal) == (0, None)


async def test_pty_input_waits_for_room_and_keeps_order(agent: Agent) -> None:
    """Input larger than the terminal's buffer is written as the program reads it, every byte in order."""
    session = await agent.client.open_pty(
        ["sh", "-c", "stty raw -echo; head -c 300000 | md5sum"], cwd="/", env={}, rows=24, cols=80
    )
    data = bytes(range(256)) * 1000 + b"x" * 44_000
    await session.started()
    await asyncio.sleep(0.2)  # stty has switched the terminal to raw (no line editing, no signals) by now
    await asyncio.gather(session.send_input(data[:150_000]), session.send_input(data[150_000:]))
    output = await pty_output(session)
    assert hashlib.md5(data).hexdigest().encode() in output, output
    assert session.exit_code == 0


async def test_pty_cannot_start(agent: Agent) -> None:
    """A program that cannot start: no started event, the reason on the terminal, exit 127."""
    session = await agent.client.open_pty(["no-such-program"], cwd="/", env={}, rows=24, cols=80)
    assert await session.started() is None
    output = await pty_output(session)
    assert output == b"cannot start 'no-such-program': No such file or directory: no-such-program\r\n"
    assert session.exit_code == 127
    session = await agent.client.open_pty(["true"], cwd="/no-such-dir", env={}, rows=24, cols=80)
    assert await pty_output(session) == b"cannot start 'true': No such file or directory: /no-such-dir\r\n"
    await agent.client.call("ping")


async def test_pty_kill_ends_the_tree_with_its_signal(agent: Agent) -> None:
    """kill (what closing a session does) kills the program's whole tree, what left its session too; the exit
    says which signal; input and resizes to the ended session are answered, and do nothing."""
    session = await agent.client.open_pty(
        ["sh", "-c", "setsid sleep 60 & echo ready; exec sleep 60"], cwd="/", env={}, rows=24, cols=80
    )
    pid = await session.started()
    assert pid is not None
    async for event in session:
        if b"ready" in event.data:
            break
    await session.kill()
    await pty_output(session)
    assert (session.exit_code, session.signal) == (137, 9)
    assert state_of(pid) in (None, "Z")
    await agent.client.call("pty_input", b"late\n", target=session._rid)
    await agent.client.call("pty_resize", target=session._rid, rows=10, cols=10)
    await session.close()


async def test_pty_program_end_ends_the_session(agent: Agent) -> None:
    """The session ends with its program: what it left running in the background does not hold it open."""
    start = time.monotonic()
    session = await agent.client.open_pty(["sh", "-c", "sleep 60 & echo done"], cwd="/", env={}, rows=24, cols=80)
    assert b"done" in await pty_output(session)
    assert session.exit_code == 0 and time.monotonic() - start < 10


async def test_pty_output_waits_for_acks(agent: Agent) -> None:
    """The agent stops reading the terminal while PTY_WINDOW output bytes are unacknowledged (the program
    waits); each ack lets more through, and all of it arrives."""
    size = 4 * agent_client.PTY_WINDOW
    rid = 999
    queue: asyncio.Queue[tuple[dict[str, Any], bytes] | None] = asyncio.Queue()
    agent.client._waiters[rid] = queue
    await agent.client._send(
        {
            "id": rid,
            "op": "pty",
            "argv": ["sh", "-c", f"stty raw -echo; head -c {size} /dev/zero"],
            "cwd": "/",
            "env": {},
            "rows": 24,
            "cols": 80,
        }
    )
    received, exit_head = 0, None

    async def take(quiet: float) -> None:
        nonlocal received, exit_head
        while exit_head is None:
            try:
                frame = await asyncio.wait_for(queue.get(), quiet)
            except TimeoutError:
                return
            assert frame is not None
            if frame[0]["ev"] == "out":
                received += len(frame[1])
            elif frame[0]["ev"] == "exit":
                exit_head = frame[0]

    await take(1.0)
    assert agent_client.PTY_WINDOW <= received < agent_client.PTY_WINDOW + (64 << 10), received
    while exit_head is None:
        await agent.client.call("pty_ack", target=rid, consumed=received)
        await take(1.0)
    assert received == size and exit_head["code"] == 0, (received, exit_head)
    del agent.client._waiters[rid]


async def test_agent_exit_kills_running_commands(agent: Agent) -> None:
    """When the manager closes the agent's stdin, the agent kills its commands and exits."""
    pids: asyncio.Queue[int] = asyncio.Queue()

    async def run() -> None:
        async for event in agent.client.exec(
            ["sh", "-c", "echo $$; exec sleep 60"], cwd="/", env={}, stdin=b"", timeout=60, max_output=1000
        ):
            if event.kind == "out":
                pids.put_nowait(int(event.data))

    task = asyncio.create_task(run())
    pid = await asyncio.wait_for(pids.get(), 5)
    assert agent.proc.stdin is not None
    agent.proc.stdin.close()
    assert await asyncio.wait_for(agent.proc.wait(), 5) == 0
    deadline = time.monotonic() + 5
    while state_of(pid) not in (None, "Z") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert state_of(pid) in (None, "Z")
    task.cancel()
    with pytest.raises((asyncio.CancelledError, OrchardError)):
        await task


async def test_frames_carry_any_header_and_body(agent: Agent) -> None:
    """The manager's framing (agent_client.encode, read_frame) and the agent's JSON agree on what headers and
    bodies can hold: non-ASCII and escaped characters, large numbers, floats, and a body of every byte value."""
    target = '/tmp/orchard-test-\u00e9-\U0001f600-\u2028"q" \\ \x01'
    body = bytes(range(256)) * 4
    try:
        head, _ = await agent.client.call("write", body, path=target, upload="u\n1", offset=0, mode=0o600, last=True)
        assert head["size"] == len(body)
        head, data = await agent.client.call("read", path=target, offset=0, length=1 << 40)
        assert data == body and head["size"] == len(body) and isinstance(head["mtime"], float)
        head, _ = await agent.client.call("stat", path=target)
        assert head["info"]["name"] == Path(target).name and head["info"]["mode"] == 0o600
    finally:
        Path(target).unlink(missing_ok=True)
    header = {"id": 7, "op": "ping", "x": [1.5e300, -2, None, True, {"k": "\u00e9"}]}
    frame = encode(header, b"\0\xff")
    total, head_len = int.from_bytes(frame[:4], "big"), int.from_bytes(frame[4:8], "big")
    assert total == len(frame) - 4 and json.loads(frame[8 : 8 + head_len]) == header
    assert frame[8 + head_len :] == b"\0\xff"
    reader = asyncio.StreamReader()
    reader.feed_data(encode(header, b"\0\xff"))
    reader.feed_eof()
    assert await read_frame(reader) == (header, b"\0\xff") and await read_frame(reader) is None


def private_dirty_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1])
    raise AssertionError("no Private_Dirty")


async def test_output_waits_in_the_pipe_while_the_manager_is_behind() -> None:
    """A manager that does not read: the command's output stays in its pipe (the command waits), not in the
    agent's memory; once read, all of it arrives."""
    proc = await asyncio.create_subprocess_exec(
        str(native_or_fail()),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=1 << 26,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert (await read_frame(proc.stdout))[0]["ev"] == "ready"  # type: ignore[index]
        size = 64 << 20
        proc.stdin.write(
            encode(
                {
                    "id": 1,
                    "op": "exec",
                    "argv": ["head", "-c", str(size), "/dev/zero"],
                    "cwd": "/",
                    "env": {},
                    "timeout": 60,
                    "max_output": size,
                }
            )
        )
        await proc.stdin.drain()
        proc.stdout._transport.pause_reading()  # type: ignore[attr-defined]  # the manager falls behind
        await asyncio.sleep(1.0)
        assert private_dirty_kib(proc.pid) < 16 * 1024  # far below the 64 MiB the command wants to write
        proc.stdout._transport.resume_reading()  # type: ignore[attr-defined]
        received = 0
        while True:
            frame = await asyncio.wait_for(read_frame(proc.stdout), 30)
            assert frame is not None
            if frame[0]["ev"] == "exit":
                break
            received += len(frame[1])
        assert received == size and frame[0]["totals"] == [size, 0] and frame[0]["code"] == 0
    finally:
        proc.kill()
        proc.stdout._transport.resume_reading()  # type: ignore[attr-defined]  # wait() waits for the pipes too
        await proc.wait()


# --- the agent on its own ---------------------------------------------------------------------------------


def test_native_agent_is_static() -> None:
    """The native agent needs no loader and no libraries from the image: one statically linked file."""
    binary = native_or_fail()
    assert binary.read_bytes()[:4] == b"\x7fELF"
    described = (
        subprocess.run(["file", "-b", str(binary)], capture_output=True, text=True, check=False).stdout
        if shutil.which("file")
        else ""
    )
    assert not described or "statically linked" in described or "static-pie linked" in described, described
    ldd = (
        subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
        if shutil.which("ldd")
        else None
    )
    assert (
        ldd is None
        or "not a dynamic executable" in ldd.stdout + ldd.stderr
        or "statically linked" in ldd.stdout + ldd.stderr
    ), ldd.stdout + ldd.stderr


def busybox() -> str | None:
    for path in ("/bin/busybox", "/usr/bin/busybox"):
        if (
            os.access(path, os.X_OK)
            and "static" in subprocess.run(["file", "-b", path], capture_output=True, text=True, check=False).stdout
        ):
            return path
    return None


async def test_native_agent_runs_in_an_empty_root() -> None:
    """Under bwrap with an empty root (no /usr, no Python, no libc: the agent alone, plus /proc and /dev),
    the native agent starts, answers, lists and runs a program by absolute path: itself (a second agent,
    whose stdin is empty: it says ready and ends), and busybox's echo where a static busybox is installed."""
    binary = native_or_fail()
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed")
    box = busybox()
    binds = ["--ro-bind", box, "/busybox"] if box else []
    probe = await asyncio.to_thread(
        subprocess.run,
        ["bwrap", "--tmpfs", "/", "--ro-bind", str(binary), "/agent", "--unshare-all", "/agent"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"bwrap cannot make a sandbox here: {probe.stderr.decode(errors='replace').strip()}")
    proc = await asyncio.create_subprocess_exec(
        "bwrap",
        "--tmpfs",
        "/",
        "--ro-bind",
        str(binary),
        "/agent",
        *binds,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--unshare-all",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "/agent",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    client = AgentClient(proc.stdout, proc.stdin, label="native-in-empty-root")
    try:
        await client.start(10)
        agent = Agent(proc, client)
        await client.call("ping")
        head, _ = await client.call("list", path="/")
        assert {f["name"] for f in head["files"]} == {"agent", "dev", "proc"} | ({"busybox"} if box else set())
        with pytest.raises(NotFound):  # no /usr: nothing of an image, no Python, no libc
            await client.call("stat", path="/usr")
        out, err, exit_ = await agent.run(["/agent"], env={"PATH": "/nowhere"})
        assert exit_.exit_code == 0 and err == b"", (out, err, exit_)
        assert b'"ev":"ready"' in out
        _, _, exit_ = await agent.run(["sh", "-c", "true"])
        assert (exit_.exit_code, exit_.error) == (127, "cannot start: No such file or directory: sh")
        if box:
            out, _, exit_ = await agent.run(["/busybox", "sh", "-c", "echo $((6 * 7)) $ORCHARD_EXEC"])
            assert exit_.exit_code == 0 and out.split()[0] == b"42", out
    finally:
        await client.close("the test ended")
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()


# --- the native agent on a unix socket (--listen: how the docker backend reaches it) ----------------------


async def start_listening(path: Path) -> asyncio.subprocess.Process:
    """The native agent with --listen path, once its socket (mode 0600) is there."""
    proc = await asyncio.create_subprocess_exec(
        str(native_or_fail()), "--listen", str(path), stdin=asyncio.subprocess.DEVNULL
    )
    deadline = time.monotonic() + 10
    while not (path.is_socket() and path.stat().st_mode & 0o777 == 0o600):
        assert proc.returncode is None and time.monotonic() < deadline, "the agent did not listen"
        await asyncio.sleep(0.02)
    return proc


async def connect(path: Path, label: str) -> AgentClient:
    """A manager on the socket, past the connection's ready frame. The socket file appears at bind(), a moment
    before listen(): a connection refused in that moment is tried again."""
    deadline = time.monotonic() + 10
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)
    client = AgentClient(reader, writer, label=label)
    await client.start(10)
    return client


async def stop_listening(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def test_native_agent_serves_a_unix_socket_one_connection_after_another(tmp_path: Path) -> None:
    """--listen: a 0600 socket; each connection gets its own ready frame and the whole protocol (exec, files);
    a command of a connection that closes keeps running (its output is dropped) and the next one is served."""
    path = tmp_path / "agent.sock"
    proc = await start_listening(path)
    try:
        client = await connect(path, "socket-1")
        agent = Agent(proc, client)
        await client.call("ping")
        assert (await agent.run(["echo", "hi"]))[0] == b"hi\n"
        target = tmp_path / "f.bin"
        await client.call("write", b"data" * 1000, path=str(target), upload="u1", offset=0, mode=0o644, last=True)
        head, data = await client.call("read", path=str(target), offset=0, length=1 << 20)
        assert data == b"data" * 1000 and head["size"] == 4000 and target.read_bytes() == data

        done = tmp_path / "done"  # written by a command that outlives its connection
        started: asyncio.Queue[bytes] = asyncio.Queue()

        async def run() -> None:
            async for event in client.exec(
                ["sh", "-c", f"echo started; sleep 0.5; touch {done}; echo lost"],
                cwd="/",
                env={},
                stdin=b"",
                timeout=60,
                max_output=1000,
            ):
                if event.kind == "out":
                    started.put_nowait(event.data)

        task = asyncio.create_task(run())
        assert await asyncio.wait_for(started.get(), 5) == b"started\n"
        await client.close("the manager restarts")
        task.cancel()
        with pytest.raises((asyncio.CancelledError, OrchardError)):
            await task

        client = await connect(path, "socket-2")  # a second ready frame: a fresh session
        try:
            agent = Agent(proc, client)
            assert (await agent.run(["echo", "again"]))[0] == b"again\n"
            deadline = time.monotonic() + 5
            while not done.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert done.exists(), "the command of the closed connection did not run on"
            head, _ = await client.call("stat", path=str(target))
            assert head["info"]["size"] == 4000
            assert proc.returncode is None
        finally:
            await client.close("the test ended")
    finally:
        await stop_listening(proc)


async def test_native_agent_replaces_a_stale_socket(tmp_path: Path) -> None:
    """A socket file left at the path (an agent that died) is replaced, not an error."""
    import socket

    path = tmp_path / "agent.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens
    path.chmod(0o644)  # not the agent's mode: start_listening waits for the agent's own socket
    assert path.is_socket()
    proc = await start_listening(path)
    try:
        client = await connect(path, "after-stale")
        try:
            await client.call("ping")
        finally:
            await client.close("the test ended")
    finally:
        await stop_listening(proc)


async def test_native_agent_on_a_socket_ends_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM: the agent kills its commands, removes its socket and exits 0."""
    path = tmp_path / "agent.sock"
    proc = await start_listening(path)
    try:
        client = await connect(path, "sigterm")
        pids: asyncio.Queue[int] = asyncio.Queue()

        async def run() -> None:
            async for event in client.exec(
                ["sh", "-c", "echo $$; exec sleep 60"], cwd="/", env={}, stdin=b"", timeout=60, max_output=1000
            ):
                if event.kind == "out":
                    pids.put_nowait(int(event.data))

        task = asyncio.create_task(run())
        pid = await asyncio.wait_for(pids.get(), 5)
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 5) == 0
        assert not path.exists()
        deadline = time.monotonic() + 5
        while state_of(pid) not in (None, "Z") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert state_of(pid) in (None, "Z")
        with pytest.raises(OrchardError):
            await asyncio.wait_for(task, 5)
        await client.close("the test ended")
    finally:
        await stop_listening(proc)


async def test_native_agent_on_a_socket_kills_the_terminals_of_a_closed_connection(tmp_path: Path) -> None:
    """A terminal lives in its connection (no later one can type into it or take its output): when the
    connection closes, its program is killed; the agent serves the next connection."""
    path = tmp_path / "agent.sock"
    proc = await start_listening(path)
    try:
        client = await connect(path, "pty-1")
        session = await client.open_pty(["sleep", "60"], cwd="/", env={}, rows=24, cols=80)
        pid = await session.started()
        assert pid is not None and state_of(pid) not in (None, "Z")
        await client.close("the manager restarts")
        deadline = time.monotonic() + 5
        while state_of(pid) not in (None, "Z") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert state_of(pid) in (None, "Z")
        client = await connect(path, "pty-2")
        try:
            await client.call("ping")
        finally:
            await client.close("the test ended")
    finally:
        await stop_listening(proc)

"""The env service end to end through its raw gRPC API, with real sandboxes on the "host" image."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from env_helpers import (
    EnvServer,
    StartEnv,
    create,
    delete_quietly,
    duration,
    needs_sandboxes,
    run,
    start,
    wait,
)

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.errors import FailedPrecondition, from_rpc_error

pytestmark = [needs_sandboxes, pytest.mark.timeout(30)]

Stub = env_pb2_grpc.EnvServiceStub
Code = grpc.StatusCode

# A grandchild that records its own pid in ./pids, then sleeps long.
GRANDCHILD = "bash -c 'echo $$ >> pids; exec sleep 100'"
# Prints every pid listed in ./pids that is still a live (non-zombie) process in the sandbox.
ALIVE_CHECK = """
for pid in open("pids").read().split():
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        continue
    if state != "Z":
        print(pid)
"""
CONNECT = """
import errno, socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
except OSError as err:
    print(errno.errorcode.get(err.errno, err))
else:
    print("connected")
"""


async def rpc_error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """The error `call` fails with; fails the test when it succeeds."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return err
    raise AssertionError("the call succeeded; expected an error")


async def download(stub: Stub, sandbox_id: str, path: str) -> tuple[pb.FileInfo, list[bytes]]:
    """DownloadFile: the info message and every content chunk."""
    info: pb.FileInfo | None = None
    chunks: list[bytes] = []
    async for message in stub.DownloadFile(pb.DownloadFileRequest(sandbox_id=sandbox_id, path=path), timeout=30):
        if message.WhichOneof("part") == "info":
            assert info is None and not chunks, "info must come once, first"
            info = message.info
        else:
            chunks.append(message.chunk)
    assert info is not None
    return info, chunks


async def upload(
    stub: Stub, sandbox_id: str, path: str, data: bytes, *, mode: int = 0, chunk: int = 1 << 20
) -> pb.UploadFileResponse:
    """UploadFile of data in chunks of `chunk` bytes."""

    async def requests() -> AsyncIterator[pb.UploadFileRequest]:
        yield pb.UploadFileRequest(header=pb.FileHeader(sandbox_id=sandbox_id, path=path, mode=mode))
        for offset in range(0, len(data), chunk):
            yield pb.UploadFileRequest(chunk=data[offset : offset + chunk])

    return await stub.UploadFile(requests(), timeout=30)  # type: ignore[no-any-return]


def host_pids(sandbox_id: str) -> set[int]:
    """Host pids of the sandbox's bwrap and of every process inside it (they inherit its environment)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"ORCHARD_SANDBOX_ID={sandbox_id}".encode() in environ or (
            b"ORCHARD_SANDBOX_ID" in cmdline and sandbox_id.encode() in cmdline
        ):
            found.add(int(entry))
    return found


def host_alive(pid: int) -> bool:
    """Whether pid is a live (non-zombie) process on the host."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ts(stamp: Any) -> float:
    """A protobuf Timestamp or Duration as float seconds."""
    return float(stamp.ToNanoseconds()) / 1e9


# ---- lifecycle ----


async def test_lifecycle(env: EnvServer) -> None:
    """Create gives a READY sandbox with name, ids, times and /workspace; get, list, delete, then NOT_FOUND."""
    stub = env.stub
    before = time.time()
    sandbox = await create(stub, labels={"suite": "lifecycle"}, env={"GREETING": "hi"})
    assert sandbox.state == pb.SANDBOX_STATE_READY
    assert sandbox.sandbox_id.startswith("sb-") and sandbox.name == f"sandboxes/{sandbox.sandbox_id}"
    assert (sandbox.kind, sandbox.image, sandbox.workdir) == (pb.SANDBOX_KIND_CONTAINER, "host", "/workspace")
    assert dict(sandbox.labels) == {"suite": "lifecycle"} and dict(sandbox.env) == {"GREETING": "hi"}
    assert before - 1 <= ts(sandbox.create_time) <= time.time()
    assert ts(sandbox.ttl) == env.settings.default_ttl_s
    assert ts(sandbox.expire_time) == pytest.approx(ts(sandbox.create_time) + env.settings.default_ttl_s)

    got = (await stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sandbox.sandbox_id), timeout=5)).sandbox
    assert got == sandbox
    listed = await stub.ListSandboxes(pb.ListSandboxesRequest(), timeout=5)
    assert [sb.sandbox_id for sb in listed.sandboxes] == [sandbox.sandbox_id] and not listed.next_page_token
    pwd = await run(stub, sandbox.sandbox_id, "pwd; echo $GREETING")
    assert pwd.stdout == b"/workspace\nhi\n"

    deleted = (await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sandbox.sandbox_id), timeout=10)).sandbox
    assert deleted.state == pb.SANDBOX_STATE_DELETED
    for call in (
        stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sandbox.sandbox_id), timeout=5),
        stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sandbox.sandbox_id), timeout=5),
        stub.StartExec(pb.StartExecRequest(sandbox_id=sandbox.sandbox_id, shell="true"), timeout=5),
    ):
        err = await rpc_error(call)
        assert err.code() is Code.NOT_FOUND and "deleted" in (err.details() or ""), err
    assert not (await stub.ListSandboxes(pb.ListSandboxesRequest(), timeout=5)).sandboxes


def bash_only_image(images_dir: Path, name: str) -> None:
    """An imported image (as `orchard image import` leaves one) holding bash and the libraries it loads, nothing
    else: no Python, no coreutils."""
    folder = images_dir / name
    rootfs = folder / "rootfs"
    bash = Path(shutil.which("bash") or "/bin/bash").resolve()
    libs = subprocess.run(["ldd", str(bash)], capture_output=True, text=True, check=True).stdout
    for path in [str(bash), *(word for word in libs.split() if word.startswith("/"))]:
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    (rootfs / "bin").mkdir(exist_ok=True)
    if not (rootfs / "bin" / "bash").exists():
        (rootfs / "bin" / "bash").symlink_to(bash)
    (rootfs / "workspace").mkdir()
    meta = {"name": name, "imported_from": "a test", "build_time": "2026-01-01T00:00:00+00:00", "size_bytes": 1}
    (folder / "image.json").write_text(json.dumps(meta))


async def test_an_image_without_python_runs_sandboxes(start_env: StartEnv, tmp_path: Path) -> None:
    """The agent is one static file bound in from the host (read-only): an image of bash alone, without
    /usr/bin/python3, runs commands, files and a terminal; the sandbox cannot change the agent."""
    bash_only_image(tmp_path / "images", "bash-only")
    env = await start_env(images_dir=tmp_path / "images")
    sandbox = await create(env.stub, image="bash-only")
    sid = sandbox.sandbox_id
    ex = await run(
        env.stub, sid, "echo $((6 * 7)); [ -e /usr/bin/python3 ] || echo no-python; echo x > /.orchard/agent"
    )
    assert ex.stdout == b"42\nno-python\n" and b"Read-only file system" in ex.stderr, ex
    await upload(env.stub, sid, "notes.txt", b"kept\n")
    assert b"".join((await download(env.stub, sid, "notes.txt"))[1]) == b"kept\n"
    async with env.manager.commands.open_pty(sid, ["bash", "-c", "echo on-a-tty; exit 3"], 24, 80, "", {}) as term:
        output = b"".join([event.data async for event in term])
    assert b"on-a-tty" in output and term.exit_code == 3


async def test_local_backend_without_the_agent_says_how_to_build_it(start_env: StartEnv, tmp_path: Path) -> None:
    """No agent binary: the service does not start, saying where it looked and how to build it."""
    with pytest.raises(FailedPrecondition, match="is not built: run scripts/build_agent.sh") as info:
        await start_env(agent_path=tmp_path / "no-such-agent")
    assert str(tmp_path / "no-such-agent") in info.value.message


async def test_create_is_idempotent_with_request_id(stub: Stub) -> None:
    """Creates with one request_id, concurrent or retried, give one and the same sandbox."""
    first = await asyncio.gather(*(create(stub, request_id="req-42") for _ in range(3)))
    retried = await create(stub, request_id="req-42")
    other = await create(stub, request_id="req-43")
    assert {sb.sandbox_id for sb in [*first, retried]} == {retried.sandbox_id}
    assert other.sandbox_id != retried.sandbox_id
    listed = await stub.ListSandboxes(pb.ListSandboxesRequest(), timeout=5)
    assert sorted(sb.sandbox_id for sb in listed.sandboxes) == sorted([retried.sandbox_id, other.sandbox_id])


async def test_caller_chosen_sandbox_id(stub: Stub) -> None:
    """A caller-chosen sandbox_id is used (also as hostname); creating it again is ALREADY_EXISTS."""
    sandbox = await create(stub, sandbox_id="my-box-1")
    assert sandbox.sandbox_id == "my-box-1" and sandbox.name == "sandboxes/my-box-1"
    assert (await run(stub, "my-box-1", "cat /proc/sys/kernel/hostname")).stdout == b"my-box-1\n"
    err = await rpc_error(create(stub, sandbox_id="my-box-1"))
    assert err.code() is Code.ALREADY_EXISTS and "my-box-1" in (err.details() or "")
    assert len((await stub.ListSandboxes(pb.ListSandboxesRequest(), timeout=5)).sandboxes) == 1


async def test_list_filters_by_labels_and_pages(stub: Stub) -> None:
    """ListSandboxes filters by every selector label and pages by id with tokens."""
    group_a = await asyncio.gather(*(create(stub, labels={"group": "a", "n": str(i)}) for i in range(5)))
    group_b = await asyncio.gather(*(create(stub, labels={"group": "b"}) for _ in range(2)))

    pages: list[list[str]] = []
    token = ""
    while True:
        response = await stub.ListSandboxes(
            pb.ListSandboxesRequest(label_selector={"group": "a"}, page_size=2, page_token=token), timeout=5
        )
        pages.append([sb.sandbox_id for sb in response.sandboxes])
        token = response.next_page_token
        if not token:
            break
    assert [len(page) for page in pages] == [2, 2, 1]
    assert [sid for page in pages for sid in page] == sorted(sb.sandbox_id for sb in group_a)

    async def ids(selector: dict[str, str]) -> list[str]:
        response = await stub.ListSandboxes(pb.ListSandboxesRequest(label_selector=selector), timeout=5)
        return [sb.sandbox_id for sb in response.sandboxes]

    assert await ids({"group": "b"}) == sorted(sb.sandbox_id for sb in group_b)
    assert await ids({"group": "a", "n": "3"}) == [group_a[3].sandbox_id]
    assert await ids({"group": "b", "n": "3"}) == []
    assert len(await ids({})) == 7


@pytest.mark.parametrize("token", ["not a token", "AAAA", "%%%%", "Tm90IEFuIElkIQ=="])
async def test_list_rejects_bad_page_token(stub: Stub, token: str) -> None:
    """A page_token the service did not issue is INVALID_ARGUMENT."""
    err = await rpc_error(stub.ListSandboxes(pb.ListSandboxesRequest(page_token=token), timeout=5))
    assert err.code() is Code.INVALID_ARGUMENT and "page_token" in (err.details() or "")


# ---- exec ----


async def test_exec_runs_in_start_order(stub: Stub, sandbox: pb.Sandbox) -> None:
    """Commands of one sandbox run one at a time, in the order they were started."""
    sid = sandbox.sandbox_id
    started = [
        await start(stub, sid, f"echo start-{i} >> order.txt; sleep 0.{5 - i}; echo end-{i} >> order.txt")
        for i in range(5)
    ]
    assert all(ex.state in (pb.EXEC_STATE_QUEUED, pb.EXEC_STATE_RUNNING) for ex in started)
    finished = [await wait(stub, ex.exec_id) for ex in started]
    assert all(ex.state == pb.EXEC_STATE_SUCCEEDED for ex in finished)
    content = (await run(stub, sid, "cat order.txt")).stdout.decode().split()
    assert content == [f"{edge}-{i}" for i in range(5) for edge in ("start", "end")]
    for earlier, later in zip(finished, finished[1:], strict=False):
        assert ts(later.start_time) >= ts(earlier.end_time)


@pytest.mark.timeout(60)
async def test_exec_runs_in_parallel_across_sandboxes(stub: Stub) -> None:
    """Commands in different sandboxes run concurrently: the three `sleep 2` were all running at one moment (by the
    service's own start and end times: a busy machine slows them, it cannot make them overlap)."""
    sandboxes = await asyncio.gather(*(create(stub) for _ in range(3)))
    results = await asyncio.gather(*(run(stub, sb.sandbox_id, "sleep 2") for sb in sandboxes))
    assert all(ex.state == pb.EXEC_STATE_SUCCEEDED for ex in results)
    assert max(ts(ex.start_time) for ex in results) < min(ts(ex.end_time) for ex in results)


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(f"{GRANDCHILD} & sleep 30", id="background"),
        pytest.param(f"setsid {GRANDCHILD} & sleep 30", id="setsid"),
        pytest.param(f"( setsid {GRANDCHILD} & ); sleep 30", id="setsid-orphan"),
        pytest.param(f"nohup {GRANDCHILD} >/dev/null 2>&1 & {GRANDCHILD} & sleep 30", id="nohup-and-background"),
    ],
)
async def test_timeout_kills_the_whole_tree(stub: Stub, sandbox: pb.Sandbox, command: str) -> None:
    """A command past its timeout is TIMED_OUT and every process it started is gone, even ones that left its session."""
    sid = sandbox.sandbox_id
    began = time.monotonic()
    ex = await run(stub, sid, command, timeout=1.0)
    assert time.monotonic() - began < 20  # ended by its timeout, not by its own `sleep 30`
    assert ex.state == pb.EXEC_STATE_TIMED_OUT and "timed out" in ex.error, ex
    assert ts(ex.timeout) == 1.0 and ts(ex.duration) >= 1.0
    assert (await run(stub, sid, "cat pids")).stdout.strip(), "the grandchildren never started"
    alive = await run(stub, sid, ["python3", "-c", ALIVE_CHECK])
    assert (alive.state, alive.stdout) == (pb.EXEC_STATE_SUCCEEDED, b"")


async def test_leftovers_of_a_finished_command_are_killed(stub: Stub, sandbox: pb.Sandbox) -> None:
    """Background processes a successful command leaves behind (even in their own session) die when it ends."""
    sid = sandbox.sandbox_id
    ex = await run(stub, sid, f"setsid {GRANDCHILD} & {GRANDCHILD} & sleep 0.3; echo done", timeout=10)
    assert (ex.state, ex.stdout) == (pb.EXEC_STATE_SUCCEEDED, b"done\n")
    assert len((await run(stub, sid, "cat pids")).stdout.split()) == 2
    assert (await run(stub, sid, ["python3", "-c", ALIVE_CHECK])).stdout == b""


@pytest.mark.parametrize("fd", [1, 2])
async def test_output_cap(stub: Stub, sandbox: pb.Sandbox, fd: int) -> None:
    """Output past max_output_bytes is dropped and reported; the total still counts every byte."""
    ex = await run(
        stub,
        sandbox.sandbox_id,
        f"head -c 1000000 /dev/zero | tr '\\0' x >&{fd}; echo tail >&{3 - fd}",
        max_output_bytes=1000,
    )
    capped, other = (ex.stdout, ex.stderr) if fd == 1 else (ex.stderr, ex.stdout)
    assert ex.state == pb.EXEC_STATE_SUCCEEDED
    assert capped == b"x" * 1000 and other == b"tail\n"
    assert (ex.stdout_truncated, ex.stderr_truncated) == (fd == 1, fd == 2)
    assert (ex.stdout_total_bytes, ex.stderr_total_bytes) == ((1000000, 5) if fd == 1 else (5, 1000000))


@pytest.mark.parametrize(
    ("command", "state", "code", "stdout", "stderr"),
    [
        ("echo out; echo err >&2", pb.EXEC_STATE_SUCCEEDED, 0, b"out\n", b"err\n"),
        ("echo partial; exit 3", pb.EXEC_STATE_FAILED, 3, b"partial\n", b""),
        ("kill -9 $$", pb.EXEC_STATE_FAILED, 137, b"", b""),
        ("no-such-program-xyz", pb.EXEC_STATE_FAILED, 127, b"", None),
    ],
)
async def test_exec_output_and_exit_codes(
    stub: Stub, sandbox: pb.Sandbox, command: str, state: int, code: int, stdout: bytes, stderr: bytes | None
) -> None:
    """stdout and stderr are kept apart; exit codes and signals give the right state and code."""
    ex = await run(stub, sandbox.sandbox_id, command)
    assert (ex.state, ex.exit_code, ex.stdout) == (state, code, stdout)
    if stderr is None:
        assert b"not found" in ex.stderr
    else:
        assert ex.stderr == stderr
    assert ex.command == command and ex.name == f"sandboxes/{sandbox.sandbox_id}/execs/{ex.exec_id}"
    assert ex.stdout_total_bytes == len(ex.stdout) and not ex.stdout_truncated


async def test_exec_times_and_duration(stub: Stub, sandbox: pb.Sandbox) -> None:
    """An exec reports create/start/end times, its duration and its timeout."""
    ex = await run(stub, sandbox.sandbox_id, "sleep 0.3", timeout=7)
    assert ts(ex.create_time) <= ts(ex.start_time) <= ts(ex.end_time)
    assert ts(ex.duration) == pytest.approx(ts(ex.end_time) - ts(ex.start_time), abs=1e-3)
    assert 0.3 <= ts(ex.duration) < 2 and ts(ex.timeout) == 7


@pytest.mark.parametrize(
    ("cmd", "wait_s", "state"), [("echo hi", 10, pb.EXEC_STATE_SUCCEEDED), ("sleep 2", 0.3, pb.EXEC_STATE_RUNNING)]
)
async def test_start_exec_can_wait(stub: Stub, sandbox: pb.Sandbox, cmd: str, wait_s: float, state: int) -> None:
    """StartExec with wait answers when the command ends, or when the wait passes with it still running."""
    began = time.monotonic()
    ex = (
        await stub.StartExec(
            pb.StartExecRequest(sandbox_id=sandbox.sandbox_id, shell=cmd, wait=duration(wait_s)), timeout=15
        )
    ).exec
    assert ex.state == state and time.monotonic() - began < wait_s + 1
    if state == pb.EXEC_STATE_SUCCEEDED:
        assert (ex.stdout, ex.exit_code) == (b"hi\n", 0)
    else:
        assert time.monotonic() - began >= wait_s - 0.05


async def test_wait_exec_returns_when_its_timeout_passes(stub: Stub, sandbox: pb.Sandbox) -> None:
    """WaitExec with a short timeout returns a running exec with done false; GetExec shows output so far."""
    ex = await start(stub, sandbox.sandbox_id, "echo early; sleep 30")
    began = time.monotonic()
    waited = await stub.WaitExec(pb.WaitExecRequest(exec_id=ex.exec_id, timeout=duration(0.5)), timeout=20)
    assert 0.45 < time.monotonic() - began < 15  # its own timeout, long before the command's end
    assert not waited.done and waited.exec.state == pb.EXEC_STATE_RUNNING and waited.exec.exit_code == -1
    got = (await stub.GetExec(pb.GetExecRequest(exec_id=ex.exec_id), timeout=5)).exec
    assert got.stdout == b"early\n" and got.state == pb.EXEC_STATE_RUNNING
    cancelled = (await stub.CancelExec(pb.CancelExecRequest(exec_id=ex.exec_id), timeout=20)).exec
    assert cancelled.state == pb.EXEC_STATE_CANCELLED


@pytest.mark.parametrize(
    ("stdin", "command", "expected"),
    [
        (bytes(range(256)) * 4, "cat", bytes(range(256)) * 4),
        (b"y" * (3 << 20), "wc -c", b"3145728\n"),
        (b"", "cat; echo eof", b"eof\n"),
        (b"line one\nline two\n", "head -n1", b"line one\n"),
    ],
)
async def test_exec_stdin(stub: Stub, sandbox: pb.Sandbox, stdin: bytes, command: str, expected: bytes) -> None:
    """stdin bytes reach the command and are closed after; no stdin reads as empty, never hangs."""
    ex = await run(stub, sandbox.sandbox_id, command, stdin=stdin, timeout=10)
    assert (ex.state, ex.stdout) == (pb.EXEC_STATE_SUCCEEDED, expected)


async def test_exec_env_and_cwd(start_env: StartEnv) -> None:
    """Commands get the sandbox env, their own env on top, and run in cwd (relative to the workdir)."""
    stub = (await start_env()).stub
    sid = (await create(stub, env={"FROM_SANDBOX": "s", "BOTH": "sandbox"}, workdir="/srv/work")).sandbox_id
    await run(stub, sid, "mkdir -p sub/dir")
    script = 'pwd; echo "$FROM_SANDBOX $FROM_EXEC $BOTH $ORCHARD_SANDBOX_ID"'
    for cwd, expected_dir in [
        ("", "/srv/work"),
        ("sub/dir", "/srv/work/sub/dir"),
        ("/tmp", "/tmp"),
        ("sub/../sub", "/srv/work/sub"),
    ]:
        ex = await run(stub, sid, script, cwd=cwd, env={"FROM_EXEC": "e", "BOTH": "exec"})
        assert ex.stdout.decode() == f"{expected_dir}\ns e exec {sid}\n", cwd
    missing = await run(stub, sid, "true", cwd="nowhere")
    assert missing.state == pb.EXEC_STATE_FAILED and "/srv/work/nowhere" in missing.error, missing


@pytest.mark.parametrize(("login", "expected"), [(True, b"login\n"), (False, b"plain\n")])
async def test_login_shell(stub: Stub, sandbox: pb.Sandbox, login: bool, expected: bytes) -> None:
    """login_shell runs the command under `bash -lc`."""
    ex = await run(stub, sandbox.sandbox_id, "shopt -q login_shell && echo login || echo plain", login_shell=login)
    assert ex.stdout.endswith(expected), ex


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["printf", "%s|", "a b", "it's", "$HOME"], b"a b|it's|$HOME|"),
        (
            ["printf", "%s|", "; echo injected", "$(id)", "`id`", "*", "a\nb", ""],
            b"; echo injected|$(id)|`id`|*|a\nb||",
        ),
        (["echo", "-n", '"double"', "back\\slash"], b'"double" back\\slash'),
    ],
)
async def test_argv_is_quoted_literally(stub: Stub, sandbox: pb.Sandbox, argv: list[str], expected: bytes) -> None:
    """argv arguments reach the program literally: no expansion, splitting or injection."""
    ex = await run(stub, sandbox.sandbox_id, argv)
    assert (ex.state, ex.stdout) == (pb.EXEC_STATE_SUCCEEDED, expected)


@pytest.mark.parametrize(
    ("argv", "state", "code", "stdout", "stderr"),
    [
        (["sh", "-c", "echo out; echo err >&2; exit 3"], pb.EXEC_STATE_FAILED, 3, b"out\n", b"err\n"),
        (["sh", "-c", "kill -9 $$"], pb.EXEC_STATE_FAILED, 137, b"", b""),
        # Nothing could start: bash's answer, as when every argv ran under bash -c.
        (["no-such-program-xyz", "a b"], pb.EXEC_STATE_FAILED, 127, b"", b"no-such-program-xyz: command not found\n"),
        (["/etc/passwd"], pb.EXEC_STATE_FAILED, 126, b"", b"/etc/passwd: Permission denied\n"),
        (["cd", "/tmp"], pb.EXEC_STATE_SUCCEEDED, 0, b"", b""),  # a bash builtin with no program of its name
    ],
)
async def test_argv_runs_without_a_shell(
    stub: Stub, sandbox: pb.Sandbox, argv: list[str], state: int, code: int, stdout: bytes, stderr: bytes
) -> None:
    """An argv runs as subprocess would run it (no bash in between); one that cannot start gets bash's answer."""
    ex = await run(stub, sandbox.sandbox_id, argv)
    assert (ex.state, ex.exit_code, ex.stdout, ex.error) == (state, code, stdout, "")
    assert ex.stderr.endswith(stderr), ex.stderr
    assert ex.command == shlex.join(argv)


async def test_argv_env_cwd_and_timeout(stub: Stub, sandbox: pb.Sandbox) -> None:
    """An argv gets the request's env and cwd (PATH looked up on the request's own); a timeout kills it."""
    ex = await run(stub, sandbox.sandbox_id, ["sh", "-c", 'echo "$GREETING $(pwd)"; ps -o comm= -p $PPID'],
                   env={"GREETING": "hi"}, cwd="/tmp")  # fmt: skip
    assert (ex.state, ex.stdout.split(b"\n")[0]) == (pb.EXEC_STATE_SUCCEEDED, b"hi /tmp"), ex
    assert b"bash" not in ex.stdout  # its parent is the agent, not a shell
    ex = await run(stub, sandbox.sandbox_id, ["true"], env={"PATH": "/nowhere"})  # no true, and no bash either
    assert (ex.exit_code, ex.error) == (127, "cannot start: No such file or directory: bash"), ex
    ex = await run(stub, sandbox.sandbox_id, ["true"], cwd="/no-such-dir")
    assert ex.state == pb.EXEC_STATE_FAILED and "No such file or directory: /no-such-dir" in ex.error
    began = time.monotonic()
    ex = await run(stub, sandbox.sandbox_id, ["sleep", "30"], timeout=0.5)
    assert (ex.state, ex.exit_code) == (pb.EXEC_STATE_TIMED_OUT, 137) and time.monotonic() - began < 10


async def test_stream_exec_yields_output_as_it_comes(stub: Stub, sandbox: pb.Sandbox) -> None:
    """StreamExec sends each chunk when it is written, then one exit event; a replay after the end is complete."""
    ex = await start(stub, sandbox.sandbox_id, "echo a; sleep 1; echo b >&2; echo c")
    began = time.monotonic()
    events: list[tuple[float, str, Any]] = []
    async for message in stub.StreamExec(pb.StreamExecRequest(exec_id=ex.exec_id), timeout=10):
        kind = message.WhichOneof("event")
        events.append((time.monotonic() - began, kind, getattr(message, kind)))
    first_at, kind, data = events[0]
    assert (kind, data) == ("stdout", b"a\n") and first_at < 0.8, events
    assert [(k, d) for _, k, d in events[:-1]] == [("stdout", b"a\n"), ("stderr", b"b\n"), ("stdout", b"c\n")]
    last_at, kind, exit_exec = events[-1]
    assert kind == "exit" and last_at >= 1.0
    assert exit_exec.state == pb.EXEC_STATE_SUCCEEDED and exit_exec.stdout == b"" and exit_exec.stdout_total_bytes == 4

    replay = [m.WhichOneof("event") async for m in stub.StreamExec(pb.StreamExecRequest(exec_id=ex.exec_id), timeout=5)]
    assert replay == ["stdout", "stderr", "stdout", "exit"]


async def test_cancel_running_exec_kills_its_tree(stub: Stub, sandbox: pb.Sandbox) -> None:
    """CancelExec of a running command ends it CANCELLED and kills every process it started."""
    sid = sandbox.sandbox_id
    ex = await start(stub, sid, f"setsid {GRANDCHILD} & {GRANDCHILD} & sleep 0.2; echo ready; sleep 30")
    stream = stub.StreamExec(pb.StreamExecRequest(exec_id=ex.exec_id), timeout=10)
    assert (await stream.read()).stdout == b"ready\n"
    began = time.monotonic()
    cancelled = (await stub.CancelExec(pb.CancelExecRequest(exec_id=ex.exec_id), timeout=20)).exec
    assert time.monotonic() - began < 15  # not the command's own `sleep 30`
    assert cancelled.state == pb.EXEC_STATE_CANCELLED and "cancel" in cancelled.error, cancelled
    stream.cancel()
    assert len((await run(stub, sid, "cat pids")).stdout.split()) == 2
    assert (await run(stub, sid, ["python3", "-c", ALIVE_CHECK])).stdout == b""


async def test_cancel_right_after_start(stub: Stub, sandbox: pb.Sandbox) -> None:
    """CancelExec sent right after StartExec cancels the command, whether it had started or not."""
    for _ in range(5):
        ex = await start(stub, sandbox.sandbox_id, "sleep 30")
        cancelled = (await stub.CancelExec(pb.CancelExecRequest(exec_id=ex.exec_id), timeout=10)).exec
        assert cancelled.state == pb.EXEC_STATE_CANCELLED, cancelled
    assert (await run(stub, sandbox.sandbox_id, "echo ok")).stdout == b"ok\n"


async def test_cancel_queued_exec_never_runs(stub: Stub, sandbox: pb.Sandbox) -> None:
    """A queued command that is cancelled ends CANCELLED and never runs; cancelling a finished one changes nothing."""
    sid = sandbox.sandbox_id
    first = await start(stub, sid, "sleep 1")
    queued = await start(stub, sid, "touch ran")
    assert queued.state == pb.EXEC_STATE_QUEUED
    cancelled = (await stub.CancelExec(pb.CancelExecRequest(exec_id=queued.exec_id), timeout=5)).exec
    assert cancelled.state == pb.EXEC_STATE_CANCELLED and "before it started" in cancelled.error
    assert not cancelled.HasField("start_time")
    assert (await wait(stub, first.exec_id)).state == pb.EXEC_STATE_SUCCEEDED
    assert (await run(stub, sid, "test -e ran")).exit_code == 1
    done = (await stub.CancelExec(pb.CancelExecRequest(exec_id=first.exec_id), timeout=5)).exec
    assert done.state == pb.EXEC_STATE_SUCCEEDED


# ---- patches ----

REPO_SETUP = """
set -e
git init -q repo && cd repo
printf 'one\\ntwo\\nthree\\n' > a.txt
mkdir -p pkg && printf 'x = 1\\n' > pkg/b.py
git add . && git -c user.email=t@example.com -c user.name=t commit -qm init
sed -i s/two/TWO/ a.txt
printf 'y = 2\\n' >> pkg/b.py
printf 'new\\n' > c.txt && git add -N c.txt
git diff
git reset -q --hard && git clean -fdq
"""


async def test_apply_patch_from_git_diff(stub: Stub, sandbox: pb.Sandbox) -> None:
    """A patch made by `git diff` applies: files change, new ones appear, and the touched files are listed."""
    sid = sandbox.sandbox_id
    made = await run(stub, sid, REPO_SETUP)
    assert made.state == pb.EXEC_STATE_SUCCEEDED, made.stderr
    patch = made.stdout.decode()
    assert (await run(stub, sid, "cat repo/a.txt; ls repo")).stdout == b"one\ntwo\nthree\na.txt\npkg\n"

    applied = await stub.ApplyPatch(pb.ApplyPatchRequest(sandbox_id=sid, patch=patch, cwd="repo"), timeout=30)
    assert sorted(applied.files) == ["a.txt", "c.txt", "pkg/b.py"]
    for path, content in [
        ("repo/a.txt", b"one\nTWO\nthree\n"),
        ("repo/pkg/b.py", b"x = 1\ny = 2\n"),
        ("repo/c.txt", b"new\n"),
    ]:
        assert b"".join((await download(stub, sid, path))[1]) == content
    status = await run(stub, sid, "git status --porcelain", cwd="repo")
    assert status.stdout.decode().split("\n")[:2] == [" M a.txt", " M pkg/b.py"]


A_PATCH = """\
diff --git a/a.txt b/a.txt
--- a/a.txt
+++ b/a.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
"""
B_BAD_PATCH = """\
diff --git a/b.txt b/b.txt
--- a/b.txt
+++ b/b.txt
@@ -1,2 +1,2 @@
 alpha
-not in the file
+NEW
"""
MISSING_FILE_PATCH = """\
diff --git a/missing.txt b/missing.txt
--- a/missing.txt
+++ b/missing.txt
@@ -1 +1 @@
-old
+new
"""


@pytest.mark.parametrize(
    "patch",
    [
        pytest.param(B_BAD_PATCH, id="hunk-mismatch"),
        pytest.param(A_PATCH + B_BAD_PATCH, id="second-file-fails"),
        pytest.param(A_PATCH + MISSING_FILE_PATCH, id="missing-file"),
        pytest.param("this is not a patch\n", id="not-a-patch"),
    ],
)
async def test_rejected_patch_changes_nothing(stub: Stub, sandbox: pb.Sandbox, patch: str) -> None:
    """A patch that does not apply is FAILED_PRECONDITION and every file stays byte for byte the same."""
    sid = sandbox.sandbox_id
    files = {"a.txt": b"one\ntwo\nthree\n", "b.txt": b"alpha\nbeta\n"}
    for name, content in files.items():
        await upload(stub, sid, name, content)
    err = await rpc_error(stub.ApplyPatch(pb.ApplyPatchRequest(sandbox_id=sid, patch=patch), timeout=30))
    assert err.code() is Code.FAILED_PRECONDITION and "does not apply" in (err.details() or ""), err
    for name, content in files.items():
        assert b"".join((await download(stub, sid, name))[1]) == content
    listed = await stub.ListFiles(pb.ListFilesRequest(sandbox_id=sid), timeout=5)
    assert [f.name for f in listed.files] == ["a.txt", "b.txt"]


# ---- files ----


async def test_upload_download_binary_and_nested(stub: Stub, sandbox: pb.Sandbox) -> None:
    """Every byte value survives a round trip; parent folders are created; mode is kept; commands see the file."""
    sid = sandbox.sandbox_id
    data = bytes(range(256)) * 3
    uploaded = await upload(stub, sid, "deep/nested/dir/all.bin", data, chunk=100)
    assert (uploaded.path, uploaded.size_bytes) == ("/workspace/deep/nested/dir/all.bin", len(data))
    info, chunks = await download(stub, sid, "/workspace/deep/nested/dir/all.bin")
    assert b"".join(chunks) == data
    assert (info.name, info.path, info.type, info.size_bytes, info.mode) == (
        "all.bin",
        "/workspace/deep/nested/dir/all.bin",
        pb.FILE_TYPE_FILE,
        len(data),
        0o644,
    )
    assert abs(ts(info.modify_time) - time.time()) < 60
    check = await run(stub, sid, "sha256sum deep/nested/dir/all.bin")
    assert check.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()

    script = await upload(stub, sid, "/opt/tool/run.sh", b"#!/bin/sh\necho tool\n", mode=0o755)
    assert script.path == "/opt/tool/run.sh"
    assert (await run(stub, sid, "/opt/tool/run.sh")).stdout == b"tool\n"
    await upload(stub, sid, "/opt/tool/run.sh", b"")  # overwrite with an empty file
    info, chunks = await download(stub, sid, "/opt/tool/run.sh")
    assert (info.size_bytes, chunks, info.mode) == (0, [], 0o644)


@pytest.mark.timeout(60)
async def test_large_file_round_trip(stub: Stub, sandbox: pb.Sandbox) -> None:
    """A 10 MB random file uploads and downloads in several streamed chunks with an equal sha256."""
    sid = sandbox.sandbox_id
    data = os.urandom(10 << 20)
    assert (await upload(stub, sid, "big.bin", data, chunk=300_000)).size_bytes == len(data)
    info, chunks = await download(stub, sid, "big.bin")
    assert info.size_bytes == len(data) and len(chunks) >= 10
    assert hashlib.sha256(b"".join(chunks)).hexdigest() == hashlib.sha256(data).hexdigest()
    check = await run(stub, sid, "sha256sum big.bin; ls -A")
    assert check.stdout.decode().split() == [hashlib.sha256(data).hexdigest(), "big.bin", "big.bin"]


async def test_list_files(stub: Stub, sandbox: pb.Sandbox) -> None:
    """ListFiles gives every entry by name with its type, size and absolute path."""
    sid = sandbox.sandbox_id
    await upload(stub, sid, "dir/b.txt", b"12345")
    await run(stub, sid, "mkdir dir/sub && ln -s b.txt dir/a-link && mkfifo dir/fifo")
    listed = await stub.ListFiles(pb.ListFilesRequest(sandbox_id=sid, path="dir"), timeout=5)
    assert listed.path == "/workspace/dir"
    assert [(f.name, f.path, f.type) for f in listed.files] == [
        ("a-link", "/workspace/dir/a-link", pb.FILE_TYPE_SYMLINK),
        ("b.txt", "/workspace/dir/b.txt", pb.FILE_TYPE_FILE),
        ("fifo", "/workspace/dir/fifo", pb.FILE_TYPE_UNSPECIFIED),
        ("sub", "/workspace/dir/sub", pb.FILE_TYPE_DIRECTORY),
    ]
    assert listed.files[1].size_bytes == 5
    workdir = await stub.ListFiles(pb.ListFilesRequest(sandbox_id=sid), timeout=5)
    assert workdir.path == "/workspace" and [f.name for f in workdir.files] == ["dir"]


@pytest.mark.parametrize(
    ("call", "code"),
    [
        pytest.param("download:dir", Code.FAILED_PRECONDITION, id="download-directory"),
        pytest.param("download:missing.txt", Code.NOT_FOUND, id="download-missing"),
        pytest.param("list:missing", Code.NOT_FOUND, id="list-missing"),
        pytest.param("list:dir/file.txt", Code.FAILED_PRECONDITION, id="list-a-file"),
        pytest.param("upload:dir", Code.FAILED_PRECONDITION, id="upload-over-directory"),
        pytest.param("upload:dir/file.txt/below", Code.FAILED_PRECONDITION, id="upload-below-a-file"),
    ],
)
async def test_file_errors(stub: Stub, sandbox: pb.Sandbox, call: str, code: grpc.StatusCode) -> None:
    """File calls on the wrong kind of path, or a missing one, get a precise status and a message naming it."""
    sid = sandbox.sandbox_id
    await upload(stub, sid, "dir/file.txt", b"content")
    op, path = call.split(":")
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "download": lambda: download(stub, sid, path),
        "list": lambda: stub.ListFiles(pb.ListFilesRequest(sandbox_id=sid, path=path), timeout=5),
        "upload": lambda: upload(stub, sid, path, b"data"),
    }
    err = await rpc_error(calls[op]())
    assert err.code() is code and path.split("/")[0] in (err.details() or ""), err
    assert b"".join((await download(stub, sid, "dir/file.txt"))[1]) == b"content"
    leftovers = await run(stub, sid, "find . -mindepth 1")
    assert sorted(leftovers.stdout.decode().split()) == ["./dir", "./dir/file.txt"]


@pytest.mark.parametrize("ending", ["second-header", "client-gone"])
async def test_broken_upload_leaves_nothing(stub: Stub, sandbox: pb.Sandbox, ending: str) -> None:
    """An upload whose stream breaks after content was sent leaves neither the file nor a partial one."""
    sid = sandbox.sandbox_id
    header = pb.UploadFileRequest(header=pb.FileHeader(sandbox_id=sid, path="sub/big.bin"))
    sent = asyncio.Event()

    async def requests() -> AsyncIterator[pb.UploadFileRequest]:
        yield header
        yield pb.UploadFileRequest(chunk=b"z" * (3 << 20))
        sent.set()
        if ending == "second-header":
            yield header
        else:
            await asyncio.sleep(30)

    call = stub.UploadFile(requests(), timeout=10)
    if ending == "client-gone":
        await sent.wait()
        await asyncio.sleep(0.3)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    else:
        err = await rpc_error(call)
        assert err.code() is Code.INVALID_ARGUMENT and "chunk" in (err.details() or "")
    for _ in range(50):
        left = (await run(stub, sid, "find /workspace -type f")).stdout
        if not left:
            break
        await asyncio.sleep(0.05)
    assert left == b""


# ---- isolation ----


async def test_no_connection_to_host_loopback(stub: Stub, sandbox: pb.Sandbox) -> None:
    """A listener on the host's 127.0.0.1 is unreachable from a sandbox, and so is any other address."""
    connections: list[object] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer.get_extra_info("peername"))
        writer.close()

    listener = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        for host, expected in [
            ("127.0.0.1", {"ECONNREFUSED"}),
            ("1.1.1.1", {"ENETUNREACH"}),
            ("10.0.0.1", {"ENETUNREACH"}),
        ]:
            ex = await run(stub, sandbox.sandbox_id, ["python3", "-c", CONNECT, host, str(port)], timeout=10)
            assert ex.stdout.decode().strip() in expected, (host, ex)
    finally:
        listener.close()
        await listener.wait_closed()
    assert connections == []


async def test_only_loopback_interface(stub: Stub, sandbox: pb.Sandbox) -> None:
    """The sandbox's network namespace has no interface but lo."""
    ex = await run(stub, sandbox.sandbox_id, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert ex.stdout == b"lo\n"


async def test_sandbox_cannot_change_host_files(stub: Stub, sandbox: pb.Sandbox, tmp_path: Path) -> None:
    """Writes inside a sandbox never reach the host's root, and the host's /tmp is hidden from it."""
    sid = sandbox.sandbox_id
    token = uuid.uuid4().hex
    host_etc = Path(f"/etc/orchard-test-{token}")
    host_file = Path(f"/var/tmp/orchard-test-{token}")
    host_file.write_text("host content\n")
    host_tmp = tmp_path / "host-secret"
    host_tmp.write_text("secret\n")
    try:
        script = (
            f"echo sandbox > {host_etc} && cat {host_file} && echo changed > {host_file} && "
            f"rm -f /etc/hostname.orchard-nonexistent && test ! -e {host_tmp} && echo ok"
        )
        ex = await run(stub, sid, script)
        assert (ex.state, ex.stdout) == (pb.EXEC_STATE_SUCCEEDED, b"host content\nok\n"), ex
        remove = await run(stub, sid, f"rm {host_file} && test ! -e {host_file} && cat {host_etc}")
        assert (remove.state, remove.stdout) == (pb.EXEC_STATE_SUCCEEDED, b"sandbox\n")
        assert not host_etc.exists()
        assert host_file.read_text() == "host content\n"
        err = await rpc_error(download(stub, sid, str(host_tmp)))
        assert err.code() is Code.NOT_FOUND
    finally:
        host_file.unlink(missing_ok=True)
        host_etc.unlink(missing_ok=True)


async def test_sandboxes_do_not_see_each_other(stub: Stub) -> None:
    """Two sandboxes see neither each other's /workspace and /tmp nor each other's processes."""
    first, second = await asyncio.gather(create(stub), create(stub))
    await run(stub, first.sandbox_id, "echo mine > /workspace/secret && echo mine > /tmp/secret")
    ex = await start(stub, first.sandbox_id, "exec -a orchard-marker-first sleep 30")
    try:
        look = await run(
            stub,
            second.sandbox_id,
            "ls -A /workspace; find /tmp -name secret; grep -l 'orchard-[m]arker' /proc/[0-9]*/cmdline; true",
        )
        assert look.stdout == b"", look
    finally:
        await stub.CancelExec(pb.CancelExecRequest(exec_id=ex.exec_id), timeout=5)


async def test_delete_kills_every_process(env: EnvServer) -> None:
    """After DeleteSandbox no process of the sandbox is alive on the host and its folder is gone; its mount goes
    in the background (an overlay's unmount syncs its files, which DeleteSandbox does not wait for) within seconds."""
    stub = env.stub
    sid = (await create(stub)).sandbox_id
    marker = f"orchard-marker-{uuid.uuid4().hex}"
    ex = await start(stub, sid, f"setsid bash -c 'exec -a {marker} sleep 1000' & exec -a {marker} sleep 1000")
    deadline = time.monotonic() + 5
    while len(pids := host_pids(sid)) < 5 and time.monotonic() < deadline:  # bwrap x2, agent, two sleeps
        await asyncio.sleep(0.05)
    assert len(pids) >= 5, pids
    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), timeout=10)
    assert [pid for pid in pids if host_alive(pid)] == []
    assert not (env.settings.state_dir / "sandboxes" / sid).exists()
    deadline = time.monotonic() + 30
    while sid in (mounts := Path("/proc/mounts").read_text()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert sid not in mounts, "the deleted sandbox's mount is still there after 30 s"
    final = (await stub.GetExec(pb.GetExecRequest(exec_id=ex.exec_id), timeout=5)).exec
    assert final.state == pb.EXEC_STATE_CANCELLED and "deleted" in final.error, final


async def test_agent_death_fails_the_sandbox(stub: Stub, sandbox: pb.Sandbox) -> None:
    """When a command kills the sandbox's agent the exec fails, the sandbox turns FAILED, and delete still works."""
    sid = sandbox.sandbox_id
    ex = await run(stub, sid, "kill -9 $PPID; sleep 5", timeout=10)
    assert ex.state == pb.EXEC_STATE_FAILED and ex.error, ex
    got = (await stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sid), timeout=5)).sandbox
    assert got.state == pb.SANDBOX_STATE_FAILED and got.failure_reason
    err = await rpc_error(start(stub, sid, "true"))
    assert err.code() is Code.FAILED_PRECONDITION and "failed" in (err.details() or "")
    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), timeout=10)


# ---- leases ----


async def test_ttl_expiry(start_env: StartEnv) -> None:
    """A sandbox past its ttl is deleted by the sweeper: its command is cancelled and GetSandbox says why."""
    stub = (await start_env(sweep_interval_s=0.2)).stub
    sandbox = await create(stub, ttl=duration(1))
    assert ts(sandbox.expire_time) == pytest.approx(ts(sandbox.create_time) + 1, abs=1e-3)
    ex = await start(stub, sandbox.sandbox_id, "sleep 30")
    final = await wait(stub, ex.exec_id)
    assert final.state == pb.EXEC_STATE_CANCELLED and "ttl" in final.error, final
    while True:  # DELETING for as long as its processes and files take to go
        try:
            got = await stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sandbox.sandbox_id), timeout=5)
        except grpc.aio.AioRpcError as err:
            assert err.code() is Code.NOT_FOUND and "ttl 1s" in (err.details() or ""), err
            break
        assert got.sandbox.state == pb.SANDBOX_STATE_DELETING
        await asyncio.sleep(0.02)
    assert time.time() - ts(sandbox.create_time) < 15  # reaped at its ttl (1 s), not left alive


async def test_heartbeat_extends_and_its_absence_reaps(start_env: StartEnv) -> None:
    """Heartbeats keep a sandbox with a heartbeat_timeout alive; once they stop it is deleted."""
    stub = (await start_env(sweep_interval_s=0.2)).stub
    sandbox = await create(stub, heartbeat_timeout=duration(2))  # 5x the beat interval: room on a busy machine
    sid = sandbox.sandbox_id
    assert ts(sandbox.heartbeat_timeout) == 2
    assert ts(sandbox.expire_time) == pytest.approx(ts(sandbox.last_heartbeat_time) + 2, abs=1e-3)
    for _ in range(10):  # 4 s of beats: twice the timeout
        await asyncio.sleep(0.4)
        beat = (await stub.Heartbeat(pb.HeartbeatRequest(sandbox_id=sid), timeout=5)).sandbox
    assert beat.state == pb.SANDBOX_STATE_READY
    assert ts(beat.expire_time) > ts(sandbox.expire_time) + 1.5
    assert ts(beat.expire_time) == pytest.approx(ts(beat.last_heartbeat_time) + 2, abs=1e-3)
    began = time.monotonic()
    while time.monotonic() - began < 15:
        try:
            await stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sid), timeout=5)
        except grpc.aio.AioRpcError as err:
            assert err.code() is Code.NOT_FOUND and "heartbeat" in (err.details() or ""), err
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the sandbox outlived its heartbeat timeout")
    assert 1.0 < time.monotonic() - began < 15  # not before its timeout (2 s after the last beat), nor never


# ---- bad input ----

BadCall = Callable[[Stub, str], Awaitable[Any]]


async def _upload_without_header(stub: Stub, sid: str) -> Any:
    async def requests() -> AsyncIterator[pb.UploadFileRequest]:
        yield pb.UploadFileRequest(chunk=b"data")

    return await stub.UploadFile(requests(), timeout=5)


async def _upload_two_headers(stub: Stub, sid: str) -> Any:
    async def requests() -> AsyncIterator[pb.UploadFileRequest]:
        header = pb.FileHeader(sandbox_id=sid, path="x.txt")
        yield pb.UploadFileRequest(header=header)
        yield pb.UploadFileRequest(header=header)

    return await stub.UploadFile(requests(), timeout=5)


async def _empty_upload_stream(stub: Stub, sid: str) -> Any:
    async def requests() -> AsyncIterator[pb.UploadFileRequest]:
        return
        yield

    return await stub.UploadFile(requests(), timeout=5)


def _exec(**fields: Any) -> BadCall:
    def call(stub: Stub, sid: str) -> Awaitable[Any]:
        request = {"sandbox_id": sid, "shell": "true", **fields}
        return stub.StartExec(pb.StartExecRequest(**{k: v for k, v in request.items() if v is not None}), timeout=5)

    return call


def _create(**fields: Any) -> BadCall:
    return lambda stub, sid: stub.CreateSandbox(pb.CreateSandboxRequest(**{"image": "host", **fields}), timeout=5)


BAD_CALLS: list[Any] = [
    pytest.param(_create(image=""), Code.INVALID_ARGUMENT, "image", id="create-empty-image"),
    pytest.param(_create(image="ubuntu:99"), Code.INVALID_ARGUMENT, "unknown image", id="create-unknown-image"),
    pytest.param(_create(sandbox_id="Bad_ID!"), Code.INVALID_ARGUMENT, "sandbox_id", id="create-bad-id"),
    pytest.param(_create(sandbox_id="x" * 64), Code.INVALID_ARGUMENT, "sandbox_id", id="create-long-id"),
    pytest.param(_create(ttl=duration(-1)), Code.INVALID_ARGUMENT, "ttl", id="create-negative-ttl"),
    pytest.param(_create(ttl=duration(1e9)), Code.INVALID_ARGUMENT, "ttl", id="create-huge-ttl"),
    pytest.param(_create(heartbeat_timeout=duration(-1)), Code.INVALID_ARGUMENT, "heartbeat", id="create-neg-hb"),
    pytest.param(_create(workdir="relative"), Code.INVALID_ARGUMENT, "workdir", id="create-relative-workdir"),
    pytest.param(_create(env={"A=B": "1"}), Code.INVALID_ARGUMENT, "A=B", id="create-bad-env-key"),
    pytest.param(_create(env={"A": "nul\0byte"}), Code.INVALID_ARGUMENT, "NUL", id="create-nul-env-value"),
    pytest.param(_create(resources=pb.Resources(pids=-1)), Code.INVALID_ARGUMENT, "resources", id="create-neg-res"),
    pytest.param(
        _create(resources=pb.Resources(pids=5_000_000)),
        Code.INVALID_ARGUMENT,
        "pid_max",
        id="create-limits-beyond-machine",
    ),
    pytest.param(
        _create(network_policy=pb.NetworkPolicy(allow=[pb.EgressRule(cidr="169.254.0.0/33")])),
        Code.INVALID_ARGUMENT,
        "cidr",
        id="create-bad-egress-rule",
    ),
    pytest.param(_create(kind=pb.SANDBOX_KIND_BROWSER), Code.INVALID_ARGUMENT, "image", id="create-browser-image"),
    pytest.param(_create(kind=7), Code.INVALID_ARGUMENT, "kind", id="create-unknown-kind"),
    pytest.param(
        lambda stub, sid: stub.GetSandbox(pb.GetSandboxRequest(sandbox_id="sb-nope"), timeout=5),
        Code.NOT_FOUND,
        "sb-nope",
        id="get-unknown",
    ),
    pytest.param(
        lambda stub, sid: stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id="sb-nope"), timeout=5),
        Code.NOT_FOUND,
        "sb-nope",
        id="delete-unknown",
    ),
    pytest.param(
        lambda stub, sid: stub.Heartbeat(pb.HeartbeatRequest(sandbox_id="sb-nope"), timeout=5),
        Code.NOT_FOUND,
        "sb-nope",
        id="heartbeat-unknown",
    ),
    pytest.param(
        lambda stub, sid: stub.ListSandboxes(pb.ListSandboxesRequest(page_size=-1), timeout=5),
        Code.INVALID_ARGUMENT,
        "page_size",
        id="list-negative-page-size",
    ),
    pytest.param(_exec(shell=""), Code.INVALID_ARGUMENT, "command", id="exec-no-command"),
    pytest.param(
        lambda stub, sid: stub.StartExec(pb.StartExecRequest(sandbox_id=sid), timeout=5),
        Code.INVALID_ARGUMENT,
        "command",
        id="exec-unset-command",
    ),
    pytest.param(_exec(shell=None, argv=pb.ArgvCommand()), Code.INVALID_ARGUMENT, "argv", id="exec-empty-argv"),
    pytest.param(_exec(sandbox_id="sb-nope"), Code.NOT_FOUND, "sb-nope", id="exec-unknown-sandbox"),
    pytest.param(_exec(timeout=duration(-1)), Code.INVALID_ARGUMENT, "timeout", id="exec-negative-timeout"),
    pytest.param(_exec(timeout=duration(1e9)), Code.INVALID_ARGUMENT, "timeout", id="exec-huge-timeout"),
    pytest.param(_exec(max_output_bytes=-5), Code.INVALID_ARGUMENT, "max_output_bytes", id="exec-negative-cap"),
    pytest.param(_exec(env={"A=B": "1"}), Code.INVALID_ARGUMENT, "A=B", id="exec-bad-env-key"),
    pytest.param(_exec(env={"A": "nul\0byte"}), Code.INVALID_ARGUMENT, "NUL", id="exec-nul-env-value"),
    pytest.param(_exec(shell="echo \0"), Code.INVALID_ARGUMENT, "NUL", id="exec-nul-command"),
    pytest.param(_exec(cwd="a\0b"), Code.INVALID_ARGUMENT, "NUL", id="exec-nul-cwd"),
    pytest.param(
        lambda stub, sid: stub.GetExec(pb.GetExecRequest(exec_id="ex-nope"), timeout=5),
        Code.NOT_FOUND,
        "ex-nope",
        id="get-exec-unknown",
    ),
    pytest.param(
        lambda stub, sid: stub.WaitExec(pb.WaitExecRequest(exec_id="ex-nope"), timeout=5),
        Code.NOT_FOUND,
        "ex-nope",
        id="wait-exec-unknown",
    ),
    pytest.param(
        lambda stub, sid: stub.CancelExec(pb.CancelExecRequest(exec_id="ex-nope"), timeout=5),
        Code.NOT_FOUND,
        "ex-nope",
        id="cancel-exec-unknown",
    ),
    pytest.param(
        lambda stub, sid: stub.StreamExec(pb.StreamExecRequest(exec_id="ex-nope"), timeout=5).read(),
        Code.NOT_FOUND,
        "ex-nope",
        id="stream-exec-unknown",
    ),
    pytest.param(
        lambda stub, sid: stub.ApplyPatch(pb.ApplyPatchRequest(sandbox_id=sid, patch=" \n"), timeout=5),
        Code.INVALID_ARGUMENT,
        "patch",
        id="patch-empty",
    ),
    pytest.param(
        lambda stub, sid: stub.ApplyPatch(pb.ApplyPatchRequest(sandbox_id="sb-nope", patch=A_PATCH), timeout=5),
        Code.NOT_FOUND,
        "sb-nope",
        id="patch-unknown-sandbox",
    ),
    pytest.param(_upload_without_header, Code.INVALID_ARGUMENT, "header", id="upload-without-header"),
    pytest.param(_upload_two_headers, Code.INVALID_ARGUMENT, "chunk", id="upload-two-headers"),
    pytest.param(_empty_upload_stream, Code.INVALID_ARGUMENT, "header", id="upload-empty-stream"),
    pytest.param(lambda stub, sid: upload(stub, sid, "", b"x"), Code.INVALID_ARGUMENT, "path", id="upload-no-path"),
    pytest.param(
        lambda stub, sid: upload(stub, sid, "f", b"x", mode=0o17777),
        Code.INVALID_ARGUMENT,
        "mode",
        id="upload-bad-mode",
    ),
    pytest.param(lambda stub, sid: upload(stub, sid, "/", b"x"), Code.INVALID_ARGUMENT, "path", id="upload-root"),
    pytest.param(lambda stub, sid: download(stub, sid, "a\0b"), Code.INVALID_ARGUMENT, "NUL", id="download-nul"),
    pytest.param(lambda stub, sid: download(stub, "sb-nope", "x"), Code.NOT_FOUND, "sb-nope", id="download-unknown"),
    pytest.param(
        lambda stub, sid: stub.WaitExec(pb.WaitExecRequest(exec_id="ex-nope", timeout=duration(-1)), timeout=5),
        Code.INVALID_ARGUMENT,
        "timeout",
        id="wait-neg-timeout",
    ),
    pytest.param(
        lambda stub, sid: stub.SetNetworkPolicy(
            pb.SetNetworkPolicyRequest(
                sandbox_id=sid, network_policy=pb.NetworkPolicy(allow=[pb.EgressRule(cidr="169.254.0.2/32")])
            ),
            timeout=5,
        ),
        Code.FAILED_PRECONDITION,
        "network policy",
        id="set-network-policy-without-one",
    ),
    pytest.param(
        lambda stub, sid: stub.Screenshot(pb.ScreenshotRequest(sandbox_id=sid), timeout=5),
        Code.FAILED_PRECONDITION,
        "browser sandbox",
        id="screenshot",
    ),
    pytest.param(
        lambda stub, sid: stub.Act(pb.ActRequest(sandbox_id=sid), timeout=5),
        Code.FAILED_PRECONDITION,
        "browser sandbox",
        id="act",
    ),
    pytest.param(
        lambda stub, sid: stub.GetPageContent(pb.GetPageContentRequest(sandbox_id=sid), timeout=5),
        Code.FAILED_PRECONDITION,
        "browser sandbox",
        id="get-page-content",
    ),
    pytest.param(
        lambda stub, sid: stub.OpenPty(iter([pb.OpenPtyRequest(input=b"ls\n")]), timeout=5).read(),
        Code.INVALID_ARGUMENT,
        "start",
        id="open-pty-without-start",
    ),
]


@pytest.mark.parametrize(("call", "code", "fragment"), BAD_CALLS)
async def test_bad_input_gets_a_clear_status(
    stub: Stub, sandbox: pb.Sandbox, call: BadCall, code: grpc.StatusCode, fragment: str
) -> None:
    """Bad input gets its precise status code and a message naming the problem; the service keeps working."""
    err = await rpc_error(call(stub, sandbox.sandbox_id))
    assert err.code() is code, err
    assert fragment.lower() in (err.details() or "").lower(), err
    ex = await run(stub, sandbox.sandbox_id, "echo still fine")
    assert (ex.state, ex.stdout) == (pb.EXEC_STATE_SUCCEEDED, b"still fine\n")
    listed = await stub.ListSandboxes(pb.ListSandboxesRequest(), timeout=5)
    assert [sb.sandbox_id for sb in listed.sandboxes] == [sandbox.sandbox_id]


async def test_image_not_built(start_env: StartEnv, tmp_path: Path) -> None:
    """A known image that is not built here is FAILED_PRECONDITION saying how to build it, and leaves nothing."""
    env = await start_env(images_dir=tmp_path / "empty")
    err = await rpc_error(create(env.stub, image="python:3.11-slim"))
    assert err.code() is Code.FAILED_PRECONDITION, err
    assert "orchard image build python:3.11-slim" in (err.details() or ""), err
    assert not (await env.stub.ListSandboxes(pb.ListSandboxesRequest(), timeout=5)).sandboxes
    assert (await create(env.stub)).state == pb.SANDBOX_STATE_READY


# ---- scale ----


@pytest.mark.timeout(90)
async def test_many_sandboxes(env: EnvServer) -> None:
    """Twenty sandboxes created concurrently each run a command and are all deleted."""
    stub = env.stub
    sandboxes = await asyncio.gather(*(create(stub, labels={"batch": "many"}) for _ in range(20)))
    assert len({sb.sandbox_id for sb in sandboxes}) == 20
    try:
        results = await asyncio.gather(*(run(stub, sb.sandbox_id, "echo $ORCHARD_SANDBOX_ID") for sb in sandboxes))
        assert [ex.stdout.decode().strip() for ex in results] == [sb.sandbox_id for sb in sandboxes]
    finally:
        await asyncio.gather(*(delete_quietly(stub, sb.sandbox_id) for sb in sandboxes))
    assert not (await stub.ListSandboxes(pb.ListSandboxesRequest(), timeout=5)).sandboxes
    assert list((env.settings.state_dir / "sandboxes").iterdir()) == []


def _retry_after(err: grpc.aio.AioRpcError) -> float | None:
    return from_rpc_error(err).retry_after


async def test_sandbox_limit_refuses_with_retry_info(start_env: StartEnv) -> None:
    """Past max_sandboxes a create is refused with RESOURCE_EXHAUSTED and retry info, and works again after a delete."""
    env = await start_env(max_sandboxes=2)
    first, _ = await create(env.stub), await create(env.stub)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await create(env.stub)
    assert info.value.code() is Code.RESOURCE_EXHAUSTED and "2 sandboxes" in info.value.details()
    retry_after = _retry_after(info.value)
    assert retry_after is not None and retry_after > 0
    await delete_quietly(env.stub, first.sandbox_id)
    await create(env.stub)


async def test_exec_queue_limit(start_env: StartEnv) -> None:
    """Past max_queued_execs StartExec is refused with retry info; the queue frees up as commands start or are
    cancelled, so the service never stalls silently."""
    env = await start_env(max_queued_execs=2, max_concurrent_execs=1)
    sb = await create(env.stub)
    blocker = await start(env.stub, sb.sandbox_id, "sleep 30")
    await asyncio.sleep(0.2)  # running now: it holds the only slot
    queued = [await start(env.stub, sb.sandbox_id, "echo queued") for _ in range(2)]
    assert all(q.state == pb.EXEC_STATE_QUEUED for q in queued)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await start(env.stub, sb.sandbox_id, "echo one too many")
    assert info.value.code() is Code.RESOURCE_EXHAUSTED and _retry_after(info.value)
    await env.stub.CancelExec(pb.CancelExecRequest(exec_id=queued[0].exec_id), timeout=10)
    extra = await start(env.stub, sb.sandbox_id, "echo fits again")
    await env.stub.CancelExec(pb.CancelExecRequest(exec_id=blocker.exec_id), timeout=10)
    assert (await wait(env.stub, queued[1].exec_id)).stdout == b"queued\n"
    assert (await wait(env.stub, extra.exec_id)).stdout == b"fits again\n"
    blocker = await start(env.stub, sb.sandbox_id, "sleep 0.5")  # the count went back down: two fit again
    again = [await start(env.stub, sb.sandbox_id, f"echo {i}") for i in range(2)]
    assert [(await wait(env.stub, a.exec_id)).stdout for a in again] == [b"0\n", b"1\n"]


async def test_env_metrics(start_env: StartEnv) -> None:
    """/metrics shows sandboxes by state, creates, ended commands by state with latency, and queue depth."""
    import urllib.request

    env = await start_env(metrics_port=0)
    sb = await create(env.stub)
    await run(env.stub, sb.sandbox_id, "true")
    await run(env.stub, sb.sandbox_id, "exit 3")
    port = env.server.metrics_port
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    )
    values = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line and not line.startswith("#")
    }
    assert values['orchard_env_sandboxes{state="ready"}'] == 1
    assert values["orchard_env_execs_queued"] == 0
    assert values["orchard_env_sandboxes_created_total"] >= 1
    assert values['orchard_env_execs_total{state="succeeded"}'] >= 1
    assert values['orchard_env_execs_total{state="failed"}'] >= 1
    assert values["orchard_env_exec_duration_seconds_count"] >= 2
    assert any(
        key.startswith('orchard_rpcs_total{code="OK",method="/orchard.env.v1.EnvService/StartExec"') for key in values
    )


async def test_request_size_is_bounded(start_env: StartEnv) -> None:
    """A message over max_message_bytes is refused with RESOURCE_EXHAUSTED before it reaches the service, which
    carries on; uploads of any size still work, since they stream in chunks under the bound."""
    env = await start_env(max_message_bytes=1 << 20)
    sb = await create(env.stub)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await env.stub.StartExec(
            pb.StartExecRequest(sandbox_id=sb.sandbox_id, shell="cat >/dev/null", stdin=b"x" * (2 << 20)), timeout=10
        )
    assert info.value.code() is Code.RESOURCE_EXHAUSTED
    chunks = [pb.UploadFileRequest(header=pb.FileHeader(sandbox_id=sb.sandbox_id, path="big"))]
    chunks += [pb.UploadFileRequest(chunk=b"y" * (512 << 10)) for _ in range(6)]
    uploaded = await env.stub.UploadFile(iter(chunks), timeout=30)
    assert uploaded.size_bytes == 3 << 20
    assert (await run(env.stub, sb.sandbox_id, "wc -c < big")).stdout == b"3145728\n"

"""The native agent's `--listen-tcp` mode (how the kubernetes backend reaches a sandbox by Pod IP), for real: the
built agent-rs binary as a plain process on a loopback address, driven by the service's AgentClient."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from orchard.errors import Unavailable
from orchard.services.env.agent_client import AgentClient, connect_tcp

pytestmark = [pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-" + "x" * 26
HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def agent_bin() -> Path:
    built = subprocess.run([str(ROOT / "scripts" / "build_agent.sh")], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.skip(f"cannot build the native agent (needs cargo): {built.stderr.strip()[-500:]}")
    return Path(built.stdout.strip())


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@pytest.fixture
async def agent(agent_bin: Path, tmp_path: Path) -> AsyncIterator[tuple[int, asyncio.subprocess.Process]]:
    """The agent listening on HOST:port with TOKEN; yields (port, process)."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        str(agent_bin),
        "--listen-tcp",
        f"{HOST}:{port}",
        cwd=tmp_path,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ["PATH"], "ORCHARD_AGENT_TOKEN": TOKEN},
    )
    for _ in range(500):  # until it listens (tests below open raw connections, which do not retry)
        try:
            socket.create_connection((HOST, port), timeout=1).close()  # a silent peer: dropped quietly
            break
        except ConnectionRefusedError:
            await asyncio.sleep(0.01)
    yield port, proc
    proc.terminate()
    assert await asyncio.wait_for(proc.wait(), 10) == 0  # SIGTERM: commands killed, exit 0


async def run(client: AgentClient, argv: list[str], cwd: str = "/") -> tuple[int, bytes]:
    out, code = b"", -1
    async for event in client.exec(argv, cwd=cwd, env={}, stdin=b"", timeout=10, max_output=1 << 20):
        if event.kind == "out":
            out += event.data
        else:
            code = event.exit_code
    return code, out


async def test_exec_and_files_over_tcp(agent: tuple[int, asyncio.subprocess.Process], tmp_path: Path) -> None:
    """The right token opens the protocol: exec, write, read; the token is not in the commands' environment."""
    port, _ = agent
    client = await connect_tcp(HOST, port, TOKEN, label="sb-tcp", timeout=5)
    try:
        assert await run(client, ["sh", "-c", "echo hi; env | grep -c ORCHARD_AGENT_TOKEN"]) == (1, b"hi\n0\n")
        target = str(tmp_path / "d" / "f.txt")
        await client.call("write", b"payload", path=target, upload="u1", offset=0, mode=0o644, last=True)
        _, data = await client.call("read", path=target, offset=0, length=100)
        assert data == b"payload"

        rounds = 50
        began = time.perf_counter()
        for _ in range(rounds):
            assert (await run(client, ["true"]))[0] == 0
        per_exec_ms = (time.perf_counter() - began) / rounds * 1000
        print(f"exec over TCP: {per_exec_ms:.2f} ms per `true`")
        assert per_exec_ms < 1000  # not pathological (bench/ measures it; a busy machine slows it)
    finally:
        await client.close("test over")


@pytest.mark.parametrize("token", ["wrong-token-" + "x" * 20, "", TOKEN + "x"])
async def test_wrong_token_is_refused(agent: tuple[int, asyncio.subprocess.Process], token: str) -> None:
    port, _ = agent
    with pytest.raises(Unavailable, match="exited before it was ready"):
        await connect_tcp(HOST, port, token, label="sb-tcp", timeout=5)
    good = await connect_tcp(HOST, port, TOKEN, label="sb-tcp", timeout=5)  # the agent serves on
    await good.close("test over")


async def test_silent_and_oversized_peers_block_nobody(agent: tuple[int, asyncio.subprocess.Process]) -> None:
    """A peer that never says hello, and one that claims a 1 GiB hello, neither stall the manager."""
    port, _ = agent
    _, silent = await asyncio.open_connection(HOST, port)
    reader, big = await asyncio.open_connection(HOST, port)
    big.write(struct.pack(">II", 1 << 30, (1 << 30) - 4))
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed unanswered
    client = await connect_tcp(HOST, port, TOKEN, label="sb-tcp", timeout=5)
    assert (await run(client, ["true"]))[0] == 0
    await client.close("test over")
    silent.close()
    big.close()


def test_without_a_token_the_agent_will_not_listen(agent_bin: Path) -> None:
    done = subprocess.run(
        [str(agent_bin), "--listen-tcp", f"{HOST}:{free_port()}"],
        env={"ORCHARD_AGENT_TOKEN": "short"},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert done.returncode == 2 and "ORCHARD_AGENT_TOKEN" in done.stderr


def test_install_copies_the_binary(agent_bin: Path, tmp_path: Path) -> None:
    """What the init container runs: the agent image holds nothing but the binary."""
    dest = tmp_path / "bin" / "orchard-agent"
    dest.parent.mkdir()
    subprocess.run([str(agent_bin), "--install", str(dest)], check=True, timeout=10)
    assert dest.read_bytes() == agent_bin.read_bytes() and os.access(dest, os.X_OK)


async def test_unreachable_agent_is_unavailable() -> None:
    with pytest.raises(Unavailable, match="not reachable"):
        await connect_tcp(HOST, free_port(), TOKEN, label="sb-tcp", timeout=0.3)

"""Unit tests of the env service's pure logic: paths, leases, exec states and the agent's framing."""

import asyncio

import pytest

from orchard.errors import InvalidArgument
from orchard.services.env.agent_client import encode, read_frame
from orchard.services.env.backends import load_backend_class
from orchard.services.env.backends.base import Resources
from orchard.services.env.files import resolve_path
from orchard.services.env.models import ExecState, Sandbox


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("", "/workspace"),
        ("a/b.txt", "/workspace/a/b.txt"),
        ("/etc/x", "/etc/x"),
        ("../x", "/x"),
        ("a/../../..", "/"),
        ("./a//b/", "/workspace/a/b"),
    ],
)
def test_resolve_path(path: str, expected: str) -> None:
    """Relative paths start at the workdir and every path comes out absolute and normalized."""
    assert resolve_path("/workspace", path) == expected


def test_resolve_path_rejects_nul() -> None:
    """A NUL byte in a path is an invalid argument naming the field."""
    with pytest.raises(InvalidArgument) as info:
        resolve_path("/workspace", "a\x00b")
    assert info.value.field == "path"


def _sandbox(ttl: float, heartbeat: float) -> Sandbox:
    return Sandbox(
        sandbox_id="sb-1",
        image="host",
        workdir="/workspace",
        env={},
        labels={},
        resources=Resources(),
        egress=(),
        ttl_s=ttl,
        heartbeat_timeout_s=heartbeat,
        create_time=1000.0,
        last_heartbeat_time=1000.0,
    )


def test_expiry_by_ttl() -> None:
    """Without a heartbeat timeout a sandbox expires at create + ttl, and says so."""
    sb = _sandbox(600, 0)
    assert sb.expire_time == 1600.0
    assert sb.expiry_reason() == "expired after ttl 600s"


def test_expiry_by_heartbeat() -> None:
    """A heartbeat timeout shorter than the TTL expires the sandbox first; a heartbeat moves it."""
    sb = _sandbox(600, 30)
    assert sb.expire_time == 1030.0
    assert sb.expiry_reason() == "no heartbeat for 30s"
    sb.last_heartbeat_time = 1100.0
    assert sb.expire_time == 1130.0
    sb.last_heartbeat_time = 1590.0
    assert sb.expire_time == 1600.0
    assert sb.expiry_reason() == "expired after ttl 600s"


@pytest.mark.parametrize("state", list(ExecState))
def test_exec_state_done(state: ExecState) -> None:
    """Only the terminal states count as done."""
    assert state.done == (state not in (ExecState.QUEUED, ExecState.RUNNING))


async def test_frames_round_trip() -> None:
    """Frames carry a JSON header and raw bytes, back to back, and end cleanly at end of stream."""
    reader = asyncio.StreamReader()
    body = bytes(range(256)) * 1000
    reader.feed_data(encode({"id": 1, "op": "write"}, body) + encode({"id": 2, "ev": "ok"}))
    reader.feed_eof()
    assert await read_frame(reader) == ({"id": 1, "op": "write"}, body)
    assert await read_frame(reader) == ({"id": 2, "ev": "ok"}, b"")
    assert await read_frame(reader) is None


def test_unknown_backend_lists_valid_names() -> None:
    """Asking for a backend that does not exist names the valid ones."""
    with pytest.raises(InvalidArgument, match="valid: docker, kubernetes, local"):
        load_backend_class("nope")

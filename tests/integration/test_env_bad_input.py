"""Bad input to the env service, found by a red-team pass: each gets a clear status naming what is wrong (never
UNKNOWN, INTERNAL, a 500 or a hang), and the service carries on."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest
from env_helpers import EnvServer, create, needs_sandboxes, run
from google.protobuf.duration_pb2 import Duration
from test_env_service import rpc_error, upload

from orchard.env.v1 import env_pb2 as pb

pytestmark = [needs_sandboxes, pytest.mark.timeout(120)]

Code = grpc.StatusCode
SERVICE = "/orchard.env.v1.EnvService/"
UNARY = [
    "CreateSandbox",
    "GetSandbox",
    "ListSandboxes",
    "DeleteSandbox",
    "Heartbeat",
    "SetNetworkPolicy",
    "SnapshotSandbox",
    "GetSnapshot",
    "ListSnapshots",
    "DeleteSnapshot",
    "StartExec",
    "GetExec",
    "WaitExec",
    "ReadExecOutput",
    "CancelExec",
    "ApplyPatch",
    "ListFiles",
    "Screenshot",
    "Act",
    "GetPageContent",
]


@pytest.mark.parametrize("method", UNARY)
async def test_undecodable_requests_are_invalid_argument(env: EnvServer, method: str) -> None:
    err = await rpc_error(env.channel.unary_unary(SERVICE + method)(b"\xff\xff\xff\xff", timeout=10))
    assert err.code() is Code.INVALID_ARGUMENT and "not a valid message" in (err.details() or ""), err


async def test_undecodable_stream_messages_are_invalid_argument(env: EnvServer) -> None:
    async def garbage():  # type: ignore[no-untyped-def]
        yield b"\x0a\xff\xff"

    for method, call in (
        ("StreamExec", env.channel.unary_stream(SERVICE + "StreamExec")(b"\xff\xff")),
        ("DownloadFile", env.channel.unary_stream(SERVICE + "DownloadFile")(b"\xff\xff")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pass
        assert info.value.code() is Code.INVALID_ARGUMENT, method
    for method in ("UploadFile",):
        err = await rpc_error(env.channel.stream_unary(SERVICE + method)(garbage(), timeout=10))
        assert err.code() is Code.INVALID_ARGUMENT, method
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in env.channel.stream_stream(SERVICE + "OpenPty")(garbage(), timeout=10):
            pass
    assert info.value.code() is Code.INVALID_ARGUMENT


async def test_paths_too_long_or_deep_and_downloads_of_devices(env: EnvServer) -> None:
    sb = await create(env.stub)
    sid = sb.sandbox_id
    for path, needle in (
        ("d/" * 3000 + "f", "bytes long"),
        ("d/" * 300 + "f", "directories deep"),
        ("x" * 300, "longer than 255"),
    ):
        err = await rpc_error(upload(env.stub, sid, path, b"x"))
        assert err.code() is Code.INVALID_ARGUMENT and needle in (err.details() or ""), err
    for path in ("/dev/zero", "/dev/urandom"):
        err = await rpc_error(_drain(env, sid, path))
        assert err.code() is Code.FAILED_PRECONDITION and "not a regular file" in (err.details() or ""), err
    await run(env.stub, sid, "ln -s /dev/zero /workspace/zero && mkfifo /workspace/fifo")
    for path in ("zero", "fifo"):
        err = await rpc_error(asyncio.wait_for(_drain(env, sid, path), 30))
        assert err.code() is Code.FAILED_PRECONDITION and "not a regular file" in (err.details() or ""), err
    grown = await env.stub.StartExec(
        pb.StartExecRequest(
            sandbox_id=sid,
            shell=("head -c 1000000 /dev/zero > /workspace/log; while true; do echo more >> /workspace/log; done"),
        ),
        timeout=10,
    )
    await asyncio.sleep(0.5)
    got = await asyncio.wait_for(_drain(env, sid, "log"), 30)  # a growing file ends at its size at the start
    assert len(got) >= 1_000_000
    await env.stub.CancelExec(pb.CancelExecRequest(exec_id=grown.exec.exec_id), timeout=20)


async def _drain(env: EnvServer, sid: str, path: str) -> bytes:
    parts = [
        m.chunk async for m in env.stub.DownloadFile(pb.DownloadFileRequest(sandbox_id=sid, path=path), timeout=30)
    ]
    return b"".join(parts)


@pytest.mark.parametrize(
    ("duration", "field"),
    [
        (Duration(seconds=1, nanos=-5), "timeout"),
        (Duration(seconds=-1), "timeout"),
        (Duration(seconds=0, nanos=1_500_000_000), "timeout"),
    ],
)
async def test_invalid_durations(env: EnvServer, duration: Duration, field: str) -> None:
    sb = await create(env.stub)
    err = await rpc_error(
        env.stub.StartExec(pb.StartExecRequest(sandbox_id=sb.sandbox_id, shell="true", timeout=duration), timeout=10)
    )
    assert err.code() is Code.INVALID_ARGUMENT and field in (err.details() or ""), err


@pytest.mark.parametrize(
    ("labels", "needle"),
    [
        ({"a": "x\x00y"}, "control"),
        ({"a": "evil\u202egnp.exe"}, "bidi"),
        ({"a": "x" * 100_000}, "256"),
        ({f"k{i}": "v" for i in range(10_000)}, "at most 64"),
        ({"bad key!": "v"}, "label key"),
        ({"": "v"}, "label key"),
    ],
)
async def test_label_limits(env: EnvServer, labels: dict[str, str], needle: str) -> None:
    err = await rpc_error(env.stub.CreateSandbox(pb.CreateSandboxRequest(image="host", labels=labels), timeout=30))
    assert err.code() is Code.INVALID_ARGUMENT and needle in (err.details() or ""), err
    assert not (await env.stub.ListSandboxes(pb.ListSandboxesRequest(), timeout=10)).sandboxes


async def test_rest_bad_bodies_are_422_never_500(start_env) -> None:  # type: ignore[no-untyped-def]
    """The REST gateway: a body that is not UTF-8 JSON, impossible quantities and negative timeouts."""
    from orchard.services.env.rest import HttpGateway

    env = await start_env()
    gateway = HttpGateway(env.manager, env.settings.model_copy(update={"http_port": 0}))
    await gateway.start()
    try:
        base = f"http://127.0.0.1:{gateway.port}"
        async with aiohttp.ClientSession() as session:

            async def post(path: str, raw: bytes) -> tuple[int, str]:
                async with session.post(base + path, data=raw, headers={"Content-Type": "application/json"}) as r:
                    return r.status, await r.text()

            for raw, needle in (
                (b'{"image": "\xff\xfe"}', "JSON"),
                (b"\xff" * 10, "JSON"),
                (b'{"image": "host", "cpu": "lots"}', "cpu"),
                (b'{"image": "host", "memory": "-5Gi"}', "memory"),
            ):
                status, text = await post("/sandboxes", raw)
                assert status == 422 and needle in text, (raw, status, text)
            status, text = await post("/sandboxes", b'{"image": "host"}')
            sid = __import__("json").loads(text)["sandbox_id"]
            for raw in (b'{"command": "true", "timeout": -1}', b'{"command": "true", "timeout_seconds": -1}'):
                status, text = await post(f"/sandboxes/{sid}/exec", raw)
                assert status == 422 and "timeout" in text, (raw, status, text)
    finally:
        await gateway.stop()

"""GrpcServer end to end on loopback: error mapping, health, reflection, auth, graceful stop, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf.wrappers_pb2 import StringValue
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from runtime_test_service import SERVICE, DemoServicer, DemoSettings, add_demo_servicer

from orchard import errors
from orchard.runtime import GrpcServer

pytestmark = pytest.mark.timeout(30)

HEALTH_SERVICE = "grpc.health.v1.Health"
SERVICE_SCRIPT = Path(__file__).with_name("runtime_test_service.py")

StartServer = Callable[..., Awaitable[tuple[GrpcServer, DemoServicer, grpc.aio.Channel]]]


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """Start a real GrpcServer with the demo service on 127.0.0.1:0; stop it and close channels after."""
    started: list[tuple[GrpcServer, grpc.aio.Channel]] = []

    async def start(**settings: object) -> tuple[GrpcServer, DemoServicer, grpc.aio.Channel]:
        server = GrpcServer(DemoSettings(**{"grace_period_s": 2.0, **settings}), name="demo")  # type: ignore[arg-type]
        servicer = DemoServicer()
        server.add_service(add_demo_servicer, servicer, SERVICE)
        port = await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        started.append((server, channel))
        return server, servicer, channel

    yield start
    for server, channel in started:
        await channel.close()
        await server.stop()


def method(channel: grpc.aio.Channel, kind: str, name: str) -> grpc.aio.UnaryUnaryMultiCallable:
    """A callable for SERVICE's method `name`; kind is unary_unary, unary_stream, stream_unary or stream_stream."""
    factory = getattr(channel, kind)
    return factory(f"/{SERVICE}/{name}", StringValue.SerializeToString, StringValue.FromString)  # type: ignore[no-any-return]


async def echo(channel: grpc.aio.Channel, value: str, **kwargs: object) -> str:
    """Call Echo and return the answer's value."""
    response = await method(channel, "unary_unary", "Echo")(StringValue(value=value), timeout=5, **kwargs)
    return response.value  # type: ignore[no-any-return]


async def rpc_error(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    """Await `call`, which must fail, and return its error."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def health_status(channel: grpc.aio.Channel, service: str = "") -> int:
    """Ask the real grpc health service for `service`'s status."""
    response = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5
    )
    return response.status  # type: ignore[no-any-return]


async def test_health_and_reflection(start_server: StartServer) -> None:
    """Health says SERVING for the server and each service; reflection lists every service."""
    server, _, channel = await start_server()
    assert server.port > 0
    for service in ("", SERVICE):
        assert await health_status(channel, service) == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    responses = [r async for r in stub.ServerReflectionInfo(iter([request]), timeout=5)]
    names = {s.name for s in responses[0].list_services_response.service}
    assert names == {SERVICE, HEALTH_SERVICE, "grpc.reflection.v1alpha.ServerReflection"}


async def test_ok_call(start_server: StartServer) -> None:
    """A normal call goes through the interceptors untouched."""
    _, _, channel = await start_server()
    assert await echo(channel, "hello") == "hello"


@pytest.mark.parametrize(
    ("value", "cls", "message", "details"),
    [
        ("not_found", errors.NotFound, "sandbox 'sb-1' not found (expired after ttl 600s)", ("name", "EXPIRED", None)),
        ("exhausted", errors.ResourceExhausted, "too many execs running; retry later", (None, None, 1.5)),
        ("bad", errors.InvalidArgument, "value 'bad' is not allowed", ("value", None, None)),
    ],
)
async def test_orchard_error_arrives_with_code_and_details(
    start_server: StartServer,
    value: str,
    cls: type[errors.OrchardError],
    message: str,
    details: tuple[str | None, str | None, float | None],
) -> None:
    """An OrchardError raised in a handler reaches the client as its code, message and details."""
    _, _, channel = await start_server()
    err = errors.from_rpc_error(await rpc_error(echo(channel, value)))
    assert type(err) is cls
    assert (err.message, (err.field, err.reason, err.retry_after)) == (message, details)


async def test_sync_client_error_round_trip(start_server: StartServer) -> None:
    """from_rpc_error reads the same details from a sync-stack RpcError."""
    server, _, _ = await start_server()

    def call() -> grpc.RpcError:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = channel.unary_unary(f"/{SERVICE}/Echo", StringValue.SerializeToString, StringValue.FromString)
            with pytest.raises(grpc.RpcError) as info:
                stub(StringValue(value="not_found"), timeout=5)
            return info.value

    err = errors.from_rpc_error(await asyncio.to_thread(call))
    assert isinstance(err, errors.NotFound)
    assert (err.field, err.reason) == ("name", "EXPIRED")


@pytest.mark.parametrize("value", ["value_error", "key_error"])
async def test_unexpected_error_is_internal_with_request_id(
    start_server: StartServer, caplog: pytest.LogCaptureFixture, value: str
) -> None:
    """An unexpected exception becomes INTERNAL naming the request id; the traceback stays in the server log."""
    _, _, channel = await start_server()
    with caplog.at_level(logging.INFO):
        err = await rpc_error(echo(channel, value, metadata=(("x-request-id", "req-42"),)))
    assert err.code() == grpc.StatusCode.INTERNAL
    assert err.details() == "internal error (request id req-42)"
    assert "secret" not in str(err.debug_error_string()) + str(err.trailing_metadata())
    [failure] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failure.request_id == "req-42"  # type: ignore[attr-defined]
    assert failure.exc_info is not None and "secret" in str(failure.exc_info[1])
    [line] = [r for r in caplog.records if r.name == "orchard.rpc" and r.levelno == logging.INFO]
    assert (line.method, line.code, line.request_id) == (f"/{SERVICE}/Echo", "INTERNAL", "req-42")  # type: ignore[attr-defined]
    assert line.duration_ms >= 0  # type: ignore[attr-defined]


async def test_generated_request_id(start_server: StartServer) -> None:
    """Without x-request-id the server makes one up and names it in the INTERNAL message."""
    _, _, channel = await start_server()
    err = await rpc_error(echo(channel, "value_error"))
    assert err.details().startswith("internal error (request id ") and len(err.details()) > 30


async def test_handler_abort_passes_through(start_server: StartServer) -> None:
    """A handler's own context.abort reaches the client unchanged."""
    _, _, channel = await start_server()
    err = await rpc_error(echo(channel, "abort"))
    assert (err.code(), err.details()) == (grpc.StatusCode.ABORTED, "the handler aborted")


async def test_sync_not_implemented_stub_is_unimplemented(start_server: StartServer) -> None:
    """A generated-style sync stub raising NotImplementedError maps to UNIMPLEMENTED, not INTERNAL."""
    _, _, channel = await start_server()
    err = await rpc_error(method(channel, "unary_unary", "Legacy")(StringValue(), timeout=5))
    assert (err.code(), err.details()) == (grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")


@pytest.mark.parametrize("name", ["Countdown", "CountdownWriter"])
async def test_stream_error_mid_stream(start_server: StartServer, name: str) -> None:
    """A server-streaming handler raising NotFound after some messages ends the stream with NOT_FOUND."""
    _, _, channel = await start_server()
    call = method(channel, "unary_stream", name)(StringValue(value="not_found"), timeout=5)
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for response in call:
            received.append(response.value)
    assert received[0] == "1"
    err = errors.from_rpc_error(info.value)
    assert isinstance(err, errors.NotFound)
    assert (err.field, err.reason) == ("name", "EXPIRED")


async def responses(call: object) -> list[str]:
    """All answer values of a unary (awaitable) or streaming (async iterable) call."""
    if isinstance(call, grpc.aio.StreamStreamCall):
        return [r.value async for r in call]
    return [(await call).value]  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kind", "name", "expected"), [("stream_unary", "Collect", ["a,b"]), ("stream_stream", "Chat", ["a", "b"])]
)
async def test_client_streaming_kinds(start_server: StartServer, kind: str, name: str, expected: list[str]) -> None:
    """Client-streaming handlers answer normally and map errors raised while reading requests."""
    _, _, channel = await start_server()
    stub = method(channel, kind, name)
    assert await responses(stub(iter([StringValue(value="a"), StringValue(value="b")]), timeout=5)) == expected
    err = await rpc_error(responses(stub(iter([StringValue(value="a"), StringValue(value="bad")]), timeout=5)))
    back = errors.from_rpc_error(err)
    assert isinstance(back, errors.InvalidArgument) and back.field == "value"


async def test_client_cancel_is_logged_as_cancelled(
    start_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A call the client cancels cancels the handler and is logged as CANCELLED, not as an error."""
    _, servicer, channel = await start_server()
    with caplog.at_level(logging.INFO):
        call = method(channel, "unary_unary", "Echo")(StringValue(value="sleep 10"), timeout=5)
        await asyncio.wait_for(servicer.slow_started.wait(), 5)
        call.cancel()
        for _ in range(200):  # the server learns of the cancel asynchronously
            if any(r.name == "orchard.rpc" for r in caplog.records):
                break
            await asyncio.sleep(0.01)
    assert [(r.levelname, r.code) for r in caplog.records if r.name == "orchard.rpc"] == [("INFO", "CANCELLED")]  # type: ignore[attr-defined]


async def test_auth(start_server: StartServer, caplog: pytest.LogCaptureFixture) -> None:
    """With a token set, calls need 'Bearer <token>'; health and reflection stay open."""
    _, _, channel = await start_server(auth_token="s3cret")
    with caplog.at_level(logging.INFO):
        missing = errors.from_rpc_error(await rpc_error(echo(channel, "hi")))
    [line] = [r for r in caplog.records if r.name == "orchard.rpc"]
    assert line.code == "UNAUTHENTICATED"  # type: ignore[attr-defined]
    assert isinstance(missing, errors.Unauthenticated)
    assert "missing 'authorization' metadata" in missing.message and missing.reason == "MISSING_TOKEN"
    wrong = errors.from_rpc_error(await rpc_error(echo(channel, "hi", metadata=(("authorization", "Bearer nope"),))))
    assert isinstance(wrong, errors.Unauthenticated) and wrong.reason == "INVALID_TOKEN"
    assert await echo(channel, "hi", metadata=(("authorization", "Bearer s3cret"),)) == "hi"
    assert await health_status(channel) == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    assert [r async for r in stub.ServerReflectionInfo(iter([request]), timeout=5)]


async def test_graceful_stop(start_server: StartServer) -> None:
    """stop() flips health to NOT_SERVING, lets an in-flight RPC finish, runs callbacks, then refuses calls."""
    server, servicer, channel = await start_server(grace_period_s=30.0)
    events: list[str] = []

    async def record(name: str) -> None:
        events.append(name)

    server.on_stop(lambda: record("first registered"))
    server.on_stop(lambda: record("last registered"))

    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=SERVICE))
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    slow = asyncio.ensure_future(echo(channel, "sleep 0.5"))
    await asyncio.wait_for(servicer.slow_started.wait(), 5)

    started = time.monotonic()
    stopping = asyncio.create_task(server.stop())
    assert (await asyncio.wait_for(watch.read(), 5)).status == health_pb2.HealthCheckResponse.NOT_SERVING
    watch.cancel()  # an open Watch would otherwise hold the drain for the whole grace period
    assert not slow.done() and not events
    assert await slow == "sleep 0.5"
    await stopping
    assert time.monotonic() - started < 20  # drained as soon as the slow call ended, not after the 30 s grace
    assert events == ["last registered", "first registered"]

    err = await rpc_error(echo(channel, "late"))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    await server.stop()  # a second stop is a no-op
    assert events == ["last registered", "first registered"]


async def test_serve_returns_when_stopped_elsewhere() -> None:
    """serve() returns once stop() is called from another task."""
    server = GrpcServer(DemoSettings(grace_period_s=0.1), name="demo")
    server.add_service(add_demo_servicer, DemoServicer(), SERVICE)
    serving = asyncio.create_task(server.serve())
    while True:  # wait until bound
        await asyncio.sleep(0.01)
        try:
            port = server.port
            break
        except RuntimeError:
            assert not serving.done()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert await echo(channel, "up") == "up"
    await server.stop()
    await asyncio.wait_for(serving, 5)


async def test_sigterm_drains_and_exits_zero() -> None:
    """A service process exits 0 on SIGTERM, logging JSON lines through shutdown."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SERVICE_SCRIPT),
        "--port",
        "0",
        "--grace-period-s",
        "1",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        first = json.loads(await asyncio.wait_for(proc.stderr.readline(), 10))
        assert first["message"].startswith("demo listening on") and first["services"] == [SERVICE]
        async with grpc.aio.insecure_channel(first["address"]) as channel:
            assert await echo(channel, "hi", metadata=(("x-request-id", "sig-1"),)) == "hi"
        proc.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, rest.decode()
    lines = [json.loads(line) for line in rest.decode().splitlines()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    rpc = next(line for line in lines if line["logger"] == "orchard.rpc")
    assert (rpc["code"], rpc["request_id"], rpc["method"]) == ("OK", "sig-1", f"/{SERVICE}/Echo")
    messages = [line["message"] for line in lines if line["logger"] != "orchard.rpc"]
    assert messages == ["demo received SIGTERM", "demo shutting down (grace 1.0s)", "backend closed", "demo stopped"]


async def test_container_healthcheck_probe(start_server: StartServer) -> None:
    """`python -m orchard.runtime.healthcheck PORT|ENV_VAR` (the images' health check) says 0 for a serving server,
    1 for a closed port, 2 for a bad argument; it runs in a subprocess exactly as a container runs it."""
    server, _, _ = await start_server()
    port = server.port
    closed = await _closed_port()

    async def probe(*args: str, **env: str) -> int:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "orchard.runtime.healthcheck",
            *args,
            env={**os.environ, **env},
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        assert proc.returncode is not None
        if proc.returncode == 2:
            assert b"usage" in err or b"neither a port" in err, err
        return proc.returncode

    assert await probe(str(port)) == 0
    assert await probe("DEMO_PORT", DEMO_PORT=str(port)) == 0
    assert await probe(str(closed)) == 1
    assert await probe("NO_SUCH_VARIABLE") == 2
    assert await probe() == 2


async def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

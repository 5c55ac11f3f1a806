"""A tiny gRPC service without a proto, for the runtime tests: each method misbehaves on request.

Messages are google.protobuf.StringValue; the request's value says what the handler does.
Run as a script it is a complete service (`python runtime_test_service.py --port 0`), used
by the SIGTERM test.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.wrappers_pb2 import StringValue
from pydantic_settings import SettingsConfigDict

from orchard import errors
from orchard.runtime import GrpcServer, ServiceSettings, configure_logging, load_settings

SERVICE = "orchard.test.v1.DemoService"


class DemoSettings(ServiceSettings):
    """Settings of the demo service."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_TEST_", extra="forbid")

    port: int = 0
    """TCP port to listen on (0 picks a free one)."""


def act(value: str) -> StringValue:
    """Answer `value`, or raise what it names."""
    match value:
        case "not_found":
            raise errors.NotFound("sandbox 'sb-1' not found (expired after ttl 600s)", field="name", reason="EXPIRED")
        case "exhausted":
            raise errors.ResourceExhausted("too many execs running; retry later", retry_after=1.5)
        case "bad":
            raise errors.InvalidArgument("value 'bad' is not allowed", field="value")
        case "value_error":
            raise ValueError("secret internals: /etc/passwd")
        case "key_error":
            raise KeyError("secret-key")
    return StringValue(value=value)


class DemoServicer:
    """Handlers of every kind; `slow_started` is set when a slow call begins."""

    def __init__(self) -> None:
        self.slow_started = asyncio.Event()

    async def echo(self, request: StringValue, context: grpc.aio.ServicerContext) -> StringValue:
        """unary-unary coroutine."""
        if request.value.startswith("sleep"):
            self.slow_started.set()
            await asyncio.sleep(float(request.value.removeprefix("sleep ")))
        if request.value == "abort":
            await context.abort(grpc.StatusCode.ABORTED, "the handler aborted")
        return act(request.value)

    async def countdown(self, request: StringValue, context: grpc.aio.ServicerContext) -> AsyncIterator[StringValue]:
        """unary-stream async generator: yields two messages, then acts on the request."""
        yield StringValue(value="1")
        yield StringValue(value="2")
        yield act(request.value)

    async def countdown_writer(self, request: StringValue, context: grpc.aio.ServicerContext) -> None:
        """unary-stream coroutine that writes through the context."""
        await context.write(StringValue(value="1"))
        await context.write(act(request.value))

    async def collect(self, requests: AsyncIterator[StringValue], context: grpc.aio.ServicerContext) -> StringValue:
        """stream-unary coroutine: acts on each request, answers the joined values."""
        return StringValue(value=",".join([act(r.value).value async for r in requests]))

    async def chat(
        self, requests: AsyncIterator[StringValue], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[StringValue]:
        """stream-stream async generator: acts on each request in turn."""
        async for request in requests:
            yield act(request.value)

    def legacy(self, request: StringValue, context: grpc.ServicerContext) -> StringValue:
        """A sync stub like the generated servicer base class has for unimplemented methods."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details("Method not implemented!")
        raise NotImplementedError("Method not implemented!")


def add_demo_servicer(servicer: DemoServicer, server: grpc.aio.Server) -> None:
    """The add_fn for GrpcServer.add_service, shaped like generated add_*_to_server functions."""
    kinds: dict[str, tuple[Callable[..., grpc.RpcMethodHandler], Any]] = {
        "Echo": (grpc.unary_unary_rpc_method_handler, servicer.echo),
        "Countdown": (grpc.unary_stream_rpc_method_handler, servicer.countdown),
        "CountdownWriter": (grpc.unary_stream_rpc_method_handler, servicer.countdown_writer),
        "Collect": (grpc.stream_unary_rpc_method_handler, servicer.collect),
        "Chat": (grpc.stream_stream_rpc_method_handler, servicer.chat),
        "Legacy": (grpc.unary_unary_rpc_method_handler, servicer.legacy),
    }
    handlers = {
        name: factory(
            fn, request_deserializer=StringValue.FromString, response_serializer=StringValue.SerializeToString
        )
        for name, (factory, fn) in kinds.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


async def main() -> None:
    """Serve the demo service until SIGTERM, logging like a real service."""
    settings = load_settings(DemoSettings)
    configure_logging(settings.log_level, settings.log_format)
    server = GrpcServer(settings, name="demo")
    server.add_service(add_demo_servicer, DemoServicer(), SERVICE)

    async def close_backend() -> None:
        logging.getLogger("demo.backend").info("backend closed", extra={"backend": "fake"})

    server.on_stop(close_backend)
    await server.serve()


if __name__ == "__main__":
    asyncio.run(main())

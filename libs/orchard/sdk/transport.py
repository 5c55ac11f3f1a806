"""The one gRPC transport every caller of an Orchard service uses (the env SDK, and orchard.clients for the other
services): connecting (failing fast), auth metadata, TLS, deadlines on every call, retries, and turning RpcErrors
into orchard.errors classes that name the service and its address."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from orchard.env.v1 import env_pb2_grpc
from orchard.errors import DeadlineExceeded, OrchardError, Unavailable, from_rpc_error
from orchard.sdk.config import ClientConfig
from orchard.sdk.retry import with_retries

START_HINT = "start it with `orchard up` (the whole stack) or `orchard serve env`, or set ORCHARD_ENV_ADDRESS"
# Command output can reach the service's per-stream cap (256 MiB at most), so no receive limit here.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


class Transport:
    """One lazily opened channel and the call helpers every SDK object uses."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        timeout: float,
        connect_timeout: float,
        service: str = "env",
        stub: Callable[[grpc.aio.Channel], Any] = env_pb2_grpc.EnvServiceStub,
        hint: str = START_HINT,
        options: list[tuple[str, Any]] | None = None,
    ) -> None:
        self.config = config
        self.service = service
        """The service's name in messages ("env", "inference" ...)."""
        self._make_stub = stub
        self._hint = hint
        self._options = CHANNEL_OPTIONS if options is None else options
        self.timeout = timeout
        """Default deadline of one call, in seconds."""
        self.connect_timeout = connect_timeout
        self._metadata = (("authorization", f"Bearer {config.api_key}"),) if config.api_key else ()
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._connecting = asyncio.Lock()
        self._closed = False

    async def connect(self) -> Any:
        """Open the channel if needed; raises Unavailable when the service cannot be reached in time."""
        async with self._connecting:
            if self._closed:
                raise RuntimeError("this client is closed; create a new one")
            if self._stub is not None:
                return self._stub
            target = self.config.target
            if self.config.secure:
                channel = grpc.aio.secure_channel(target, self.config.credentials(), options=self._options)
            else:
                channel = grpc.aio.insecure_channel(target, options=self._options)
            try:
                await asyncio.wait_for(channel.channel_ready(), self.connect_timeout)
            except TimeoutError:
                await channel.close()
                raise Unavailable(
                    f"cannot reach the {self.service} service at {target} "
                    f"(no connection within {self.connect_timeout:g}s); is it running? "
                    f"{self._hint}"
                ) from None
            except BaseException:
                await channel.close()
                raise
            self._channel, self._stub = channel, self._make_stub(channel)
            return self._stub

    async def close(self) -> None:
        self._closed = True
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None

    @property
    def channel(self) -> grpc.aio.Channel | None:
        """The open channel (after connect), e.g. for a health check of the same service."""
        return self._channel

    async def unary(self, method: str, request: Any, *, idempotent: bool, timeout: float | None = None) -> Any:
        """Call a unary RPC with a deadline (`timeout`, else the client's), retrying where safe."""
        stub = await self.connect()
        deadline = timeout or self.timeout
        rpc = getattr(stub, method)

        async def attempt() -> Any:
            try:
                return await rpc(request, timeout=deadline, metadata=self._metadata)
            except grpc.aio.AioRpcError as err:
                raise self.error(err, method, deadline) from None

        return await with_retries(attempt, idempotent=idempotent, what=method)

    async def server_stream(self, method: str, request: Any, *, timeout: float | None = None) -> AsyncIterator[Any]:
        """Yield the messages of a server-streaming RPC; leaving early cancels the call."""
        stub = await self.connect()
        deadline = timeout or self.timeout
        call = getattr(stub, method)(request, timeout=deadline, metadata=self._metadata)
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as err:
            raise self.error(err, method, deadline) from None
        finally:
            call.cancel()

    async def bidi_stream(self, method: str, *, timeout: float | None = None) -> grpc.aio.StreamStreamCall:
        """Open a bidirectional-streaming RPC for write()/read(); map its RpcErrors with `error`."""
        stub = await self.connect()
        return getattr(stub, method)(timeout=timeout or self.timeout, metadata=self._metadata)

    async def client_stream(self, method: str, requests: AsyncIterator[Any], *, timeout: float | None = None) -> Any:
        """Send a request stream and return the single response."""
        stub = await self.connect()
        deadline = timeout or self.timeout
        try:
            return await getattr(stub, method)(requests, timeout=deadline, metadata=self._metadata)
        except grpc.aio.AioRpcError as err:
            raise self.error(err, method, deadline) from None

    def error(self, err: grpc.aio.AioRpcError, method: str, deadline: float) -> OrchardError:
        """The orchard.errors class for `err`, with the address or deadline added where gRPC's text is bare."""
        error = from_rpc_error(err)
        target = self.config.target
        if isinstance(error, DeadlineExceeded) and error.message == "Deadline Exceeded":
            return DeadlineExceeded(
                f"{method} to the {self.service} service at {target} did not finish within "
                f"the client's {deadline:g}s deadline; pass a larger timeout if the work is slow"
            )
        if isinstance(error, Unavailable) and not _sent_by_orchard(err):
            return Unavailable(f"the {self.service} service at {target} is unavailable ({error.message}); {self._hint}")
        return error


def _sent_by_orchard(err: grpc.aio.AioRpcError) -> bool:
    """True when an Orchard server set the status (it always attaches google.rpc details), not the transport."""
    return any(key == "grpc-status-details-bin" for key, _ in err.trailing_metadata() or ())

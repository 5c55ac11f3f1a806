"""Server interceptors: the one place exceptions become status codes, and bearer-token auth.

`ErrorInterceptor` must be the outermost interceptor: `BearerAuthInterceptor` rejects a
call by raising `Unauthenticated`, which the error interceptor then reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health as grpc_health

from orchard import errors
from orchard.runtime import tenancy
from orchard.runtime.metrics import observe_rpc

_log = logging.getLogger("orchard.rpc")

REQUEST_ID_KEY = "x-request-id"
"""Metadata key a client may set to tie its logs to the server's; generated when absent."""

_HEALTH_PREFIX = f"/{grpc_health.SERVICE_NAME}/"
_AUTH_EXEMPT_PREFIXES = (_HEALTH_PREFIX, "/grpc.reflection.")
_MAX_REQUEST_ID_CHARS = 128
_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]
Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions from any handler to a status and writes one log line per RPC.

    OrchardError -> its code with google.rpc details; NotImplementedError (what generated
    servicer stubs raise) -> UNIMPLEMENTED; CancelledError, grpc's own abort errors and
    non-Exception BaseExceptions pass through; any other Exception -> INTERNAL
    "internal error (request id ...)", with the traceback logged here and never sent to
    the client. Sync handlers (only the generated "not implemented" stubs) run inline.
    """

    def __init__(self, service: str = "") -> None:
        self._service = service

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None  # grpc answers UNIMPLEMENTED "Method not found!"
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        request_id = _request_id(handler_call_details)
        behavior = _checked_requests(_behavior(handler), handler.request_streaming, method)
        decode = _tolerant(handler.request_deserializer)
        if handler.response_streaming and not inspect.iscoroutinefunction(_behavior(handler)):
            return _with_behavior(handler, _wrap_stream(behavior, method, request_id, self._service), decode)
        return _with_behavior(handler, _wrap_unary(behavior, method, request_id, self._service), decode)


class _Undecodable:
    """What a request that does not parse as its message becomes (grpc would answer UNKNOWN for it)."""

    def __init__(self, error: Exception) -> None:
        self.error = f"{type(error).__name__}: {error}"


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as err:  # protobuf's DecodeError, or anything a custom deserializer raises
            return _Undecodable(err)

    return decode


def _refuse(method: str, request: _Undecodable) -> NoReturn:
    raise errors.InvalidArgument(
        f"the request to {method} is not a valid message of its type ({request.error}); "
        "send the serialized request message the service's proto defines",
        reason="UNDECODABLE_REQUEST",
    )


def _checked_requests(behavior: Behavior, streaming: bool, method: str) -> Behavior:
    """`behavior`, refusing an undecodable request (or message of a request stream) with INVALID_ARGUMENT."""
    if streaming:

        async def messages(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, _Undecodable):
                    _refuse(method, request)
                yield request

        def checked_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            return behavior(messages(requests), context)

        return checked_stream

    def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            _refuse(method, request)
        return behavior(request, context)

    return checked


def _wrap_unary(behavior: Behavior, method: str, request_id: str, service: str) -> Behavior:
    """Wrap a handler that returns one response (or writes a stream through `context.write`)."""

    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        rpc = _Rpc(method, request_id, context, service)
        try:
            result = behavior(request, context)
            if inspect.isawaitable(result):
                result = await result
            return result
        except asyncio.CancelledError:
            rpc.code = grpc.StatusCode.CANCELLED.name
            raise
        except Exception as exc:
            await rpc.fail(exc)
        finally:
            rpc.log()

    return handle


def _wrap_stream(behavior: Behavior, method: str, request_id: str, service: str) -> Behavior:
    """Wrap a handler that is an (async) generator of responses."""

    async def handle(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        rpc = _Rpc(method, request_id, context, service)
        try:
            responses = behavior(request, context)
            if inspect.isasyncgen(responses):
                # Close the handler's generator now (running its finally blocks) if grpc stops early.
                async with contextlib.aclosing(responses):
                    async for response in responses:
                        yield response
            else:
                for response in responses:
                    yield response
        except asyncio.CancelledError:
            rpc.code = grpc.StatusCode.CANCELLED.name
            raise
        except Exception as exc:
            await rpc.fail(exc)
        finally:
            rpc.log()

    return handle


class _Rpc:
    """One call in flight: its timing, final code and error reporting."""

    def __init__(self, method: str, request_id: str, context: grpc.aio.ServicerContext, service: str) -> None:
        self.service = service
        self.method = method
        self.request_id = request_id
        self.context = context
        self.started = time.monotonic()
        self.code = "OK"
        self.error: str | None = None
        self._logged = False

    async def fail(self, exc: Exception) -> NoReturn:
        """Report `exc` to the client as a status; always raises (grpc's AbortError at the end)."""
        if isinstance(exc, grpc.aio.BaseError):
            # The handler called context.abort itself (or the call was already over):
            # grpc has sent the status, so report what we can and let grpc finish.
            self.code = self._code_set_by_handler() or "ABORTED_BY_HANDLER"
            raise exc
        if isinstance(exc, NotImplementedError) and not isinstance(exc, errors.OrchardError):
            exc = errors.Unimplemented(str(exc) or f"{self.method} is not implemented by this server")
        if isinstance(exc, errors.OrchardError):
            self.code, self.error = exc.code.name, exc.message
            self.log()  # before the status goes out: a client that has seen its error finds its line and metric
            await self.context.abort_with_status(errors.to_status(exc))
            raise AssertionError("context.abort returned instead of raising")
        self.code, self.error = grpc.StatusCode.INTERNAL.name, f"{type(exc).__name__}: {exc}"
        _log.error(
            "unexpected error in %s (request id %s)",
            self.method,
            self.request_id,
            exc_info=exc,
            extra={"method": self.method, "request_id": self.request_id},
        )
        self.log()
        await self.context.abort(grpc.StatusCode.INTERNAL, f"internal error (request id {self.request_id})")
        raise AssertionError("context.abort returned instead of raising")

    def _code_set_by_handler(self) -> str | None:
        """The non-OK code a handler set with context.set_code, if any."""
        code = _CODE_BY_NUMBER.get(self.context.code())  # type: ignore[call-overload]
        return code.name if code is not None and code is not grpc.StatusCode.OK else None

    def log(self) -> None:
        """Write the per-RPC line, once; health checks log at DEBUG so probes do not flood the logs."""
        if self._logged:
            return
        self._logged = True
        level = logging.DEBUG if self.method.startswith(_HEALTH_PREFIX) else logging.INFO
        if self.code == "OK":
            self.code = self._code_set_by_handler() or "OK"
        seconds = time.monotonic() - self.started
        observe_rpc(self.service, self.method, self.code, seconds)
        fields: dict[str, Any] = {
            "method": self.method,
            "code": self.code,
            "duration_ms": round(seconds * 1000, 2),
            "request_id": self.request_id,
        }
        if self.error is not None:
            fields["error"] = self.error
        _log.log(level, "rpc %s %s", self.method, self.code, extra=fields)


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on every call except health and reflection, and runs the call
    as the token's tenant (orchard.runtime.tenancy)."""

    def __init__(self, tokens: dict[str, str] | str) -> None:
        self._tokens = {tokens: tenancy.DEFAULT_TENANT} if isinstance(tokens, str) else dict(tokens)

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        if handler is None or method.startswith(_AUTH_EXEMPT_PREFIXES):
            return handler
        sent = _metadata_value(handler_call_details, "authorization")
        tenant = None
        if sent is not None and sent.startswith("Bearer "):
            tenant = tenancy.tenant_of(sent.removeprefix("Bearer "), self._tokens)
        if tenant is not None:
            # The interceptor runs in the call's own task, before its handler: the handler sees this tenant.
            tenancy.set_tenant(tenant)
            return handler
        if sent is None:
            message = "missing 'authorization' metadata; send 'authorization: Bearer <token>'"
        else:
            message = "invalid bearer token in 'authorization' metadata; check the token configured for this server"

        async def reject(request: Any, context: grpc.aio.ServicerContext) -> None:
            raise errors.Unauthenticated(message, reason="INVALID_TOKEN" if sent else "MISSING_TOKEN")

        return _with_behavior(handler, reject)


def _metadata_value(details: grpc.HandlerCallDetails, key: str) -> str | None:
    metadata: Sequence[tuple[str, str | bytes]] = details.invocation_metadata or ()  # type: ignore[attr-defined]
    for name, value in metadata:
        if name == key and isinstance(value, str):
            return value
    return None


def _request_id(details: grpc.HandlerCallDetails) -> str:
    """The client's x-request-id when it is sane, else a fresh one."""
    sent = _metadata_value(details, REQUEST_ID_KEY)
    if sent and len(sent) <= _MAX_REQUEST_ID_CHARS and sent.isprintable():
        return sent
    return uuid.uuid4().hex[:16]


def _behavior(handler: grpc.RpcMethodHandler) -> Behavior:
    """The one callable a handler holds, whatever its kind."""
    behavior = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    assert behavior is not None, "grpc handler without a behavior"
    return behavior  # type: ignore[no-any-return]


def _with_behavior(
    handler: grpc.RpcMethodHandler, behavior: Behavior, request_deserializer: Callable[[bytes], Any] | None = None
) -> grpc.RpcMethodHandler:
    """A handler of the same kind and (de)serializers as `handler` (or this request deserializer) that runs
    `behavior`."""
    factory = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return factory(  # type: ignore[operator]
        behavior,
        request_deserializer=request_deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )

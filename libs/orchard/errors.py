"""Domain errors shared by servers and the SDK, and their mapping to rich gRPC statuses.

Servers raise these; the runtime's error interceptor turns them into a status with
google.rpc details (see `to_status`). Clients turn an `RpcError` back into the same
class with `from_rpc_error`, so `except NotFound:` works on both sides of the wire.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, cast

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

ERROR_DOMAIN = "orchard.dev"
"""The `domain` of every google.rpc.ErrorInfo Orchard attaches."""

_DETAILS_KEY = "grpc-status-details-bin"


class OrchardError(Exception):
    """Base of all Orchard errors; unexpected ones map to INTERNAL.

    Attributes:
        message: what went wrong and what to do next, sent to the client.
        field: the request field at fault (sent as a google.rpc.BadRequest violation).
        reason: a stable UPPER_SNAKE machine-readable cause (sent as google.rpc.ErrorInfo).
        retry_after: seconds a client should wait before retrying (sent as google.rpc.RetryInfo).
    """

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        reason: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.reason = reason
        self.retry_after = retry_after

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        extras = "".join(
            f", {name}={value!r}"
            for name, value in (("field", self.field), ("reason", self.reason), ("retry_after", self.retry_after))
            if value is not None
        )
        return f"{type(self).__name__}({self.message!r}{extras}; code={self.code.name})"


class InvalidArgument(OrchardError, ValueError):
    """The request is malformed or a field has a bad value."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(OrchardError, LookupError):
    """The named resource does not exist (or no longer exists)."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(OrchardError):
    """The resource the caller tried to create already exists."""

    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(OrchardError):
    """The resource is not in a state that allows the operation."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(OrchardError):
    """A limit or quota was hit; set `retry_after` when waiting will help."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(OrchardError, ConnectionError):
    """The service or a dependency is temporarily unreachable; safe to retry."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(OrchardError, TimeoutError):
    """The operation did not finish before its deadline."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unimplemented(OrchardError, NotImplementedError):
    """The operation is not supported by this server or backend."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Unauthenticated(OrchardError, PermissionError):
    """The caller sent no credentials or wrong ones."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(OrchardError, PermissionError):
    """The caller is known but may not do this."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Cancelled(OrchardError):
    """The operation was cancelled, usually by the caller."""

    code = grpc.StatusCode.CANCELLED


_CLASS_BY_CODE: dict[grpc.StatusCode, type[OrchardError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Unimplemented,
        Unauthenticated,
        PermissionDenied,
        Cancelled,
    )
}


def to_status(err: OrchardError) -> grpc.Status:
    """Build the rich gRPC status (with google.rpc details) that reports `err`."""
    status = status_pb2.Status(code=err.code.value[0], message=err.message)
    if err.field is not None:
        violation = error_details_pb2.BadRequest.FieldViolation(field=err.field, description=err.message)
        status.details.add().Pack(error_details_pb2.BadRequest(field_violations=[violation]))
    if err.retry_after is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(round(err.retry_after * 1e9))
        status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    if err.reason is not None:
        status.details.add().Pack(error_details_pb2.ErrorInfo(reason=err.reason, domain=ERROR_DOMAIN))
    return rpc_status.to_status(status)


class _FinishedCall(Protocol):
    """What both `grpc.aio.AioRpcError` and the sync stack's RpcError offer."""

    def code(self) -> grpc.StatusCode: ...

    def details(self) -> str | None: ...

    def trailing_metadata(self) -> Iterable[tuple[str, str | bytes]] | None: ...


def from_rpc_error(err: grpc.RpcError) -> OrchardError:
    """Turn a failed call (sync or aio) back into the matching `OrchardError`.

    Codes without a subclass (UNKNOWN, INTERNAL, ABORTED, ...) give the base class with
    the real code kept on the instance's `code` attribute.
    """
    call = cast(_FinishedCall, err)
    code = call.code()
    field, reason, retry_after = _parse_details(call.trailing_metadata() or ())
    cls = _CLASS_BY_CODE.get(code, OrchardError)
    result = cls(call.details() or "", field=field, reason=reason, retry_after=retry_after)
    if cls is OrchardError:
        result.code = code
    return result


def _parse_details(
    metadata: Iterable[tuple[str, str | bytes]],
) -> tuple[str | None, str | None, float | None]:
    """Read (field, reason, retry_after) from the google.rpc.Status in trailing metadata."""
    field: str | None = None
    reason: str | None = None
    retry_after: float | None = None
    for key, value in metadata:
        if key != _DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except DecodeError:
            # A peer that is not Orchard may send anything here; the code and message still count.
            return None, None, None
        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad_request = error_details_pb2.BadRequest()
                detail.Unpack(bad_request)
                if bad_request.field_violations:
                    field = bad_request.field_violations[0].field
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry_info = error_details_pb2.RetryInfo()
                detail.Unpack(retry_info)
                retry_after = retry_info.retry_delay.ToNanoseconds() / 1e9
            elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                error_info = error_details_pb2.ErrorInfo()
                detail.Unpack(error_info)
                reason = error_info.reason
    return field, reason, retry_after

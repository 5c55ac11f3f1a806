"""Tests for orchard.errors: status codes, rich details and the client-side round trip."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from orchard import errors

SUBCLASSES: list[tuple[type[errors.OrchardError], grpc.StatusCode, type[BaseException] | None]] = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, ValueError),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND, LookupError),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS, None),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION, None),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED, None),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE, ConnectionError),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED, TimeoutError),
    (errors.Unimplemented, grpc.StatusCode.UNIMPLEMENTED, NotImplementedError),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED, PermissionError),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED, PermissionError),
    (errors.Cancelled, grpc.StatusCode.CANCELLED, None),
]


def rpc_error_for(status: grpc.Status) -> grpc.aio.AioRpcError:
    """The error a grpc.aio client would raise for a call that ended with `status`."""
    return grpc.aio.AioRpcError(
        code=status.code,
        initial_metadata=grpc.aio.Metadata(),
        trailing_metadata=grpc.aio.Metadata(*status.trailing_metadata),
        details=status.details,
    )


def rich_status(status: grpc.Status) -> status_pb2.Status:
    """The google.rpc.Status carried in the trailing metadata of `status`."""
    (value,) = [value for key, value in status.trailing_metadata if key == "grpc-status-details-bin"]
    return status_pb2.Status.FromString(value)


@pytest.mark.parametrize(("cls", "code", "builtin"), SUBCLASSES, ids=lambda v: getattr(v, "__name__", None))
def test_subclass_code_and_builtin(
    cls: type[errors.OrchardError], code: grpc.StatusCode, builtin: type[BaseException] | None
) -> None:
    """Each subclass carries its status code and is also the closest builtin exception."""
    err = cls("boom")
    assert (err.code, str(err), err.message) == (code, "boom", "boom")
    assert isinstance(err, errors.OrchardError)
    if builtin is not None:
        assert isinstance(err, builtin)


@pytest.mark.parametrize(("cls", "code", "builtin"), SUBCLASSES, ids=lambda v: getattr(v, "__name__", None))
def test_round_trip_plain(
    cls: type[errors.OrchardError], code: grpc.StatusCode, builtin: type[BaseException] | None
) -> None:
    """An error without details comes back as the same class, code and message."""
    status = errors.to_status(cls("sandbox 'sb-1' not found"))
    assert (status.code, status.details) == (code, "sandbox 'sb-1' not found")
    assert list(rich_status(status).details) == []
    back = errors.from_rpc_error(rpc_error_for(status))
    assert type(back) is cls
    assert (back.code, back.message, back.field, back.reason, back.retry_after) == (
        code,
        "sandbox 'sb-1' not found",
        None,
        None,
        None,
    )


def test_details_are_attached_and_parsed_back() -> None:
    """field, retry_after and reason travel as BadRequest, RetryInfo and ErrorInfo."""
    err = errors.ResourceExhausted("too many execs", field="command", reason="EXEC_LIMIT", retry_after=1.25)
    status = errors.to_status(err)
    details = rich_status(status).details
    bad_request, retry_info, error_info = (
        error_details_pb2.BadRequest(),
        error_details_pb2.RetryInfo(),
        error_details_pb2.ErrorInfo(),
    )
    assert [details[0].Unpack(bad_request), details[1].Unpack(retry_info), details[2].Unpack(error_info)] == [True] * 3
    assert bad_request.field_violations[0].field == "command"
    assert retry_info.retry_delay.ToMilliseconds() == 1250
    assert (error_info.reason, error_info.domain) == ("EXEC_LIMIT", "orchard.dev")

    back = errors.from_rpc_error(rpc_error_for(status))
    assert isinstance(back, errors.ResourceExhausted)
    assert (back.field, back.retry_after, back.reason) == ("command", 1.25, "EXEC_LIMIT")


@pytest.mark.parametrize("code", [grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS])
def test_codes_without_subclass_give_base_with_code(code: grpc.StatusCode) -> None:
    """Codes with no subclass become the base OrchardError, keeping the real code."""
    error = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "it broke")
    back = errors.from_rpc_error(error)
    assert type(back) is errors.OrchardError
    assert (back.code, back.message) == (code, "it broke")
    assert errors.OrchardError.code is grpc.StatusCode.INTERNAL  # the class default is untouched


def test_garbage_details_are_ignored() -> None:
    """Undecodable status details from a foreign peer still give code and message."""
    error = grpc.aio.AioRpcError(
        grpc.StatusCode.NOT_FOUND,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(("grpc-status-details-bin", b"\xff\xfe not a proto")),
        "gone",
    )
    back = errors.from_rpc_error(error)
    assert isinstance(back, errors.NotFound)
    assert (back.message, back.field) == ("gone", None)

"""Clients of every Orchard service, on the one transport (orchard.sdk.transport): auth (a bearer token from the
argument or ORCHARD_API_KEY), TLS (an https:// address, ORCHARD_TLS_* files), a deadline on every call, retries
of idempotent calls on UNAVAILABLE, and errors that name the service and its address with what to do.

    async with connect("trainer", "127.0.0.1:50056") as trainer:
        job = (await trainer.unary("CreateJob", request, idempotent=False)).job
        async for event in trainer.server_stream("StreamJobEvents", pb.StreamJobEventsRequest(job_id=...)):
            ...

The env service's own SDK (orchard.sdk) is the same transport with typed handles on top.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from orchard.sdk.config import load_config
from orchard.sdk.transport import Transport

STUBS: dict[str, tuple[str, str, str]] = {
    "env": ("orchard.env.v1.env_pb2_grpc", "EnvServiceStub", "orchard serve env"),
    "inference": ("orchard.inference.v1.inference_pb2_grpc", "InferenceServiceStub", "orchard serve inference"),
    "experience": ("orchard.experience.v1.experience_pb2_grpc", "ExperienceServiceStub", "orchard serve experience"),
    "reward": ("orchard.reward.v1.reward_pb2_grpc", "RewardServiceStub", "orchard serve reward"),
    "trainer": ("orchard.trainer.v1.trainer_pb2_grpc", "TrainerServiceStub", "orchard serve trainer"),
    "value": ("orchard.value.v1.value_pb2_grpc", "ValueServiceStub", "orchard serve value"),
}
"""Each service's stub class (module, name) and the command that starts it alone."""
DEFAULT_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 10.0
UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def _stub_class(service: str) -> Callable[[grpc.aio.Channel], Any]:
    import importlib

    if service not in STUBS:
        raise ValueError(f"unknown service {service!r}; one of {', '.join(STUBS)}")
    module, name, _ = STUBS[service]
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def transport(
    service: str,
    address: str,
    *,
    token: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    connect_timeout: float = CONNECT_TIMEOUT_S,
    options: list[tuple[str, Any]] | None = None,
    flag: str = "",
) -> Transport:
    """A transport to `service` at `address` ("host:port", or "https://host:port" for TLS); not yet connected.
    `flag` names the option that sets the address, for the message when the service cannot be reached."""
    if not address:
        raise ValueError(f"the {service} service needs an address")
    config = load_config(address, token)
    hint = f"start the stack with `orchard up` (or `{STUBS[service][2]}`), or pass {flag or 'its address'}"
    return Transport(
        config,
        timeout=timeout,
        connect_timeout=connect_timeout,
        service=service,
        stub=_stub_class(service),
        hint=hint,
        options=UNLIMITED if options is None else options,
    )


@contextlib.asynccontextmanager
async def connect(service: str, address: str, **options: Any) -> AsyncIterator[Transport]:
    """A connected transport to `service` at `address` (Unavailable, naming how to start it, if none answers),
    closed when the block ends."""
    client = transport(service, address, **options)
    try:
        await client.connect()
        yield client
    finally:
        await client.close()

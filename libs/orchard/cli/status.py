"""`orchard status`: the local stack's health at a glance (NATS reachable, each service SERVING)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchard import clients
from orchard.env.v1 import env_pb2
from orchard.errors import FailedPrecondition, OrchardError
from orchard.experience.v1 import experience_pb2
from orchard.inference.v1 import inference_pb2
from orchard.sdk.transport import Transport
from orchard.trainer.v1 import trainer_pb2
from orchard.value.v1 import value_pb2


@dataclass(frozen=True)
class Row:
    name: str
    address: str
    ok: bool
    detail: str


async def nats_row(address: str) -> Row:
    host, _, port = address.rpartition(":")
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2)
        banner = await asyncio.wait_for(reader.readline(), 2)  # NATS greets with INFO {...}
        writer.close()
    except (OSError, TimeoutError) as err:
        return Row("nats", address, False, f"unreachable: {err or type(err).__name__}")
    ok = banner.startswith(b"INFO ")
    detail = f"{(time.perf_counter() - start) * 1e3:.1f} ms" if ok else "answered, but not as NATS"
    return Row("nats", address, ok, detail)


Ask = Callable[[Transport], Awaitable[str]]


async def service_row(service: str, address: str, token: str | None, ask: Ask) -> Row:
    """A service's row: DOWN unless it answers and its health check says SERVING; then what `ask` reads of it."""
    client = clients.transport(service, address, token=token, timeout=5, connect_timeout=2)
    try:
        await client.connect()
        assert client.channel is not None
        health = await health_pb2_grpc.HealthStub(client.channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        if health.status != health_pb2.HealthCheckResponse.SERVING:
            return Row(service, address, False, health_pb2.HealthCheckResponse.ServingStatus.Name(health.status))
        return Row(service, address, True, await ask(client))
    except grpc.aio.AioRpcError as err:  # the health check's own call
        return Row(service, address, False, f"{err.code().name}: {err.details()}")
    except OrchardError as err:
        return Row(service, address, False, f"{err.code.name}: {err.message}")
    finally:
        await client.close()


async def env_detail(client: Transport) -> str:
    states: dict[str, int] = {}
    request = env_pb2.ListSandboxesRequest(page_size=1000)
    try:
        while True:
            page = await client.unary("ListSandboxes", request, idempotent=True)
            for sb in page.sandboxes:
                name = env_pb2.SandboxState.Name(sb.state).removeprefix("SANDBOX_STATE_").lower()
                states[name] = states.get(name, 0) + 1
            request.page_token = page.next_page_token
            if not request.page_token:
                break
    except OrchardError as err:
        return f"SERVING (sandboxes: {err.code.name})"
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "none"
    return f"SERVING, sandboxes: {counts}"


async def inference_detail(client: Transport) -> str:
    models = await client.unary("ListModels", inference_pb2.ListModelsRequest(), idempotent=True)
    served = ", ".join(f"{m.model_id} ({m.engine}, weights {m.weights_version})" for m in models.models)
    return f"SERVING, models: {served}"


async def experience_detail(client: Transport) -> str:
    stats = await client.unary(
        "QueryStats",
        experience_pb2.QueryStatsRequest(filter=experience_pb2.TrajectoryFilter(include_unfinished=True)),
        idempotent=True,
    )
    return f"SERVING, trajectories: {stats.total.trajectory_count} ({stats.total.finished_count} finished)"


async def trainer_detail(client: Transport) -> str:
    jobs: list[trainer_pb2.Job] = []
    request = trainer_pb2.ListJobsRequest(page_size=1000)
    while True:
        page = await client.unary("ListJobs", request, idempotent=True)
        jobs += page.jobs
        request.page_token = page.next_page_token
        if not request.page_token:
            break
    running = sum(job.state == trainer_pb2.JOB_STATE_RUNNING for job in jobs)
    return f"SERVING, jobs: {len(jobs)} ({running} running)"


async def value_detail(client: Transport) -> str:
    try:
        model = (await client.unary("GetModel", value_pb2.GetModelRequest(), idempotent=True)).model
    except FailedPrecondition:  # serving, with no model loaded yet
        return "SERVING, no model loaded (LoadModel or --checkpoint)"
    return f"SERVING, model: {model.version} ({model.base_model})"


async def value_row(address: str, token: str | None) -> Row:
    return await service_row("value", address, token, value_detail)


async def status(
    env_address: str,
    nats_address: str,
    token: str | None,
    inference_address: str | None = None,
    experience_address: str | None = None,
    trainer_address: str | None = None,
    value_address: str | None = None,
) -> list[Row]:
    """Rows for NATS, env and, when their addresses are given, inference, experience, trainer and value."""
    checks = [nats_row(nats_address), service_row("env", env_address, token, env_detail)]
    for service, address, detail in (
        ("inference", inference_address, inference_detail),
        ("experience", experience_address, experience_detail),
        ("trainer", trainer_address, trainer_detail),
        ("value", value_address, value_detail),
    ):
        if address:
            checks.append(service_row(service, address, token, detail))
    return list(await asyncio.gather(*checks))


def print_rows(rows: list[Row]) -> None:
    print(f"{'SERVICE':<10} {'ADDRESS':<22} {'STATUS':<6} DETAIL")
    for row in rows:
        print(f"{row.name:<10} {row.address:<22} {'up' if row.ok else 'DOWN':<6} {row.detail}")

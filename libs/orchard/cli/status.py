"""`orchard status`: the local stack's health at a glance (NATS reachable, each service SERVING)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchard.env.v1 import env_pb2, env_pb2_grpc
from orchard.experience.v1 import experience_pb2, experience_pb2_grpc
from orchard.inference.v1 import inference_pb2, inference_pb2_grpc
from orchard.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from orchard.value.v1 import value_pb2, value_pb2_grpc


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


async def env_row(address: str, token: str | None) -> Row:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.aio.AioRpcError as err:
            return Row("env", address, False, f"{err.code().name}: {err.details()}")
        if health.status != health_pb2.HealthCheckResponse.SERVING:
            return Row("env", address, False, health_pb2.HealthCheckResponse.ServingStatus.Name(health.status))
        stub = env_pb2_grpc.EnvServiceStub(channel)  # type: ignore[no-untyped-call]
        states: dict[str, int] = {}
        token_page = ""
        try:
            while True:
                page = await stub.ListSandboxes(env_pb2.ListSandboxesRequest(page_size=1000, page_token=token_page),
                                                timeout=5, metadata=metadata)
                for sb in page.sandboxes:
                    name = env_pb2.SandboxState.Name(sb.state).removeprefix("SANDBOX_STATE_").lower()
                    states[name] = states.get(name, 0) + 1
                if not (token_page := page.next_page_token):
                    break
        except grpc.aio.AioRpcError as err:
            return Row("env", address, True, f"SERVING (sandboxes: {err.code().name})")
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "none"
    return Row("env", address, True, f"SERVING, sandboxes: {counts}")


async def not_serving(channel: grpc.aio.Channel, name: str, address: str) -> Row | None:
    """The row of a service whose health check answers but is not SERVING; None when it serves."""
    health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
    if health.status != health_pb2.HealthCheckResponse.SERVING:
        return Row(name, address, False, health_pb2.HealthCheckResponse.ServingStatus.Name(health.status))
    return None


async def inference_row(address: str, token: str | None) -> Row:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            if (down := await not_serving(channel, "inference", address)) is not None:
                return down
            stub = inference_pb2_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            models = await stub.ListModels(inference_pb2.ListModelsRequest(), timeout=5, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            return Row("inference", address, False, f"{err.code().name}: {err.details()}")
    served = ", ".join(f"{m.model_id} ({m.engine}, weights {m.weights_version})" for m in models.models)
    return Row("inference", address, True, f"SERVING, models: {served}")


async def experience_row(address: str, token: str | None) -> Row:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            if (down := await not_serving(channel, "experience", address)) is not None:
                return down
            stub = experience_pb2_grpc.ExperienceServiceStub(channel)  # type: ignore[no-untyped-call]
            stats = await stub.QueryStats(experience_pb2.QueryStatsRequest(
                filter=experience_pb2.TrajectoryFilter(include_unfinished=True)), timeout=5, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            return Row("experience", address, False, f"{err.code().name}: {err.details()}")
    return Row("experience", address, True, f"SERVING, trajectories: {stats.total.trajectory_count} "
               f"({stats.total.finished_count} finished)")


async def trainer_row(address: str, token: str | None) -> Row:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    jobs: list[trainer_pb2.Job] = []
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            if (down := await not_serving(channel, "trainer", address)) is not None:
                return down
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)  # type: ignore[no-untyped-call]
            request = trainer_pb2.ListJobsRequest(page_size=1000)
            while True:
                page = await stub.ListJobs(request, timeout=5, metadata=metadata)
                jobs += page.jobs
                request.page_token = page.next_page_token
                if not request.page_token:
                    break
        except grpc.aio.AioRpcError as err:
            return Row("trainer", address, False, f"{err.code().name}: {err.details()}")
    running = sum(job.state == trainer_pb2.JOB_STATE_RUNNING for job in jobs)
    return Row("trainer", address, True, f"SERVING, jobs: {len(jobs)} ({running} running)")


async def value_row(address: str, token: str | None) -> Row:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            if (down := await not_serving(channel, "value", address)) is not None:
                return down
            stub = value_pb2_grpc.ValueServiceStub(channel)  # type: ignore[no-untyped-call]
            model = (await stub.GetModel(value_pb2.GetModelRequest(), timeout=5, metadata=metadata)).model
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.FAILED_PRECONDITION:  # serving, with no model loaded yet
                return Row("value", address, True, "SERVING, no model loaded (LoadModel or --checkpoint)")
            return Row("value", address, False, f"{err.code().name}: {err.details()}")
    return Row("value", address, True, f"SERVING, model: {model.version} ({model.base_model})")


async def status(env_address: str, nats_address: str, token: str | None,
                 inference_address: str | None = None, experience_address: str | None = None,
                 trainer_address: str | None = None, value_address: str | None = None) -> list[Row]:
    """Rows for NATS, env and, when their addresses are given, inference, experience, trainer and value."""
    checks = [nats_row(nats_address), env_row(env_address, token)]
    if inference_address:
        checks.append(inference_row(inference_address, token))
    if experience_address:
        checks.append(experience_row(experience_address, token))
    if trainer_address:
        checks.append(trainer_row(trainer_address, token))
    if value_address:
        checks.append(value_row(value_address, token))
    return list(await asyncio.gather(*checks))


def print_rows(rows: list[Row]) -> None:
    print(f"{'SERVICE':<10} {'ADDRESS':<22} {'STATUS':<6} DETAIL")
    for row in rows:
        print(f"{row.name:<10} {row.address:<22} {'up' if row.ok else 'DOWN':<6} {row.detail}")

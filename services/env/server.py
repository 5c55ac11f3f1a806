"""Bootstrap of the env service: settings → backend → manager → gRPC server (+ REST gateway with
--http-port) (`orchard serve env`)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from orchard.env.v1 import env_pb2_grpc
from orchard.runtime import GrpcServer
from orchard.runtime.main import run_service
from orchard.services.env import metrics
from orchard.services.env.backends import load_backend_class
from orchard.services.env.manager import SandboxManager
from orchard.services.env.rest import HttpGateway
from orchard.services.env.servicer import EnvServicer
from orchard.services.env.settings import EnvSettings


async def build(settings: EnvSettings) -> tuple[GrpcServer, SandboxManager]:
    """An env service ready to start: its backend is up, its server not yet listening."""
    backend = load_backend_class(settings.backend)(settings)
    await backend.start()
    manager = SandboxManager(settings, backend)
    await manager.start()
    server = GrpcServer(settings, name="env")
    server.add_service(env_pb2_grpc.add_EnvServiceServicer_to_server, EnvServicer(manager), "orchard.env.v1.EnvService")
    server.on_stop(manager.close)
    if settings.metrics_port is not None:
        collector = metrics.register(manager)

        async def unregister_metrics() -> None:
            metrics.unregister(collector)

        server.on_stop(unregister_metrics)
    return server, manager


async def start_gateway(settings: EnvSettings, server: GrpcServer, manager: SandboxManager) -> HttpGateway | None:
    """Start the REST gateway (settings.http_port) over the built service's manager; None when not asked for.

    Stop callbacks run last registered first: on SIGTERM gRPC drains, then the gateway, then the manager closes.
    """
    if settings.http_port is None:
        return None
    gateway = HttpGateway(manager, settings)
    await gateway.start()
    server.on_stop(gateway.stop)
    return gateway


async def serve(settings: EnvSettings) -> None:
    server, manager = await build(settings)
    try:
        await start_gateway(settings, server, manager)
    except BaseException:
        await manager.close()
        raise
    await server.serve()  # until SIGTERM/SIGINT: NOT_SERVING, drain, then every sandbox is destroyed


def main(argv: Sequence[str] | None = None) -> None:
    if sys.version_info < (3, 12):
        # 3.11 waits for each child (every sandbox) with a thread of its own; a pidfd per child costs nothing.
        asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    run_service("env", EnvSettings, serve, argv)


if __name__ == "__main__":
    main()

"""Bootstrap of the trainer service (`orchard serve trainer`): settings → job manager (jobs on disk taken back)
→ gRPC server. On SIGTERM: NOT_SERVING, drain RPCs, then running workers are killed; their jobs resume from
their latest checkpoint at the next start."""

from __future__ import annotations

from collections.abc import Sequence

from orchard.runtime import GrpcServer
from orchard.runtime.main import run_service
from orchard.services.trainer.jobs import JobManager
from orchard.services.trainer.servicer import TrainerServicer
from orchard.services.trainer.settings import TrainerSettings
from orchard.trainer.v1 import trainer_pb2_grpc


async def build(settings: TrainerSettings) -> tuple[GrpcServer, JobManager]:
    """A trainer service ready to start: its jobs loaded (unfinished ones queued), its server not yet listening."""
    manager = JobManager(settings)
    await manager.start()
    server = GrpcServer(settings, name="trainer")
    server.add_service(
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        TrainerServicer(manager),
        "orchard.trainer.v1.TrainerService",
    )
    server.on_stop(manager.stop)
    return server, manager


async def serve(settings: TrainerSettings) -> None:
    server, _ = await build(settings)
    await server.serve()


def main(argv: Sequence[str] | None = None) -> None:
    run_service("trainer", TrainerSettings, serve, argv)


if __name__ == "__main__":
    main()

"""Bootstrap of the value service (`orchard serve value`): settings → the checkpoint (when one is set) → batcher →
gRPC server. On SIGTERM: NOT_SERVING, drain RPCs, then the batcher stops."""

from __future__ import annotations

from collections.abc import Sequence

from orchard.runtime import GrpcServer
from orchard.runtime.main import run_service
from orchard.services.value.batcher import Batcher
from orchard.services.value.checkpoints import ValueModels
from orchard.services.value.servicer import ValueServicer
from orchard.services.value.settings import ValueSettings
from orchard.value.v1 import value_pb2_grpc


async def build(settings: ValueSettings) -> tuple[GrpcServer, ValueServicer]:
    """A value service ready to start, serving settings.checkpoint when set (a bad one fails here, naming it)."""
    models = ValueModels(settings.torch_threads)
    if settings.checkpoint is not None:
        await models.load(str(settings.checkpoint))
    batcher = Batcher(settings.max_batch, settings.batch_wait_ms / 1000, settings.max_queued_candidates)
    batcher.start()
    servicer = ValueServicer(settings, models, batcher)
    server = GrpcServer(settings, name="value")
    server.add_service(value_pb2_grpc.add_ValueServiceServicer_to_server, servicer, "orchard.value.v1.ValueService")
    server.on_stop(batcher.close)
    return server, servicer


async def serve(settings: ValueSettings) -> None:
    server, _ = await build(settings)
    await server.serve()


def main(argv: Sequence[str] | None = None) -> None:
    run_service("value", ValueSettings, serve, argv)


if __name__ == "__main__":
    main()

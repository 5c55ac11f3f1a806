"""Bootstrap of the experience service (`orchard serve experience`): settings → store → NATS consumer → gRPC.

On SIGTERM: health NOT_SERVING, drain RPCs, stop the consumer after the batch in hand (acked only if
committed), drain NATS, close the store.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchard.events.publisher import connect_nats
from orchard.experience.v1 import experience_pb2_grpc
from orchard.runtime import GrpcServer
from orchard.runtime.main import run_service
from orchard.services.experience.backends import load_store
from orchard.services.experience.backends.base import SqlStore
from orchard.services.experience.consumer import EventConsumer
from orchard.services.experience.servicer import ExperienceServicer
from orchard.services.experience.settings import ExperienceSettings


async def build(settings: ExperienceSettings) -> tuple[GrpcServer, SqlStore]:
    """An experience service ready to start: store open and consuming, its server not yet listening."""
    store = load_store(settings.store_url)
    await store.open()
    try:
        nc = await connect_nats(settings.nats_url, name="orchard-experience")
    except BaseException:
        await store.close()
        raise
    consumer = EventConsumer(
        nc, store, durable=settings.consumer_name, batch_size=settings.batch_size, ack_wait_s=settings.ack_wait_s
    )
    await consumer.start()
    server = GrpcServer(settings, name="experience")
    server.add_service(
        experience_pb2_grpc.add_ExperienceServiceServicer_to_server,
        ExperienceServicer(store, settings.eval_task_ids()),
        "orchard.experience.v1.ExperienceService",
    )
    # Stop callbacks run last registered first: consumer, then NATS, then the store.
    server.on_stop(store.close)
    server.on_stop(nc.drain)
    server.on_stop(consumer.stop)
    return server, store


async def serve(settings: ExperienceSettings) -> None:
    server, _ = await build(settings)
    await server.serve()


def main(argv: Sequence[str] | None = None) -> None:
    run_service("experience", ExperienceSettings, serve, argv)


if __name__ == "__main__":
    main()

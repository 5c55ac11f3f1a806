"""Bootstrap of the inference service: settings → engine (model loaded) → gRPC server (+ the OpenAI-compatible
HTTP endpoint with --http-port) (`orchard serve inference`)."""

from __future__ import annotations

from collections.abc import Sequence

from orchard.inference.v1 import inference_pb2_grpc
from orchard.runtime import GrpcServer
from orchard.runtime.main import run_service
from orchard.services.inference.engines import load_engine
from orchard.services.inference.engines.base import Engine
from orchard.services.inference.openai_http import OpenAIGateway
from orchard.services.inference.servicer import InferenceServicer
from orchard.services.inference.settings import InferenceSettings


async def build(settings: InferenceSettings) -> tuple[GrpcServer, Engine]:
    """An inference service ready to start: its model is loaded, its server not yet listening."""
    engine = load_engine(settings)
    await engine.start()
    server = GrpcServer(settings, name="inference")
    server.add_service(
        inference_pb2_grpc.add_InferenceServiceServicer_to_server,
        InferenceServicer(engine, settings.max_n),
        "orchard.inference.v1.InferenceService",
    )
    server.on_stop(engine.close)
    return server, engine


async def start_gateway(settings: InferenceSettings, server: GrpcServer, engine: Engine) -> OpenAIGateway | None:
    """Start the OpenAI-compatible endpoint (settings.http_port) over the same engine; None when not asked for.

    Stop callbacks run last registered first: on SIGTERM gRPC drains, then the gateway, then the engine closes.
    """
    if settings.http_port is None:
        return None
    gateway = OpenAIGateway(engine, settings)
    await gateway.start()
    server.on_stop(gateway.stop)
    return gateway


async def serve(settings: InferenceSettings) -> None:
    server, engine = await build(settings)
    try:
        await start_gateway(settings, server, engine)
    except BaseException:
        await engine.close()
        raise
    await server.serve()  # until SIGTERM/SIGINT: NOT_SERVING, drain, then the engine closes


def main(argv: Sequence[str] | None = None) -> None:
    run_service("inference", InferenceSettings, serve, argv)


if __name__ == "__main__":
    main()

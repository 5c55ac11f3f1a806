"""Container health probe: `python -m orchard.runtime.healthcheck PORT_OR_ENV_VAR [HOST]` exits 0 when the gRPC
server on that port answers SERVING to the standard health check, 1 otherwise (health is exempt from auth).
The port may be given as a number or as the name of an environment variable holding it."""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def probe(host: str, port: int, timeout_s: float = 3.0) -> bool:
    """Whether the gRPC server at host:port reports SERVING."""
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print("usage: python -m orchard.runtime.healthcheck PORT_OR_ENV_VAR [HOST]", file=sys.stderr)
        return 2
    raw = argv[0] if argv[0].isdigit() else os.environ.get(argv[0], "")
    if not raw.isdigit():
        print(f"healthcheck: {argv[0]!r} is neither a port nor an environment variable holding one", file=sys.stderr)
        return 2
    return 0 if probe(argv[1] if len(argv) == 2 else "127.0.0.1", int(raw)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

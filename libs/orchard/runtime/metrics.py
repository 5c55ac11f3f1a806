"""Prometheus metrics every service exports: per-RPC counts and latency, plus an HTTP endpoint to scrape."""

from __future__ import annotations

import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Histogram, start_http_server

_log = logging.getLogger("orchard.metrics")

RPC_LATENCY = Histogram(
    "orchard_rpc_duration_seconds",
    "Time to answer an RPC, by service, method and status code.",
    ["service", "method", "code"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
RPC_TOTAL = Counter("orchard_rpcs", "RPCs answered, by service, method and status code.", ["service", "method", "code"])


def observe_rpc(service: str, method: str, code: str, seconds: float) -> None:
    RPC_LATENCY.labels(service, method, code).observe(seconds)
    RPC_TOTAL.labels(service, method, code).inc()


class MetricsEndpoint:
    """The /metrics HTTP endpoint (prometheus_client's server in a daemon thread)."""

    def __init__(self, host: str, port: int) -> None:
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr=host)
        self.port: int = self._server.server_port
        _log.info("metrics on http://%s:%d/metrics", host, self.port, extra={"metrics_port": self.port})

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

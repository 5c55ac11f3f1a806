"""The gRPC server every Orchard service runs: interceptors, health, reflection, graceful stop.

Typical `services/<name>/server.py`:

    server = GrpcServer(settings, name="env")
    server.add_service(env_pb2_grpc.add_EnvServiceServicer_to_server, servicer, "orchard.env.v1.EnvService")
    server.on_stop(manager.close)
    await server.serve()  # returns after SIGTERM/SIGINT: NOT_SERVING, drain, callbacks
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from orchard.runtime.interceptors import BearerAuthInterceptor, ErrorInterceptor
from orchard.runtime.metrics import MetricsEndpoint
from orchard.runtime.settings import ServiceSettings

_log = logging.getLogger("orchard.server")

AddServicerFn = Callable[[Any, grpc.aio.Server], None]
StopCallback = Callable[[], Awaitable[None]]


class GrpcServer:
    """One service's grpc.aio server with Orchard's interceptors, health and reflection."""

    def __init__(self, settings: ServiceSettings, *, name: str) -> None:
        self._settings = settings
        self._name = name
        self._services: list[tuple[AddServicerFn, Any, str]] = []
        self._stop_callbacks: list[StopCallback] = []
        self._server: grpc.aio.Server | None = None
        self._health: grpc_health.aio.HealthServicer | None = None
        self._port: int | None = None
        self._metrics: MetricsEndpoint | None = None
        self._stop_requested = asyncio.Event()
        self._stopping = False
        self._stopped = asyncio.Event()

    def add_service(self, add_fn: AddServicerFn, servicer: Any, full_name: str) -> None:
        """Register a servicer (before `start`); `full_name` is its proto name for health and reflection."""
        if self._server is not None:
            raise RuntimeError(f"add_service({full_name!r}) after start(); register services first")
        self._services.append((add_fn, servicer, full_name))

    def on_stop(self, fn: StopCallback) -> None:
        """Run `fn` after the server has stopped; callbacks run in reverse order of registration."""
        self._stop_callbacks.append(fn)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0); only valid after `start`."""
        if self._port is None:
            raise RuntimeError("server not started; call start() first")
        return self._port

    @property
    def metrics_port(self) -> int | None:
        """The bound port of the /metrics endpoint, when metrics are on and the server started."""
        return self._metrics.port if self._metrics is not None else None

    async def start(self) -> int:
        """Bind `host:port`, start serving and mark every service SERVING; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("server already started")
        settings = self._settings
        interceptors: list[grpc.aio.ServerInterceptor] = [ErrorInterceptor(self._name)]
        if settings.auth_enabled:
            interceptors.append(BearerAuthInterceptor(settings.auth_tokens()))
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_send_message_length", settings.max_message_bytes),
                ("grpc.max_receive_message_length", settings.max_message_bytes),
                # Fail loudly when the port is taken instead of silently sharing it.
                ("grpc.so_reuseport", 0),
            ],
        )
        for add_fn, servicer, _ in self._services:
            add_fn(servicer, server)
        health = grpc_health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        names = [full_name for _, _, full_name in self._services]
        reflection.enable_server_reflection([*names, grpc_health.SERVICE_NAME, reflection.SERVICE_NAME], server)

        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        address = f"{host}:{settings.port}"
        try:
            if settings.tls_cert_file is not None and settings.tls_key_file is not None:
                port = server.add_secure_port(address, _server_credentials(settings))
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(
                f"{self._name}: cannot listen on {address}; is the port in use or the host not local?"
            ) from exc
        for service in ["", *names]:  # before start, so no probe ever sees a service as unknown
            await health.set(service, health_pb2.HealthCheckResponse.SERVING)
        await server.start()
        self._server, self._health, self._port = server, health, port
        if settings.metrics_port is not None:
            self._metrics = MetricsEndpoint(settings.host, settings.metrics_port)
        _log.info(
            "%s listening on %s:%d",
            self._name,
            host,
            port,
            extra={
                "service": self._name,
                "address": f"{host}:{port}",
                "services": names,
                "auth": settings.auth_enabled,
                "tls": "mutual" if settings.tls_client_ca_file else bool(settings.tls_cert_file),
            },
        )
        return port

    async def stop(self) -> None:
        """Stop gracefully: health NOT_SERVING, drain in-flight RPCs for the grace period, run callbacks.

        Safe to call more than once or concurrently; later calls wait for the first to finish.
        """
        self._stop_requested.set()
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        grace = self._settings.grace_period_s
        try:
            _log.info(
                "%s shutting down (grace %.1fs)", self._name, grace, extra={"service": self._name, "grace_s": grace}
            )
            # 1. Tell load balancers and probes first, so no new work is routed here.
            if self._health is not None:
                await self._health.enter_graceful_shutdown()
            # 2. Refuse new RPCs and let in-flight ones finish; cancel what remains after `grace`.
            if self._server is not None:
                await self._server.stop(grace)
            if self._metrics is not None:
                self._metrics.close()
            # 3. Close what the servicers used (backends, event bus), last registered first.
            for callback in reversed(self._stop_callbacks):
                try:
                    await callback()
                except Exception:
                    # Keep closing the rest: one broken backend must not leak the others.
                    _log.exception("%s: stop callback %r failed", self._name, callback, extra={"service": self._name})
            _log.info("%s stopped", self._name, extra={"service": self._name})
        finally:
            self._stopped.set()

    async def serve(self) -> None:
        """Start, then run until SIGTERM/SIGINT or `stop()`; returns once fully stopped.

        After the first signal the previous handlers are back, so a second Ctrl-C or
        SIGTERM ends the process at once instead of waiting for the drain.
        """
        await self.start()
        loop = asyncio.get_running_loop()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        for sig in previous:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self._stop_requested.wait()
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)
            # Also on cancellation: a cancelled serve() still drains and closes the backends.
            await self.stop()

    def _on_signal(self, sig: signal.Signals) -> None:
        _log.info("%s received %s", self._name, sig.name, extra={"service": self._name, "signal": sig.name})
        self._stop_requested.set()


def _server_credentials(settings: ServiceSettings) -> grpc.ServerCredentials:
    """TLS for the gRPC port; with a client CA, clients must present a certificate (mutual TLS)."""
    assert settings.tls_cert_file is not None and settings.tls_key_file is not None
    client_ca = settings.tls_client_ca_file.read_bytes() if settings.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )

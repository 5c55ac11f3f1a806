"""The services' HTTP endpoints (env's REST gateway, inference's OpenAI API, the recording proxy): one aiohttp
application listening on host:port, stopped with the service's grace period."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from orchard.errors import FailedPrecondition


class HttpSite:
    """Runs one aiohttp application. `start` binds (port 0 picks a free one) and returns the bound port; `stop`
    stops accepting, lets requests in flight finish for the grace period, then closes (safe to repeat)."""

    def __init__(self, port_flag: str = "--http-port", port_field: str = "http_port") -> None:
        self._port_flag, self._port_field = port_flag, port_field
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0); only valid after `start`."""
        if self._port is None:
            raise RuntimeError("HTTP endpoint not started; call start() first")
        return self._port

    async def start(
        self, app: web.Application, host: str, port: int, grace_period_s: float, **runner_options: Any
    ) -> int:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=grace_period_s, **runner_options)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as err:
            await runner.cleanup()
            raise FailedPrecondition(
                f"cannot listen for HTTP on {host}:{port} ({err.strerror}); is the port in "
                f"use? choose another with {self._port_flag}",
                field=self._port_field,
            ) from None
        self._runner, self._port = runner, runner.addresses[0][1]
        return self._port

    async def stop(self) -> bool:
        """Whether this call stopped it (False: it was not running)."""
        runner, self._runner = self._runner, None
        if runner is None:
            return False
        await runner.cleanup()
        return True

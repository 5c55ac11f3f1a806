"""The entry point every service's `main` shares: settings from env vars and flags, logging, then the service's
async `serve` until SIGTERM/SIGINT, with start-up problems said in one line instead of a traceback."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from orchard.errors import OrchardError
from orchard.runtime.logs import configure_logging
from orchard.runtime.settings import ServiceSettings, SettingsError, load_settings

S = TypeVar("S", bound=ServiceSettings)


def run_service(
    name: str,
    settings_class: type[S],
    serve: Callable[[S], Coroutine[Any, Any, None]],
    argv: Sequence[str] | None = None,
) -> None:
    """`orchard serve <name>`: exits with "orchard serve <name>: <what is wrong>" on a bad setting or an
    OrchardError at start-up (port taken, a dependency unreachable, a missing model ...)."""
    try:
        settings = load_settings(settings_class, argv)
    except SettingsError as err:
        raise SystemExit(f"orchard serve {name}: {err}") from None
    configure_logging(settings.log_level, settings.log_format)
    try:
        asyncio.run(serve(settings))
    except OrchardError as err:
        raise SystemExit(f"orchard serve {name}: {err.message}") from None

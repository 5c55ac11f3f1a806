"""Sandbox backends by name. Adding one means one new module and one line here."""

from __future__ import annotations

import importlib
from typing import Any

from orchard.errors import InvalidArgument

BACKENDS: dict[str, str] = {
    "local": "orchard.services.env.backends.local:LocalBackend",
    "docker": "orchard.services.env.backends.docker:DockerBackend",
    "kubernetes": "orchard.services.env.backends.kubernetes:KubernetesBackend",
}


def load_backend_class(name: str) -> Any:
    """The backend class registered under name, imported lazily."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise InvalidArgument(f"unknown sandbox backend {name!r}; valid: {', '.join(sorted(BACKENDS))}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)

"""Experience stores, chosen by the store URL's scheme. Adding one means one new module and one line here."""

from __future__ import annotations

import importlib

from orchard.services.experience.backends.base import SqlStore

STORES: dict[str, str] = {
    "sqlite": "orchard.services.experience.backends.sqlite:SqliteStore",
    "postgresql": "orchard.services.experience.backends.postgres:PostgresStore",
    "postgres": "orchard.services.experience.backends.postgres:PostgresStore",
}


def load_store(url: str) -> SqlStore:
    """The (unopened) store for `url`; ValueError naming the valid schemes otherwise."""
    scheme = url.split(":", 1)[0]
    if scheme not in STORES:
        raise ValueError(
            f"unknown store URL scheme {scheme!r} in {url!r}; use one of: {', '.join(s + '://' for s in STORES)}"
        )
    module, _, name = STORES[scheme].partition(":")
    store: SqlStore = getattr(importlib.import_module(module), name)(url)
    return store

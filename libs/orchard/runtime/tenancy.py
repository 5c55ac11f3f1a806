"""Tenants: with auth on, each bearer token is a tenant, and every request runs as its tenant.

The tenant of the request being served is in a context variable, set by the transport's auth check (gRPC
interceptor, HTTP middleware) and read by domain code that scopes resources to tenants. Work a service does on
its own (expiry sweeps, shutdown) runs as SYSTEM, which sees every tenant's resources.
"""

from __future__ import annotations

import contextlib
import hmac
import re
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

DEFAULT_TENANT = "default"
"""The tenant of the single `auth_token`, and of every request when auth is off."""
SYSTEM = "*"
"""The service's own work: sees and may act on every tenant's resources."""

_TENANT: ContextVar[str] = ContextVar("orchard_tenant", default=DEFAULT_TENANT)
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


def current_tenant() -> str:
    return _TENANT.get()


def set_tenant(tenant: str) -> None:
    """Make `tenant` the current one for the rest of this task (a request's handler runs in its own task)."""
    _TENANT.set(tenant)


@contextlib.contextmanager
def as_tenant(tenant: str) -> Iterator[None]:
    token = _TENANT.set(tenant)
    try:
        yield
    finally:
        _TENANT.reset(token)


def may_access(owner: str) -> bool:
    """Whether the current tenant may see a resource owned by `owner`."""
    tenant = _TENANT.get()
    return tenant == SYSTEM or tenant == owner


def load_tokens(auth_token: str | None, tokens_file: Path | None) -> dict[str, str]:
    """token -> tenant, from the single auth_token (tenant "default") and a file of `tenant:token` lines
    (`#` starts a comment). Raises ValueError naming the line when the file is malformed."""
    tokens: dict[str, str] = {}
    if auth_token is not None:
        tokens[auth_token] = DEFAULT_TENANT
    if tokens_file is not None:
        for number, raw in enumerate(tokens_file.read_text().splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            tenant, sep, token = line.partition(":")
            tenant, token = tenant.strip(), token.strip()
            if not sep or not _NAME.match(tenant) or len(token) < 8:
                raise ValueError(
                    f"{tokens_file}:{number}: expected `tenant:token` with a tenant of lowercase "
                    "letters, digits, '.', '_' or '-' and a token of at least 8 characters"
                )
            if token in tokens:
                raise ValueError(f"{tokens_file}:{number}: this token is already given to tenant {tokens[token]!r}")
            tokens[token] = tenant
    return tokens


def tenant_of(sent: str, tokens: dict[str, str]) -> str | None:
    """The tenant whose token was sent, comparing every token in constant time; None when none matches."""
    found = None
    for token, tenant in tokens.items():
        if hmac.compare_digest(sent.encode(), token.encode()):
            found = tenant
    return found

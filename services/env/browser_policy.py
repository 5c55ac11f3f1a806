"""Which destinations a browser sandbox may reach: its network policy's egress rules applied to URLs and to
the host:port pairs its proxy is asked for. Pure functions, no I/O."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from orchard.services.env.backends.base import EgressRule

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
LOCAL_SCHEMES = frozenset({"about", "data", "blob"})
"""Schemes that never leave the browser, so every policy admits them."""
NAVIGABLE_SCHEMES = frozenset({"http", "https", "about", "data"})
"""Schemes Act NAVIGATE accepts."""


@dataclass(frozen=True)
class Target:
    """A network destination: a host (a name, or an IP address without brackets) and a port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def url_target(url: str) -> Target | None:
    """The destination an http(s)/ws(s) URL connects to; None for a URL that stays in the browser (about:,
    data:, blob:). Raises ValueError for other schemes and for URLs without a host."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in LOCAL_SCHEMES:
        return None
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"scheme {scheme or '(none)'!r} is not http, https, ws or wss")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise ValueError("the URL has no host")
    port = parts.port or DEFAULT_PORTS[scheme]  # .port raises ValueError when out of range
    return Target(host.lower(), port)


def authority_target(authority: str) -> Target:
    """The destination of a proxy CONNECT request's "host:port" (IPv6 in brackets); raises ValueError."""
    host, sep, port = authority.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{authority!r} is not host:port")
    host = host.removeprefix("[").removesuffix("]").rstrip(".").lower()
    if not host:
        raise ValueError(f"{authority!r} has no host")
    return Target(host, int(port))


def ip_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def needs_addresses(rules: Sequence[EgressRule], target: Target) -> bool:
    """True when only the addresses target.host resolves to can decide: it is a name no host rule admits, and
    some CIDR rule covers its port."""
    if ip_of(target.host) is not None or admits(rules, target):
        return False
    return any(rule.cidr and rule.port in (0, target.port) for rule in rules)


def admits(rules: Sequence[EgressRule], target: Target, addresses: Sequence[str] = ()) -> bool:
    """Whether some rule admits target: a host rule by name (case-insensitive, exact: no subdomains), a CIDR
    rule by the literal IP of target.host or, for a name, by one of `addresses` (what it resolved to); a rule's
    port 0 means any port. No rules admit nothing."""
    literal = ip_of(target.host)
    candidates = [literal] if literal is not None else [a for a in map(ip_of, addresses) if a is not None]
    for rule in rules:
        if rule.port not in (0, target.port):
            continue
        if rule.host and rule.host.rstrip(".").lower() == target.host:
            return True
        if rule.cidr:
            network = ipaddress.ip_network(rule.cidr, strict=False)
            if any(address.version == network.version and address in network for address in candidates):
                return True
    return False


def admitted_addresses(rules: Sequence[EgressRule], target: Target, addresses: Sequence[str]) -> list[str]:
    """Those of `addresses` (target.host resolved) that a CIDR rule admits, so a connection goes to an address
    that was checked rather than to whatever a second lookup returns."""
    return [a for a in addresses if admits([r for r in rules if r.cidr], Target(a, target.port))]

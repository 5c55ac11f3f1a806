"""Egress allowlists of a rootless `local` sandbox. Its network namespace is made by pasta (the passt package): a
user and network namespace of the service's user with a tap device, whose traffic pasta carries out through this
host's own sockets. The allowlist is nftables rules inside that namespace, loaded before the sandbox starts and
swapped in one transaction later; the sandbox's processes have no capabilities to change them.

There is no host side to filter on (the root mode's veth and host table): traffic leaves as this user's connections,
so the rules also refuse this host's own addresses unless a rule names that one address (as the root mode's host
table does), pasta maps nothing to the host's loopback (--no-map-gw, -T/-U none) and forwards no port inwards.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
from dataclasses import dataclass

from orchard.errors import FailedPrecondition, Unavailable
from orchard.services.env.backends.base import EgressRule
from orchard.services.env.backends.network import Allowed, CommandFailed, _run, inner_ruleset, resolve

TUN = "/dev/net/tun"
PASTA_ARGS = (
    *("--config-net", "--quiet", "--foreground", "--no-map-gw"),
    *("-t", "none", "-u", "none", "-T", "none", "-U", "none"),  # no ports forwarded in, none to the host's loopback
)
# Run by /bin/sh inside pasta's namespaces, as their root: load the allowlist ($1), then exec the rest.
NET_SCRIPT = 'printf "%s" "$1" | nft -f - || exit 125; shift; exec "$@"'


def ruleset(allowed: list[Allowed], protected: list[str]) -> str:
    """The sandbox's rules, one transaction that replaces the last: only allowed destinations leave, and of this
    host's own addresses (`protected`) only those a rule names one by one."""
    single = "".join(f"    {a.match()} accept\n" for a in allowed if a.single_address)
    guards = ""
    for family, version in (("ip", 4), ("ip6", 6)):
        addresses = [a for a in protected if ipaddress.ip_address(a).version == version]
        if addresses:
            guards += f"    {family} daddr {{ {', '.join(addresses)} }} reject with icmpx type admin-prohibited\n"
    return inner_ruleset(allowed, first=single + guards)


def check_host() -> None:
    """FailedPrecondition naming what this host lacks for rootless allowlists, if anything."""
    missing = [tool for tool in ("pasta", "nft", "nsenter", "setpriv") if shutil.which(tool) is None]
    if missing:
        raise FailedPrecondition(
            f"egress allowlists of a rootless env service need {', '.join(missing)} on its host (apt-get install "
            "passt nftables util-linux, or run scripts/install.sh); create the sandbox without a network policy",
            field="network_policy",
        )
    if not os.access(TUN, os.R_OK | os.W_OK):
        raise FailedPrecondition(
            f"egress allowlists of a rootless env service need {TUN} usable by its user (uid {os.geteuid()}): pasta "
            f"opens a tap device with it; `chmod 0666 {TUN}` (Debian's and Ubuntu's default mode), or run the env "
            "service as root; create the sandbox without a network policy meanwhile",
            field="network_policy",
        )


async def host_addresses() -> list[str]:
    """This host's own addresses but loopback ones (a sandbox's loopback is its own)."""
    links = json.loads(await _run("ip", "-j", "addr", "show"))
    found = {info["local"] for link in links for info in link.get("addr_info", []) if "local" in info}
    return sorted(a for a in found if not ipaddress.ip_address(a).is_loopback)


@dataclass
class _Net:
    pid: int = 0
    """A process in the sandbox's user and network namespaces (bwrap, pasta's child), once it has started."""


class RootlessNetworks:
    """The pasta namespaces of one rootless env service's sandboxes with a network policy."""

    def __init__(self) -> None:
        self._nets: dict[str, _Net] = {}
        self._nftables_checked = False

    async def _check_nftables(self) -> None:
        """Once: load a table of nftables' inet family in a network namespace of this user, as each allowlisted
        sandbox's rules will be; FailedPrecondition naming what the kernel lacks if it refuses (the sandbox's agent
        would otherwise fail to start with nft's message in its log)."""
        if self._nftables_checked:
            return
        try:
            await _run("unshare", "--user", "--map-root-user", "--net", "nft", "-f", "-", stdin="table inet probe {}\n")
        except CommandFailed as err:
            raise FailedPrecondition(
                f"egress allowlists of a rootless env service need nftables' inet family in the sandbox's network "
                f"namespace, and this kernel refuses it: {err} (CONFIG_NF_TABLES_INET); create the sandbox without a "
                "network policy",
                field="network_policy",
            ) from None
        self._nftables_checked = True

    def __contains__(self, sandbox_id: str) -> bool:
        return sandbox_id in self._nets

    async def enter_argv(self, sandbox_id: str, rules: tuple[EgressRule, ...], argv: list[str]) -> list[str]:
        """argv behind pasta (dying with this service) and the sandbox's allowlist, loaded before argv starts; the
        caller has made sure of the host with check_host."""
        await self._check_nftables()
        allowed = await resolve(rules)
        text = ruleset(allowed, await host_addresses())
        self._nets[sandbox_id] = _Net()
        return [
            "setpriv",
            "--pdeathsig",
            "KILL",
            "pasta",
            *PASTA_ARGS,
            "--",
            "/bin/sh",
            "-c",
            NET_SCRIPT,
            "sh",
            text,
            *argv,
        ]

    def started(self, sandbox_id: str, pid: int) -> None:
        """Note the process whose namespaces later rule changes enter."""
        self._nets[sandbox_id].pid = pid

    async def apply(self, sandbox_id: str, rules: tuple[EgressRule, ...]) -> None:
        """Replace the sandbox's allowlist (no rules: it may reach nothing)."""
        net = self._nets[sandbox_id]
        text = ruleset(await resolve(rules), await host_addresses())
        try:
            await _run(
                "nsenter", "-t", str(net.pid), "-U", "-n", "--preserve-credentials", "nft", "-f", "-", stdin=text
            )
        except CommandFailed as err:
            raise Unavailable(f"cannot change the network policy of sandbox {sandbox_id!r}: {err}") from None

    def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone (its namespaces went with its processes)."""
        self._nets.pop(sandbox_id, None)

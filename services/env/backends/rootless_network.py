"""Egress allowlists of a rootless `local` sandbox. Its network namespace is made by pasta (the passt package): a
user and network namespace of the service's user with a tap device, whose traffic pasta carries out through this
host's own sockets. The allowlist is firewall rules inside that namespace (nftables', or legacy iptables' where the
kernel lacks nftables' inet family: network.choose_firewall), loaded before the sandbox starts and swapped in one
transaction later; the sandbox's processes have no capabilities to change them.

There is no host side to filter on (the root mode's veth and host table): traffic leaves as this user's connections,
so the rules also refuse this host's own addresses unless a rule names that one address (as the root mode's host
table does), pasta maps nothing to the host's loopback (--no-map-gw, -T/-U none) and forwards no port inwards.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from orchard.errors import FailedPrecondition, Unavailable
from orchard.services.env.backends.base import EgressRule
from orchard.services.env.backends.network import (
    CommandFailed,
    FirewallChoice,
    Load,
    _all,
    _run,
    inner_loads,
    resolve,
)

TUN = "/dev/net/tun"
PASTA_ARGS = (
    *("--config-net", "--quiet", "--foreground", "--no-map-gw"),
    *("-t", "none", "-u", "none", "-T", "none", "-U", "none"),  # no ports forwarded in, none to the host's loopback
)


def net_script(loads: list[Load]) -> list[str]:
    """/bin/sh's arguments that, inside pasta's namespaces as their root, load the allowlist (each load's text is an
    argument), then exec the arguments after them with a /proc of pasta's PID namespace.

    pasta makes a PID namespace too but leaves this host's /proc, where bwrap then looked up its sandbox's init by
    the pid it has in pasta's namespace (`open /proc/7/ns failed` whenever this host had no such pid, as a user-mode
    Linux VM's kernel threads come and go): a mount namespace of its own with a fresh /proc gives it the right one
    (unshare execs, so the pid stays the one whose namespaces `apply` enters)."""
    steps = "".join(f'printf "%s" "$1" | {shlex.join(argv)} || exit 125; shift; ' for argv, _ in loads)
    return ["-c", f'{steps}exec unshare --mount --mount-proc "$@"', "sh", *(text for _, text in loads)]


def check_host() -> None:
    """FailedPrecondition naming what this host lacks for rootless allowlists, if anything."""
    missing = [tool for tool in ("pasta", "nsenter", "setpriv") if shutil.which(tool) is None]
    if missing:
        raise FailedPrecondition(
            f"egress allowlists of a rootless env service need {', '.join(missing)} on its host (apt-get install "
            "passt util-linux, or run scripts/install.sh); create the sandbox without a network policy",
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

    def __init__(self, state_dir: Path, firewall: str = "auto") -> None:
        self._nets: dict[str, _Net] = {}
        # Legacy iptables takes /run/xtables.lock, root's file: this user's own instead (each sandbox's rules are in
        # a namespace of its own, so the lock guards nothing shared).
        self._lock = str(state_dir.resolve() / "xtables.lock")
        netns = ["unshare", "--user", "--map-root-user", "--net"]
        self._firewall = FirewallChoice(firewall, netns, host=False, lock=self._lock)

    async def _loads(self, rules: tuple[EgressRule, ...]) -> list[Load]:
        """The sandbox's rules with the firewall chosen once, by loading a sandbox's rules in a network namespace of
        this user (FailedPrecondition naming what the kernel lacks if none works: the sandbox's agent would otherwise
        fail to start with the firewall's message in its log)."""
        firewall = await self._firewall.get()
        return inner_loads(firewall, await resolve(rules), await host_addresses(), self._lock)

    def __contains__(self, sandbox_id: str) -> bool:
        return sandbox_id in self._nets

    async def enter_argv(self, sandbox_id: str, rules: tuple[EgressRule, ...], argv: list[str]) -> list[str]:
        """argv behind pasta (dying with this service) and the sandbox's allowlist, loaded before argv starts; the
        caller has made sure of the host with check_host."""
        loads = await self._loads(rules)
        self._nets[sandbox_id] = _Net()
        return ["setpriv", "--pdeathsig", "KILL", "pasta", *PASTA_ARGS, "--", "/bin/sh", *net_script(loads), *argv]

    def started(self, sandbox_id: str, pid: int) -> None:
        """Note the process whose namespaces later rule changes enter."""
        self._nets[sandbox_id].pid = pid

    async def apply(self, sandbox_id: str, rules: tuple[EgressRule, ...]) -> None:
        """Replace the sandbox's allowlist (no rules: it may reach nothing)."""
        net = self._nets[sandbox_id]
        inside = ["nsenter", "-t", str(net.pid), "-U", "-n", "--preserve-credentials"]
        try:
            await _all(*(_run(*inside, *argv, stdin=text) for argv, text in await self._loads(rules)))
        except CommandFailed as err:
            raise Unavailable(f"cannot change the network policy of sandbox {sandbox_id!r}: {err}") from None

    def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone (its namespaces went with its processes)."""
        self._nets.pop(sandbox_id, None)

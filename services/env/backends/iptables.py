"""Egress allowlists rendered for legacy iptables, for kernels without nftables' inet family (Debian's user-mode Linux
kernel has nftables' bridge family only): the same rules as network.py's nftables rule sets, one text per IP version
for iptables-legacy-restore and ip6tables-legacy-restore, each of which swaps a whole table in one step."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # network.py renders through this module
    from orchard.services.env.backends.network import Allowed, Link

VERSIONS = (4, 6)
REJECT = {4: "-j REJECT --reject-with icmp-admin-prohibited", 6: "-j REJECT --reject-with icmp6-adm-prohibited"}
MODULES = ("ip_tables", "iptable_filter", "ip6_tables", "ip6table_filter", "xt_conntrack", "ipt_REJECT", "ip6t_REJECT")
"""The kernel modules a sandbox's own rules need: root's iptables loads them; a rootless service's cannot."""
SUFFIXES = ("in", "fwd", "nat")
"""A sandbox's chains on this host are <service prefix><slot>-<suffix>: at most 17 + 5 + 4 characters (iptables
allows 28), and the prefix finds a crashed run's leftovers as it finds its nftables tables."""


def restore_argv(version: int, *, noflush: bool = False, lock: str = "") -> list[str]:
    """The command that loads one rendered text; `lock`: the xtables lock file where /run/xtables.lock is not this
    user's (a rootless service)."""
    tool = "iptables-legacy-restore" if version == 4 else "ip6tables-legacy-restore"
    # -w: wait for the xtables lock, which every legacy iptables command on this host takes around its
    # read-modify-write of a table, so concurrent sandboxes (and other programs' rules) never lose an update.
    argv = [tool, "-w", *(["--noflush"] if noflush else [])]
    return ["env", f"XTABLES_LOCKFILE={lock}", *argv] if lock else argv


def matches(allowed: Iterable[Allowed], version: int, *, single: bool = False) -> list[str]:
    """The rules of this IP version as iptables matches, one per address and protocol (single: only the rules that
    name one address)."""
    out = []
    for a in allowed:
        if (4 if a.family == "ip" else 6) != version or (single and not a.single_address):
            continue
        protocols = [f" -p {p} --dport {a.port}" for p in ("tcp", "udp")] if a.port else [""]
        out += [f"-d {address}{p}" for address in a.addresses for p in protocols]
    return out


def inner_rules(allowed: list[Allowed], version: int, protected: Iterable[str] = ()) -> str:
    """The sandbox's own rules for one IP version, as inner_ruleset has them: the namespace is the sandbox's alone,
    so its whole filter table is replaced (OUTPUT drops by policy); answers pass by conntrack direction, every other
    outgoing packet is matched against the rules, refused ones get an ICMP error. `protected`: this host's own
    addresses, refused unless a rule names that one address (a rootless sandbox's guards)."""
    guards = [a for a in protected if ipaddress.ip_address(a).version == version]
    lines = [
        "*filter",
        ":INPUT ACCEPT [0:0]",
        ":FORWARD ACCEPT [0:0]",
        ":OUTPUT DROP [0:0]",
        "-A OUTPUT -o lo -j ACCEPT",
        "-A OUTPUT -m conntrack --ctdir REPLY -j ACCEPT",
        *(f"-A OUTPUT {m} -j ACCEPT" for m in (matches(allowed, version, single=True) if guards else [])),
        *(f"-A OUTPUT -d {address} {REJECT[version]}" for address in guards),
        *(f"-A OUTPUT {m} -j ACCEPT" for m in matches(allowed, version)),
        f"-A OUTPUT {REJECT[version]}",
        "COMMIT",
    ]
    return "\n".join(lines) + "\n"


def host_rules(chains: str, link: Link, allowed: list[Allowed], version: int, *, hook: bool) -> str:
    """This host's rules for one sandbox's veth and IP version, as host_ruleset has them, in chains of the sandbox's
    own (`chains` + in/fwd/nat) that iptables-restore --noflush empties and fills anew, leaving every other rule;
    `hook` (once, at create) adds the jumps to them from the built-in chains, ahead of the host's own rules.

    The built-in chains are shared with the host's own rules, where nftables gives the sandbox a table of its own whose
    accepts leave other tables' verdicts standing: so these chains only refuse, and RETURN what they admit, and the
    host's firewall still decides the rest (a FORWARD policy of DROP, Docker's, still wins, as with nftables)."""
    veth, reject = link.veth, REJECT[version]
    in_, fwd, nat = (f"{chains}{suffix}" for suffix in SUFFIXES)
    lines = [
        "*filter",
        f":{in_} - [0:0]",
        f":{fwd} - [0:0]",
        f"-A {in_} -m conntrack --ctdir REPLY -j RETURN",
        # This host's own services only through rules that name one address (a range never opens this host).
        *(f"-A {in_} {m} -j RETURN" for m in matches(allowed, version, single=True)),
        f"-A {in_} {reject}",
        f"-A {fwd} -o {veth} -m conntrack --ctdir REPLY -j RETURN",
        f"-A {fwd} -o {veth} -j DROP",  # nothing opens a connection into the sandbox
        *(f"-A {fwd} -i {veth} {m} -j RETURN" for m in matches(allowed, version)),
        f"-A {fwd} -i {veth} {reject}",
    ]
    if hook:
        lines += [
            f"-I INPUT 1 -i {veth} -j {in_}",
            f"-I FORWARD 1 -i {veth} -j {fwd}",
            f"-I FORWARD 1 -o {veth} -j {fwd}",
        ]
    lines.append("COMMIT")
    if hook and version == 4:  # the sandbox's link is IPv4 only: only that is forwarded, so masqueraded
        lines += [
            "*nat",
            f":{nat} - [0:0]",
            f"-A {nat} ! -o {veth} -j MASQUERADE",
            f"-I POSTROUTING 1 -s {link.sandbox_addr}/32 -j {nat}",  # POSTROUTING knows no input interface
            "COMMIT",
        ]
    return "\n".join(lines) + "\n"


def removal(saved: str, chains: str) -> str:
    """iptables-restore --noflush input that removes, from what iptables-save printed, the chains whose names begin
    with `chains` and the jumps to them ('' when there are none)."""
    tables: dict[str, tuple[list[str], list[str]]] = {}  # table -> (its jumps to delete, its chains)
    table = ""
    for line in saved.splitlines():
        words = line.split()
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":") and words[0][1:].startswith(chains):
            tables.setdefault(table, ([], []))[1].append(words[0][1:])
        elif words[:1] == ["-A"] and not words[1].startswith(chains) and "-j" in words:
            if words[words.index("-j") + 1].startswith(chains):
                tables.setdefault(table, ([], []))[0].append("-D" + line[2:])
    text = ""
    for name, (jumps, own) in tables.items():
        body = [*jumps, *(f"-F {c}" for c in own), *(f"-X {c}" for c in own)]
        text += "\n".join([f"*{name}", *body, "COMMIT"]) + "\n"
    return text

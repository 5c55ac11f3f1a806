"""Run inside the cgroup v2 VM (test_env_cgroup_v2_vm.py) as an unprivileged user whose own cgroup was delegated to
it, as systemd's Delegate=yes gives a user's service: the local backend's cgroups take that group over (moving this
process into its leaf), limit a sandbox's group, and a process joined to it is held to them. Prints one JSON object."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from orchard.services.env.backends.base import Resources
from orchard.services.env.backends.cgroups import CGROUP_FS, Cgroups, enter_argv

MiB = 1 << 20


def main() -> None:
    own_before = Path("/proc/self/cgroup").read_text().split("::")[1].strip()
    cgroups = Cgroups(Path(tempfile.mkdtemp()))
    cgroups.start()
    cgroups.require("the probe", "delegate the controllers")
    joins = cgroups.create("sb-probe", Resources(cpu_millis=500, memory_bytes=64 * MiB, pids=32))
    hog = subprocess.run(enter_argv(joins, [sys.executable, "-c", "x = b'x' * (200 << 20)"]), check=False)
    inside = subprocess.run(
        enter_argv(
            joins, ["sh", "-c", 'g=$(cut -d: -f3 /proc/self/cgroup); echo "$g"; cat "/sys/fs/cgroup$g/pids.max"']
        ),
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    oom_kills = cgroups.oom_kills("sb-probe")
    cgroups.remove("sb-probe")
    cgroups.close()
    subtree = CGROUP_FS / own_before.lstrip("/")
    print(
        json.dumps(
            {
                "own_before": own_before,
                "own_after": Path("/proc/self/cgroup").read_text().split("::")[1].strip(),
                "hog_returncode": hog.returncode,
                "oom_kills": oom_kills,
                "joined": inside,
                "left": sorted(p.name for p in subtree.iterdir() if p.is_dir()),
            }
        )
    )


if __name__ == "__main__":
    main()

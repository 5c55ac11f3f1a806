"""The local backend's cgroup logic that needs no cgroupfs: which hierarchy a mount table gives, this process's
groups, the files and values a sandbox's limits write, and the OOM-kill counters. The kernel's side (delegation,
limits felt, OOM kills) is tested for real in tests/integration/test_env_limits.py, on this machine (cgroup v1) and
in the cgroup v2 VM (test_env_cgroup_v2_vm.py)."""

from __future__ import annotations

import pytest

from orchard.services.env.backends.base import Resources
from orchard.services.env.backends.cgroups import Limit, limit_files, mounted_hierarchy, oom_kill_count, own_groups

ROOT = "22 1 0:21 / / rw,relatime - ext4 /dev/vda rw"
V2 = "29 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate"
HYBRID = [
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755",
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu",
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids",
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw",
]
EMPTIED = "90 31 0:50 / /sys/fs/cgroup rw,relatime - tmpfs none rw"  # a tmpfs mounted over it later hides the rest


@pytest.mark.parametrize(
    ("mounts", "expected"),
    [
        pytest.param([ROOT, V2], "v2", id="unified"),
        pytest.param([ROOT, *HYBRID], "v1", id="hybrid-with-empty-unified"),
        pytest.param([ROOT, *HYBRID[:-1]], "v1", id="legacy"),
        pytest.param([ROOT, *HYBRID, EMPTIED], None, id="hidden-by-tmpfs"),
        pytest.param([ROOT, HYBRID[0], HYBRID[-1]], None, id="only-unified-under-tmpfs"),
        pytest.param([ROOT], None, id="none"),
    ],
)
def test_mounted_hierarchy(mounts: list[str], expected: str | None) -> None:
    assert mounted_hierarchy("\n".join(mounts) + "\n") == expected


def test_own_groups() -> None:
    hybrid = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/c78\n2:cpu,cpuacct:/\n0::/\n"
    assert own_groups(hybrid) == {"name=systemd": "/", "pids": "/", "memory": "/process_api/c78", "cpu": "/",
                                  "cpuacct": "/", "": "/"}  # fmt: skip
    assert own_groups("0::/system.slice/orchard-env.service\n") == {"": "/system.slice/orchard-env.service"}


def test_limit_files() -> None:
    every = Resources(cpu_millis=500, memory_bytes=64 << 20, pids=32)
    assert limit_files("v2", every) == [
        Limit("memory", "memory.max", "67108864"),
        Limit("memory", "memory.swap.max", "0"),
        Limit("cpu", "cpu.max", "50000 100000"),
        Limit("pids", "pids.max", "32"),
    ]
    assert limit_files("v1", every) == [
        Limit("memory", "memory.limit_in_bytes", "67108864"),
        Limit("memory", "memory.memsw.limit_in_bytes", "67108864"),
        Limit("cpu", "cpu.cfs_period_us", "100000"),
        Limit("cpu", "cpu.cfs_quota_us", "50000"),
        Limit("pids", "pids.max", "32"),
    ]
    assert limit_files("v2", Resources(pids=4096)) == [Limit("pids", "pids.max", "4096")]
    assert limit_files("v2", Resources()) == []


def test_oom_kill_count() -> None:
    v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
    v2 = "low 0\nhigh 0\nmax 14\noom 1\noom_kill 1\noom_group_kill 0\n"
    assert (oom_kill_count(v1), oom_kill_count(v2), oom_kill_count("")) == (2, 1, 0)

"""Sandbox records on disk: what a restarted env service reads back."""

from __future__ import annotations

import json
from pathlib import Path

from orchard.services.env import records
from orchard.services.env.backends.base import EgressRule, Resources
from orchard.services.env.backends.docker import oom_kill_count
from orchard.services.env.models import Sandbox


def test_a_record_round_trips(tmp_path: Path) -> None:
    sandbox = Sandbox(
        sandbox_id="sb-1",
        image="python:3.11-slim",
        workdir="/work",
        env={"A": "1"},
        labels={"task": "t"},
        resources=Resources(500, 1 << 30, 64, 0),
        egress=(EgressRule(cidr="10.0.0.0/8", port=443),),
        ttl_s=600.0,
        heartbeat_timeout_s=30.0,
        create_time=1000.5,
        request_id="r1",
        tenant="alice",
        from_snapshot="s",
        layers=("s", "t"),
    )
    records.save(tmp_path, sandbox)
    assert sandbox.key != "sb-1"  # another tenant than the default: its key is made unique across tenants
    assert (tmp_path / f"{sandbox.key}.json").stat().st_mode & 0o777 == 0o600
    [back] = records.load_all(tmp_path)
    fields = (
        "sandbox_id",
        "image",
        "workdir",
        "env",
        "labels",
        "resources",
        "egress",
        "ttl_s",
        "heartbeat_timeout_s",
        "create_time",
        "request_id",
        "tenant",
        "from_snapshot",
        "layers",
        "key",
    )
    assert {f: getattr(back, f) for f in fields} == {f: getattr(sandbox, f) for f in fields}
    records.remove(tmp_path, sandbox.key)
    assert records.load_all(tmp_path) == []


def test_old_and_broken_records(tmp_path: Path) -> None:
    """An older version's record (id, tenant, create time) never reads as expired; a broken one is dropped."""
    (tmp_path / "sb-old.json").write_text(json.dumps({"sandbox_id": "sb-old", "tenant": "t", "create_time": 1.0}))
    (tmp_path / "sb-bad.json").write_text("{not json")
    [old] = records.load_all(tmp_path)
    assert (old.sandbox_id, old.tenant, old.expire_time) == ("sb-old", "t", float("inf"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sb-old.json"]


def test_oom_kill_count() -> None:
    assert oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3  # cgroup v1 memory.oom_control
    assert oom_kill_count("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n") == 2  # v2 memory.events
    assert oom_kill_count("") == 0

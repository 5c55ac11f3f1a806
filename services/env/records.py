"""Sandbox records on disk, one JSON file per live sandbox: what the next run of the env service needs after a
crash, to say what became of a sandbox or, where its backend kept it running, to take it back."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from orchard.services.env.backends.base import EgressRule, Resources
from orchard.services.env.models import Sandbox, SandboxKind

log = logging.getLogger(__name__)


def save(folder: Path, sandbox: Sandbox) -> None:
    """Write (or replace) the sandbox's record in one step; only the service may read it (env may hold secrets)."""
    data: dict[str, Any] = {
        "sandbox_id": sandbox.sandbox_id,
        "tenant": sandbox.tenant,
        "create_time": sandbox.create_time,
        "image": sandbox.image,
        "workdir": sandbox.workdir,
        "env": sandbox.env,
        "labels": sandbox.labels,
        "resources": vars(sandbox.resources),
        "egress": [vars(rule) for rule in sandbox.egress],
        "ttl_s": sandbox.ttl_s,
        "heartbeat_timeout_s": sandbox.heartbeat_timeout_s,
        "request_id": sandbox.request_id,
        "from_snapshot": sandbox.from_snapshot,
        "layers": list(sandbox.layers),
        "kind": sandbox.kind.name.lower(),
        "key": sandbox.key,
        "isolation": sandbox.isolation,
    }
    tmp = folder / f".{sandbox.key}.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out)
    tmp.replace(folder / f"{sandbox.key}.json")


def remove(folder: Path, key: str) -> None:
    (folder / f"{key}.json").unlink(missing_ok=True)


def load_all(folder: Path) -> list[Sandbox]:
    """The sandboxes of every record in folder (not ready: no agent client yet); unreadable records are dropped."""
    sandboxes = []
    for path in sorted(folder.glob("*.json")):
        try:
            sandboxes.append(_sandbox(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("unreadable sandbox record %s", path)
            path.unlink(missing_ok=True)
    for tmp in folder.glob(".*.json.tmp"):  # a save cut short by the crash
        tmp.unlink(missing_ok=True)
    return sandboxes


def _sandbox(data: dict[str, Any]) -> Sandbox:
    # Records of older versions hold only id, tenant and create time: enough to say the sandbox ended (with
    # the restart as the reason, never an expiry).
    return Sandbox(
        sandbox_id=data["sandbox_id"],
        tenant=data["tenant"],
        create_time=float(data["create_time"]),
        image=data.get("image", ""),
        workdir=data.get("workdir", "/"),
        env=dict(data.get("env", {})),
        labels=dict(data.get("labels", {})),
        resources=Resources(**data.get("resources", {})),
        egress=tuple(EgressRule(**rule) for rule in data.get("egress", [])),
        ttl_s=float(data.get("ttl_s", "inf")),
        heartbeat_timeout_s=float(data.get("heartbeat_timeout_s", 0.0)),
        request_id=data.get("request_id", ""),
        from_snapshot=data.get("from_snapshot", ""),
        layers=tuple(data.get("layers", [])),
        kind=SandboxKind[data.get("kind", "container").upper()],
        key=data.get("key", ""),
        isolation=data.get("isolation", "container"),
    )

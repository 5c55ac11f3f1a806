"""Snapshots of sandboxes, for the SandboxManager: taking them in a sandbox's command order, tenants, labels,
limits, and when their files may go. The files themselves are the backend's (SandboxBackend.snapshot).

A snapshot is the sandbox's writable layer, copied; a sandbox made from it stacks that layer (and the layers its
source sandbox was itself made from) over its image, so making N of them copies nothing. Deleting a snapshot
removes it from the API at once; its layer stays on disk while a live sandbox or another snapshot still stacks
it, and goes with the last of them. A snapshot ends with the service unless it was taken with `keep`: then a
record on disk (<state_dir>/snapshot-records) brings it back at the next start, and its files stay until it is
deleted (built environments are kept snapshots).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict

from orchard.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted
from orchard.runtime import tenancy
from orchard.services.env.backends.base import SandboxBackend
from orchard.services.env.labels import check_labels
from orchard.services.env.models import SandboxDirectory, Snapshot
from orchard.services.env.settings import EnvSettings

log = logging.getLogger(__name__)

SNAPSHOT_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def check_id(snapshot_id: str, field: str) -> None:
    if not snapshot_id:
        raise InvalidArgument(f"{field} is required", field=field)
    if not SNAPSHOT_ID.match(snapshot_id):
        raise InvalidArgument(
            f"{field} {snapshot_id!r} must be 1-63 lowercase letters, digits or '-', starting and "
            "ending with a letter or digit",
            field=field,
        )


class Snapshots:
    """Every snapshot of one env service."""

    def __init__(self, settings: EnvSettings, backend: SandboxBackend, directory: SandboxDirectory) -> None:
        self._directory = directory
        self._backend = backend
        self._max = settings.max_snapshots
        self._snapshots: dict[str, Snapshot] = {}
        self._taking: dict[str, tuple[asyncio.Event, tuple[str, ...]]] = {}  # id -> (done, layers it builds on)
        self._retired: dict[str, Snapshot] = {}  # deleted, but its layer is still stacked by something
        self._by_request: dict[tuple[str, str], str] = {}  # (tenant, request_id) -> snapshot id
        self._records = settings.state_dir / "snapshot-records"

    async def start(self) -> None:
        """Take back the kept snapshots of a previous run; remove every other snapshot's files it left."""
        self._records.mkdir(parents=True, exist_ok=True)
        for path in sorted(self._records.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                retired = data.pop("retired", False)
                snapshot = Snapshot(**{**data, "layers": tuple(data["layers"]), "keep": True})
            except (OSError, ValueError, TypeError, KeyError):
                log.warning("unreadable snapshot record %s", path)
                path.unlink(missing_ok=True)
                continue
            (self._retired if retired else self._snapshots)[snapshot.snapshot_id] = snapshot
            if snapshot.request_id and not retired:
                self._by_request[snapshot.tenant, snapshot.request_id] = snapshot.snapshot_id
        used = {layer for s in [*self._snapshots.values(), *self._retired.values()] for layer in s.layers}
        stale = await self._backend.stored_snapshots() - used
        for snapshot_id in stale:
            await self._backend.delete_snapshot(snapshot_id)
        if stale:
            log.info("removed %d snapshots a previous run left", len(stale))
        if self._snapshots:
            log.info("took back %d kept snapshots", len(self._snapshots))
        await self.collect()

    async def close(self) -> None:
        """Remove every snapshot that was not kept (the service is stopping); kept ones stay on disk."""
        kept = {layer for s in [*self._snapshots.values(), *self._retired.values()] if s.keep for layer in s.layers}
        for snapshot_id in {*self._snapshots, *self._retired} - kept:
            await self._backend.delete_snapshot(snapshot_id)

    def _save(self, snapshot: Snapshot, *, retired: bool = False) -> None:
        if not snapshot.keep:
            return
        data = {**asdict(snapshot), "layers": list(snapshot.layers), "retired": retired}
        data.pop("keep")
        tmp = self._records / f".{snapshot.snapshot_id}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        tmp.replace(self._records / f"{snapshot.snapshot_id}.json")

    def _unrecord(self, snapshot_id: str) -> None:
        (self._records / f"{snapshot_id}.json").unlink(missing_ok=True)

    def get(self, snapshot_id: str, field: str = "snapshot_id") -> Snapshot:
        """The snapshot, if the current tenant may see it; another tenant's is NOT_FOUND, so ids don't leak."""
        check_id(snapshot_id, field)
        snapshot = self._snapshots.get(snapshot_id)
        if snapshot is None or not tenancy.may_access(snapshot.tenant):
            raise NotFound(
                f"snapshot {snapshot_id!r} not found (snapshots last until they are deleted or, unless "
                "taken with keep, the env service stops)",
                field=field,
            )
        return snapshot

    async def take(
        self, sandbox_id: str, snapshot_id: str, labels: Mapping[str, str], request_id: str, keep: bool = False
    ) -> Snapshot:
        """Snapshot a ready sandbox between its commands: after those started before, before those started after.

        Processes still running in the background (and terminal sessions, and uploads in flight) are not
        stopped: a file one of them is writing may be caught half written.
        """
        tenant = tenancy.current_tenant()
        if request_id and (earlier := self._by_request.get((tenant, request_id))) is not None:
            if earlier in self._taking:
                await self._taking[earlier][0].wait()
            if earlier in self._snapshots:
                return self._snapshots[earlier]
        if snapshot_id:
            check_id(snapshot_id, "snapshot_id")
            if snapshot_id in self._snapshots or snapshot_id in self._taking or snapshot_id in self._retired:
                raise AlreadyExists(f"snapshot {snapshot_id!r} already exists", field="snapshot_id")
        check_labels(labels)
        if len(self._snapshots) + len(self._taking) >= self._max:
            raise ResourceExhausted(
                f"the service already holds {self._max} snapshots (its limit); delete some or retry later",
                retry_after=5.0,
            )
        sandbox = self._directory.ready_sandbox(sandbox_id)
        snapshot_id = snapshot_id or f"snap-{uuid.uuid4().hex[:12]}"
        done = asyncio.Event()
        self._taking[snapshot_id] = (done, sandbox.layers)
        if request_id:
            self._by_request[tenant, request_id] = snapshot_id
        try:
            async with sandbox.exec_order:
                self._directory.ready_sandbox(sandbox_id)  # it may have failed or gone while earlier commands ran
                files = await self._backend.snapshot(sandbox.key, snapshot_id)
            snapshot = Snapshot(
                snapshot_id=snapshot_id,
                sandbox_id=sandbox_id,
                image=sandbox.image,
                layers=files.layers,
                size_bytes=files.size_bytes,
                labels=dict(labels),
                tenant=sandbox.tenant,
                request_id=request_id,
                keep=keep,
            )
            self._save(snapshot)
            self._snapshots[snapshot_id] = snapshot
        except BaseException:
            if self._by_request.get((tenant, request_id)) == snapshot_id:
                del self._by_request[tenant, request_id]
            raise
        finally:
            del self._taking[snapshot_id]
            done.set()
        return snapshot

    def list(self, label_selector: Mapping[str, str], page_size: int, page_token: str) -> tuple[list[Snapshot], str]:
        if page_size < 0:
            raise InvalidArgument("page_size must not be negative", field="page_size")
        size = min(page_size or 100, 1000)
        after = ""
        if page_token:
            try:
                after = base64.b64decode(page_token.encode(), altchars=b"-_", validate=True).decode()
            except ValueError:
                pass
            if not SNAPSHOT_ID.match(after):
                raise InvalidArgument(
                    "page_token is not one this service issued; pass the next_page_token of the "
                    "previous page, or none for the first",
                    field="page_token",
                )
        matching = sorted(
            (
                s
                for s in self._snapshots.values()
                if s.snapshot_id > after
                and tenancy.may_access(s.tenant)
                and all(s.labels.get(k) == v for k, v in label_selector.items())
            ),
            key=lambda s: s.snapshot_id,
        )
        page = matching[:size]
        token = base64.urlsafe_b64encode(page[-1].snapshot_id.encode()).decode() if len(matching) > size else ""
        return page, token

    async def delete(self, snapshot_id: str) -> Snapshot:
        """Forget the snapshot now; its layer goes once no sandbox or other snapshot stacks it."""
        snapshot = self.get(snapshot_id)
        del self._snapshots[snapshot_id]
        self._by_request.pop((snapshot.tenant, snapshot.request_id), None)
        self._retired[snapshot_id] = snapshot
        self._save(snapshot, retired=True)
        await self.collect()
        return snapshot

    async def collect(self) -> None:
        """Remove the layers of deleted snapshots that nothing stacks any more (after a sandbox or snapshot goes)."""
        if not self._retired:
            return
        used = {layer for s in self._snapshots.values() for layer in s.layers}
        used.update(layer for sb in self._directory.sandboxes.values() for layer in sb.layers)
        used.update(layer for _, layers in self._taking.values() for layer in layers)
        for snapshot_id in [i for i in self._retired if i not in used]:
            await self._backend.delete_snapshot(snapshot_id)
            self._unrecord(snapshot_id)
            self._retired.pop(snapshot_id, None)  # only now may its id be taken again

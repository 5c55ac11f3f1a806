"""Where the recording proxy's records go. One record per proxied call: the request, the (assembled) response,
the rollout id and the call's position in its rollout (`seq`), so a rollout's file replays as a trajectory.

Records go to JSON-lines files, one per rollout (`JsonlRecords`), or, when the proxy has a nats_url, onto the
event bus as RolloutEvents (`NatsRecords`), where the experience service stores them with the rollout's
trajectory."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from nats.aio.client import Client as NatsClient

from orchard import events
from orchard.experience.v1.experience_pb2 import ModelCallRecorded

log = logging.getLogger(__name__)

ROLLOUT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
UNKEYED = "unkeyed"


def check_rollout_id(rollout_id: str) -> str:
    """The id itself, or ValueError saying what an id may hold (it names a file, so no slashes or dots first)."""
    if not ROLLOUT_ID.fullmatch(rollout_id):
        raise ValueError(
            f"invalid rollout id {rollout_id[:200]!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return rollout_id


class RecordSink(Protocol):
    async def write(self, record: dict[str, Any]) -> None:
        """Store one record durably before returning (the proxy answers the client after it)."""
        ...

    async def close(self) -> None: ...


class JsonlRecords:
    """<dir>/<rollout id>.jsonl, one record a line. `seq` counts a rollout's records from 0 and continues
    across restarts (the file's line count is read on a rollout's first record). Writes are serialized per
    rollout and flushed before write() returns, off the event loop."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._next_seq: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def path(self, rollout_id: str) -> Path:
        return self.directory / f"{rollout_id}.jsonl"

    async def write(self, record: dict[str, Any]) -> None:
        rollout_id = record["rollout_id"]
        async with self._locks.setdefault(rollout_id, asyncio.Lock()):
            if rollout_id not in self._next_seq:
                self._next_seq[rollout_id] = await asyncio.to_thread(self._count_lines, rollout_id)
            record["seq"] = self._next_seq[rollout_id]
            line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
            await asyncio.to_thread(self._append, rollout_id, line)
            self._next_seq[rollout_id] += 1

    def _count_lines(self, rollout_id: str) -> int:
        try:
            with self.path(rollout_id).open("rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def _append(self, rollout_id: str, line: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with self.path(rollout_id).open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()

    async def close(self) -> None:
        return None  # every write() already flushed


class NatsRecords:
    """Publishes each record as a RolloutEvent (model_call_recorded) on orchard.rollouts.<run_id>.call, with the
    rollout id as trajectory id, through an EventPublisher: buffered, retried across NATS restarts, never dropped.

    write() returns once JetStream acknowledged the record, or after ack_wait_s with the record still buffered
    and retried in the background (logged): a bus outage delays records but does not fail the model call."""

    def __init__(self, nc: NatsClient, publisher: events.EventPublisher, run_id: str, ack_wait_s: float) -> None:
        self._nc, self._publisher, self._run_id, self._ack_wait_s = nc, publisher, run_id, ack_wait_s
        self._next_seq: dict[str, int] = {}

    @classmethod
    async def connect(cls, url: str, run_id: str, ack_wait_s: float = 5.0) -> NatsRecords:
        nc = await events.connect_nats(url, name="orchard-proxy")
        publisher = events.EventPublisher(nc, close_timeout_s=30)
        try:
            await publisher.start()
        except BaseException:
            await nc.close()
            raise
        return cls(nc, publisher, run_id, ack_wait_s)

    async def write(self, record: dict[str, Any]) -> None:
        rollout_id = record["rollout_id"]
        record["seq"] = self._next_seq.get(rollout_id, 0)
        self._next_seq[rollout_id] = record["seq"] + 1
        call = ModelCallRecorded(
            call_id=uuid.uuid4().hex,
            seq=record["seq"],
            path=record.get("path", ""),
            request_json=json.dumps(record.get("request"), ensure_ascii=False),
            response_json="" if record.get("response") is None else json.dumps(record["response"], ensure_ascii=False),
            http_status=record.get("status", 0),
            stream=bool(record.get("stream")),
            error=record.get("error") or "",
            upstream=record.get("upstream", ""),
        )
        call.latency.FromMilliseconds(int(record.get("latency_ms", 0)))
        event = events.model_call(self._run_id, rollout_id, call)
        event.event_time.FromDatetime(datetime.fromisoformat(record["time"]))
        await self._publisher.publish(event)
        try:
            await self._publisher.flush(self._ack_wait_s)
        except TimeoutError:
            log.warning(
                "record of rollout %s not yet acknowledged by NATS; it stays buffered and is retried (last error: %s)",
                rollout_id,
                self._publisher.stats.last_error,
            )

    async def close(self) -> None:
        try:
            await self._publisher.close()
        finally:
            await self._nc.close()


def read_records(directory: Path, rollout_id: str) -> list[dict[str, Any]]:
    """A rollout's records in order (what a trainer or a test reads back)."""
    path = directory / f"{check_rollout_id(rollout_id)}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

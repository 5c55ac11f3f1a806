"""Where rollout events go: the `EventSink` protocol (the event bus's `orchard.events.EventPublisher` fits it), a
no-op default and an in-memory sink. The events themselves are built by `orchard.events` (started, step,
finished, reward), with the deterministic ids the experience service deduplicates on."""

from __future__ import annotations

from typing import Protocol

from orchard.experience.v1 import experience_pb2 as epb


class EventSink(Protocol):
    """Receives rollout events as they happen. `publish` may raise; the loop logs and carries on, because the
    finished trajectory is authoritative and is also returned to the caller."""

    async def publish(self, event: epb.RolloutEvent) -> None: ...


class NullSink:
    """Drops every event (the default)."""

    async def publish(self, event: epb.RolloutEvent) -> None:
        return None


class ListSink:
    """Keeps every event in memory, in order (for tests and small local runs)."""

    def __init__(self) -> None:
        self.events: list[epb.RolloutEvent] = []

    async def publish(self, event: epb.RolloutEvent) -> None:
        self.events.append(event)

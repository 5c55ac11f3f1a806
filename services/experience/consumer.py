"""The durable JetStream pull consumer that moves rollout events into the store.

Loop: fetch a batch, decode, write it in one transaction, then ack every message (AckPolicy.EXPLICIT).
Not AckPolicy.ALL: after a crash the restarted consumer is handed *new* messages while the dead one's batch
waits out ack_wait, and its first cumulative ack would ack that unwritten batch too, losing it. A crash between commit and ack only means JetStream redelivers the batch
after ack_wait, and the store's idempotent writes make that a no-op: every event is stored exactly once.
Undecodable messages are term()ed (never redelivered) and logged; a failed write naks the batch with a
delay and backs off. NATS restarts are ridden out by nats-py's reconnect plus retries here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from google.protobuf.message import DecodeError
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from orchard.events.subjects import STREAM, SUBJECT_PREFIX, ensure_stream
from orchard.experience.v1.experience_pb2 import RolloutEvent
from orchard.services.experience.backends.base import SqlStore
from prometheus_client import Counter

_log = logging.getLogger("orchard.experience.consumer")

STORED = Counter("orchard_experience_events_written", "Rollout events written to the store (redeliveries included).")
POISON = Counter("orchard_experience_events_poison", "Messages on the rollout stream that are not RolloutEvents.")
WRITE_ERRORS = Counter("orchard_experience_write_errors", "Batches the store failed to write (and that were retried).")


class EventConsumer:
    """Runs the fetch-write-ack loop as one owned task; `stop()` finishes the batch in hand, then returns."""

    def __init__(self, nc: NatsClient, store: SqlStore, *, durable: str, batch_size: int, ack_wait_s: float) -> None:
        self._js = nc.jetstream()
        self._store = store
        self._durable, self._batch_size, self._ack_wait_s = durable, batch_size, ack_wait_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="orchard-experience-consumer")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=10)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task

    async def _subscribe(self):  # type: ignore[no-untyped-def]
        await ensure_stream(self._js)
        config = ConsumerConfig(
            durable_name=self._durable, ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
            ack_wait=self._ack_wait_s, max_ack_pending=max(20_000, 4 * self._batch_size),
            filter_subject=f"{SUBJECT_PREFIX}.>")
        return await self._js.pull_subscribe(f"{SUBJECT_PREFIX}.>", durable=self._durable, stream=STREAM,
                                             config=config)

    async def _run(self) -> None:
        subscription = None
        failures = 0
        while not self._stopping.is_set():
            try:
                if subscription is None:
                    subscription = await self._subscribe()
                try:
                    msgs = await subscription.fetch(self._batch_size, timeout=1)
                except TimeoutError:
                    failures = 0
                    continue  # nothing to do for a second; check for stop and fetch again
                await self._handle(msgs)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as err:  # NATS restarting, store briefly unavailable: back off and go on
                failures += 1
                if failures == 1 or failures % 50 == 0:
                    _log.warning("consuming rollout events failed (%s: %s); retrying", type(err).__name__, err)
                if failures >= 5:
                    subscription = None  # after a server restart the old pull subscription may be stale
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), min(2.0, 0.1 * failures))
        if subscription is not None:
            # Otherwise the connection's drain waits (30 s) on the pull subscription's inbox.
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def _handle(self, msgs: list[Msg]) -> None:
        events = []
        good: list[Msg] = []
        for msg in msgs:
            try:
                events.append(RolloutEvent.FromString(msg.data))
                good.append(msg)
            except DecodeError:
                POISON.inc()
                _log.error("dropping a message on %s that is not a RolloutEvent (%d bytes); term()ed",
                           msg.subject, len(msg.data))
                await msg.term()
        try:
            if events:
                await self._store.write_events(events)
        except Exception:
            WRITE_ERRORS.inc()
            for msg in msgs:
                with contextlib.suppress(Exception):
                    await msg.nak(delay=1)
            raise
        STORED.inc(len(events))
        # Only after the commit above. ack() is a fire-and-forget publish: a lost ack means a redelivery,
        # which the idempotent store absorbs.
        for msg in good:
            await msg.ack()

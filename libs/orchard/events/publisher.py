"""`EventPublisher`: publishes RolloutEvents to JetStream without ever blocking a rollout on a slow bus for
longer than a bound, and without dropping an event it accepted.

    async with EventPublisher.connect("nats://127.0.0.1:4222") as publisher:
        await publisher.publish(events.started(trajectory))   # returns at once while the buffer has room
        ...
        await publisher.flush()                               # optional: wait until the bus stored everything
    # leaving the block flushes (bounded by close_timeout_s) and closes the connection

How it keeps its promises:
- `publish()` only appends to a bounded in-memory buffer; one background task publishes it in batches
  (every message of a batch in one write, then their acknowledgements together, on one reply subscription read
  straight off the wire by `wire.RawParser`; the next batch goes out while the previous one's
  acknowledgements come back) and removes an event only once JetStream acknowledged it. Failed or unanswered
  publishes go back to the buffer and are retried with backoff, across NATS restarts (nats-py reconnects
  forever). Every publish carries
  `Nats-Msg-Id` = event id, so a retry of a publish that was in fact stored is dropped by JetStream's
  duplicate window: at-least-once sends become exactly-once storage.
- Backpressure: when `max_pending` events are waiting, `publish()` waits up to `max_wait_s` for room (counted
  in `stats.backpressure_waits` and the `orchard_events_backpressure` metric) and then raises
  `PublishBackpressure` (RESOURCE_EXHAUSTED). The event was then *not* accepted: the caller still holds it and
  decides (retry later, pause the rollout, fail it). Nothing accepted is ever discarded.
- `close()` flushes for up to `close_timeout_s`; if the bus is still unreachable it raises `Unavailable`
  naming how many events were not published, rather than losing them silently.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from prometheus_client import Counter, Gauge

from orchard.errors import ResourceExhausted, Unavailable
from orchard.events.subjects import STREAM, ensure_stream, subject_of
from orchard.events.wire import raw_subscribe, raw_unsubscribe, send_raw
from orchard.experience.v1.experience_pb2 import RolloutEvent

_log = logging.getLogger("orchard.events")

PUBLISHED = Counter("orchard_events_published", "Rollout events JetStream acknowledged.")
RETRIED = Counter("orchard_events_retried", "Rollout event publishes retried after a failure or timeout.")
BACKPRESSURE = Counter(
    "orchard_events_backpressure", "publish() calls that found the buffer full, by outcome.", ["outcome"]
)
PENDING = Gauge("orchard_events_pending", "Rollout events accepted but not yet acknowledged by JetStream.")


class PublishBackpressure(ResourceExhausted):
    """The publisher's buffer stayed full for max_wait_s: the bus is down or slower than the producers.

    The event was not accepted; retry it later or slow down."""


@dataclass
class PublisherStats:
    """Counters of one publisher since it started."""

    accepted: int = 0
    """Events publish() accepted."""
    published: int = 0
    """Events JetStream acknowledged (duplicates it dropped included)."""
    retries: int = 0
    """Publishes retried after an error or a missing acknowledgement."""
    backpressure_waits: int = 0
    """publish() calls that found the buffer full and had to wait."""
    backpressure_refusals: int = 0
    """publish() calls that raised PublishBackpressure."""
    pending: int = 0
    """Events accepted but not yet acknowledged."""
    last_error: str = ""
    """The latest publish error, for logs and status pages."""


_Outgoing = tuple[bytes, bytes, bytes]
"""An accepted event as it goes on the wire: (subject, header block with its Nats-Msg-Id, serialized event)."""
_NEWLINES = str.maketrans({"\r": " ", "\n": " "})


@dataclass
class _Round:
    """One batch on the wire; acknowledgements come to <reply prefix>.<number>.<index in batch>."""

    number: int
    batch: list[_Outgoing]
    outcomes: list[str | None]
    """Per event: None = no answer yet, "" = stored, or why not."""
    unanswered: int
    answered: asyncio.Event
    deadline: float = 0.0
    """Loop time after which unanswered events count as failed."""


class EventPublisher:
    """Buffers RolloutEvents and publishes them to the ORCHARD_ROLLOUTS stream in the background.

    Args:
        nc: a connected nats-py client (connect() makes one that reconnects forever).
        max_pending: most events buffered (accepted, not yet acknowledged) before publish() waits.
        max_wait_s: longest publish() waits for room before raising PublishBackpressure (0 = never waits).
        batch_size: most publishes in one batch (two batches overlap: one being sent, one awaiting its acks).
        ack_timeout_s: how long to wait for JetStream's acknowledgement before retrying the publish.
        close_timeout_s: how long close() keeps trying to publish what is left.
    """

    def __init__(
        self,
        nc: NatsClient,
        *,
        max_pending: int = 20_000,
        max_wait_s: float = 5.0,
        batch_size: int = 1000,
        ack_timeout_s: float = 5.0,
        close_timeout_s: float = 30.0,
    ) -> None:
        if max_pending < 1 or batch_size < 1:
            raise ValueError("max_pending and batch_size must be at least 1")
        self._nc = nc
        self._js = nc.jetstream()
        self._max_pending, self._max_wait_s = max_pending, max_wait_s
        self._batch_size, self._ack_timeout_s, self._close_timeout_s = batch_size, ack_timeout_s, close_timeout_s
        self._buffer: collections.deque[_Outgoing] = collections.deque()
        self._queued = asyncio.Event()  # set while the buffer holds events
        self._in_flight = 0
        self._changed = asyncio.Condition()  # notified when events leave the buffer (room, flush)
        self._reply_prefix = nc.new_inbox()
        self._replies: Subscription | None = None
        self._round = 0
        self._rounds: dict[int, _Round] = {}  # the batches in flight, by number, oldest first
        self._stream_missing = False
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.stats = PublisherStats()

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, url: str, **options: float) -> AsyncIterator[EventPublisher]:
        """Connect to NATS at `url`, make sure the stream exists, and publish until the block ends."""
        nc = await connect_nats(url)
        publisher = cls(nc, **options)  # type: ignore[arg-type]
        try:
            await publisher.start()
            yield publisher
        finally:
            try:
                await publisher.close()
            finally:
                await nc.close()

    async def start(self) -> None:
        """Ensure the stream exists and start the background sender."""
        await ensure_stream(self._js)
        self._replies = await raw_subscribe(self._nc, f"{self._reply_prefix}.*.*", self._on_reply)
        self._task = asyncio.create_task(self._run(), name="orchard-event-publisher")

    async def publish(self, event: RolloutEvent) -> None:
        """Accept `event` for publishing; returns once it is buffered (not yet stored on the bus).

        Raises:
            ValueError: the event has no id, no kind, or a run id unfit for a subject.
            PublishBackpressure: the buffer stayed full for max_wait_s; the event was not accepted.
        """
        subject = subject_of(event)  # refuse a bad event here, where the caller can fix it, not in the sender
        if self._closed or self._task is None:
            raise RuntimeError("publisher is not running; use `async with EventPublisher.connect(url)`")
        if self._pending() >= self._max_pending:
            await self._wait_for_room(event)
        data = event.SerializeToString()
        msg_id = event.event_id.strip()
        if "\r" in msg_id or "\n" in msg_id:  # as nats-py would put it in a header
            msg_id = msg_id.translate(_NEWLINES)
        self._buffer.append((subject.encode(), b"NATS/1.0\r\nNats-Msg-Id: %s\r\n\r\n" % msg_id.encode(), data))
        self._queued.set()
        self.stats.accepted += 1
        # The gauge follows when a batch is acknowledged: its lock, taken per event, cost more than the rest here.
        self.stats.pending = self._pending()

    async def _wait_for_room(self, event: RolloutEvent) -> None:
        self.stats.backpressure_waits += 1
        BACKPRESSURE.labels("waited").inc()
        try:
            async with asyncio.timeout(self._max_wait_s), self._changed:
                await self._changed.wait_for(lambda: self._pending() < self._max_pending)
        except TimeoutError:
            self.stats.backpressure_refusals += 1
            BACKPRESSURE.labels("refused").inc()
            raise PublishBackpressure(
                f"event {event.event_id!r} not accepted: {self._pending()} events still wait for the bus "
                f"after {self._max_wait_s:.1f}s (last error: {self.stats.last_error or 'none'}); "
                "retry later or slow down",
                retry_after=1.0,
                reason="EVENT_BUFFER_FULL",
            ) from None

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until JetStream acknowledged every accepted event (TimeoutError after `timeout` seconds)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: self._pending() == 0)

    async def close(self) -> None:
        """Flush for up to close_timeout_s, then stop the sender; Unavailable if events remain unpublished."""
        if self._closed:
            return
        try:
            await self.flush(self._close_timeout_s)
        except TimeoutError:
            pass
        finally:
            self._closed = True
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            if self._replies is not None:
                with contextlib.suppress(Exception):
                    await raw_unsubscribe(self._replies)
        left = len(self._buffer)
        if left:
            raise Unavailable(
                f"{left} rollout events were not published: NATS did not acknowledge them within "
                f"{self._close_timeout_s:.0f}s (last error: {self.stats.last_error or 'none'})"
            )

    def _pending(self) -> int:
        return len(self._buffer) + self._in_flight

    def _set_pending(self) -> None:
        self.stats.pending = self._pending()
        PENDING.set(self.stats.pending)

    async def _run(self) -> None:
        """Send batches until cancelled, two at a time: batch n+1 goes on the wire before waiting for batch n's
        acknowledgements, so the bus stores one while the next is sent (one batch at a time left both sides idle
        in turn). Failed events go back to the front of the buffer and are retried."""
        failures = 0
        previous: _Round | None = None
        try:
            while True:
                if previous is None:
                    await self._queued.wait()
                current = None
                if self._buffer:
                    batch = [self._buffer.popleft() for _ in range(min(self._batch_size, len(self._buffer)))]
                    if not self._buffer:
                        self._queued.clear()
                    current = await self._send(batch)
                if previous is not None:
                    failures = await self._finish(previous, failures)
                previous = current
        except asyncio.CancelledError:
            for r in reversed(self._rounds.values()):  # newest first, so the buffer keeps the order they had
                self._buffer.extendleft(reversed(r.batch))  # close() reports them as unpublished
            self._rounds.clear()
            self._in_flight = 0
            raise

    async def _send(self, batch: list[_Outgoing]) -> _Round:
        """Publish every event of `batch` with a reply subject of its own round, as one write. Cheaper than
        `js.publish_async` (a future, a semaphore slot and a parsed PubAck per message) and than nats-py's
        publish per event (subject and header checks, a flush request each)."""
        self._round += 1
        r = _Round(self._round, batch, [None] * len(batch), len(batch), asyncio.Event())
        self._rounds[r.number] = r
        self._in_flight += len(batch)
        nc = self._nc
        reply = b"%s.%d." % (self._reply_prefix.encode(), r.number)
        commands = []
        for i, (subject, header, data) in enumerate(batch):
            if len(data) > nc.max_payload:  # as nats-py's publish would refuse it
                r.outcomes[i] = f"MaxPayloadError: {len(data)} bytes, over the server's max_payload {nc.max_payload}"
                r.unanswered -= 1
                continue
            size = len(header) + len(data)
            commands.append(b"HPUB %s %s%d %d %d\r\n%s%s\r\n" % (subject, reply, i, len(header), size, header, data))
        command = b"".join(commands)
        try:
            if command:
                await send_raw(nc, command)
        except Exception as err:  # disconnected with a full buffer, closing: retry the batch later
            for i, outcome in enumerate(r.outcomes):
                if outcome is None:
                    r.outcomes[i] = f"{type(err).__name__}: {err}"
            r.unanswered = 0
        if not r.unanswered:
            r.answered.set()
        # One deadline for the whole batch: a lost connection must not cost ack_timeout_s per event.
        r.deadline = asyncio.get_running_loop().time() + self._ack_timeout_s
        return r

    async def _finish(self, r: _Round, failures: int) -> int:
        """Wait (up to the round's deadline) for JetStream's answers to `r`, requeue what it did not
        acknowledge, and back off after a failure; returns the count of consecutive failed rounds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(r.deadline):
                await r.answered.wait()
        async with self._changed:
            del self._rounds[r.number]  # here, where nothing suspends: a cancel finds the round or its requeue
            failed = []
            for outgoing, outcome in zip(r.batch, r.outcomes, strict=True):
                if outcome is None:
                    self.stats.last_error = f"no acknowledgement within {self._ack_timeout_s:.1f}s"
                    failed.append(outgoing)
                elif outcome:
                    self.stats.last_error = outcome
                    failed.append(outgoing)
            if failed:
                self._buffer.extendleft(reversed(failed))
                self._queued.set()
            self._in_flight -= len(r.batch)
            done = len(r.batch) - len(failed)
            self.stats.published += done
            PUBLISHED.inc(done)
            self._set_pending()
            self._changed.notify_all()
        if not failed:
            if failures:
                _log.info("publishing rollout events works again after %d failed attempts", failures)
            return 0
        failures += 1
        self.stats.retries += len(failed)
        RETRIED.inc(len(failed))
        if failures == 1:
            _log.warning(
                "publishing rollout events failed (%s); retrying until NATS answers",
                self.stats.last_error,
                extra={"pending": self._pending()},
            )
        if self._stream_missing:
            self._stream_missing = False
            with contextlib.suppress(Exception):
                await ensure_stream(self._js)  # a NATS server that lost its store (e.g. a fresh one)
        # Jittered exponential backoff so a restarting server is not hammered by every producer at once.
        await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)) * random.uniform(0.5, 1.0))
        return failures

    def _on_reply(self, subject: bytes, reply: bytes, header: bytes, payload: bytes) -> None:
        """JetStream's answer to one publish of a round in flight (a retry has the same Nats-Msg-Id, so
        answers to a finished round are ignored)."""
        _, number, index = subject.rsplit(b".", 2)
        r, i = self._rounds.get(int(number)), int(index)
        if r is None or r.outcomes[i] is not None:
            return
        if header.startswith(b"NATS/1.0 503"):  # nothing listens: the stream does not exist
            self._stream_missing = True
            outcome = f"stream {STREAM} not found (the publish had no responders)"
        elif b'"error"' in payload:  # a PubAck is {"stream":..., "seq":...}; an error is {"error": {...}}
            error = json.loads(payload)["error"]
            outcome = f"JetStream refused the publish: {error.get('description')} (code {error.get('code')})"
        else:
            outcome = ""
        r.outcomes[i] = outcome
        r.unanswered -= 1
        if not r.unanswered:
            r.answered.set()


async def connect_nats(url: str, *, name: str = "orchard", first_connect_timeout_s: float = 30.0) -> NatsClient:
    """A nats-py client that reconnects forever once connected (a restarting server is waited for, not fatal).
    The first connection gets first_connect_timeout_s: nats-py would otherwise retry it forever too, and a
    service pointed at the wrong address would hang at start instead of saying so."""

    async def on_error(err: Exception) -> None:
        _log.debug("nats: %s", err)

    clients: list[NatsClient] = []

    async def on_disconnect() -> None:
        if clients and not (clients[0].is_closed or clients[0].is_draining):  # not our own close()
            _log.warning("disconnected from NATS at %s; reconnecting", url)

    async def on_reconnect() -> None:
        _log.info("reconnected to NATS at %s", url)

    try:
        clients.append(
            await asyncio.wait_for(
                nats.connect(
                    url,
                    name=name,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.25,
                    connect_timeout=2,
                    error_cb=on_error,
                    disconnected_cb=on_disconnect,
                    reconnected_cb=on_reconnect,
                ),
                first_connect_timeout_s,
            )
        )
        return clients[0]
    except TimeoutError:
        raise Unavailable(
            f"cannot reach NATS at {url} within {first_connect_timeout_s:.0f}s; is nats-server "
            "running (orchard up starts one)?"
        ) from None
    except Exception as err:
        raise Unavailable(
            f"cannot reach NATS at {url}: {type(err).__name__}: {err}; is nats-server running (orchard up starts one)?"
        ) from err

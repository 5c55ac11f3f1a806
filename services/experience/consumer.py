"""The durable JetStream pull consumer that moves rollout events into the store.

Two owned tasks form a pipeline, so NATS delivery and SQL writes overlap:
1. The puller keeps one pull request (`$JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>`) outstanding while fewer
   than a batch of messages waits, and collects the replies on one inbox subscription. A request with
   `no_wait` and `expires` returns what is there at once, or waits for the first message; it ends when its
   batch is delivered or with one status message (404 No Messages, 408 Request Timeout). nats-py's `fetch()`
   does the same with a task and a timer per message, which cost more CPU than the whole SQL write. The inbox's
   messages come as bytes straight from the protocol parser (`raw_subscribe`): no `Msg` objects, parsed headers or
   queue hop per message.
2. The writer takes up to a batch of waiting messages, decodes them, writes them in one transaction, and
   only then acks each one (AckPolicy.EXPLICIT), the batch's acks sent as one write.
Not AckPolicy.ALL: after a crash the restarted consumer is handed *new* messages while the dead one's batch
waits out ack_wait, and its first cumulative ack would ack that unwritten batch too, losing it. A crash between
commit and ack only means JetStream redelivers the batch after ack_wait, and the store's idempotent writes make
that a no-op: every event is stored exactly once.
Undecodable messages are term()ed (never redelivered) and logged; a failed write naks the batch with a delay
and backs off. NATS restarts are ridden out by nats-py's reconnect (which resubscribes the inbox) plus a new
pull request when the old one goes unanswered.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging

from google.protobuf.message import DecodeError
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from prometheus_client import Counter

from orchard.events.subjects import STREAM, SUBJECT_PREFIX, ensure_stream
from orchard.events.wire import raw_subscribe, raw_unsubscribe, send_raw
from orchard.experience.v1.experience_pb2 import RolloutEvent
from orchard.services.experience.backends.base import SqlStore

_log = logging.getLogger("orchard.experience.consumer")

STORED = Counter("orchard_experience_events_written", "Rollout events written to the store (redeliveries included).")
POISON = Counter("orchard_experience_events_poison", "Messages on the rollout stream that are not RolloutEvents.")
WRITE_ERRORS = Counter("orchard_experience_write_errors", "Batches the store failed to write (and that were retried).")

PULL_EXPIRES_S = 1.0
"""How long a pull request waits for a first message; the puller asks again after it ends."""
_END_OF_REQUEST = (b"404", b"408")
"""Statuses that end a pull request normally: nothing (more) to deliver now, or it expired."""
_ACK, _TERM = b"+ACK", b"+TERM"
_NAK_1S = b'-NAK {"delay": 1000000000}'
"""Redeliver after a second: a failed write is retried soon, but not in a tight loop."""

_Delivery = tuple[bytes, bytes, bytes]
"""A delivered message as it came off the wire: (subject, ack subject, payload)."""


class EventConsumer:
    """Runs the pull and write tasks; `stop()` finishes the batch being written, then returns."""

    def __init__(self, nc: NatsClient, store: SqlStore, *, durable: str, batch_size: int, ack_wait_s: float) -> None:
        self._nc, self._js = nc, nc.jetstream()
        self._store = store
        self._durable, self._batch_size, self._ack_wait_s = durable, batch_size, ack_wait_s
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{durable}"
        self._inbox = nc.new_inbox()
        self._subscription: Subscription | None = None
        # Delivered, not yet taken by the writer. At most ~2 batches: the puller asks for room only.
        self._ready: collections.deque[_Delivery] = collections.deque()
        self._arrived = asyncio.Event()  # set when _ready gains messages
        self._room = asyncio.Event()  # set when the writer took messages out of _ready
        self._request_ended = asyncio.Event()  # set when the pull request in flight got its batch or a status
        self._requested = 0  # messages the pull request in flight may still deliver
        self._request_error = ""  # a status other than 404/408 (consumer deleted, no responders, ...)
        self._runner: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self._runner = asyncio.create_task(self._run(), name="orchard-experience-consumer")

    async def stop(self) -> None:
        self._stopping.set()
        if self._runner is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._runner), timeout=10)
            except TimeoutError:
                self._runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._runner

    async def _run(self) -> None:
        self._subscription = await raw_subscribe(self._nc, self._inbox, self._on_message)
        try:
            async with asyncio.TaskGroup() as tasks:
                puller = tasks.create_task(self._pull(), name="orchard-experience-puller")
                await self._write_loop()
                puller.cancel()
        finally:
            # Otherwise the connection's drain waits (30 s) on the inbox; what was delivered but not written
            # goes back at once (not after ack_wait) to a replica or the next start.
            with contextlib.suppress(Exception):
                await raw_unsubscribe(self._subscription)
            with contextlib.suppress(Exception):
                await self._reply([reply for _, reply, _ in self._ready], b"-NAK")
            self._ready.clear()

    # -- 1. pull ----------------------------------------------------------------------------------------------

    def _on_message(self, subject: bytes, reply: bytes, header: bytes, payload: bytes) -> None:
        """The inbox's route: keep deliveries (they carry an ack subject), and note when the pull request in
        flight has ended (a status message: header `NATS/1.0 <code> <description>`, no ack subject)."""
        if reply:
            self._ready.append((subject, reply, payload))
            self._arrived.set()
            self._requested -= 1
            if self._requested <= 0:
                self._request_ended.set()
            return
        status = header[9:].split(b"\r\n", 1)[0].strip() if header.startswith(b"NATS/1.0 ") else b""
        if status[:3] not in _END_OF_REQUEST:
            self._request_error = status.decode(errors="replace") or "a message without an ack subject"
        self._request_ended.set()

    async def _pull(self) -> None:
        """Keep one pull request outstanding while fewer than batch_size messages wait for the writer."""
        expires_ns = int(PULL_EXPIRES_S * 1e9)
        failures = 0
        check_consumer = True
        while True:
            while len(self._ready) >= self._batch_size:
                self._room.clear()
                await self._room.wait()
            try:
                if check_consumer:
                    await self._ensure_consumer()
                    check_consumer = False
                self._request_ended.clear()
                self._request_error = ""
                self._requested = self._batch_size - len(self._ready)
                request = {"batch": self._requested, "expires": expires_ns, "no_wait": True}
                await self._nc.publish(self._next_subject, json.dumps(request).encode(), reply=self._inbox)
                try:
                    async with asyncio.timeout(PULL_EXPIRES_S + 2):
                        await self._request_ended.wait()
                except TimeoutError:  # lost to a NATS restart: it will never end, ask again
                    raise TimeoutError(f"no answer to the pull request within {PULL_EXPIRES_S + 2:.0f}s") from None
                if self._request_error:
                    raise RuntimeError(f"pull request refused: {self._request_error}")
                failures = 0
            except Exception as err:  # NATS restarting, consumer or stream gone: back off and set them up again
                failures += 1
                check_consumer = True
                if failures == 1 or failures % 50 == 0:
                    _log.warning("pulling rollout events failed (%s: %s); retrying", type(err).__name__, err)
                await asyncio.sleep(min(2.0, 0.1 * failures))

    async def _ensure_consumer(self) -> None:
        """Create the stream and the durable consumer if missing; an existing consumer is left as it is."""
        await ensure_stream(self._js)
        try:
            await self._js.consumer_info(STREAM, self._durable)
        except NotFoundError:
            await self._js.add_consumer(
                STREAM,
                ConsumerConfig(
                    durable_name=self._durable,
                    ack_policy=AckPolicy.EXPLICIT,
                    deliver_policy=DeliverPolicy.ALL,
                    ack_wait=self._ack_wait_s,
                    max_ack_pending=max(20_000, 4 * self._batch_size),
                    filter_subject=f"{SUBJECT_PREFIX}.>",
                ),
            )

    # -- 2. write ---------------------------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            if not self._ready:
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), 1)  # wake up now and then to check for stop
                continue
            msgs = [self._ready.popleft() for _ in range(min(self._batch_size, len(self._ready)))]
            self._room.set()
            try:
                await self._handle(msgs)
                failures = 0
            except Exception as err:  # store briefly unavailable: the batch was nak()ed; back off and go on
                failures += 1
                if failures == 1 or failures % 50 == 0:
                    _log.warning("writing rollout events failed (%s: %s); retrying", type(err).__name__, err)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), min(2.0, 0.1 * failures))

    async def _handle(self, msgs: list[_Delivery]) -> None:
        events = []
        good: list[bytes] = []
        poison: list[bytes] = []
        for subject, reply, data in msgs:
            try:
                events.append(RolloutEvent.FromString(data))
                good.append(reply)
            except DecodeError:
                POISON.inc()
                _log.error(
                    "dropping a message on %s that is not a RolloutEvent (%d bytes); term()ed",
                    subject.decode(errors="replace"),
                    len(data),
                )
                poison.append(reply)
        if poison:
            await self._reply(poison, _TERM)
        try:
            if events:
                await self._store.write_events(events)
        except Exception:
            WRITE_ERRORS.inc()
            with contextlib.suppress(Exception):
                await self._reply(good, _NAK_1S)
            raise
        STORED.inc(len(events))
        # Only after the commit above. The acks are fire-and-forget (buffered, sent by nats-py's flusher):
        # a lost ack means a redelivery, which the idempotent store absorbs.
        await self._reply(good, _ACK)

    async def _reply(self, ack_subjects: list[bytes], payload: bytes) -> None:
        """Send `payload` (+ACK, -NAK, +TERM) to each message's ack subject, all in one write."""
        if ack_subjects:
            tail = b" %d\r\n%s\r\n" % (len(payload), payload)
            await send_raw(self._nc, b"".join(b"PUB " + subject + tail for subject in ack_subjects))

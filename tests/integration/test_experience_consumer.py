"""The experience consumer against a real nats-server and a real SQLite file: each batch it takes is written in
one transaction and acked only after that transaction commits; a batch whose consumer dies between its commit
and its acks, and a batch whose transaction fails, come back from JetStream and are stored exactly once.

The stores here are the real SqliteStore with a spy around it (it records what JetStream had acked when each
batch began, or makes one step fail after the batch's statements ran); every row goes to the real database."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

from experience_helpers import NatsServer, rollout
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from orchard import events
from orchard.events.publisher import connect_nats
from orchard.events.subjects import STREAM
from orchard.experience.v1 import experience_pb2 as pb
from orchard.services.experience.backends.base import Statement
from orchard.services.experience.backends.sqlite import SqliteStore
from orchard.services.experience.consumer import EventConsumer

DURABLE = "orchard-experience-test"
STEPS = 8


def rollouts(n: int) -> list[pb.RolloutEvent]:
    """n whole rollouts of STEPS steps: n * (STEPS + 2) events."""
    return [e for i in range(n) for e in rollout("run-c", f"t{i}", f"task{i}", steps=STEPS)]


async def publish(url: str, published: list[pb.RolloutEvent]) -> None:
    async with events.EventPublisher.connect(url) as publisher:
        for event in published:
            await publisher.publish(event)


async def ack_state(nc: NatsClient) -> tuple[int, int]:
    """(the stream sequence below which JetStream has every ack, acks it still waits for) of the test's consumer."""
    info = await nc.jetstream().consumer_info(STREAM, DURABLE)
    return (info.ack_floor.stream_seq if info.ack_floor else 0), info.num_ack_pending or 0


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.05)


async def assert_stored_once(db: Path, published: list[pb.RolloutEvent], trajectories: int) -> None:
    store = SqliteStore(f"sqlite:///{db}")
    await store.open()
    try:
        assert await store.count_events() == len(published)
        for i in range(trajectories):
            t = await store.get_trajectory(f"t{i}", full=True)
            assert t is not None and (t.step_count, len(t.steps), len(t.rewards)) == (STEPS, STEPS, 1)
    finally:
        await store.close()
    with sqlite3.connect(db) as conn:  # no row twice (primary keys make that impossible; say it anyway)
        assert conn.execute("SELECT count(*), count(DISTINCT event_id) FROM events").fetchone() == (
            len(published),
            len(published),
        )
        assert conn.execute("SELECT count(*) FROM steps").fetchone() == (trajectories * STEPS,)


class AckCheckingStore(SqliteStore):
    """Records, for each batch, its size, JetStream's ack floor when it began and the transactions it took."""

    def __init__(self, url: str, nc: NatsClient) -> None:
        super().__init__(url)
        self.nc = nc
        self.batches: list[tuple[int, int]] = []  # (events, ack floor's stream sequence when the batch began)
        self.transactions = 0

    async def write_events(self, batch: list[pb.RolloutEvent]) -> None:
        await asyncio.sleep(0.05)  # acks sent before this point (on the consumer's own connection) have landed
        ack_floor, _ = await ack_state(self.nc)
        self.batches.append((len(batch), ack_floor))
        await super().write_events(batch)

    async def _transaction(self, statements: list[Statement]) -> None:
        self.transactions += 1
        await super()._transaction(statements)


@contextlib.asynccontextmanager
async def consuming(nc: NatsClient, store: SqliteStore, *, batch_size: int, ack_wait_s: int) -> AsyncIterator[None]:
    """An EventConsumer on `nc` writing to `store` for the block; then the consumer, the store and `nc` are closed."""
    await store.open()
    consumer = EventConsumer(nc, store, durable=DURABLE, batch_size=batch_size, ack_wait_s=ack_wait_s)
    await consumer.start()
    try:
        yield
    finally:
        await consumer.stop()
        await store.close()
        await nc.close()


async def test_each_batch_is_one_transaction_acked_after_its_commit(tmp_path: Path, nats_server: NatsServer) -> None:
    published = rollouts(25)  # 250 events, already in the stream: the consumer finds full batches waiting
    await publish(nats_server.url, published)
    nc = await connect_nats(nats_server.url)
    store = AckCheckingStore(f"sqlite:///{tmp_path / 'e.db'}", nc)
    async with consuming(nc, store, batch_size=100, ack_wait_s=30):
        await until(lambda: _all_acked(nc, len(published)))
    committed = 0
    for size, ack_floor in store.batches:
        assert ack_floor <= committed, store.batches  # nothing of this batch (or later) was acked before its commit
        committed += size
    assert committed == len(published) and store.transactions == len(store.batches), store.batches
    assert len(store.batches) <= len(published) // 10, store.batches  # batched: not a transaction per event
    await assert_stored_once(tmp_path / "e.db", published, 25)


async def _all_acked(nc: NatsClient, n: int) -> bool:
    try:
        return await ack_state(nc) == (n, 0)
    except NotFoundError:  # the consumer has not created its durable yet
        return False


class DiesAfterCommitStore(SqliteStore):
    """Commits its first batch, then loses the consumer's NATS connection before the acks go out (as a
    process killed between the two would)."""

    def __init__(self, url: str, nc: NatsClient) -> None:
        super().__init__(url)
        self.nc = nc
        self.committed = False

    async def _transaction(self, statements: list[Statement]) -> None:
        if self.committed:
            raise ConnectionError("this consumer is dead")
        await super()._transaction(statements)
        self.committed = True
        await self.nc.close()


async def test_a_batch_whose_consumer_died_after_the_commit_is_redelivered_and_stored_once(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    published = rollouts(6)
    await publish(nats_server.url, published)
    db = tmp_path / "e.db"
    nc = await connect_nats(nats_server.url)
    dying = DiesAfterCommitStore(f"sqlite:///{db}", nc)
    await dying.open()
    first = EventConsumer(nc, dying, durable=DURABLE, batch_size=1000, ack_wait_s=1)
    await first.start()
    await until(lambda: _true(dying.committed))
    await first.stop()
    await dying.close()
    rows_after_crash = _count(db)
    assert 0 < rows_after_crash  # the first batch is committed, and none of it was acked

    # A new consumer (a restarted service) gets the unacked batch again after ack_wait and writes it again.
    nc2 = await connect_nats(nats_server.url)
    store = CountingStore(f"sqlite:///{db}")
    async with consuming(nc2, store, batch_size=1000, ack_wait_s=1):
        await until(lambda: _all_acked(nc2, len(published)))
    assert store.written >= rows_after_crash  # the committed batch really came back, and was written again
    await assert_stored_once(db, published, 6)


class CountingStore(SqliteStore):
    """Counts the events handed to it, redeliveries included."""

    written = 0

    async def write_events(self, batch: list[pb.RolloutEvent]) -> None:
        await super().write_events(batch)
        self.written += len(batch)


class FailsOnceStore(SqliteStore):
    """Its first transaction runs every statement of the batch, then fails before the commit (and rolls back)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.attempts = 0

    def _write(self, statements: Sequence[Statement]) -> None:  # type: ignore[override]
        self.attempts += 1
        if self.attempts == 1:
            failing: list[Statement] = [*statements, ("INSERT INTO no_such_table VALUES (?)", [(1,)])]
            super()._write(failing)
        super()._write(list(statements))


async def test_a_failed_transaction_stores_nothing_and_its_batch_comes_back_once(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    published = rollouts(4)
    await publish(nats_server.url, published)
    db = tmp_path / "e.db"
    nc = await connect_nats(nats_server.url)
    store = FailsOnceStore(f"sqlite:///{db}")
    async with consuming(nc, store, batch_size=1000, ack_wait_s=30):
        await until(lambda: _all_acked(nc, len(published)))  # nak(delay=1) brings it back well before ack_wait
    assert store.attempts >= 2  # the failed batch was nak()ed and came back
    await assert_stored_once(db, published, 4)


async def _true(value: bool) -> bool:
    return value


def _count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])


async def test_messages_that_are_not_events_are_terminated_and_the_rest_stored(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    published = rollouts(3)
    await publish(nats_server.url, published)  # creates the stream
    nc = await connect_nats(nats_server.url)
    for i in range(5):  # not RolloutEvents: the consumer must term() them (never redelivered), not stall on them
        await nc.jetstream().publish("orchard.rollouts.run-c.step", b"\xff\xff not a protobuf %d" % i)
    store = CountingStore(f"sqlite:///{tmp_path / 'e.db'}")
    async with consuming(nc, store, batch_size=1000, ack_wait_s=1):
        await until(lambda: _all_acked(nc, len(published) + 5))
        await asyncio.sleep(1.5)  # past ack_wait: nothing comes back
        assert await ack_state(nc) == (len(published) + 5, 0)
    assert store.written == len(published)
    await assert_stored_once(tmp_path / "e.db", published, 3)


async def test_the_consumer_rides_out_a_nats_restart(tmp_path: Path, nats_server: NatsServer) -> None:
    """Through the restart the consumer keeps its connection object: nats-py reconnects it and resubscribes the
    inbox whose messages the consumer reads off the wire itself; the events published after it are stored."""
    published = rollouts(10)
    half = len(published) // 2
    await publish(nats_server.url, published[:half])
    nc = await connect_nats(nats_server.url)
    store = CountingStore(f"sqlite:///{tmp_path / 'e.db'}")
    async with consuming(nc, store, batch_size=30, ack_wait_s=30):
        await until(lambda: _all_acked(nc, half))
        await asyncio.to_thread(nats_server.restart)
        await publish(nats_server.url, published[half:])
        await until(lambda: _all_acked(nc, len(published)), timeout_s=60)
        assert nc.stats["reconnects"] == 1  # the same connection, reconnected
    await assert_stored_once(tmp_path / "e.db", published, 10)

"""EventPublisher against a real nats-server: subjects and Nats-Msg-Id dedupe, bounded backpressure while the
bus is down, and nothing accepted lost when it comes back."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from experience_helpers import NatsServer, rollout
from nats.aio.msg import Msg

from orchard import events
from orchard.events.subjects import STREAM
from orchard.experience.v1 import experience_pb2 as pb
from orchard.types.v1 import types_pb2 as tpb


def msg_id(msg: Msg) -> str:
    """The Nats-Msg-Id header, which the publisher sets on every event."""
    assert msg.headers is not None, msg
    return msg.headers["Nats-Msg-Id"]


async def test_events_land_on_their_subjects_once(tmp_path: Path) -> None:
    nats_server = NatsServer(tmp_path / "nats")
    nats_server.start()
    try:
        sample = rollout("run-1", "t1", "task", steps=2)
        async with events.EventPublisher.connect(nats_server.url) as publisher:
            for event in [*sample, *sample]:  # every event twice: the second copy is a duplicate by Nats-Msg-Id
                await publisher.publish(event)
            await publisher.flush(10)
            js = publisher._js
            assert (await js.stream_info(STREAM)).state.messages == len(sample)
            sub = await js.pull_subscribe("orchard.rollouts.run-1.>", durable="check", stream=STREAM)
            msgs = await sub.fetch(10, timeout=2)
        assert [m.subject.rsplit(".", 1)[1] for m in msgs] == ["started", "step", "step", "finished"]
        assert [msg_id(m) for m in msgs] == [e.event_id for e in sample]
        assert pb.RolloutEvent.FromString(msgs[3].data) == sample[3]
        assert publisher.stats.accepted == 2 * len(sample) and publisher.stats.pending == 0
    finally:
        nats_server.stop()


@pytest.mark.parametrize(
    "event",
    [
        pb.RolloutEvent(event_id="x", run_id="r"),  # no event kind
        pb.RolloutEvent(run_id="r", rollout_step=pb.RolloutStep()),  # no id
        pb.RolloutEvent(event_id="x", run_id="bad.run", rollout_step=pb.RolloutStep()),  # not a subject token
    ],
)
def test_bad_events_are_refused(event: pb.RolloutEvent) -> None:
    with pytest.raises(ValueError, match="event|run id"):
        events.subject_of(event)


async def test_backpressure_is_bounded_and_nothing_is_lost(tmp_path: Path) -> None:
    """With the bus down, publish() accepts up to max_pending, then waits max_wait_s and refuses (the caller keeps
    the event); the sender retries what the bus never acknowledged; once NATS is back every accepted event is
    stored exactly once. The retry path is forced, not hoped for: the bus stays down until a retry happened."""
    nats_server = NatsServer(tmp_path / "nats")
    nats_server.start()
    try:
        async with events.EventPublisher.connect(
            nats_server.url, max_pending=50, max_wait_s=0.3, ack_timeout_s=0.5
        ) as publisher:
            await asyncio.to_thread(nats_server.stop)
            steps = [events.step("run-1", "t1", tpb.Step(index=i)) for i in range(60)]
            for event in steps[:50]:
                await publisher.publish(event)  # returns at once: buffered
            async with asyncio.timeout(60):  # the ack timeout passes with the bus down: those publishes are retried
                while publisher.stats.retries == 0:
                    await asyncio.sleep(0.05)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(events.PublishBackpressure, match="not accepted"):
                await publisher.publish(steps[50])
            assert loop.time() - started >= 0.29  # it waited max_wait_s for room (bounded: pytest's timeout)
            assert publisher.stats.backpressure_refusals >= 1 and publisher.stats.accepted == 50
            await asyncio.to_thread(nats_server.start)
            for event in steps[50:]:  # the refused event and the rest: accepted again once there is room
                async with asyncio.timeout(60):
                    while True:
                        try:
                            await publisher.publish(event)
                            break
                        except events.PublishBackpressure:  # still reconnecting: the caller retries later
                            await asyncio.sleep(0.1)
            await publisher.flush(60)
            assert (publisher.stats.accepted, publisher.stats.pending) == (60, 0)
            js = publisher._js
            assert (await js.stream_info(STREAM)).state.messages == 60
            sub = await js.pull_subscribe("orchard.rollouts.run-1.>", durable="check", stream=STREAM)
            stored: list[str] = []
            # No more messages: everything was read. TimeoutError, not only nats-py's: a fetch whose deadline passed
            # before its waiting pull (a loaded machine) raises asyncio's own.
            with contextlib.suppress(TimeoutError):
                while True:
                    stored += [msg_id(m) for m in await sub.fetch(100, timeout=2)]
        assert sorted(stored) == sorted(e.event_id for e in steps)  # none lost, none stored twice
    finally:
        nats_server.stop()


async def test_overlapping_batches_keep_the_order(tmp_path: Path) -> None:
    """The next batch goes out while the previous one's acknowledgements come back: 1,000 events in batches of
    100 are all acknowledged, land once each, and in the order they were published."""
    nats_server = NatsServer(tmp_path / "nats")
    nats_server.start()
    try:
        steps = [events.step("run-1", "t1", tpb.Step(index=i)) for i in range(1000)]
        async with events.EventPublisher.connect(nats_server.url, batch_size=100) as publisher:
            for event in steps:
                await publisher.publish(event)
            await publisher.flush(30)
            assert (publisher.stats.published, publisher.stats.pending, publisher.stats.retries) == (1000, 0, 0)
            assert (await publisher._js.stream_info(STREAM)).state.messages == 1000
            sub = await publisher._js.pull_subscribe("orchard.rollouts.run-1.>", durable="check", stream=STREAM)
            stored: list[str] = []
            async with asyncio.timeout(60):
                while len(stored) < 1000:
                    with contextlib.suppress(TimeoutError):  # a slow fetch on a loaded machine (nats-py's or asyncio's)
                        stored += [msg_id(m) for m in await sub.fetch(1000 - len(stored), timeout=5)]
        assert stored == [e.event_id for e in steps]
    finally:
        nats_server.stop()


async def test_first_connect_to_a_dead_address_fails_clearly() -> None:
    """No nats-server there: the first connect gives up after its timeout with Unavailable saying what to do
    (nats-py alone would retry it forever and the service would hang at start)."""
    import socket
    import time

    from orchard.errors import Unavailable
    from orchard.events.publisher import connect_nats

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(Unavailable, match="orchard up starts one"):
        await connect_nats(f"nats://127.0.0.1:{port}", first_connect_timeout_s=1.5)
    assert time.monotonic() - started < 10

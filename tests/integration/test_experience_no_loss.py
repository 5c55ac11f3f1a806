"""No event lost or doubled: 100,000 events published while nats-server is restarted once and the experience
service process is SIGKILLed and restarted once; exactly 100,000 distinct events end up stored, each
trajectory whole, and the stream itself holds each event once (Nats-Msg-Id dedupe)."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from experience_helpers import NatsServer, free_port

from orchard import events
from orchard.experience.v1 import experience_pb2 as pb
from orchard.experience.v1 import experience_pb2_grpc
from orchard.types.v1 import types_pb2 as tpb

TRAJECTORIES, STEPS = 10_000, 8
TOTAL = TRAJECTORIES * (STEPS + 2)  # started + steps + finished = 100,000


def all_events() -> list[pb.RolloutEvent]:
    out = []
    for i in range(TRAJECTORIES):
        tid = f"t{i:05d}"
        out.append(events.started(tpb.Trajectory(trajectory_id=tid, run_id="noloss", task_id=f"task{i % 50}")))
        steps = [tpb.Step(index=k, tokens=tpb.TokenSpan(token_ids=[k, k + 1], mask=[1, 0])) for k in range(STEPS)]
        out += [events.step("noloss", tid, s) for s in steps]
        out.append(
            events.finished(
                tpb.Trajectory(
                    trajectory_id=tid,
                    run_id="noloss",
                    task_id=f"task{i % 50}",
                    steps=steps,
                    stop_reason=tpb.STOP_REASON_SUBMITTED,
                )
            )
        )
    return out


def start_service(nats_url: str, db: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchard.services.experience.server",
            "--port",
            str(port),
            "--nats-url",
            nats_url,
            "--store-url",
            f"sqlite:///{db}",
            "--ack-wait-s",
            "3",
            "--log-format",
            "text",
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stored(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db, timeout=30) as conn:
        try:
            return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
        except sqlite3.OperationalError:  # the schema is not created yet
            return 0


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_100k_events_survive_a_nats_restart_and_a_killed_consumer(tmp_path: Path) -> None:
    nats_server = NatsServer(tmp_path / "nats")
    nats_server.start()
    db, port, log = tmp_path / "experience.db", free_port(), tmp_path / "service.log"
    service = start_service(nats_server.url, db, port, log)
    try:
        published = all_events()
        refusals = 0
        async with events.EventPublisher.connect(nats_server.url, max_pending=20_000, max_wait_s=30) as publisher:
            restarted_nats = False
            for n, event in enumerate(published):
                while True:
                    try:
                        await publisher.publish(event)
                        break
                    except events.PublishBackpressure:  # the documented contract: not accepted, try again
                        refusals += 1
                        await asyncio.sleep(0.5)
                if not restarted_nats and n >= 30_000:
                    # 1. The bus goes away mid-stream, with events in flight; the same server comes back.
                    await asyncio.to_thread(nats_server.restart)
                    restarted_nats = True
            # 2. Kill the consumer hard mid-ingest (uncommitted and unacked batches are in flight), then restart it.
            async with asyncio.timeout(120):
                while stored(db) < 40_000:
                    await asyncio.sleep(0.05)
            service.send_signal(signal.SIGKILL)
            service.wait()
            killed_at = stored(db)
            service = start_service(nats_server.url, db, port, log)
            await publisher.flush(120)
            assert publisher.stats.published == TOTAL
            stream = await publisher._js.stream_info(events.STREAM)
            assert stream.state.messages == TOTAL  # retried publishes were deduplicated by Nats-Msg-Id

        async with asyncio.timeout(120):
            while stored(db) < TOTAL:
                assert service.poll() is None, log.read_text()[-3000:]
                await asyncio.sleep(0.2)
        await asyncio.sleep(4)  # past ack_wait: anything redelivered now must not add rows
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*), count(DISTINCT event_id) FROM events").fetchone() == (TOTAL, TOTAL)
            assert conn.execute("SELECT count(*) FROM steps").fetchone()[0] == TRAJECTORIES * STEPS
            assert conn.execute(
                "SELECT count(*), min(step_count), max(step_count) FROM trajectories WHERE state = 2"
            ).fetchone() == (TRAJECTORIES, STEPS, STEPS)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await experience_pb2_grpc.ExperienceServiceStub(channel).QueryStats(
                pb.QueryStatsRequest(), timeout=30, wait_for_ready=True
            )
        assert (reply.total.trajectory_count, reply.total.finished_count) == (TRAJECTORIES, TRAJECTORIES)
        print(
            f"killed the consumer at {killed_at} stored events; publisher retries {publisher.stats.retries}, "
            f"backpressure refusals {refusals}"
        )
    finally:
        if service.poll() is None:
            service.terminate()
            service.wait(timeout=30)
        nats_server.stop()

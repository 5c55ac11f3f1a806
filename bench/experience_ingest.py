"""Experience ingest: events/s from `EventPublisher.publish()` to a stored row in the experience service's store,
against raw JetStream publish (what a user would pick instead: bare `js.publish_async` of the same serialized
payloads with Nats-Msg-Id, up to 1000 in flight, into a stream of the same configuration, no consumer). The two
are alternated in blocks within one run (the order rotating every round) so that load from other work hits both;
each block is reported, with the median of the per-round ratios and the load average at start and end.
Starts its own nats-server and `orchard serve experience` (SQLite, or --store-url) on free ports in a temporary
folder; prints one JSON object. The CPU each process spent per 1,000 events shows where the time goes.

    python bench/experience_ingest.py [--events 100000] [--rounds 6] [--steps 8] [--tokens 64] [--store-url ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import nats
from nats.js import JetStreamContext

from orchard import events
from orchard.events.subjects import stream_config
from orchard.experience.v1 import experience_pb2 as pb
from orchard.types.v1 import types_pb2 as tpb

NATS_SERVER = str(Path(sys.executable).with_name("nats-server"))
POLL_S = 0.01
"""How often the end-to-end side looks for the block's last row (an indexed lookup, microseconds of work)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_events(n: int, steps: int, tokens: int, run_id: str) -> list[pb.RolloutEvent]:
    """Whole rollouts (started, `steps` steps of `tokens` tokens with logprobs and mask, finished) until n events."""
    out: list[pb.RolloutEvent] = []
    i = 0
    while len(out) < n:
        tid = f"{run_id}-t{i}"
        base = tpb.Trajectory(
            trajectory_id=tid,
            run_id=run_id,
            task_id=f"task{i % 100}",
            task_set="bench",
            policy=tpb.Policy(model="m", weights_version="v1"),
            messages=[tpb.Message(role=tpb.ROLE_USER, content="solve the task " * 8)],
        )
        out.append(events.started(base))
        done = [
            tpb.Step(
                index=k,
                model_output=tpb.Message(role=tpb.ROLE_ASSISTANT, content="ls -la"),
                tokens=tpb.TokenSpan(
                    token_ids=list(range(tokens)),
                    logprobs=[-0.1] * tokens,
                    mask=[1] * (tokens // 2) + [0] * (tokens - tokens // 2),
                ),
            )
            for k in range(steps)
        ]
        out += [events.step(run_id, tid, s) for s in done]
        final = tpb.Trajectory()
        final.CopyFrom(base)
        final.steps.extend(done)
        final.rewards.append(tpb.Reward(kind=tpb.REWARD_KIND_OUTCOME, value=1.0))
        out.append(events.finished(final))
        i += 1
    return out[:n]


class StoreProbe:
    """Reads the store the service writes: whether an event id is stored, and how many are."""

    def __init__(self, store_url: str) -> None:
        self._url = store_url
        self._conn: Any = None
        self._no_schema: type[Exception] = sqlite3.OperationalError  # the service has not created the schema yet

    def _connect(self) -> Any:
        if self._conn is None:
            if self._url.startswith("sqlite:///"):
                self._conn = sqlite3.connect(self._url.removeprefix("sqlite:///"), timeout=30, check_same_thread=False)
            else:
                import psycopg

                self._conn = psycopg.connect(self._url, autocommit=True)
                self._no_schema = psycopg.errors.UndefinedTable
        return self._conn

    def _one(self, query: str, params: tuple[object, ...] = ()) -> Any:
        if self._url.startswith("postgres"):
            query = query.replace("?", "%s")
        try:
            row = self._connect().execute(query, params).fetchone()
        except self._no_schema:
            return None
        return row[0] if row else None

    def has(self, event_id: str) -> bool:
        return self._one("SELECT 1 FROM events WHERE event_id = ?", (event_id,)) is not None

    def count(self) -> int:
        return int(self._one("SELECT count(*) FROM events") or 0)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def raw_publish(js: JetStreamContext, payloads: list[tuple[str, bytes, str]]) -> None:
    """Bare js.publish_async of every payload into BENCH_RAW, then every PubAck awaited."""
    futures = [
        await js.publish_async("bench.raw." + subject.split(".", 2)[2], data, headers={"Nats-Msg-Id": msg_id})
        for subject, data, msg_id in payloads
    ]
    await asyncio.gather(*futures)


async def end_to_end(
    publisher: events.EventPublisher, probe: StoreProbe, block: list[pb.RolloutEvent], total: int
) -> tuple[float, float]:
    """Publish `block` through the EventPublisher and wait until the store holds `total` events; returns the
    seconds from the first publish() until publish() had accepted the whole block, and until JetStream had
    acknowledged it."""
    start = time.perf_counter()
    for event in block:
        while True:
            try:
                await publisher.publish(event)
                break
            except events.PublishBackpressure:
                await asyncio.sleep(0.05)
    accepted = time.perf_counter() - start
    await publisher.flush()
    acknowledged = time.perf_counter() - start
    while not await asyncio.to_thread(probe.has, block[-1].event_id):
        await asyncio.sleep(POLL_S)
    while await asyncio.to_thread(probe.count) < total:  # in order in practice: this loop does not run
        await asyncio.sleep(POLL_S)
    return accepted, acknowledged


async def timed(pids: dict[str, int], work: Awaitable[object]) -> tuple[float, dict[str, float], object]:
    """(wall seconds, CPU seconds per process, what `work` returned)."""
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    start = time.perf_counter()
    result = await work
    seconds = time.perf_counter() - start
    return seconds, {name: cpu_s(pid) - before[name] for name, pid in pids.items()}, result


async def main(args: argparse.Namespace) -> dict[str, object]:
    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="orchard-bench-experience-"))
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    store_url = args.store_url or f"sqlite:///{work / 'experience.db'}"
    nats_proc = subprocess.Popen(
        [NATS_SERVER, "-js", "-sd", str(work / "nats"), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    service = None
    probe = StoreProbe(store_url)
    rows: list[dict[str, Any]] = []
    try:
        await asyncio.sleep(0.5)
        sample = make_events(args.events, args.steps, args.tokens, f"bench{int(time.time())}")
        payload_bytes = sum(len(e.SerializeToString()) for e in sample) / len(sample)
        service = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchard.services.experience.server",
                "--port",
                str(free_port()),
                "--nats-url",
                url,
                "--store-url",
                store_url,
                "--batch-size",
                str(args.batch_size),
                "--log-level",
                "WARNING",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        pids = {"bench": os.getpid(), "nats_server": nats_proc.pid, "service": service.pid}
        nc = await nats.connect(url)
        js = nc.jetstream(publish_async_max_pending=1000)
        raw_config = stream_config()  # the rollout stream's configuration, under another name and subjects
        raw_config.name, raw_config.subjects = "BENCH_RAW", ["bench.raw.>"]
        await js.add_stream(raw_config)
        async with events.EventPublisher.connect(url) as publisher:
            # Warm-up, not counted: the service is up, the schema exists, both streams have taken messages.
            warm = make_events(200, args.steps, args.tokens, "warmup")
            await end_to_end(publisher, probe, warm, len(warm))
            await raw_publish(js, [(events.subject_of(e), e.SerializeToString(), "w" + e.event_id) for e in warm])
            stored_total = len(warm)
            for r in range(args.rounds):
                block = sample[r * len(sample) // args.rounds : (r + 1) * len(sample) // args.rounds]
                payloads = [(events.subject_of(e), e.SerializeToString(), e.event_id) for e in block]
                stored_total += len(block)
                row: dict[str, Any] = {"round": r}
                for side in ("raw", "orchard") if r % 2 == 0 else ("orchard", "raw"):
                    if side == "raw":
                        seconds, cpu, _ = await timed(pids, raw_publish(js, payloads))
                        row["raw_publish_per_s"] = round(len(block) / seconds)
                    else:
                        seconds, cpu, accepted = await timed(pids, end_to_end(publisher, probe, block, stored_total))
                        row["stored_per_s"] = round(len(block) / seconds)
                        row["publisher_accept_per_s"] = round(len(block) / accepted[0])  # type: ignore[index]
                        row["publisher_acked_per_s"] = round(len(block) / accepted[1])  # type: ignore[index]
                    row[f"{side}_cpu_ms_per_1k"] = {k: round(v * 1e6 / len(block), 1) for k, v in cpu.items()}
                row["ratio"] = round(row["stored_per_s"] / row["raw_publish_per_s"], 3)
                # On cores shared with other work the ratio follows this one: CPU the raw side spent per event
                # over what the Orchard side spent (all processes summed).
                row["cpu_ratio"] = round(
                    sum(row["raw_cpu_ms_per_1k"].values()) / sum(row["orchard_cpu_ms_per_1k"].values()), 3
                )
                rows.append(row)
        await js.delete_stream("BENCH_RAW")
        await nc.close()
        final_count = probe.count()
    finally:
        probe.close()
        if service is not None:
            service.terminate()
            service.wait(timeout=30)
        nats_proc.terminate()
        nats_proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    assert final_count == stored_total, f"stored {final_count} events, published {stored_total}"
    ratio = statistics.median(row["ratio"] for row in rows)
    return {
        "events": len(sample),
        "rounds": args.rounds,
        "block_events": len(sample) // args.rounds,
        "mean_event_bytes": round(payload_bytes),
        "store": store_url.split(":", 1)[0],
        "blocks": rows,
        "stored_events_per_s": round(statistics.median(row["stored_per_s"] for row in rows)),
        "raw_jetstream_publish_per_s": round(statistics.median(row["raw_publish_per_s"] for row in rows)),
        "ratio_stored_to_raw_publish": round(ratio, 3),
        "cpu_ms_per_1k_raw": round(statistics.median(sum(row["raw_cpu_ms_per_1k"].values()) for row in rows), 1),
        "cpu_ms_per_1k_orchard": round(
            statistics.median(sum(row["orchard_cpu_ms_per_1k"].values()) for row in rows), 1
        ),
        "cpu_ratio_raw_to_orchard": round(statistics.median(row["cpu_ratio"] for row in rows), 3),
        **{
            f"cpu_ms_per_1k_{side}_by_process": {
                name: round(statistics.median(row[f"{side}_cpu_ms_per_1k"][name] for row in rows), 1) for name in pids
            }
            for side in ("raw", "orchard")
        },
        "publisher_accept_per_s": round(statistics.median(row["publisher_accept_per_s"] for row in rows)),
        "publisher_acked_per_s": round(statistics.median(row["publisher_acked_per_s"] for row in rows)),
        "target_ratio": 0.9,
        "meets_target": ratio >= 0.9,
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="events per side, split over the rounds")
    parser.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="rounds of one raw and one Orchard block each (even: each side goes first as often)",
    )
    parser.add_argument("--steps", type=int, default=8, help="steps per rollout (events per rollout = steps + 2)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per step")
    parser.add_argument("--batch-size", type=int, default=1000, help="the service's fetch/transaction batch")
    parser.add_argument("--store-url", default="", help="default: a SQLite file in the temporary folder")
    print(json.dumps(asyncio.run(main(parser.parse_args()))))

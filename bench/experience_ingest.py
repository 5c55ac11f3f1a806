"""Experience ingest: events/s from `EventPublisher.publish()` to a stored row in the experience service's store,
against raw JetStream publish throughput measured in the same run (the baseline: `js.publish_async` of the same
payloads with Nats-Msg-Id, up to 1000 in flight, no consumer). Starts its own nats-server and
`orchard serve experience` (SQLite, or --store-url) on free ports in a temporary folder; prints one JSON object.

    python bench/experience_ingest.py [--events 100000] [--steps 8] [--tokens 64] [--store-url postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats

from orchard import events
from orchard.experience.v1 import experience_pb2 as pb
from orchard.types.v1 import types_pb2 as tpb

NATS_SERVER = str(Path(sys.executable).with_name("nats-server"))


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


async def raw_publish(url: str, payloads: list[tuple[str, bytes, str]]) -> float:
    """Events/s of bare js.publish_async (acks awaited) into a stream of its own, no buffering, no consumer."""
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=1000)
    await js.add_stream(name="BENCH_RAW", subjects=["bench.raw.>"], duplicate_window=600)
    start = time.perf_counter()
    futures = []
    for subject, data, msg_id in payloads:
        futures.append(
            await js.publish_async("bench.raw." + subject.split(".", 2)[2], data, headers={"Nats-Msg-Id": msg_id})
        )
    await asyncio.gather(*futures)
    seconds = time.perf_counter() - start
    await js.delete_stream("BENCH_RAW")
    await nc.close()
    return len(payloads) / seconds


def stored(store_url: str) -> int:
    if store_url.startswith("sqlite:///"):
        path = store_url.removeprefix("sqlite:///")
        try:
            with sqlite3.connect(path, timeout=30) as conn:
                return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
        except sqlite3.OperationalError:
            return 0
    import psycopg

    with psycopg.connect(store_url) as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])  # type: ignore[index]


async def end_to_end(url: str, store_url: str, sample: list[pb.RolloutEvent], base: int) -> tuple[float, float]:
    """(stored events/s from first publish to last stored row, publisher accept rate events/s)."""
    start = time.perf_counter()
    async with events.EventPublisher.connect(url) as publisher:
        for event in sample:
            while True:
                try:
                    await publisher.publish(event)
                    break
                except events.PublishBackpressure:
                    await asyncio.sleep(0.05)
        accepted = time.perf_counter() - start
        while await asyncio.to_thread(stored, store_url) < base + len(sample):
            await asyncio.sleep(0.05)  # a count(*) costs ms of the CPU the pipeline is measured on; poll gently
    return len(sample) / (time.perf_counter() - start), len(sample) / accepted


async def main(args: argparse.Namespace) -> dict[str, object]:
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
    try:
        await asyncio.sleep(0.5)
        sample = make_events(args.events, args.steps, args.tokens, f"bench{int(time.time())}")
        payload_bytes = sum(len(e.SerializeToString()) for e in sample) / len(sample)
        raw = await raw_publish(url, [(events.subject_of(e), e.SerializeToString(), e.event_id) for e in sample])
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
        warm = make_events(200, args.steps, args.tokens, "warmup")  # the service is up and the schema exists
        await end_to_end(url, store_url, warm, 0)
        stored_rate, accept_rate = await end_to_end(url, store_url, sample, len(warm))
    finally:
        if service is not None:
            service.terminate()
            service.wait(timeout=30)
        nats_proc.terminate()
        nats_proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    return {
        "events": args.events,
        "mean_event_bytes": round(payload_bytes),
        "store": store_url.split(":", 1)[0],
        "stored_events_per_s": round(stored_rate),
        "raw_jetstream_publish_per_s": round(raw),
        "ratio_stored_to_raw_publish": round(stored_rate / raw, 3),
        "publisher_accept_per_s": round(accept_rate),
        "target_stored_events_per_s": 10_000,
        "meets_target": stored_rate >= 10_000,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=8, help="steps per rollout (events per rollout = steps + 2)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per step")
    parser.add_argument("--batch-size", type=int, default=1000, help="the service's fetch/transaction batch")
    parser.add_argument("--store-url", default="", help="default: a SQLite file in the temporary folder")
    print(json.dumps(asyncio.run(main(parser.parse_args()))))

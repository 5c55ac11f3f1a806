"""Orchard Env snapshot and fork cost: SnapshotSandbox of a sandbox whose workspace holds ~50 MB in ~1000 files,
and CreateSandbox from that snapshot (a fork) against a plain create from the image (baseline, alternated in the
same run), per image. Starts its own env service (`orchard serve env`); prints one JSON.

On a built image a fork stacks the snapshot's layer under its own (nothing copied); on `host` it starts with a
copy of the layer (overlayfs refuses a layer inside the host's root), so its fork cost grows with the snapshot.

    python bench/env_fork.py [--image host --image python:3.11-slim] [--snapshots 10] [--creates 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import grpc
from env_service import env_service
from google.protobuf.duration_pb2 import Duration

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc

# 1000 files of 50 KiB (random, so nothing dedupes) in 20 folders: ~50 MB.
FILL = (
    "for d in $(seq 20); do mkdir -p data/$d; for f in $(seq 50); do head -c 51200 /dev/urandom > data/$d/$f; "
    "done; done; du -sb data | cut -f1; find data -type f | wc -l"
)


def summary_ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(values) * 1e3, 1),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1e3, 1),
        "n": len(values),
    }


def duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def shell(stub: env_pb2_grpc.EnvServiceStub, sandbox_id: str, command: str) -> bytes:
    ex = stub.StartExec(pb.StartExecRequest(sandbox_id=sandbox_id, shell=command, wait=duration(60)), timeout=90).exec
    while ex.state in (pb.EXEC_STATE_QUEUED, pb.EXEC_STATE_RUNNING):
        ex = stub.WaitExec(pb.WaitExecRequest(exec_id=ex.exec_id), timeout=90).exec
    assert ex.state == pb.EXEC_STATE_SUCCEEDED, ex
    return ex.stdout


def bench_image(stub: env_pb2_grpc.EnvServiceStub, image: str, snapshots: int, creates: int) -> dict[str, object]:
    try:
        source = stub.CreateSandbox(pb.CreateSandboxRequest(image=image), timeout=60).sandbox
    except grpc.RpcError as err:
        return {"skipped": err.details()}
    size, files = (int(v) for v in shell(stub, source.sandbox_id, FILL).split())
    times: dict[str, list[float]] = {"snapshot": [], "fork": [], "create": [], "fork_exec": []}
    for _ in range(snapshots):
        start = time.perf_counter()
        snap = stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=source.sandbox_id), timeout=120).snapshot
        times["snapshot"].append(time.perf_counter() - start)
        stub.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id), timeout=60)
    snap = stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=source.sandbox_id), timeout=120).snapshot
    for i in range(2 * creates):
        forked = i % 2 == 1
        request = (
            pb.CreateSandboxRequest(from_snapshot=snap.snapshot_id) if forked else pb.CreateSandboxRequest(image=image)
        )
        start = time.perf_counter()
        sandbox = stub.CreateSandbox(request, timeout=60).sandbox
        times["fork" if forked else "create"].append(time.perf_counter() - start)
        if forked:  # the fork really holds the files: count them
            start = time.perf_counter()
            assert int(shell(stub, sandbox.sandbox_id, "find data -type f | wc -l")) == files
            times["fork_exec"].append(time.perf_counter() - start)
        stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sandbox.sandbox_id), timeout=60)
    stub.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id), timeout=60)
    stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=source.sandbox_id), timeout=60)
    s = {name: summary_ms(values) for name, values in times.items()}
    return {
        "workspace_bytes": size,
        "workspace_files": files,
        "snapshot_bytes": snap.size_bytes,
        "snapshot": s["snapshot"],
        "fork_create": s["fork"],
        "plain_create": s["create"],
        "fork_to_plain_create_p50_ratio": round(s["fork"]["p50_ms"] / s["create"]["p50_ms"], 2),
        "find_over_the_files_in_a_fork": s["fork_exec"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", action="append", help="repeatable; default: host and python:3.11-slim")
    parser.add_argument("--snapshots", type=int, default=10)
    parser.add_argument("--creates", type=int, default=20)
    args = parser.parse_args()

    results: dict[str, object] = {}
    with env_service() as (address, _):
        with grpc.insecure_channel(address) as channel:
            stub = env_pb2_grpc.EnvServiceStub(channel)
            for image in args.image or ["host", "python:3.11-slim"]:
                results[image] = bench_image(stub, image, args.snapshots, args.creates)
    print(json.dumps({"benchmark": "env_fork", "cpus": os.cpu_count(), "images": results}))


if __name__ == "__main__":
    main()

"""The experience service end to end: a real nats-server, events published with EventPublisher, the real gRPC
service consuming them into SQLite; then queries, pages, stats, exports (JSONL and Parquet), decontamination
and bad input, all through gRPC."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import grpc
import pyarrow.parquet as pq
import pytest
from experience_helpers import NatsServer, outcome, publish_and_store, rollout, stamp

from orchard import events
from orchard.experience.v1 import experience_pb2 as pb
from orchard.experience.v1 import experience_pb2_grpc
from orchard.services.experience.server import build
from orchard.services.experience.settings import ExperienceSettings
from orchard.types.v1 import types_pb2 as tpb

RESOLVED, UNRESOLVED = tpb.OUTCOME_STATUS_RESOLVED, tpb.OUTCOME_STATUS_UNRESOLVED
Stub = experience_pb2_grpc.ExperienceServiceStub


@pytest.fixture
async def stub(tmp_path: Path, nats_server: NatsServer) -> AsyncIterator[Stub]:
    """The service with eval set {task-eval}, fed one run of five rollouts and an unfinished one."""
    eval_file = tmp_path / "eval.txt"
    eval_file.write_text("# held out\ntask-eval\n")
    settings = ExperienceSettings(
        port=0,
        nats_url=nats_server.url,
        store_url=f"sqlite:///{tmp_path / 'e.db'}",
        log_format="text",
        eval_task_files=[eval_file],
        grace_period_s=1,
    )
    server, store = await build(settings)
    port = await server.start()
    published = [
        *rollout("run-a", "t0", "task-a", status=RESOLVED, end=1_700_000_100),
        *rollout("run-a", "t1", "task-a", status=UNRESOLVED, end=1_700_000_200),
        *rollout("run-a", "t2", "task-b", status=RESOLVED, weights_version="v2", end=1_700_000_300),
        *rollout("run-a", "t3", "task-eval", status=RESOLVED, end=1_700_000_400),
        *rollout("run-b", "t4", "task-b", status=UNRESOLVED, weights_version="v2", end=1_700_000_500),
        *rollout("run-b", "t5", "task-a", finish=False),
        events.reward("run-a", "t0", tpb.Reward(kind=tpb.REWARD_KIND_RPR, value=1.3), 0),
    ]
    await publish_and_store(nats_server.url, published, store)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield Stub(channel)
    await server.stop()


async def test_get_trajectory(stub: Stub) -> None:
    t = (await stub.GetTrajectory(pb.GetTrajectoryRequest(trajectory_id="t0"), timeout=5)).trajectory
    assert (t.name, t.run_id, t.task_id, t.step_count) == ("runs/run-a/trajectories/t0", "run-a", "task-a", 2)
    assert [s.tokens.mask[0] for s in t.steps] == [1, 1] and len(t.messages) == 6
    assert [(r.kind, r.value) for r in t.rewards] == [(tpb.REWARD_KIND_OUTCOME, 1.0), (tpb.REWARD_KIND_RPR, 1.3)]
    basic = (
        await stub.GetTrajectory(pb.GetTrajectoryRequest(trajectory_id="t0", view=pb.TRAJECTORY_VIEW_BASIC), timeout=5)
    ).trajectory
    assert not basic.steps and not basic.messages and basic.step_count == 2


async def _list(stub: Stub, f: pb.TrajectoryFilter, page_size: int = 0) -> list[str]:
    ids, token = [], ""
    while True:
        reply = await stub.ListTrajectories(
            pb.ListTrajectoriesRequest(filter=f, page_size=page_size, page_token=token), timeout=5
        )
        ids += [t.trajectory_id for t in reply.trajectories]
        token = reply.next_page_token
        if not token:
            return ids


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        (pb.TrajectoryFilter(), ["t4", "t3", "t2", "t1", "t0"]),
        (pb.TrajectoryFilter(run_ids=["run-b"], include_unfinished=True), ["t4", "t5"]),
        (pb.TrajectoryFilter(task_ids=["task-b"]), ["t4", "t2"]),
        (pb.TrajectoryFilter(outcome_status=RESOLVED), ["t3", "t2", "t0"]),
        (pb.TrajectoryFilter(weights_version="v2"), ["t4", "t2"]),
        (pb.TrajectoryFilter(end_after_time=stamp(1_700_000_200), end_before_time=stamp(1_700_000_400)), ["t2", "t1"]),
        (pb.TrajectoryFilter(reward_kind=tpb.REWARD_KIND_RPR, min_reward=1.0), ["t0"]),
    ],
)
async def test_query_trajectories_paginated(stub: Stub, f: pb.TrajectoryFilter, expected: list[str]) -> None:
    for page_size in (0, 1, 2):
        assert await _list(stub, f, page_size) == expected, f"page_size {page_size}"


async def test_stats_and_runs(stub: Stub) -> None:
    reply = await stub.QueryStats(pb.QueryStatsRequest(group_by=pb.STATS_GROUP_BY_TASK), timeout=5)
    assert [(g.key, g.resolved_count, g.graded_count) for g in reply.groups] == [
        ("task-a", 1, 2),
        ("task-b", 1, 2),
        ("task-eval", 1, 1),
    ]
    assert reply.total.trajectory_count == 5 and reply.total.mean_steps == 2
    assert dict(reply.total.stop_reason_counts) == {"STOP_REASON_SUBMITTED": 5}
    page = await stub.QueryStats(pb.QueryStatsRequest(group_by=pb.STATS_GROUP_BY_TASK, page_size=2), timeout=5)
    rest = await stub.QueryStats(
        pb.QueryStatsRequest(group_by=pb.STATS_GROUP_BY_TASK, page_size=2, page_token=page.next_page_token), timeout=5
    )
    assert [g.key for g in [*page.groups, *rest.groups]] == ["task-a", "task-b", "task-eval"]
    runs = await stub.ListRuns(pb.ListRunsRequest(), timeout=5)
    assert {(r.run_id, r.trajectory_count, r.finished_count) for r in runs.runs} == {("run-a", 4, 4), ("run-b", 2, 1)}


async def _dataset(stub: Stub, **request: Any) -> tuple[bytes, pb.ExportDatasetSummary]:
    replies = [r async for r in stub.ExportDataset(pb.ExportDatasetRequest(**request), timeout=10)]
    assert replies[-1].HasField("summary") and not replies[-1].chunk
    return b"".join(r.chunk for r in replies), replies[-1].summary


async def test_export_jsonl_decontaminated(stub: Stub) -> None:
    data, summary = await _dataset(stub, format=pb.DATASET_FORMAT_JSONL)
    rows = [json.loads(line) for line in data.decode().splitlines()]
    assert [r["trajectory_id"] for r in rows] == ["t0", "t1", "t2", "t4"]  # oldest first, t3 (task-eval) left out
    assert (summary.row_count, summary.decontaminated_count, list(summary.decontaminated_task_ids)) == (
        4,
        1,
        ["task-eval"],
    )
    row = rows[0]
    assert row["messages"][0] == {"role": "system", "content": "be brief"}
    assert row["messages"][2] == {"role": "assistant", "content": "step 0"}
    assert row["tools"][0]["function"]["name"] == "bash" and row["reward"] == 1.0
    assert row["token_ids"] == [1, 2, 3, 10, 20, 11, 21] and row["loss_mask"] == [0, 0, 0, 1, 0, 1, 0]
    assert row["logprobs"] == [0, 0, 0, -0.5, 0, -0.5, 0]
    everything, summary = await _dataset(stub, format=pb.DATASET_FORMAT_JSONL, purpose=pb.EXPORT_PURPOSE_EVALUATION)
    assert len(everything.splitlines()) == 5 and summary.decontaminated_count == 0


async def test_export_parquet(stub: Stub) -> None:
    data, summary = await _dataset(stub, format=pb.DATASET_FORMAT_PARQUET, limit=3)
    table = pq.read_table(io.BytesIO(data))
    assert table.num_rows == summary.row_count == 3 and summary.byte_count == len(data)
    rows = table.to_pylist()
    assert [r["trajectory_id"] for r in rows] == ["t0", "t1", "t2"]
    assert json.loads(rows[1]["messages"])[1] == {"role": "user", "content": "task-a"}
    assert rows[1]["loss_mask"] == [0, 0, 0, 1, 0, 1, 0] and rows[1]["outcome_status"] == "OUTCOME_STATUS_UNRESOLVED"


async def test_export_trajectories_stream(stub: Stub) -> None:
    replies = [
        r async for r in stub.ExportTrajectories(pb.ExportTrajectoriesRequest(distinct_patches=True), timeout=10)
    ]
    # t3 is an eval task (training is the default purpose); t1 repeats t0's (task, patch) pair.
    assert [r.trajectory.trajectory_id for r in replies] == ["t0", "t2"]
    assert all(len(r.trajectory.steps) == 2 for r in replies)


async def test_training_export_naming_an_eval_task_is_refused(stub: Stub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _dataset(stub, format=pb.DATASET_FORMAT_JSONL, filter=pb.TrajectoryFilter(task_ids=["task-eval"]))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "evaluation-set tasks (task-eval, from eval.txt)" in (caught.value.details() or "")
    data, _ = await _dataset(
        stub,
        format=pb.DATASET_FORMAT_JSONL,
        purpose=pb.EXPORT_PURPOSE_EVALUATION,
        filter=pb.TrajectoryFilter(task_ids=["task-eval"]),
    )
    assert len(data.splitlines()) == 1


@pytest.mark.parametrize(
    ("call", "code", "words"),
    [
        (lambda s: s.GetTrajectory(pb.GetTrajectoryRequest(), timeout=5), "INVALID_ARGUMENT", "trajectory_id is empty"),
        (lambda s: s.GetTrajectory(pb.GetTrajectoryRequest(trajectory_id="nope"), timeout=5), "NOT_FOUND", "'nope'"),
        (
            lambda s: s.GetTrajectory(
                pb.GetTrajectoryRequest(trajectory_id="t0", view=cast(pb.TrajectoryView, 9)), timeout=5
            ),
            "INVALID_ARGUMENT",
            "not a TrajectoryView",
        ),
        (
            lambda s: s.ListTrajectories(pb.ListTrajectoriesRequest(page_size=-1), timeout=5),
            "INVALID_ARGUMENT",
            "negative",
        ),
        (
            lambda s: s.ListTrajectories(pb.ListTrajectoriesRequest(page_token="garbage"), timeout=5),
            "INVALID_ARGUMENT",
            "not a token this service issued",
        ),
        (
            lambda s: s.ListTrajectories(
                pb.ListTrajectoriesRequest(filter=pb.TrajectoryFilter(min_reward=2, max_reward=1)), timeout=5
            ),
            "INVALID_ARGUMENT",
            "above filter.max_reward",
        ),
        (
            lambda s: s.ListTrajectories(
                pb.ListTrajectoriesRequest(filter=pb.TrajectoryFilter(stop_reasons=[cast(tpb.StopReason, 42)])),
                timeout=5,
            ),
            "INVALID_ARGUMENT",
            "not a StopReason",
        ),
        (
            lambda s: s.QueryStats(pb.QueryStatsRequest(group_by=cast(pb.StatsGroupBy, 77)), timeout=5),
            "INVALID_ARGUMENT",
            "not a StatsGroupBy",
        ),
        (lambda s: _dataset(s), "INVALID_ARGUMENT", "DATASET_FORMAT_JSONL or DATASET_FORMAT_PARQUET"),
    ],
)
async def test_bad_input(stub: Stub, call, code: str, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(stub)
    assert caught.value.code().name == code and words in (caught.value.details() or "")


async def test_page_token_of_another_filter_is_refused(stub: Stub) -> None:
    first = await stub.ListTrajectories(pb.ListTrajectoriesRequest(page_size=1), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ListTrajectories(
            pb.ListTrajectoriesRequest(
                page_size=1, page_token=first.next_page_token, filter=pb.TrajectoryFilter(run_ids=["run-a"])
            ),
            timeout=5,
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "different filter" in caught.value.details()


async def test_reward_added_later_changes_outcome(stub: Stub, nats_server: NatsServer) -> None:
    """A regrade published after the rollout shows up in outcome filters (the latest outcome reward counts)."""
    async with events.EventPublisher.connect(nats_server.url) as publisher:
        await publisher.publish(events.reward("run-a", "t1", outcome(RESOLVED, 1.0), 1))
    async with asyncio.timeout(10):
        while "t1" not in await _list(stub, pb.TrajectoryFilter(outcome_status=RESOLVED)):
            await asyncio.sleep(0.05)

"""The experience store's logic on both backends (SQLite file, real PostgreSQL): idempotent writes in any order,
finished events authoritative, reward union, filters and pages, runs and stats."""

from __future__ import annotations

import itertools
import random
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "integration"))
from experience_helpers import outcome, rollout, stamp

from orchard import events
from orchard.experience.v1 import experience_pb2 as pb
from orchard.services.experience import ingest, stats
from orchard.services.experience.backends import load_store
from orchard.services.experience.backends.base import SqlStore
from orchard.types.v1 import types_pb2 as tpb

_databases = itertools.count()


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'experience.db'}"
    else:
        server = request.getfixturevalue("postgres_url")
        name = f"experience_{next(_databases)}"
        async with await psycopg.AsyncConnection.connect(server, autocommit=True) as conn:
            await conn.execute(f"CREATE DATABASE {name}")
        url = server.rsplit("/", 1)[0] + "/" + name
    s = load_store(url)
    await s.open()
    yield s
    await s.close()


async def test_writes_are_idempotent_in_any_order(store: SqlStore) -> None:
    """Shuffled events, written twice and in overlapping batches, give the same trajectories as one clean pass."""
    all_events = [e for i in range(6) for e in rollout("r1", f"t{i}", f"task{i % 3}", steps=3)]
    shuffled = random.Random(7).sample(all_events, len(all_events))
    for start in range(0, len(shuffled), 5):
        await store.write_events(shuffled[start : start + 7])  # overlapping batches: every event at least once
    await store.write_events(all_events)
    assert await store.count_events() == len(all_events)
    t = await store.get_trajectory("t2", full=True)
    assert t is not None
    assert (t.step_count, len(t.steps), len(t.rewards), t.stop_reason) == (3, 3, 1, tpb.STOP_REASON_SUBMITTED)
    assert [s.index for s in t.steps] == [0, 1, 2]
    assert len(t.messages) == 2 + 2 * 3 and t.token_count == 3 + 3 * 2 and len(t.patch_hash) == 64
    page = await store.list_trajectories(pb.TrajectoryFilter(), full=False, limit=100)
    assert sorted(x.trajectory_id for x, _ in page) == [f"t{i}" for i in range(6)]


async def test_finished_is_authoritative_and_rewards_are_a_union(store: SqlStore) -> None:
    started, step0, _step1, finished = rollout("r1", "t1", "task", steps=2)
    late_step = events.step("r1", "t1", tpb.Step(index=5))
    extra = outcome(tpb.OUTCOME_STATUS_UNRESOLVED, -1.0)
    again = finished.rollout_finished.trajectory.rewards[0]
    await store.write_events([finished, events.reward("r1", "t1", again, 0)])
    await store.write_events([started, step0, late_step, events.reward("r1", "t1", extra, 1)])
    t = await store.get_trajectory("t1", full=True)
    assert t is not None
    assert [s.index for s in t.steps] == [0, 1]  # the late step and started did not touch the finished record
    assert [r.value for r in t.rewards] == [1.0, -1.0]  # the equal reward is kept once, in order added
    # The latest outcome reward decides outcome filters.
    unresolved = pb.TrajectoryFilter(outcome_status=tpb.OUTCOME_STATUS_UNRESOLVED)
    assert [x.trajectory_id for x, _ in await store.list_trajectories(unresolved, full=False, limit=10)] == ["t1"]


async def test_a_batch_of_whole_rollouts_writes_each_step_once(store: SqlStore, tmp_path: Path) -> None:
    """Started and step events of a trajectory finished in the same batch add only their ledger rows (the finished
    event replaces the rest in that transaction); what is stored equals writing the events one at a time."""
    batch = [e for i in range(3) for e in rollout("r1", f"t{i}", "task", steps=3)]
    batch += rollout("r1", "t9", "task", steps=2, finish=False)
    redone = events.finished(tpb.Trajectory(trajectory_id="t0", run_id="r1", task_id="redone"))
    redone.event_id += ".again"  # finished twice in one batch (another event id): the later one wins
    batch.append(redone)
    p = ingest.plan(batch)
    assert {row[0] for row in p.steps} == {"t9"} and {row[-1] for row in p.started} == {"t9"}
    assert len(p.finished_steps) == 3 + 3 and len(p.ledger) == len(batch)  # t0's first finished event is replaced
    await store.write_events(batch)
    one_by_one = load_store(f"sqlite:///{tmp_path / 'one-by-one.db'}")
    await one_by_one.open()
    try:
        for event in batch:
            await one_by_one.write_events([event])
        for tid in ("t0", "t1", "t2", "t9"):
            assert await store.get_trajectory(tid, full=True) == await one_by_one.get_trajectory(tid, full=True)
    finally:
        await one_by_one.close()
    t0 = await store.get_trajectory("t0", full=True)
    assert t0 is not None and (t0.task_id, t0.step_count) == ("redone", 0)


async def test_unfinished_trajectories_assemble_from_started_and_steps(store: SqlStore) -> None:
    await store.write_events(rollout("r1", "t1", "task", steps=2, finish=False))
    await store.write_events([events.step("r2", "t2", tpb.Step(index=0))])  # a step without its started event
    assert await store.list_trajectories(pb.TrajectoryFilter(), full=False, limit=10) == []
    page = await store.list_trajectories(pb.TrajectoryFilter(include_unfinished=True), full=True, limit=10)
    by_id = {t.trajectory_id: t for t, _ in page}
    assert by_id["t1"].step_count == 2 and len(by_id["t1"].messages) == 2 + 4
    assert by_id["t2"].run_id == "r2" and by_id["t2"].step_count == 1


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        (pb.TrajectoryFilter(run_ids=["r2"]), ["t3"]),
        (pb.TrajectoryFilter(task_ids=["a"]), ["t0", "t2"]),
        (pb.TrajectoryFilter(exclude_task_ids=["a"]), ["t1", "t3"]),
        (pb.TrajectoryFilter(weights_version="v2"), ["t2", "t3"]),
        (pb.TrajectoryFilter(outcome_status=tpb.OUTCOME_STATUS_RESOLVED), ["t0", "t2"]),
        (pb.TrajectoryFilter(min_reward=0.5), ["t0", "t2"]),
        (pb.TrajectoryFilter(max_reward=0.0), ["t1", "t3"]),
        (pb.TrajectoryFilter(end_after_time=stamp(1_700_000_200), end_before_time=stamp(1_700_000_400)), ["t2", "t3"]),
        (pb.TrajectoryFilter(metadata_selector={"source": "test"}), ["t0", "t1", "t2", "t3"]),
        (pb.TrajectoryFilter(metadata_selector={"source": "other"}), []),
    ],
)
async def test_filters(store: SqlStore, f: pb.TrajectoryFilter, expected: list[str]) -> None:
    resolved, unresolved = tpb.OUTCOME_STATUS_RESOLVED, tpb.OUTCOME_STATUS_UNRESOLVED
    await store.write_events(
        [
            *rollout("r1", "t0", "a", status=resolved, end=1_700_000_100),
            *rollout("r1", "t1", "b", status=unresolved, end=1_700_000_150),
            *rollout("r1", "t2", "a", status=resolved, weights_version="v2", end=1_700_000_250),
            *rollout("r2", "t3", "b", status=unresolved, weights_version="v2", end=1_700_000_350),
        ]
    )
    page = await store.list_trajectories(f, full=False, limit=10)
    assert sorted(t.trajectory_id for t, _ in page) == expected


async def test_pages_are_newest_first_and_complete(store: SqlStore) -> None:
    await store.write_events([e for i in range(7) for e in rollout("r1", f"t{i}", "a", end=1_700_000_000 + i)])
    seen, after = [], None
    while True:
        page = await store.list_trajectories(pb.TrajectoryFilter(), full=False, limit=3, after=after)
        seen += [t.trajectory_id for t, _ in page]
        if len(page) < 3:
            break
        after = page[-1][1]
    assert seen == [f"t{i}" for i in reversed(range(7))]


async def test_runs_and_stats(store: SqlStore) -> None:
    await store.write_events(
        [
            *rollout("r1", "t0", "a"),
            *rollout("r1", "t1", "a", status=tpb.OUTCOME_STATUS_UNRESOLVED),
            *rollout("r2", "t2", "b"),
            *rollout("r2", "t3", "b", finish=False),
        ]
    )
    runs = {r.run_id: r for r in await store.list_runs()}
    assert (runs["r1"].trajectory_count, runs["r1"].finished_count, list(runs["r1"].task_sets)) == (2, 2, ["toy"])
    assert (runs["r2"].trajectory_count, runs["r2"].finished_count) == (2, 1)
    groups, total = stats.summarise(*await store.stats_rows(pb.TrajectoryFilter()), pb.STATS_GROUP_BY_TASK)
    assert [(g.key, g.resolved_count, g.graded_count, g.resolved_rate) for g in groups] == [
        ("a", 1, 2, 0.5),
        ("b", 1, 1, 1.0),
    ]
    assert total.trajectory_count == 3 and total.rewards[0].mean == pytest.approx(1 / 3)

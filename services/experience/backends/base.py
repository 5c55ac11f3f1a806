"""`SqlStore`: the experience store's logic over SQL, shared by the SQLite and PostgreSQL backends.

A backend only opens connections and runs statements (`_transaction`, `_fetch`); everything else
(idempotent writes, trajectory assembly, filters, pages) is here, so both backends behave the same.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from orchard.chat.openai_format import messages_from_call
from orchard.experience.v1 import experience_pb2 as pb
from orchard.services.experience import ingest, sql
from orchard.types.v1 import types_pb2 as tpb

Statement = tuple[str, Sequence[Sequence[Any]]]
Position = tuple[int, str]
"""Where a trajectory sorts: (sort time, trajectory id)."""


class SqlStore(abc.ABC):
    """The experience store on a SQL database. Subclasses set `blob`/`greatest` and implement I/O."""

    blob = "BLOB"
    greatest = "max"

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect and create the schema if missing."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close every connection."""

    @abc.abstractmethod
    async def _transaction(self, statements: list[Statement]) -> None:
        """Run each (sql, rows) with executemany, all in one transaction; roll back on any error."""

    @abc.abstractmethod
    async def _fetch(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one read-only query."""

    def schema(self) -> str:
        return sql.SCHEMA.format(blob=self.blob)

    # -- writes -----------------------------------------------------------------------------------------------

    async def write_events(self, events: list[pb.RolloutEvent]) -> None:
        """Store a batch in one transaction, idempotently: writing it again (or any part of it) changes nothing."""
        p = ingest.plan(events)
        never_finished = (
            f"NOT EXISTS (SELECT 1 FROM trajectories f WHERE f.trajectory_id = ? AND f.state = {sql.FINISHED})"
        )
        statements: list[Statement] = [
            # 1. The ledger: one row per event id ever stored.
            (
                "INSERT INTO events (event_id, run_id, trajectory_id, kind, event_time) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (event_id) DO NOTHING",
                p.ledger,
            ),
            # 2. Every trajectory an event names exists from its first event on (maybe only as a stub).
            (
                "INSERT INTO trajectories (trajectory_id, run_id, sort_time, first_seen, last_seen) VALUES (?, ?, ?, ?, ?) "
                f"ON CONFLICT (trajectory_id) DO UPDATE SET last_seen = {self.greatest}(trajectories.last_seen, "
                "excluded.last_seen)",
                [(tid, run, first, first, last) for tid, (run, first, last) in p.stubs.items()],
            ),
            # 3. Started and step events fill in what a finished event has not already settled.
            (
                "UPDATE trajectories SET task_id = ?, task_set = ?, harness = ?, policy_model = ?, weights_version = ?, "
                f"header = ?, start_time = ?, sort_time = ?, state = {sql.STARTED} "
                f"WHERE trajectory_id = ? AND state < {sql.FINISHED}",
                p.started,
            ),
            (
                f"INSERT INTO metadata (trajectory_id, key, value) SELECT ?, ?, ? WHERE {never_finished} "
                "ON CONFLICT (trajectory_id, key) DO NOTHING",
                p.started_metadata,
            ),
            (
                f"INSERT INTO steps (trajectory_id, step_index, token_count, data) SELECT ?, ?, ?, ? WHERE {never_finished} "
                "ON CONFLICT (trajectory_id, step_index) DO NOTHING",
                p.steps,
            ),
            (
                "UPDATE trajectories SET step_count = (SELECT count(*) FROM steps s WHERE s.trajectory_id = ?), "
                "token_count = (SELECT coalesce(sum(s.token_count), 0) FROM steps s WHERE s.trajectory_id = ?) "
                f"WHERE trajectory_id = ? AND state < {sql.FINISHED}",
                [(t, t, t) for t in sorted(p.stepped)],
            ),
            # 4. A finished event replaces whatever was pieced together, whenever it arrives.
            ("DELETE FROM steps WHERE trajectory_id = ?", [(t,) for t in p.finished]),
            ("DELETE FROM metadata WHERE trajectory_id = ?", [(t,) for t in p.finished]),
            (
                "UPDATE trajectories SET task_id = ?, task_set = ?, harness = ?, policy_model = ?, weights_version = ?, "
                "stop_reason = ?, patch_hash = ?, start_time = ?, end_time = ?, sort_time = ?, step_count = ?, "
                f"token_count = ?, header = ?, state = {sql.FINISHED} WHERE trajectory_id = ?",
                list(p.finished.values()),
            ),
            (
                "INSERT INTO steps (trajectory_id, step_index, token_count, data) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (trajectory_id, step_index) DO NOTHING",
                p.finished_steps,
            ),
            (
                "INSERT INTO metadata (trajectory_id, key, value) VALUES (?, ?, ?) "
                "ON CONFLICT (trajectory_id, key) DO NOTHING",
                p.finished_metadata,
            ),
            # 5. Rewards are a union keyed by content; recorded model calls by call id.
            (
                "INSERT INTO rewards (trajectory_id, reward_key, seq, kind, value, outcome_status, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (trajectory_id, reward_key) DO NOTHING",
                p.rewards,
            ),
            (
                "INSERT INTO model_calls (trajectory_id, call_id, event_time, seq, data) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (trajectory_id, call_id) DO NOTHING",
                p.calls,
            ),
        ]
        await self._transaction([(query, rows) for query, rows in statements if rows])

    # -- reads ------------------------------------------------------------------------------------------------

    async def count_events(self) -> int:
        """How many distinct events the store holds."""
        return int((await self._fetch("SELECT count(*) FROM events"))[0][0])

    async def get_trajectory(self, trajectory_id: str, *, full: bool) -> tpb.Trajectory | None:
        rows = await self._fetch(
            f"SELECT {sql.TRAJECTORY_COLUMNS} FROM trajectories t WHERE t.trajectory_id = ?", [trajectory_id]
        )
        return (await self._assemble(rows, full))[0][0] if rows else None

    async def list_trajectories(
        self,
        f: pb.TrajectoryFilter,
        *,
        full: bool,
        limit: int,
        after: Position | None = None,
        oldest_first: bool = False,
    ) -> list[tuple[tpb.Trajectory, Position]]:
        """One page of matches, newest first (or oldest first), starting after `after`."""
        clause, params = sql.where(f)
        order = "ASC" if oldest_first else "DESC"
        if after is not None:
            cmp = ">" if oldest_first else "<"
            clause += f" AND (t.sort_time {cmp} ? OR (t.sort_time = ? AND t.trajectory_id {cmp} ?))"
            params += [after[0], after[0], after[1]]
        rows = await self._fetch(
            f"SELECT {sql.TRAJECTORY_COLUMNS} FROM trajectories t WHERE {clause} "
            f"ORDER BY t.sort_time {order}, t.trajectory_id {order} LIMIT ?",
            [*params, limit],
        )
        return await self._assemble(rows, full)

    async def stats_rows(self, f: pb.TrajectoryFilter) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """(trajectory rows, reward rows in the order they were added) of every match, for stats.py."""
        clause, params = sql.where(f)
        trajectories = await self._fetch(
            "SELECT t.trajectory_id, t.run_id, t.task_id, t.policy_model, t.weights_version, t.harness, t.state, "
            f"t.stop_reason, t.step_count, t.token_count FROM trajectories t WHERE {clause}",
            params,
        )
        rewards = await self._fetch(
            "SELECT r.trajectory_id, r.kind, r.value, r.outcome_status FROM rewards r JOIN trajectories t "
            f"ON t.trajectory_id = r.trajectory_id WHERE {clause} ORDER BY r.seq",
            params,
        )
        return trajectories, rewards

    async def list_runs(self) -> list[pb.Run]:
        """Every run, newest (by first event) first."""
        rows = await self._fetch(
            f"SELECT run_id, count(*), sum(CASE WHEN state = {sql.FINISHED} THEN 1 ELSE 0 END), min(first_seen), "
            "max(last_seen) FROM trajectories GROUP BY run_id ORDER BY min(first_seen) DESC, run_id DESC"
        )
        runs = {
            r[0]: pb.Run(
                name=f"runs/{r[0]}",
                run_id=r[0],
                trajectory_count=r[1],
                finished_count=r[2] or 0,
                create_time=_stamp(r[3]),
                update_time=_stamp(r[4]),
            )
            for r in rows
        }
        parts = await self._fetch(
            "SELECT DISTINCT run_id, task_set, harness, policy_model, weights_version "
            "FROM trajectories ORDER BY run_id, task_set, harness, policy_model, weights_version"
        )
        for run_id, task_set, harness, model, version in parts:
            run = runs[run_id]
            if task_set and task_set not in run.task_sets:
                run.task_sets.append(task_set)
            if harness and harness not in run.harnesses:
                run.harnesses.append(harness)
            policy = tpb.Policy(model=model, weights_version=version)
            if (model or version) and policy not in run.policies:
                run.policies.append(policy)
        return list(runs.values())

    async def _assemble(self, rows: list[tuple[Any, ...]], full: bool) -> list[tuple[tpb.Trajectory, Position]]:
        """Trajectories from their rows plus their rewards (and, when full, steps or recorded calls)."""
        if not rows:
            return []
        ids = [r[0] for r in rows]
        marks = ", ".join("?" * len(ids))
        rewards: dict[str, list[bytes]] = {}
        for tid, data in await self._fetch(
            f"SELECT trajectory_id, data FROM rewards WHERE trajectory_id IN ({marks}) ORDER BY seq", ids
        ):
            rewards.setdefault(tid, []).append(bytes(data))
        steps: dict[str, list[bytes]] = {}
        calls: dict[str, bytes] = {}
        if full:
            for tid, data in await self._fetch(
                f"SELECT trajectory_id, data FROM steps WHERE trajectory_id IN ({marks}) ORDER BY step_index", ids
            ):
                steps.setdefault(tid, []).append(bytes(data))
            proxy_only = [r[0] for r in rows if r[3] is None]
            if proxy_only:
                marks = ", ".join("?" * len(proxy_only))
                for tid, data in await self._fetch(
                    f"SELECT trajectory_id, data FROM model_calls WHERE trajectory_id "
                    f"IN ({marks}) ORDER BY event_time, seq",
                    proxy_only,
                ):
                    calls[tid] = bytes(data)  # the latest call holds the whole conversation so far
        out = []
        for tid, run_id, state, header, step_count, token_count, digest, sort_time, _start, _end in rows:
            t = tpb.Trajectory.FromString(bytes(header)) if header is not None else tpb.Trajectory()
            t.trajectory_id, t.run_id, t.name = tid, run_id, f"runs/{run_id}/trajectories/{tid}"
            t.step_count, t.token_count, t.patch_hash = step_count, token_count, digest
            if t.HasField("start_time") and t.HasField("end_time") and not t.HasField("duration"):
                t.duration.FromNanoseconds(t.end_time.ToNanoseconds() - t.start_time.ToNanoseconds())
            t.rewards.extend(tpb.Reward.FromString(r) for r in rewards.get(tid, []))
            if full:
                t.steps.extend(tpb.Step.FromString(s) for s in steps.get(tid, []))
                if state != sql.FINISHED:
                    _append_step_messages(t)
                if tid in calls:
                    t.messages.extend(messages_from_call(pb.ModelCallRecorded.FromString(calls[tid])))
                    t.metadata.setdefault("source", "proxy")
                if header is None and not steps.get(tid):
                    t.step_count = sum(1 for m in t.messages if m.role == tpb.ROLE_ASSISTANT)
            else:
                for name in ("messages", "steps", "prompt_tokens"):
                    t.ClearField(name)
            out.append((t, (sort_time, tid)))
        return out


def _append_step_messages(t: tpb.Trajectory) -> None:
    """An unfinished trajectory's conversation so far: its initial messages, then each step's turn."""
    for step in t.steps:
        if step.HasField("model_output"):
            t.messages.append(step.model_output)
        t.messages.extend(o.message for o in step.observations if o.HasField("message"))


def _stamp(us: int | None) -> Timestamp | None:
    if us is None:
        return None
    stamp = Timestamp()
    stamp.FromMicroseconds(int(us))
    return stamp

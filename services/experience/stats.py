"""QueryStats' arithmetic: groups of trajectories summarised from the store's rows (no I/O)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from orchard.experience.v1 import experience_pb2 as pb
from orchard.services.experience import sql
from orchard.types.v1 import types_pb2 as tpb

# Column of stats_rows' trajectory rows that holds each grouping's key.
GROUP_COLUMN = {
    pb.STATS_GROUP_BY_RUN: 1,
    pb.STATS_GROUP_BY_TASK: 2,
    pb.STATS_GROUP_BY_POLICY: 3,
    pb.STATS_GROUP_BY_WEIGHTS_VERSION: 4,
    pb.STATS_GROUP_BY_HARNESS: 5,
}


def summarise(
    trajectories: list[tuple[Any, ...]], rewards: list[tuple[Any, ...]], group_by: pb.StatsGroupBy
) -> tuple[list[pb.StatsGroup], pb.StatsGroup]:
    """(groups ordered by key, the total) from store.stats_rows()."""
    # The latest reward of each kind per trajectory: rows come in the order they were added.
    latest: dict[str, dict[tpb.RewardKind, tuple[float, int]]] = defaultdict(dict)
    for tid, kind, value, status in rewards:
        latest[tid][kind] = (value, status)
    column = GROUP_COLUMN.get(group_by)
    groups: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for row in trajectories:
        groups[row[column] if column is not None else ""].append(row)
    summaries = [_group(key, rows, latest) for key, rows in sorted(groups.items())]
    return summaries, _group("", trajectories, latest)


def _group(
    key: str, rows: list[tuple[Any, ...]], latest: dict[str, dict[tpb.RewardKind, tuple[float, int]]]
) -> pb.StatsGroup:
    g = pb.StatsGroup(key=key, trajectory_count=len(rows))
    values: dict[tpb.RewardKind, list[float]] = defaultdict(list)
    steps = tokens = 0
    for tid, _run, _task, _model, _version, _harness, state, stop_reason, step_count, token_count in rows:
        if state == sql.FINISHED:
            g.finished_count += 1
            steps += step_count
            tokens += token_count
            g.stop_reason_counts[tpb.StopReason.Name(stop_reason)] += 1
        for kind, (value, _status) in latest.get(tid, {}).items():
            values[kind].append(value)
        outcome = latest.get(tid, {}).get(tpb.REWARD_KIND_OUTCOME)
        if outcome is not None and outcome[1] != tpb.OUTCOME_STATUS_ERROR:
            g.graded_count += 1
            g.resolved_count += outcome[1] == tpb.OUTCOME_STATUS_RESOLVED
    g.resolved_rate = g.resolved_count / g.graded_count if g.graded_count else 0.0
    if g.finished_count:
        g.mean_steps, g.mean_tokens = steps / g.finished_count, tokens / g.finished_count
    for kind in sorted(values):
        v = values[kind]
        mean = sum(v) / len(v)
        g.rewards.append(
            pb.RewardStats(
                kind=kind,
                count=len(v),
                mean=mean,
                min=min(v),
                max=max(v),
                std=math.sqrt(sum((x - mean) ** 2 for x in v) / len(v)),
            )
        )
    return g

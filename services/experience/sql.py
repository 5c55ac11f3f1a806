"""The store's SQL, shared by SQLite and PostgreSQL: the schema, TrajectoryFilter -> WHERE, and page tokens.

Statements use `?` placeholders; the PostgreSQL backend rewrites them to `%s`. Times are integer
microseconds since the epoch. The `events` table is the idempotency ledger (one row per event id ever
stored); the other tables hold the assembled trajectories.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from orchard.errors import InvalidArgument
from orchard.experience.v1 import experience_pb2 as pb
from orchard.types.v1 import types_pb2 as tpb

# {blob} and {greatest} differ between the dialects (BLOB/BYTEA, max()/GREATEST()).
SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
  event_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL,
  trajectory_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  event_time BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS trajectories (
  trajectory_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL,
  task_id TEXT NOT NULL DEFAULT '',
  task_set TEXT NOT NULL DEFAULT '',
  harness TEXT NOT NULL DEFAULT '',
  policy_model TEXT NOT NULL DEFAULT '',
  weights_version TEXT NOT NULL DEFAULT '',
  stop_reason INTEGER NOT NULL DEFAULT 0,
  patch_hash TEXT NOT NULL DEFAULT '',
  state INTEGER NOT NULL DEFAULT 0,
  start_time BIGINT,
  end_time BIGINT,
  sort_time BIGINT NOT NULL,
  step_count INTEGER NOT NULL DEFAULT 0,
  token_count BIGINT NOT NULL DEFAULT 0,
  first_seen BIGINT NOT NULL,
  last_seen BIGINT NOT NULL,
  header {blob}
);
CREATE INDEX IF NOT EXISTS trajectories_sort ON trajectories (sort_time, trajectory_id);
CREATE INDEX IF NOT EXISTS trajectories_run ON trajectories (run_id);
CREATE INDEX IF NOT EXISTS trajectories_task ON trajectories (task_id);
CREATE TABLE IF NOT EXISTS steps (
  trajectory_id TEXT NOT NULL,
  step_index INTEGER NOT NULL,
  token_count BIGINT NOT NULL,
  data {blob} NOT NULL,
  PRIMARY KEY (trajectory_id, step_index)
);
CREATE TABLE IF NOT EXISTS rewards (
  trajectory_id TEXT NOT NULL,
  reward_key TEXT NOT NULL,
  seq BIGINT NOT NULL,
  kind INTEGER NOT NULL,
  value DOUBLE PRECISION NOT NULL,
  outcome_status INTEGER NOT NULL,
  data {blob} NOT NULL,
  PRIMARY KEY (trajectory_id, reward_key)
);
CREATE TABLE IF NOT EXISTS metadata (
  trajectory_id TEXT NOT NULL,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY (trajectory_id, key)
);
CREATE TABLE IF NOT EXISTS model_calls (
  trajectory_id TEXT NOT NULL,
  call_id TEXT NOT NULL,
  event_time BIGINT NOT NULL,
  seq BIGINT NOT NULL,
  data {blob} NOT NULL,
  PRIMARY KEY (trajectory_id, call_id)
);
"""

# Trajectory states, in the order they can only move forward.
STUB, STARTED, FINISHED = 0, 1, 2

TRAJECTORY_COLUMNS = (
    "t.trajectory_id, t.run_id, t.state, t.header, t.step_count, t.token_count, t.patch_hash, "
    "t.sort_time, t.start_time, t.end_time"
)


def latest_reward(column: str) -> str:
    """A scalar subquery: `column` of the trajectory's latest reward of the kind bound to its `?`."""
    return (
        f"(SELECT r.{column} FROM rewards r WHERE r.trajectory_id = t.trajectory_id AND r.kind = ? "
        "ORDER BY r.seq DESC LIMIT 1)"
    )


def where(f: pb.TrajectoryFilter) -> tuple[str, list[Any]]:
    """The WHERE clause (on trajectories `t`) and its parameters for a filter; InvalidArgument on bad values."""
    clauses: list[str] = []
    params: list[Any] = []

    def any_of(column: str, values: list[Any], negate: bool = False) -> None:
        if values:
            clauses.append(f"{column} {'NOT IN' if negate else 'IN'} ({', '.join('?' * len(values))})")
            params.extend(values)

    any_of("t.run_id", list(f.run_ids))
    any_of("t.task_id", list(f.task_ids))
    any_of("t.task_id", list(f.exclude_task_ids), negate=True)
    any_of("t.stop_reason", list(f.stop_reasons))
    for column, value in (
        ("t.task_set", f.task_set),
        ("t.policy_model", f.policy_model),
        ("t.weights_version", f.weights_version),
        ("t.harness", f.harness),
    ):
        if value:
            clauses.append(f"{column} = ?")
            params.append(value)
    if f.outcome_status:
        clauses.append(f"{latest_reward('outcome_status')} = ?")
        params += [tpb.REWARD_KIND_OUTCOME, f.outcome_status]
    kind = f.reward_kind or tpb.REWARD_KIND_OUTCOME
    if f.HasField("min_reward") and f.HasField("max_reward") and f.min_reward > f.max_reward:
        raise InvalidArgument(
            f"filter.min_reward {f.min_reward} is above filter.max_reward {f.max_reward}", field="filter.min_reward"
        )
    if f.HasField("min_reward"):
        clauses.append(f"{latest_reward('value')} >= ?")
        params += [kind, f.min_reward]
    if f.HasField("max_reward"):
        clauses.append(f"{latest_reward('value')} <= ?")
        params += [kind, f.max_reward]
    if f.HasField("end_after_time"):
        clauses.append("t.end_time >= ?")
        params.append(_micros(f.end_after_time))
    if f.HasField("end_before_time"):
        clauses.append("t.end_time < ?")
        params.append(_micros(f.end_before_time))
    for key, value in sorted(f.metadata_selector.items()):
        clauses.append(
            "EXISTS (SELECT 1 FROM metadata m WHERE m.trajectory_id = t.trajectory_id AND m.key = ? AND m.value = ?)"
        )
        params += [key, value]
    if not f.include_unfinished:
        clauses.append(f"t.state = {FINISHED}")
    return (" AND ".join(clauses) or "1 = 1"), params


def _micros(stamp: Any) -> int:
    return int(stamp.seconds) * 1_000_000 + int(stamp.nanos) // 1000


def fingerprint(*parts: Any) -> str:
    """A short hash of what a page token belongs to (the filter and view), so a changed filter is caught."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(
            part.SerializeToString(deterministic=True) if hasattr(part, "SerializeToString") else repr(part).encode()
        )
    return digest.hexdigest()[:16]


def encode_token(position: list[Any], fp: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"p": position, "f": fp}).encode()).decode()


def decode_token(token: str, fp: str, field: str = "page_token") -> list[Any] | None:
    """The position a page token points after, None for the first page; InvalidArgument when it is not ours."""
    if not token:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        position, token_fp = data["p"], data["f"]
        if not isinstance(position, list):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise InvalidArgument(
            f"{field} {token[:40]!r} is not a token this service issued; pass the "
            "next_page_token of the previous page, or empty for the first",
            field=field,
        ) from None
    if token_fp != fp:
        raise InvalidArgument(
            f"{field} belongs to a different filter or view; keep the filter unchanged "
            "between pages, or start again with an empty page_token",
            field=field,
        )
    return position

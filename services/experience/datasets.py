"""Exports for trainers: the trajectories a filter selects, decontaminated, as JSON lines or Parquet.

A dataset row is one trajectory in the OpenAI messages format plus its token-level fields:

    trajectory_id, run_id, task_id, task_set, harness, policy_model, weights_version, group_id, sample_index,
    messages (OpenAI chat messages), tools (OpenAI function tools), stop_reason, outcome_status,
    reward (latest outcome reward, null when ungraded), rewards [{kind, name, value, step_index}],
    final_patch, final_answer, metadata, prompt_token_count,
    token_ids / logprobs / loss_mask: the whole sequence (prompt tokens, then every step's tokens), parallel
    lists; logprobs 0 and mask 0 where the producer recorded none.

In Parquet, messages, tools, rewards and metadata are JSON text columns (their shapes vary per row); the
token columns are list<int32>/list<float>.

Decontamination: a training export (purpose TRAINING, or unspecified) leaves out every trajectory whose task
is in one of the server's evaluation sets and counts them in the summary; a filter that names such a task
in task_ids is refused with FAILED_PRECONDITION, since it asks for evaluation data to train on.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from orchard.chat.openai_format import to_openai
from orchard.errors import FailedPrecondition
from orchard.experience.v1 import experience_pb2 as pb
from orchard.services.experience.backends.base import Position, SqlStore
from orchard.types.v1 import types_pb2 as tpb

PAGE = 100
CHUNK_BYTES = 1 << 20
PARQUET_ROW_GROUP = 500
MAX_LISTED_TASKS = 1000


@dataclass
class Selection:
    """What an export selected: counts filled in while it runs."""

    sent: int = 0
    decontaminated: int = 0
    decontaminated_tasks: set[str] = field(default_factory=set)


def check_purpose(f: pb.TrajectoryFilter, purpose: int, eval_tasks: dict[str, str]) -> bool:
    """True when eval-set tasks must be left out; FailedPrecondition when the filter asks for them by name."""
    if purpose == pb.EXPORT_PURPOSE_EVALUATION or not eval_tasks:
        return False
    named = sorted(t for t in f.task_ids if t in eval_tasks)
    if named:
        raise FailedPrecondition(
            f"filter.task_ids names evaluation-set tasks ({', '.join(named[:5])}{' ...' if len(named) > 5 else ''}, "
            f"from {eval_tasks[named[0]]}); a training export refuses them. Remove them, or export with "
            "purpose EXPORT_PURPOSE_EVALUATION",
            field="filter.task_ids",
            reason="EVAL_TASK_IN_TRAINING_EXPORT",
        )
    return True


async def select(
    store: SqlStore,
    f: pb.TrajectoryFilter,
    *,
    full: bool,
    limit: int,
    distinct_patches: bool,
    eval_tasks: dict[str, str] | None,
    selection: Selection,
) -> AsyncIterator[tpb.Trajectory]:
    """Matching trajectories oldest first, read a page at a time; eval-set tasks skipped when `eval_tasks`."""
    after: Position | None = None
    seen_patches: set[tuple[str, str]] = set()
    while True:
        page = await store.list_trajectories(f, full=full, limit=PAGE, after=after, oldest_first=True)
        for trajectory, after in page:  # noqa: B007 - `after` is the next page's cursor
            if eval_tasks and trajectory.task_id in eval_tasks:
                selection.decontaminated += 1
                selection.decontaminated_tasks.add(trajectory.task_id)
                continue
            if distinct_patches:
                pair = (trajectory.task_id, trajectory.patch_hash)
                if pair in seen_patches:
                    continue
                seen_patches.add(pair)
            yield trajectory
            selection.sent += 1
            if limit and selection.sent >= limit:
                return
        if len(page) < PAGE:
            return


def dataset_row(t: tpb.Trajectory) -> dict[str, Any]:
    """One trajectory as a dataset row (see the module docstring)."""
    outcome = next((r for r in reversed(t.rewards) if r.kind == tpb.REWARD_KIND_OUTCOME), None)
    token_ids, logprobs, mask = _tokens(t)
    return {
        "trajectory_id": t.trajectory_id,
        "run_id": t.run_id,
        "task_id": t.task_id,
        "task_set": t.task_set,
        "harness": t.harness,
        "policy_model": t.policy.model,
        "weights_version": t.policy.weights_version,
        "group_id": t.group_id,
        "sample_index": t.sample_index,
        "messages": [to_openai(m) for m in t.messages],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": d.name,
                    "description": d.description,
                    "parameters": json.loads(d.parameters) if d.parameters else {},
                },
            }
            for d in t.tools
        ],
        "stop_reason": tpb.StopReason.Name(t.stop_reason),
        "outcome_status": tpb.OutcomeStatus.Name(outcome.outcome.status) if outcome else "OUTCOME_STATUS_UNSPECIFIED",
        "reward": outcome.value if outcome else None,
        "rewards": [
            {
                "kind": tpb.RewardKind.Name(r.kind),
                "name": r.name,
                "value": r.value,
                "step_index": r.step_index if r.HasField("step_index") else None,
            }
            for r in t.rewards
        ],
        "final_patch": t.final_patch,
        "final_answer": t.final_answer,
        "metadata": dict(t.metadata),
        "prompt_token_count": len(t.prompt_tokens.token_ids),
        "token_ids": token_ids,
        "logprobs": logprobs,
        "loss_mask": mask,
    }


def _tokens(t: tpb.Trajectory) -> tuple[list[int], list[float], list[int]]:
    ids: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    for span in [t.prompt_tokens, *(s.tokens for s in t.steps)]:
        n = len(span.token_ids)
        ids.extend(span.token_ids)
        logprobs.extend(span.logprobs if len(span.logprobs) == n else [0.0] * n)
        mask.extend(span.mask if len(span.mask) == n else [0] * n)
    return ids, logprobs, mask


_JSON_COLUMNS = ("messages", "tools", "rewards", "metadata")
PARQUET_SCHEMA = pa.schema(
    [
        *(
            (name, pa.string())
            for name in (
                "trajectory_id",
                "run_id",
                "task_id",
                "task_set",
                "harness",
                "policy_model",
                "weights_version",
                "group_id",
            )
        ),
        ("sample_index", pa.int32()),
        *((name, pa.string()) for name in ("messages", "tools")),
        ("stop_reason", pa.string()),
        ("outcome_status", pa.string()),
        ("reward", pa.float64()),
        ("rewards", pa.string()),
        ("final_patch", pa.string()),
        ("final_answer", pa.string()),
        ("metadata", pa.string()),
        ("prompt_token_count", pa.int32()),
        ("token_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("loss_mask", pa.list_(pa.int8())),
    ]
)


async def jsonl_chunks(trajectories: AsyncIterator[tpb.Trajectory]) -> AsyncIterator[bytes]:
    """The JSON-lines file, in chunks of about CHUNK_BYTES."""
    buffer = io.BytesIO()
    async for t in trajectories:
        buffer.write(json.dumps(dataset_row(t), ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
        if buffer.tell() >= CHUNK_BYTES:
            yield buffer.getvalue()
            buffer = io.BytesIO()
    if buffer.tell():
        yield buffer.getvalue()


class _Sink(io.RawIOBase):
    """A file pyarrow writes into, whose bytes are taken out after each row group."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


async def parquet_chunks(trajectories: AsyncIterator[tpb.Trajectory]) -> AsyncIterator[bytes]:
    """The Parquet file, one chunk per row group; the conversion runs off the event loop."""
    sink = _Sink()
    writer = pq.ParquetWriter(sink, PARQUET_SCHEMA)
    rows: list[dict[str, Any]] = []

    def write(batch: list[dict[str, Any]]) -> bytes:
        for row in batch:
            for name in _JSON_COLUMNS:
                row[name] = json.dumps(row[name], ensure_ascii=False)
        writer.write_table(pa.Table.from_pylist(batch, schema=PARQUET_SCHEMA))
        return sink.take()

    try:
        async for t in trajectories:
            rows.append(dataset_row(t))
            if len(rows) >= PARQUET_ROW_GROUP:
                yield await asyncio.to_thread(write, rows)
                rows = []
        if rows:
            yield await asyncio.to_thread(write, rows)
    finally:
        writer.close()
    yield sink.take()  # the footer

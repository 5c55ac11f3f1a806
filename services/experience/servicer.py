"""ExperienceService servicer: checks requests, calls the store, and turns the answers into protos.
Errors raised here are OrchardErrors; the runtime's interceptor maps them to status codes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from orchard.errors import InvalidArgument, NotFound
from orchard.experience.v1 import experience_pb2 as pb
from orchard.experience.v1 import experience_pb2_grpc
from orchard.services.experience import datasets, sql, stats
from orchard.services.experience.backends.base import SqlStore
from orchard.types.v1 import types_pb2 as tpb

DEFAULT_PAGE = 50
MAX_PAGE, MAX_FULL_PAGE = 1000, 100


def check_filter(f: pb.TrajectoryFilter) -> None:
    """InvalidArgument for enum values this server does not know and for an empty time range."""
    for i, reason in enumerate(f.stop_reasons):
        if reason not in tpb.StopReason.values() or reason == tpb.STOP_REASON_UNSPECIFIED:
            raise InvalidArgument(
                f"filter.stop_reasons[{i}] = {reason} is not a StopReason; use e.g. STOP_REASON_SUBMITTED",
                field=f"filter.stop_reasons[{i}]",
            )
    if f.outcome_status not in tpb.OutcomeStatus.values():
        raise InvalidArgument(
            f"filter.outcome_status = {f.outcome_status} is not an OutcomeStatus", field="filter.outcome_status"
        )
    if f.reward_kind not in tpb.RewardKind.values():
        raise InvalidArgument(f"filter.reward_kind = {f.reward_kind} is not a RewardKind", field="filter.reward_kind")
    if (
        f.HasField("end_after_time")
        and f.HasField("end_before_time")
        and f.end_after_time.ToNanoseconds() >= f.end_before_time.ToNanoseconds()
    ):
        raise InvalidArgument(
            "filter.end_after_time is not before filter.end_before_time, so nothing can match",
            field="filter.end_after_time",
        )
    sql.where(f)  # the checks that need the SQL (reward range) raise here


def _full(view: int, default_full: bool) -> bool:
    if view not in pb.TrajectoryView.values():
        raise InvalidArgument(
            f"view = {view} is not a TrajectoryView; use TRAJECTORY_VIEW_BASIC or TRAJECTORY_VIEW_FULL", field="view"
        )
    return default_full if view == pb.TRAJECTORY_VIEW_UNSPECIFIED else view == pb.TRAJECTORY_VIEW_FULL


def _page_size(size: int, cap: int) -> int:
    if size < 0:
        raise InvalidArgument(
            f"page_size {size} is negative; use 0 for the default ({DEFAULT_PAGE}) or up to {cap}", field="page_size"
        )
    return min(size or DEFAULT_PAGE, cap)


class ExperienceServicer(experience_pb2_grpc.ExperienceServiceServicer):
    def __init__(self, store: SqlStore, eval_tasks: dict[str, str]) -> None:
        self._store = store
        self._eval_tasks = eval_tasks

    async def GetTrajectory(
        self,
        request: pb.GetTrajectoryRequest,
        context: grpc.aio.ServicerContext,
    ) -> pb.GetTrajectoryResponse:
        if not request.trajectory_id:
            raise InvalidArgument("trajectory_id is empty; name the trajectory to get", field="trajectory_id")
        trajectory = await self._store.get_trajectory(request.trajectory_id, full=_full(request.view, True))
        if trajectory is None:
            raise NotFound(
                f"trajectory {request.trajectory_id!r} not found: no event for it has been stored "
                "(events reach the store within seconds of being published)"
            )
        return pb.GetTrajectoryResponse(trajectory=trajectory)

    async def ListTrajectories(
        self,
        request: pb.ListTrajectoriesRequest,
        context: grpc.aio.ServicerContext,
    ) -> pb.ListTrajectoriesResponse:
        check_filter(request.filter)
        full = _full(request.view, False)
        size = _page_size(request.page_size, MAX_FULL_PAGE if full else MAX_PAGE)
        fp = sql.fingerprint("trajectories", request.filter, full)
        after = sql.decode_token(request.page_token, fp)
        page = await self._store.list_trajectories(
            request.filter, full=full, limit=size + 1, after=(int(after[0]), str(after[1])) if after else None
        )
        token = sql.encode_token(list(page[size - 1][1]), fp) if len(page) > size else ""
        return pb.ListTrajectoriesResponse(trajectories=[t for t, _ in page[:size]], next_page_token=token)

    async def QueryStats(
        self,
        request: pb.QueryStatsRequest,
        context: grpc.aio.ServicerContext,
    ) -> pb.QueryStatsResponse:
        check_filter(request.filter)
        if request.group_by not in pb.StatsGroupBy.values():
            raise InvalidArgument(f"group_by = {request.group_by} is not a StatsGroupBy", field="group_by")
        size = _page_size(request.page_size, MAX_PAGE)
        fp = sql.fingerprint("stats", request.filter, request.group_by)
        after = sql.decode_token(request.page_token, fp)
        groups, total = stats.summarise(*await self._store.stats_rows(request.filter), request.group_by)
        if after:
            groups = [g for g in groups if g.key > str(after[0])]
        token = sql.encode_token([groups[size - 1].key], fp) if len(groups) > size else ""
        return pb.QueryStatsResponse(groups=groups[:size], total=total, next_page_token=token)

    async def ExportTrajectories(
        self,
        request: pb.ExportTrajectoriesRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ExportTrajectoriesResponse]:
        check_filter(request.filter)
        full = _full(request.view, True)
        if request.limit < 0:
            raise InvalidArgument(f"limit {request.limit} is negative; use 0 for all", field="limit")
        decontaminate = datasets.check_purpose(request.filter, request.purpose, self._eval_tasks)
        selection = datasets.Selection()
        async for t in datasets.select(
            self._store,
            request.filter,
            full=full,
            limit=request.limit,
            distinct_patches=request.distinct_patches,
            eval_tasks=self._eval_tasks if decontaminate else None,
            selection=selection,
        ):
            yield pb.ExportTrajectoriesResponse(trajectory=t)

    async def ExportDataset(
        self,
        request: pb.ExportDatasetRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ExportDatasetResponse]:
        check_filter(request.filter)
        writers = {pb.DATASET_FORMAT_JSONL: datasets.jsonl_chunks, pb.DATASET_FORMAT_PARQUET: datasets.parquet_chunks}
        if request.format not in writers:
            raise InvalidArgument(
                f"format = {request.format} is not a dataset format; use DATASET_FORMAT_JSONL or "
                "DATASET_FORMAT_PARQUET",
                field="format",
            )
        if request.limit < 0:
            raise InvalidArgument(f"limit {request.limit} is negative; use 0 for all", field="limit")
        decontaminate = datasets.check_purpose(request.filter, request.purpose, self._eval_tasks)
        selection = datasets.Selection()
        trajectories = datasets.select(
            self._store,
            request.filter,
            full=True,
            limit=request.limit,
            distinct_patches=False,
            eval_tasks=self._eval_tasks if decontaminate else None,
            selection=selection,
        )
        size = 0
        async for chunk in writers[request.format](trajectories):
            size += len(chunk)
            yield pb.ExportDatasetResponse(chunk=chunk)
        yield pb.ExportDatasetResponse(
            summary=pb.ExportDatasetSummary(
                row_count=selection.sent,
                decontaminated_count=selection.decontaminated,
                byte_count=size,
                decontaminated_task_ids=sorted(selection.decontaminated_tasks)[: datasets.MAX_LISTED_TASKS],
            )
        )

    async def ListRuns(self, request: pb.ListRunsRequest, context: grpc.aio.ServicerContext) -> pb.ListRunsResponse:
        size = _page_size(request.page_size, MAX_PAGE)
        fp = sql.fingerprint("runs")
        after = sql.decode_token(request.page_token, fp)
        runs = await self._store.list_runs()
        if after:
            position = (int(after[0]), str(after[1]))
            runs = [r for r in runs if (r.create_time.ToMicroseconds(), r.run_id) < position]
        token = ""
        if len(runs) > size:
            last = runs[size - 1]
            token = sql.encode_token([last.create_time.ToMicroseconds(), last.run_id], fp)
        return pb.ListRunsResponse(runs=runs[:size], next_page_token=token)

import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from orchard.types.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrajectoryView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAJECTORY_VIEW_UNSPECIFIED: _ClassVar[TrajectoryView]
    TRAJECTORY_VIEW_BASIC: _ClassVar[TrajectoryView]
    TRAJECTORY_VIEW_FULL: _ClassVar[TrajectoryView]

class StatsGroupBy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATS_GROUP_BY_UNSPECIFIED: _ClassVar[StatsGroupBy]
    STATS_GROUP_BY_RUN: _ClassVar[StatsGroupBy]
    STATS_GROUP_BY_TASK: _ClassVar[StatsGroupBy]
    STATS_GROUP_BY_POLICY: _ClassVar[StatsGroupBy]
    STATS_GROUP_BY_WEIGHTS_VERSION: _ClassVar[StatsGroupBy]
    STATS_GROUP_BY_HARNESS: _ClassVar[StatsGroupBy]

class ExportPurpose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPORT_PURPOSE_UNSPECIFIED: _ClassVar[ExportPurpose]
    EXPORT_PURPOSE_TRAINING: _ClassVar[ExportPurpose]
    EXPORT_PURPOSE_EVALUATION: _ClassVar[ExportPurpose]

class DatasetFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DATASET_FORMAT_UNSPECIFIED: _ClassVar[DatasetFormat]
    DATASET_FORMAT_JSONL: _ClassVar[DatasetFormat]
    DATASET_FORMAT_PARQUET: _ClassVar[DatasetFormat]
TRAJECTORY_VIEW_UNSPECIFIED: TrajectoryView
TRAJECTORY_VIEW_BASIC: TrajectoryView
TRAJECTORY_VIEW_FULL: TrajectoryView
STATS_GROUP_BY_UNSPECIFIED: StatsGroupBy
STATS_GROUP_BY_RUN: StatsGroupBy
STATS_GROUP_BY_TASK: StatsGroupBy
STATS_GROUP_BY_POLICY: StatsGroupBy
STATS_GROUP_BY_WEIGHTS_VERSION: StatsGroupBy
STATS_GROUP_BY_HARNESS: StatsGroupBy
EXPORT_PURPOSE_UNSPECIFIED: ExportPurpose
EXPORT_PURPOSE_TRAINING: ExportPurpose
EXPORT_PURPOSE_EVALUATION: ExportPurpose
DATASET_FORMAT_UNSPECIFIED: DatasetFormat
DATASET_FORMAT_JSONL: DatasetFormat
DATASET_FORMAT_PARQUET: DatasetFormat

class TrajectoryFilter(_message.Message):
    __slots__ = ("run_ids", "task_ids", "exclude_task_ids", "task_set", "policy_model", "weights_version", "harness", "stop_reasons", "outcome_status", "reward_kind", "min_reward", "max_reward", "end_after_time", "end_before_time", "metadata_selector", "include_unfinished")
    class MetadataSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    TASK_SET_FIELD_NUMBER: _ClassVar[int]
    POLICY_MODEL_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASONS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_STATUS_FIELD_NUMBER: _ClassVar[int]
    REWARD_KIND_FIELD_NUMBER: _ClassVar[int]
    MIN_REWARD_FIELD_NUMBER: _ClassVar[int]
    MAX_REWARD_FIELD_NUMBER: _ClassVar[int]
    END_AFTER_TIME_FIELD_NUMBER: _ClassVar[int]
    END_BEFORE_TIME_FIELD_NUMBER: _ClassVar[int]
    METADATA_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_UNFINISHED_FIELD_NUMBER: _ClassVar[int]
    run_ids: _containers.RepeatedScalarFieldContainer[str]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    exclude_task_ids: _containers.RepeatedScalarFieldContainer[str]
    task_set: str
    policy_model: str
    weights_version: str
    harness: str
    stop_reasons: _containers.RepeatedScalarFieldContainer[_types_pb2.StopReason]
    outcome_status: _types_pb2.OutcomeStatus
    reward_kind: _types_pb2.RewardKind
    min_reward: float
    max_reward: float
    end_after_time: _timestamp_pb2.Timestamp
    end_before_time: _timestamp_pb2.Timestamp
    metadata_selector: _containers.ScalarMap[str, str]
    include_unfinished: bool
    def __init__(self, run_ids: _Optional[_Iterable[str]] = ..., task_ids: _Optional[_Iterable[str]] = ..., exclude_task_ids: _Optional[_Iterable[str]] = ..., task_set: _Optional[str] = ..., policy_model: _Optional[str] = ..., weights_version: _Optional[str] = ..., harness: _Optional[str] = ..., stop_reasons: _Optional[_Iterable[_Union[_types_pb2.StopReason, str]]] = ..., outcome_status: _Optional[_Union[_types_pb2.OutcomeStatus, str]] = ..., reward_kind: _Optional[_Union[_types_pb2.RewardKind, str]] = ..., min_reward: _Optional[float] = ..., max_reward: _Optional[float] = ..., end_after_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_before_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., metadata_selector: _Optional[_Mapping[str, str]] = ..., include_unfinished: _Optional[bool] = ...) -> None: ...

class GetTrajectoryRequest(_message.Message):
    __slots__ = ("trajectory_id", "view")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    view: TrajectoryView
    def __init__(self, trajectory_id: _Optional[str] = ..., view: _Optional[_Union[TrajectoryView, str]] = ...) -> None: ...

class GetTrajectoryResponse(_message.Message):
    __slots__ = ("trajectory",)
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    trajectory: _types_pb2.Trajectory
    def __init__(self, trajectory: _Optional[_Union[_types_pb2.Trajectory, _Mapping]] = ...) -> None: ...

class ListTrajectoriesRequest(_message.Message):
    __slots__ = ("filter", "view", "page_size", "page_token")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: TrajectoryFilter
    view: TrajectoryView
    page_size: int
    page_token: str
    def __init__(self, filter: _Optional[_Union[TrajectoryFilter, _Mapping]] = ..., view: _Optional[_Union[TrajectoryView, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTrajectoriesResponse(_message.Message):
    __slots__ = ("trajectories", "next_page_token")
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    trajectories: _containers.RepeatedCompositeFieldContainer[_types_pb2.Trajectory]
    next_page_token: str
    def __init__(self, trajectories: _Optional[_Iterable[_Union[_types_pb2.Trajectory, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RewardStats(_message.Message):
    __slots__ = ("kind", "count", "mean", "std", "min", "max")
    KIND_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    kind: _types_pb2.RewardKind
    count: int
    mean: float
    std: float
    min: float
    max: float
    def __init__(self, kind: _Optional[_Union[_types_pb2.RewardKind, str]] = ..., count: _Optional[int] = ..., mean: _Optional[float] = ..., std: _Optional[float] = ..., min: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class StatsGroup(_message.Message):
    __slots__ = ("key", "trajectory_count", "finished_count", "resolved_count", "graded_count", "resolved_rate", "rewards", "mean_steps", "mean_tokens", "stop_reason_counts")
    class StopReasonCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_COUNT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_COUNT_FIELD_NUMBER: _ClassVar[int]
    GRADED_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_RATE_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    MEAN_STEPS_FIELD_NUMBER: _ClassVar[int]
    MEAN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_COUNTS_FIELD_NUMBER: _ClassVar[int]
    key: str
    trajectory_count: int
    finished_count: int
    resolved_count: int
    graded_count: int
    resolved_rate: float
    rewards: _containers.RepeatedCompositeFieldContainer[RewardStats]
    mean_steps: float
    mean_tokens: float
    stop_reason_counts: _containers.ScalarMap[str, int]
    def __init__(self, key: _Optional[str] = ..., trajectory_count: _Optional[int] = ..., finished_count: _Optional[int] = ..., resolved_count: _Optional[int] = ..., graded_count: _Optional[int] = ..., resolved_rate: _Optional[float] = ..., rewards: _Optional[_Iterable[_Union[RewardStats, _Mapping]]] = ..., mean_steps: _Optional[float] = ..., mean_tokens: _Optional[float] = ..., stop_reason_counts: _Optional[_Mapping[str, int]] = ...) -> None: ...

class QueryStatsRequest(_message.Message):
    __slots__ = ("filter", "group_by", "page_size", "page_token")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: TrajectoryFilter
    group_by: StatsGroupBy
    page_size: int
    page_token: str
    def __init__(self, filter: _Optional[_Union[TrajectoryFilter, _Mapping]] = ..., group_by: _Optional[_Union[StatsGroupBy, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class QueryStatsResponse(_message.Message):
    __slots__ = ("groups", "total", "next_page_token")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[StatsGroup]
    total: StatsGroup
    next_page_token: str
    def __init__(self, groups: _Optional[_Iterable[_Union[StatsGroup, _Mapping]]] = ..., total: _Optional[_Union[StatsGroup, _Mapping]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ExportTrajectoriesRequest(_message.Message):
    __slots__ = ("filter", "view", "limit", "distinct_patches", "purpose")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    DISTINCT_PATCHES_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    filter: TrajectoryFilter
    view: TrajectoryView
    limit: int
    distinct_patches: bool
    purpose: ExportPurpose
    def __init__(self, filter: _Optional[_Union[TrajectoryFilter, _Mapping]] = ..., view: _Optional[_Union[TrajectoryView, str]] = ..., limit: _Optional[int] = ..., distinct_patches: _Optional[bool] = ..., purpose: _Optional[_Union[ExportPurpose, str]] = ...) -> None: ...

class ExportDatasetRequest(_message.Message):
    __slots__ = ("filter", "format", "purpose", "limit")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    filter: TrajectoryFilter
    format: DatasetFormat
    purpose: ExportPurpose
    limit: int
    def __init__(self, filter: _Optional[_Union[TrajectoryFilter, _Mapping]] = ..., format: _Optional[_Union[DatasetFormat, str]] = ..., purpose: _Optional[_Union[ExportPurpose, str]] = ..., limit: _Optional[int] = ...) -> None: ...

class ExportDatasetSummary(_message.Message):
    __slots__ = ("row_count", "decontaminated_count", "decontaminated_task_ids", "byte_count")
    ROW_COUNT_FIELD_NUMBER: _ClassVar[int]
    DECONTAMINATED_COUNT_FIELD_NUMBER: _ClassVar[int]
    DECONTAMINATED_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    BYTE_COUNT_FIELD_NUMBER: _ClassVar[int]
    row_count: int
    decontaminated_count: int
    decontaminated_task_ids: _containers.RepeatedScalarFieldContainer[str]
    byte_count: int
    def __init__(self, row_count: _Optional[int] = ..., decontaminated_count: _Optional[int] = ..., decontaminated_task_ids: _Optional[_Iterable[str]] = ..., byte_count: _Optional[int] = ...) -> None: ...

class ExportDatasetResponse(_message.Message):
    __slots__ = ("chunk", "summary")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    chunk: bytes
    summary: ExportDatasetSummary
    def __init__(self, chunk: _Optional[bytes] = ..., summary: _Optional[_Union[ExportDatasetSummary, _Mapping]] = ...) -> None: ...

class ExportTrajectoriesResponse(_message.Message):
    __slots__ = ("trajectory",)
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    trajectory: _types_pb2.Trajectory
    def __init__(self, trajectory: _Optional[_Union[_types_pb2.Trajectory, _Mapping]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("name", "run_id", "trajectory_count", "finished_count", "task_sets", "harnesses", "policies", "create_time", "update_time")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_COUNT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_COUNT_FIELD_NUMBER: _ClassVar[int]
    TASK_SETS_FIELD_NUMBER: _ClassVar[int]
    HARNESSES_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    run_id: str
    trajectory_count: int
    finished_count: int
    task_sets: _containers.RepeatedScalarFieldContainer[str]
    harnesses: _containers.RepeatedScalarFieldContainer[str]
    policies: _containers.RepeatedCompositeFieldContainer[_types_pb2.Policy]
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., run_id: _Optional[str] = ..., trajectory_count: _Optional[int] = ..., finished_count: _Optional[int] = ..., task_sets: _Optional[_Iterable[str]] = ..., harnesses: _Optional[_Iterable[str]] = ..., policies: _Optional[_Iterable[_Union[_types_pb2.Policy, _Mapping]]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RolloutEvent(_message.Message):
    __slots__ = ("event_id", "run_id", "trajectory_id", "event_time", "rollout_started", "rollout_step", "rollout_finished", "reward_added", "model_call_recorded")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_STARTED_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_STEP_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FINISHED_FIELD_NUMBER: _ClassVar[int]
    REWARD_ADDED_FIELD_NUMBER: _ClassVar[int]
    MODEL_CALL_RECORDED_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    run_id: str
    trajectory_id: str
    event_time: _timestamp_pb2.Timestamp
    rollout_started: RolloutStarted
    rollout_step: RolloutStep
    rollout_finished: RolloutFinished
    reward_added: RewardAdded
    model_call_recorded: ModelCallRecorded
    def __init__(self, event_id: _Optional[str] = ..., run_id: _Optional[str] = ..., trajectory_id: _Optional[str] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rollout_started: _Optional[_Union[RolloutStarted, _Mapping]] = ..., rollout_step: _Optional[_Union[RolloutStep, _Mapping]] = ..., rollout_finished: _Optional[_Union[RolloutFinished, _Mapping]] = ..., reward_added: _Optional[_Union[RewardAdded, _Mapping]] = ..., model_call_recorded: _Optional[_Union[ModelCallRecorded, _Mapping]] = ...) -> None: ...

class RolloutStarted(_message.Message):
    __slots__ = ("trajectory",)
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    trajectory: _types_pb2.Trajectory
    def __init__(self, trajectory: _Optional[_Union[_types_pb2.Trajectory, _Mapping]] = ...) -> None: ...

class RolloutStep(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: _types_pb2.Step
    def __init__(self, step: _Optional[_Union[_types_pb2.Step, _Mapping]] = ...) -> None: ...

class RolloutFinished(_message.Message):
    __slots__ = ("trajectory",)
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    trajectory: _types_pb2.Trajectory
    def __init__(self, trajectory: _Optional[_Union[_types_pb2.Trajectory, _Mapping]] = ...) -> None: ...

class RewardAdded(_message.Message):
    __slots__ = ("reward",)
    REWARD_FIELD_NUMBER: _ClassVar[int]
    reward: _types_pb2.Reward
    def __init__(self, reward: _Optional[_Union[_types_pb2.Reward, _Mapping]] = ...) -> None: ...

class ModelCallRecorded(_message.Message):
    __slots__ = ("call_id", "seq", "path", "request_json", "response_json", "http_status", "stream", "error", "upstream", "latency")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_JSON_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    seq: int
    path: str
    request_json: str
    response_json: str
    http_status: int
    stream: bool
    error: str
    upstream: str
    latency: _duration_pb2.Duration
    def __init__(self, call_id: _Optional[str] = ..., seq: _Optional[int] = ..., path: _Optional[str] = ..., request_json: _Optional[str] = ..., response_json: _Optional[str] = ..., http_status: _Optional[int] = ..., stream: _Optional[bool] = ..., error: _Optional[str] = ..., upstream: _Optional[str] = ..., latency: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

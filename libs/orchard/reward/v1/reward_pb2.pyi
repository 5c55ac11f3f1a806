import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from orchard.types.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TestSpec(_message.Message):
    __slots__ = ("image", "workdir", "eval_script", "log_parser", "fail_to_pass", "pass_to_pass", "timeout")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    EVAL_SCRIPT_FIELD_NUMBER: _ClassVar[int]
    LOG_PARSER_FIELD_NUMBER: _ClassVar[int]
    FAIL_TO_PASS_FIELD_NUMBER: _ClassVar[int]
    PASS_TO_PASS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    image: str
    workdir: str
    eval_script: str
    log_parser: str
    fail_to_pass: _containers.RepeatedScalarFieldContainer[str]
    pass_to_pass: _containers.RepeatedScalarFieldContainer[str]
    timeout: _duration_pb2.Duration
    def __init__(self, image: _Optional[str] = ..., workdir: _Optional[str] = ..., eval_script: _Optional[str] = ..., log_parser: _Optional[str] = ..., fail_to_pass: _Optional[_Iterable[str]] = ..., pass_to_pass: _Optional[_Iterable[str]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class OutcomeRewardConfig(_message.Message):
    __slots__ = ("resolved_reward", "unresolved_reward", "truncated_reward")
    RESOLVED_REWARD_FIELD_NUMBER: _ClassVar[int]
    UNRESOLVED_REWARD_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_REWARD_FIELD_NUMBER: _ClassVar[int]
    resolved_reward: float
    unresolved_reward: float
    truncated_reward: float
    def __init__(self, resolved_reward: _Optional[float] = ..., unresolved_reward: _Optional[float] = ..., truncated_reward: _Optional[float] = ...) -> None: ...

class ComputeOutcomeRewardRequest(_message.Message):
    __slots__ = ("task_id", "spec", "patch", "stop_reason", "config", "sandbox_id", "task_set")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_SET_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    spec: TestSpec
    patch: str
    stop_reason: _types_pb2.StopReason
    config: OutcomeRewardConfig
    sandbox_id: str
    task_set: str
    def __init__(self, task_id: _Optional[str] = ..., spec: _Optional[_Union[TestSpec, _Mapping]] = ..., patch: _Optional[str] = ..., stop_reason: _Optional[_Union[_types_pb2.StopReason, str]] = ..., config: _Optional[_Union[OutcomeRewardConfig, _Mapping]] = ..., sandbox_id: _Optional[str] = ..., task_set: _Optional[str] = ...) -> None: ...

class ComputeOutcomeRewardResponse(_message.Message):
    __slots__ = ("reward",)
    REWARD_FIELD_NUMBER: _ClassVar[int]
    reward: _types_pb2.Reward
    def __init__(self, reward: _Optional[_Union[_types_pb2.Reward, _Mapping]] = ...) -> None: ...

class RubricCriterion(_message.Message):
    __slots__ = ("criterion_id", "name", "weight", "description")
    CRITERION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    criterion_id: str
    name: str
    weight: float
    description: str
    def __init__(self, criterion_id: _Optional[str] = ..., name: _Optional[str] = ..., weight: _Optional[float] = ..., description: _Optional[str] = ...) -> None: ...

class JudgeConfig(_message.Message):
    __slots__ = ("judge_model", "alpha", "temperature", "max_tokens", "rubric")
    JUDGE_MODEL_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUBRIC_FIELD_NUMBER: _ClassVar[int]
    judge_model: str
    alpha: float
    temperature: float
    max_tokens: int
    rubric: _containers.RepeatedCompositeFieldContainer[RubricCriterion]
    def __init__(self, judge_model: _Optional[str] = ..., alpha: _Optional[float] = ..., temperature: _Optional[float] = ..., max_tokens: _Optional[int] = ..., rubric: _Optional[_Iterable[_Union[RubricCriterion, _Mapping]]] = ...) -> None: ...

class JudgeReference(_message.Message):
    __slots__ = ("gold_patch", "changed_files", "test_files", "fail_to_pass")
    GOLD_PATCH_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FILES_FIELD_NUMBER: _ClassVar[int]
    TEST_FILES_FIELD_NUMBER: _ClassVar[int]
    FAIL_TO_PASS_FIELD_NUMBER: _ClassVar[int]
    gold_patch: str
    changed_files: _containers.RepeatedScalarFieldContainer[str]
    test_files: _containers.RepeatedScalarFieldContainer[str]
    fail_to_pass: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, gold_patch: _Optional[str] = ..., changed_files: _Optional[_Iterable[str]] = ..., test_files: _Optional[_Iterable[str]] = ..., fail_to_pass: _Optional[_Iterable[str]] = ...) -> None: ...

class JudgeTrajectoryRequest(_message.Message):
    __slots__ = ("trajectory", "problem_statement", "outcome", "reference", "config")
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    trajectory: _types_pb2.Trajectory
    problem_statement: str
    outcome: _types_pb2.Reward
    reference: JudgeReference
    config: JudgeConfig
    def __init__(self, trajectory: _Optional[_Union[_types_pb2.Trajectory, _Mapping]] = ..., problem_statement: _Optional[str] = ..., outcome: _Optional[_Union[_types_pb2.Reward, _Mapping]] = ..., reference: _Optional[_Union[JudgeReference, _Mapping]] = ..., config: _Optional[_Union[JudgeConfig, _Mapping]] = ...) -> None: ...

class JudgeTrajectoryResponse(_message.Message):
    __slots__ = ("reward",)
    REWARD_FIELD_NUMBER: _ClassVar[int]
    reward: _types_pb2.Reward
    def __init__(self, reward: _Optional[_Union[_types_pb2.Reward, _Mapping]] = ...) -> None: ...

class BatchJudgeTrajectoriesRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[JudgeTrajectoryRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[JudgeTrajectoryRequest, _Mapping]]] = ...) -> None: ...

class BatchJudgeTrajectoriesResponse(_message.Message):
    __slots__ = ("rewards",)
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    rewards: _containers.RepeatedCompositeFieldContainer[_types_pb2.Reward]
    def __init__(self, rewards: _Optional[_Iterable[_Union[_types_pb2.Reward, _Mapping]]] = ...) -> None: ...

class ComputeTeacherLogprobsRequest(_message.Message):
    __slots__ = ("teacher_model", "prompt_token_ids", "response", "max_context_tokens")
    TEACHER_MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    teacher_model: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response: _types_pb2.TokenSpan
    max_context_tokens: int
    def __init__(self, teacher_model: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., response: _Optional[_Union[_types_pb2.TokenSpan, _Mapping]] = ..., max_context_tokens: _Optional[int] = ...) -> None: ...

class ComputeTeacherLogprobsResponse(_message.Message):
    __slots__ = ("reward",)
    REWARD_FIELD_NUMBER: _ClassVar[int]
    reward: _types_pb2.Reward
    def __init__(self, reward: _Optional[_Union[_types_pb2.Reward, _Mapping]] = ...) -> None: ...

class BatchComputeTeacherLogprobsRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ComputeTeacherLogprobsRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[ComputeTeacherLogprobsRequest, _Mapping]]] = ...) -> None: ...

class BatchComputeTeacherLogprobsResponse(_message.Message):
    __slots__ = ("rewards",)
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    rewards: _containers.RepeatedCompositeFieldContainer[_types_pb2.Reward]
    def __init__(self, rewards: _Optional[_Iterable[_Union[_types_pb2.Reward, _Mapping]]] = ...) -> None: ...

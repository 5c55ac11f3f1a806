import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from orchard.types.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CandidateChecks(_message.Message):
    __slots__ = ("patch_applies", "repro_tests_pass", "regression_tests_pass")
    PATCH_APPLIES_FIELD_NUMBER: _ClassVar[int]
    REPRO_TESTS_PASS_FIELD_NUMBER: _ClassVar[int]
    REGRESSION_TESTS_PASS_FIELD_NUMBER: _ClassVar[int]
    patch_applies: bool
    repro_tests_pass: bool
    regression_tests_pass: bool
    def __init__(self, patch_applies: _Optional[bool] = ..., repro_tests_pass: _Optional[bool] = ..., regression_tests_pass: _Optional[bool] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("candidate_id", "problem_statement", "trajectory", "patch", "checks")
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    candidate_id: str
    problem_statement: str
    trajectory: _types_pb2.Trajectory
    patch: str
    checks: CandidateChecks
    def __init__(self, candidate_id: _Optional[str] = ..., problem_statement: _Optional[str] = ..., trajectory: _Optional[_Union[_types_pb2.Trajectory, _Mapping]] = ..., patch: _Optional[str] = ..., checks: _Optional[_Union[CandidateChecks, _Mapping]] = ...) -> None: ...

class ScoredCandidate(_message.Message):
    __slots__ = ("candidate_id", "score", "logit")
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    LOGIT_FIELD_NUMBER: _ClassVar[int]
    candidate_id: str
    score: float
    logit: float
    def __init__(self, candidate_id: _Optional[str] = ..., score: _Optional[float] = ..., logit: _Optional[float] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("candidates",)
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    def __init__(self, candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "model_version")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[ScoredCandidate]
    model_version: str
    def __init__(self, scores: _Optional[_Iterable[_Union[ScoredCandidate, _Mapping]]] = ..., model_version: _Optional[str] = ...) -> None: ...

class RankedCandidate(_message.Message):
    __slots__ = ("candidate_id", "rank", "score", "cluster_id", "cluster_size", "excluded", "exclusion_reason")
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    EXCLUSION_REASON_FIELD_NUMBER: _ClassVar[int]
    candidate_id: str
    rank: int
    score: float
    cluster_id: str
    cluster_size: int
    excluded: bool
    exclusion_reason: str
    def __init__(self, candidate_id: _Optional[str] = ..., rank: _Optional[int] = ..., score: _Optional[float] = ..., cluster_id: _Optional[str] = ..., cluster_size: _Optional[int] = ..., excluded: _Optional[bool] = ..., exclusion_reason: _Optional[str] = ...) -> None: ...

class RerankRequest(_message.Message):
    __slots__ = ("task_id", "problem_statement", "candidates", "tie_margin")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    TIE_MARGIN_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    problem_statement: str
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    tie_margin: float
    def __init__(self, task_id: _Optional[str] = ..., problem_statement: _Optional[str] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., tie_margin: _Optional[float] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("ranked", "best_candidate_id", "model_version", "tie_margin")
    RANKED_FIELD_NUMBER: _ClassVar[int]
    BEST_CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIE_MARGIN_FIELD_NUMBER: _ClassVar[int]
    ranked: _containers.RepeatedCompositeFieldContainer[RankedCandidate]
    best_candidate_id: str
    model_version: str
    tie_margin: float
    def __init__(self, ranked: _Optional[_Iterable[_Union[RankedCandidate, _Mapping]]] = ..., best_candidate_id: _Optional[str] = ..., model_version: _Optional[str] = ..., tie_margin: _Optional[float] = ...) -> None: ...

class ValueModel(_message.Message):
    __slots__ = ("name", "version", "checkpoint_path", "base_model", "max_context_tokens", "job", "metrics", "load_time")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    LOAD_TIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    checkpoint_path: str
    base_model: str
    max_context_tokens: int
    job: str
    metrics: _containers.ScalarMap[str, float]
    load_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., checkpoint_path: _Optional[str] = ..., base_model: _Optional[str] = ..., max_context_tokens: _Optional[int] = ..., job: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., load_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LoadModelRequest(_message.Message):
    __slots__ = ("checkpoint_path", "version")
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    checkpoint_path: str
    version: str
    def __init__(self, checkpoint_path: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class LoadModelResponse(_message.Message):
    __slots__ = ("model", "previous_version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    model: ValueModel
    previous_version: str
    def __init__(self, model: _Optional[_Union[ValueModel, _Mapping]] = ..., previous_version: _Optional[str] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: ValueModel
    def __init__(self, model: _Optional[_Union[ValueModel, _Mapping]] = ...) -> None: ...

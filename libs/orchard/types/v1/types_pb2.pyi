import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_DEVELOPER: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]
    ROLE_TOOL: _ClassVar[Role]

class ActionStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTION_STATUS_UNSPECIFIED: _ClassVar[ActionStatus]
    ACTION_STATUS_OK: _ClassVar[ActionStatus]
    ACTION_STATUS_PARSE_ERROR: _ClassVar[ActionStatus]
    ACTION_STATUS_UNKNOWN_TOOL: _ClassVar[ActionStatus]
    ACTION_STATUS_TIMED_OUT: _ClassVar[ActionStatus]
    ACTION_STATUS_ENV_ERROR: _ClassVar[ActionStatus]
    ACTION_STATUS_SUBMITTED: _ClassVar[ActionStatus]

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_UNSPECIFIED: _ClassVar[StopReason]
    STOP_REASON_SUBMITTED: _ClassVar[StopReason]
    STOP_REASON_STEP_LIMIT: _ClassVar[StopReason]
    STOP_REASON_TOKEN_LIMIT: _ClassVar[StopReason]
    STOP_REASON_TIME_LIMIT: _ClassVar[StopReason]
    STOP_REASON_FORMAT_ERROR: _ClassVar[StopReason]
    STOP_REASON_MODEL_ERROR: _ClassVar[StopReason]
    STOP_REASON_ENV_ERROR: _ClassVar[StopReason]
    STOP_REASON_CANCELLED: _ClassVar[StopReason]

class RewardKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REWARD_KIND_UNSPECIFIED: _ClassVar[RewardKind]
    REWARD_KIND_OUTCOME: _ClassVar[RewardKind]
    REWARD_KIND_RPR: _ClassVar[RewardKind]
    REWARD_KIND_OPD: _ClassVar[RewardKind]
    REWARD_KIND_VALUE_MODEL: _ClassVar[RewardKind]
    REWARD_KIND_STEP_VALUE: _ClassVar[RewardKind]

class OutcomeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_STATUS_UNSPECIFIED: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_RESOLVED: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_UNRESOLVED: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_TRUNCATED: _ClassVar[OutcomeStatus]
    OUTCOME_STATUS_ERROR: _ClassVar[OutcomeStatus]

class TestGroup(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TEST_GROUP_UNSPECIFIED: _ClassVar[TestGroup]
    TEST_GROUP_FAIL_TO_PASS: _ClassVar[TestGroup]
    TEST_GROUP_PASS_TO_PASS: _ClassVar[TestGroup]

class TestStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TEST_STATUS_UNSPECIFIED: _ClassVar[TestStatus]
    TEST_STATUS_PASSED: _ClassVar[TestStatus]
    TEST_STATUS_FAILED: _ClassVar[TestStatus]
    TEST_STATUS_ERROR: _ClassVar[TestStatus]
    TEST_STATUS_SKIPPED: _ClassVar[TestStatus]
    TEST_STATUS_MISSING: _ClassVar[TestStatus]
ROLE_UNSPECIFIED: Role
ROLE_SYSTEM: Role
ROLE_DEVELOPER: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
ROLE_TOOL: Role
ACTION_STATUS_UNSPECIFIED: ActionStatus
ACTION_STATUS_OK: ActionStatus
ACTION_STATUS_PARSE_ERROR: ActionStatus
ACTION_STATUS_UNKNOWN_TOOL: ActionStatus
ACTION_STATUS_TIMED_OUT: ActionStatus
ACTION_STATUS_ENV_ERROR: ActionStatus
ACTION_STATUS_SUBMITTED: ActionStatus
STOP_REASON_UNSPECIFIED: StopReason
STOP_REASON_SUBMITTED: StopReason
STOP_REASON_STEP_LIMIT: StopReason
STOP_REASON_TOKEN_LIMIT: StopReason
STOP_REASON_TIME_LIMIT: StopReason
STOP_REASON_FORMAT_ERROR: StopReason
STOP_REASON_MODEL_ERROR: StopReason
STOP_REASON_ENV_ERROR: StopReason
STOP_REASON_CANCELLED: StopReason
REWARD_KIND_UNSPECIFIED: RewardKind
REWARD_KIND_OUTCOME: RewardKind
REWARD_KIND_RPR: RewardKind
REWARD_KIND_OPD: RewardKind
REWARD_KIND_VALUE_MODEL: RewardKind
REWARD_KIND_STEP_VALUE: RewardKind
OUTCOME_STATUS_UNSPECIFIED: OutcomeStatus
OUTCOME_STATUS_RESOLVED: OutcomeStatus
OUTCOME_STATUS_UNRESOLVED: OutcomeStatus
OUTCOME_STATUS_TRUNCATED: OutcomeStatus
OUTCOME_STATUS_ERROR: OutcomeStatus
TEST_GROUP_UNSPECIFIED: TestGroup
TEST_GROUP_FAIL_TO_PASS: TestGroup
TEST_GROUP_PASS_TO_PASS: TestGroup
TEST_STATUS_UNSPECIFIED: TestStatus
TEST_STATUS_PASSED: TestStatus
TEST_STATUS_FAILED: TestStatus
TEST_STATUS_ERROR: TestStatus
TEST_STATUS_SKIPPED: TestStatus
TEST_STATUS_MISSING: TestStatus

class Image(_message.Message):
    __slots__ = ("data", "url", "mime_type", "width", "height")
    DATA_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    url: str
    mime_type: str
    width: int
    height: int
    def __init__(self, data: _Optional[bytes] = ..., url: _Optional[str] = ..., mime_type: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class ContentPart(_message.Message):
    __slots__ = ("text", "image")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    text: str
    image: Image
    def __init__(self, text: _Optional[str] = ..., image: _Optional[_Union[Image, _Mapping]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ToolDefinition(_message.Message):
    __slots__ = ("name", "description", "parameters")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content", "parts", "name", "tool_calls", "tool_call_id", "reasoning")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    role: Role
    content: str
    parts: _containers.RepeatedCompositeFieldContainer[ContentPart]
    name: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    reasoning: str
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ..., parts: _Optional[_Iterable[_Union[ContentPart, _Mapping]]] = ..., name: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., reasoning: _Optional[str] = ...) -> None: ...

class TokenSpan(_message.Message):
    __slots__ = ("token_ids", "logprobs", "mask")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    mask: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., mask: _Optional[_Iterable[int]] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("tool_call_id", "message", "exit_code", "truncated", "duration")
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    tool_call_id: str
    message: Message
    exit_code: int
    truncated: bool
    duration: _duration_pb2.Duration
    def __init__(self, tool_call_id: _Optional[str] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., exit_code: _Optional[int] = ..., truncated: _Optional[bool] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("index", "model_output", "actions", "action_status", "action_error", "observations", "prompt_tokens", "tokens", "prompt_token_count", "completion_token_count", "weights_version", "start_time", "end_time", "model_duration", "env_duration")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MODEL_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    ACTION_STATUS_FIELD_NUMBER: _ClassVar[int]
    ACTION_ERROR_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    MODEL_DURATION_FIELD_NUMBER: _ClassVar[int]
    ENV_DURATION_FIELD_NUMBER: _ClassVar[int]
    index: int
    model_output: Message
    actions: _containers.RepeatedCompositeFieldContainer[ToolCall]
    action_status: ActionStatus
    action_error: str
    observations: _containers.RepeatedCompositeFieldContainer[Observation]
    prompt_tokens: TokenSpan
    tokens: TokenSpan
    prompt_token_count: int
    completion_token_count: int
    weights_version: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    model_duration: _duration_pb2.Duration
    env_duration: _duration_pb2.Duration
    def __init__(self, index: _Optional[int] = ..., model_output: _Optional[_Union[Message, _Mapping]] = ..., actions: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., action_status: _Optional[_Union[ActionStatus, str]] = ..., action_error: _Optional[str] = ..., observations: _Optional[_Iterable[_Union[Observation, _Mapping]]] = ..., prompt_tokens: _Optional[_Union[TokenSpan, _Mapping]] = ..., tokens: _Optional[_Union[TokenSpan, _Mapping]] = ..., prompt_token_count: _Optional[int] = ..., completion_token_count: _Optional[int] = ..., weights_version: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., model_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., env_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("model", "weights_version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    weights_version: str
    def __init__(self, model: _Optional[str] = ..., weights_version: _Optional[str] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("name", "trajectory_id", "run_id", "task_id", "task_set", "harness", "policy", "group_id", "sample_index", "tools", "messages", "steps", "prompt_tokens", "final_patch", "patch_hash", "final_answer", "stop_reason", "stop_detail", "rewards", "step_count", "token_count", "metadata", "start_time", "end_time", "duration")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_SET_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINAL_PATCH_FIELD_NUMBER: _ClassVar[int]
    PATCH_HASH_FIELD_NUMBER: _ClassVar[int]
    FINAL_ANSWER_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_DETAIL_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    STEP_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    trajectory_id: str
    run_id: str
    task_id: str
    task_set: str
    harness: str
    policy: Policy
    group_id: str
    sample_index: int
    tools: _containers.RepeatedCompositeFieldContainer[ToolDefinition]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    prompt_tokens: TokenSpan
    final_patch: str
    patch_hash: str
    final_answer: str
    stop_reason: StopReason
    stop_detail: str
    rewards: _containers.RepeatedCompositeFieldContainer[Reward]
    step_count: int
    token_count: int
    metadata: _containers.ScalarMap[str, str]
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    duration: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., trajectory_id: _Optional[str] = ..., run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., task_set: _Optional[str] = ..., harness: _Optional[str] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., group_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., tools: _Optional[_Iterable[_Union[ToolDefinition, _Mapping]]] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., prompt_tokens: _Optional[_Union[TokenSpan, _Mapping]] = ..., final_patch: _Optional[str] = ..., patch_hash: _Optional[str] = ..., final_answer: _Optional[str] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., stop_detail: _Optional[str] = ..., rewards: _Optional[_Iterable[_Union[Reward, _Mapping]]] = ..., step_count: _Optional[int] = ..., token_count: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class TestResult(_message.Message):
    __slots__ = ("test_id", "group", "status")
    TEST_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    test_id: str
    group: TestGroup
    status: TestStatus
    def __init__(self, test_id: _Optional[str] = ..., group: _Optional[_Union[TestGroup, str]] = ..., status: _Optional[_Union[TestStatus, str]] = ...) -> None: ...

class OutcomeDetails(_message.Message):
    __slots__ = ("status", "patch_applied", "fail_to_pass_passed", "fail_to_pass_total", "pass_to_pass_passed", "pass_to_pass_total", "tests", "log_tail", "error", "duration")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PATCH_APPLIED_FIELD_NUMBER: _ClassVar[int]
    FAIL_TO_PASS_PASSED_FIELD_NUMBER: _ClassVar[int]
    FAIL_TO_PASS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PASS_TO_PASS_PASSED_FIELD_NUMBER: _ClassVar[int]
    PASS_TO_PASS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    LOG_TAIL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    status: OutcomeStatus
    patch_applied: bool
    fail_to_pass_passed: int
    fail_to_pass_total: int
    pass_to_pass_passed: int
    pass_to_pass_total: int
    tests: _containers.RepeatedCompositeFieldContainer[TestResult]
    log_tail: str
    error: str
    duration: _duration_pb2.Duration
    def __init__(self, status: _Optional[_Union[OutcomeStatus, str]] = ..., patch_applied: _Optional[bool] = ..., fail_to_pass_passed: _Optional[int] = ..., fail_to_pass_total: _Optional[int] = ..., pass_to_pass_passed: _Optional[int] = ..., pass_to_pass_total: _Optional[int] = ..., tests: _Optional[_Iterable[_Union[TestResult, _Mapping]]] = ..., log_tail: _Optional[str] = ..., error: _Optional[str] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CriterionScore(_message.Message):
    __slots__ = ("criterion_id", "name", "weight", "score", "raw_score")
    CRITERION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORE_FIELD_NUMBER: _ClassVar[int]
    criterion_id: str
    name: str
    weight: float
    score: float
    raw_score: float
    def __init__(self, criterion_id: _Optional[str] = ..., name: _Optional[str] = ..., weight: _Optional[float] = ..., score: _Optional[float] = ..., raw_score: _Optional[float] = ...) -> None: ...

class JudgeDetails(_message.Message):
    __slots__ = ("scores", "judge_score", "alpha", "outcome_reward", "reasoning", "judge_model", "fell_back", "fallback_reason", "adjustments", "reference_guided")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    JUDGE_SCORE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_REWARD_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    JUDGE_MODEL_FIELD_NUMBER: _ClassVar[int]
    FELL_BACK_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    ADJUSTMENTS_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_GUIDED_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[CriterionScore]
    judge_score: float
    alpha: float
    outcome_reward: float
    reasoning: str
    judge_model: str
    fell_back: bool
    fallback_reason: str
    adjustments: _containers.RepeatedScalarFieldContainer[str]
    reference_guided: bool
    def __init__(self, scores: _Optional[_Iterable[_Union[CriterionScore, _Mapping]]] = ..., judge_score: _Optional[float] = ..., alpha: _Optional[float] = ..., outcome_reward: _Optional[float] = ..., reasoning: _Optional[str] = ..., judge_model: _Optional[str] = ..., fell_back: _Optional[bool] = ..., fallback_reason: _Optional[str] = ..., adjustments: _Optional[_Iterable[str]] = ..., reference_guided: _Optional[bool] = ...) -> None: ...

class TeacherDetails(_message.Message):
    __slots__ = ("teacher_model", "teacher_weights_version", "teacher_logprobs", "mask", "truncated_tokens")
    TEACHER_MODEL_FIELD_NUMBER: _ClassVar[int]
    TEACHER_WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    TEACHER_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    teacher_model: str
    teacher_weights_version: str
    teacher_logprobs: _containers.RepeatedScalarFieldContainer[float]
    mask: _containers.RepeatedScalarFieldContainer[int]
    truncated_tokens: int
    def __init__(self, teacher_model: _Optional[str] = ..., teacher_weights_version: _Optional[str] = ..., teacher_logprobs: _Optional[_Iterable[float]] = ..., mask: _Optional[_Iterable[int]] = ..., truncated_tokens: _Optional[int] = ...) -> None: ...

class StepValueDetails(_message.Message):
    __slots__ = ("key_step", "rationale", "annotator_model")
    KEY_STEP_FIELD_NUMBER: _ClassVar[int]
    RATIONALE_FIELD_NUMBER: _ClassVar[int]
    ANNOTATOR_MODEL_FIELD_NUMBER: _ClassVar[int]
    key_step: bool
    rationale: str
    annotator_model: str
    def __init__(self, key_step: _Optional[bool] = ..., rationale: _Optional[str] = ..., annotator_model: _Optional[str] = ...) -> None: ...

class Reward(_message.Message):
    __slots__ = ("kind", "value", "name", "step_index", "source", "create_time", "outcome", "judge", "teacher", "step_value")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    JUDGE_FIELD_NUMBER: _ClassVar[int]
    TEACHER_FIELD_NUMBER: _ClassVar[int]
    STEP_VALUE_FIELD_NUMBER: _ClassVar[int]
    kind: RewardKind
    value: float
    name: str
    step_index: int
    source: str
    create_time: _timestamp_pb2.Timestamp
    outcome: OutcomeDetails
    judge: JudgeDetails
    teacher: TeacherDetails
    step_value: StepValueDetails
    def __init__(self, kind: _Optional[_Union[RewardKind, str]] = ..., value: _Optional[float] = ..., name: _Optional[str] = ..., step_index: _Optional[int] = ..., source: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[_Union[OutcomeDetails, _Mapping]] = ..., judge: _Optional[_Union[JudgeDetails, _Mapping]] = ..., teacher: _Optional[_Union[TeacherDetails, _Mapping]] = ..., step_value: _Optional[_Union[StepValueDetails, _Mapping]] = ...) -> None: ...

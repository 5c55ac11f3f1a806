import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from orchard.experience.v1 import experience_pb2 as _experience_pb2
from orchard.inference.v1 import inference_pb2 as _inference_pb2
from orchard.reward.v1 import reward_pb2 as _reward_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_KIND_UNSPECIFIED: _ClassVar[JobKind]
    JOB_KIND_SFT: _ClassVar[JobKind]
    JOB_KIND_CREDIT_ASSIGNMENT_SFT: _ClassVar[JobKind]
    JOB_KIND_RL: _ClassVar[JobKind]
    JOB_KIND_VALUE: _ClassVar[JobKind]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_QUEUED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class LrSchedule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LR_SCHEDULE_UNSPECIFIED: _ClassVar[LrSchedule]
    LR_SCHEDULE_COSINE: _ClassVar[LrSchedule]
    LR_SCHEDULE_LINEAR: _ClassVar[LrSchedule]
    LR_SCHEDULE_CONSTANT: _ClassVar[LrSchedule]

class SftSampleMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SFT_SAMPLE_MODE_UNSPECIFIED: _ClassVar[SftSampleMode]
    SFT_SAMPLE_MODE_TRAJECTORY: _ClassVar[SftSampleMode]
    SFT_SAMPLE_MODE_PER_TURN: _ClassVar[SftSampleMode]

class OverflowPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERFLOW_POLICY_UNSPECIFIED: _ClassVar[OverflowPolicy]
    OVERFLOW_POLICY_TRUNCATE_LEFT: _ClassVar[OverflowPolicy]
    OVERFLOW_POLICY_DROP: _ClassVar[OverflowPolicy]

class RlAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RL_ALGORITHM_UNSPECIFIED: _ClassVar[RlAlgorithm]
    RL_ALGORITHM_GRPO: _ClassVar[RlAlgorithm]
    RL_ALGORITHM_GSPO: _ClassVar[RlAlgorithm]
    RL_ALGORITHM_RLOO: _ClassVar[RlAlgorithm]

class GroupFilter(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GROUP_FILTER_UNSPECIFIED: _ClassVar[GroupFilter]
    GROUP_FILTER_DEFAULT: _ClassVar[GroupFilter]
    GROUP_FILTER_NONZERO_STD: _ClassVar[GroupFilter]
    GROUP_FILTER_NO_ABORTED: _ClassVar[GroupFilter]
    GROUP_FILTER_NONE: _ClassVar[GroupFilter]

class LossAggregation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOSS_AGGREGATION_UNSPECIFIED: _ClassVar[LossAggregation]
    LOSS_AGGREGATION_TOKEN_MEAN: _ClassVar[LossAggregation]
    LOSS_AGGREGATION_SEQUENCE_MEAN: _ClassVar[LossAggregation]

class OpdLossType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPD_LOSS_TYPE_UNSPECIFIED: _ClassVar[OpdLossType]
    OPD_LOSS_TYPE_K1: _ClassVar[OpdLossType]
    OPD_LOSS_TYPE_K2: _ClassVar[OpdLossType]
    OPD_LOSS_TYPE_K3: _ClassVar[OpdLossType]
    OPD_LOSS_TYPE_JS_SKEW: _ClassVar[OpdLossType]

class ValueHead(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VALUE_HEAD_UNSPECIFIED: _ClassVar[ValueHead]
    VALUE_HEAD_SCALAR: _ClassVar[ValueHead]
    VALUE_HEAD_YES_TOKEN: _ClassVar[ValueHead]
JOB_KIND_UNSPECIFIED: JobKind
JOB_KIND_SFT: JobKind
JOB_KIND_CREDIT_ASSIGNMENT_SFT: JobKind
JOB_KIND_RL: JobKind
JOB_KIND_VALUE: JobKind
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_QUEUED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
LR_SCHEDULE_UNSPECIFIED: LrSchedule
LR_SCHEDULE_COSINE: LrSchedule
LR_SCHEDULE_LINEAR: LrSchedule
LR_SCHEDULE_CONSTANT: LrSchedule
SFT_SAMPLE_MODE_UNSPECIFIED: SftSampleMode
SFT_SAMPLE_MODE_TRAJECTORY: SftSampleMode
SFT_SAMPLE_MODE_PER_TURN: SftSampleMode
OVERFLOW_POLICY_UNSPECIFIED: OverflowPolicy
OVERFLOW_POLICY_TRUNCATE_LEFT: OverflowPolicy
OVERFLOW_POLICY_DROP: OverflowPolicy
RL_ALGORITHM_UNSPECIFIED: RlAlgorithm
RL_ALGORITHM_GRPO: RlAlgorithm
RL_ALGORITHM_GSPO: RlAlgorithm
RL_ALGORITHM_RLOO: RlAlgorithm
GROUP_FILTER_UNSPECIFIED: GroupFilter
GROUP_FILTER_DEFAULT: GroupFilter
GROUP_FILTER_NONZERO_STD: GroupFilter
GROUP_FILTER_NO_ABORTED: GroupFilter
GROUP_FILTER_NONE: GroupFilter
LOSS_AGGREGATION_UNSPECIFIED: LossAggregation
LOSS_AGGREGATION_TOKEN_MEAN: LossAggregation
LOSS_AGGREGATION_SEQUENCE_MEAN: LossAggregation
OPD_LOSS_TYPE_UNSPECIFIED: OpdLossType
OPD_LOSS_TYPE_K1: OpdLossType
OPD_LOSS_TYPE_K2: OpdLossType
OPD_LOSS_TYPE_K3: OpdLossType
OPD_LOSS_TYPE_JS_SKEW: OpdLossType
VALUE_HEAD_UNSPECIFIED: ValueHead
VALUE_HEAD_SCALAR: ValueHead
VALUE_HEAD_YES_TOKEN: ValueHead

class Hyperparameters(_message.Message):
    __slots__ = ("learning_rate", "min_learning_rate", "lr_schedule", "warmup_ratio", "weight_decay", "adam_beta1", "adam_beta2", "max_grad_norm", "epochs", "max_steps", "global_batch_size", "micro_batch_size", "max_seq_len", "seed", "save_every_steps")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MIN_LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    LR_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    WARMUP_RATIO_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    ADAM_BETA1_FIELD_NUMBER: _ClassVar[int]
    ADAM_BETA2_FIELD_NUMBER: _ClassVar[int]
    MAX_GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAVE_EVERY_STEPS_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    min_learning_rate: float
    lr_schedule: LrSchedule
    warmup_ratio: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    max_grad_norm: float
    epochs: int
    max_steps: int
    global_batch_size: int
    micro_batch_size: int
    max_seq_len: int
    seed: int
    save_every_steps: int
    def __init__(self, learning_rate: _Optional[float] = ..., min_learning_rate: _Optional[float] = ..., lr_schedule: _Optional[_Union[LrSchedule, str]] = ..., warmup_ratio: _Optional[float] = ..., weight_decay: _Optional[float] = ..., adam_beta1: _Optional[float] = ..., adam_beta2: _Optional[float] = ..., max_grad_norm: _Optional[float] = ..., epochs: _Optional[int] = ..., max_steps: _Optional[int] = ..., global_batch_size: _Optional[int] = ..., micro_batch_size: _Optional[int] = ..., max_seq_len: _Optional[int] = ..., seed: _Optional[int] = ..., save_every_steps: _Optional[int] = ...) -> None: ...

class Compute(_message.Message):
    __slots__ = ("nodes", "gpus_per_node", "cpu_processes")
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    CPU_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    gpus_per_node: int
    cpu_processes: int
    def __init__(self, nodes: _Optional[int] = ..., gpus_per_node: _Optional[int] = ..., cpu_processes: _Optional[int] = ...) -> None: ...

class DatasetSource(_message.Message):
    __slots__ = ("experience", "path", "limit", "distinct_patches", "eval_task_files", "task_ids")
    EXPERIENCE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    DISTINCT_PATCHES_FIELD_NUMBER: _ClassVar[int]
    EVAL_TASK_FILES_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    experience: _experience_pb2.TrajectoryFilter
    path: str
    limit: int
    distinct_patches: bool
    eval_task_files: _containers.RepeatedScalarFieldContainer[str]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, experience: _Optional[_Union[_experience_pb2.TrajectoryFilter, _Mapping]] = ..., path: _Optional[str] = ..., limit: _Optional[int] = ..., distinct_patches: _Optional[bool] = ..., eval_task_files: _Optional[_Iterable[str]] = ..., task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SftConfig(_message.Message):
    __slots__ = ("sample_mode", "overflow_policy", "freeze_vision", "max_images")
    SAMPLE_MODE_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_POLICY_FIELD_NUMBER: _ClassVar[int]
    FREEZE_VISION_FIELD_NUMBER: _ClassVar[int]
    MAX_IMAGES_FIELD_NUMBER: _ClassVar[int]
    sample_mode: SftSampleMode
    overflow_policy: OverflowPolicy
    freeze_vision: bool
    max_images: int
    def __init__(self, sample_mode: _Optional[_Union[SftSampleMode, str]] = ..., overflow_policy: _Optional[_Union[OverflowPolicy, str]] = ..., freeze_vision: _Optional[bool] = ..., max_images: _Optional[int] = ...) -> None: ...

class CreditAssignmentSftConfig(_message.Message):
    __slots__ = ("sft", "annotator_model", "epsilon", "merge_gap")
    SFT_FIELD_NUMBER: _ClassVar[int]
    ANNOTATOR_MODEL_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    MERGE_GAP_FIELD_NUMBER: _ClassVar[int]
    sft: SftConfig
    annotator_model: str
    epsilon: float
    merge_gap: int
    def __init__(self, sft: _Optional[_Union[SftConfig, _Mapping]] = ..., annotator_model: _Optional[str] = ..., epsilon: _Optional[float] = ..., merge_gap: _Optional[int] = ...) -> None: ...

class BarConfig(_message.Message):
    __slots__ = ("max_group_size", "stride", "rho_min", "rho_max")
    MAX_GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    RHO_MIN_FIELD_NUMBER: _ClassVar[int]
    RHO_MAX_FIELD_NUMBER: _ClassVar[int]
    max_group_size: int
    stride: int
    rho_min: float
    rho_max: float
    def __init__(self, max_group_size: _Optional[int] = ..., stride: _Optional[int] = ..., rho_min: _Optional[float] = ..., rho_max: _Optional[float] = ...) -> None: ...

class OpdConfig(_message.Message):
    __slots__ = ("teacher_model", "kl_coef", "loss_type", "js_mixture_weight", "opd_only", "teacher_max_context_tokens")
    TEACHER_MODEL_FIELD_NUMBER: _ClassVar[int]
    KL_COEF_FIELD_NUMBER: _ClassVar[int]
    LOSS_TYPE_FIELD_NUMBER: _ClassVar[int]
    JS_MIXTURE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    OPD_ONLY_FIELD_NUMBER: _ClassVar[int]
    TEACHER_MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    teacher_model: str
    kl_coef: float
    loss_type: OpdLossType
    js_mixture_weight: float
    opd_only: bool
    teacher_max_context_tokens: int
    def __init__(self, teacher_model: _Optional[str] = ..., kl_coef: _Optional[float] = ..., loss_type: _Optional[_Union[OpdLossType, str]] = ..., js_mixture_weight: _Optional[float] = ..., opd_only: _Optional[bool] = ..., teacher_max_context_tokens: _Optional[int] = ...) -> None: ...

class RlConfig(_message.Message):
    __slots__ = ("algorithm", "harness", "policy_model", "group_size", "bar", "prompts_per_step", "oversample_prompts", "group_filter", "clip_eps_low", "clip_eps_high", "kl_coef", "entropy_coef", "loss_aggregation", "sampling", "max_turns", "max_trajectory_tokens", "rollout_timeout", "max_concurrent_rollouts", "outcome_reward", "judge", "opd", "max_staleness", "updates_per_step", "negative_advantage_scale")
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    POLICY_MODEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    BAR_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    OVERSAMPLE_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FILTER_FIELD_NUMBER: _ClassVar[int]
    CLIP_EPS_LOW_FIELD_NUMBER: _ClassVar[int]
    CLIP_EPS_HIGH_FIELD_NUMBER: _ClassVar[int]
    KL_COEF_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_COEF_FIELD_NUMBER: _ClassVar[int]
    LOSS_AGGREGATION_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    MAX_TRAJECTORY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_REWARD_FIELD_NUMBER: _ClassVar[int]
    JUDGE_FIELD_NUMBER: _ClassVar[int]
    OPD_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    UPDATES_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_ADVANTAGE_SCALE_FIELD_NUMBER: _ClassVar[int]
    algorithm: RlAlgorithm
    harness: str
    policy_model: str
    group_size: int
    bar: BarConfig
    prompts_per_step: int
    oversample_prompts: int
    group_filter: GroupFilter
    clip_eps_low: float
    clip_eps_high: float
    kl_coef: float
    entropy_coef: float
    loss_aggregation: LossAggregation
    sampling: _inference_pb2.SamplingParams
    max_turns: int
    max_trajectory_tokens: int
    rollout_timeout: _duration_pb2.Duration
    max_concurrent_rollouts: int
    outcome_reward: _reward_pb2.OutcomeRewardConfig
    judge: _reward_pb2.JudgeConfig
    opd: OpdConfig
    max_staleness: int
    updates_per_step: int
    negative_advantage_scale: float
    def __init__(self, algorithm: _Optional[_Union[RlAlgorithm, str]] = ..., harness: _Optional[str] = ..., policy_model: _Optional[str] = ..., group_size: _Optional[int] = ..., bar: _Optional[_Union[BarConfig, _Mapping]] = ..., prompts_per_step: _Optional[int] = ..., oversample_prompts: _Optional[int] = ..., group_filter: _Optional[_Union[GroupFilter, str]] = ..., clip_eps_low: _Optional[float] = ..., clip_eps_high: _Optional[float] = ..., kl_coef: _Optional[float] = ..., entropy_coef: _Optional[float] = ..., loss_aggregation: _Optional[_Union[LossAggregation, str]] = ..., sampling: _Optional[_Union[_inference_pb2.SamplingParams, _Mapping]] = ..., max_turns: _Optional[int] = ..., max_trajectory_tokens: _Optional[int] = ..., rollout_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_concurrent_rollouts: _Optional[int] = ..., outcome_reward: _Optional[_Union[_reward_pb2.OutcomeRewardConfig, _Mapping]] = ..., judge: _Optional[_Union[_reward_pb2.JudgeConfig, _Mapping]] = ..., opd: _Optional[_Union[OpdConfig, _Mapping]] = ..., max_staleness: _Optional[int] = ..., updates_per_step: _Optional[int] = ..., negative_advantage_scale: _Optional[float] = ...) -> None: ...

class ValueConfig(_message.Message):
    __slots__ = ("head", "pairwise_weight", "max_context_tokens", "eval_fraction", "best_at_n", "tie_margin")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    PAIRWISE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EVAL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    BEST_AT_N_FIELD_NUMBER: _ClassVar[int]
    TIE_MARGIN_FIELD_NUMBER: _ClassVar[int]
    head: ValueHead
    pairwise_weight: float
    max_context_tokens: int
    eval_fraction: float
    best_at_n: _containers.RepeatedScalarFieldContainer[int]
    tie_margin: float
    def __init__(self, head: _Optional[_Union[ValueHead, str]] = ..., pairwise_weight: _Optional[float] = ..., max_context_tokens: _Optional[int] = ..., eval_fraction: _Optional[float] = ..., best_at_n: _Optional[_Iterable[int]] = ..., tie_margin: _Optional[float] = ...) -> None: ...

class JobConfig(_message.Message):
    __slots__ = ("kind", "base_model", "dataset", "output_dir", "hyperparameters", "compute", "extra_args", "sft", "credit_assignment_sft", "rl", "value")
    class ExtraArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIR_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    EXTRA_ARGS_FIELD_NUMBER: _ClassVar[int]
    SFT_FIELD_NUMBER: _ClassVar[int]
    CREDIT_ASSIGNMENT_SFT_FIELD_NUMBER: _ClassVar[int]
    RL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    kind: JobKind
    base_model: str
    dataset: DatasetSource
    output_dir: str
    hyperparameters: Hyperparameters
    compute: Compute
    extra_args: _containers.ScalarMap[str, str]
    sft: SftConfig
    credit_assignment_sft: CreditAssignmentSftConfig
    rl: RlConfig
    value: ValueConfig
    def __init__(self, kind: _Optional[_Union[JobKind, str]] = ..., base_model: _Optional[str] = ..., dataset: _Optional[_Union[DatasetSource, _Mapping]] = ..., output_dir: _Optional[str] = ..., hyperparameters: _Optional[_Union[Hyperparameters, _Mapping]] = ..., compute: _Optional[_Union[Compute, _Mapping]] = ..., extra_args: _Optional[_Mapping[str, str]] = ..., sft: _Optional[_Union[SftConfig, _Mapping]] = ..., credit_assignment_sft: _Optional[_Union[CreditAssignmentSftConfig, _Mapping]] = ..., rl: _Optional[_Union[RlConfig, _Mapping]] = ..., value: _Optional[_Union[ValueConfig, _Mapping]] = ...) -> None: ...

class JobProgress(_message.Message):
    __slots__ = ("step", "total_steps", "epoch", "loss", "metrics", "update_time")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    epoch: float
    loss: float
    metrics: _containers.ScalarMap[str, float]
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ..., epoch: _Optional[float] = ..., loss: _Optional[float] = ..., metrics: _Optional[_Mapping[str, float]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("name", "job_id", "version", "step", "path", "metrics", "is_final", "create_time")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    IS_FINAL_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    job_id: str
    version: str
    step: int
    path: str
    metrics: _containers.ScalarMap[str, float]
    is_final: bool
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., job_id: _Optional[str] = ..., version: _Optional[str] = ..., step: _Optional[int] = ..., path: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., is_final: _Optional[bool] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("name", "job_id", "display_name", "config", "state", "error", "progress", "latest_checkpoint", "labels", "create_time", "start_time", "end_time")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    LATEST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    job_id: str
    display_name: str
    config: JobConfig
    state: JobState
    error: str
    progress: JobProgress
    latest_checkpoint: Checkpoint
    labels: _containers.ScalarMap[str, str]
    create_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., job_id: _Optional[str] = ..., display_name: _Optional[str] = ..., config: _Optional[_Union[JobConfig, _Mapping]] = ..., state: _Optional[_Union[JobState, str]] = ..., error: _Optional[str] = ..., progress: _Optional[_Union[JobProgress, _Mapping]] = ..., latest_checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateJobRequest(_message.Message):
    __slots__ = ("config", "job_id", "display_name", "labels", "request_id")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    config: JobConfig
    job_id: str
    display_name: str
    labels: _containers.ScalarMap[str, str]
    request_id: str
    def __init__(self, config: _Optional[_Union[JobConfig, _Mapping]] = ..., job_id: _Optional[str] = ..., display_name: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("kind", "state", "label_selector", "page_size", "page_token")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    kind: JobKind
    state: JobState
    label_selector: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    def __init__(self, kind: _Optional[_Union[JobKind, str]] = ..., state: _Optional[_Union[JobState, str]] = ..., label_selector: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: Job
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class WaitJobRequest(_message.Message):
    __slots__ = ("job_id", "timeout")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    timeout: _duration_pb2.Duration
    def __init__(self, job_id: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitJobResponse(_message.Message):
    __slots__ = ("job", "done")
    JOB_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    job: Job
    done: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., done: _Optional[bool] = ...) -> None: ...

class StreamJobEventsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class StreamJobEventsResponse(_message.Message):
    __slots__ = ("event_time", "job", "progress", "checkpoint")
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    event_time: _timestamp_pb2.Timestamp
    job: Job
    progress: JobProgress
    checkpoint: Checkpoint
    def __init__(self, event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., progress: _Optional[_Union[JobProgress, _Mapping]] = ..., checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ("job_id", "page_size", "page_token")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    page_size: int
    page_token: str
    def __init__(self, job_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints", "next_page_token")
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[Checkpoint]
    next_page_token: str
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[Checkpoint, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

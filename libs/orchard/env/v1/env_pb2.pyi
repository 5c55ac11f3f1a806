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

class SandboxKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SANDBOX_KIND_UNSPECIFIED: _ClassVar[SandboxKind]
    SANDBOX_KIND_CONTAINER: _ClassVar[SandboxKind]
    SANDBOX_KIND_BROWSER: _ClassVar[SandboxKind]

class SandboxState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SANDBOX_STATE_UNSPECIFIED: _ClassVar[SandboxState]
    SANDBOX_STATE_PENDING: _ClassVar[SandboxState]
    SANDBOX_STATE_READY: _ClassVar[SandboxState]
    SANDBOX_STATE_FAILED: _ClassVar[SandboxState]
    SANDBOX_STATE_DELETING: _ClassVar[SandboxState]
    SANDBOX_STATE_DELETED: _ClassVar[SandboxState]

class ExecState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXEC_STATE_UNSPECIFIED: _ClassVar[ExecState]
    EXEC_STATE_QUEUED: _ClassVar[ExecState]
    EXEC_STATE_RUNNING: _ClassVar[ExecState]
    EXEC_STATE_SUCCEEDED: _ClassVar[ExecState]
    EXEC_STATE_FAILED: _ClassVar[ExecState]
    EXEC_STATE_TIMED_OUT: _ClassVar[ExecState]
    EXEC_STATE_CANCELLED: _ClassVar[ExecState]

class Isolation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ISOLATION_UNSPECIFIED: _ClassVar[Isolation]
    ISOLATION_CONTAINER: _ClassVar[Isolation]
    ISOLATION_GVISOR: _ClassVar[Isolation]

class OutputStream(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_STREAM_UNSPECIFIED: _ClassVar[OutputStream]
    OUTPUT_STREAM_STDOUT: _ClassVar[OutputStream]
    OUTPUT_STREAM_STDERR: _ClassVar[OutputStream]

class FileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_TYPE_UNSPECIFIED: _ClassVar[FileType]
    FILE_TYPE_FILE: _ClassVar[FileType]
    FILE_TYPE_DIRECTORY: _ClassVar[FileType]
    FILE_TYPE_SYMLINK: _ClassVar[FileType]

class ActionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTION_TYPE_UNSPECIFIED: _ClassVar[ActionType]
    ACTION_TYPE_CLICK: _ClassVar[ActionType]
    ACTION_TYPE_DOUBLE_CLICK: _ClassVar[ActionType]
    ACTION_TYPE_TYPE: _ClassVar[ActionType]
    ACTION_TYPE_KEY_PRESS: _ClassVar[ActionType]
    ACTION_TYPE_SCROLL: _ClassVar[ActionType]
    ACTION_TYPE_NAVIGATE: _ClassVar[ActionType]
    ACTION_TYPE_BACK: _ClassVar[ActionType]
    ACTION_TYPE_WAIT: _ClassVar[ActionType]
SANDBOX_KIND_UNSPECIFIED: SandboxKind
SANDBOX_KIND_CONTAINER: SandboxKind
SANDBOX_KIND_BROWSER: SandboxKind
SANDBOX_STATE_UNSPECIFIED: SandboxState
SANDBOX_STATE_PENDING: SandboxState
SANDBOX_STATE_READY: SandboxState
SANDBOX_STATE_FAILED: SandboxState
SANDBOX_STATE_DELETING: SandboxState
SANDBOX_STATE_DELETED: SandboxState
EXEC_STATE_UNSPECIFIED: ExecState
EXEC_STATE_QUEUED: ExecState
EXEC_STATE_RUNNING: ExecState
EXEC_STATE_SUCCEEDED: ExecState
EXEC_STATE_FAILED: ExecState
EXEC_STATE_TIMED_OUT: ExecState
EXEC_STATE_CANCELLED: ExecState
ISOLATION_UNSPECIFIED: Isolation
ISOLATION_CONTAINER: Isolation
ISOLATION_GVISOR: Isolation
OUTPUT_STREAM_UNSPECIFIED: OutputStream
OUTPUT_STREAM_STDOUT: OutputStream
OUTPUT_STREAM_STDERR: OutputStream
FILE_TYPE_UNSPECIFIED: FileType
FILE_TYPE_FILE: FileType
FILE_TYPE_DIRECTORY: FileType
FILE_TYPE_SYMLINK: FileType
ACTION_TYPE_UNSPECIFIED: ActionType
ACTION_TYPE_CLICK: ActionType
ACTION_TYPE_DOUBLE_CLICK: ActionType
ACTION_TYPE_TYPE: ActionType
ACTION_TYPE_KEY_PRESS: ActionType
ACTION_TYPE_SCROLL: ActionType
ACTION_TYPE_NAVIGATE: ActionType
ACTION_TYPE_BACK: ActionType
ACTION_TYPE_WAIT: ActionType

class Resources(_message.Message):
    __slots__ = ("cpu_millis", "memory_bytes", "pids", "disk_bytes")
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    cpu_millis: int
    memory_bytes: int
    pids: int
    disk_bytes: int
    def __init__(self, cpu_millis: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., pids: _Optional[int] = ..., disk_bytes: _Optional[int] = ...) -> None: ...

class EgressRule(_message.Message):
    __slots__ = ("cidr", "host", "port")
    CIDR_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    cidr: str
    host: str
    port: int
    def __init__(self, cidr: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class NetworkPolicy(_message.Message):
    __slots__ = ("allow",)
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    allow: _containers.RepeatedCompositeFieldContainer[EgressRule]
    def __init__(self, allow: _Optional[_Iterable[_Union[EgressRule, _Mapping]]] = ...) -> None: ...

class Sandbox(_message.Message):
    __slots__ = ("name", "sandbox_id", "kind", "image", "state", "failure_reason", "resources", "env", "labels", "network_policy", "workdir", "create_time", "expire_time", "ttl", "heartbeat_timeout", "last_heartbeat_time", "tenant", "from_snapshot", "isolation")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POLICY_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_TIME_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    FROM_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    sandbox_id: str
    kind: SandboxKind
    image: str
    state: SandboxState
    failure_reason: str
    resources: Resources
    env: _containers.ScalarMap[str, str]
    labels: _containers.ScalarMap[str, str]
    network_policy: NetworkPolicy
    workdir: str
    create_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    ttl: _duration_pb2.Duration
    heartbeat_timeout: _duration_pb2.Duration
    last_heartbeat_time: _timestamp_pb2.Timestamp
    tenant: str
    from_snapshot: str
    isolation: Isolation
    def __init__(self, name: _Optional[str] = ..., sandbox_id: _Optional[str] = ..., kind: _Optional[_Union[SandboxKind, str]] = ..., image: _Optional[str] = ..., state: _Optional[_Union[SandboxState, str]] = ..., failure_reason: _Optional[str] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., network_policy: _Optional[_Union[NetworkPolicy, _Mapping]] = ..., workdir: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., heartbeat_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., last_heartbeat_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tenant: _Optional[str] = ..., from_snapshot: _Optional[str] = ..., isolation: _Optional[_Union[Isolation, str]] = ...) -> None: ...

class CreateSandboxRequest(_message.Message):
    __slots__ = ("image", "kind", "resources", "env", "labels", "ttl", "heartbeat_timeout", "network_policy", "sandbox_id", "request_id", "workdir", "from_snapshot", "isolation")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POLICY_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    FROM_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    image: str
    kind: SandboxKind
    resources: Resources
    env: _containers.ScalarMap[str, str]
    labels: _containers.ScalarMap[str, str]
    ttl: _duration_pb2.Duration
    heartbeat_timeout: _duration_pb2.Duration
    network_policy: NetworkPolicy
    sandbox_id: str
    request_id: str
    workdir: str
    from_snapshot: str
    isolation: Isolation
    def __init__(self, image: _Optional[str] = ..., kind: _Optional[_Union[SandboxKind, str]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., env: _Optional[_Mapping[str, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., heartbeat_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., network_policy: _Optional[_Union[NetworkPolicy, _Mapping]] = ..., sandbox_id: _Optional[str] = ..., request_id: _Optional[str] = ..., workdir: _Optional[str] = ..., from_snapshot: _Optional[str] = ..., isolation: _Optional[_Union[Isolation, str]] = ...) -> None: ...

class CreateSandboxResponse(_message.Message):
    __slots__ = ("sandbox",)
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class GetSandboxRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class GetSandboxResponse(_message.Message):
    __slots__ = ("sandbox",)
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class ListSandboxesRequest(_message.Message):
    __slots__ = ("label_selector", "page_size", "page_token")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    label_selector: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    def __init__(self, label_selector: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSandboxesResponse(_message.Message):
    __slots__ = ("sandboxes", "next_page_token")
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sandboxes: _containers.RepeatedCompositeFieldContainer[Sandbox]
    next_page_token: str
    def __init__(self, sandboxes: _Optional[_Iterable[_Union[Sandbox, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteSandboxRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class DeleteSandboxResponse(_message.Message):
    __slots__ = ("sandbox",)
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("sandbox",)
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class SetNetworkPolicyRequest(_message.Message):
    __slots__ = ("sandbox_id", "network_policy")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    NETWORK_POLICY_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    network_policy: NetworkPolicy
    def __init__(self, sandbox_id: _Optional[str] = ..., network_policy: _Optional[_Union[NetworkPolicy, _Mapping]] = ...) -> None: ...

class SetNetworkPolicyResponse(_message.Message):
    __slots__ = ("sandbox",)
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    sandbox: Sandbox
    def __init__(self, sandbox: _Optional[_Union[Sandbox, _Mapping]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("name", "snapshot_id", "sandbox_id", "image", "size_bytes", "create_time", "labels", "tenant", "keep")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    name: str
    snapshot_id: str
    sandbox_id: str
    image: str
    size_bytes: int
    create_time: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    tenant: str
    keep: bool
    def __init__(self, name: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., sandbox_id: _Optional[str] = ..., image: _Optional[str] = ..., size_bytes: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., tenant: _Optional[str] = ..., keep: _Optional[bool] = ...) -> None: ...

class SnapshotSandboxRequest(_message.Message):
    __slots__ = ("sandbox_id", "snapshot_id", "labels", "request_id", "keep")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    snapshot_id: str
    labels: _containers.ScalarMap[str, str]
    request_id: str
    keep: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., request_id: _Optional[str] = ..., keep: _Optional[bool] = ...) -> None: ...

class SnapshotSandboxResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: Snapshot
    def __init__(self, snapshot: _Optional[_Union[Snapshot, _Mapping]] = ...) -> None: ...

class GetSnapshotRequest(_message.Message):
    __slots__ = ("snapshot_id",)
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ...) -> None: ...

class GetSnapshotResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: Snapshot
    def __init__(self, snapshot: _Optional[_Union[Snapshot, _Mapping]] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("label_selector", "page_size", "page_token")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    label_selector: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    def __init__(self, label_selector: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots", "next_page_token")
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[Snapshot]
    next_page_token: str
    def __init__(self, snapshots: _Optional[_Iterable[_Union[Snapshot, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteSnapshotRequest(_message.Message):
    __slots__ = ("snapshot_id",)
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ...) -> None: ...

class DeleteSnapshotResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: Snapshot
    def __init__(self, snapshot: _Optional[_Union[Snapshot, _Mapping]] = ...) -> None: ...

class Exec(_message.Message):
    __slots__ = ("name", "exec_id", "sandbox_id", "command", "state", "exit_code", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "stdout_total_bytes", "stderr_total_bytes", "error", "create_time", "start_time", "end_time", "duration", "timeout", "oom_killed", "stdout_partial", "stderr_partial")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXEC_ID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDERR_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    STDERR_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    OOM_KILLED_FIELD_NUMBER: _ClassVar[int]
    STDOUT_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    STDERR_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    exec_id: str
    sandbox_id: str
    command: str
    state: ExecState
    exit_code: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    stdout_total_bytes: int
    stderr_total_bytes: int
    error: str
    create_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    duration: _duration_pb2.Duration
    timeout: _duration_pb2.Duration
    oom_killed: bool
    stdout_partial: bool
    stderr_partial: bool
    def __init__(self, name: _Optional[str] = ..., exec_id: _Optional[str] = ..., sandbox_id: _Optional[str] = ..., command: _Optional[str] = ..., state: _Optional[_Union[ExecState, str]] = ..., exit_code: _Optional[int] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., stdout_truncated: _Optional[bool] = ..., stderr_truncated: _Optional[bool] = ..., stdout_total_bytes: _Optional[int] = ..., stderr_total_bytes: _Optional[int] = ..., error: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., oom_killed: _Optional[bool] = ..., stdout_partial: _Optional[bool] = ..., stderr_partial: _Optional[bool] = ...) -> None: ...

class StartExecRequest(_message.Message):
    __slots__ = ("sandbox_id", "argv", "shell", "cwd", "env", "stdin", "timeout", "login_shell", "max_output_bytes", "wait")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    LOGIN_SHELL_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    argv: ArgvCommand
    shell: str
    cwd: str
    env: _containers.ScalarMap[str, str]
    stdin: bytes
    timeout: _duration_pb2.Duration
    login_shell: bool
    max_output_bytes: int
    wait: _duration_pb2.Duration
    def __init__(self, sandbox_id: _Optional[str] = ..., argv: _Optional[_Union[ArgvCommand, _Mapping]] = ..., shell: _Optional[str] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., stdin: _Optional[bytes] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., login_shell: _Optional[bool] = ..., max_output_bytes: _Optional[int] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ArgvCommand(_message.Message):
    __slots__ = ("args",)
    ARGS_FIELD_NUMBER: _ClassVar[int]
    args: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, args: _Optional[_Iterable[str]] = ...) -> None: ...

class StartExecResponse(_message.Message):
    __slots__ = ("exec",)
    EXEC_FIELD_NUMBER: _ClassVar[int]
    exec: Exec
    def __init__(self, exec: _Optional[_Union[Exec, _Mapping]] = ...) -> None: ...

class GetExecRequest(_message.Message):
    __slots__ = ("exec_id",)
    EXEC_ID_FIELD_NUMBER: _ClassVar[int]
    exec_id: str
    def __init__(self, exec_id: _Optional[str] = ...) -> None: ...

class GetExecResponse(_message.Message):
    __slots__ = ("exec",)
    EXEC_FIELD_NUMBER: _ClassVar[int]
    exec: Exec
    def __init__(self, exec: _Optional[_Union[Exec, _Mapping]] = ...) -> None: ...

class WaitExecRequest(_message.Message):
    __slots__ = ("exec_id", "timeout")
    EXEC_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    exec_id: str
    timeout: _duration_pb2.Duration
    def __init__(self, exec_id: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitExecResponse(_message.Message):
    __slots__ = ("exec", "done")
    EXEC_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    exec: Exec
    done: bool
    def __init__(self, exec: _Optional[_Union[Exec, _Mapping]] = ..., done: _Optional[bool] = ...) -> None: ...

class StreamExecRequest(_message.Message):
    __slots__ = ("exec_id",)
    EXEC_ID_FIELD_NUMBER: _ClassVar[int]
    exec_id: str
    def __init__(self, exec_id: _Optional[str] = ...) -> None: ...

class StreamExecResponse(_message.Message):
    __slots__ = ("stdout", "stderr", "exit")
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    stdout: bytes
    stderr: bytes
    exit: Exec
    def __init__(self, stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., exit: _Optional[_Union[Exec, _Mapping]] = ...) -> None: ...

class ReadExecOutputRequest(_message.Message):
    __slots__ = ("exec_id", "stream", "offset", "limit")
    EXEC_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    exec_id: str
    stream: OutputStream
    offset: int
    limit: int
    def __init__(self, exec_id: _Optional[str] = ..., stream: _Optional[_Union[OutputStream, str]] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ReadExecOutputResponse(_message.Message):
    __slots__ = ("data", "kept_bytes", "eof")
    DATA_FIELD_NUMBER: _ClassVar[int]
    KEPT_BYTES_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    kept_bytes: int
    eof: bool
    def __init__(self, data: _Optional[bytes] = ..., kept_bytes: _Optional[int] = ..., eof: _Optional[bool] = ...) -> None: ...

class CancelExecRequest(_message.Message):
    __slots__ = ("exec_id",)
    EXEC_ID_FIELD_NUMBER: _ClassVar[int]
    exec_id: str
    def __init__(self, exec_id: _Optional[str] = ...) -> None: ...

class CancelExecResponse(_message.Message):
    __slots__ = ("exec",)
    EXEC_FIELD_NUMBER: _ClassVar[int]
    exec: Exec
    def __init__(self, exec: _Optional[_Union[Exec, _Mapping]] = ...) -> None: ...

class ApplyPatchRequest(_message.Message):
    __slots__ = ("sandbox_id", "patch", "cwd", "timeout")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    patch: str
    cwd: str
    timeout: _duration_pb2.Duration
    def __init__(self, sandbox_id: _Optional[str] = ..., patch: _Optional[str] = ..., cwd: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ApplyPatchResponse(_message.Message):
    __slots__ = ("files", "output")
    FILES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedScalarFieldContainer[str]
    output: str
    def __init__(self, files: _Optional[_Iterable[str]] = ..., output: _Optional[str] = ...) -> None: ...

class FileHeader(_message.Message):
    __slots__ = ("sandbox_id", "path", "mode")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    mode: int
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ..., mode: _Optional[int] = ...) -> None: ...

class UploadFileRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: FileHeader
    chunk: bytes
    def __init__(self, header: _Optional[_Union[FileHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class UploadFileResponse(_message.Message):
    __slots__ = ("path", "size_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class DownloadFileRequest(_message.Message):
    __slots__ = ("sandbox_id", "path")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class DownloadFileResponse(_message.Message):
    __slots__ = ("info", "chunk")
    INFO_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    info: FileInfo
    chunk: bytes
    def __init__(self, info: _Optional[_Union[FileInfo, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ("name", "path", "type", "size_bytes", "mode", "modify_time")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MODIFY_TIME_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    type: FileType
    size_bytes: int
    mode: int
    modify_time: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., type: _Optional[_Union[FileType, str]] = ..., size_bytes: _Optional[int] = ..., mode: _Optional[int] = ..., modify_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListFilesRequest(_message.Message):
    __slots__ = ("sandbox_id", "path")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    path: str
    def __init__(self, sandbox_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ListFilesResponse(_message.Message):
    __slots__ = ("path", "files")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    path: str
    files: _containers.RepeatedCompositeFieldContainer[FileInfo]
    def __init__(self, path: _Optional[str] = ..., files: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ...) -> None: ...

class PtyStart(_message.Message):
    __slots__ = ("sandbox_id", "argv", "rows", "cols", "cwd", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    rows: int
    cols: int
    cwd: str
    env: _containers.ScalarMap[str, str]
    def __init__(self, sandbox_id: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PtyResize(_message.Message):
    __slots__ = ("rows", "cols")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    cols: int
    def __init__(self, rows: _Optional[int] = ..., cols: _Optional[int] = ...) -> None: ...

class OpenPtyRequest(_message.Message):
    __slots__ = ("start", "input", "resize")
    START_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    RESIZE_FIELD_NUMBER: _ClassVar[int]
    start: PtyStart
    input: bytes
    resize: PtyResize
    def __init__(self, start: _Optional[_Union[PtyStart, _Mapping]] = ..., input: _Optional[bytes] = ..., resize: _Optional[_Union[PtyResize, _Mapping]] = ...) -> None: ...

class OpenPtyResponse(_message.Message):
    __slots__ = ("output", "exit_code")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    output: bytes
    exit_code: int
    def __init__(self, output: _Optional[bytes] = ..., exit_code: _Optional[int] = ...) -> None: ...

class ScreenshotRequest(_message.Message):
    __slots__ = ("sandbox_id", "full_page")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    FULL_PAGE_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    full_page: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., full_page: _Optional[bool] = ...) -> None: ...

class ScreenshotResponse(_message.Message):
    __slots__ = ("png", "width", "height", "url", "title")
    PNG_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    png: bytes
    width: int
    height: int
    url: str
    title: str
    def __init__(self, png: _Optional[bytes] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., url: _Optional[str] = ..., title: _Optional[str] = ...) -> None: ...

class ActRequest(_message.Message):
    __slots__ = ("sandbox_id", "action", "x", "y", "selector", "text", "key", "delta_x", "delta_y", "url", "timeout", "screenshot")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    DELTA_X_FIELD_NUMBER: _ClassVar[int]
    DELTA_Y_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    SCREENSHOT_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    action: ActionType
    x: float
    y: float
    selector: str
    text: str
    key: str
    delta_x: float
    delta_y: float
    url: str
    timeout: _duration_pb2.Duration
    screenshot: bool
    def __init__(self, sandbox_id: _Optional[str] = ..., action: _Optional[_Union[ActionType, str]] = ..., x: _Optional[float] = ..., y: _Optional[float] = ..., selector: _Optional[str] = ..., text: _Optional[str] = ..., key: _Optional[str] = ..., delta_x: _Optional[float] = ..., delta_y: _Optional[float] = ..., url: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., screenshot: _Optional[bool] = ...) -> None: ...

class ActResponse(_message.Message):
    __slots__ = ("url", "title", "png")
    URL_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    PNG_FIELD_NUMBER: _ClassVar[int]
    url: str
    title: str
    png: bytes
    def __init__(self, url: _Optional[str] = ..., title: _Optional[str] = ..., png: _Optional[bytes] = ...) -> None: ...

class GetPageContentRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class GetPageContentResponse(_message.Message):
    __slots__ = ("url", "title", "accessibility_tree", "text")
    URL_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    ACCESSIBILITY_TREE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    url: str
    title: str
    accessibility_tree: str
    text: str
    def __init__(self, url: _Optional[str] = ..., title: _Optional[str] = ..., accessibility_tree: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class ImageRecipe(_message.Message):
    __slots__ = ("suite", "packages", "pip", "description")
    SUITE_FIELD_NUMBER: _ClassVar[int]
    PACKAGES_FIELD_NUMBER: _ClassVar[int]
    PIP_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    suite: str
    packages: _containers.RepeatedScalarFieldContainer[str]
    pip: _containers.RepeatedScalarFieldContainer[str]
    description: str
    def __init__(self, suite: _Optional[str] = ..., packages: _Optional[_Iterable[str]] = ..., pip: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ...) -> None: ...

class BuildImageRequest(_message.Message):
    __slots__ = ("name", "recipe", "force")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    recipe: ImageRecipe
    force: bool
    def __init__(self, name: _Optional[str] = ..., recipe: _Optional[_Union[ImageRecipe, _Mapping]] = ..., force: _Optional[bool] = ...) -> None: ...

class ImageBuildProgress(_message.Message):
    __slots__ = ("stage", "done", "total", "message")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    stage: str
    done: int
    total: int
    message: str
    def __init__(self, stage: _Optional[str] = ..., done: _Optional[int] = ..., total: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class SandboxImage(_message.Message):
    __slots__ = ("name", "size_bytes", "build_time", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUILD_TIME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    size_bytes: int
    build_time: _timestamp_pb2.Timestamp
    description: str
    def __init__(self, name: _Optional[str] = ..., size_bytes: _Optional[int] = ..., build_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., description: _Optional[str] = ...) -> None: ...

class BuildImageResponse(_message.Message):
    __slots__ = ("progress", "image")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    progress: ImageBuildProgress
    image: SandboxImage
    def __init__(self, progress: _Optional[_Union[ImageBuildProgress, _Mapping]] = ..., image: _Optional[_Union[SandboxImage, _Mapping]] = ...) -> None: ...

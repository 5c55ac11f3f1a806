"""The proto contracts: buf lint and format are clean, the committed stubs are fresh, and every service imports with
its RPCs."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import shutil
import subprocess
import sys
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = pathlib.Path(__file__).resolve().parents[2]

SERVICES: dict[str, tuple[str, str, list[str]]] = {
    "env": (
        "orchard.env.v1.env_pb2",
        "EnvService",
        [
            "CreateSandbox",
            "GetSandbox",
            "ListSandboxes",
            "DeleteSandbox",
            "Heartbeat",
            "SetNetworkPolicy",
            "SnapshotSandbox",
            "GetSnapshot",
            "ListSnapshots",
            "DeleteSnapshot",
            "StartExec",
            "GetExec",
            "WaitExec",
            "StreamExec",
            "ReadExecOutput",
            "CancelExec",
            "ApplyPatch",
            "UploadFile",
            "DownloadFile",
            "ListFiles",
            "OpenPty",
            "Screenshot",
            "Act",
            "GetPageContent",
            "BuildImage",
        ],
    ),
    "inference": (
        "orchard.inference.v1.inference_pb2",
        "InferenceService",
        [
            "Chat",
            "StreamChat",
            "Generate",
            "StreamGenerate",
            "ScoreTokens",
            "Tokenize",
            "ApplyChatTemplate",
            "ListModels",
            "UpdateWeights",
        ],
    ),
    "reward": (
        "orchard.reward.v1.reward_pb2",
        "RewardService",
        [
            "ComputeOutcomeReward",
            "JudgeTrajectory",
            "BatchJudgeTrajectories",
            "ComputeTeacherLogprobs",
            "BatchComputeTeacherLogprobs",
        ],
    ),
    "value": ("orchard.value.v1.value_pb2", "ValueService", ["Score", "Rerank", "LoadModel", "GetModel"]),
    "trainer": (
        "orchard.trainer.v1.trainer_pb2",
        "TrainerService",
        ["CreateJob", "GetJob", "ListJobs", "CancelJob", "WaitJob", "StreamJobEvents", "ListCheckpoints"],
    ),
    "experience": (
        "orchard.experience.v1.experience_pb2",
        "ExperienceService",
        ["GetTrajectory", "ListTrajectories", "QueryStats", "ExportTrajectories", "ExportDataset", "ListRuns"],
    ),
}


def buf_binary() -> str:
    """Return the buf executable of the dev extra (buf-bin), next to this interpreter or on PATH."""
    beside = pathlib.Path(sys.executable).parent / "buf"
    found = str(beside) if beside.exists() else shutil.which("buf")
    if found is None:
        pytest.skip("buf not found: install the dev extra (pip install -e '.[dev]'), which ships buf-bin")
    return found


def run_buf(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run buf with args in cwd and capture its output."""
    return subprocess.run([buf_binary(), *args], cwd=cwd, capture_output=True, text=True, timeout=20)


def copy_module(tmp_path: pathlib.Path, lint_use: list[str]) -> pathlib.Path:
    """Copy protos/ into tmp_path with a buf.yaml using the given lint categories; return the copy's root."""
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    rules = "\n".join(f"    - {rule}" for rule in lint_use)
    (tmp_path / "buf.yaml").write_text(f"version: v2\nmodules:\n  - path: protos\nlint:\n  use:\n{rules}\n")
    return tmp_path


def load_gen_protos() -> ModuleType:
    """Load scripts/gen_protos.py by path (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_buf_lint_is_clean() -> None:
    """Every proto passes buf's STANDARD lint rules (buf.yaml at the repository root)."""
    result = run_buf("lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_format_is_clean() -> None:
    """Every proto is formatted as `buf format` writes it."""
    result = run_buf("format", "-d", "--exit-code")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_element_is_commented(tmp_path: pathlib.Path) -> None:
    """Every service, rpc, message, field, oneof and enum value has a comment (buf's COMMENTS rules)."""
    result = run_buf("lint", cwd=copy_module(tmp_path, ["STANDARD", "COMMENTS"]))
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_stubs_are_fresh() -> None:
    """The committed stubs under libs/ match a fresh generation (run scripts/gen_protos.py when this fails)."""
    assert load_gen_protos().check() == []


def test_generated_folders_hold_only_generated_files() -> None:
    """Generated stubs stay apart from hand-written code: a `<service>/v1/` folder under libs/orchard holds the stubs
    of its proto and an empty `__init__.py`, nothing else (a domain's own modules live beside the folder)."""
    gen = load_gen_protos()
    generated = set(gen.generated_paths(gen.OUT))
    folders = {pathlib.Path(rel).parent for rel in generated}
    strays = [
        str(path.relative_to(gen.OUT))
        for folder in folders
        for path in sorted((gen.OUT / folder).iterdir())
        if path.name != "__pycache__"
        and str(path.relative_to(gen.OUT)) not in generated
        and not (path.name == "__init__.py" and not path.read_text().strip())
    ]
    assert folders and strays == []


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_service_has_its_rpcs(service: str) -> None:
    """Each service's generated module imports and its descriptor lists exactly the expected RPCs."""
    module_name, service_name, rpcs = SERVICES[service]
    module = importlib.import_module(module_name)
    importlib.import_module(module_name + "_grpc")
    descriptor = module.DESCRIPTOR.services_by_name[service_name]
    assert [method.name for method in descriptor.methods] == rpcs


def test_shared_types_import() -> None:
    """The shared types import as orchard.types.v1 and round-trip through the wire format."""
    from orchard.types.v1 import types_pb2

    reward = types_pb2.Reward(
        kind=types_pb2.REWARD_KIND_RPR,
        value=1.35,
        judge=types_pb2.JudgeDetails(judge_score=0.7, alpha=0.5, outcome_reward=1.0),
    )
    trajectory = types_pb2.Trajectory(
        trajectory_id="t-1",
        run_id="r-1",
        steps=[types_pb2.Step(index=0, tokens=types_pb2.TokenSpan(token_ids=[5, 6, 7], mask=[1, 1, 0]))],
        rewards=[reward],
    )
    parsed = types_pb2.Trajectory.FromString(trajectory.SerializeToString())
    assert parsed == trajectory
    assert parsed.rewards[0].WhichOneof("details") == "judge"


@pytest.mark.parametrize(
    ("module_name", "unary", "streaming"),
    [
        ("orchard.inference.v1.inference_pb2", "ChatRequest", "StreamChatRequest"),
        ("orchard.inference.v1.inference_pb2", "GenerateRequest", "StreamGenerateRequest"),
    ],
)
def test_stream_requests_match_unary_requests(module_name: str, unary: str, streaming: str) -> None:
    """A streaming RPC's request has exactly the fields (names, numbers, types) of its unary twin."""
    messages = importlib.import_module(module_name).DESCRIPTOR.message_types_by_name

    def shape(name: str) -> list[tuple[str, int, int, str]]:
        fields = messages[name].fields
        return [(f.name, f.number, f.type, f.message_type.name if f.message_type else "") for f in fields]

    assert shape(unary) == shape(streaming)


def test_lint_catches_a_bad_proto(tmp_path: pathlib.Path) -> None:
    """buf lint fails on a proto whose enum lacks an _UNSPECIFIED zero value, so the clean result means something."""
    root = copy_module(tmp_path, ["STANDARD"])
    bad = root / "protos" / "orchard" / "bad" / "v1" / "bad.proto"
    bad.parent.mkdir(parents=True)
    bad.write_text('syntax = "proto3";\n\npackage orchard.bad.v1;\n\nenum Color {\n  RED = 0;\n  GREEN = 1;\n}\n')
    result = run_buf("lint", cwd=root)
    assert result.returncode != 0
    assert "_UNSPECIFIED" in result.stdout + result.stderr

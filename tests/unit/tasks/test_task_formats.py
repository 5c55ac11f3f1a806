"""Task files in the formats users hold on disk: SWE-bench and SWE-Gym (JSON, JSON lines, Parquet, list fields
as JSON text), SWE-smith (a per-repository image_name) and SWE-rebench (an install_config), and spec files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.errors import InvalidArgument, NotFound
from orchard.tasks import load_instances
from orchard.tasks.envspec import EnvSpec, EnvSpecs

SWE_BENCH = {  # a row as SWE-bench's dataset exports it (list fields are JSON text)
    "repo": "pallets/click",
    "instance_id": "pallets__click-1234",
    "base_commit": "a" * 40,
    "patch": "diff --git a/x b/x\n",
    "test_patch": "diff --git a/t b/t\n",
    "problem_statement": "Bug.",
    "hints_text": "",
    "created_at": "2023-01-01T00:00:00Z",
    "version": "8.1",
    "FAIL_TO_PASS": '["tests/test_a.py::test_one"]',
    "PASS_TO_PASS": '["tests/test_a.py::test_two"]',
    "environment_setup_commit": "b" * 40,
}


def test_swe_bench_json_jsonl_and_parquet_read_alike(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "a.json").write_text(json.dumps([SWE_BENCH]))
    (tmp_path / "a.jsonl").write_text(json.dumps(SWE_BENCH) + "\n")
    pq.write_table(pa.Table.from_pylist([SWE_BENCH]), tmp_path / "a.parquet")
    loaded = [load_instances(tmp_path / name)[0] for name in ("a.json", "a.jsonl", "a.parquet")]
    assert loaded[0] == loaded[1] == loaded[2]
    assert loaded[0].fail_to_pass == ["tests/test_a.py::test_one"] and loaded[0].version == "8.1"


def test_swe_gym_rows_are_swe_bench_rows(tmp_path: Path) -> None:
    gym = {
        **SWE_BENCH,
        "instance_id": "getmoto__moto-1",
        "repo": "getmoto/moto",
        "FAIL_TO_PASS": ["tests/test_s3.py::test_x"],
        "PASS_TO_PASS": [],
    }
    (tmp_path / "gym.jsonl").write_text(json.dumps(gym) + "\n")
    [instance] = load_instances(tmp_path / "gym.jsonl")
    assert instance.repo == "getmoto/moto" and instance.pass_to_pass == []


def test_swe_smith_image_name_and_swe_rebench_install_config(tmp_path: Path) -> None:
    smith = {**SWE_BENCH, "instance_id": "s1", "image_name": "swesmith.x86_64.pallets__click.fde47b4b"}
    rebench = {
        **SWE_BENCH,
        "instance_id": "r1",
        "install_config": json.dumps(
            {
                "python": "3.9",
                "packages": "less",
                "pip_packages": ["pytest==8.3.4"],
                "install": "pip install -e .",
                "test_cmd": "pytest -rA",
                "reqs_path": ["requirements.txt"],
            }
        ),
    }
    (tmp_path / "mix.jsonl").write_text(json.dumps(smith) + "\n" + json.dumps(rebench) + "\n")
    s, r = load_instances(tmp_path / "mix.jsonl")
    assert s.image == "swesmith.x86_64.pallets__click.fde47b4b" and s.environment is None
    assert r.environment == EnvSpec(
        python="3.9", packages=("less",), pip_packages=("pytest==8.3.4",), test_cmd="pytest -rA"
    )
    assert r.command == "pytest -rA" and r.environment.image.startswith("env-py3.9-")


def test_specs_files_by_repo_and_by_version(tmp_path: Path) -> None:
    specs = tmp_path / "specs.json"
    specs.write_text(
        json.dumps(
            {
                "pallets/click": {"8.1": {"python": "3.11", "pip_packages": ["pytest"]}, "8.0": {"python": "3.9"}},
                "other/repo": {"python": "3.13", "install": ""},
            }
        )
    )
    (tmp_path / "t.jsonl").write_text(
        json.dumps(SWE_BENCH) + "\n" + json.dumps({**SWE_BENCH, "instance_id": "o1", "repo": "other/repo"}) + "\n"
    )
    click, other = load_instances(tmp_path / "t.jsonl", env_specs=specs)
    assert click.environment is not None and click.environment.python == "3.11"
    assert other.environment is not None and other.environment.image == "python:3.13-slim"
    assert other.environment.install == "pip install -e ."  # an empty install is the default one
    assert EnvSpecs.load(specs).get("nobody/here", "1") is None
    with pytest.raises(NotFound, match="no spec for pallets/click version '7.0'"):
        EnvSpecs.load(specs).get("pallets/click", "7.0")


@pytest.mark.parametrize(
    ("specs", "needle"),
    [
        ({"r/x": {"python": "3.10"}}, "python 3.10 is not available"),
        ({"r/x": {"1": {"pip_packages": 5}}}, "pip_packages"),
        ([1, 2], "JSON object keyed by repo"),
    ],
)
def test_bad_specs_are_refused_naming_the_entry(tmp_path: Path, specs: object, needle: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(specs))
    with pytest.raises(InvalidArgument, match=needle):
        EnvSpecs.load(path)


def test_the_venv_always_has_a_pytest_and_keys_follow_content() -> None:
    bare = EnvSpec()
    assert bare.venv_requirements == ("pytest",)  # else the image's pytest would test the image's packages
    assert EnvSpec(pip_packages=("pytest==8.3.4",)).venv_requirements == ("pytest==8.3.4",)
    assert EnvSpec(packages=("less",)).image == EnvSpec(packages=("less",), pip_packages=("x",)).image
    assert EnvSpec(pip_packages=("a",)).key() != EnvSpec(pip_packages=("b",)).key()
    assert EnvSpec(packages=("less",)).image_packages[:2] == ("python3", "python-is-python3")

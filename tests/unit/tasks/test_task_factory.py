"""The task factory's pieces that need no sandbox: which base tests count, the statement and its leak check, the
repository copy and the tasks' commits (parentless, the same hashes every time), and which candidates are tried."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchard.errors import InvalidArgument
from orchard.tasks.envspec import EnvSpec
from orchard.tasks.factory import source as sources
from orchard.tasks.factory import statements
from orchard.tasks.factory.synthesize import Options, Synthesizer, classify_base, is_source_file, is_test_file


def log(**statuses: str) -> str:
    return "".join(f"{status} tests/test_m.py::{name}\n" for name, status in statuses.items())


def test_only_tests_that_pass_in_every_base_run_are_graded() -> None:
    stable, figures = classify_base(
        [log(a="PASSED", b="PASSED", c="FAILED", d="XFAIL"), log(a="PASSED", b="FAILED", c="FAILED", d="XFAIL")]
    )
    assert stable == {"tests/test_m.py::a", "tests/test_m.py::d"}
    assert figures == {"stable": 2, "flaky": ["tests/test_m.py::b"], "failing": 1}


PYTEST_LOG = """\
=================================== FAILURES ===================================
__________________________________ test_take ___________________________________

    def test_take():
>       assert list(take(2, [1, 2, 3])) == [1, 2]
E       assert [1] == [1, 2]
E         Right contains one more item: 2

toolz/itertoolz.py:12: in take
>       return itertools.islice(seq, n - 1)
E       TypeError: bad <function f at 0x7f3a2b1c0d90>
__________________________________ test_other __________________________________
E       assert 3 == 4
=========================== short test summary info ============================
FAILED tests/test_m.py::test_take - assert [1] == [1, 2]
"""


def test_statement_names_the_failing_tests_and_their_errors_never_the_change() -> None:
    changed = ("return itertools.islice(seq, n)", "return itertools.islice(seq, n - 1)")
    text = statements.template("toolz", ["tests/test_m.py::test_take"], PYTEST_LOG, changed)
    assert "`tests/test_m.py::test_take`" in text and "1 test in `tests/test_m.py` fails" in text
    assert "assert [1] == [1, 2]" in text and "Right contains one more item: 2" in text
    assert "0x..." in text and "0x7f3a" not in text  # the same statement every run
    assert "assert 3 == 4" not in text  # another test's error
    assert not statements.leaks(text, changed) and "islice" not in text
    quoting = PYTEST_LOG.replace("E       assert [1] == [1, 2]", "E       assert itertools.islice(seq, n - 1)")
    assert "islice" not in statements.template("toolz", ["tests/test_m.py::test_take"], quoting, changed)
    with pytest.raises(ValueError, match="quote"):  # a test named after the changed line: no such task
        statements.template("toolz", ["tests/test_m.py::test_x[return itertools.islice(seq, n)]"], "", changed)


def test_file_roles() -> None:
    assert is_test_file("toolz/tests/test_itertoolz.py") and is_test_file("pkg/util_test.py")
    assert is_source_file("toolz/itertoolz.py") and is_source_file("src/pkg/core.py")
    for path in ("setup.py", "docs/conf.py", "tests/helpers.py", "pkg/conftest.py", "pkg/_version.py", "a.txt"):
        assert not is_source_file(path), path


def make_repo(root: Path) -> Path:
    repo = root / "calc"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef unnamed_in_tests(x):\n    return x * 2\n"
    )
    (repo / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    env = ["-c", "user.name=me", "-c", "user.email=me@example.com"]
    subprocess.run(["git", "-C", str(repo), *env, "commit", "-q", "-m", "base"], check=True)
    return repo


def test_task_commits_are_parentless_reproducible_and_never_touch_the_users_repository(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    before = subprocess.run(["git", "-C", str(repo), "show-ref"], capture_output=True, text=True).stdout
    source = sources.from_repo(repo, tmp_path / "out")
    assert source.repo_dir != repo and source.name == "calc"
    buggy = sources.read_at(source, "calc/__init__.py").replace("a + b", "a - b")
    commit, patch = sources.task_commit(source, "calc-add-1", "calc/__init__.py", buggy)
    again = sources.from_repo(repo, tmp_path / "elsewhere")
    assert sources.task_commit(again, "calc-add-1", "calc/__init__.py", buggy) == (commit, patch)
    parents = sources.git(source.repo_dir, "rev-list", "--parents", "-n", "1", commit).split()
    assert parents == [commit]  # no parent: `git log` shows nothing of the fix
    assert sources.git(source.repo_dir, "show", f"{commit}:calc/__init__.py") == buggy
    assert "-    return a - b\n+    return a + b" in patch and patch.startswith("diff --git a/calc/__init__.py")
    assert sources.git(source.repo_dir, "rev-parse", f"{sources.TASK_REFS}/calc-add-1").strip() == commit
    assert subprocess.run(["git", "-C", str(repo), "show-ref"], capture_output=True, text=True).stdout == before
    assert sources.git(source.repo_dir, "status", "--porcelain") == ""  # the copy's work tree is untouched too


def test_bad_sources_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="NAME==VERSION"):
        sources.from_sdist("toolz>=1", tmp_path)
    (tmp_path / "plain").mkdir()
    with pytest.raises(InvalidArgument, match="not a git repository"):
        sources.from_repo(tmp_path / "plain", tmp_path / "out")


def test_candidates_are_scoped_to_the_test_files_that_name_the_function(tmp_path: Path) -> None:
    source = sources.from_repo(make_repo(tmp_path), tmp_path / "out")
    synthesizer = Synthesizer(None, source, EnvSpec(), Options(seed=3))  # type: ignore[arg-type]  # no service used
    files = sources.files_at(source)
    candidates = synthesizer.candidates(files, set())
    assert candidates and {c.mutation.function for c in candidates} == {"add"}
    assert all(c.test_files == ("tests/test_calc.py",) for c in candidates)
    assert synthesizer.discarded["no test file names the function"] >= 2  # unnamed_in_tests' bugs
    assert [c.index for c in candidates] == list(range(len(candidates)))
    same = Synthesizer(None, source, EnvSpec(), Options(seed=3)).candidates(files, set())  # type: ignore[arg-type]
    assert [c.mutation.key for c in same] == [c.mutation.key for c in candidates]
    fenced = Synthesizer(None, source, EnvSpec(), Options()).candidates(files, {("calc/__init__.py", "add")})  # type: ignore[arg-type]
    assert fenced == []

"""The value servicer's request handling without a model: which candidates Rerank excludes and why, how bad
candidate lists are refused (naming the field), what text a candidate renders to, and the settings' bounds."""

from __future__ import annotations

import pytest

from orchard.errors import InvalidArgument
from orchard.runtime.settings import SettingsError, load_settings
from orchard.services.value.servicer import (
    check_candidates,
    exclusion_reason,
    render_all,
)
from orchard.services.value.settings import ValueSettings
from orchard.types.v1 import types_pb2 as tpb
from orchard.value.render import render_candidate
from orchard.value.v1 import value_pb2 as pb

PATCH = "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"


@pytest.mark.parametrize(
    ("candidate", "reason"),
    [
        (pb.Candidate(patch=PATCH), ""),
        (pb.Candidate(trajectory=tpb.Trajectory(final_patch=PATCH)), ""),
        (
            pb.Candidate(
                patch=PATCH,
                checks=pb.CandidateChecks(patch_applies=True, repro_tests_pass=True, regression_tests_pass=True),
            ),
            "",
        ),
        (pb.Candidate(), "the patch is empty (nothing was submitted)"),
        (pb.Candidate(patch=" \n\n"), "the patch is empty (nothing was submitted)"),
        (pb.Candidate(patch=PATCH, checks=pb.CandidateChecks(patch_applies=False)), "the patch does not apply"),
        (pb.Candidate(patch=PATCH, checks=pb.CandidateChecks(repro_tests_pass=False)), "the reproduction tests fail"),
        (pb.Candidate(patch=PATCH, checks=pb.CandidateChecks(regression_tests_pass=False)), "regression tests fail"),
        (
            pb.Candidate(checks=pb.CandidateChecks(patch_applies=False, regression_tests_pass=False)),
            "the patch is empty (nothing was submitted); the patch does not apply; regression tests fail",
        ),
    ],
)
def test_exclusion_reasons(candidate: pb.Candidate, reason: str) -> None:
    assert exclusion_reason(candidate) == reason


@pytest.mark.parametrize(
    ("ids", "field", "message"),
    [
        ([], "candidates", "candidates is empty"),
        (["a", "b", "c", "d"], "candidates", "4 candidates exceed the limit of 3"),
        (["a", ""], "candidates[1].candidate_id", r"candidates\[1\].candidate_id is empty"),
        (["a", "b", "b"], "candidates[2].candidate_id", r"'b' is given twice \(candidates\[1\] and candidates\[2\]\)"),
    ],
)
def test_bad_candidate_lists(ids: list[str], field: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as caught:
        check_candidates([pb.Candidate(candidate_id=i) for i in ids], limit=3)
    assert caught.value.field == field


def test_render_takes_the_task_from_the_candidate_the_request_or_the_trajectory() -> None:
    asked = tpb.Trajectory(messages=[tpb.Message(role=tpb.ROLE_USER, content="Fix x.")], final_patch=PATCH)
    own, shared = render_all(
        [(0, pb.Candidate(problem_statement="Own task.", trajectory=asked)), (1, pb.Candidate(trajectory=asked))],
        "Shared task.",
        10_000,
    )
    (from_trajectory,) = render_all([(0, pb.Candidate(trajectory=asked))], "", 10_000)
    assert own == render_candidate(asked, problem="Own task.")
    assert shared == render_candidate(asked, problem="Shared task.")
    assert from_trajectory == render_candidate(asked) and "Fix x." in from_trajectory and "x = 2" in from_trajectory
    with pytest.raises(InvalidArgument, match="no task statement") as caught:
        render_all([(5, pb.Candidate(patch=PATCH))], "", 10_000)
    assert caught.value.field == "candidates[5].problem_statement"
    with pytest.raises(InvalidArgument, match="over the limit of 50") as caught:
        render_all([(0, pb.Candidate(problem_statement="Own task.", patch=PATCH))], "", 50)
    assert caught.value.field == "candidates[0].trajectory"


def test_settings_defaults_and_bounds() -> None:
    settings = load_settings(ValueSettings, [])
    assert (settings.port, settings.checkpoint, settings.max_batch, settings.max_candidates) == (50057, None, 32, 256)
    with pytest.raises(SettingsError, match="max_queued_candidates"):
        load_settings(ValueSettings, ["--max-candidates", "100", "--max-queued-candidates", "10"])
    with pytest.raises(SettingsError, match="ORCHARD_VALUE_MAX_BATCH"):
        load_settings(ValueSettings, ["--max-batch", "0"])

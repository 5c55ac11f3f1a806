"""The best-of-N figures every part shares (the job, the service, `orchard eval --best-of`, the toy): patch
normalisation and clusters, the ranking rule, AUC, ECE and the best@N / random@N / pass@N definitions."""

from __future__ import annotations

from typing import cast

import pytest

from orchard.value import metrics as vm

PATCH = (
    "diff --git a/x.py b/x.py\nindex 1a2b3c4..5d6e7f8 100644\n--- a/x.py\n+++ b/x.py\n"
    "@@ -10,2 +10,2 @@ def f():\n-    return 1\n+    return 2   \n\n"
)


def test_normalised_patches_ignore_index_lines_line_numbers_and_trailing_space() -> None:
    moved = (
        PATCH.replace("index 1a2b3c4..5d6e7f8 100644", "index 9999999..0000000 100644")
        .replace("@@ -10,2 +10,2 @@", "@@ -12,2 +12,2 @@")
        .replace("return 2   ", "return 2")
    )
    assert vm.cluster_id(moved) == vm.cluster_id(PATCH) != ""
    assert vm.cluster_id(PATCH.replace("return 2", "return 3")) != vm.cluster_id(PATCH)
    assert vm.cluster_id("") == vm.cluster_id(" \n") == ""


def test_rank_puts_exclusions_last_then_score_then_cluster_size() -> None:
    other = PATCH.replace("return 2", "return 3")
    ranked = vm.rank([0.5, 0.9, 0.5, 0.5, 0.99], [other, PATCH, PATCH, PATCH, ""], [False, True, False, False, False])
    # 4: empty patch (excluded whatever its score); 1: a failed check; ties 0/2/3 -> the larger cluster first.
    assert [r.index for r in ranked] == [2, 3, 0, 4, 1]
    assert [r.cluster_size for r in ranked] == [3, 3, 1, 1, 3]
    assert [r.excluded for r in ranked] == [False, False, False, True, True]


def test_auc_and_ece() -> None:
    assert vm.auc([0.9, 0.8, 0.1], [True, False, False]) == 1.0
    assert vm.auc([0.5, 0.5], [True, False]) == 0.5  # a tie counts half
    assert vm.auc([0.1, 0.9], [True, False]) == 0.0
    assert vm.auc([0.3], [True]) is None
    assert vm.ece([1.0, 0.0], [True, False]) == 0.0
    assert vm.ece([0.75] * 4, [True, True, False, False]) == pytest.approx(0.25)
    assert vm.ece([], []) is None


def test_best_random_and_pass_at_n() -> None:
    cands = [
        vm.Candidate("a", 0.2, False, "p1"),
        vm.Candidate("a", 0.9, True, "p2"),
        vm.Candidate("a", 0.1, False, "p3"),
        vm.Candidate("a", 0.3, False, "p4"),
        vm.Candidate("b", 0.8, False, "q1"),
        vm.Candidate("b", 0.4, True, "q2"),
    ]
    assert vm.best_at_n(cands, 1) == 0.0  # each task's first candidate is unresolved
    assert vm.best_at_n(cands, 2) == 0.5  # a picks its resolved second; b picks its wrong first
    assert vm.random_at_n(cands, 2) == pytest.approx((0.5 + 0.5) / 2)
    assert vm.pass_at_n(cands, 2) == 1.0
    assert vm.random_at_n(cands, 4) == pytest.approx((0.25 + 0.5) / 2)  # b has only 2
    report = vm.best_of_n_report(cands, (1, 2, 4, 8))
    assert [row["n"] for row in cast(list[dict[str, object]], report["curve"])] == [1, 2, 4]  # no task has 8
    assert report["pass@1"] == pytest.approx(2 / 6) and report["auc"] == pytest.approx(7 / 8)
    table = vm.format_best_of_n(report)
    assert "  2      50.0%      50.0%     100.0%" in table and "AUC 0.875" in table


def test_an_excluded_or_empty_candidate_is_not_picked_over_a_scored_one() -> None:
    cands = [
        vm.Candidate("a", 0.99, True, ""),
        vm.Candidate("a", 0.98, True, "p", excluded=True),
        vm.Candidate("a", 0.1, False, "q"),
    ]
    assert vm.best_of(cands).patch == "q"


def test_auc_and_ece_leave_excluded_candidates_out() -> None:
    # The excluded candidate's placeholder score (0) would otherwise count as a perfectly ranked negative.
    cands = [
        vm.Candidate("a", 0.9, False, "p"),
        vm.Candidate("a", 0.6, True, "q"),
        vm.Candidate("a", 0.0, False, "", excluded=True),
    ]
    report = vm.best_of_n_report(cands, (1, 2))
    assert report["auc"] == 0.0  # counting the excluded one would give 0.5
    assert report["ece"] == pytest.approx(vm.ece([0.9, 0.6], [False, True]))
    assert report["candidates"] == 3


def test_scores_within_the_tie_margin_go_to_the_larger_patch_cluster() -> None:
    """Each place goes to the largest cluster among the scores within the margin of the best remaining one, so a
    near-tie takes the majority patch and a clear lead does not; margin 0 ranks by score alone."""
    other, third = PATCH.replace("return 2", "return 3"), PATCH.replace("return 2", "return 4")
    scores = [0.99, 0.96, 0.95, 0.90, 0.2]
    patches = [other, PATCH, PATCH, third, PATCH]
    assert [r.index for r in vm.rank(scores, patches, tie_margin=0.0)] == [0, 1, 2, 3, 4]
    # 0.96 and 0.95 are within 0.05 of 0.99: the 3-candidate cluster first, its best score leading; 0.2 is not near.
    assert [r.index for r in vm.rank(scores, patches, tie_margin=0.05)] == [1, 2, 0, 3, 4]
    assert [r.index for r in vm.rank(scores, patches, tie_margin=1.0)] == [1, 2, 4, 0, 3]  # a majority vote
    assert [r.index for r in vm.rank(scores, patches)] == [1, 2, 0, 3, 4]  # TIE_MARGIN is the default
    for bad in (-0.01, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"within \[0, 1\]"):
            vm.rank(scores, patches, tie_margin=bad)


def test_the_report_carries_the_majority_vote_and_the_margin() -> None:
    """vote@N is the pick with every score equal (no model); best@N follows the margin it was given."""
    cands = [
        vm.Candidate("a", 0.90, False, "p1"),
        vm.Candidate("a", 0.88, True, "p2"),
        vm.Candidate("a", 0.87, True, "p2"),
        vm.Candidate("a", 0.10, False, ""),
    ]
    assert vm.vote_at_n(cands, 4) == 1.0 and vm.vote_at_n(cands, 1) == 0.0
    assert vm.best_at_n(cands, 4, tie_margin=0.0) == 0.0
    assert vm.best_at_n(cands, 4, tie_margin=0.05) == 1.0
    report = vm.best_of_n_report(cands, (1, 2, 4), tie_margin=0.0)
    curve = cast(list[dict[str, object]], report["curve"])
    assert report["tie_margin"] == 0.0 and [row["vote"] for row in curve] == [0.0, 0.0, 1.0]
    table = vm.format_best_of_n(report)
    assert "tie margin 0" in table and "vote@N" in table

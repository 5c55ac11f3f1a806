"""Best-of-N figures of a value model (docs/training.md §2.6): AUC, ECE, pass@1, random@N, best@N, pass@N, and the
patch clusters that break score ties. Pure Python, shared by the value job, the value service, `orchard eval
--best-of` and the toy proofs, so every one of them computes the same numbers."""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_INDEX_LINE = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+( \d+)?$")
_HUNK_HEADER = re.compile(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@.*$")


def normalise_patch(patch: str) -> str:
    """A patch reduced to what it changes: index lines, hunk line numbers, trailing spaces and blank lines go, so
    two candidates making the same edit from different sandboxes compare equal."""
    kept = []
    for line in patch.replace("\r\n", "\n").splitlines():
        line = line.rstrip()
        if not line or _INDEX_LINE.match(line):
            continue
        kept.append("@@" if _HUNK_HEADER.match(line) else line)
    return "\n".join(kept)


def cluster_id(patch: str) -> str:
    """The id of a patch's cluster: a short hash of its normalised form ("" for an empty patch)."""
    norm = normalise_patch(patch)
    return hashlib.sha256(norm.encode()).hexdigest()[:12] if norm else ""


@dataclass(frozen=True)
class Ranked:
    """A candidate's place in a best-of-N ranking."""

    index: int
    """Its position in the input."""
    score: float
    cluster: str
    cluster_size: int
    excluded: bool


TIE_MARGIN = 0.05
"""Scores closer than this to the best remaining one count as a tie, which the larger patch cluster wins. The value
model's scores are not that precise (its calibration error is ~0.26 on the real run), and a cluster that several
independent trajectories reached is evidence the score alone does not see. Chosen on the real run's seeds 0-1:
it lifted best@8 from 0.750 to 0.854 there, and from 0.771 to 0.833 on seeds 2-3, which were not used to choose it
(README, "Value model")."""


def check_tie_margin(tie_margin: float) -> float:
    """`tie_margin` itself when it is within [0, 1] (NaN is not); ValueError saying so otherwise."""
    if not 0 <= tie_margin <= 1:
        raise ValueError(f"must be within [0, 1] (a score difference), got {tie_margin}")
    return tie_margin


def rank(
    scores: Sequence[float],
    patches: Sequence[str],
    excluded: Sequence[bool] | None = None,
    tie_margin: float = TIE_MARGIN,
) -> list[Ranked]:
    """The candidates best first: excluded ones (and empty patches) last; the others one place at a time, each
    place going to the largest patch cluster (a majority vote over normalised patches) among the candidates
    scoring within `tie_margin` of the best remaining score, then to the higher score, then to input order.
    `tie_margin` 0 ranks by score alone, cluster size breaking exact ties only."""
    check_tie_margin(tie_margin)
    clusters = [cluster_id(p) for p in patches]
    sizes = Counter(c for c in clusters if c)
    out = excluded if excluded is not None else [False] * len(scores)
    ranked = [
        Ranked(i, float(s), c, sizes[c] if c else 1, bool(x) or not c)
        for i, (s, c, x) in enumerate(zip(scores, clusters, out, strict=True))
    ]
    by_score = sorted(ranked, key=lambda r: (r.excluded, -r.score, -r.cluster_size, r.index))
    left = [r for r in by_score if not r.excluded]
    placed = []
    while left:
        floor = left[0].score - tie_margin - 1e-12  # left stays sorted by score: the near ones are its head
        near = [r for r in left if r.score >= floor]
        chosen = min(near, key=lambda r: (-r.cluster_size, -r.score, r.index))
        placed.append(chosen)
        left.remove(chosen)
    return placed + [r for r in by_score if r.excluded]


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """The ROC AUC (ties count half); None when the labels hold only one class."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def ece(probabilities: Sequence[float], labels: Sequence[bool], bins: int = 10) -> float | None:
    """The expected calibration error over `bins` equal-width probability bins; None without samples."""
    if not probabilities:
        return None
    total, err = len(probabilities), 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [
            (p, y) for p, y in zip(probabilities, labels, strict=True) if lo <= p < hi or (b == bins - 1 and p == 1.0)
        ]
        if members:
            confidence = sum(p for p, _ in members) / len(members)
            accuracy = sum(bool(y) for _, y in members) / len(members)
            err += len(members) / total * abs(confidence - accuracy)
    return err


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


@dataclass(frozen=True)
class Candidate:
    """One graded candidate of a task, with the value model's score."""

    task_id: str
    score: float
    resolved: bool
    patch: str = ""
    excluded: bool = False


def _by_task(candidates: Sequence[Candidate]) -> dict[str, list[Candidate]]:
    tasks: dict[str, list[Candidate]] = {}
    for c in candidates:
        tasks.setdefault(c.task_id, []).append(c)
    return tasks


def best_of(group: Sequence[Candidate], tie_margin: float = TIE_MARGIN) -> Candidate:
    """The candidate the reranker picks from `group`."""
    top = rank([c.score for c in group], [c.patch for c in group], [c.excluded for c in group], tie_margin)[0]
    return group[top.index]


def best_at_n(candidates: Sequence[Candidate], n: int, tie_margin: float = TIE_MARGIN) -> float:
    """The fraction of tasks whose reranked pick among their first `n` candidates resolves."""
    tasks = _by_task(candidates)
    return sum(best_of(group[:n], tie_margin).resolved for group in tasks.values()) / max(len(tasks), 1)


def vote_at_n(candidates: Sequence[Candidate], n: int) -> float:
    """The baseline without a model: the fraction of tasks whose largest patch cluster among their first `n`
    candidates (excluded ones left out; input order breaks ties) resolves."""
    unscored = [Candidate(c.task_id, 0.5, c.resolved, c.patch, c.excluded) for c in candidates]
    return best_at_n(unscored, n, tie_margin=0.0)


def random_at_n(candidates: Sequence[Candidate], n: int) -> float:
    """The expected resolve rate of a uniform pick among each task's first `n` candidates."""
    tasks = _by_task(candidates)
    return sum(sum(c.resolved for c in g[:n]) / len(g[:n]) for g in tasks.values()) / max(len(tasks), 1)


def pass_at_n(candidates: Sequence[Candidate], n: int) -> float:
    """The oracle: the fraction of tasks with a resolving candidate among their first `n`."""
    tasks = _by_task(candidates)
    return sum(any(c.resolved for c in g[:n]) for g in tasks.values()) / max(len(tasks), 1)


def pass_at_1(candidates: Sequence[Candidate]) -> float:
    """The resolve rate of every candidate (the unbiased pass@1 of all samples; random@1 is that of each task's
    first candidate only)."""
    return sum(c.resolved for c in candidates) / max(len(candidates), 1)


def best_of_n_report(
    candidates: Sequence[Candidate], ns: Sequence[int] = (1, 2, 4, 8), tie_margin: float = TIE_MARGIN
) -> dict[str, object]:
    """pass@1, and for each N: random@N, best@N (ranked with `tie_margin`), pass@N and the majority vote@N; AUC
    and ECE of the scores (as probabilities).

    AUC and ECE cover the scored candidates only: an excluded one (empty or unappliable patch) has no score
    of its own, and counting its placeholder would grade the exclusion rule, not the value model."""
    tasks = _by_task(candidates)
    most = max((len(g) for g in tasks.values()), default=0)
    scored = [c for c in candidates if not c.excluded]
    scores = [c.score for c in scored]
    labels = [c.resolved for c in scored]
    curve = [
        {
            "n": n,
            "random": random_at_n(candidates, n),
            "best": best_at_n(candidates, n, tie_margin),
            "pass": pass_at_n(candidates, n),
            "vote": vote_at_n(candidates, n),
        }
        for n in ns
        if n <= most
    ]
    return {
        "tasks": len(tasks),
        "candidates": len(candidates),
        "samples_per_task": most,
        "pass@1": pass_at_1(candidates),
        "auc": auc(scores, labels),
        "ece": ece(scores, labels),
        "tie_margin": tie_margin,
        "curve": curve,
    }


def format_best_of_n(report: dict[str, object]) -> str:
    """The report as a table: one row per N."""

    def pct(x: object) -> str:
        return "-" if x is None else f"{100 * float(x):5.1f}%"  # type: ignore[arg-type]

    margin = report.get("tie_margin")
    lines = [
        (
            f"best-of-N over {report['tasks']} tasks x up to {report['samples_per_task']} candidates: "
            f"pass@1 {pct(report['pass@1'])}  AUC {'-' if report['auc'] is None else format(report['auc'], '.3f')}"
            f"  ECE {'-' if report['ece'] is None else format(report['ece'], '.3f')}"
            + ("" if margin is None else f"  tie margin {margin:g}")
        ),
        f"{'N':>3}  {'random@N':>9}  {'best@N':>9}  {'pass@N':>9}  {'vote@N':>9}",
    ]
    for row in report["curve"]:  # type: ignore[attr-defined]
        lines.append(
            f"{row['n']:>3}  {pct(row['random']):>9}  {pct(row['best']):>9}  {pct(row['pass']):>9}"
            f"  {pct(row.get('vote')):>9}"
        )
    return "\n".join(lines)

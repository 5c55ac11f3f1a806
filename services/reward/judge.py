"""The RPR judge (docs/training.md §2.5): an LLM grades a whole trajectory's process on a weighted rubric; its JSON is
parsed robustly, each score snapped to the 0.1 grid, the rubric's test-evidence guards applied (guards.py), and the
reward is R' = R_bin + alpha * J. alpha = 0 makes no call, and any judge failure falls back to the outcome reward,
saying why."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from orchard.chat.render import Reference, render_trajectory, steps_of
from orchard.errors import OrchardError
from orchard.services.reward import metrics
from orchard.services.reward.guards import apply_guards
from orchard.services.reward.models import Models
from orchard.services.reward.rubric import Rubric
from orchard.types.v1 import types_pb2 as tpb

_log = logging.getLogger("orchard.reward.judge")

SYSTEM_PROMPT = """You are an expert reviewer of software-engineering agents. You grade the PROCESS of one agent \
trajectory (how it investigated, fixed and verified), as far as possible independently of whether the hidden \
tests finally passed.

Score each criterion on a 0.0 to 1.0 scale in steps of 0.1:
{criteria}

Penalise the agent's response to evidence (ignoring failures, submitting without green checks), not the mere \
appearance of tracebacks. When a reference solution is shown, use it only to ground the test-related criteria; \
do not grade whether the edit matches it.{evidence}

Answer with one JSON object and nothing else:
{{"reasoning": "<at most 3 sentences, citing step indices>", "scores": {{{schema}}}}}"""
OUTPUT_TAIL_CHARS = 300


class JudgeOutputError(ValueError):
    """The judge's answer holds no usable scores; the message says what was wrong."""


@dataclass(frozen=True)
class JudgeOutput:
    reasoning: str
    raw_scores: dict[str, float]
    """Criterion id → the score as the judge wrote it."""


@dataclass(frozen=True)
class JudgeInput:
    """One trajectory to judge, with everything the judge and the reward need."""

    trajectory: tpb.Trajectory
    problem_statement: str
    outcome: tpb.Reward
    reference: Reference | None
    rubric: Rubric
    model: str
    alpha: float
    temperature: float
    max_tokens: int


def system_prompt(rubric: Rubric) -> str:
    criteria = "\n".join(f"- {c.id} {c.name} (weight {c.weight:g}): {c.description}" for c in rubric.criteria)
    schema = ", ".join(f'"{c.id}": <0.0-1.0>' for c in rubric.criteria)
    evidence = ""
    if rubric.test_evidence is not None and rubric.evidence_ids:
        # The guards clamp these scores unless a cited step ran a test, so the judge is told to cite such steps.
        evidence = (
            f" Scores above {rubric.test_evidence.criterion_cap:g} for {', '.join(rubric.evidence_ids)} "
            "need a test that actually ran: cite the steps that ran it."
        )
    return SYSTEM_PROMPT.format(criteria=criteria, schema=schema, evidence=evidence)


def snap(score: float) -> float:
    """A score clamped to [0, 1] and snapped to the nearest 0.1, halves up (0.05 → 0.1, 0.35 → 0.4)."""
    return math.floor(min(1.0, max(0.0, score)) * 10 + 0.5 + 1e-9) / 10


def _object_text(text: str) -> str:
    """The first balanced {...} in `text` (code fences and text around it ignored)."""
    fenced = re.search(r"```(?:json|JSON)?\s*\n?(.*?)```", text, re.DOTALL)
    if fenced and "{" in fenced.group(1):
        text = fenced.group(1)
    start = text.find("{")
    if start < 0:
        raise JudgeOutputError("no JSON object in the answer")
    depth, quote, escaped = 0, "", False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    raise JudgeOutputError("the JSON object is not closed (the answer may have been cut off by max_tokens)")


def _load(obj: str) -> object:
    """JSON, or its near misses: trailing commas, single quotes, Python literals."""
    attempts = (obj, re.sub(r",\s*([}\]])", r"\1", obj))
    for candidate in attempts:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            pass
    try:
        pythonic = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", re.sub(r"\bnull\b", "None", obj)))
        return ast.literal_eval(pythonic)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as err:
        raise JudgeOutputError(f"the object is neither JSON nor a Python literal ({type(err).__name__})") from None


def _number(value: object, cid: str) -> float:
    if isinstance(value, dict) and "score" in value:
        value = value["score"]
    if isinstance(value, bool):
        raise JudgeOutputError(f"score {cid} is a boolean")
    if isinstance(value, str):
        try:
            value = float(value.strip().rstrip("%"))
        except ValueError:
            raise JudgeOutputError(f"score {cid} is not a number: {value!r}") from None
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise JudgeOutputError(f"score {cid} is not a finite number: {value!r}")
    return float(value)


def parse_judge_output(text: str, rubric: Rubric) -> JudgeOutput:
    """The reasoning and per-criterion raw scores of a judge's answer; raises JudgeOutputError when any
    criterion's score is missing or not a number."""
    data = _load(_object_text(text))
    if not isinstance(data, dict):
        raise JudgeOutputError("the answer's top-level value is not an object")
    scores = data.get("scores", data)
    if not isinstance(scores, dict):
        raise JudgeOutputError("'scores' is not an object")
    by_id = {str(k).strip().upper(): v for k, v in scores.items()}
    # "R1 Fix quality" or "R1_fix_quality" keys also name R1.
    for k, v in scores.items():
        head = re.match(r"^\s*([A-Za-z][A-Za-z0-9]*)", str(k))
        if head:
            by_id.setdefault(head.group(1).upper(), v)
    missing = [c.id for c in rubric.criteria if c.id.upper() not in by_id]
    if missing:
        raise JudgeOutputError(f"scores for {', '.join(missing)} are missing")
    raw = {c.id: _number(by_id[c.id.upper()], c.id) for c in rubric.criteria}
    reasoning = data.get("reasoning", "")
    return JudgeOutput(reasoning=reasoning if isinstance(reasoning, str) else json.dumps(reasoning), raw_scores=raw)


class Judge:
    """Judges trajectories with a model behind `models`, at most `max_concurrent` calls at once."""

    def __init__(self, models: Models, max_concurrent: int, timeout_s: float) -> None:
        self.models = models
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_concurrent)

    async def judge(self, item: JudgeInput, deadline_s: float | None = None) -> tpb.Reward:
        """The RPR reward of one trajectory; never raises for a judge failure (it falls back instead)."""
        r_bin = item.outcome.value
        details = tpb.JudgeDetails(
            alpha=item.alpha, outcome_reward=r_bin, judge_model=item.model, reference_guided=item.reference is not None
        )
        if item.alpha == 0:
            return _reward(r_bin, details, "alpha is 0: no judge call made")
        if item.outcome.outcome.status == tpb.OUTCOME_STATUS_ERROR:
            return _reward(r_bin, details, "the outcome is ERROR (grading failed; mask it): not judged")
        steps = steps_of(item.trajectory)
        user = render_trajectory(item.problem_statement, steps, item.trajectory.final_patch, item.reference)
        timeout = self.timeout_s if deadline_s is None else min(self.timeout_s, deadline_s)
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                async with self._slots:
                    reply = await self.models.chat(
                        item.model,
                        system_prompt(item.rubric),
                        user,
                        temperature=item.temperature,
                        max_tokens=item.max_tokens,
                        timeout=max(0.001, timeout - (time.monotonic() - started)),
                    )
        except TimeoutError:
            return _reward(r_bin, details, f"judge call timed out after {timeout:.1f}s")
        except OrchardError as err:
            return _reward(r_bin, details, f"judge call failed ({err.code.name}): {err.message}")
        details.judge_model = reply.model or item.model
        try:
            parsed = parse_judge_output(reply.text, item.rubric)
        except JudgeOutputError as err:
            tail = reply.text.strip()[-OUTPUT_TAIL_CHARS:]
            return _reward(r_bin, details, f"judge output unusable: {err}; the answer ended with: {tail!r}")
        rubric = item.rubric
        guarded = apply_guards(
            {c.id: snap(parsed.raw_scores[c.id]) for c in rubric.criteria}, rubric, steps, parsed.reasoning
        )
        for c in rubric.criteria:
            details.scores.append(
                tpb.CriterionScore(
                    criterion_id=c.id,
                    name=c.name,
                    weight=c.weight,
                    score=guarded.scores[c.id],
                    raw_score=parsed.raw_scores[c.id],
                )
            )
        details.judge_score = guarded.judge_score
        details.adjustments.extend(note for _, note in guarded.adjustments)
        details.reasoning = parsed.reasoning
        metrics.observe_judged(rubric.name, guarded)
        _log.debug(
            "judged %s: J=%.2f in %.1fs%s",
            item.trajectory.trajectory_id,
            details.judge_score,
            time.monotonic() - started,
            "".join(f"; {note}" for _, note in guarded.adjustments),
        )
        return _reward(r_bin + item.alpha * details.judge_score, details, None)


def log_batch(rewards: Sequence[tpb.Reward]) -> None:
    """Log a batch's mean score per criterion (after the guards) and how many rewards the guards adjusted: agents
    that run tests without checking anything show as few adjustments with low R4/R5 means."""
    judged = [r.judge for r in rewards if not r.judge.fell_back]
    if not judged:
        _log.info("judged a batch of %d: all fell back", len(rewards))
        return
    by_id: dict[str, list[float]] = {}
    for d in judged:
        for s in d.scores:
            by_id.setdefault(s.criterion_id, []).append(s.score)
    means = {cid: round(sum(v) / len(v), 3) for cid, v in by_id.items()}
    j = round(sum(d.judge_score for d in judged) / len(judged), 3)
    guarded = sum(1 for d in judged if d.adjustments)
    _log.info(
        "judged a batch of %d (%d fell back): mean J %.3f; means %s; guards adjusted %d",
        len(rewards),
        len(rewards) - len(judged),
        j,
        " ".join(f"{k}={v:.2f}" for k, v in means.items()),
        guarded,
        extra={
            "judged": len(judged),
            "fell_back": len(rewards) - len(judged),
            "mean_judge_score": j,
            "criterion_means": means,
            "guarded": guarded,
        },
    )


def _reward(value: float, details: tpb.JudgeDetails, fallback_reason: str | None) -> tpb.Reward:
    if fallback_reason is not None:
        details.fell_back, details.fallback_reason, details.judge_score = True, fallback_reason, 0.0
        del details.scores[:]
    reward = tpb.Reward(
        kind=tpb.REWARD_KIND_RPR,
        value=value,
        name="rpr",
        source=f"judge:{details.judge_model or 'default'}",
        judge=details,
    )
    reward.create_time.GetCurrentTime()
    return reward

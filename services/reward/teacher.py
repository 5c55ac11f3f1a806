"""The OPD teacher (docs/training.md §2.4): a teacher model's log-prob of every token of a student's exact sequence
(prefill only, through the inference service's ScoreTokens), with the loss mask carried through."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from orchard.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, OrchardError
from orchard.services.reward.models import Models
from orchard.types.v1 import types_pb2 as tpb


@dataclass(frozen=True)
class TeacherInput:
    """One student sequence to score: prompt ids, response ids, the response mask (1 = student-generated) and,
    optionally, the student's log-probs of the response."""

    model: str
    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int]
    student_logprobs: list[float]
    max_context_tokens: int


@dataclass(frozen=True)
class Window:
    """Which part of prompt + response the teacher sees: the first `first_scored` response tokens are not
    scored (dropped from the start to fit the context, or used as the only context)."""

    context: list[int]
    continuation: list[int]
    first_scored: int
    dropped: int


def window(prompt: list[int], response: list[int], cap: int) -> Window:
    """Fit prompt + response into `cap` tokens by dropping tokens from the start (teacher truncation 'suffix');
    at least one token stays as context."""
    total = prompt + response
    dropped = max(0, len(total) - cap)
    kept = total[dropped:]
    context_len = max(len(prompt) - dropped, 1)
    first_scored = dropped + context_len - len(prompt)
    return Window(
        context=kept[:context_len], continuation=kept[context_len:], first_scored=first_scored, dropped=dropped
    )


def opd_value(teacher: list[float], student: list[float], mask: list[int]) -> float:
    """The mean of teacher minus student log-prob over mask-1 tokens; 0 without student log-probs or tokens."""
    used = [t - s for t, s, m in zip(teacher, student, mask, strict=False) if m]
    return sum(used) / len(used) if student and used else 0.0


class Teacher:
    """Scores student sequences with a teacher behind `models`, at most `max_concurrent` calls at once."""

    def __init__(self, models: Models, max_concurrent: int, timeout_s: float) -> None:
        self.models = models
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_concurrent)

    async def score(self, item: TeacherInput, deadline_s: float | None = None) -> tpb.Reward:
        """The OPD reward of one sequence. Raises OrchardError (a deadline as DeadlineExceeded)."""
        timeout = self.timeout_s if deadline_s is None else min(self.timeout_s, deadline_s)
        try:
            async with asyncio.timeout(timeout):
                return await self._score(item, timeout)
        except TimeoutError as err:
            if isinstance(err, OrchardError):
                raise
            raise DeadlineExceeded(
                f"teacher scoring took longer than {timeout:.1f}s; give a longer deadline or fewer tokens"
            ) from None

    async def _score(self, item: TeacherInput, timeout: float) -> tpb.Reward:
        async with self._slots:
            # The request's cap, never beyond the teacher's own context.
            cap = await self.models.context_length(item.model, timeout=timeout)
            cap = min(cap, item.max_context_tokens) if item.max_context_tokens else cap
            if cap < 2:
                raise InvalidArgument(
                    f"max_context_tokens {cap} leaves no token to score; give at least 2", field="max_context_tokens"
                )
            win = window(item.prompt_ids, item.response_ids, cap)
            scored, model, version = [], item.model, ""
            if win.continuation:
                try:
                    result = await self.models.score(item.model, win.context, win.continuation, timeout=timeout)
                except InvalidArgument as err:
                    if err.field not in ("token_ids", "continuation_token_ids"):
                        raise
                    # The inference service rejects ids outside its vocabulary: the teacher cannot score this
                    # student's tokens (a different tokenizer).
                    raise FailedPrecondition(
                        f"the teacher cannot score these tokens: {err.message}",
                        field="response.token_ids",
                        reason="TEACHER_VOCABULARY",
                    ) from None
                scored, model, version = result.logprobs, result.model, result.weights_version
        if len(scored) != len(win.continuation):
            raise FailedPrecondition(
                f"the teacher returned {len(scored)} log-probs for {len(win.continuation)} "
                "tokens; check the inference service"
            )
        logprobs = [0.0] * win.first_scored + list(scored)
        mask = [m if i >= win.first_scored else 0 for i, m in enumerate(item.mask)]
        details = tpb.TeacherDetails(
            teacher_model=model,
            teacher_weights_version=version,
            teacher_logprobs=logprobs,
            mask=mask,
            truncated_tokens=win.dropped,
        )
        reward = tpb.Reward(
            kind=tpb.REWARD_KIND_OPD,
            value=opd_value(logprobs, item.student_logprobs, mask),
            name="opd_teacher",
            source=f"teacher:{model or 'default'}",
            teacher=details,
        )
        reward.create_time.GetCurrentTime()
        return reward

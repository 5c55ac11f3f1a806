"""ValueService servicer: validates candidates, renders them as the value model reads them, and scores them through
the batcher; Rerank excludes candidates that fail their checks and ranks the rest. Errors raised here are
OrchardErrors; the runtime's interceptor maps them to status codes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc

from orchard.chat.render import problem_statement
from orchard.errors import InvalidArgument
from orchard.prototime import timestamp
from orchard.services.value.batcher import Batcher
from orchard.services.value.checkpoints import ServedModel, ValueModels
from orchard.services.value.settings import ValueSettings
from orchard.value.metrics import check_tie_margin, cluster_id, rank, sigmoid
from orchard.value.render import render_candidate
from orchard.value.v1 import value_pb2 as pb
from orchard.value.v1 import value_pb2_grpc

_log = logging.getLogger("orchard.value")

MODEL_NAME = "valueModel"
CHECKS = (
    ("patch_applies", "the patch does not apply"),
    ("repro_tests_pass", "the reproduction tests fail"),
    ("regression_tests_pass", "regression tests fail"),
)
"""Each CandidateChecks field, and the exclusion reason when it is set to false."""


def patch_of(candidate: pb.Candidate) -> str:
    return candidate.patch or candidate.trajectory.final_patch


def exclusion_reason(candidate: pb.Candidate) -> str:
    """Why Rerank ranks the candidate last without scoring it; "" when it is scored."""
    reasons = [] if cluster_id(patch_of(candidate)) else ["the patch is empty (nothing was submitted)"]
    checks = candidate.checks
    reasons += [reason for name, reason in CHECKS if checks.HasField(name) and not getattr(checks, name)]
    return "; ".join(reasons)


def check_candidates(candidates: Sequence[pb.Candidate], limit: int) -> None:
    """Refuse an empty or oversized list and missing or repeated ids, naming the field."""
    if not candidates:
        raise InvalidArgument("candidates is empty; give at least one", field="candidates")
    if len(candidates) > limit:
        raise InvalidArgument(
            f"{len(candidates)} candidates exceed the limit of {limit} per request; split them "
            "(Rerank ranks one task's candidates)",
            field="candidates",
        )
    seen: dict[str, int] = {}
    for i, c in enumerate(candidates):
        field = f"candidates[{i}].candidate_id"
        if not c.candidate_id:
            raise InvalidArgument(
                f"{field} is empty; give every candidate an id (its trajectory id is a good choice)", field=field
            )
        if c.candidate_id in seen:
            raise InvalidArgument(
                f"candidate_id {c.candidate_id!r} is given twice (candidates[{seen[c.candidate_id]}]"
                f" and candidates[{i}]); ids must be unique within a request",
                field=field,
            )
        seen[c.candidate_id] = i


def render_all(candidates: Sequence[tuple[int, pb.Candidate]], problem: str, max_chars: int) -> list[str]:
    """The model input of each (index, candidate): its task (its own, else `problem`, else its trajectory's first
    user message), compact trajectory and patch."""
    texts = []
    for i, c in candidates:
        task = c.problem_statement or problem or problem_statement(c.trajectory)
        if not task.strip():
            raise InvalidArgument(
                f"candidates[{i}] has no task statement: problem_statement is empty and its "
                "trajectory has no user message; give the task",
                field=f"candidates[{i}].problem_statement",
            )
        text = render_candidate(c.trajectory, problem=task, patch=c.patch)
        if len(text) > max_chars:
            raise InvalidArgument(
                f"candidates[{i}] renders to {len(text)} characters, over the limit of {max_chars} "
                "(max_text_chars); send fewer of its trajectory's steps",
                field=f"candidates[{i}].trajectory",
            )
        texts.append(text)
    return texts


def model_proto(served: ServedModel) -> pb.ValueModel:
    load_time = timestamp(served.load_time)
    config = served.model.config
    return pb.ValueModel(
        name=MODEL_NAME,
        version=served.version,
        checkpoint_path=served.checkpoint_path,
        base_model=config.base_model,
        max_context_tokens=config.max_context_tokens,
        job=served.job,
        metrics=served.metrics,
        load_time=load_time,
    )


class ValueServicer(value_pb2_grpc.ValueServiceServicer):
    """gRPC face of the served value model and its batcher."""

    def __init__(self, settings: ValueSettings, models: ValueModels, batcher: Batcher) -> None:
        self.settings = settings
        self.models = models
        self.batcher = batcher

    async def _logits(self, served: ServedModel, texts: list[str]) -> list[float]:
        """The logits of `texts`; equal texts are scored once, so they always get equal scores."""
        unique = list(dict.fromkeys(texts))
        by_text = dict(zip(unique, await self.batcher.score(served.model, unique), strict=True))
        return [by_text[t] for t in texts]

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreResponse:
        candidates = request.candidates
        check_candidates(candidates, self.settings.max_candidates)
        texts = await asyncio.to_thread(render_all, list(enumerate(candidates)), "", self.settings.max_text_chars)
        served = self.models.served
        logits = await self._logits(served, texts)
        return pb.ScoreResponse(
            scores=[
                pb.ScoredCandidate(candidate_id=c.candidate_id, score=sigmoid(x), logit=x)
                for c, x in zip(candidates, logits, strict=True)
            ],
            model_version=served.version,
        )

    async def Rerank(self, request: pb.RerankRequest, context: grpc.aio.ServicerContext) -> pb.RerankResponse:
        candidates = request.candidates
        check_candidates(candidates, self.settings.max_candidates)
        margin = request.tie_margin if request.HasField("tie_margin") else self.settings.tie_margin
        try:
            check_tie_margin(margin)
        except ValueError as err:
            raise InvalidArgument(f"tie_margin {err}", field="tie_margin") from None
        reasons = [exclusion_reason(c) for c in candidates]
        kept = [(i, c) for i, c in enumerate(candidates) if not reasons[i]]
        texts = await asyncio.to_thread(render_all, kept, request.problem_statement, self.settings.max_text_chars)
        served = self.models.served
        scores = [0.0] * len(candidates)
        for (i, _), logit in zip(kept, await self._logits(served, texts) if texts else [], strict=True):
            scores[i] = sigmoid(logit)
        order = rank(scores, [patch_of(c) for c in candidates], [bool(r) for r in reasons], margin)
        ranked = [
            pb.RankedCandidate(
                candidate_id=candidates[r.index].candidate_id,
                rank=place,
                score=r.score,
                cluster_id=r.cluster,
                cluster_size=r.cluster_size,
                excluded=r.excluded,
                exclusion_reason=reasons[r.index],
            )
            for place, r in enumerate(order, start=1)
        ]
        best = "" if ranked[0].excluded else ranked[0].candidate_id
        _log.info(
            "reranked task %s: %d candidates (%d excluded), best %s",
            request.task_id or "(unnamed)",
            len(candidates),
            len(candidates) - len(kept),
            best or "none",
            extra={
                "task_id": request.task_id,
                "candidates": len(candidates),
                "excluded": len(candidates) - len(kept),
                "best_candidate_id": best,
                "model_version": served.version,
            },
        )
        return pb.RerankResponse(ranked=ranked, best_candidate_id=best, model_version=served.version, tie_margin=margin)

    async def LoadModel(self, request: pb.LoadModelRequest, context: grpc.aio.ServicerContext) -> pb.LoadModelResponse:
        served, previous = await self.models.load(request.checkpoint_path, request.version)
        return pb.LoadModelResponse(model=model_proto(served), previous_version=previous)

    async def GetModel(self, request: pb.GetModelRequest, context: grpc.aio.ServicerContext) -> pb.GetModelResponse:
        return pb.GetModelResponse(model=model_proto(self.models.served))

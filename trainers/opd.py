"""On-policy distillation (docs/training.md §2.4): a per-token loss from the student's and a teacher's log-probs of the
student's own sampled tokens (l_s, l_t), masked to assistant tokens and added to the GRPO loss:

    L = L_PPO-clip(A_grpo) + opd_coef · mean_{assistant tokens} L_opd(l_s, l_t)

Surrogates (`estimate` is the per-token value, `token_loss` the differentiable loss):
- k1: value l_s - l_t; loss sg(l_s - l_t)·l_s (score function: REINFORCE with reward l_t - l_s).
- k2: ½(l_s - l_t)² (its gradient equals k1's on-policy).
- k3: exp(l_t - l_s) - 1 + (l_s - l_t) (non-negative; its gradient is the forward-KL one).
- js_skew: KL(π_s ‖ m), m = (1-λ)π_s + λπ_t, sampled-token value f = l_s - log((1-λ)e^{l_s} + λe^{l_t}), bounded
  by -log(1-λ) (log 2 at λ = 0.5); λ = 1 gives reverse KL (k1's value).

Choices [I]:
- js_skew's loss is f + sg(f)·(l_s - sg(l_s)): its value is f and its gradient (f + λπ_t/m)·∇l_s is the exact
  on-policy gradient of KL(π_s ‖ m) (pathwise plus score-function terms). The pathwise term alone,
  λπ_t/m·∇l_s, would push probability away from the tokens the teacher prefers.
- teacher_topk = 1: only the sampled token's teacher log-prob is used (what ScoreTokens returns).
"""

from __future__ import annotations

import math
from enum import StrEnum

import torch

from orchard.inference.v1 import inference_pb2 as ipb
from orchard.inference.v1 import inference_pb2_grpc
from orchard.trainers.rl import CLIP_HIGH, CLIP_LOW, Aggregation, LossStats, aggregate, policy_loss

JS_LAMBDA = 0.5


class OpdLoss(StrEnum):
    """The OPD surrogate."""

    K1 = "k1"
    K2 = "k2"
    K3 = "k3"
    JS_SKEW = "js_skew"


def _js_value(ls: torch.Tensor, lt: torch.Tensor, lam: float) -> torch.Tensor:
    if not 0 <= lam <= 1:
        raise ValueError(f"the js_skew mixture weight must be in [0, 1], got {lam}")
    log_student = torch.full_like(ls, -math.inf) if lam == 1 else ls + math.log(1 - lam)
    log_teacher = torch.full_like(lt, -math.inf) if lam == 0 else lt + math.log(lam)
    return ls - torch.logaddexp(log_student, log_teacher)


def estimate(
    ls: torch.Tensor, lt: torch.Tensor, kind: OpdLoss = OpdLoss.JS_SKEW, lam: float = JS_LAMBDA
) -> torch.Tensor:
    """The per-token divergence estimate of each surrogate (no gradient semantics)."""
    d = ls - lt
    if kind == OpdLoss.K1:
        return d
    if kind == OpdLoss.K2:
        return 0.5 * d**2
    if kind == OpdLoss.K3:
        return torch.exp(-d) - 1 + d
    return _js_value(ls, lt, lam)


def token_loss(
    ls: torch.Tensor, lt: torch.Tensor, kind: OpdLoss = OpdLoss.JS_SKEW, lam: float = JS_LAMBDA
) -> torch.Tensor:
    """The per-token differentiable OPD loss; the gradient flows through the student's log-probs `ls` only."""
    lt = lt.detach()
    if kind == OpdLoss.K1:
        return (ls - lt).detach() * ls
    if kind in (OpdLoss.K2, OpdLoss.K3):
        return estimate(ls, lt, kind)
    f = _js_value(ls, lt, lam)
    return f + f.detach() * (ls - ls.detach())


def opd_loss(
    ls: torch.Tensor, lt: torch.Tensor, mask: torch.Tensor, kind: OpdLoss = OpdLoss.JS_SKEW, lam: float = JS_LAMBDA
) -> torch.Tensor:
    """The mean OPD loss over assistant tokens (mask 1); tool and observation tokens are scored but masked."""
    return aggregate(token_loss(ls, lt, kind, lam), mask.float(), Aggregation.TOKEN_MEAN)


def total_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    opd_coef: float = 1.0,
    kind: OpdLoss = OpdLoss.JS_SKEW,
    lam: float = JS_LAMBDA,
    opd_only: bool = False,
    clip_low: float = CLIP_LOW,
    clip_high: float = CLIP_HIGH,
    aggregation: Aggregation = Aggregation.TOKEN_MEAN,
) -> tuple[torch.Tensor, LossStats]:
    """GRPO's clipped loss plus opd_coef times the OPD loss; `opd_only` zeroes the task advantage."""
    if opd_only:
        advantages = torch.zeros_like(advantages)
    loss, stats = policy_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, aggregation)
    if opd_coef:
        loss = loss + opd_coef * opd_loss(logprobs, teacher_logprobs, mask, kind, lam)
    return loss, stats


async def teacher_logprobs(
    stub: inference_pb2_grpc.InferenceServiceStub,
    model: str,
    token_ids: list[int],
    max_context: int = 0,
    timeout_s: float = 300.0,
) -> tuple[list[float], list[int]]:
    """The teacher's log-prob of every token of the identical sequence (tool tokens included), through the
    inference service's ScoreTokens, and a mask of the scored positions.

    Over `max_context` (0: no cap) the oldest tokens are dropped (the suffix is kept); the first kept token
    has no context, so it and every dropped one get log-prob 0 and mask 0.
    """
    cut = max(0, len(token_ids) - max_context) if max_context else 0
    kept = token_ids[cut:]
    if len(kept) < 2:
        return [0.0] * len(token_ids), [0] * len(token_ids)
    request = ipb.ScoreTokensRequest(
        model=model,
        token_ids=ipb.TokenIds(ids=kept[:1]),
        continuation_token_ids=kept[1:],
        labels={"purpose": "opd-teacher"},
    )
    response = await stub.ScoreTokens(request, timeout=timeout_s)
    logprobs = [0.0] * (cut + 1) + list(response.logprobs)
    return logprobs, [0] * (cut + 1) + [1] * (len(kept) - 1)

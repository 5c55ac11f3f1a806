"""On-policy distillation losses (docs/training.md §2.4): closed forms, gradients, masking, the combination with GRPO,
and a toy distillation of a tiny student towards a fixed bigram teacher (shared with the learning bench)."""

from __future__ import annotations

import math
import time

import pytest
import torch
from toy import distill_bigram

from orchard.trainers.opd import OpdLoss, estimate, opd_loss, token_loss, total_loss
from orchard.trainers.rl import policy_loss

LOG = math.log


@pytest.mark.parametrize("kind", list(OpdLoss))
def test_all_surrogates_are_zero_when_student_equals_teacher(kind: OpdLoss) -> None:
    ls = torch.log(torch.tensor([0.9, 0.3, 1e-4]))
    assert estimate(ls, ls.clone(), kind).abs().max().item() < 1e-6
    assert token_loss(ls, ls.clone(), kind).abs().max().item() < 1e-6


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (OpdLoss.K1, LOG(2)),  # l_s - l_t, p_s = 0.5, p_t = 0.25
        (OpdLoss.K2, 0.5 * LOG(2) ** 2),
        (OpdLoss.K3, 0.5 - 1 + LOG(2)),
        (OpdLoss.JS_SKEW, LOG(0.5) - LOG(0.5 * 0.5 + 0.5 * 0.25)),  # log(4/3)
    ],
)
def test_closed_forms(kind: OpdLoss, expected: float) -> None:
    assert estimate(torch.tensor(LOG(0.5)), torch.tensor(LOG(0.25)), kind).item() == pytest.approx(expected)


def test_js_skew_with_lambda_one_is_reverse_kl_and_stays_under_its_bound() -> None:
    ls, lt = torch.log(torch.tensor([0.9, 0.5, 0.01, 0.3])), torch.log(torch.tensor([1e-9, 0.25, 0.9, 0.3]))
    assert torch.allclose(estimate(ls, lt, OpdLoss.JS_SKEW, lam=1.0), estimate(ls, lt, OpdLoss.K1))
    for lam in (0.1, 0.5, 0.9):
        assert (estimate(ls, lt, OpdLoss.JS_SKEW, lam) <= -math.log(1 - lam) + 1e-6).all()  # the supremum
    assert estimate(ls, lt, OpdLoss.JS_SKEW, lam=0.5).max().item() == pytest.approx(LOG(2), abs=1e-3)
    assert estimate(ls, lt, OpdLoss.JS_SKEW, lam=0.0).abs().max().item() == 0.0


@pytest.mark.parametrize(
    ("kind", "grad"),
    [
        (OpdLoss.K1, LOG(2)),  # sg(l_s - l_t)
        (OpdLoss.K2, LOG(2)),  # l_s - l_t
        (OpdLoss.K3, 1 - 0.5),  # 1 - p_t / p_s
        (OpdLoss.JS_SKEW, LOG(4 / 3) + 0.5 * 0.25 / 0.375),  # f + lambda p_t / m
    ],
)
def test_surrogate_gradients(kind: OpdLoss, grad: float) -> None:
    ls = torch.tensor(LOG(0.5), requires_grad=True)
    token_loss(ls, torch.tensor(LOG(0.25)), kind).backward()
    assert ls.grad is not None
    assert ls.grad.item() == pytest.approx(grad)


@pytest.mark.parametrize("kind", list(OpdLoss))
def test_tool_tokens_contribute_no_gradient(kind: OpdLoss) -> None:
    ls = torch.log(torch.tensor([[0.5, 0.2, 0.7, 0.1]])).requires_grad_(True)
    lt = torch.log(torch.tensor([[0.25, 0.6, 0.1, 0.3]]))
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    opd_loss(ls, lt, mask, kind).backward()
    assert ls.grad is not None
    assert ls.grad[0, 1] == 0 and ls.grad[0, 3] == 0 and ls.grad[0, 0] != 0 and ls.grad[0, 2] != 0


def test_opd_only_ignores_the_task_advantage_and_zero_coef_is_plain_grpo() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.4], [0.3, 0.2]]))
    old = torch.log(torch.tensor([[0.45, 0.4], [0.35, 0.25]]))
    teacher = torch.log(torch.tensor([[0.6, 0.1], [0.2, 0.9]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    grpo, _ = policy_loss(lp, old, adv, mask)
    assert total_loss(lp, old, teacher, adv, mask, opd_coef=0.0)[0].item() == grpo.item()
    only = total_loss(lp, old, teacher, adv, mask, opd_coef=0.7, opd_only=True)[0]
    also = total_loss(lp, old, teacher, -3 * adv, mask, opd_coef=0.7, opd_only=True)[0]
    assert only.item() == also.item() == pytest.approx(0.7 * opd_loss(lp, teacher, mask).item())
    combined = total_loss(lp, old, teacher, adv, mask, opd_coef=2.0)[0]
    assert combined.item() == pytest.approx(grpo.item() + 2.0 * opd_loss(lp, teacher, mask).item())


@pytest.mark.slow
def test_opd_reduces_full_kl_to_a_bigram_teacher() -> None:
    """200 steps of js_skew OPD (the default) on the student's own samples cut the exact KL by at least half."""
    began = time.monotonic()
    before, after = distill_bigram(seed=0, steps=200, kind=OpdLoss.JS_SKEW)
    print(
        f"js_skew: KL {before:.3f} -> {after:.3f} ({1 - after / before:.0%} lower) in {time.monotonic() - began:.1f}s"
    )
    assert after <= 0.5 * before

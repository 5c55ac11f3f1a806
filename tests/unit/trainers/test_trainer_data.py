"""The trainer jobs' data and optimisation pieces: chat-template samples with assistant-only masks, the LR
schedule, hyperparameter defaults and micro-batching."""

from __future__ import annotations

import math

import pytest

from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers import optim
from orchard.trainers.data import TemplateRenderer, render_sample
from orchard.trainers.sft import Sample
from orchard.trainers.sft_job import micro_batches


@pytest.fixture(scope="module")
def renderer() -> TemplateRenderer:
    from transformers import AutoTokenizer

    from orchard.model_files import default_cache_dir, resolve_model

    return TemplateRenderer(AutoTokenizer.from_pretrained(resolve_model("", default_cache_dir())[0]))


MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Where is the bug?"},
    {"role": "assistant", "content": "In calc.py."},
    {"role": "user", "content": "Fix it."},
    {"role": "assistant", "content": "Done: median sorts first."},
]


def trained_text(renderer: TemplateRenderer, sample: Sample) -> list[str]:
    """The trained spans of a sample, decoded (consecutive mask-1 tokens joined)."""
    spans, run = [], []
    for token, m in zip(sample.token_ids, sample.loss_mask, strict=True):
        if m:
            run.append(token)
        elif run:
            spans.append(renderer.tokenizer.decode(run))
            run = []
    if run:
        spans.append(renderer.tokenizer.decode(run))
    return spans


def test_mask_covers_exactly_the_assistant_replies_with_their_end_token(renderer: TemplateRenderer) -> None:
    sample = render_sample(renderer, MESSAGES, [])
    assert trained_text(renderer, sample) == ["In calc.py.<|im_end|>", "Done: median sorts first.<|im_end|>"]
    # The tokens are those of the whole rendered conversation.
    full = renderer.apply_chat_template(MESSAGES, None, add_generation_prompt=False)
    assert renderer.tokenizer.decode(sample.token_ids) == full


def test_only_the_chosen_turns_are_trained(renderer: TemplateRenderer) -> None:
    sample = render_sample(renderer, MESSAGES, [], trained_turns={1})
    assert trained_text(renderer, sample) == ["Done: median sorts first.<|im_end|>"]
    assert not any(render_sample(renderer, MESSAGES, [], trained_turns=set()).loss_mask)


def test_tool_calls_render_as_the_inference_service_renders_them(renderer: TemplateRenderer) -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "bash", "description": "run a command", "parameters": {"type": "object"}},
        }
    ]
    messages = [
        {"role": "user", "content": "List files."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "calc.py"},
    ]
    sample = render_sample(renderer, messages, tools)
    (trained,) = trained_text(renderer, sample)
    assert "<tool_call>" in trained and '"name": "bash"' in trained and "calc.py" not in trained
    assert "<tools>" in renderer.tokenizer.decode(sample.token_ids)  # the Hermes preamble, untrained


def resolved(**fields: object) -> optim.Optim:
    return optim.resolve(pb.Hyperparameters(**fields), pb.JOB_KIND_SFT)  # type: ignore[arg-type]


def test_recipe_defaults_fill_unset_hyperparameters() -> None:
    sft = resolved(seed=3)
    assert (sft.learning_rate, sft.weight_decay, sft.betas) == (1e-5, 0.0, (0.9, 0.999))
    assert sft.min_learning_rate == pytest.approx(1e-6)
    assert sft.schedule == pb.LR_SCHEDULE_COSINE and sft.seed == 3 and sft.micro_batch_size == 1
    rl = optim.resolve(pb.Hyperparameters(), pb.JOB_KIND_RL)
    assert (rl.learning_rate, rl.weight_decay, rl.betas[1]) == (1e-6, 0.1, 0.98)
    assert optim.resolve(pb.Hyperparameters(), pb.JOB_KIND_RL, opd_only=True).schedule == pb.LR_SCHEDULE_CONSTANT
    assert resolved(weight_decay=0.0, min_learning_rate=0.0).min_learning_rate == 0.0  # explicit zeros are kept


def test_lr_schedules() -> None:
    cosine = resolved(learning_rate=1.0, min_learning_rate=0.0, warmup_ratio=0.2)
    lrs = [optim.lr_at(cosine, s, 10) for s in range(10)]
    assert lrs[:2] == [0.5, 1.0]  # two warmup steps, linear from 0
    assert lrs[2] == 1.0 and lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert lrs[5] == pytest.approx(0.5 * (1 + math.cos(math.pi * 3 / 7)))
    linear = resolved(learning_rate=1.0, min_learning_rate=0.1, lr_schedule=pb.LR_SCHEDULE_LINEAR)
    assert [round(optim.lr_at(linear, s, 4), 6) for s in range(4)] == [1.0, 0.7, 0.4, 0.1]
    constant = resolved(learning_rate=0.3, lr_schedule=pb.LR_SCHEDULE_CONSTANT)
    assert {optim.lr_at(constant, s, 5) for s in range(5)} == {0.3}


def test_micro_batches_split_evenly_over_ranks() -> None:
    batch = [Sample([i, i], [0, 1]) for i in range(6)]
    assert [len(mb) for mb in micro_batches(batch, 4, 1)] == [3, 3]
    assert [len(mb) for mb in micro_batches(batch, 1, 2)] == [1] * 6
    two = micro_batches(batch, 2, 2)
    assert len(two) % 2 == 0 and sorted(s.token_ids[0] for mb in two for s in mb) == list(range(6))

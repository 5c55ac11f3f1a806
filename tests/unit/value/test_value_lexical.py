"""The value model's lexical part: stable hashed features, a zero start, fitting that carries to unseen tasks, and
checkpoints with and without it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from orchard.errors import FailedPrecondition
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers import value_job
from orchard.trainers.value_data import Example, ValueData
from orchard.value import metrics as vm
from orchard.value.lexical import FEATURES, LexicalHead, feature_ids
from orchard.value.model import CONFIG_FILE, LEXICAL_FILE, ValueModel, resolve_backbone

WORDS = [f"w{i}" for i in range(400)]


def test_features_are_words_and_pairs_hashed_stably() -> None:
    ids = feature_ids("The tests PASS. Submitting")
    assert ids == sorted(set(ids)) and all(0 <= i < FEATURES for i in ids)
    assert ids == feature_ids("the tests pass. submitting")  # lower-cased
    # words: the, tests, pass, ".", submitting; pairs: the tests, tests pass, pass ., . submitting
    assert len(ids) == 9
    assert set(feature_ids("tests pass")) < set(ids) and not set(feature_ids("pass tests")) <= set(ids)
    # Pinned: a saved lexical part is only right while every process hashes the same way.
    assert feature_ids("tests pass") == [54308, 64606, 241767]


def test_a_new_part_scores_zero_and_takes_empty_texts() -> None:
    head = LexicalHead()
    assert head(["", "some words here", "x"]).tolist() == [0.0, 0.0, 0.0]


def candidate(task: int, good: bool, rng: random.Random) -> Example:
    """A synthetic rendered candidate: task-specific words, noise, and the outcome's phrase."""
    own = " ".join(rng.sample(WORDS[task * 20 : task * 20 + 20], 8))
    noise = " ".join(rng.choices(WORDS, k=30))
    ending = "The tests pass. Submitting." if good else "Some tests still fail. Submitting."
    return Example(
        f"task-{task}",
        "run",
        f"{task}-{good}-{rng.random()}",
        f"## Task\n{own}\n{noise}\n{ending}",
        good,
        f"patch {rng.random()}",
    )


def test_fitting_learns_the_outcome_phrase_and_ranks_unseen_tasks() -> None:
    rng = random.Random(0)
    train = [candidate(t, good, rng) for t in range(12) for good in (True, False, False)]
    held = [candidate(t, good, rng) for t in range(12, 18) for good in (True, False, False, True)]
    data = ValueData(train, [], {})
    head = LexicalHead()
    loss = value_job.fit_lexical(head, data, seed=0, batch_size=8, pairwise_weight=1.0, steps=60)
    with torch.no_grad():
        scores = head([e.text for e in held]).tolist()
    assert loss < 0.5
    assert vm.auc(scores, [e.resolved for e in held]) == 1.0


def test_checkpoints_keep_the_part_and_older_ones_load_without_it(tmp_path: Path) -> None:
    model = ValueModel.load(resolve_backbone("")[0])
    assert model.lexical is not None and model.config.lexical_features == FEATURES
    with torch.no_grad():
        model.lexical.bag.weight[feature_ids("still fail")] = -3.0
    texts = ["The tests pass.", "Some tests still fail."]
    before = model.score(texts)
    assert before[1] < before[0] - 2.0  # the part's score is added to the head's logit
    model.save(tmp_path / "new")
    assert (tmp_path / "new" / LEXICAL_FILE).is_file()
    assert ValueModel.load(tmp_path / "new").score(texts) == pytest.approx(before, abs=1e-5)

    # A checkpoint from before the lexical part: its config has no such field and it has no file.
    model.save(tmp_path / "old")
    config = json.loads((tmp_path / "old" / CONFIG_FILE).read_text())
    del config["lexical_features"]
    (tmp_path / "old" / CONFIG_FILE).write_text(json.dumps(config))
    (tmp_path / "old" / LEXICAL_FILE).unlink()
    old = ValueModel.load(tmp_path / "old")
    assert old.lexical is None and old.score(texts)[0] == pytest.approx(old.score(texts)[1], abs=0.5)

    (tmp_path / "new" / LEXICAL_FILE).unlink()
    with pytest.raises(FailedPrecondition, match="declares a lexical part but has no value_lexical.safetensors"):
        ValueModel.load(tmp_path / "new")


def test_the_value_job_takes_its_held_out_tie_margin_from_the_job_config() -> None:
    assert value_job.settings(pb.ValueConfig())[3] == vm.TIE_MARGIN
    assert value_job.settings(pb.ValueConfig(tie_margin=0.0))[3] == 0.0  # set, even to zero, overrides

    # Scores from the lexical part alone: "lone" nudges one unresolved candidate 0.025 above a resolved pair
    # that submitted the same patch, which the default margin counts as a near-tie and a margin of 0 does not.
    model = ValueModel.load(resolve_backbone("")[0])
    assert model.lexical is not None
    with torch.no_grad():
        for p in model.head.parameters():
            p.zero_()
        model.lexical.bag.weight.zero_()
        model.lexical.bias.zero_()
        model.lexical.bag.weight[feature_ids("lone")] = 0.1 / len(feature_ids("lone"))
    held = [
        Example("t", "r", "a", "lone", False, "patch-a"),
        Example("t", "r", "b", "pair", True, "patch-b"),
        Example("t", "r", "c", "pair", True, "patch-b"),
    ]
    by_score = value_job.held_out_report(model, held, [3], seed=0, tie_margin=0.0)
    by_default = value_job.held_out_report(model, held, [3], seed=0)
    assert (by_score["tie_margin"], by_default["tie_margin"]) == (0.0, vm.TIE_MARGIN)
    assert by_score["curve"][0]["best"] == 0.0 and by_default["curve"][0]["best"] == 1.0

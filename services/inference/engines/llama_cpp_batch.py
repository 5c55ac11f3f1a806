"""The llama.cpp half of the `llama_cpp` engine: one model and one context (through llama-cpp-python's C API
bindings), and the sequences decoding together in it.

Every method runs in the engine's one worker thread. The context holds one unified KV cache shared by every
sequence (llama.cpp's sequence ids, one per row). A step is one `llama_decode` batch (split only past n_batch
tokens): the last sampled token of every running sequence, then the whole prompt of each request admitted in that
step, its tokens tagged with all n of its sequences' ids so the n samples share the prompt's cache cells (as
llama.cpp's `batched` example does). Logits come back for the decode tokens and each prompt's last token; sampling,
stop strings and text are `Sequence`'s, the same as the transformers engine's. An aborted sequence's cells are
removed at once, a finished one's stay as a cached prefix (below). A request is admitted when its prompt plus n * max_tokens fit in the cache beside what the
running ones reserved; until then it waits, holding its place.

Prefix cache: a finished sequence's cells (its prompt and what it generated) stay as a cached prefix, in
least-recently-used order, up to `cache_slots` of them. A new request's prompt starts from the longest cached prefix
it shares (`llama_memory_seq_cp`: its sequences share those cells) and decodes only the rest, so an agent's next
turn, which repeats the conversation so far, or n samples of the same prompt in later calls, prefill only what is
new. Cached prefixes are evicted, oldest first, when a request needs their room. Logits can differ from a full
prefill's, as they already do between llama.cpp's many-token and one-token steps (docs/inference.md).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer

from orchard.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
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
    try:
        from llama_cpp import llama_cpp
    except ImportError as err:  # an opt-in package: say how to get it
        raise FailedPrecondition(
            "the llama_cpp engine needs llama-cpp-python, which the install builds only when asked: "
            "ORCHARD_LLAMA_CPP=1 bash scripts/install.sh (or pip install llama-cpp-python==0.3.36)"
        ) from err

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
        self.cache_slots = max(0, min(32, max_batch_size, 255 - max_batch_size))
        self._ids = max_batch_size + self.cache_slots  # sequence ids 0.._ids-1 run or cache; _ids scores
        self._cached: OrderedDict[int, list[int]] = OrderedDict()  # sequence id -> its tokens, oldest first
        self._cached_cells = 0
        self.prefix_hits = 0
        """Prompt tokens taken from the prefix cache instead of decoded (for tests and benchmarks)."""
        if gguf is None:
            self._load(*self._convert(hf_folder))
        else:
            self._load(self._load_model(gguf), None)
        self.batch = self.lib.llama_batch_init(_N_BATCH, 0, max_batch_size)  # a prompt's token is in <= n sequences
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
        params.n_seq_max = self._ids + 1
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
        self._free_ids = list(range(self._ids - 1, -1, -1))
        self._reserved = 0
        self._cached.clear()
        self._cached_cells = 0
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
        while self._waiting:
            group = self._waiting[0]
            prompt = group.seqs[0].prompt_ids
            source, reuse = self._longest_prefix(prompt)
            if not self._make_room(len(group.seqs), group.reserve, keep=source):
                break
            if source not in self._cached:  # evicted to make room after all
                source, reuse = None, 0
            self._waiting.pop(0)
            self._reserved += group.reserve
            ids = [self._free_ids.pop() for _ in group.seqs]
            self._seq_id.update((id(s), i) for s, i in zip(group.seqs, ids, strict=True))
            if source is not None:
                self._cached.move_to_end(source)
                for seq_id in ids:
                    self.lib.llama_memory_seq_cp(self.mem, source, seq_id, 0, reuse)
                self.prefix_hits += reuse
            entries.extend((prompt[pos], pos, ids, pos == len(prompt) - 1) for pos in range(reuse, len(prompt)))
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

    def _longest_prefix(self, prompt: list[int]) -> tuple[int | None, int]:
        """The cached sequence sharing the longest prefix with prompt, and its length (short of the last token,
        which is decoded for its logits); (None, 0) when none shares a token."""
        best, best_len = None, 0
        for seq_id, tokens in self._cached.items():
            n = 0
            for a, b in zip(tokens, prompt[:-1], strict=False):
                if a != b:
                    break
                n += 1
            if n > best_len:
                best, best_len = seq_id, n
        return best, best_len

    def _make_room(self, ids: int, cells: int, keep: int | None = None) -> bool:
        """Whether `ids` sequence ids and `cells` KV cells are free beside the running requests, evicting cached
        prefixes (oldest first, `keep` last) until they are."""

        def short() -> bool:
            busy = self._reserved + self._cached_cells
            return len(self._free_ids) < ids or (busy > 0 and busy + cells > self.kv_tokens)

        for seq_id in [i for i in self._cached if i != keep] + ([keep] if keep is not None else []):
            if not short():
                break
            self._evict(seq_id)
        # Alone, a request may use the whole cache (its prompt + max_tokens fit the context).
        return not short() or (not self._seq_id and len(self._free_ids) >= ids)

    def _evict(self, seq_id: int) -> None:
        self._cached_cells -= len(self._cached.pop(seq_id))
        self.lib.llama_memory_seq_rm(self.mem, seq_id, -1, -1)
        self._free_ids.append(seq_id)

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
            self._reserved -= seq.params.max_tokens
            if group.live == 0:
                self._reserved -= group.prompt_cells
            if seq.aborted or not self.cache_slots:
                self.lib.llama_memory_seq_rm(self.mem, seq_id, -1, -1)
                self._free_ids.append(seq_id)
                continue
            # Its cells stay as a cached prefix: the prompt and all it generated but the last token (not decoded).
            self._cached[seq_id] = seq.prompt_ids + seq.out_ids[:-1]
            self._cached_cells += len(self._cached[seq_id])
            if len(self._cached) > self.cache_slots:
                self._evict(next(iter(self._cached)))

    # -- scoring ------------------------------------------------------------------------------------------------

    def score(self, prompt_ids: list[int], continuation_ids: list[int], top_logprobs: int) -> ScoreResult:
        """Log-probs of the continuation: prompt + continuation decoded as one more sequence, then removed."""
        ids = prompt_ids + continuation_ids
        if not self._make_room(0, len(ids)):
            raise ResourceExhausted("the llama.cpp KV cache is full of running requests; retry later", retry_after=1.0)
        first = len(prompt_ids) - 1  # the position whose logits predict the first continuation token
        seq_id = self._ids
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

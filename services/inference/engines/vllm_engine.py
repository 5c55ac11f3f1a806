"""The `vllm` engine: the same interface over vLLM's async engine, for GPU machines (`pip install orchard[vllm]`).

vLLM batches continuously, samples (n, seed, stop strings) and computes log-probs itself; this module only maps
our requests onto `vllm.SamplingParams` and its outputs back to `TokenEvent`s. The mapping functions are pure and
take vLLM's output objects by their attributes, so they are unit-tested without vLLM; bench/vllm_engine.py runs
the real engine on a GPU. vLLM's default logprobs mode is the raw model distribution, as our interface promises.
A vision-language model (vLLM's `is_multimodal_model`) takes images: its chat template (the processor's) renders
{"type": "image"} content parts as placeholder tokens, and `generate` hands vLLM the decoded images with the ids.
"""

from __future__ import annotations

import asyncio
import io
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol

from orchard.errors import FailedPrecondition, InvalidArgument
from orchard.services.inference.engines.base import (
    ChatMessage,
    Engine,
    FinishReason,
    ModelInfo,
    SamplingParams,
    ScoreResult,
    TokenEvent,
    ToolSpec,
    seed_bits,
    vision_unsupported,
)
from orchard.services.inference.settings import InferenceSettings


class Logprob(Protocol):
    """What vllm.sequence.Logprob offers."""

    logprob: float


class CompletionOutput(Protocol):
    """What vllm.outputs.CompletionOutput offers (in DELTA output mode: only the new part)."""

    index: int
    text: str
    token_ids: Any  # a sequence of ints
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """Keyword arguments of vllm.SamplingParams for our params (DELTA output: each output holds only new tokens)."""
    want = params.logprobs or params.top_logprobs > 0
    return {
        "n": params.n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k or -1,  # -1 = no cut, accepted by every vLLM release
        "stop": list(params.stop),
        "seed": None if params.seed is None else seed_bits(params.seed),  # vLLM's torch generator keeps 32 bits
        # vLLM's logprobs=k returns the sampled token's log-prob plus the k most likely; 0 = the sampled one only.
        "logprobs": params.top_logprobs if want else None,
        "skip_special_tokens": True,
    }


def token_event(out: CompletionOutput, params: SamplingParams) -> TokenEvent:
    """One vLLM delta output as our event."""
    ids = [int(t) for t in out.token_ids]
    lps: list[float] = []
    tops: list[list[tuple[int, float]]] = []
    for token, position in zip(ids, out.logprobs or [], strict=False):
        if params.logprobs:
            lps.append(float(position[token].logprob))
        if params.top_logprobs:
            ranked = sorted(position.items(), key=lambda kv: kv[1].logprob, reverse=True)[: params.top_logprobs]
            tops.append([(int(t), float(lp.logprob)) for t, lp in ranked])
    finish: FinishReason | None = None
    if out.finish_reason is not None:
        finish = out.finish_reason if out.finish_reason in ("stop", "length", "abort") else "stop"  # type: ignore[assignment]
    stop_sequence = out.stop_reason if isinstance(out.stop_reason, str) else ""
    return TokenEvent(
        index=out.index,
        token_ids=ids,
        text=out.text,
        logprobs=lps,
        top_logprobs=tops,
        finish_reason=finish,
        stop_sequence=stop_sequence,
    )


def score_result(
    prompt_logprobs: list[dict[int, Logprob] | None], prompt_len: int, continuation: list[int], top_logprobs: int
) -> ScoreResult:
    """ScoreTokens from vLLM's prompt_logprobs of prompt + continuation (entry 0 is None: nothing precedes it)."""
    positions = prompt_logprobs[prompt_len : prompt_len + len(continuation)]
    lps, tops = [], []
    for token, position in zip(continuation, positions, strict=True):
        assert position is not None
        lps.append(float(position[token].logprob))
        if top_logprobs:
            ranked = sorted(position.items(), key=lambda kv: kv[1].logprob, reverse=True)[:top_logprobs]
            tops.append([(int(t), float(lp.logprob)) for t, lp in ranked])
    return ScoreResult(logprobs=lps, top_logprobs=tops)


def decode_images(images: Sequence[bytes]) -> list[Any]:
    """The prompt's encoded images as RGB PIL images; InvalidArgument names the first that does not decode."""
    from PIL import Image, UnidentifiedImageError  # vLLM depends on Pillow; the CPU install does not

    decoded = []
    for k, data in enumerate(images):
        try:
            with Image.open(io.BytesIO(data)) as image:
                decoded.append(image.convert("RGB"))
        except (UnidentifiedImageError, OSError) as err:
            raise InvalidArgument(
                f"images[{k}] (image {k} of the prompt) does not decode as an image ({err}); send PNG or JPEG bytes",
                field=f"images[{k}]",
            ) from None
    return decoded


def engine_prompt(prompt_ids: list[int], images: list[Any]) -> dict[str, Any]:
    """vLLM's prompt for exact token ids and their decoded images, in placeholder order."""
    if not images:
        return {"prompt_token_ids": prompt_ids}
    return {"prompt_token_ids": prompt_ids, "multi_modal_data": {"image": images}}


class VllmEngine(Engine):
    """vLLM's AsyncLLM engine for one model (a hub id or a local folder)."""

    def __init__(self, settings: InferenceSettings) -> None:
        if not settings.model:
            raise FailedPrecondition("the vllm engine needs a model: set --model to a hub id or a checkpoint folder")
        self._settings = settings
        self._engine: Any = None
        self._tokenizer: Any = None
        self._chat_template: str | None = None
        """The processor's chat template for a vision model (it renders image parts); None: the tokenizer's."""
        self._info: ModelInfo | None = None

    @property
    def info(self) -> ModelInfo:
        assert self._info is not None, "engine not started"
        return self._info

    async def start(self) -> None:
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as err:
            raise FailedPrecondition(f"the vllm engine needs vLLM: pip install 'orchard[vllm]' ({err})") from None
        from transformers import AutoProcessor, AutoTokenizer

        s = self._settings
        args = AsyncEngineArgs(
            model=s.model,
            gpu_memory_utilization=s.gpu_memory_utilization,
            max_model_len=s.max_model_len,
            max_num_seqs=s.max_batch_size,
            max_logprobs=20,
        )
        self._engine = AsyncLLM.from_engine_args(args)
        self._tokenizer = AutoTokenizer.from_pretrained(s.model)
        config = self._engine.model_config
        vision = bool(config.is_multimodal_model)
        if vision:
            self._chat_template = AutoProcessor.from_pretrained(s.model).chat_template
        model_id = s.model_id or s.model.rstrip("/").split("/")[-1]
        self._info = ModelInfo(
            model_id=model_id,
            engine="vllm",
            checkpoint_path=s.model,
            weights_version=model_id,
            max_context_tokens=int(config.max_model_len),
            vocab_size=int(config.get_vocab_size()),
            load_time=time.time(),
            vision=vision,
        )

    async def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, images: Sequence[bytes] = ()
    ) -> AsyncGenerator[TokenEvent, None]:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        if images and not self.info.vision:
            raise vision_unsupported(self.info, "the prompt")
        decoded = await asyncio.to_thread(decode_images, images) if images else []
        request_id = uuid.uuid4().hex
        sampling = VllmSamplingParams(**sampling_kwargs(params), output_kind=RequestOutputKind.DELTA)
        done = False
        try:
            async for output in self._engine.generate(engine_prompt(prompt_ids, decoded), sampling, request_id):
                for out in output.outputs:
                    yield token_event(out, params)
            done = True
        finally:
            if not done:  # client gone or deadline: free the sequences in vLLM too
                await self._engine.abort(request_id)

    async def score(self, prompt_ids: list[int], continuation_ids: list[int], top_logprobs: int = 0) -> ScoreResult:
        from vllm import SamplingParams as VllmSamplingParams

        sampling = VllmSamplingParams(max_tokens=1, prompt_logprobs=top_logprobs, temperature=0)
        final = None
        async for output in self._engine.generate(
            {"prompt_token_ids": prompt_ids + continuation_ids}, sampling, uuid.uuid4().hex
        ):
            final = output
        assert final is not None and final.prompt_logprobs is not None
        return score_result(final.prompt_logprobs, len(prompt_ids), continuation_ids, top_logprobs)

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def token_strings(self, token_ids: list[int]) -> list[str]:
        return [self._tokenizer.decode([t]) for t in token_ids]

    def detokenize(self, token_ids: list[int]) -> str:
        return str(self._tokenizer.decode(token_ids, skip_special_tokens=True))

    def apply_chat_template(
        self,
        messages: list[ChatMessage],
        tools: list[ToolSpec] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        return str(
            self._tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                chat_template=self._chat_template,
                **(template_kwargs or {}),
            )
        )

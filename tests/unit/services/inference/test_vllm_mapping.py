"""The vllm engine's request/response mapping. There is no GPU and no vLLM on this machine, so vLLM's output
objects are stood in for by dataclasses with the same attributes, and vLLM's engine and module by small fakes that
record what they get (bench/vllm_engine.py runs the real engine)."""

from __future__ import annotations

import io
import math
import sys
import time
import types
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from orchard.errors import InvalidArgument, Unimplemented
from orchard.inference.v1 import inference_pb2 as pb
from orchard.services.inference.engines.base import ModelInfo, SamplingParams
from orchard.services.inference.engines.vllm_engine import VllmEngine, sampling_kwargs, score_result, token_event
from orchard.services.inference.servicer import InferenceServicer
from orchard.services.inference.settings import InferenceSettings
from orchard.types.v1 import types_pb2 as tpb


@dataclass
class FakeLogprob:
    """vllm.sequence.Logprob's fields."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FakeCompletionOutput:
    """vllm.outputs.CompletionOutput's fields."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, FakeLogprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: None = None
    extra: dict[str, object] = field(default_factory=dict)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            SamplingParams(max_tokens=8),
            {
                "n": 1,
                "max_tokens": 8,
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": -1,
                "stop": [],
                "seed": None,
                "logprobs": None,
                "skip_special_tokens": True,
            },
        ),
        (
            SamplingParams(
                max_tokens=3, temperature=0.0, top_p=0.9, top_k=40, stop=("\n",), seed=7, n=4, logprobs=True
            ),
            {
                "n": 4,
                "max_tokens": 3,
                "temperature": 0.0,
                "top_p": 0.9,
                "top_k": 40,
                "stop": ["\n"],
                "seed": 7,
                "logprobs": 0,
                "skip_special_tokens": True,
            },
        ),
        (
            SamplingParams(max_tokens=3, top_logprobs=5),
            {
                "n": 1,
                "max_tokens": 3,
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": -1,
                "stop": [],
                "seed": None,
                "logprobs": 5,
                "skip_special_tokens": True,
            },
        ),
    ],
)
def test_sampling_kwargs(params: SamplingParams, expected: dict[str, object]) -> None:
    """Our params map 1:1 onto vllm.SamplingParams; logprobs=0 asks vLLM for the sampled token's only."""
    assert sampling_kwargs(params) == expected


def test_token_event_with_logprobs_and_tops() -> None:
    """A delta output's tokens, sampled log-probs and ranked alternatives come through per position."""
    out = FakeCompletionOutput(
        index=1,
        text=" Paris",
        token_ids=[5, 9],
        logprobs=[
            {5: FakeLogprob(-0.1, 1), 6: FakeLogprob(-2.5, 2), 7: FakeLogprob(-3.0, 3)},
            {9: FakeLogprob(-1.2, 2), 3: FakeLogprob(-0.4, 1)},
        ],
    )
    event = token_event(out, SamplingParams(max_tokens=4, logprobs=True, top_logprobs=2))
    assert (event.index, event.token_ids, event.text, event.finish_reason) == (1, [5, 9], " Paris", None)
    assert event.logprobs == [-0.1, -1.2]
    assert event.top_logprobs == [[(5, -0.1), (6, -2.5)], [(3, -0.4), (9, -1.2)]]


@pytest.mark.parametrize(
    ("finish", "stop_reason", "expected"),
    [
        ("stop", None, ("stop", "")),
        ("stop", "\n\n", ("stop", "\n\n")),
        ("stop", 2, ("stop", "")),
        ("length", None, ("length", "")),
        ("abort", None, ("abort", "")),
    ],
)
def test_token_event_finish(finish: str, stop_reason: int | str | None, expected: tuple[str, str]) -> None:
    """Finish reasons map through; a stop string (not a stop token id) becomes stop_sequence."""
    out = FakeCompletionOutput(index=0, text="", token_ids=[2], finish_reason=finish, stop_reason=stop_reason)
    event = token_event(out, SamplingParams(max_tokens=4))
    assert (event.finish_reason, event.stop_sequence) == expected and event.logprobs == []


def test_score_result_from_prompt_logprobs() -> None:
    """ScoreTokens reads the continuation's positions of prompt_logprobs (entry 0 is None)."""
    prompt_logprobs = [
        None,
        {4: FakeLogprob(-1.0)},
        {8: FakeLogprob(-0.5), 1: FakeLogprob(-2.0)},
        {9: FakeLogprob(-3.0), 2: FakeLogprob(-0.1)},
    ]
    result = score_result(prompt_logprobs, prompt_len=2, continuation=[8, 9], top_logprobs=1)  # type: ignore[arg-type]
    assert result.logprobs == [-0.5, -3.0]
    assert result.top_logprobs == [[(8, -0.5)], [(2, -0.1)]]
    assert all(math.isfinite(x) for x in result.logprobs)


# -- images: a vision-language model through the servicer and the engine, over fakes of vLLM --------------------------

PROCESSOR_TEMPLATE = "{# the processor's chat template #}"


class FakeAsyncLLM:
    """Stands in for vLLM's AsyncLLM: records each prompt and answers one finished token."""

    def __init__(self) -> None:
        self.prompts: list[dict[str, Any]] = []

    async def generate(self, prompt: dict[str, Any], sampling: object, request_id: str) -> AsyncIterator[Any]:
        self.prompts.append(prompt)
        yield types.SimpleNamespace(
            outputs=[FakeCompletionOutput(index=0, text="ok", token_ids=[7], finish_reason="stop")]
        )

    async def abort(self, request_id: str) -> None:
        raise AssertionError("a finished request is not aborted")


class FakeTokenizer:
    """Stands in for the Hugging Face tokenizer: records each chat-template call and renders image parts as
    <image> (a real VLM template renders its placeholder tokens there)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, Any]], str | None]] = []

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: object = None,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
    ) -> str:
        self.calls.append((messages, chat_template))

        def text(content: str | list[dict[str, str]]) -> str:
            if isinstance(content, str):
                return content
            return "".join("<image>" if part["type"] == "image" else part["text"] for part in content)

        return "".join(f"{m['role']}: {text(m['content'])}\n" for m in messages)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 100 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return ""


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two names VllmEngine.generate imports from vLLM."""
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kwargs: kwargs  # type: ignore[attr-defined]
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = types.SimpleNamespace(DELTA="delta")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)


def engine_over_fakes(vision: bool) -> VllmEngine:
    """A VllmEngine as start() leaves it for a (vision-language or text) model, over the fakes above."""
    engine = VllmEngine(InferenceSettings(engine="vllm", model="Qwen/Qwen2.5-VL-3B-Instruct"))
    engine._engine = FakeAsyncLLM()
    engine._tokenizer = FakeTokenizer()
    engine._chat_template = PROCESSOR_TEMPLATE if vision else None
    engine._info = ModelInfo(
        model_id="Qwen2.5-VL-3B-Instruct",
        engine="vllm",
        checkpoint_path="Qwen/Qwen2.5-VL-3B-Instruct",
        weights_version="v0",
        max_context_tokens=4096,
        vocab_size=100,
        load_time=time.time(),
        vision=vision,
    )
    return engine


def png(width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


def screenshot(width: int, height: int) -> tpb.Image:
    return tpb.Image(data=png(width, height), mime_type="image/png", width=width, height=height)


@pytest.fixture
def pillow() -> None:
    pytest.importorskip("PIL", reason="Pillow (which vLLM installs) decodes the images")


async def test_generate_with_images_reaches_vllm_as_multi_modal_data(fake_vllm: None, pillow: None) -> None:
    """Generate's images reach vLLM decoded, in order, next to the exact token ids."""
    engine = engine_over_fakes(vision=True)
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[1, 2, 3]),
        sampling=pb.SamplingParams(max_tokens=4),
        images=[screenshot(4, 3), screenshot(2, 5)],
    )
    response = await InferenceServicer(engine, max_n=4).Generate(request, None)  # type: ignore[arg-type]
    assert list(response.choices[0].token_ids) == [7] and response.choices[0].text == "ok"
    [prompt] = engine._engine.prompts
    assert prompt["prompt_token_ids"] == [1, 2, 3]
    assert [(i.mode, i.size) for i in prompt["multi_modal_data"]["image"]] == [("RGB", (4, 3)), ("RGB", (2, 5))]


async def test_chat_renders_image_parts_and_passes_the_images(fake_vllm: None, pillow: None) -> None:
    """Chat renders image parts through the processor's template and hands vLLM the conversation's images."""
    engine = engine_over_fakes(vision=True)
    user = tpb.Message(role=tpb.ROLE_USER)
    user.parts.add(text="What is on the screen?")
    user.parts.add(image=screenshot(3, 3))
    request = pb.ChatRequest(
        messages=[tpb.Message(role=tpb.ROLE_SYSTEM, content="Be brief."), user],
        sampling=pb.SamplingParams(max_tokens=4),
    )
    await InferenceServicer(engine, max_n=4).Chat(request, None)  # type: ignore[arg-type]
    messages, template = engine._tokenizer.calls[-1]
    assert template == PROCESSOR_TEMPLATE
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is on the screen?"}, {"type": "image"}]},
    ]
    [prompt] = engine._engine.prompts
    assert prompt["prompt_token_ids"] == engine.tokenize("system: Be brief.\nuser: What is on the screen?<image>\n")
    assert [i.size for i in prompt["multi_modal_data"]["image"]] == [(3, 3)]


async def test_apply_chat_template_renders_image_placeholders(fake_vllm: None) -> None:
    """ApplyChatTemplate of a conversation with an image renders its placeholder where the part is."""
    user = tpb.Message(
        role=tpb.ROLE_USER,
        parts=[tpb.ContentPart(image=tpb.Image(data=b"png")), tpb.ContentPart(text="Click the red button.")],
    )
    request = pb.ApplyChatTemplateRequest(prompt=pb.ChatPrompt(messages=[user], add_generation_prompt=True))
    response = await InferenceServicer(engine_over_fakes(vision=True), 4).ApplyChatTemplate(request, None)  # type: ignore[arg-type]
    assert response.text == "user: <image>Click the red button.\n"


async def test_text_generate_sends_no_multi_modal_data(fake_vllm: None) -> None:
    engine = engine_over_fakes(vision=True)
    request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 2]), sampling=pb.SamplingParams(max_tokens=2))
    await InferenceServicer(engine, 4).Generate(request, None)  # type: ignore[arg-type]
    assert engine._engine.prompts == [{"prompt_token_ids": [1, 2]}]


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (tpb.Image(data=b"not an image"), "images[1] (image 1 of the prompt) does not decode as an image"),
        (tpb.Image(url="https://example.com/a.png"), "images[1] has no data"),
    ],
)
async def test_bad_images_name_their_index(fake_vllm: None, pillow: None, bad: tpb.Image, needle: str) -> None:
    """An image that does not decode (or has no bytes) is INVALID_ARGUMENT naming its index; nothing reaches vLLM."""
    engine = engine_over_fakes(vision=True)
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[1]), sampling=pb.SamplingParams(max_tokens=2), images=[screenshot(2, 2), bad]
    )
    with pytest.raises(InvalidArgument) as err:
        await InferenceServicer(engine, 4).Generate(request, None)  # type: ignore[arg-type]
    assert needle in str(err.value) and engine._engine.prompts == []


async def test_text_only_vllm_model_refuses_images(fake_vllm: None) -> None:
    """A text model on vLLM refuses images as the CPU engine does: UNIMPLEMENTED, VISION_UNSUPPORTED."""
    engine = engine_over_fakes(vision=False)
    request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1]), images=[tpb.Image(data=b"png")])
    with pytest.raises(Unimplemented, match="takes text only; serve a vision-language model") as err:
        await InferenceServicer(engine, 4).Generate(request, None)  # type: ignore[arg-type]
    assert err.value.reason == "VISION_UNSUPPORTED"
    with pytest.raises(Unimplemented, match="the prompt holds an image"):
        async for _ in engine.generate([1], SamplingParams(max_tokens=1), [b"png"]):
            pass

"""A job's training data: trajectories from the experience store or a JSONL file, decontaminated, rendered into
token samples through the base model's own chat template.

Choices [I]:
- Samples are rendered from each trajectory's OpenAI-format `messages` (not its stored token ids): the stored ids
  are the acting policy's tokenizer's, which need not be the base model's (a teacher, a scripted policy, a proxy
  record). Tools are rendered the way the inference service renders them (`orchard.chat.templates`),
  so the trained text is what the policy sees when it serves.
- The loss mask covers an assistant turn's whole rendered reply, end-of-turn token included (the whitespace a
  template adds after it is not trained: the model stops at the end token); found by rendering
  each turn's prefix and end and mapping the character span onto tokens with the tokenizer's offsets.
- A record whose task id is in a declared evaluation set fails the job before training (decontamination).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from orchard import clients
from orchard.chat.openai_format import from_openai, to_openai
from orchard.chat.templates import render
from orchard.chat.tools import tool_spec
from orchard.errors import FailedPrecondition, InvalidArgument, OrchardError
from orchard.experience.v1 import experience_pb2 as epb
from orchard.tasks.instance import eval_task_ids
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers.sft import Sample
from orchard.types.v1 import types_pb2 as tpb


class TemplateRenderer:
    """The base model's chat template, shaped like the inference engine `chat.render` expects."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **(template_kwargs or {}),
            )
        )


def render_sample(
    renderer: TemplateRenderer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    trained_turns: set[int] | None = None,
) -> Sample:
    """The conversation as token ids with mask 1 on the assistant turns in `trained_turns` (the k-th assistant
    message is turn k; every turn when None)."""
    full = render(renderer, messages, tools, add_generation_prompt=False)
    spans: list[tuple[int, int]] = []
    turn = -1
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        turn += 1
        if trained_turns is not None and turn not in trained_turns:
            continue
        start = len(render(renderer, messages[:i], tools, add_generation_prompt=True)) if i else 0
        through = render(renderer, messages[: i + 1], tools, add_generation_prompt=False)
        end = len(through.rstrip())  # the newline a template puts after the end token is not the model's output
        if not full.startswith(through):
            raise InvalidArgument(
                f"the chat template does not render turn {turn} as a prefix of the conversation; "
                "it cannot be trained turn by turn"
            )
        spans.append((start, end))
    encoded = renderer.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= lo and hi <= b and hi > lo for a, b in spans)) for lo, hi in encoded["offset_mapping"]]
    return Sample(list(encoded["input_ids"]), mask)


def trajectory_sample(
    renderer: TemplateRenderer, traj: tpb.Trajectory, trained_steps: set[int] | None = None
) -> Sample:
    """A stored trajectory as a sample; `trained_steps` are step indices (step k is the k-th assistant turn)."""
    return render_sample(
        renderer,
        [to_openai(m) for m in traj.messages],
        [tool_spec(t, i) for i, t in enumerate(traj.tools)],
        trained_steps,
    )


@dataclass
class Dataset:
    """The records a job trains on."""

    trajectories: list[tpb.Trajectory]
    openai_samples: list[dict[str, Any]]
    """Records of a JSONL file in the OpenAI format ({"messages": [...], "tools": [...]})."""

    def __len__(self) -> int:
        return len(self.trajectories) + len(self.openai_samples)


async def load_dataset(source: pb.DatasetSource, experience_address: str, *, allow_unresolved: bool = True) -> Dataset:
    """The records `source` selects, decontaminated against its eval_task_files."""
    kind = source.WhichOneof("source")
    if kind == "experience":
        trajectories = [t async for t in _export(source, experience_address)]
        data = Dataset(trajectories, [])
    elif kind == "path":
        data = _read_jsonl(Path(source.path), source.limit)
    else:
        raise InvalidArgument(
            "dataset has no source; set dataset.experience (a trajectory filter) or dataset.path",
            field="config.dataset",
        )
    if source.distinct_patches:
        seen: set[tuple[str, str]] = set()
        kept = []
        for t in data.trajectories:
            key = (t.task_id, t.patch_hash)
            if not t.patch_hash or key not in seen:
                seen.add(key)
                kept.append(t)
        data.trajectories = kept
    decontaminate(data, list(source.eval_task_files))
    if not len(data):
        raise FailedPrecondition(
            f"the dataset selects no records ({json_format.MessageToJson(source, indent=None)}); "
            "check the filter or the file"
        )
    return data


def decontaminate(data: Dataset, eval_task_files: list[str]) -> None:
    """Raise FailedPrecondition when a record's task is in one of the evaluation sets."""
    for path in eval_task_files:
        eval_ids = eval_task_ids(path)
        leaked = sorted(
            {t.task_id for t in data.trajectories if t.task_id in eval_ids}
            | {
                str(s.get("instance_id") or s.get("task_id"))
                for s in data.openai_samples
                if (s.get("instance_id") or s.get("task_id")) in eval_ids
            }
        )
        if leaked:
            raise FailedPrecondition(
                f"{len(leaked)} task(s) of the dataset are in the evaluation set {path}: {leaked[:5]}; training on "
                "them would contaminate the evaluation. Exclude them (filter.exclude_task_ids) or drop the file."
            )


async def _export(source: pb.DatasetSource, address: str) -> AsyncIterator[tpb.Trajectory]:
    request = epb.ExportTrajectoriesRequest(
        filter=source.experience,
        limit=source.limit,
        distinct_patches=source.distinct_patches,
        purpose=epb.EXPORT_PURPOSE_TRAINING,
    )
    try:
        async with clients.connect("experience", address) as experience:
            async for response in experience.server_stream("ExportTrajectories", request, timeout=600):
                yield response.trajectory
    except OrchardError as err:
        raise FailedPrecondition(
            f"cannot read the dataset from the experience store at {address}: {err.code.name}: {err.message}"
        ) from None


def _read_jsonl(path: Path, limit: int) -> Dataset:
    if not path.is_file():
        raise InvalidArgument(f"dataset file {path} not found", field="config.dataset.path")
    data = Dataset([], [])
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise InvalidArgument(f"{path}:{n} is not JSON: {err}", field="config.dataset.path") from None
            if "messages" in record and "trajectory_id" not in record and "trajectoryId" not in record:
                if not isinstance(record["messages"], list) or not record["messages"]:
                    raise InvalidArgument(f"{path}:{n}: messages must be a non-empty list", field="config.dataset.path")
                data.openai_samples.append(record)
            else:
                try:
                    data.trajectories.append(
                        json_format.ParseDict(record, tpb.Trajectory(), ignore_unknown_fields=True)
                    )
                except json_format.ParseError as err:
                    raise InvalidArgument(
                        f"{path}:{n} is neither an OpenAI sample nor a trajectory: {err}", field="config.dataset.path"
                    ) from None
            if limit and len(data) >= limit:
                break
    return data


def openai_sample(renderer: TemplateRenderer, record: dict[str, Any]) -> Sample:
    """An OpenAI-format record ({"messages", "tools"}) as a sample, every assistant turn trained."""
    messages = [to_openai(from_openai(m)) for m in record["messages"]]  # normalised like stored messages
    return render_sample(renderer, messages, list(record.get("tools") or []))


def resolved(traj: tpb.Trajectory) -> bool:
    """Whether the latest outcome reward says the task was resolved."""
    outcomes = [r for r in traj.rewards if r.kind == tpb.REWARD_KIND_OUTCOME]
    return bool(outcomes) and outcomes[-1].outcome.status == tpb.OUTCOME_STATUS_RESOLVED

"""Inference engines by name. Adding one means one new module and one line here."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from orchard.errors import InvalidArgument

if TYPE_CHECKING:
    from orchard.services.inference.engines.base import Engine
    from orchard.services.inference.settings import InferenceSettings

ENGINES: dict[str, str] = {
    "transformers": "orchard.services.inference.engines.transformers_engine:TransformersEngine",
    "llama_cpp": "orchard.services.inference.engines.llama_cpp_engine:LlamaCppEngine",
    "vllm": "orchard.services.inference.engines.vllm_engine:VllmEngine",
}


def load_engine(settings: InferenceSettings) -> Engine:
    """The engine named by settings.engine, imported lazily (torch and vllm are heavy), not yet started."""
    try:
        target = ENGINES[settings.engine]
    except KeyError:
        raise InvalidArgument(
            f"unknown inference engine {settings.engine!r}; valid: {', '.join(sorted(ENGINES))}", field="engine"
        ) from None
    module, _, cls = target.partition(":")
    engine: Engine = getattr(importlib.import_module(module), cls)(settings)
    return engine

"""compiled_engine: a compiled inference runtime for hybrid Gated-DeltaNet + GQA models (Qwen3.5, Qwen3-Next).

The public names are imported on first use (PEP 562), so that importing one low module of the package
(``compiled_engine.model``, ``compiled_engine.config``) does not import the engine above it (docs/ARCHITECTURE.md,
"Layers").
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "CompletionOutput": "compiled_engine.outputs",
    "LLM": "compiled_engine.llm",
    "LLMEngine": "compiled_engine.engine",
    "RequestOutput": "compiled_engine.outputs",
    "RequestOutputKind": "compiled_engine.sampling_params",
    "Runtime": "compiled_engine.runtime",
    "RuntimeConfig": "compiled_engine.config",
    "SamplingParams": "compiled_engine.sampling_params",
    "StructuredOutputsParams": "compiled_engine.sampling_params",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'compiled_engine' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))

"""compiled_engine: a compiled inference runtime for hybrid Gated-DeltaNet + GQA models (Qwen3.5, Qwen3-Next)."""

from compiled_engine.engine import LLMEngine, RequestOutput
from compiled_engine.llm import LLM
from compiled_engine.runtime import Runtime, RuntimeConfig
from compiled_engine.sampling_params import RequestOutputKind, SamplingParams

__all__ = ["LLM", "LLMEngine", "RequestOutput", "RequestOutputKind", "Runtime", "RuntimeConfig", "SamplingParams"]

"""SamplingParams: how to pick each next token and when to stop (vLLM's names and defaults)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RequestOutputKind(enum.Enum):
    """Which steps return an output for a request (vLLM's names)."""

    CUMULATIVE = "cumulative"  # every step that produced a token: all tokens so far
    FINAL_ONLY = "final_only"  # only the step that finished it (LLM.generate: nothing per step to build or copy)


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens whose probability reaches top_p; in (0, 1]
    top_k: int = 0  # keep the k most likely tokens; 0 (or -1) = all
    min_p: float = 0.0  # drop tokens less likely than min_p * (probability of the most likely token); in [0, 1]
    max_tokens: int = 16  # generated tokens at most
    min_tokens: int = 0  # EOS and stop tokens are suppressed until this many tokens are generated
    stop_token_ids: list[int] | None = None  # finish when one of these is generated (it is kept in the output)
    ignore_eos: bool = False  # keep generating past the checkpoint's EOS token(s)
    seed: int | None = None  # per-request seed: the same output whatever else is in the batch
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE  # engine.step(); LLM.generate uses FINAL_ONLY

    def __post_init__(self):
        if self.top_k == -1:
            self.top_k = 0
        self.stop_token_ids = list(self.stop_token_ids or [])
        checks = [
            ("temperature", self.temperature >= 0, "must be >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= 0, "must be a non-negative int (0 = off)"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("max_tokens", isinstance(self.max_tokens, int) and self.max_tokens >= 1, "must be an int >= 1"),
            ("min_tokens", isinstance(self.min_tokens, int) and 0 <= self.min_tokens, "must be an int >= 0"),
            ("output_kind", isinstance(self.output_kind, RequestOutputKind), "must be a RequestOutputKind"),
            ("seed", self.seed is None or (isinstance(self.seed, int) and -(2**63) <= self.seed < 2**63),
             "must be None or an int in [-2**63, 2**63) (it travels as int64)"),
        ]
        for field_name, ok, rule in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{field_name} {rule}, got {getattr(self, field_name)!r}")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"SamplingParams.min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

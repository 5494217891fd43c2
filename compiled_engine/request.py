"""Request: one request as the engine holds it, from ``LLMEngine.add_request`` to its finish: its sequence, its
params and seed, and what it has produced so far."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from compiled_engine.detokenizer import IncrementalDetokenizer
from compiled_engine.outputs import TokenLogprobs
from compiled_engine.sampling_params import SamplingParams
from compiled_engine.sequence import Sequence


@dataclass(eq=False)
class Request:
    request_id: str
    seq: Sequence
    params: SamplingParams
    seed: int
    stop_ids: frozenset[int]  # EOS (unless ignore_eos) and stop_token_ids
    prompt_token_ids: list[int]  # a copy made once; every output of the request shares it (treat it as read-only)
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finished_time: float | None = None
    finish_reason: str | None = None
    drafts: list[int] | None = None  # speculative decoding: the MTP layer's drafts after the last token
    stop_reason: str | int | None = None
    # The text so far, token by token: for requests that stream or have stop strings (with a tokenizer).
    detokenizer: IncrementalDetokenizer | None = None
    logprobs: list[TokenLogprobs] | None = None  # with SamplingParams.logprobs
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # with SamplingParams.prompt_logprobs, as computed
    grammar: object | None = None  # structured outputs: an xgrammar GrammarMatcher past the accepted tokens
    bad_words: list[tuple[int, ...]] | None = None  # SamplingParams.bad_words as token sequences (sampler.bad_word_ids)
    _prompt_array: np.ndarray | None = field(default=None, repr=False)
    # The output tokens read back so far, converted once: the first ``_num_converted`` entries of a buffer that
    # doubles when full (a token is copied a constant number of times on average, not once a step).
    _output_buffer: np.ndarray = field(default_factory=lambda: np.empty(16, dtype=np.int64), repr=False)
    _num_converted: int = 0

    def wants_prompt_logprobs(self) -> bool:
        """Whether prompt tokens' logprobs are still to compute (its prefill chunks need every position's logits)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    def prompt_array(self) -> np.ndarray:
        """The prompt as an int64 array, made on first use (penalties fill a token table from it every step)."""
        if self._prompt_array is None:
            self._prompt_array = np.array(self.prompt_token_ids, dtype=np.int64)
        return self._prompt_array

    def output_array(self, n: int) -> np.ndarray:
        """The first ``n`` output tokens as an int64 array (penalties fill a token table from it every step). The
        tokens read back are converted once and kept (a step converts only its new ones); a placeholder still in
        flight is converted each time, never kept (its position gets the real token later)."""
        if n < 0:
            raise ValueError(f"output_array: {n} output tokens")
        seq = self.seq
        start = seq.num_prompt_tokens
        settled = min(n, len(seq.token_ids) - seq.num_placeholder_tokens - start)
        kept = self._num_converted
        if settled > kept:
            if settled > len(self._output_buffer):
                grown = np.empty(max(settled, 2 * len(self._output_buffer)), dtype=np.int64)
                grown[:kept] = self._output_buffer[:kept]
                self._output_buffer = grown
            self._output_buffer[kept:settled] = seq.token_ids[start + kept : start + settled]
            self._num_converted = kept = settled
        if n <= kept:
            return self._output_buffer[:n]
        rest = seq.token_ids[start + kept : start + n]
        return np.concatenate([self._output_buffer[:kept], np.array(rest, dtype=np.int64)])

    def reads_last_token(self) -> bool:
        """Whether its next token's logits depend on its last token on the host (a grammar's mask; a bad word of
        several tokens, matched against the output's end): it never runs ahead of a token still in flight."""
        return self.grammar is not None or any(len(word) > 1 for word in self.bad_words or ())

    def shows_last_token_text(self) -> bool:
        """Whether the output text includes its last token's: not when it is the stop token (or EOS) that finished
        the request (vLLM's default; it stays in token_ids), unless ``include_stop_str_in_output``."""
        by_token = self.finish_reason == "stop" and not isinstance(self.stop_reason, str)
        return not by_token or self.params.include_stop_str_in_output

    def suppressing(self) -> bool:
        """Whether its stop tokens are still suppressed (fewer than min_tokens generated)."""
        return self.seq.num_generated_tokens < self.params.min_tokens and bool(self.stop_ids)

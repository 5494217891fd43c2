"""What a request's steps return (vLLM's shapes): ``RequestOutput``, its ``CompletionOutput`` view, and the
``TokenLogprobs`` of a token."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprobs:
    """A generated token's log-probability and the ``SamplingParams.logprobs`` most likely tokens' (id, logprob),
    most likely first, from the logits of the step that chose it (ops/logprobs.py)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class CompletionOutput:
    """vLLM's view of one completion (``RequestOutput.outputs[0]``), for code written against vLLM's API. Our logprobs
    are :class:`TokenLogprobs` (vLLM's: a dict per token); ``cumulative_logprob`` is their sum when asked for."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None
    stop_reason: str | int | None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens so far
    new_token_ids: list[int]  # generated in the step that returned this output
    finished: bool
    # "stop" (EOS, a stop token or a stop string), "length" (max_tokens / max_model_len), "abort"
    finish_reason: str | None
    # The generated text: when finished (with a tokenizer), and at every output of a request that streams
    # (output_kind CUMULATIVE) or has stop strings: so far, less what may begin a stop string (detokenizer.py).
    text: str | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that finished it (None: EOS, length)
    logprobs: list[TokenLogprobs] | None = None  # one per generated token, with SamplingParams.logprobs
    # With SamplingParams.prompt_logprobs: None for the first prompt token, then one per prompt token (once computed)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    # LLM.generate with SamplingParams.n > 1: completions 1 to n - 1 (the fields above and below are completion 0's)
    more_outputs: list[CompletionOutput] = field(default_factory=list)
    num_cached_tokens: int = 0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finished_time: float | None = None
    prompt: str | None = None  # the prompt's text where LLM.generate / LLM.chat was given text (vLLM's), else None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def outputs(self) -> list[CompletionOutput]:
        """vLLM's shape (``out.outputs[j].text``): the prompt's completions, in index order."""
        return [self.completion(0), *self.more_outputs]

    def completion(self, index: int) -> CompletionOutput:
        """This output's fields as completion ``index`` of its prompt."""
        cumulative = None if self.logprobs is None else sum(entry.logprob for entry in self.logprobs)
        return CompletionOutput(index, self.text or "", self.token_ids, cumulative, self.logprobs, self.finish_reason,
                                self.stop_reason)

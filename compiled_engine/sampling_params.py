"""SamplingParams: how to pick each next token and when to stop (vLLM's names and defaults).

Validation (``SamplingParams.validate``, run at construction and again by whoever takes params that may have been
changed since) raises ValueError naming the field:
  * float fields (temperature, top_p, min_p, the penalties) take any finite real but not a bool or a string;
    ``inf`` and ``nan`` are rejected;
  * int fields (top_k, max_tokens, min_tokens, seed, n, logprobs, prompt_logprobs, truncate_prompt_tokens) take
    any ``numbers.Integral`` (numpy ints too, stored as ``int``) but not a bool, float or string;
  * ``stop_token_ids``: None or a list/tuple/set of integer ids (Python, numpy or 0-d torch integers, stored as
    ``int``); a bare int, a string or a non-integer element is rejected;
  * ``stop``: None, a string, or a list/tuple of non-empty strings (stored as a list);
  * ``logprobs``: None or an int in [0, 20] (the chosen token's logprob plus that many top ones);
    ``prompt_logprobs`` the same, for each prompt token after the first;
  * ``presence_penalty`` and ``frequency_penalty`` in [-2, 2], ``repetition_penalty`` > 0 (vLLM's ranges);
  * ``logit_bias``: None or a dict of token ids (as above) to finite biases in [-100, 100] (OpenAI's range);
    ``allowed_token_ids``: None or a non-empty list of token ids (as ``stop_token_ids``);
  * ``structured_outputs``: None or a ``StructuredOutputsParams`` (checked when built: exactly one kind);
  * ``n``: an int >= 1, completions of the prompt (``LLM.generate`` and the server; ``LLMEngine`` takes n = 1:
    each completion is a request of its own, ``for_completion(j)``'s params);
  * a temperature below ``SAMPLING_EPS`` (1e-5, vLLM's ``_SAMPLING_EPS``) is greedy: it is stored as 0, so every
    path (the ``greedy`` property, the sampler's per-row temperatures) takes the argmax; no 1 / 1e-38 ever
    reaches the sampler.
"""

from __future__ import annotations

import enum
import json as _json
import math
import numbers
from dataclasses import dataclass, replace

import torch

from ops.logprobs import MAX_LOGPROBS

SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: temperatures below it are greedy


def as_token_id(value) -> int | None:
    """``value`` as a Python int if it is an integer token id, else None.

    Ids are Python ints, numpy integer scalars and 0-d integer torch tensors; bools (Python, numpy, torch) are not
    ids, nor are floats or strings. Range checks are the caller's (it knows the vocabulary).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):  # int, numpy integers (np.bool_ is not Integral)
        return int(value)
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype != torch.bool:
        if not value.dtype.is_floating_point and not value.dtype.is_complex:
            return int(value.item())
    return None


class RequestOutputKind(enum.Enum):
    """Which steps return an output for a request (vLLM's names)."""

    CUMULATIVE = "cumulative"  # every step that produced a token: all tokens so far
    FINAL_ONLY = "final_only"  # only the step that finished it (LLM.generate: nothing per step to build or copy)


@dataclass(frozen=True)
class StructuredOutputsParams:
    """What a structured output must be (vLLM's ``StructuredOutputsParams``): exactly one of a JSON schema (a dict or
    its JSON text), any JSON object, a regex, a choice of strings, or an EBNF grammar (xgrammar's dialect).
    compiled_engine/structured_output.py constrains the tokens to it."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self):
        given = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object is True else []
        if len(given) != 1:
            raise ValueError("SamplingParams.structured_outputs needs exactly one of json, regex, choice, grammar, "
                             f"json_object; got {given or 'none'}")
        if not isinstance(self.json_object, bool):
            raise ValueError(f"SamplingParams.structured_outputs.json_object must be a bool, got {self.json_object!r}")
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError(f"SamplingParams.structured_outputs.json must be a dict or a string, got {self.json!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"SamplingParams.structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None and not (isinstance(self.choice, (list, tuple)) and self.choice
                                            and all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError("SamplingParams.structured_outputs.choice must be a non-empty list of non-empty strings, "
                             f"got {self.choice!r}")

    def key(self) -> tuple:
        """A hashable identity of the spec (the grammar cache's key)."""
        schema = self.json if not isinstance(self.json, dict) else _json.dumps(self.json, sort_keys=True)
        return (schema, self.regex, tuple(self.choice) if self.choice is not None else None, self.grammar,
                self.json_object)


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens whose probability reaches top_p; in (0, 1]
    top_k: int = 0  # keep the k most likely tokens; 0 (or -1) = all
    min_p: float = 0.0  # drop tokens less likely than min_p * (probability of the most likely token); in [0, 1]
    max_tokens: int | None = 16  # generated tokens at most; None: up to max_model_len (vLLM's)
    min_tokens: int = 0  # EOS and stop tokens are suppressed until this many tokens are generated
    # Finish when one of these is generated: it ends token_ids, its text is not in the output text (vLLM's default).
    stop_token_ids: list[int] | None = None
    # Finish when the text contains one of these (matched across token boundaries on the incrementally detokenized
    # text; the stop string and anything after it are not in the output text; its tokens stay in token_ids). As in
    # vLLM, searched from the token after the first min_tokens on, and one found is the finish reason ("stop") even
    # where the same token reaches max_tokens.
    stop: list[str] | None = None
    ignore_eos: bool = False  # keep generating past the checkpoint's EOS token(s)
    seed: int | None = None  # per-request seed: the same output whatever else is in the batch
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE  # engine.step(); LLM.generate uses FINAL_ONLY
    # Per generated token: its log-probability and the top ``logprobs`` ones (raw model distribution); None: off.
    logprobs: int | None = None
    # Per prompt token after the first: its log-probability given the tokens before it and the top ones (as logprobs;
    # vLLM's field). The prompt is computed whole (no prefix-cache hit), in chunks of engine.PROMPT_LOGPROBS_CHUNK.
    prompt_logprobs: int | None = None
    n: int = 1  # completions of the prompt (LLM.generate; an LLMEngine request is one completion: for_completion)
    # Penalties on the logits before temperature and truncation (vLLM's and OpenAI's definitions; sampler.py):
    # presence subtracts itself from every token already generated, frequency itself times the token's count so far;
    # repetition divides a positive logit (multiplies a negative one) of every token in the prompt or the output.
    presence_penalty: float = 0.0  # in [-2, 2]
    frequency_penalty: float = 0.0  # in [-2, 2]
    repetition_penalty: float = 1.0  # > 0; 1 = off
    # Added to the token's logit before the penalties (OpenAI's logit_bias, token id -> bias in [-100, 100]).
    logit_bias: dict[int, float] | None = None
    # Only these tokens can be drawn (vLLM's; the others' logits are -inf before the bias and the penalties).
    allowed_token_ids: list[int] | None = None
    # Words never generated (vLLM's): each word's tokens, as the tokenizer encodes it alone and after a space; the
    # last token of one is -inf wherever the output so far ends with the others (sampler.py ``bad_word_ids``).
    bad_words: list[str] | None = None
    # The output kept to a JSON schema, a regex, a choice or a grammar (vLLM's; compiled_engine/structured_output.py)
    structured_outputs: StructuredOutputsParams | None = None
    # Only the prompt's last this many tokens are used (vLLM's left truncation; None: all of it).
    truncate_prompt_tokens: int | None = None
    # The stop string, or the stop token's (EOS's) text, that finished the request is kept in the text (vLLM's).
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True  # special tokens' text left out of the output text (vLLM's default)
    # False: tokens only, no text (vLLM's; ``out.outputs[j].text`` is ""): the engine runs no detokenizer for the
    # request. Stop strings need the text, so they need True.
    detokenize: bool = True

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Check every field (raises ValueError naming it) and normalise: numpy/torch ints become ints, a
        temperature below SAMPLING_EPS becomes 0 (greedy), top_k -1 becomes 0. Idempotent: the engine may call it
        again on params changed after construction."""
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"SamplingParams.{name} must be a finite number, got {value!r}")
            setattr(self, name, float(value))
        optional = ("seed", "logprobs", "prompt_logprobs", "truncate_prompt_tokens", "max_tokens")
        for name in ("top_k", "max_tokens", "min_tokens", "n") + optional:
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"SamplingParams.{name} must be an int, got {value!r} ({type(value).__name__})")
            setattr(self, name, int(value))
        self.stop_token_ids = [] if self.stop_token_ids is None else self._checked_token_ids("stop_token_ids",
                                                                                              self.stop_token_ids)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = self._checked_token_ids("allowed_token_ids", self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise ValueError("SamplingParams.allowed_token_ids must not be empty (None: every token)")
        self.stop = self._checked_stop(self.stop)
        if self.bad_words is not None:
            if isinstance(self.bad_words, str) or not isinstance(self.bad_words, (list, tuple)) or not all(
                    isinstance(w, str) and w.strip() for w in self.bad_words):
                raise ValueError(f"SamplingParams.bad_words must be a list of words (non-blank strings), got "
                                 f"{self.bad_words!r}")
            self.bad_words = list(self.bad_words) or None
        self.logit_bias = self._checked_logit_bias(self.logit_bias)
        if self.top_k == -1:
            self.top_k = 0
        if 0 < self.temperature < SAMPLING_EPS:
            self.temperature = 0.0  # greedy (vLLM): 1 / temperature would overflow the sampler's fp32 scaling
        checks = [
            ("temperature", self.temperature >= 0, "must be >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k >= 0, "must be a non-negative int (0 = off)"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("max_tokens", self.max_tokens is None or self.max_tokens >= 1, "must be None or an int >= 1"),
            ("min_tokens", 0 <= self.min_tokens, "must be an int >= 0"),
            ("output_kind", isinstance(self.output_kind, RequestOutputKind), "must be a RequestOutputKind"),
            ("seed", self.seed is None or -(2**63) <= self.seed < 2**63,
             "must be None or an int in [-2**63, 2**63) (it travels as int64)"),
            ("ignore_eos", isinstance(self.ignore_eos, bool), "must be a bool"),
            ("include_stop_str_in_output", isinstance(self.include_stop_str_in_output, bool), "must be a bool"),
            ("skip_special_tokens", isinstance(self.skip_special_tokens, bool), "must be a bool"),
            ("detokenize", isinstance(self.detokenize, bool), "must be a bool"),
            ("structured_outputs",
             self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
             "must be None or a StructuredOutputsParams"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
             f"must be None or an int in [0, {MAX_LOGPROBS}]"),
            ("prompt_logprobs", self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
             f"must be None or an int in [0, {MAX_LOGPROBS}]"),
            ("n", self.n >= 1, "must be an int >= 1"),
            ("truncate_prompt_tokens", self.truncate_prompt_tokens is None or self.truncate_prompt_tokens >= 1,
             "must be None or an int >= 1"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "must be in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
            ("repetition_penalty", self.repetition_penalty > 0, "must be > 0"),
        ]
        for field_name, ok, rule in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{field_name} {rule}, got {getattr(self, field_name)!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"SamplingParams.min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if self.stop and not self.detokenize:
            raise ValueError("SamplingParams.stop needs detokenize=True: stop strings are matched on the output text")

    def for_completion(self, index: int) -> "SamplingParams":
        """The params of completion ``index`` (0 to n - 1) of a prompt, one request's (vLLM's parallel-sampling
        rule): n = 1 and, with a seed, seed + index, so that the completions differ and each is reproducible alone.
        The sum wraps within int64, the seed's range."""
        seed = self.seed
        if seed is not None:
            seed = (seed + index + 2**63) % 2**64 - 2**63
        return replace(self, n=1, seed=seed)

    @staticmethod
    def _checked_token_ids(name: str, token_ids) -> list[int]:
        """A list/tuple/set of integer token ids as a list of ints (range checks are the engine's)."""
        if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, (list, tuple, set, frozenset)):
            raise ValueError(f"SamplingParams.{name} must be a list of ints, got {token_ids!r}")
        ids = [as_token_id(t) for t in token_ids]
        bad = [t for t, i in zip(token_ids, ids) if i is None or i < 0]
        if bad:
            raise ValueError(f"SamplingParams.{name} must hold ints >= 0, got {bad[0]!r}")
        return ids

    @staticmethod
    def _checked_logit_bias(logit_bias) -> dict[int, float] | None:
        if logit_bias is None:
            return None
        if not isinstance(logit_bias, dict):
            raise ValueError(f"SamplingParams.logit_bias must be a dict of token id -> bias, got {logit_bias!r}")
        checked = {}
        for token, bias in logit_bias.items():
            token_id = as_token_id(token)
            if token_id is None or token_id < 0:
                raise ValueError(f"SamplingParams.logit_bias keys must be token ids (ints >= 0), got {token!r}")
            if (isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not math.isfinite(bias)
                    or not -100 <= bias <= 100):
                raise ValueError(f"SamplingParams.logit_bias values must be numbers in [-100, 100], got {bias!r}")
            checked[token_id] = float(bias)
        return checked or None

    @staticmethod
    def _checked_stop(stop) -> list[str]:
        if stop is None:
            return []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"SamplingParams.stop must be a string or a list of non-empty strings, got {stop!r}")
        return list(stop)

    @property
    def penalized(self) -> bool:
        """Whether any penalty applies (they count the request's tokens)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def adjusts_logits(self) -> bool:
        """Whether the logits are changed before sampling (penalties, logit_bias, allowed_token_ids, bad_words,
        structured outputs): sampled outside the decode graph."""
        return (self.penalized or self.logit_bias is not None or self.allowed_token_ids is not None
                or self.bad_words is not None or self.structured_outputs is not None)

    @property
    def greedy(self) -> bool:
        """Argmax decoding: temperature below SAMPLING_EPS (validate stores such a temperature as 0)."""
        return self.temperature < SAMPLING_EPS

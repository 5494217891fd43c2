"""Structured outputs: a request's tokens constrained to a JSON schema, a regex, a choice of strings or an EBNF
grammar (``SamplingParams.structured_outputs``), with xgrammar (the grammar engine vLLM and SGLang use; writing a
tokenizer-aware grammar matcher by hand is what it exists to spare).

Per request a ``GrammarMatcher`` follows the accepted tokens; before each of the request's draws it fills a bitmask
of the tokens that keep the output inside the grammar (``token_masks``), which the sampler turns into -inf logits
(``sampler.apply_token_masks_``); a verify row's mask follows the grammar past the drafts before it. Once the grammar
is complete only the stop token (EOS) is allowed. Compiled grammars are cached by their spec (``GrammarCache``).
xgrammar is imported only when a request asks for structured output, so an install without it
(``pip install compiled_engine[structured]`` adds it) runs everything else.
"""

from __future__ import annotations

import json

import torch

from compiled_engine.sampling_params import StructuredOutputsParams


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise ValueError("SamplingParams.structured_outputs needs xgrammar: pip install compiled_engine[structured]")
    return xgrammar


class GrammarCache:
    """Compiles specs to xgrammar grammars for one tokenizer and vocabulary (the model's logits width), once each."""

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._compiler = None
        self._compiled: dict[tuple, object] = {}

    def compile(self, spec: StructuredOutputsParams):
        """The compiled grammar of ``spec``; raises ValueError (naming structured_outputs) for one xgrammar refuses."""
        key = spec.key()
        if key not in self._compiled:
            xgr = _xgrammar()
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size)
                self._compiler = xgr.GrammarCompiler(info)
            compiler = self._compiler
            try:
                if spec.json is not None:
                    schema = spec.json if isinstance(spec.json, str) else json.dumps(spec.json)
                    compiled = compiler.compile_json_schema(schema)
                elif spec.json_object:  # OpenAI's json_object: an object (xgrammar's builtin grammar is any value)
                    compiled = compiler.compile_json_schema('{"type": "object"}')
                elif spec.regex is not None:
                    compiled = compiler.compile_regex(spec.regex)
                elif spec.choice is not None:
                    compiled = compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in spec.choice))
                else:
                    compiled = compiler.compile_grammar(spec.grammar)
            except (RuntimeError, ValueError) as error:
                raise ValueError(f"SamplingParams.structured_outputs could not be compiled: {error}") from None
            self._compiled[key] = compiled
        return self._compiled[key]

    def matcher(self, spec: StructuredOutputsParams):
        """A fresh matcher of ``spec``'s grammar, at the start of an output."""
        return _xgrammar().GrammarMatcher(self.compile(spec))


def token_masks(matchers: list, vocab: int, device: torch.device, ahead: list[list[int]] | None = None) -> torch.Tensor:
    """``[len(matchers), vocab]`` bool on ``device``: the tokens each matcher allows next, or, with ``ahead``, after
    the tokens ``ahead[row]`` (a verify row's drafts before it: accepted for the fill, then rolled back; past one the
    grammar refuses, the mask is the one before it: such a row is never reached). The bitmasks are filled on the
    host (xgrammar, 32 tokens an int32), uploaded, and expanded to one bool a token on the device."""
    xgr = _xgrammar()
    bitmask = xgr.allocate_token_bitmask(len(matchers), vocab)
    for row, matcher in enumerate(matchers):
        accepted = 0
        for token in ahead[row] if ahead is not None else ():
            if not matcher.accept_token(token):
                break
            accepted += 1
        if not matcher.is_terminated():  # past a draft's stop token the row is never reached: left as allocated
            matcher.fill_next_token_bitmask(bitmask, row)
        if accepted:
            matcher.rollback(accepted)
    words = bitmask.to(device)
    bits = (words.unsqueeze(-1) >> torch.arange(32, device=device, dtype=torch.int32)) & 1
    return bits.flatten(1)[:, :vocab].bool()

"""Incremental detokenization and stop strings: the text of a request's generated tokens, token by token.

A token's text is not a function of the token alone: byte-level tokenizers split a character over several tokens
(its text is U+FFFD until the last one arrives) and SentencePiece-style ones drop or add a leading space depending on
the token before. So each new token's text is the difference between two decodes of a short window of ids (vLLM's
``detokenize_incrementally``): ``decode(ids[prefix:read])`` (text already emitted, with some context before it) and
``decode(ids[prefix:])``. When the latter is longer and does not end in U+FFFD (an incomplete character), its extra
characters are the new text and the window moves on: ``prefix = read``, ``read = len(ids)``. The window starts a few
prompt tokens back so that the first generated token has its context. Each step decodes a handful of ids, whatever
the output's length.

Stop strings (``SamplingParams.stop``) are searched in the new text and the ``len(stop) - 1`` characters before it,
so a stop string spanning tokens is found when its last token arrives; the text is cut where it starts (the stop
string is not returned), or where it ends with ``include_stop``. While a request runs, the last
``max(len(stop)) - 1`` characters are held back from ``text``, since they may turn out to begin a stop string
(vLLM's stop buffer); nothing is held back with ``include_stop``, as they are shown either way.
"""

from __future__ import annotations

from typing import Sequence as Seq

PROMPT_CONTEXT = 5  # prompt tokens decoded before the first generated one (vLLM's initial offset)
INCOMPLETE = "\ufffd"  # what a decoder yields for the bytes of a character not complete yet


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: Seq[int], stop: Seq[str] = (), skip_special_tokens: bool = True,
                 include_stop: bool = False):
        # A fast tokenizer's Rust backend decodes the same text without the Python wrapper (~1.3 us against ~4.4 us
        # a call: two calls per token per request, on the engine thread), unless the wrapper post-processes it.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        plain = backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._decoder = backend if plain else tokenizer
        self._skip_special = skip_special_tokens
        self._ids = list(prompt_token_ids[-PROMPT_CONTEXT:])  # the window: only its tail is ever decoded
        self._prefix = 0  # ids[prefix:read] decode to text already emitted (with the context before it)
        self._read = len(self._ids)
        self.stop = tuple(stop)
        self._include_stop = include_stop
        self._hold = 0 if include_stop else max((len(s) for s in self.stop), default=1) - 1
        self.text = ""  # everything decoded so far (cut at a stop string once one is found)

    def _decode(self, ids: list[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=self._skip_special)

    def add(self, token_id: int, check_stop: bool = True) -> str | None:
        """Take one generated token; returns the stop string it completed (the text is then cut before it), or
        None. ``check_stop`` False: the token's text is not searched for stop strings (a request's first
        ``min_tokens`` tokens: vLLM's rule; a stop string ending in a later token is still found where it starts
        in earlier text)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(INCOMPLETE):
            return None  # no complete character yet: wait for the next token
        delta = new_text[len(prefix_text) :]
        # Move the window on, dropping the ids before it (only ids[prefix:] are ever decoded again).
        del self._ids[: self._read]
        self._prefix, self._read = 0, len(self._ids)
        self.text += delta
        return self._find_stop(len(delta)) if self.stop and check_stop else None

    def flush(self) -> None:
        """The request finished: emit what an incomplete character held back (as the decoder renders it)."""
        if self._read < len(self._ids):
            prefix_text = self._decode(self._ids[self._prefix : self._read])
            self.text += self._decode(self._ids[self._prefix :])[len(prefix_text) :]
            self._read = len(self._ids)

    def _find_stop(self, num_new_chars: int) -> str | None:
        """The stop string that ends in the last ``num_new_chars`` characters and starts first; cuts the text where it
        starts (where it ends with ``include_stop``)."""
        found, at = None, len(self.text)
        for stop in self.stop:
            index = self.text.find(stop, max(0, len(self.text) - num_new_chars - len(stop) + 1))
            if index != -1 and index < at:
                found, at = stop, index
        if found is not None:
            self.text = self.text[: at + len(found) if self._include_stop else at]
        return found

    def output_text(self, finished: bool) -> str:
        """The text to show: all of it once finished, else less the characters that may begin a stop string."""
        if finished or not self._hold:
            return self.text
        return self.text[: max(0, len(self.text) - self._hold)]

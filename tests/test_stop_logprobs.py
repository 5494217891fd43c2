"""Stop strings and logprobs, the engine side of the server (CPU, the embedded tiny default model).

Oracles: ``ce::logprobs`` against a float64 log-softmax and sort (its opcheck case is in tests/test_ops.py); the
incremental detokenizer against the tokenizer's decode of all the ids at once and Python's ``str.find``; stop strings
against a solo run without them; the engine's logprobs against HF transformers' logits of the tiny default
checkpoint (a Qwen3_5ForCausalLM) in float64.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ops  # noqa: F401  (registers the ce ops)
from compiled_engine import LLM, SamplingParams
from compiled_engine.detokenizer import IncrementalDetokenizer
from compiled_engine.llm import load_tokenizer
from compiled_engine.tiny_model import ensure_tiny_model
from tests import hf_models

ce = torch.ops.ce
GREEDY = dict(temperature=0.0, ignore_eos=True)
# Our fp32 forward and HF's fp32 forward of the same ~50 tokens round apart by ~1e-4 in a log-probability (more on
# some CPUs than others), where a temperature-scaled or another row's distribution is off by O(0.1-1).
LOGPROB_TOL = 3e-4


@pytest.fixture(scope="module")
def tiny_path() -> str:
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def tokenizer(tiny_path):
    return load_tokenizer(tiny_path)


@pytest.fixture(scope="module")
def llm(tiny_path) -> LLM:
    return LLM(tiny_path, device="cpu", enforce_eager=True, max_model_len=256, max_num_seqs=4, overlap_decode=False)


# --------------------------------------------------------------------------------------------------------------
# ce::logprobs
# --------------------------------------------------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 5), vocab=st.integers(2, 300), k=st.integers(0, 20), seed=st.integers(0, 2**31),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_logprobs_op_matches_a_float64_log_softmax(rows, vocab, k, seed, dtype):
    k = min(k, vocab)
    g = torch.Generator().manual_seed(seed)
    # Distinct values (a permutation of a grid) so that the top-k order has no ties, in any dtype.
    logits = (torch.stack([torch.randperm(vocab, generator=g) for _ in range(rows)]).float() * 0.0625 - 8).to(dtype)
    tokens = torch.randint(vocab, (rows,), generator=g)
    chosen, values, ids = ce.logprobs(logits, tokens, k)
    x = logits.double()
    expected = x - torch.log(torch.exp(x - x.max(-1, keepdim=True).values).sum(-1, keepdim=True)) \
        - x.max(-1, keepdim=True).values
    order = torch.argsort(x, dim=-1, descending=True)[:, :k]
    assert chosen.dtype == values.dtype == torch.float32 and ids.dtype == torch.long
    torch.testing.assert_close(chosen.double(), expected.gather(1, tokens[:, None])[:, 0], atol=1e-5, rtol=0)
    assert torch.equal(ids, order)
    torch.testing.assert_close(values.double(), expected.gather(1, order), atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------------------------
# Incremental detokenizer
# --------------------------------------------------------------------------------------------------------------

# Byte strings rich in multi-byte characters, split over tokens (the tiny tokenizer's tokens are bytes).
PIECES = ["a", "b", " ", "é", "€", "😀", "ab", "\n", "zz"]
texts = st.lists(st.sampled_from(PIECES), min_size=1, max_size=20).map("".join)


@settings(max_examples=40, deadline=None)
@given(text=texts, prompt=texts, junk=st.lists(st.integers(128, 255), max_size=3))
def test_incremental_text_is_the_decode_of_all_ids(tokenizer, text, prompt, junk):
    """Token by token, including invalid bytes (a stray continuation byte renders as U+FFFD): the text equals one
    decode of all the generated ids once flushed, and is a prefix of it at every step."""
    ids = list(text.encode()) + junk
    detok = IncrementalDetokenizer(tokenizer, list(prompt.encode()))
    full = tokenizer.decode(ids)
    for token in ids:
        assert detok.add(token) is None
        assert full.startswith(detok.text)
    detok.flush()
    assert detok.text == full


@settings(max_examples=40, deadline=None)
@given(text=texts, stops=st.lists(st.sampled_from(["b", "zz", "a b", "€", "é€", "q"]), min_size=1, max_size=3))
def test_stop_strings_cut_the_text_where_the_first_one_starts(tokenizer, text, stops):
    """Oracle: str.find on the whole text. The stop string is found at the token that completes it, the text is
    cut before it, and while running the text shown is a prefix of the final text (nothing of a stop string is ever
    shown) that holds back no more than the longest stop string less one character (vLLM's stop buffer)."""
    ids = list(text.encode())
    detok = IncrementalDetokenizer(tokenizer, [1, 2, 3], stops)
    found, shown, found_at = None, [], None
    for index, token in enumerate(ids):
        shown.append((detok.output_text(finished=False), len(detok.text)))
        found = detok.add(token)
        if found is not None:
            found_at = index
            break
    hits = [(text.find(s), s) for s in stops if s in text]
    at = min((i for i, _ in hits), default=len(text))
    final = text[:at]
    hold = max(map(len, stops)) - 1
    for text_shown, decoded in shown:
        assert final.startswith(text_shown) and len(text_shown) >= decoded - hold
    if not hits:
        assert found is None and detok.text == text
        return
    assert detok.text == final
    assert found in {s for i, s in hits if i == at}
    # Found at the first token (a byte here) that completes any stop string's first occurrence, not later.
    assert found_at + 1 == min(len(text[: i + len(s)].encode()) for i, s in hits)


# --------------------------------------------------------------------------------------------------------------
# The engine: stop strings and logprobs
# --------------------------------------------------------------------------------------------------------------


def two_char_stop(text: str) -> tuple[str, int]:
    """The first two adjacent printable ASCII characters of ``text`` (two bytes: two tokens of the tiny tokenizer),
    not at its very start."""
    for i in range(1, len(text) - 1):
        if text[i].isascii() and text[i + 1].isascii() and (text[i] + text[i + 1]).isprintable():
            return text[i : i + 2], i
    raise AssertionError(f"no two adjacent ASCII characters in {text!r}")


@pytest.mark.parametrize("overlap", [False, True])
def test_a_stop_string_spanning_two_tokens_ends_the_request(llm, tokenizer, overlap):
    prompts = ["Hello world", "abc", "The quick brown fox"]
    solo = [llm.generate(p, SamplingParams(max_tokens=40, **GREEDY), use_tqdm=False)[0] for p in prompts]
    stop, at = two_char_stop(solo[0].text)
    assert solo[0].text.find(stop) == at  # its first occurrence
    llm.engine.overlap_decode = overlap
    try:
        params = [SamplingParams(max_tokens=40, stop=[stop, "\x00never"], **GREEDY),
                  SamplingParams(max_tokens=40, **GREEDY), SamplingParams(max_tokens=40, stop="\x00never", **GREEDY)]
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.engine.overlap_decode = False
    first = outs[0]
    assert first.finish_reason == "stop" and first.stop_reason == stop
    assert first.text == solo[0].text[:at]
    n = len(first.token_ids)
    assert first.token_ids == solo[0].token_ids[:n]  # the tokens up to the one completing the stop string
    assert tokenizer.decode(first.token_ids).endswith(stop)
    assert not tokenizer.decode(first.token_ids[:-1]).endswith(stop)
    for out, ref in zip(outs[1:], solo[1:]):  # the others run to their length, unchanged
        assert (out.token_ids, out.text, out.finish_reason) == (ref.token_ids, ref.text, "length")
    engine = llm.engine
    assert engine.runtime.caches.num_free_slots == engine.runtime.config.max_num_seqs


@pytest.mark.parametrize("overlap", [False, True])
def test_a_stop_string_completed_by_the_last_allowed_token_is_the_finish_reason(llm, tokenizer, overlap):
    """The token that reaches max_tokens completes a stop string: the text is cut where it starts and the request
    finishes "stop" with the string as its reason (vLLM's output processor), not "length". Oracle: a solo run
    without stop strings and str.find."""
    solo = llm.generate("Hello world", SamplingParams(max_tokens=40, **GREEDY), use_tqdm=False)[0]
    stop, at = two_char_stop(solo.text)
    n = next(i for i in range(1, 41) if tokenizer.decode(solo.token_ids[:i]).find(stop) >= 0)  # the completing one
    llm.engine.overlap_decode = overlap
    try:
        out = llm.generate("Hello world", SamplingParams(max_tokens=n, stop=[stop], **GREEDY), use_tqdm=False)[0]
    finally:
        llm.engine.overlap_decode = False
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.text == solo.text[:at] and out.token_ids == solo.token_ids[:n]


def test_stop_strings_are_not_searched_in_the_first_min_tokens(llm, tokenizer):
    """A stop string completed inside the first min_tokens tokens is ignored there (vLLM's rule): nothing is cut
    from the text, and a stop string completed later still stops the request where it starts. Oracle: a solo run
    without stop strings, str.find."""
    solo = llm.generate("Hello world", SamplingParams(max_tokens=40, **GREEDY), use_tqdm=False)[0]
    early, at = two_char_stop(solo.text)
    completes = [tokenizer.decode(solo.token_ids[:i]) for i in range(1, 41)]
    n = next(i + 1 for i, text in enumerate(completes) if early in text)  # the token completing it
    assert solo.text.find(early, at + 1) < 0  # its one occurrence
    late, late_at = next((solo.text[j : j + 2], j) for j in range(at + 2, len(solo.text) - 1)
                         if solo.text[j : j + 2].isascii() and solo.text[j : j + 2].isprintable()
                         and solo.text.find(solo.text[j : j + 2]) == j)
    assert late not in completes[n - 1]  # completed past the first n tokens
    params = dict(max_tokens=40, min_tokens=n, **GREEDY)
    out = llm.generate("Hello world", SamplingParams(stop=[early], **params), use_tqdm=False)[0]
    assert (out.token_ids, out.text, out.finish_reason) == (solo.token_ids, solo.text, "length")
    out = llm.generate("Hello world", SamplingParams(stop=[early, late], **params), use_tqdm=False)[0]
    assert (out.text, out.finish_reason, out.stop_reason) == (solo.text[:late_at], "stop", late)
    assert out.token_ids == solo.token_ids[: len(out.token_ids)]


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_token_ends_the_token_ids_but_not_the_text(llm, tokenizer, stream):
    """A stop token ends token_ids; the text is that of the tokens before it (vLLM's default), whether the text comes
    from the detokenizer (streamed: CUMULATIVE outputs) or one decode at the end (LLM.generate's FINAL_ONLY).
    Oracle: a solo run without the stop token and the tokenizer's decode."""
    solo = llm.generate("Hello world", SamplingParams(max_tokens=40, **GREEDY), use_tqdm=False)[0]
    token = next(t for t in solo.token_ids[3:] if tokenizer.decode([t]).strip())  # a token with text of its own
    first = solo.token_ids.index(token)
    params = SamplingParams(max_tokens=40, stop_token_ids=[token], **GREEDY)
    if stream:
        engine = llm.engine
        engine.add_request("t", llm._encode("Hello world"), params)
        while engine.has_unfinished_requests():
            for out in engine.step():
                pass
    else:
        out = llm.generate("Hello world", params, use_tqdm=False)[0]
    assert out.token_ids == solo.token_ids[: first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", token)
    assert out.text == tokenizer.decode(solo.token_ids[:first], skip_special_tokens=True)


def finished_output(llm, prompt: str, params: SamplingParams, stream: bool):
    """The request's final output: streamed through engine.step (CUMULATIVE outputs: the detokenizer's text) or from
    LLM.generate (FINAL_ONLY: one decode at the end, unless it has stop strings)."""
    if not stream:
        return llm.generate(prompt, params, use_tqdm=False)[0]
    llm.engine.add_request("s", llm._encode(prompt), params)
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            pass
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output_keeps_what_stopped_it(llm, tokenizer, stream):
    """vLLM's ``include_stop_str_in_output``: the text ends after the stop string (``str.find`` in a solo run's text)
    or with the stop token's text (the tokenizer's decode of every token); finish and stop reasons unchanged."""
    solo = llm.generate("Hello world", SamplingParams(max_tokens=40, **GREEDY), use_tqdm=False)[0]
    stop, at = two_char_stop(solo.text)
    params = SamplingParams(max_tokens=40, stop=[stop], include_stop_str_in_output=True, **GREEDY)
    out = finished_output(llm, "Hello world", params, stream)
    assert (out.text, out.finish_reason, out.stop_reason) == (solo.text[: at + len(stop)], "stop", stop)
    token = next(t for t in solo.token_ids[3:] if tokenizer.decode([t]).strip())
    first = solo.token_ids.index(token)
    out = finished_output(llm, "Hello world", SamplingParams(max_tokens=40, stop_token_ids=[token],
                                                             include_stop_str_in_output=True, **GREEDY), stream)
    assert out.token_ids == solo.token_ids[: first + 1] and out.stop_reason == token
    assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("stream", [False, True])
def test_skip_special_tokens_off_shows_their_text(llm, tokenizer, stream):
    """``skip_special_tokens=False``: the special token (the tiny model's <|endoftext|>, forced by a logit bias past
    EOS) is in the text, as the tokenizer decodes it; on (the default) it is not."""
    eos = tokenizer.eos_token_id
    forced = dict(max_tokens=3, logit_bias={eos: 100.0}, **GREEDY)
    out = finished_output(llm, "Hello", SamplingParams(skip_special_tokens=False, **forced), stream)
    assert out.token_ids == [eos] * 3
    assert out.text == tokenizer.decode([eos] * 3, skip_special_tokens=False) == tokenizer.eos_token * 3
    assert finished_output(llm, "Hello", SamplingParams(**forced), stream).text == ""


def test_vllm_style_outputs(llm, tokenizer):
    """Code written for vLLM reads ``out.outputs[0]``: its text is the tokenizer's decode of its tokens (cut at a
    stop string), its finish and stop reasons the request's, and its cumulative logprob the sum of the tokens'
    logprobs (the model's log-softmax: its own test above)."""
    solo = llm.generate("Hello world", SamplingParams(max_tokens=40, **GREEDY), use_tqdm=False)[0]
    stop, at = two_char_stop(solo.text)
    outs = llm.generate(["Hello world", "abc"], [SamplingParams(max_tokens=40, stop=[stop], **GREEDY),
                                                 SamplingParams(max_tokens=6, logprobs=2, n=1, **GREEDY)],
                        use_tqdm=False)
    first, second = (out.outputs for out in outs)
    assert len(first) == len(second) == 1 and first[0].index == 0
    assert (first[0].text, first[0].finish_reason, first[0].stop_reason) == (solo.text[:at], "stop", stop)
    assert first[0].token_ids == solo.token_ids[: len(first[0].token_ids)] and first[0].cumulative_logprob is None
    assert second[0].text == tokenizer.decode(second[0].token_ids, skip_special_tokens=True)
    assert len(second[0].logprobs) == 6 and second[0].finish_reason == "length"
    assert second[0].cumulative_logprob == pytest.approx(sum(e.logprob for e in outs[1].logprobs))


def test_streamed_text_adds_up_and_stop_text_is_never_shown(llm):
    """Through engine.step (CUMULATIVE outputs): each output's text extends the previous one and never shows the
    stop string; the last one is the stopped text."""
    solo = llm.generate("Hello world", SamplingParams(max_tokens=40, **GREEDY), use_tqdm=False)[0]
    stop, at = two_char_stop(solo.text)
    engine = llm.engine
    engine.add_request("s", llm._encode("Hello world"), SamplingParams(max_tokens=40, stop=[stop], **GREEDY))
    shown = ""
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.text.startswith(shown) and stop not in out.text
            shown = out.text
    assert out.finished and shown == solo.text[:at]


@pytest.mark.parametrize("overlap,split", [(False, False), (True, False), (True, True)])
def test_logprobs_are_the_models_log_softmax(llm, tiny_path, overlap, split):
    """Against HF transformers' float64 logits of the same checkpoint over prompt + generated tokens: the chosen
    token's logprob and the top-n, for greedy and seeded sampled rows, through decode steps, prefill steps (first
    tokens; min_tokens rows sample from the logits) and mixed steps (six requests over four slots, finishing at
    different lengths, so later ones join running ones), fused or ``split`` into a decode and a prefill step."""
    model = hf_models.load_hf(tiny_path).double()
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (5, 17, 40, 9, 23, 3)]
    kinds = [dict(logprobs=3, **GREEDY), dict(temperature=0.8, top_k=20, seed=7, logprobs=20, ignore_eos=True),
             dict(temperature=0.0, min_tokens=3, logprobs=0), dict(**GREEDY)]
    params = [SamplingParams(max_tokens=2 + 2 * i, **kinds[i % len(kinds)]) for i in range(len(prompts))]
    engine = llm.engine
    engine.overlap_decode, fused = overlap, engine.max_fused_decode_rows
    engine.max_fused_decode_rows = 0 if split else fused
    mixed_before = engine.scheduler.num_mixed_steps
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        engine.overlap_decode, engine.max_fused_decode_rows = False, fused
    assert engine.scheduler.num_mixed_steps > mixed_before  # the mixed steps the docstring names did run
    assert not engine._with_logprobs  # finished requests leave steps without the row-by-row look for logprobs
    for prompt, p, out in zip(prompts, params, outs):
        if p.logprobs is None:
            assert out.logprobs is None
            continue
        assert [e.token_id for e in out.logprobs] == out.token_ids
        logits = hf_models.hf_logits(model, prompt + out.token_ids)
        oracle = torch.log_softmax(logits.double(), dim=-1)[len(prompt) - 1 : -1]
        for row, entry in zip(oracle, out.logprobs):
            assert math.isclose(entry.logprob, row[entry.token_id].item(), abs_tol=LOGPROB_TOL)
            assert len(entry.top) == p.logprobs
            kth = row.sort(descending=True).values[p.logprobs - 1].item() if p.logprobs else math.inf
            for token, value in entry.top:
                assert math.isclose(value, row[token].item(), abs_tol=LOGPROB_TOL) and value >= kth - LOGPROB_TOL
            assert [v for _, v in entry.top] == sorted((v for _, v in entry.top), reverse=True)

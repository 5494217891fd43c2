"""``SamplingParams.bad_words`` (vLLM's): the words' token sequences by vLLM's rule, and greedy outputs that never end
with a bad word, equal to HF's float64 greedy continuation masked by the definition (each word's last token -inf
where the output so far ends with its other tokens), in every engine mode."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer

from compiled_engine import LLM, SamplingParams
from compiled_engine.request import Request
from compiled_engine.sampler import bad_word_ends, bad_word_ids
from compiled_engine.sequence import Sequence
from compiled_engine.tiny_model import ensure_tiny_model
from tests import hf_models
from tests.test_penalties import continuation_drafts

TIE = 1e-3  # top-2 float64 logits closer than this: the fp32 engine may break the tie the other way


class WordTokenizer:
    """A tokenizer of fixed encodings: what vLLM's rule keeps of each word's two spellings is visible."""

    ENCODINGS = {"bad": [5], " bad": [6], "two words": [7, 8], " two words": [9, 8], "x y": [1, 2], " x y": [3],
                 "same": [4], " same": [4], "nothing": [], " nothing": [3]}

    def encode(self, text, add_special_tokens=True):
        assert not add_special_tokens
        return self.ENCODINGS[text]


def test_bad_word_ids_follow_vllms_rule():
    """Each word stripped on the left and encoded alone; its spelling after a space kept where it starts with another
    token and has as many tokens (vLLM's ``update_from_tokenizer``)."""
    assert bad_word_ids(WordTokenizer(), ["  bad", "two words", "x y", "same"]) == [
        (5,), (6,), (7, 8), (9, 8), (1, 2), (4,)]
    with pytest.raises(ValueError, match="no token"):
        bad_word_ids(WordTokenizer(), ["nothing"])


@given(st.lists(st.integers(0, 3), max_size=8), st.lists(st.integers(0, 3), max_size=3), st.booleans(),
       st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=4))
def test_bad_word_ends_is_the_definition(output, extra, placeholder, words):
    """The tokens banned next: each word's last token where the output then ``extra`` end with its other tokens
    (a placeholder still in flight after the output is not part of it)."""
    seq = Sequence(0, [1, 2] + output + ([0] if placeholder else []), 2)  # the prompt never counts
    seq.num_placeholder_tokens = int(placeholder)
    request = Request("r", seq, SamplingParams(), seed=0, stop_ids=frozenset(), prompt_token_ids=[1, 2])
    request.bad_words = [tuple(w) for w in words]
    seen = output + extra
    want = {w[-1] for w in words if len(w) - 1 <= len(seen) and seen[len(seen) - (len(w) - 1) :] == w[:-1]}
    assert bad_word_ends(request, extra) == want


@pytest.mark.parametrize("words", ["bad", [""], ["  "], [3], ("ok", None)])
def test_bad_words_must_be_a_list_of_words(words):
    with pytest.raises(ValueError, match="bad_words"):
        SamplingParams(bad_words=words)


# The tiny model's tokenizer encodes bytes; its unmasked greedy outputs are mostly non-ASCII bytes. Each prompt's
# word is a piece of its unmasked output (found below): two consecutive printable ASCII tokens (banned from the step
# of the second: the engine must know the first, which may still be in flight), or the first token alone.
PROMPTS = [[40, 41], [100, 111, 103, 115, 32], [116, 104, 101], [72, 101, 108, 108, 111]]
WORD_TOKENS = [2, 2, 1, 0]  # tokens of each prompt's word (0: no word, the control request)
LENGTH = 16


@pytest.fixture(scope="module")
def tiny_path() -> str:
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def cases(tiny_path):
    """Per prompt: its bad words, their token sequences by HF's tokenizer, and HF's float64 greedy continuation
    under them with how many of its tokens are decided (before the first step whose top two logits lie within TIE)."""
    model = hf_models.load_hf(tiny_path).double()
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)  # HF's own, not the engine's loader
    results = []
    with torch.no_grad():
        for prompt, size in zip(PROMPTS, WORD_TOKENS):
            plain = hf_models.hf_greedy_no_cache(model, prompt, LENGTH)
            words = []
            if size == 1:
                words = [chr(plain[0])]
            elif size == 2:
                at = next(i for i in range(1, LENGTH - 1)
                          if all(33 <= t < 127 for t in plain[i : i + 2]))  # the prompt list is chosen so one exists
                words = [chr(plain[at]) + chr(plain[at + 1])]
            banned = [tuple(tokenizer.encode(w, add_special_tokens=False)) for w in words]
            output, decided = [], None
            for step in range(LENGTH):
                row = hf_models.hf_logits(model, prompt + output)[-1].clone()
                for word in banned:
                    if len(word) == 1 or tuple(output[-(len(word) - 1) :]) == word[:-1]:
                        row[word[-1]] = float("-inf")
                top2 = row.topk(2).values
                if decided is None and top2[0] - top2[1] < TIE:
                    decided = step
                output.append(int(row.argmax()))
            if words:  # the word changed the output, and the masked output never ends with it
                assert output != plain, (prompt, words)
            results.append((words, banned, output, LENGTH if decided is None else decided))
    return results


@pytest.mark.parametrize("mode", ["sync", "overlap", "speculative", "compiled"])
def test_greedy_outputs_never_end_with_a_bad_word(tiny_path, cases, mode):
    """Four requests over two slots (later ones join running ones), one without bad words: each greedy output equals
    the masked oracle's over its decided tokens, and no token of it (decided or not) completes a bad word. Overlapped,
    a request with a word of two tokens must not run ahead of its in-flight token (else the step after it would not
    see the word's first token and draw its last)."""
    knobs = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=2, enforce_eager=mode != "compiled",
                 overlap_decode=mode != "sync")
    if mode == "speculative":
        knobs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 2}
    llm = LLM(tiny_path, **knobs)
    params = [SamplingParams(temperature=0, ignore_eos=True, max_tokens=LENGTH, bad_words=words or None)
              for words, _, _, _ in cases]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out, (words, banned, expected, decided) in zip(PROMPTS, outs, cases):
        assert decided >= 8, (words, decided)
        assert out.token_ids[:decided] == expected[:decided], (words, out.token_ids, expected, decided)
        tokens = prompt + out.token_ids
        for word in banned:
            ends = [i for i in range(len(prompt), len(tokens)) if tuple(tokens[i - len(word) + 1 : i + 1]) == word]
            assert not ends, (words, out.token_ids, ends)
    assert not llm.engine.requests and not llm.engine._adjusting


def test_bad_words_need_a_tokenizer(tmp_path, tiny_path):
    import shutil

    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{tiny_path}/{name}", tmp_path / name)
    llm = LLM(str(tmp_path), device="cpu", dtype="float32", max_model_len=64, max_num_seqs=1, enforce_eager=True)
    with pytest.raises(ValueError, match="bad_words needs a tokenizer"):
        llm.engine.add_request(None, [1, 2, 3], SamplingParams(bad_words=["x"]))
    assert not llm.engine.requests


def test_a_word_past_the_models_vocabulary_is_refused_by_the_engine_and_the_servers_front_end(tmp_path, tiny_path):
    """A tokenizer may hold more tokens than the model (added tokens): a bad word spelled with one is a ValueError
    naming the field from the engine and from an engine process's front end (the server's 400), nothing queued."""
    import shutil

    from compiled_engine.async_llm import EngineProcess

    shutil.copytree(tiny_path, tmp_path, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(tmp_path)
    vocab = 257  # the tiny model's: 256 bytes and EOS
    assert AutoTokenizer.from_pretrained(tmp_path).encode("<extra>", add_special_tokens=False) == [vocab]
    llm = LLM(str(tmp_path), device="cpu", dtype="float32", max_model_len=64, max_num_seqs=1, enforce_eager=True)
    assert llm.engine.runtime.model_config.vocab_size == vocab
    for refuse in (lambda p: llm.engine.add_request(None, [1, 2, 3], p),
                   lambda p: _front_end(EngineProcess(str(tmp_path), {}), vocab).validate_request([1, 2, 3], p)):
        with pytest.raises(ValueError, match=r"SamplingParams\.bad_words: token 257 .* \[0, 257\)"):
            refuse(SamplingParams(bad_words=["ok", "<extra>"]))
        refuse(SamplingParams(bad_words=["ok"]))  # the model's own tokens pass
    assert [r.params.bad_words for r in llm.engine.requests.values()] == [["ok"]]  # only the good one queued


def _front_end(process, vocab: int):
    """An engine process's front end as it stands once its process has reported its numbers (not started here)."""
    process.info = {"max_model_len": 64, "vocab_size": vocab, "has_tokenizer": True}
    return process


@pytest.mark.parametrize("drafts", ["oracle", "wrong"])
def test_verify_rows_match_the_drafts_before_them(tiny_path, cases, drafts):
    """MTP k = 2 with drafts overridden by the oracle's own continuation (each verified row p masks a word's last
    token where the output and drafts[:p] end with its others, so the drafts after a word's first token are
    accepted) or by tokens next to them (rejected: the correction is drawn where the wrong one sat): the outputs
    equal the oracle's either way."""
    llm = LLM(tiny_path, device="cpu", dtype="float32", max_model_len=128, max_num_seqs=2, enforce_eager=True,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    expected_outputs = [expected for _, _, expected, _ in cases]
    llm.engine.draft_override = continuation_drafts(PROMPTS, expected_outputs, drafts == "wrong")
    params = [SamplingParams(temperature=0, ignore_eos=True, max_tokens=LENGTH, bad_words=words or None)
              for words, _, _, _ in cases]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for out, (words, _, expected, decided) in zip(outs, cases):
        assert out.token_ids[:decided] == expected[:decided], (words, out.token_ids, expected, decided)
    engine = llm.engine
    assert engine.num_draft_tokens > 0
    if drafts == "oracle":
        assert engine.num_accepted_tokens >= 0.6 * engine.num_draft_tokens, (engine.num_accepted_tokens,
                                                                             engine.num_draft_tokens)
    else:
        assert engine.num_accepted_tokens <= 0.1 * engine.num_draft_tokens, (engine.num_accepted_tokens,
                                                                             engine.num_draft_tokens)

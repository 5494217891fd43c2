"""The rest of vLLM's offline API on the embedded tiny default model (CPU): ``SamplingParams.n``, ``LLM.chat``,
``LLM.get_tokenizer``, ``RequestOutput.prompt``, ``max_tokens=None``, ``detokenize=False`` and ``SamplingParams.prompt_logprobs``.

Oracles: solo runs of each completion with its seed (vLLM's seed + j); a run asking for exactly the tokens that fill
max_model_len; a detokenizing run of the same seeded request and the tokenizer's decode; HF's AutoTokenizer over
the checkpoint's folder; HF transformers' own
``apply_chat_template(..., tokenize=True)`` for a conversation's prompt tokens; HF's float64 log-softmax of the
checkpoint's logits over a prompt for its prompt logprobs.
"""

from __future__ import annotations

import random

import pytest
import torch

from compiled_engine import LLM, RequestOutputKind, SamplingParams
from compiled_engine import engine as engine_module
from tests import hf_models
# The embedded tiny default checkpoint, its tokenizer and a 4-slot LLM over it; greedy params, the logprob tolerance.
from tests.test_stop_logprobs import GREEDY, LOGPROB_TOL, llm, tiny_path, tokenizer  # noqa: F401  (fixtures)


def test_n_completions_are_solo_runs_with_seed_plus_index(llm, tokenizer):
    """``SamplingParams.n``: a prompt's completions come back as one output in index order, completion j equal to a
    solo run of the prompt with seed + j (vLLM's rule), greedy ones equal to the greedy run; eight completions over
    the engine's four slots, so later ones queue behind earlier ones."""
    sampled = dict(temperature=0.9, top_k=50, max_tokens=12, ignore_eos=True, logprobs=1)
    outs = llm.generate(["Hello world", [1, 2, 3], "abc", "abc"],
                        [SamplingParams(n=3, seed=11, **sampled), SamplingParams(max_tokens=5, **GREEDY),
                         SamplingParams(n=2, max_tokens=7, **GREEDY), SamplingParams(n=2, **sampled)],
                        use_tqdm=False)
    assert [len(out.outputs) for out in outs] == [3, 1, 2, 2]
    assert all([c.index for c in out.outputs] == list(range(len(out.outputs))) for out in outs)
    seeded = outs[0].outputs
    for j, completion in enumerate(seeded):
        solo = llm.generate("Hello world", SamplingParams(seed=11 + j, **sampled), use_tqdm=False)[0]
        assert (completion.token_ids, completion.text) == (solo.token_ids, solo.text), j
        assert completion.cumulative_logprob == pytest.approx(sum(e.logprob for e in solo.logprobs), abs=LOGPROB_TOL)
    assert len({tuple(c.token_ids) for c in seeded}) == 3  # seeds 11, 12, 13 draw different completions
    assert (outs[0].token_ids, outs[0].text) == (seeded[0].token_ids, seeded[0].text)  # the flat fields: completion 0
    greedy = llm.generate("abc", SamplingParams(max_tokens=7, **GREEDY), use_tqdm=False)[0].token_ids
    assert [c.token_ids for c in outs[2].outputs] == [greedy, greedy]
    for completion in outs[3].outputs:  # unseeded: each a full-length sample, its text its tokens' decode
        assert len(completion.token_ids) == 12
        assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    assert not llm.engine.requests
    with pytest.raises(ValueError, match="SamplingParams.n must be 1 in an engine request"):
        llm.engine.add_request(None, [1, 2, 3], SamplingParams(n=2))


def test_completion_seeds_wrap_within_int64():
    top = SamplingParams(seed=2**63 - 1, n=3)
    assert [top.for_completion(j).seed for j in range(3)] == [2**63 - 1, -(2**63), -(2**63) + 1]
    assert SamplingParams(n=2).for_completion(1).seed is None and top.for_completion(2).n == 1


CONVERSATION = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}]


def template_ids(tokenizer, conversation) -> list[int]:
    """HF's own tokenization of the rendered template (a BatchEncoding in transformers 5, a list before)."""
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def test_chat_generates_from_the_templates_tokens(llm, tokenizer):
    """``LLM.chat`` of one conversation or several: the prompt is HF's rendering of the template (its own
    tokenization), and each output equals ``generate`` on those tokens; OpenAI's text parts read as their joined
    text; ``add_generation_prompt=False`` leaves the assistant's turn unopened."""
    params = SamplingParams(max_tokens=6, **GREEDY)
    expected = template_ids(tokenizer, CONVERSATION)
    solo = llm.generate([expected], params, use_tqdm=False)[0]
    one = llm.chat(CONVERSATION, params, use_tqdm=False)
    assert len(one) == 1 and (one[0].prompt_token_ids, one[0].token_ids) == (expected, solo.token_ids)
    parts = [dict(m, content=[{"type": "text", "text": m["content"][:3]}, {"type": "text", "text": m["content"][3:]}])
             for m in CONVERSATION]
    short = CONVERSATION[:2]
    both = llm.chat([parts, short], params, use_tqdm=False)
    assert both[0].prompt_token_ids == expected and both[0].token_ids == solo.token_ids
    short_ids = template_ids(tokenizer, short)
    assert both[1].prompt_token_ids == short_ids
    assert both[1].token_ids == llm.generate([short_ids], params, use_tqdm=False)[0].token_ids
    closed = llm.chat(short, params, use_tqdm=False, add_generation_prompt=False)[0].prompt_token_ids
    assert short_ids[: len(closed)] == closed and len(closed) < len(short_ids)


@pytest.mark.parametrize("messages,match", [
    ([], "no conversations"),
    ([[]], "non-empty list of messages"),
    ([{"content": "hi"}], "string 'role'"),
    ([{"role": "user", "content": 3}], "content must be"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "only text parts"),
])
def test_bad_conversations_raise_value_errors(llm, messages, match):
    with pytest.raises(ValueError, match=match):
        llm.chat(messages, use_tqdm=False)
    assert not llm.engine.requests


def test_get_tokenizer_is_the_checkpoints(llm, tiny_path):
    """vLLM's ``LLM.get_tokenizer``: the checkpoint's tokenizer, as HF's AutoTokenizer loads it from the folder: the
    same ids for a text and the same rendered chat prompt."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_path)
    text = "Hello world, again"
    assert llm.get_tokenizer().encode(text) == hf.encode(text)
    messages = [{"role": "user", "content": text}]
    assert (llm.get_tokenizer().apply_chat_template(messages, tokenize=False)
            == hf.apply_chat_template(messages, tokenize=False))


def test_outputs_carry_the_prompt_text_they_were_given(llm, tiny_path):
    """vLLM's ``RequestOutput.prompt``: the text of a prompt given as text (a string, ``{"prompt": ...}``, the chat
    template's rendering of a conversation, as HF's tokenizer renders it), None for token ids; the prompt's token ids
    are the text's, encoded by HF's tokenizer."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_path)
    params = SamplingParams(max_tokens=2, **GREEDY)
    outs = llm.generate(["Hello there", {"prompt": "abc"}, [5, 6, 7], {"prompt_token_ids": [8, 9]}], params,
                        use_tqdm=False)
    assert [out.prompt for out in outs] == ["Hello there", "abc", None, None]
    assert outs[0].prompt_token_ids == hf.encode("Hello there", add_special_tokens=False)
    messages = [{"role": "user", "content": "Hi"}]
    [chat] = llm.chat(messages, params, use_tqdm=False)
    assert chat.prompt == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_chat_needs_a_tokenizer(llm, monkeypatch):
    monkeypatch.setattr(llm, "tokenizer", None)
    with pytest.raises(ValueError, match="tokenizer"):
        llm.chat(CONVERSATION, use_tqdm=False)


def test_truncate_prompt_tokens_keeps_the_prompts_end(llm):
    """vLLM's ``truncate_prompt_tokens``: the request runs on the prompt's last k tokens (its output's prompt ids),
    as a solo run of those tokens does, also where the whole prompt would not fit max_model_len (256)."""
    long = [(7 * i) % 250 for i in range(300)]
    params = SamplingParams(max_tokens=6, truncate_prompt_tokens=20, **GREEDY)
    out = llm.generate([long], params, use_tqdm=False)[0]
    solo = llm.generate([long[-20:]], SamplingParams(max_tokens=6, **GREEDY), use_tqdm=False)[0]
    assert (out.prompt_token_ids, out.token_ids) == (long[-20:], solo.token_ids)
    short = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0]
    assert short.prompt_token_ids == [5, 6, 7]


def test_max_tokens_none_generates_up_to_max_model_len(llm):
    """vLLM's ``max_tokens=None``: the request generates until its prompt and output fill max_model_len (256), the
    same tokens as a run asking for exactly that many; the caller's params keep None. min_tokens needs no
    max_tokens then."""
    prompt = [11, 12, 13, 14, 15]
    params = SamplingParams(max_tokens=None, min_tokens=3, **GREEDY)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    exact = llm.generate([prompt], SamplingParams(max_tokens=256 - len(prompt), **GREEDY), use_tqdm=False)[0]
    assert len(out.token_ids) == 256 - len(prompt) and out.outputs[0].finish_reason == "length"
    assert out.token_ids == exact.token_ids
    assert params.max_tokens is None
    with pytest.raises(ValueError, match="SamplingParams.max_tokens must be None or an int >= 1"):
        SamplingParams(max_tokens=0)


def test_detokenize_false_returns_the_same_tokens_without_text(llm, tokenizer):
    """vLLM's ``detokenize=False``: the tokens a detokenizing run of the same request generates, an empty text
    (``LLM.generate``) and no text in any of the engine's streamed outputs; stop strings need the text, so they
    raise ValueError with it (vLLM's rule)."""
    sampled = dict(temperature=0.8, seed=5, max_tokens=10, ignore_eos=True)
    with_text = llm.generate(["Hello world"], SamplingParams(**sampled), use_tqdm=False)[0]
    tokens_only = llm.generate(["Hello world"], SamplingParams(detokenize=False, **sampled), use_tqdm=False)[0]
    assert tokens_only.token_ids == with_text.token_ids
    assert with_text.text == tokenizer.decode(with_text.token_ids, skip_special_tokens=True)
    assert tokens_only.outputs[0].text == ""
    engine = llm.engine
    engine.add_request("streamed", tokenizer.encode("Hello world", add_special_tokens=False),
                       SamplingParams(detokenize=False, output_kind=RequestOutputKind.CUMULATIVE, **sampled))
    streamed = []
    while engine.has_unfinished_requests():
        streamed += [out for out in engine.step() if out.request_id == "streamed"]
    assert streamed[-1].finished and streamed[-1].token_ids == with_text.token_ids
    assert all(out.text is None for out in streamed)
    with pytest.raises(ValueError, match="SamplingParams.stop needs detokenize=True"):
        SamplingParams(stop=["\n"], detokenize=False)
    with pytest.raises(ValueError, match="SamplingParams.detokenize must be a bool"):
        SamplingParams(detokenize="no")


# --------------------------------------------------------------------------------------------------------------
# prompt_logprobs
# --------------------------------------------------------------------------------------------------------------


def check_prompt_logprobs(entries, prompt: list[int], log_softmax: torch.Tensor, k: int) -> None:
    """``entries`` against HF's float64 log-softmax over ``prompt`` (row p predicts token p + 1): None first, then
    each token's logprob and the k most likely (ids checked through their own logprobs: ties may order apart)."""
    assert len(entries) == len(prompt) and entries[0] is None
    for i in range(1, len(prompt)):
        entry, row = entries[i], log_softmax[i - 1]
        assert entry.token_id == prompt[i] and entry.logprob == pytest.approx(row[prompt[i]].item(), abs=LOGPROB_TOL)
        assert len(entry.top) == k
        top = row.topk(k).values.tolist()
        assert [v for _, v in entry.top] == pytest.approx(top, abs=LOGPROB_TOL), i
        assert all(row[t].item() == pytest.approx(v, abs=LOGPROB_TOL) for t, v in entry.top), i


@pytest.mark.parametrize("overlap", [False, True])
def test_prompt_logprobs_are_the_models_log_softmax(tiny_path, monkeypatch, overlap):
    """Against HF's float64 log-softmax of each prompt: prompts longer than the chunk (16 here) span several chunks,
    beside a request without prompt logprobs that decodes meanwhile; a prompt whose prefix is cached still gets every
    position (computed whole: no cached tokens, where the same prompt without prompt logprobs hits the cache); the
    generated tokens are those of runs without prompt logprobs."""
    monkeypatch.setattr(engine_module, "PROMPT_LOGPROBS_CHUNK", 16)
    model = hf_models.load_hf(tiny_path).double()
    rng = random.Random(4)
    first = [rng.randrange(256) for _ in range(80)]
    shared = first[:72] + [rng.randrange(256) for _ in range(9)]
    short = [rng.randrange(256) for _ in range(5)]
    llm = LLM(tiny_path, device="cpu", dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=3,
              overlap_decode=overlap, enable_prefix_caching=True, prefix_snapshot_interval=64)
    greedy = dict(temperature=0.0, ignore_eos=True, max_tokens=6)
    plain = [o.token_ids for o in llm.generate([first, short, shared], SamplingParams(**greedy), use_tqdm=False)]
    outs = llm.generate([first, short, [7, 8]],
                        [SamplingParams(prompt_logprobs=3, **greedy), SamplingParams(**dict(greedy, max_tokens=20)),
                         SamplingParams(prompt_logprobs=0, **greedy)], use_tqdm=False)
    with torch.no_grad():
        log_softmax = lambda ids: hf_models.hf_logits(model, ids).log_softmax(-1)  # noqa: E731
        check_prompt_logprobs(outs[0].prompt_logprobs, first, log_softmax(first), 3)
        check_prompt_logprobs(outs[2].prompt_logprobs, [7, 8], log_softmax([7, 8]), 0)
        assert outs[1].prompt_logprobs is None
        assert [outs[0].token_ids, outs[1].token_ids[:6]] == plain[:2]
        cached, whole = llm.generate([shared, shared], [SamplingParams(**greedy),
                                                        SamplingParams(prompt_logprobs=1, **greedy)], use_tqdm=False)
        assert cached.num_cached_tokens > 0 and whole.num_cached_tokens == 0
        check_prompt_logprobs(whole.prompt_logprobs, shared, log_softmax(shared), 1)
        assert cached.token_ids == whole.token_ids == plain[2]
    assert not llm.engine.requests


def test_prompt_logprobs_with_speculative_decoding_equal_plain_runs(llm, tiny_path):
    """With MTP drafting, a prompt that wants its logprobs is computed by plain prefill steps (every position's
    logits): its prompt logprobs and greedy tokens equal the plain engine's, beside a request that drafts."""
    spec_llm = LLM(tiny_path, device="cpu", enforce_eager=True, max_model_len=256, max_num_seqs=2,
                   speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    prompts = [[(3 * i) % 250 for i in range(40)], [9, 8, 7]]
    params = [SamplingParams(max_tokens=8, prompt_logprobs=2, **GREEDY), SamplingParams(max_tokens=12, **GREEDY)]
    drafted, plain = (e.generate(prompts, params, use_tqdm=False) for e in (spec_llm, llm))
    assert [o.token_ids for o in drafted] == [o.token_ids for o in plain]
    one, two = drafted[0].prompt_logprobs, plain[0].prompt_logprobs
    assert len(one) == len(two) == 40 and one[0] is None and drafted[1].prompt_logprobs is None
    assert [e.token_id for e in one[1:]] == [e.token_id for e in two[1:]]
    assert [e.logprob for e in one[1:]] == pytest.approx([e.logprob for e in two[1:]], abs=LOGPROB_TOL)
    assert [[t for t, _ in e.top] for e in one[1:]] == [[t for t, _ in e.top] for e in two[1:]]  # the top-2 ids
    assert [v for e in one[1:] for _, v in e.top] == pytest.approx([v for e in two[1:] for _, v in e.top],
                                                                   abs=LOGPROB_TOL)
    assert spec_llm.engine.num_verified_rows > 0

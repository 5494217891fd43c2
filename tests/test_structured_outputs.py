"""Structured outputs (SamplingParams.structured_outputs; compiled_engine/structured_output.py) on the embedded tiny
default model (CPU).

Oracles: the spec itself (Python's ``re.fullmatch`` for a regex, the choice list, ``json.loads`` and the schema's
keys and types); HF transformers' float64 logits, restricted to the tokens a fresh xgrammar matcher of the same
grammar allows and argmax'd token by token, for greedy outputs; solo runs for the unconstrained requests beside them.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from compiled_engine import LLM, SamplingParams
from compiled_engine.sampling_params import RequestOutputKind, StructuredOutputsParams
from tests import hf_models
from tests.test_stop_logprobs import tiny_path, tokenizer  # noqa: F401  (fixtures)

xgr = pytest.importorskip("xgrammar")  # compiled_engine[structured]: in the test extras, so CI runs these

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}
SPECS = {
    "regex": StructuredOutputsParams(regex=r"[ab]{2,4}-[0-9]{2}"),
    "choice": StructuredOutputsParams(choice=["red", "green", "blue"]),
    "json": StructuredOutputsParams(json=SCHEMA),
    "json_object": StructuredOutputsParams(json_object=True),
    "grammar": StructuredOutputsParams(grammar='root ::= "(" [xy]+ ")"'),
}


def conforms(kind: str, text: str) -> bool:
    if kind == "regex":
        return re.fullmatch(r"[ab]{2,4}-[0-9]{2}", text) is not None
    if kind == "choice":
        return text in ("red", "green", "blue")
    if kind == "grammar":
        return re.fullmatch(r"\([xy]+\)", text) is not None
    value = json.loads(text, strict=False)  # xgrammar's JSON strings may hold raw control characters
    if kind == "json_object":
        return isinstance(value, dict)
    return (set(value) == {"name", "n"} and isinstance(value["name"], str) and len(value["name"]) <= 6
            and isinstance(value["n"], int))


@pytest.fixture(scope="module", params=["sync", "overlap", "speculative"])
def llm(tiny_path, request):
    knobs = dict(device="cpu", dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=3,
                 overlap_decode=request.param != "sync")
    if request.param == "speculative":
        knobs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 2}
    return LLM(tiny_path, **knobs)


def test_outputs_conform_and_end_with_the_grammar(llm):
    """Every bounded kind (any JSON object can run past max_tokens: next test), greedy and seeded sampling, beside
    unconstrained requests (over three slots): each structured output is a complete instance of its spec that
    stopped on EOS when the grammar completed (also under ignore_eos); the unconstrained ones equal their solo
    runs."""
    sampled = dict(temperature=1.0, seed=5, ignore_eos=True)
    cases = [(k, s) for k in sorted(SPECS) if k != "json_object" for s in (dict(temperature=0.0), sampled)]
    params = [SamplingParams(max_tokens=120, structured_outputs=SPECS[k], **sampling) for k, sampling in cases]
    free = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
            SamplingParams(max_tokens=9, temperature=0.8, seed=3, ignore_eos=True)]
    prompts = [f"Give {k}: " for k, _ in cases] + ["Hello", "world"]
    outs = llm.generate(prompts, params + free, use_tqdm=False)
    eos = llm.tokenizer.eos_token_id
    for (kind, _), out in zip(cases, outs):
        assert out.finish_reason == "stop" and out.token_ids[-1] == eos, (kind, out.text, out.finish_reason)
        assert conforms(kind, out.text), (kind, out.text)
    for p, prompt, out in zip(free, ["Hello", "world"], outs[-2:]):
        assert out.token_ids == llm.generate(prompt, p, use_tqdm=False)[0].token_ids
    assert not llm.engine.requests and not llm.engine._adjusting


def test_a_json_object_is_an_object(llm, oracle):
    """``json_object`` (OpenAI's): HF's float64 greedy tokens under a fresh matcher of an object's grammar, up to the
    first near-tie; a finished output parses as an object (the tiny model's open-ended one may run to max_tokens)."""
    prompt, expected, decided = oracle["json_object"]
    assert decided >= 4
    params = SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=SPECS["json_object"])
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert out.token_ids[:decided] == expected[:decided]
    assert out.text.lstrip().startswith("{")
    if out.finish_reason == "stop":
        assert conforms("json_object", out.text)


@pytest.fixture(scope="module")
def oracle(tiny_path, tokenizer) -> dict[str, tuple[list[int], list[int], int]]:
    """Per spec (a regex, a JSON schema, json_object): a prompt, HF's float64 greedy continuation with the tokens a fresh matcher
    of the grammar does not allow at -inf, token by token, and how many of its tokens are decided (before the first
    step whose top two allowed logits lie within 1e-3)."""
    model = hf_models.load_hf(tiny_path).double()
    vocab = model.config.vocab_size
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab))
    grammars = {"regex": compiler.compile_regex(SPECS["regex"].regex),
                "json": compiler.compile_json_schema(json.dumps(SCHEMA)),
                "json_object": compiler.compile_json_schema('{"type": "object"}')}  # OpenAI's: any object
    prompt = tokenizer.encode("Data: ", add_special_tokens=False)
    results = {}
    for kind, grammar in grammars.items():
        matcher, expected, decided = xgr.GrammarMatcher(grammar), [], None
        bitmask = xgr.allocate_token_bitmask(1, vocab)
        with torch.no_grad():
            while not matcher.is_terminated() and len(expected) < 60:
                matcher.fill_next_token_bitmask(bitmask)
                allowed = ((bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:vocab]
                row = hf_models.hf_logits(model, prompt + expected)[-1].masked_fill(allowed == 0, float("-inf"))
                top2 = row.topk(2).values
                if decided is None and top2[0] - top2[1] < 1e-3:
                    decided = len(expected)
                expected.append(int(row.argmax()))
                assert matcher.accept_token(expected[-1])
        results[kind] = (prompt, expected, len(expected) if decided is None else decided)
    return results


def test_greedy_output_is_the_argmax_of_the_allowed_tokens(llm, oracle):
    """Against HF's float64 logits with the tokens a fresh matcher of the grammar does not allow at -inf, token by
    token (up to the first near-tie), for a regex and a JSON schema; streamed through engine.step as well."""
    for kind, (prompt, expected, decided) in oracle.items():
        spec = SPECS[kind]
        assert decided >= 4
        params = SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=spec)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        assert out.token_ids[:decided] == expected[:decided]
        llm.engine.add_request("s", prompt, SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=spec,
                                                           output_kind=RequestOutputKind.CUMULATIVE))
        while llm.engine.has_unfinished_requests():
            for streamed in llm.engine.step():
                pass
        assert streamed.token_ids == out.token_ids and streamed.text == out.text


@pytest.mark.parametrize("drafts", ["oracle", "wrong"])
def test_verify_rows_follow_the_grammar_past_the_drafts_before_them(tiny_path, oracle, drafts):
    """MTP k = 2 with drafts overridden by the oracle's own continuation (each verified row p is masked by the
    grammar past drafts[:p], so all decided ones are accepted) or by tokens next to it (rejected: the correction is
    drawn under the mask where the wrong one sat): the outputs equal the oracle's either way."""
    llm = LLM(tiny_path, device="cpu", dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=2,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    for kind, (prompt, expected, decided) in oracle.items():
        def override(request_id, token_ids, proposed):
            ahead = expected[len(token_ids) - len(prompt) :][:2]
            ahead = ahead + proposed[len(ahead) : 2]
            return ahead if drafts == "oracle" else [(t + 1) % 256 for t in ahead]

        llm.engine.draft_override = override
        before = (llm.engine.num_draft_tokens, llm.engine.num_accepted_tokens)
        params = SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=SPECS[kind])
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        assert out.token_ids[:decided] == expected[:decided], (kind, out.token_ids, expected, decided)
        assert out.finish_reason == "length" or conforms(kind, out.text)
        drafted = llm.engine.num_draft_tokens - before[0]
        accepted = llm.engine.num_accepted_tokens - before[1]
        assert drafted > 0 and (drafts == "wrong" or accepted >= 0.6 * drafted), (kind, drafted, accepted)


@pytest.mark.parametrize("fields,match", [
    (dict(regex="[a-", ), "could not be compiled"),
    (dict(grammar="root ::= "), "could not be compiled"),
    (dict(json="{not json"), "could not be compiled"),
])
def test_specs_xgrammar_refuses_raise_value_errors(llm, fields, match):
    with pytest.raises(ValueError, match=match):
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(**fields)), use_tqdm=False)
    assert not llm.engine.requests


@pytest.mark.parametrize("fields", [dict(), dict(regex="a", choice=["a"]), dict(choice=[]), dict(regex=""),
                                    dict(json=3), dict(json_object="yes")])
def test_malformed_specs_name_the_field(fields):
    with pytest.raises(ValueError, match="structured_outputs"):
        StructuredOutputsParams(**fields)


def test_structured_outputs_need_a_tokenizer(llm, monkeypatch):
    monkeypatch.setattr(llm.engine, "tokenizer", None)
    with pytest.raises(ValueError, match="tokenizer"):
        llm.engine.add_request(None, [1, 2], SamplingParams(structured_outputs=SPECS["choice"]))

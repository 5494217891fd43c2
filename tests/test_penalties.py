"""Logit bias and presence, frequency and repetition penalties (SamplingParams; compiled_engine/sampler.py
``apply_logit_bias_``, ``apply_penalties_``).

Oracles: the definitions (vLLM's and OpenAI's) written out in float64 here, token by token; HF transformers'
float64 logits of the embedded tiny default checkpoint, penalised by them and argmax'd, for the engine's greedy
outputs along its paths (synchronous and overlapped steps, decode rows of penalised requests beside prompts that
arrive later, speculative decoding on, the compiled decode).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from compiled_engine import LLM, SamplingParams
from compiled_engine import sampler
from compiled_engine.request import Request
from compiled_engine.sequence import Sequence
from compiled_engine.sampler import (LogitBias, Penalties, TokenMasks, apply_logit_bias_, apply_penalties_,
                                     apply_token_masks_)
from compiled_engine.tiny_model import ensure_tiny_model
from tests import hf_models
from tests.test_engine import heavy_settings

TIE = 1e-3  # compare greedy tokens up to the first step whose top two penalised logits are this close


def penalised(logits: torch.Tensor, prompt: list[int], output: list[int], presence: float = 0.0,
              frequency: float = 0.0, repetition: float = 1.0, bias: dict[int, float] | None = None,
              allowed: list[int] | None = None) -> torch.Tensor:
    """One row's allowed tokens, logit bias and penalties by their definition, in float64, in vLLM's order: every
    token but the allowed ones at -inf; the biases added; then a token seen in the prompt or the output has its
    logit divided by ``repetition`` when positive, multiplied when not; a token generated c times loses
    frequency * c + presence."""
    out = logits.double().clone()
    if allowed is not None:
        out[[t for t in range(out.shape[0]) if t not in allowed]] = float("-inf")
    for token, value in (bias or {}).items():
        out[token] += value
    for token in set(prompt) | set(output):
        out[token] = out[token] / repetition if out[token] > 0 else out[token] * repetition
    for token, count in Counter(output).items():
        out[token] -= frequency * count + presence
    return out


def padded(lists: list[list[int]], pad: int, width: int | None = None) -> torch.Tensor:
    width = max(1, max(map(len, lists))) if width is None else width
    return torch.tensor([row + [pad] * (width - len(row)) for row in lists], dtype=torch.int64)


@heavy_settings(max_examples=60)
@given(data=st.data(), batch=st.integers(1, 5), vocab=st.integers(2, 40), split_last=st.booleans())
def test_apply_penalties_matches_the_definition(data, batch, vocab, split_last):
    """Random rows, some penalised, with repeated tokens and empty lists; ``last_tokens`` (a decode step's input
    token on the device) counts like the output tokens; rows without penalties are left exactly as they were."""
    hundredths = lambda lo, hi: st.integers(lo, hi).map(lambda x: x / 100)  # noqa: E731  (no subnormals)
    logits = torch.tensor(data.draw(st.lists(st.lists(hundredths(-800, 800), min_size=vocab, max_size=vocab),
                                             min_size=batch, max_size=batch)), dtype=torch.float32)
    rows = sorted(data.draw(st.sets(st.integers(0, batch - 1), min_size=1)))
    token = st.integers(0, vocab - 1)
    prompts = [data.draw(st.lists(token, max_size=8)) for _ in rows]
    outputs = [data.draw(st.lists(token, min_size=1 if split_last else 0, max_size=12)) for _ in rows]
    presence, frequency = ([data.draw(hundredths(-200, 200)) for _ in rows] for _ in range(2))
    repetition = [data.draw(hundredths(10, 300)) for _ in rows]
    f32 = lambda xs: torch.tensor(xs, dtype=torch.float32)  # noqa: E731
    got = apply_penalties_(logits.clone(), Penalties(
        rows=torch.tensor(rows), prompt_tokens=padded(prompts, vocab),
        output_tokens=padded([o[:-1] if split_last else o for o in outputs], vocab),
        last_tokens=torch.tensor([o[-1] for o in outputs]) if split_last else None,
        presence=f32(presence), frequency=f32(frequency), repetition=f32(repetition)))
    expected = logits.double().clone()
    for i, row in enumerate(rows):
        expected[row] = penalised(logits[row], prompts[i], outputs[i], presence[i], frequency[i], repetition[i])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-5)
    untouched = [r for r in range(batch) if r not in rows]
    assert torch.equal(got[untouched], logits[untouched])


@given(st.lists(st.sampled_from(["token", "run", "placeholder", "read back", "table"]), max_size=80),
       st.integers(1, 2**40))
@example(["run"] * 12 + ["placeholder", "table", "read back", "token"], 3)  # 86 tokens: the buffer grows thrice
def test_output_array_follows_the_sequence(events, base):
    """``Request.output_array`` (the penalties' token table reads it every step) equals the sequence's output tokens
    however tokens arrive: appended read back one or several at a time, placed as a placeholder (kept apart until its
    real token replaces it, as an overlapped step does), and read at any point; past its buffer's first sizes."""
    seq = Sequence(0, [5, 6, 7], 3)
    request = Request("r", seq, SamplingParams(repetition_penalty=1.2), seed=0, stop_ids=frozenset(),
                      prompt_token_ids=[5, 6, 7])
    for i, event in enumerate(events):
        if event == "token" and not seq.num_placeholder_tokens:
            seq.token_ids.append(base + i)
        elif event == "run" and not seq.num_placeholder_tokens:  # a verify round's accepted tokens
            seq.token_ids.extend(base + 100 * i + j for j in range(7))
        elif event == "placeholder" and not seq.num_placeholder_tokens:
            seq.token_ids.append(0)
            seq.num_placeholder_tokens = 1
        elif event == "read back" and seq.num_placeholder_tokens:
            seq.token_ids[-1] = base + i
            seq.num_placeholder_tokens = 0
        for n in {seq.num_generated_tokens, seq.num_generated_tokens - seq.num_placeholder_tokens}:
            assert request.output_array(n).tolist() == seq.token_ids[3 : 3 + n]
    with pytest.raises(ValueError, match="-1 output tokens"):  # not a slice from the end of its buffer
        request.output_array(-1)


def test_apply_allowed_tokens_leaves_only_them():
    logits = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.25, -1.0], [4.0, 5.0, 6.0]])
    allowed = torch.tensor([[False, True, True], [True, False, False]])  # rows 0 and 2: tokens 1, 2 and token 0
    got = apply_token_masks_(logits.clone(), TokenMasks(torch.tensor([0, 2]), allowed))
    inf = float("-inf")
    assert torch.equal(got, torch.tensor([[inf, -2.0, 3.0], [0.5, 0.25, -1.0], [4.0, inf, inf]]))


def test_apply_logit_bias_adds_each_bias_to_its_logit():
    logits = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.25, -1.0]])
    got = apply_logit_bias_(logits.clone(), LogitBias(torch.tensor([0, 1, 1]), torch.tensor([2, 0, 2]),
                                             torch.tensor([-100.0, 2.5, 7.0])))
    assert torch.equal(got, torch.tensor([[1.0, -2.0, -97.0], [3.0, 0.25, 6.0]])) and logits[0, 2] == 3.0


@pytest.mark.parametrize("fields,field", [
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty=-2.1), "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(presence_penalty="1"), "presence_penalty"),
    (dict(logit_bias=[1]), "logit_bias"), (dict(logit_bias={"1": 2.0}), "logit_bias"),
    (dict(logit_bias={-1: 2.0}), "logit_bias"), (dict(logit_bias={1: 100.5}), "logit_bias"),
    (dict(logit_bias={1: True}), "logit_bias"), (dict(logit_bias={1: float("nan")}), "logit_bias"),
    (dict(allowed_token_ids=[]), "allowed_token_ids"), (dict(allowed_token_ids=["1"]), "allowed_token_ids"),
    (dict(allowed_token_ids=[-1]), "allowed_token_ids"), (dict(allowed_token_ids=3), "allowed_token_ids"),
])
def test_bad_penalties_name_the_field(fields, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**fields)


# --------------------------------------------------------------------------------------------------------------
# The engine against HF's logits
# --------------------------------------------------------------------------------------------------------------

# Prompts whose unpenalised greedy outputs repeat a token within 8-11 steps (the tiny model rarely repeats itself
# sooner), so that presence and frequency penalties have something to act on; the last two bias tokens of their
# unbiased outputs ([41]: 219, 115, 174, 71, ...; [112]: 85, 155, 48, 130, ...) down and others up, [41] its own
# prompt token, whose bias the repetition penalty then halves (vLLM's order: penalties after the bias; the other
# order outputs 41 first); [77, 30] may draw five tokens only, its prompt's two among them.
PROMPTS = [[5, 9, 5, 9, 5, 9, 5], [166, 32, 97, 113, 122, 72], [96], [3, 3, 3, 3, 3, 3],
           [183, 111, 71, 144, 252, 182, 42, 166, 17], [41], [112], [77, 30]]
PENALTIES = [dict(repetition_penalty=1.4), dict(frequency_penalty=1.5), dict(presence_penalty=2.0),
             dict(), dict(presence_penalty=-0.5, frequency_penalty=1.0, repetition_penalty=0.8),
             dict(logit_bias={41: 10.0, 219: -4.0, 71: -2.5}, repetition_penalty=2.0),
             dict(logit_bias={85: -100.0, 155: -6.0, 7: 2.0}),
             dict(allowed_token_ids=[10, 20, 30, 40, 77], repetition_penalty=1.5)]
LENGTHS = [14, 16, 14, 9, 16, 10, 8, 10]
ORACLE_NAMES = dict(presence_penalty="presence", frequency_penalty="frequency", repetition_penalty="repetition",
                    logit_bias="bias", allowed_token_ids="allowed")


@pytest.fixture(scope="module")
def tiny_path() -> str:
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def oracle(tiny_path) -> list[tuple[list[int], int]]:
    """Per request: HF's float64 greedy continuation under its penalties, and how many of its tokens are decided
    (before the first step whose top two penalised logits lie within TIE)."""
    model = hf_models.load_hf(tiny_path).double()
    results = []
    with torch.no_grad():
        for prompt, penalties, length in zip(PROMPTS, PENALTIES, LENGTHS):
            kwargs = {ORACLE_NAMES[name]: value for name, value in penalties.items()}
            output, decided = [], None
            for step in range(length):
                row = penalised(hf_models.hf_logits(model, prompt + output)[-1], prompt, output, **kwargs)
                top2 = row.topk(2).values
                if decided is None and top2[0] - top2[1] < TIE:
                    decided = step
                output.append(int(row.argmax()))
            results.append((output, length if decided is None else decided))
    return results


def test_the_oracle_is_decided_and_the_penalties_change_the_output(tiny_path, oracle):
    """The comparison below covers most tokens, and without their penalties or biases most requests' outputs differ
    (so a run that ignored them would fail it)."""
    assert sum(d for _, d in oracle) >= 0.8 * sum(LENGTHS), oracle
    model = hf_models.load_hf(tiny_path).double()
    changed = [hf_models.hf_greedy_no_cache(model, p, n)[:d] != out[:d]
               for (out, d), p, n, kw in zip(oracle, PROMPTS, LENGTHS, PENALTIES) if kw]
    assert sum(changed) >= 5, changed


GPU = pytest.mark.gpu


@pytest.mark.parametrize("mode", ["sync", "overlap", "overlap-chunked", "speculative", "compiled",
                                  pytest.param("cuda", marks=GPU), pytest.param("cuda-speculative", marks=GPU)])
def test_greedy_outputs_follow_the_penalised_logits(tiny_path, oracle, mode, monkeypatch):
    """Eight requests over two slots (later ones join running ones, so prompt chunks meet penalised decode rows), one
    without penalties or bias; each greedy output equals the oracle's over its decided tokens (on the GPU compiled and
    overlapped, with MTP drafts and without). And every token of a penalised request was drawn with exactly its prompt
    and its output before it counted (the tokens each ``apply_penalties_`` call saw, against the final output): one
    call per token, none counting an in-flight placeholder, which a near-tie-free output alone could miss.
    ``overlap-chunked``: prompt steps of at most 12 tokens, so the second prompt's last token runs as a decode row
    beside the first's (its input, on the device, is a prompt token: no output token to count)."""
    on_gpu = mode.startswith("cuda")
    knobs = dict(device="cuda" if on_gpu else "cpu", dtype="float32", max_model_len=128, max_num_seqs=2,
                 enforce_eager=mode in ("sync", "overlap", "overlap-chunked", "speculative"),
                 overlap_decode=mode != "sync")
    if mode == "overlap-chunked":
        knobs["max_num_batched_tokens"] = 12
    if mode.endswith("speculative"):
        knobs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 2}
    llm = LLM(tiny_path, **knobs)
    seen: list[tuple[list[int], list[int]]] = []  # (prompt, output so far) of each penalised row drawn
    uncounted = []  # rows whose device token was not an output token (a prompt's last token as a decode row)

    def recording(logits, penalties):
        vocab = logits.shape[-1]
        last = [None] * len(penalties.rows) if penalties.last_tokens is None else penalties.last_tokens.tolist()
        for prompt, output, token in zip(penalties.prompt_tokens.tolist(), penalties.output_tokens.tolist(), last):
            if token == vocab:
                uncounted.append(prompt)
            seen.append(([t for t in prompt if t != vocab],
                         [t for t in output if t != vocab] + ([] if token in (None, vocab) else [token])))
        return apply_penalties_(logits, penalties)

    monkeypatch.setattr(sampler, "apply_penalties_", recording)
    params = [SamplingParams(temperature=0, ignore_eos=True, max_tokens=n, **kw) for n, kw in zip(LENGTHS, PENALTIES)]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for out, (expected, decided) in zip(outs, oracle):
        assert out.token_ids[:decided] == expected[:decided], (out.request_id, out.token_ids, expected, decided)
    assert not llm.engine.requests and not llm.engine._adjusting
    if mode.endswith("speculative"):  # drafting stays on: verify rows count the drafts before them (next test)
        assert llm.engine.num_verified_rows > 0
        return
    for prompt, out, kw in zip(PROMPTS, outs, PENALTIES):
        drawn = sorted(len(output) for p, output in seen if p == prompt)
        assert drawn == (list(range(len(out.token_ids))) if SamplingParams(**kw).penalized else []), (prompt, drawn)
        assert all(output == out.token_ids[: len(output)] for p, output in seen if p == prompt), prompt
    assert bool(uncounted) == (mode == "overlap-chunked"), uncounted  # the chunked mode met the case it is for


def continuation_drafts(prompts: list[list[int]], outputs: list[list[int]], wrong: bool):
    """A draft override proposing each request's expected continuation (found by its prompt's first token; the
    drafter's own proposals past its end), or the tokens next to it (``wrong``: every draft rejected)."""
    by_first = {prompt[0]: (len(prompt), output) for prompt, output in zip(prompts, outputs)}

    def override(request_id, token_ids, proposed):
        start, expected = by_first[token_ids[0]]
        ahead = expected[len(token_ids) - start :][: len(proposed)]
        ahead = ahead + proposed[len(ahead) :]
        return [(t + 1) % 256 for t in ahead] if wrong else ahead

    return override


@pytest.mark.parametrize("drafts", ["oracle", "wrong"])
def test_verify_rounds_count_the_drafts_before_each_position(tiny_path, oracle, drafts):
    """MTP k = 2 with drafts overridden by the oracle's own continuation (each verified row p of a penalised request
    draws as if drafts[:p] were accepted, so all decided ones are) or by tokens next to it (rejected: the correction
    is drawn at the position where the wrong one sat): the outputs equal the oracle's either way."""
    llm = LLM(tiny_path, device="cpu", dtype="float32", max_model_len=128, max_num_seqs=2, enforce_eager=True,
              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    llm.engine.draft_override = continuation_drafts(PROMPTS, [expected for expected, _ in oracle], drafts == "wrong")
    params = [SamplingParams(temperature=0, ignore_eos=True, max_tokens=n, **kw) for n, kw in zip(LENGTHS, PENALTIES)]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for out, (expected, decided) in zip(outs, oracle):
        assert out.token_ids[:decided] == expected[:decided], (out.request_id, out.token_ids, expected, decided)
    engine = llm.engine
    assert engine.num_draft_tokens > 0
    if drafts == "oracle":
        assert engine.num_accepted_tokens >= 0.6 * engine.num_draft_tokens, (engine.num_accepted_tokens,
                                                                             engine.num_draft_tokens)



def test_seeded_sampling_with_penalties_is_the_same_with_drafting(tiny_path):
    """Seeded sampled requests with penalties and a logit bias draw the very tokens of their non-speculative runs
    with MTP k = 2 (the verify rows' draws use the same per-output-index noise and, with the drafts before them
    counted, the same distributions)."""
    sampled = [SamplingParams(temperature=0.9, top_k=40, seed=20 + i, ignore_eos=True, max_tokens=n, **kw)
               for i, (n, kw) in enumerate(zip(LENGTHS, PENALTIES))]
    knobs = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=2, enforce_eager=True)
    plain = LLM(tiny_path, **knobs).generate(PROMPTS, sampled, use_tqdm=False)
    llm = LLM(tiny_path, **knobs, speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    drafted = llm.generate(PROMPTS, sampled, use_tqdm=False)
    assert [o.token_ids for o in drafted] == [o.token_ids for o in plain]
    assert llm.engine.num_verified_rows > 0

"""Overlapped steps (``LLM(overlap_decode=True)``): the host schedules the next step, prefill, mixed or decode,
before reading this one's tokens back. It must change no output: every test runs the same requests through the
synchronous engine (the oracle, itself checked against HF in tests/test_engine.py) or HF directly, and compares token
for token, finish reason for finish reason, with nothing leaked. The random streams run under each scheduling policy:
mixed steps launched as one varlen step ("fused") or as a decode step then a prefill step ("split"), prefill first,
and the defaults (growth reserve on); the first three admit without a reserve, so that they preempt.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, strategies as st

from compiled_engine import SamplingParams
from tests.test_engine import GREEDY, MODEL, assert_clean, check_invariants, drain, heavy_settings, make_llm, prompt
from tests import hf_models


@pytest.fixture(scope="module")
def model_path(build_hf_model):
    return build_hf_model(MODEL)


ENGINE_KNOBS = dict(max_num_seqs=4, num_kv_blocks=12, max_num_batched_tokens=64)
CACHING = dict(enable_prefix_caching=True, prefix_snapshot_interval=64, num_prefix_snapshots=2)
# Scheduling policies: (LLM knobs, max_fused_decode_rows or None for the engine's own)
POLICIES = {
    "fused": (dict(kv_growth_reserve=0.0), 1 << 20),
    "split": (dict(kv_growth_reserve=0.0), 0),
    "prefill_first": (dict(kv_growth_reserve=0.0, mixed_steps=False), None),
    "defaults": ({}, None),
}


def engine_pair(path, policy: str, **knobs):
    """(synchronous, overlapped) engines with the same knobs, under one scheduling policy."""
    llm_knobs, fused_rows = POLICIES[policy]
    pair = tuple(make_llm(path, overlap_decode=o, **llm_knobs, **knobs).engine for o in (False, True))
    if fused_rows is not None:
        for engine in pair:
            engine.max_fused_decode_rows = fused_rows
    return pair


@pytest.fixture(scope="module", params=sorted(POLICIES))
def engines(model_path, request):
    """(synchronous, overlapped) engines, small enough that KV blocks run short (preemption, sync fallbacks)."""
    return engine_pair(model_path, request.param, **ENGINE_KNOBS)


@pytest.fixture(scope="module", params=sorted(POLICIES))
def caching_engines(model_path, request):
    """The same pair with prefix caching on: a 64-token snapshot interval and room for only 2 snapshots."""
    return engine_pair(model_path, request.param, **ENGINE_KNOBS, **CACHING)


def run(engine, requests, abort=None, late=(), prompt_logprobs=None):
    """Queue ``requests`` ((id, prompt, params)), then step to the end: ``abort`` = (id, k) aborts that request once
    it has reported k tokens (a point both engines reach with the same tokens: the overlapped one reports each token
    one step later), and the ``late`` ones join after 4 steps, or once every request has finished or been aborted if
    that comes first (the synchronous engine can be done with a short stream a step before the overlapped one, which
    reads its last tokens back a step later; either way the late ones then run alone). Returns {id: (token_ids,
    finish_reason)}; fills ``prompt_logprobs`` (a dict) with the prompt logprobs of the requests that asked."""
    prompt_logprobs = {} if prompt_logprobs is None else prompt_logprobs
    for rid, tokens, params in requests:
        engine.add_request(rid, tokens, params)
    reported, aborted, step, joined = {}, {}, 0, False

    def on_step():
        nonlocal step, joined
        step += 1
        check_invariants(engine)
        if abort is not None and abort[0] in engine.requests and len(reported.get(abort[0], ())) >= abort[1]:
            out = engine.abort_request(abort[0])
            aborted[out.request_id] = (out.token_ids, out.finish_reason)
        if not joined and (step == 4 or not engine.has_unfinished_requests()):  # after the abort: it can end them
            joined = True
            for rid, tokens, params in late:
                engine.add_request(rid, tokens, params)

    finals = drain(engine, on_step=on_step, streamed=reported)
    assert_clean(engine)
    for o in finals.values():  # prompt logprobs, where asked: (token, logprob) per prompt token after the first
        if o.prompt_logprobs is not None:
            prompt_logprobs[o.request_id] = [(e.token_id, e.logprob) for e in o.prompt_logprobs[1:]]
    return {**{rid: (o.token_ids, o.finish_reason) for rid, o in finals.items()}, **aborted}


def stop_token_of(engine, tokens, params) -> int:
    """A token the synchronous engine generates mid-way for this request: a stop token that really fires."""
    (generated, _), = run(engine, [("probe", tokens, params)]).values()
    return generated[len(generated) // 2]


STREAMS = dict(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    max_tokens=st.lists(st.integers(1, 12), min_size=6, max_size=6),
    sampled=st.booleans(),
    abort_after=st.one_of(st.none(), st.integers(1, 4)),
    seed=st.integers(0, 3),
    adjusted=st.booleans(),
)


def check_stream(engines, lengths, max_tokens, sampled, abort_after, seed, adjusted):
    """The same request stream through both engines gives the same tokens and finish reasons. ``adjusted``: requests
    with penalties and a logit bias among them (sampled from their logits, penalised rows in decode steps of their
    own), and a late one with prompt logprobs (its prompt steps apart, all positions' logits)."""
    sync, overlapped = engines
    base = dict(temperature=0.8, top_k=20, seed=seed) if sampled else dict(GREEDY)
    base.pop("ignore_eos", None)
    requests = []
    for i, n in enumerate(lengths):
        params = SamplingParams(max_tokens=max_tokens[i], ignore_eos=True, **base)
        requests.append((f"r{i}", prompt(n, seed), params))
    # one request stops on a token it really generates, one not before min_tokens
    rid, tokens, params = requests[0]
    stop = stop_token_of(sync, tokens, SamplingParams(max_tokens=12, ignore_eos=True, **base))
    requests[0] = (rid, tokens, SamplingParams(max_tokens=12, stop_token_ids=[stop], **base))
    if adjusted:
        for i, extra in ((1, dict(repetition_penalty=1.3, frequency_penalty=0.5)),
                         (2, dict(logit_bias={5: 3.0, 9: -2.0}, presence_penalty=0.7))):
            if i < len(requests):
                rid, tokens, params = requests[i]
                requests[i] = (rid, tokens, dataclasses.replace(params, **extra))
    late = [
        ("late", prompt(7, seed + 1), SamplingParams(max_tokens=5, min_tokens=3, stop_token_ids=[stop],
                                                     prompt_logprobs=2 if adjusted else None, **base)),
        ("long", prompt(120, seed), SamplingParams(max_tokens=20, ignore_eos=True, **base)),  # max_model_len stops it
    ]
    abort = ("r1", abort_after) if abort_after is not None and len(requests) > 1 else None
    expected_logprobs, got_logprobs = {}, {}
    expected = run(sync, requests, abort, late, expected_logprobs)
    assert run(overlapped, requests, abort, late, got_logprobs) == expected
    assert got_logprobs.keys() == expected_logprobs.keys() and ("late" in expected_logprobs) == adjusted
    for rid, entries in expected_logprobs.items():  # the same positions' logits in other batches: fp32 rounding apart
        assert [t for t, _ in got_logprobs[rid]] == [t for t, _ in entries]
        assert [v for _, v in got_logprobs[rid]] == pytest.approx([v for _, v in entries], abs=1e-4)


@heavy_settings(6)
@given(**STREAMS)
def test_overlapped_outputs_equal_synchronous(engines, lengths, max_tokens, sampled, abort_after, seed, adjusted):
    check_stream(engines, lengths, max_tokens, sampled, abort_after, seed, adjusted)


@heavy_settings(6)
@given(**STREAMS)
def test_overlapped_outputs_equal_synchronous_with_prefix_caching(caching_engines, lengths, max_tokens, sampled,
                                                                  abort_after, seed, adjusted):
    check_stream(caching_engines, lengths, max_tokens, sampled, abort_after, seed, adjusted)


@pytest.mark.parametrize("caching", [{}, CACHING])
def test_a_prefill_in_flight_hands_its_tokens_to_the_next_decode(model_path, caching, monkeypatch):
    """Prefill first (no mixed steps), prefill steps are left in flight too: the next decode takes the new sequences'
    first tokens from the device and the older sequences' last tokens from the host (both kinds in one step, checked
    with a spy), a prompt chunked over several steps runs next to them, and a request finished by its prefill token
    alone (max_tokens=1) is not decoded. Outputs equal the synchronous engine's. KV blocks to spare, so that no step
    falls back to reading the in-flight one back first."""
    knobs = dict(ENGINE_KNOBS, num_kv_blocks=40, mixed_steps=False, **caching)
    sync, overlapped = (make_llm(model_path, overlap_decode=o, **knobs).engine for o in (False, True))
    mixed = []
    next_input_ids = type(overlapped)._next_input_ids

    def spy(self, seqs, in_flight):
        in_flight_ids = {r.seq.seq_id for r in in_flight.requests}
        mixed.append(len({s.seq_id in in_flight_ids for s in seqs}) == 2)
        return next_input_ids(self, seqs, in_flight)

    monkeypatch.setattr(type(overlapped), "_next_input_ids", spy)
    decoded_prompt_lengths = set()  # the prompt lengths of the sequences in the overlapped engine's decode steps
    build_step = overlapped.runtime.build_step

    def watched_build_step(seqs, counts, is_prefill, *args, **kwargs):
        if not is_prefill:
            decoded_prompt_lengths.update(s.num_prompt_tokens for s in seqs)
        return build_step(seqs, counts, is_prefill, *args, **kwargs)

    monkeypatch.setattr(overlapped.runtime, "build_step", watched_build_step)

    def params(n):
        return SamplingParams(max_tokens=n, **GREEDY)

    requests = [("a", prompt(5, 7), params(14)), ("b", prompt(9, 7), params(1))]
    late = [("c", prompt(100, 7), params(6)), ("d", prompt(3, 7), params(1)), ("e", prompt(7, 7), params(5))]
    assert run(overlapped, requests, late=late) == run(sync, requests, late=late)
    assert any(mixed)
    # b and d (prompts of 9 and 3 tokens) finish with their prefill token: never a decode row; a, c and e decode
    assert decoded_prompt_lengths == {5, 100, 7}, decoded_prompt_lengths


@pytest.mark.parametrize("caching", [{}, CACHING])
@pytest.mark.parametrize("split", [False, True])
def test_a_mixed_step_takes_in_flight_tokens_from_the_device(model_path, caching, split, monkeypatch):
    """A mixed step right after another: a's decode row takes its input, the in-flight step's token, from the device
    while b's decode row (the last token of its prompt, left by the token budget) and c's prompt chunk come from the
    host, all in one step: scattered into the packed prefill ids (one varlen step), or as the input ids of the decode
    part (split). Checked with a spy; outputs equal the synchronous engine's."""
    sync, overlapped = engine_pair(model_path, "split" if split else "fused", max_num_seqs=4, num_kv_blocks=40,
                                   max_num_batched_tokens=16, **caching)
    both = []
    name = "_next_input_ids" if split else "_carried_input_ids"
    real = getattr(type(overlapped), name)

    def spy(self, batch_or_seqs, in_flight):
        seqs = batch_or_seqs if split else batch_or_seqs.seqs[: batch_or_seqs.num_decode]
        in_flight_ids = {r.seq.seq_id for r in in_flight.requests}
        if self.scheduler.num_mixed_steps:
            both.append(len({s.seq_id in in_flight_ids for s in seqs}) == 2)
        return real(self, batch_or_seqs, in_flight)

    monkeypatch.setattr(type(overlapped), name, spy)
    params = SamplingParams(max_tokens=8, **GREEDY)
    # step 1: a's 5 tokens and 11 of b's 12; step 2: a and b decode rows, 14 tokens of c
    requests = [("a", prompt(5, 8), params), ("b", prompt(12, 8), params), ("c", prompt(70, 8), params)]
    assert run(overlapped, requests) == run(sync, requests)
    assert any(both)
    assert overlapped.scheduler.num_mixed_steps >= 4


@pytest.mark.parametrize("split", [False, True])
def test_a_boundary_crossed_by_a_decode_row_of_a_mixed_step_is_snapshotted_once_read_back(model_path, split):
    """Prefix caching with overlap and mixed steps: a prompt streaming in 16-token chunks keeps the steps mixed while
    two requests decode across the 64-token snapshot boundary, their inputs placeholders until read back. Turn 2
    hits at 64 only if that snapshot was keyed by the right tokens, and decodes the same tokens only if it holds the
    state right after the crossing step."""
    from tests.test_prefix_cache import assert_clean as assert_cache_clean

    results = []
    for overlap in (False, True):
        llm = make_llm(model_path, overlap_decode=overlap, max_model_len=256, max_num_batched_tokens=16,
                       enable_prefix_caching=True, prefix_snapshot_interval=64, num_prefix_snapshots=8)
        llm.engine.max_fused_decode_rows = 0 if split else 1 << 20
        turn1 = [prompt(60, 21), prompt(62, 22), prompt(200, 23)]  # the first two cross 64 while the third streams
        replies = llm.generate(turn1, SamplingParams(max_tokens=12, **GREEDY), use_tqdm=False)
        assert llm.engine.scheduler.num_mixed_steps >= 10
        turn2 = [p + r.token_ids + prompt(9, 24) for p, r in zip(turn1[:2], replies)]
        answers = llm.generate(turn2, SamplingParams(max_tokens=8, **GREEDY), use_tqdm=False)
        assert_cache_clean(llm)
        results.append([(o.token_ids, o.num_cached_tokens) for o in replies + answers])
    synchronous, overlapped = results
    assert [cached for _, cached in synchronous] == [0, 0, 0, 64, 64]  # the case under test happens
    assert overlapped == synchronous


@pytest.mark.parametrize("policy", ["fused", "split"])
def test_mixed_steps_under_preemption_and_aborts_equal_the_synchronous_engine(model_path, policy):
    """Mixed steps with overlap where KV blocks run out (admission without the growth reserve): the overlapped engine
    reads its in-flight step back before a step could preempt a sequence whose last token is a placeholder, then
    preempts; a request aborted while its token is in flight reports only what was read. Outputs equal the
    synchronous engine's (itself HF-checked), and both really preempt and mix."""
    sync, overlapped = engine_pair(model_path, policy, block_size=4, num_kv_blocks=26, max_model_len=96,
                                   max_num_seqs=4, max_num_batched_tokens=16)
    params = [SamplingParams(max_tokens=20, **GREEDY), SamplingParams(temperature=0.9, seed=3, max_tokens=18)]
    requests = [(f"r{i}", prompt(n, 25), params[i % 2]) for i, n in enumerate((30, 26, 22, 35))]
    late = [("late", prompt(9, 26), params[1])]
    expected = run(sync, requests, abort=("r1", 5), late=late)
    assert run(overlapped, requests, abort=("r1", 5), late=late) == expected
    assert expected["r1"][1] == "abort"
    for engine in (sync, overlapped):
        assert engine.scheduler.num_preemptions > 0 and engine.scheduler.num_mixed_steps > 0


def test_overlapped_decode_snapshots_boundaries_it_crosses_like_the_synchronous_one(model_path):
    """Prefix caching with overlap: a snapshot boundary reached while decoding is keyed by tokens the host reads
    back one step late, and must still be taken from the state right after that step. Turn 2 of each conversation
    (turn 1's prompt + reply + more) hits only if turn 1 left the decode-time snapshot at 64 under the right key,
    and decodes the same tokens only if that snapshot holds the right state."""
    from tests.test_prefix_cache import assert_clean as assert_cache_clean

    results = []
    for overlap in (False, True):
        llm = make_llm(model_path, overlap_decode=overlap, max_model_len=256, enable_prefix_caching=True,
                       prefix_snapshot_interval=64, num_prefix_snapshots=4)
        turn1 = [prompt(58, 1), prompt(63, 2), prompt(40, 3)]  # each crosses 64 while decoding
        replies = llm.generate(turn1, SamplingParams(max_tokens=30, **GREEDY), use_tqdm=False)
        turn2 = [p + r.token_ids + prompt(9, 4) for p, r in zip(turn1, replies)]
        answers = llm.generate(turn2, SamplingParams(max_tokens=8, **GREEDY), use_tqdm=False)
        assert_cache_clean(llm)
        results.append([(o.token_ids, o.num_cached_tokens) for o in replies + answers])
    synchronous, overlapped = results
    assert [cached for _, cached in synchronous] == [0, 0, 0, 64, 64, 64]  # the case under test happens
    assert overlapped == synchronous


def test_overlapped_generate_equals_hf_greedy(model_path, load_hf_model):
    prompts = [prompt(n, 5) for n in (3, 17, 40)]
    llm = make_llm(model_path, overlap_decode=True, max_num_seqs=3)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=10, **GREEDY), use_tqdm=False)
    model = load_hf_model(MODEL)
    assert [o.token_ids for o in outputs] == [hf_models.hf_greedy(model, p, 10) for p in prompts]
    assert_clean(llm.engine)


def test_decode_step_input_ids_replace_the_last_tokens_and_are_checked(model_path):
    rt = make_llm(model_path).runtime
    a, b = rt.add_sequence(prompt(5)), rt.add_sequence(prompt(9))
    rt.prefill([a, b])
    a.token_ids.append(11)
    b.token_ids.append(22)
    expected = rt.decode_step([a, b])
    a2, b2 = rt.add_sequence(prompt(5)), rt.add_sequence(prompt(9))
    rt.prefill([a2, b2])
    a2.token_ids.append(0)  # placeholders: the device ids win
    b2.token_ids.append(0)
    with pytest.raises(ValueError, match=r"input_ids must be \[2\] int64"):
        rt.decode_step([a2, b2], input_ids=torch.tensor([11, 22], dtype=torch.int32))
    assert a2.num_computed_tokens == 5  # a refused step reserves and advances nothing
    got = rt.decode_step([a2, b2], input_ids=torch.tensor([11, 22]))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_prefill_device_input_ids_replace_packed_tokens_and_are_checked(model_path):
    """``Runtime.prefill(device_input_ids=(indices, tokens))``: the packed step's ids at those token indices are the
    device's. A mixed step (a 1-token row, then a 6-token chunk) whose row holds a placeholder on the host gives the
    logits of the same step with the real token on the host."""
    rt = make_llm(model_path).runtime
    logits = []
    for placeholder in (False, True):
        a, b = rt.add_sequence(prompt(5, 30)), rt.add_sequence(prompt(9, 30))
        rt.prefill([a])
        a.token_ids.append(0 if placeholder else 17)
        if not placeholder:
            logits.append(rt.prefill([a, b], [1, 6]))
            continue
        bad = (torch.tensor([0]), torch.tensor([17], dtype=torch.int32))
        with pytest.raises(ValueError, match="device_input_ids must be two"):
            rt.prefill([a, b], [1, 6], device_input_ids=bad)
        assert a.num_computed_tokens == 5 and b.num_computed_tokens == 0  # a refused step advances nothing
        logits.append(rt.prefill([a, b], [1, 6], device_input_ids=(torch.tensor([0]), torch.tensor([17]))))
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=0)


def test_abort_of_a_request_in_flight_reports_only_its_read_tokens(engines):
    sync, overlapped = engines
    requests = [(f"r{i}", prompt(5 + i, 9), SamplingParams(max_tokens=10, **GREEDY)) for i in range(3)]
    expected = run(sync, requests, abort=("r1", 2))
    assert expected["r1"][1] == "abort" and len(expected["r1"][0]) == 2
    assert run(overlapped, requests, abort=("r1", 2)) == expected


def test_length_stops_compute_no_extra_token(engines, monkeypatch):
    """A sequence whose in-flight token is its last (max_tokens, max_model_len) is left out of the next step, decode
    or mixed: the overlapped engine computes exactly the tokens the synchronous one does (only EOS / stop-token stops
    cost a row). Counted at ``build_step``, which every step goes through."""
    requests = [
        ("a", prompt(4, 1), SamplingParams(max_tokens=3, **GREEDY)),
        ("b", prompt(9, 1), SamplingParams(max_tokens=7, **GREEDY)),
        ("long", prompt(120, 1), SamplingParams(max_tokens=20, **GREEDY)),  # stopped by max_model_len=128
    ]
    rows = []
    for engine in engines:
        computed = []
        real = engine.runtime.build_step
        monkeypatch.setattr(engine.runtime, "build_step",
                            lambda seqs, counts, *a, **kw: computed.append(sum(counts)) or real(seqs, counts, *a, **kw))
        results = run(engine, requests)
        rows.append((sum(computed), results))
        monkeypatch.undo()
    assert rows[0] == rows[1]
    assert rows[0][0] >= 4 + 9 + 120 + 2 + 6 + 7  # prompts, then every generated token but the last of each

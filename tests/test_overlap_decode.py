"""Overlapped steps (``LLM(overlap_decode=True)``): the host schedules the next step, prefill or decode, before
reading this one's tokens back. It must change no output: every test runs the same requests through the synchronous
engine (the oracle, itself checked against HF in tests/test_engine.py) or HF directly, and compares token for token,
finish reason for finish reason, with nothing leaked.
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def engines(model_path):
    """(synchronous, overlapped) engines, small enough that KV blocks run short (preemption, sync fallbacks)."""
    return (make_llm(model_path, **ENGINE_KNOBS).engine,
            make_llm(model_path, overlap_decode=True, **ENGINE_KNOBS).engine)


@pytest.fixture(scope="module")
def caching_engines(model_path):
    """The same pair with prefix caching on: a 64-token snapshot interval and room for only 2 snapshots."""
    return (make_llm(model_path, **ENGINE_KNOBS, **CACHING).engine,
            make_llm(model_path, overlap_decode=True, **ENGINE_KNOBS, **CACHING).engine)


def run(engine, requests, abort=None, late=()):
    """Queue ``requests`` ((id, prompt, params)), then step to the end: the ``late`` ones join after 4 steps, and
    ``abort`` = (id, k) aborts that request once it has reported k tokens (a point both engines reach with the
    same tokens: the overlapped one reports each token one step later). Returns {id: (token_ids, finish_reason)}."""
    for rid, tokens, params in requests:
        engine.add_request(rid, tokens, params)
    reported, aborted, step = {}, {}, 0

    def on_step():
        nonlocal step
        step += 1
        check_invariants(engine)
        if step == 4:
            for rid, tokens, params in late:
                engine.add_request(rid, tokens, params)
        if abort is not None and abort[0] in engine.requests and len(reported.get(abort[0], ())) >= abort[1]:
            out = engine.abort_request(abort[0])
            aborted[out.request_id] = (out.token_ids, out.finish_reason)

    finals = drain(engine, on_step=on_step, streamed=reported)
    assert_clean(engine)
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
)


def check_stream(engines, lengths, max_tokens, sampled, abort_after, seed):
    """The same request stream through both engines gives the same tokens and finish reasons."""
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
    late = [
        ("late", prompt(7, seed + 1), SamplingParams(max_tokens=5, min_tokens=3, stop_token_ids=[stop], **base)),
        ("long", prompt(120, seed), SamplingParams(max_tokens=20, ignore_eos=True, **base)),  # max_model_len stops it
    ]
    abort = ("r1", abort_after) if abort_after is not None and len(requests) > 1 else None
    expected = run(sync, requests, abort, late)
    assert run(overlapped, requests, abort, late) == expected


@heavy_settings(6)
@given(**STREAMS)
def test_overlapped_outputs_equal_synchronous(engines, lengths, max_tokens, sampled, abort_after, seed):
    check_stream(engines, lengths, max_tokens, sampled, abort_after, seed)


@heavy_settings(6)
@given(**STREAMS)
def test_overlapped_outputs_equal_synchronous_with_prefix_caching(caching_engines, lengths, max_tokens, sampled,
                                                                  abort_after, seed):
    check_stream(caching_engines, lengths, max_tokens, sampled, abort_after, seed)


@pytest.mark.parametrize("caching", [{}, CACHING])
def test_a_prefill_in_flight_hands_its_tokens_to_the_next_decode(model_path, caching, monkeypatch):
    """Prefill steps are left in flight too: the next decode takes the new sequences' first tokens from the device
    and the older sequences' last tokens from the host (both kinds in one step, checked with a spy), a prompt chunked
    over several steps runs next to them, and a request finished by its prefill token alone (max_tokens=1) is not
    decoded. Outputs equal the synchronous engine's. KV blocks to spare, so that no step falls back to reading the
    in-flight one back first."""
    knobs = dict(ENGINE_KNOBS, num_kv_blocks=40, **caching)
    sync, overlapped = (make_llm(model_path, overlap_decode=o, **knobs).engine for o in (False, True))
    mixed = []
    next_input_ids = type(overlapped)._next_input_ids

    def spy(self, seqs, in_flight):
        in_flight_ids = {r.seq.seq_id for r in in_flight.requests}
        mixed.append(len({s.seq_id in in_flight_ids for s in seqs}) == 2)
        return next_input_ids(self, seqs, in_flight)

    monkeypatch.setattr(type(overlapped), "_next_input_ids", spy)

    def params(n):
        return SamplingParams(max_tokens=n, **GREEDY)

    requests = [("a", prompt(5, 7), params(14)), ("b", prompt(9, 7), params(1))]
    late = [("c", prompt(100, 7), params(6)), ("d", prompt(3, 7), params(1)), ("e", prompt(7, 7), params(5))]
    assert run(overlapped, requests, late=late) == run(sync, requests, late=late)
    assert any(mixed)


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


def test_abort_of_a_request_in_flight_reports_only_its_read_tokens(engines):
    sync, overlapped = engines
    requests = [(f"r{i}", prompt(5 + i, 9), SamplingParams(max_tokens=10, **GREEDY)) for i in range(3)]
    expected = run(sync, requests, abort=("r1", 2))
    assert expected["r1"][1] == "abort" and len(expected["r1"][0]) == 2
    assert run(overlapped, requests, abort=("r1", 2)) == expected


def test_length_stops_compute_no_extra_token(engines, monkeypatch):
    """A sequence whose in-flight token is its last (max_tokens, max_model_len) is left out of the next step: the
    overlapped engine decodes exactly the rows the synchronous one does (only EOS / stop-token stops cost a row)."""
    requests = [
        ("a", prompt(4, 1), SamplingParams(max_tokens=3, **GREEDY)),
        ("b", prompt(9, 1), SamplingParams(max_tokens=7, **GREEDY)),
        ("long", prompt(120, 1), SamplingParams(max_tokens=20, **GREEDY)),  # stopped by max_model_len=128
    ]
    rows = []
    for engine in engines:
        decoded = []
        real = engine.runtime.decode_step
        monkeypatch.setattr(engine.runtime, "decode_step", lambda seqs, **kw: decoded.append(len(seqs)) or real(seqs, **kw))
        results = run(engine, requests)
        rows.append((sum(decoded), results))
        monkeypatch.undo()
    assert rows[0] == rows[1]

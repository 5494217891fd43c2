"""LLMEngine and its scheduler on a tiny HF-verified model (CPU, fp32, eager): the behaviour docs/ARCHITECTURE.md "Scheduling"
promises, each checked step by step, with HF transformers' greedy tokens as the oracle for every output.

* new requests join while others decode: with mixed steps (the default) the decode-ready sequences ride in the
  prefill step as 1-token rows in front of the prefill chunks, so none waits more than one step while prefill work
  streams in; without, prefill steps go first and interleave with decode steps;
* chunked prefill never exceeds ``max_num_batched_tokens`` (decode rows included) and a chunked prompt's output is
  unchanged;
* admission keeps KV blocks for the running sequences to reach their length limits (``kv_growth_reserve``): a load
  that preempts without the reserve runs without a preemption with it;
* at most ``max_num_seqs`` sequences run; each running sequence holds one state slot, distinct and stable for its
  life, freed when it finishes;
* preemption by recompute when KV blocks run out: the victim's blocks and slot are freed, it is requeued at the
  front of the waiting queue with its tokens so far, and its output (greedy or seeded sampling) is unchanged;
* aborting a waiting, a mid-prefill or a decoding request frees everything it holds;
* RequestOutput carries the prompt and generated ids, the stream of new ids, the finish reason and timings;
  ``LLM.generate`` draws a tqdm bar unless ``use_tqdm=False``.

The helpers at the top (``make_llm``, ``drain``, ``assert_clean``, ``StepRecorder``) are shared by the other engine
test modules.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compiled_engine import LLM, LLMEngine, RequestOutput, RequestOutputKind, SamplingParams
from compiled_engine.sequence import Sequence
from tests import hf_models

MODEL = "qwen3_5_text_untied"
VOCAB = hf_models.QWEN3_5_TEXT_VOCAB
GREEDY = dict(temperature=0.0, ignore_eos=True)


# --------------------------------------------------------------------------------------------------------------
# Helpers (shared with test_sampling, test_api_errors, test_scheduler_properties)
# --------------------------------------------------------------------------------------------------------------


def heavy_settings(max_examples: int, **kw) -> settings:
    """Hypothesis settings for tests that run the model: the `ci` profile (derandomised: the same examples on every
    run, no deadline) with a modest example count, whatever profile is loaded, unless a `thorough` run is asked."""
    if settings.get_current_profile_name() == "thorough":
        return settings(**kw)
    return settings(settings.get_profile("ci"), max_examples=max_examples, **kw)


def make_llm(path, **knobs) -> LLM:
    """A CPU fp32 eager LLM with small defaults; ``knobs`` override them (RuntimeConfig fields,
    max_num_batched_tokens, overlap_decode). Its engine is the synchronous one, whose ``step()`` returns each step's
    own tokens, which these tests drive step by step; tests/test_overlap_decode.py compares LLM's default, the
    overlapped engine, against it."""
    config = dict(max_model_len=128, max_num_seqs=4, block_size=16, max_num_batched_tokens=256, overlap_decode=False)
    config.update(knobs)
    return LLM(str(path), device="cpu", dtype="float32", enforce_eager=True, **config)


def prompt(length: int, seed: int = 0) -> list[int]:
    rng = random.Random(f"{length}/{seed}")
    return [rng.randrange(VOCAB) for _ in range(length)]


def drain(engine: LLMEngine, max_steps: int = 5000, on_step=None, streamed=None) -> dict[str, RequestOutput]:
    """Step until no request is left. Returns each request's final output; checks that the streamed new ids add
    up to the final token ids and that nothing is reported after it finished. ``streamed`` (a dict, filled in as
    the steps go: request id -> new ids reported so far) lets ``on_step`` see what has been reported."""
    finals: dict[str, RequestOutput] = {}
    streamed = {} if streamed is None else streamed
    streamed.update({rid: list(r.seq.generated_token_ids) for rid, r in engine.requests.items()})
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            assert out.request_id not in finals, f"{out.request_id} reported after it finished"
            streamed.setdefault(out.request_id, []).extend(out.new_token_ids)
            assert out.token_ids == streamed[out.request_id]
            if out.finished:
                finals[out.request_id] = out
        if on_step is not None:
            on_step()
    else:
        raise AssertionError(f"requests still unfinished after {max_steps} steps: {list(engine.requests)}")
    return finals


def assert_clean(engine: LLMEngine) -> None:
    """No request, queue entry, KV block or state slot is left behind."""
    runtime, scheduler = engine.runtime, engine.scheduler
    assert not engine.requests and not engine._with_logprobs
    assert not scheduler.waiting and not scheduler.running
    blocks = runtime.caches.blocks
    assert blocks.num_free == runtime.cache_config.num_kv_blocks - 1
    assert sorted(blocks.free + list(getattr(blocks, "evictable", ()))) == list(range(1, blocks.num_blocks))
    assert not any(getattr(blocks, "refcount", ()))
    assert runtime.caches.slots.num_free == runtime.config.max_num_seqs
    assert sorted(runtime.caches.slots.free) == list(range(1, runtime.config.max_num_seqs + 1))


def check_invariants(engine: LLMEngine) -> None:
    """Resource accounting that must hold between any two steps (prefix caching off: no block is shared)."""
    runtime, scheduler = engine.runtime, engine.scheduler
    running, waiting = scheduler.running, list(scheduler.waiting)
    assert len(running) <= scheduler.max_num_seqs
    slots = [s.state_slot for s in running]
    assert None not in slots and len(set(slots)) == len(slots), f"slots {slots}"
    assert runtime.caches.slots.num_free == runtime.config.max_num_seqs - len(running)
    assert not set(slots) & set(runtime.caches.slots.free)
    held = [b for s in running for b in s.block_table]
    assert len(held) == len(set(held)), "a KV block is held twice"
    assert 0 not in held and 0 not in runtime.caches.blocks.free
    assert len(runtime.caches.blocks.free) == len(set(runtime.caches.blocks.free))
    assert not set(held) & set(runtime.caches.blocks.free), "a held block is also free"
    assert len(held) + runtime.caches.blocks.num_free == runtime.cache_config.num_kv_blocks - 1, "leaked KV blocks"
    for seq in waiting:
        assert seq.state_slot is None and not seq.block_table and seq.num_computed_tokens == 0
    for seq in running:
        assert len(seq.block_table) * runtime.config.block_size >= seq.num_computed_tokens
    live = {r.seq for r in engine.requests.values()}
    assert set(running) | set(waiting) == live and not set(running) & set(waiting)


@dataclass
class Scheduled:
    is_prefill: bool
    seq_ids: list[int]
    num_tokens: list[int]
    slots: list[int]  # state slot of each scheduled sequence
    running: dict[int, int]  # seq_id -> state slot of every running sequence after scheduling
    num_decode: int = 0  # leading decode rows (all of a decode step)
    ready: tuple[int, ...] = ()  # running sequences with exactly one uncomputed token after scheduling


class StepRecorder:
    """Wraps ``engine.scheduler.schedule`` and records every batch it returns."""

    def __init__(self, engine: LLMEngine):
        self.batches: list[Scheduled] = []
        scheduler = engine.scheduler
        schedule = scheduler.schedule

        def recording_schedule():
            batch = schedule()
            if batch is not None:
                self.batches.append(
                    Scheduled(
                        batch.is_prefill,
                        [s.seq_id for s in batch.seqs],
                        list(batch.num_tokens),
                        [s.state_slot for s in batch.seqs],
                        {s.seq_id: s.state_slot for s in scheduler.running},
                        batch.num_decode,
                        tuple(s.seq_id for s in scheduler.running if s.num_uncomputed_tokens == 1),
                    )
                )
            return batch

        scheduler.schedule = recording_schedule


_HF_CACHE: dict[tuple, list[int]] = {}


def hf_greedy(load_hf_model, tokens: list[int], max_new_tokens: int) -> list[int]:
    """HF transformers' greedy continuation (cached; a shorter request's answer is a prefix of a longer one's)."""
    for (key, n), out in _HF_CACHE.items():
        if key == tuple(tokens) and n >= max_new_tokens:
            return out[:max_new_tokens]
    out = hf_models.hf_greedy(load_hf_model(MODEL), tokens, max_new_tokens)
    _HF_CACHE[(tuple(tokens), max_new_tokens)] = out
    return out


def seq_of(engine: LLMEngine, request_id: str) -> Sequence:
    return engine.requests[request_id].seq


# --------------------------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path(build_hf_model):
    return build_hf_model(MODEL)


# --------------------------------------------------------------------------------------------------------------
# Continuous batching
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixed", [True, False])
def test_new_requests_join_while_others_decode(model_path, load_hf_model, mixed):
    llm = make_llm(model_path, max_num_seqs=4, mixed_steps=mixed)
    engine = llm.engine
    rec = StepRecorder(engine)
    a, b, c = prompt(10), prompt(7), prompt(23)
    engine.add_request("a", a, SamplingParams(max_tokens=12, **GREEDY))
    for _ in range(3):  # a: prefill, then two decode steps
        engine.step()
    assert [x.is_prefill for x in rec.batches] == [True, False, False]
    engine.add_request("b", b, SamplingParams(max_tokens=6, **GREEDY))
    engine.step()
    # b's prefill runs while a is still running (mid-decode, holding its slot), and the next decode has both. With
    # mixed steps a decodes in that very step, as a 1-token row in front of b's prompt.
    join = rec.batches[-1]
    a_id, b_id = seq_of(engine, "a").seq_id, seq_of(engine, "b").seq_id
    assert join.is_prefill and set(join.running) == {a_id, b_id}
    if mixed:
        assert (join.seq_ids, join.num_tokens, join.num_decode) == ([a_id, b_id], [1, len(b)], 1)
    else:
        assert (join.seq_ids, join.num_decode) == ([b_id], 0)
    engine.step()
    assert not rec.batches[-1].is_prefill and rec.batches[-1].seq_ids == [a_id, b_id]
    engine.add_request("c", c, SamplingParams(max_tokens=4, **GREEDY))
    finals = drain(engine)
    assert_clean(engine)
    c_prefill = next(i for i, x in enumerate(rec.batches) if x.is_prefill and len(x.running) == 3)
    assert not rec.batches[c_prefill + 1].is_prefill and len(rec.batches[c_prefill + 1].seq_ids) == 3
    assert (engine.scheduler.num_mixed_steps > 0) == mixed
    for rid, tokens, n in (("a", a, 12), ("b", b, 6), ("c", c, 4)):
        assert finals[rid].token_ids == hf_greedy(load_hf_model, tokens, n), rid
        assert finals[rid].finish_reason == "length"


def test_mixed_steps_carry_every_decode_ready_sequence_first(model_path, load_hf_model):
    """Requests arriving over time with a 16-token budget: every step takes every decode-ready running sequence, as
    the leading 1-token rows of a prefill step when prompt chunks are left to compute (the budget counting them too),
    and the outputs are HF's."""
    budget = 16
    engine = make_llm(model_path, max_num_seqs=4, max_num_batched_tokens=budget).engine
    rec = StepRecorder(engine)
    specs = [(5, 12, 0), (40, 6, 0), (9, 10, 2), (33, 8, 3), (1, 7, 5), (27, 9, 9), (16, 5, 12)]
    prompts = {f"r{i}": prompt(n, 12) for i, (n, _, _) in enumerate(specs)}
    step = 0

    def arrive():
        for i, (_, max_tokens, at) in enumerate(specs):
            if at == step:
                engine.add_request(f"r{i}", prompts[f"r{i}"], SamplingParams(max_tokens=max_tokens, **GREEDY))

    def on_step():
        nonlocal step
        step += 1
        arrive()
        check_invariants(engine)

    arrive()
    finals = drain(engine, on_step=on_step)
    assert_clean(engine)
    for x in rec.batches:
        assert sum(x.num_tokens) <= budget
        assert x.num_tokens[: x.num_decode] == [1] * x.num_decode  # decode rows lead
        assert set(x.ready) <= set(x.seq_ids), "a decode-ready sequence was left out of a step"
        if not x.is_prefill:
            assert x.num_decode == len(x.seq_ids)
    mixed = [x for x in rec.batches if x.is_prefill and x.num_decode and max(x.num_tokens) > 1]
    assert len(mixed) >= 3 and engine.scheduler.num_mixed_steps == len([x for x in rec.batches if x.is_prefill
                                                                         and x.num_decode])
    assert any(sum(x.num_tokens) == budget for x in mixed)  # prompt chunks fill what the decode rows leave
    for i, (n, max_tokens, _) in enumerate(specs):
        assert finals[f"r{i}"].token_ids == hf_greedy(load_hf_model, prompts[f"r{i}"], max_tokens), i


@pytest.mark.parametrize("mixed", [True, False])
def test_a_decoding_sequence_waits_at_most_one_step_while_prompts_stream_in(model_path, load_hf_model, mixed):
    """One request decodes while three 90-token prompts stream in through a 16-token budget (prefill work for more
    than 15 steps). Counted in engine steps between its tokens: with mixed steps it gets a token every step; prefill
    first, it waits for consecutive prefill steps (the contrast that makes the count mean something)."""
    engine = make_llm(model_path, max_num_seqs=4, max_num_batched_tokens=16, mixed_steps=mixed).engine
    tokens = prompt(6, 13)
    engine.add_request("a", tokens, SamplingParams(max_tokens=30, **GREEDY))
    engine.step()  # a's prefill: its first token
    for i in range(3):
        engine.add_request(f"p{i}", prompt(90, 14 + i), SamplingParams(max_tokens=3, **GREEDY))
    steps_of_a, step, finals = [0], 0, {}
    while "a" in engine.requests:
        step += 1
        outputs = engine.step()
        steps_of_a += [step for out in outputs if out.request_id == "a"]
        finals.update({out.request_id: out for out in outputs if out.finished})
        assert step < 500
    gaps = [b - a for a, b in zip(steps_of_a, steps_of_a[1:])]
    assert len(steps_of_a) == 30
    if mixed:
        assert gaps == [1] * 29
        assert engine.scheduler.num_mixed_steps >= 15
    else:
        assert max(gaps) >= 5
    finals.update(drain(engine))
    assert_clean(engine)
    assert engine.scheduler.num_prefill_tokens == len(tokens) + 3 * 90  # decode rows are not prefill tokens
    assert finals["a"].token_ids == hf_greedy(load_hf_model, tokens, 30)
    for i in range(3):
        assert finals[f"p{i}"].token_ids == hf_greedy(load_hf_model, prompt(90, 14 + i), 3), i


@pytest.mark.parametrize("split", [False, True])
def test_a_mixed_step_with_many_decode_rows_runs_them_as_a_decode_step_first(model_path, load_hf_model, split,
                                                                             monkeypatch):
    """Beyond ``max_fused_decode_rows`` decode rows, a mixed step runs them through the decode path, then its prompt
    chunks through the prefill path, in the same engine step; below it, one varlen prefill step carries both. The
    same tokens (HF's) either way."""
    engine = make_llm(model_path, max_num_seqs=4, max_num_batched_tokens=16).engine
    engine.max_fused_decode_rows = 0 if split else 64
    calls: list[tuple[str, list[int]]] = []
    runtime = engine.runtime
    decode, prefill = runtime.decode, runtime.prefill
    monkeypatch.setattr(runtime, "decode", lambda seqs, **kw: calls.append(("decode", [1] * len(seqs)))
                        or decode(seqs, **kw))
    monkeypatch.setattr(runtime, "prefill", lambda seqs, counts, *a, **kw: calls.append(("prefill", list(counts)))
                        or prefill(seqs, counts, *a, **kw))
    prompts = {"a": prompt(7, 15), "b": prompt(8, 15), "c": prompt(45, 15)}
    engine.add_request("a", prompts["a"], SamplingParams(max_tokens=9, **GREEDY))
    engine.add_request("b", prompts["b"], SamplingParams(max_tokens=9, **GREEDY))
    engine.step()  # a and b: prompts
    engine.add_request("c", prompts["c"], SamplingParams(max_tokens=4, **GREEDY))
    del calls[:]
    engine.step()  # a and b decode, c's first chunk
    if split:
        assert calls == [("decode", [1, 1]), ("prefill", [14])]
    else:
        assert calls == [("prefill", [1, 1, 14])]
    finals = drain(engine)
    assert_clean(engine)
    for rid, n in (("a", 9), ("b", 9), ("c", 4)):
        assert finals[rid].token_ids == hf_greedy(load_hf_model, prompts[rid], n), rid


def test_chunked_prefill_under_token_budget(model_path, load_hf_model):
    budget = 16
    llm = make_llm(model_path, max_num_seqs=8, max_num_batched_tokens=budget)
    engine = llm.engine
    rec = StepRecorder(engine)
    lengths = (45, 16, 17, 3, 1, 33)
    prompts = {f"r{n}": prompt(n, 1) for n in lengths}
    for rid, tokens in prompts.items():
        engine.add_request(rid, tokens, SamplingParams(max_tokens=5, **GREEDY))
    seqs = {rid: seq_of(engine, rid) for rid in prompts}
    finals = drain(engine)
    assert_clean(engine)
    prefills = [x for x in rec.batches if x.is_prefill]
    assert all(sum(x.num_tokens) <= budget for x in prefills)
    assert any(sum(x.num_tokens) == budget for x in prefills)  # the budget is used, not just respected
    assert any(len(x.seq_ids) > 1 for x in prefills)  # a continuing chunk and a new prompt share a step
    per_seq: dict[int, list[int]] = {}
    for x in rec.batches:
        for sid, n in zip(x.seq_ids, x.num_tokens):
            per_seq.setdefault(sid, []).append(n)
    for rid, tokens in prompts.items():
        chunks = per_seq[seqs[rid].seq_id]
        # The prompt is computed in chunks of at most `budget` tokens, then one token per decode step.
        prompt_chunks, computed = [], 0
        while computed < len(tokens):
            prompt_chunks.append(chunks[len(prompt_chunks)])
            computed += prompt_chunks[-1]
        assert computed == len(tokens) and max(prompt_chunks) <= budget
        assert len(prompt_chunks) >= -(-len(tokens) // budget)
        assert chunks[len(prompt_chunks) :] == [1] * (len(chunks) - len(prompt_chunks))
        assert finals[rid].token_ids == hf_greedy(load_hf_model, tokens, 5), rid
    long_seq = seqs["r45"].seq_id
    assert len([x for x in prefills if long_seq in x.seq_ids]) >= 3


def test_at_most_max_num_seqs_run(model_path, load_hf_model):
    llm = make_llm(model_path, max_num_seqs=3, max_num_batched_tokens=64)
    engine = llm.engine
    rec = StepRecorder(engine)
    prompts = {f"r{i}": prompt(5 + 3 * i, 2) for i in range(8)}
    for i, (rid, tokens) in enumerate(prompts.items()):
        engine.add_request(rid, tokens, SamplingParams(max_tokens=3 + i % 4, **GREEDY))
    finals = drain(engine, on_step=lambda: check_invariants(engine))
    assert_clean(engine)
    assert max(len(x.running) for x in rec.batches) == 3
    assert all(len(x.seq_ids) <= 3 for x in rec.batches)
    for i, (rid, tokens) in enumerate(prompts.items()):
        assert finals[rid].token_ids == hf_greedy(load_hf_model, tokens, 3 + i % 4), rid


@pytest.mark.parametrize("budget, max_model_len, max_num_seqs", [(64, 24, 8), (64, 32, 8), (40, 128, 4), (200, 24, 3)])
def test_the_startup_prefill_is_the_schedulers_largest_step(model_path, budget, max_model_len, max_num_seqs):
    """The start-up step that sizes the memory plan and warms the kernels (memory_plan.measure_activation_peak) has the
    shape of the largest step the scheduler builds: full-length prompts, more than fit, cut by its token budget."""
    from compiled_engine.memory_plan import largest_prefill_lengths

    llm = make_llm(model_path, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                   max_num_batched_tokens=budget, block_size=4, num_kv_blocks=512)
    engine = llm.engine
    for i in range(max_num_seqs + 2):
        engine.add_request(f"r{i}", prompt(max_model_len, i), SamplingParams(max_tokens=1, **GREEDY))
    first = engine.scheduler.schedule()
    assert first.is_prefill
    assert first.num_tokens == largest_prefill_lengths(budget, max_model_len, max_num_seqs)
    for rid in [f"r{i}" for i in range(max_num_seqs + 2)]:
        engine.abort_request(rid)


@given(budget=st.integers(1, 70000), key_heads=st.integers(1, 64), data=st.data())
def test_startup_prefills_cover_every_fla_l2norm_bucket_a_step_can_meet(budget, key_heads, data):
    """Every prefill step of at most ``budget`` tokens falls in an l2norm autotune bucket that a start-up prefill
    (the largest step, then ``l2norm_bucket_totals``) already met. Bucket of a step: FLA 0.6's
    ``cdiv(tokens * heads, 2048 * 32)`` (fla/modules/norm/l2norm.py), written out here."""
    from compiled_engine.memory_plan import l2norm_bucket_totals

    def bucket(tokens):
        return -(-tokens * key_heads // (2048 * 32))

    warmed = {bucket(t) for t in [budget, *l2norm_bucket_totals(budget, key_heads)]}
    assert all(t <= budget for t in l2norm_bucket_totals(budget, key_heads))
    served = data.draw(st.integers(1, budget))
    assert bucket(served) in warmed


@given(budget=st.integers(1, 40000), max_model_len=st.integers(1, 9000), max_num_seqs=st.integers(1, 300),
       limit=st.integers(0, 2048))
def test_startup_warms_the_chunked_delta_rule_in_both_integer_classes(budget, max_model_len, max_num_seqs, limit):
    """Past the delta rule's short-step limit (``limit``) the chunked form runs; the largest start-up steps give it
    totals that are multiples of 16 (whenever they are), and ``chunked_warmup_lengths`` the other class (Triton's
    integer specialisation, written out here): a step the scheduler could build, past the limit, with every sequence
    inside ``max_model_len``; nothing where no served step gets past the limit."""
    from compiled_engine.memory_plan import chunked_warmup_lengths

    most = min(budget, max_model_len * max_num_seqs)  # the largest step the scheduler builds
    steps = chunked_warmup_lengths(budget, max_model_len, max_num_seqs, limit)
    if not steps:  # of limit + 1 and limit + 2 one is in the other class: neither fits
        assert most < limit + 3
        return
    (lengths,) = steps
    total = sum(lengths)
    assert limit < total <= most and total % 16 != 0 and total != 1
    assert len(lengths) <= max_num_seqs and all(0 < n <= max_model_len for n in lengths)


def test_startup_runs_a_prefill_in_every_l2norm_bucket(model_path, monkeypatch):
    """memory_plan.measure_activation_peak (the start-up steps, CUDA-only) run on the CPU with the memory calls stubbed
    and FLA's bucket shrunk to 16 rows, so that a 64-token budget spans several buckets: the prefill steps it runs must
    meet the bucket of every step size the scheduler can build."""
    import compiled_engine.memory_plan as memory_plan
    from compiled_engine.runtime import Runtime

    monkeypatch.setattr(memory_plan, "FLA_L2NORM_BUCKET_ROWS", 16)
    for name in ("synchronize", "reset_peak_memory_stats", "memory_allocated", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, **kwargs: 0)
    rt = Runtime.from_pretrained(model_path, device="cpu", max_num_batched_tokens=64, max_model_len=32,
                                 max_num_seqs=4, num_kv_blocks=64)
    key_heads = rt.model_config.linear_num_key_heads
    seen = []
    forward = rt.model.forward
    monkeypatch.setattr(rt.model, "forward",
                        lambda step: seen.append((step.is_prefill, step.input_ids.shape[0])) or forward(step))
    memory_plan.measure_activation_peak(rt.model, rt.config, rt.max_model_len, rt.device, rt.dtype)
    assert (False, 4) in seen  # the decode step at max_num_seqs ran too
    eager_steps = list(seen)
    memory_plan.measure_activation_peak(rt.model, rt.config, rt.max_model_len, rt.device, rt.dtype, 48)
    assert seen[len(eager_steps):] == eager_steps + [(True, 48)]  # and the captured prompt steps' largest, last

    def bucket(tokens):
        return -(-tokens * key_heads // 16)

    warmed = {bucket(tokens) for is_prefill, tokens in seen if is_prefill}
    assert len(warmed) > 4  # more buckets than the fixed start-up shapes alone would meet
    assert all(bucket(tokens) in warmed for tokens in range(1, 65)), (sorted(warmed), key_heads)


def test_one_state_slot_per_sequence_stable_for_its_life(model_path):
    llm = make_llm(model_path, max_num_seqs=3, max_num_batched_tokens=24)
    engine = llm.engine
    rec = StepRecorder(engine)
    for i in range(7):
        engine.add_request(f"r{i}", prompt(4 + 7 * i, 3), SamplingParams(max_tokens=2 + i, **GREEDY))
    drain(engine, on_step=lambda: check_invariants(engine))
    assert_clean(engine)
    assert engine.scheduler.num_preemptions == 0
    slot_of: dict[int, int] = {}
    life: dict[int, list[int]] = {}  # seq -> batch indices where it was running
    for i, x in enumerate(rec.batches):
        assert len(set(x.running.values())) == len(x.running), "two running sequences share a slot"
        assert all(1 <= s <= 3 for s in x.running.values())
        for sid, slot in x.running.items():
            assert slot_of.setdefault(sid, slot) == slot, f"sequence {sid} changed slot"
            life.setdefault(sid, []).append(i)
    for sid, steps in life.items():  # running from admission to finish without a gap
        assert steps == list(range(steps[0], steps[-1] + 1))
    assert len(slot_of) == 7 and len(set(slot_of.values())) == 3  # 7 lives share the 3 slots: freed and reused


def test_one_scheduling_pass_zeroes_every_fresh_slot_and_nothing_else(model_path):
    """The slots a prefill pass admits into are zeroed together at its end (one fill per state tensor): a slot's
    previous sequence leaves no state behind, and the other slots keep theirs."""
    engine = make_llm(model_path, max_num_seqs=4, max_num_batched_tokens=256).engine
    runtime = engine.runtime
    pools = [t for layer in runtime.model.layers if hasattr(layer.mixer, "recurrent_state")
             for t in (layer.mixer.recurrent_state, layer.mixer.conv_state)]
    for pool in pools:
        pool.fill_(7.0)  # what finished sequences might have left
    for i in range(3):
        engine.add_request(f"r{i}", prompt(5 + i), SamplingParams(max_tokens=1, **GREEDY))
    batch = engine.scheduler.schedule()  # admits all three, runs nothing
    slots = sorted(s.state_slot for s in batch.seqs)
    assert batch.is_prefill and len(slots) == 3
    for pool in pools:
        assert not pool[slots].any()
        others = [s for s in range(pool.shape[0]) if s not in slots]
        assert (pool[others] == 7.0).all()


# --------------------------------------------------------------------------------------------------------------
# Preemption by recompute
# --------------------------------------------------------------------------------------------------------------


class PreemptionProbe:
    """Wraps ``scheduler._preempt`` and checks what every preemption frees and keeps."""

    def __init__(self, engine: LLMEngine):
        self.victims: list[int] = []
        scheduler, runtime = engine.scheduler, engine.runtime
        preempt = scheduler._preempt

        def probed(seq: Sequence):
            assert seq in scheduler.running and seq.state_slot is not None
            blocks_before, slots_before = runtime.caches.blocks.num_free, runtime.caches.slots.num_free
            held, tokens = list(seq.block_table), list(seq.token_ids)
            preempt(seq)
            assert seq not in scheduler.running and scheduler.waiting[0] is seq  # front of the queue
            assert seq.block_table == [] and seq.state_slot is None and seq.num_computed_tokens == 0
            assert runtime.caches.blocks.num_free == blocks_before + len(held)
            assert set(held) <= set(runtime.caches.blocks.free)
            assert runtime.caches.slots.num_free == slots_before + 1
            assert seq.token_ids == tokens  # prompt and generated tokens are kept, to be recomputed
            self.victims.append(seq.seq_id)

        scheduler._preempt = probed


# Admission by this step's blocks only (no growth reserve): the load below must run out of blocks mid-decode.
PREEMPTING = dict(block_size=4, num_kv_blocks=26, max_model_len=96, max_num_seqs=4, max_num_batched_tokens=32,
                  kv_growth_reserve=0.0)


def test_preemption_by_recompute_keeps_greedy_output(model_path, load_hf_model):
    llm = make_llm(model_path, **PREEMPTING)  # 25 blocks of 4 tokens: two sequences of ~50 tokens fill it
    engine = llm.engine
    probe = PreemptionProbe(engine)
    prompts = {f"r{i}": prompt(n, 4) for i, n in enumerate((30, 26, 22, 35, 9))}
    for rid, tokens in prompts.items():
        engine.add_request(rid, tokens, SamplingParams(max_tokens=20, **GREEDY))
    finals = drain(engine, on_step=lambda: check_invariants(engine))
    assert_clean(engine)
    assert engine.scheduler.num_preemptions == len(probe.victims) >= 2
    for rid, tokens in prompts.items():
        assert finals[rid].token_ids == hf_greedy(load_hf_model, tokens, 20), rid
        assert finals[rid].finish_reason == "length"


def growth_to_limits(engine: LLMEngine) -> int:
    """KV blocks the running sequences still need to reach their length limits: prompt + max_tokens, capped by
    max_model_len, less the last token (never computed)."""
    size = engine.runtime.config.block_size
    total = 0
    for request in engine.requests.values():
        seq = request.seq
        if seq in engine.scheduler.running:
            limit = min(seq.num_prompt_tokens + request.params.max_tokens, engine.runtime.max_model_len)
            total += max(0, -(-(limit - 1) // size) - len(seq.block_table))
    return total


@pytest.mark.parametrize("reserve", [0.0, 1.0])
def test_admission_reserves_the_growth_of_running_sequences(model_path, load_hf_model, reserve):
    """25 blocks of 4 tokens, five requests of 9-18 prompt tokens growing by 20. Admitting by prompt blocks alone
    (reserve 0) runs out of blocks mid-decode and preempts; with the full reserve (the default) the free blocks
    always cover what the running sequences still need, nothing is preempted, and still three run at once. The
    outputs are HF's either way."""
    llm = make_llm(model_path, **dict(PREEMPTING, kv_growth_reserve=reserve))
    engine = llm.engine
    rec = StepRecorder(engine)
    prompts = {f"r{i}": prompt(n, 16) for i, n in enumerate((14, 10, 9, 18, 9))}
    for rid, tokens in prompts.items():
        engine.add_request(rid, tokens, SamplingParams(max_tokens=20, **GREEDY))
    covered = []

    def on_step():
        check_invariants(engine)
        covered.append(growth_to_limits(engine) <= engine.runtime.caches.num_free_blocks)

    finals = drain(engine, on_step=on_step)
    assert_clean(engine)
    if reserve:
        assert engine.scheduler.num_preemptions == 0 and all(covered)
        assert max(len(x.running) for x in rec.batches) == 3
    else:
        assert engine.scheduler.num_preemptions > 0 and not all(covered)
    for rid, tokens in prompts.items():
        assert finals[rid].token_ids == hf_greedy(load_hf_model, tokens, 20), rid


def test_preemption_keeps_seeded_sampling_output(model_path):
    params = [
        SamplingParams(temperature=1.0, seed=11, max_tokens=14),
        SamplingParams(temperature=0.7, top_k=20, seed=12, max_tokens=14),
        SamplingParams(temperature=1.3, top_p=0.8, seed=13, max_tokens=14),
        SamplingParams(temperature=1.0, min_p=0.05, seed=14, max_tokens=14),
    ]
    prompts = [prompt(n, 5) for n in (31, 27, 24, 33)]
    solo_llm = make_llm(model_path, max_num_seqs=1)
    solo = [solo_llm.generate([p], sp, use_tqdm=False)[0].token_ids for p, sp in zip(prompts, params)]
    llm = make_llm(model_path, **PREEMPTING)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == solo
    assert_clean(llm.engine)


# --------------------------------------------------------------------------------------------------------------
# Abort
# --------------------------------------------------------------------------------------------------------------


def test_abort_frees_everything(model_path, load_hf_model):
    llm = make_llm(model_path, max_num_seqs=2, block_size=4, max_num_batched_tokens=8)
    engine, runtime = llm.engine, llm.runtime
    tokens = {"decoding": prompt(6, 6), "prefilling": prompt(40, 6), "waiting": prompt(5, 6), "kept": prompt(9, 6)}
    engine.add_request("decoding", tokens["decoding"], SamplingParams(max_tokens=30, **GREEDY))
    engine.step()  # decoding: prefilled (6 tokens)
    engine.step()  # decoding: first decode step
    engine.add_request("prefilling", tokens["prefilling"], SamplingParams(max_tokens=4, **GREEDY))
    engine.add_request("waiting", tokens["waiting"], SamplingParams(max_tokens=4, **GREEDY))
    engine.step()  # prefilling: first 8-token chunk; waiting: not admitted (max_num_seqs=2)
    prefilling, waiting, decoding = (seq_of(engine, r) for r in ("prefilling", "waiting", "decoding"))
    assert 0 < prefilling.num_computed_tokens < len(tokens["prefilling"]) and prefilling.state_slot is not None
    assert waiting in engine.scheduler.waiting and decoding.num_generated_tokens >= 2
    check_invariants(engine)

    free_blocks, free_slots = runtime.caches.blocks.num_free, runtime.caches.slots.num_free
    held = len(prefilling.block_table)
    out = engine.abort_request("prefilling")
    assert (out.finished, out.finish_reason, out.token_ids) == (True, "abort", [])
    assert runtime.caches.blocks.num_free == free_blocks + held and runtime.caches.slots.num_free == free_slots + 1
    assert prefilling.block_table == [] and prefilling.state_slot is None
    check_invariants(engine)

    out = engine.abort_request("waiting")
    assert out.finish_reason == "abort" and out.token_ids == [] and out.time_to_first_token is None
    assert waiting not in engine.scheduler.waiting
    check_invariants(engine)

    engine.add_request("kept", tokens["kept"], SamplingParams(max_tokens=6, **GREEDY))
    for _ in range(3):
        engine.step()
    generated = list(decoding.generated_token_ids)
    out = engine.abort_request("decoding")
    assert out.finish_reason == "abort" and out.token_ids == generated and len(generated) > 2
    assert generated == hf_greedy(load_hf_model, tokens["decoding"], 30)[: len(generated)]
    check_invariants(engine)
    with pytest.raises(ValueError, match="request id"):
        engine.abort_request("decoding")  # already gone
    finals = drain(engine, on_step=lambda: check_invariants(engine))
    assert set(finals) == {"kept"}
    assert finals["kept"].token_ids == hf_greedy(load_hf_model, tokens["kept"], 6)
    assert_clean(engine)
    # The freed resources are usable: a request as large as the pool allows still runs.
    out = llm.generate([tokens["prefilling"]], SamplingParams(max_tokens=4, **GREEDY), use_tqdm=False)[0]
    assert out.token_ids == hf_greedy(load_hf_model, tokens["prefilling"], 4)
    assert_clean(engine)


def test_abort_everything_mid_stream_leaves_a_clean_engine(model_path):
    llm = make_llm(model_path, **PREEMPTING)
    engine = llm.engine
    for i in range(6):
        engine.add_request(f"r{i}", prompt(20 + 5 * i, 7), SamplingParams(max_tokens=30, **GREEDY))
    for _ in range(12):
        engine.step()
        check_invariants(engine)
    assert engine.scheduler.running and engine.scheduler.waiting
    for rid in list(engine.requests):
        assert engine.abort_request(rid).finish_reason == "abort"
    assert_clean(engine)
    assert engine.step() == []


# --------------------------------------------------------------------------------------------------------------
# API: RequestOutput, LLM.generate
# --------------------------------------------------------------------------------------------------------------


def test_request_output_fields(model_path, load_hf_model):
    llm = make_llm(model_path)
    engine = llm.engine
    tokens = prompt(12, 8)
    rid = engine.add_request(None, tokens, SamplingParams(max_tokens=5, **GREEDY))
    assert rid.startswith("req-")
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    want = hf_greedy(load_hf_model, tokens, 5)
    assert len(outputs) == 5
    for i, out in enumerate(outputs):
        assert isinstance(out, RequestOutput) and out.request_id == rid
        assert out.prompt_token_ids == tokens
        assert out.new_token_ids == [want[i]] and out.token_ids == want[: i + 1]
        assert out.finished == (i == 4) and out.finish_reason == (None if i < 4 else "length")
        assert out.text is None  # this folder has no tokenizer
        assert out.first_token_time == outputs[0].first_token_time  # set once, at the first token
    final = outputs[-1]
    assert final.time_to_first_token is not None and final.time_to_first_token > 0
    assert final.arrival_time < final.first_token_time <= final.finished_time
    assert outputs[0].finished_time is None


def test_final_only_requests_report_once_with_the_full_output(model_path, load_hf_model):
    """FINAL_ONLY (what LLM.generate uses) skips the per-step outputs but not the final one; a CUMULATIVE request in
    the same batch still streams every token."""
    engine = make_llm(model_path).engine
    tokens = {"final": prompt(9, 10), "streamed": prompt(14, 11)}
    engine.add_request("final", tokens["final"], SamplingParams(max_tokens=6, output_kind=RequestOutputKind.FINAL_ONLY, **GREEDY))
    engine.add_request("streamed", tokens["streamed"], SamplingParams(max_tokens=4, **GREEDY))
    reported = []
    while engine.has_unfinished_requests():
        reported.extend(engine.step())
    final = [o for o in reported if o.request_id == "final"]
    assert len(final) == 1 and final[0].finished and final[0].finish_reason == "length"
    assert final[0].prompt_token_ids == tokens["final"]
    assert final[0].token_ids == hf_greedy(load_hf_model, tokens["final"], 6)
    assert len([o for o in reported if o.request_id == "streamed"]) == 4
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind="final_only")


def test_generate_returns_prompt_order_and_tqdm_is_switchable(model_path, load_hf_model, capsys):
    llm = make_llm(model_path)
    prompts = [prompt(n, 9) for n in (17, 3, 8)]
    params = [SamplingParams(max_tokens=n, **GREEDY) for n in (2, 6, 4)]
    capsys.readouterr()
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert capsys.readouterr().err == ""
    assert [o.prompt_token_ids for o in outs] == prompts
    assert [o.token_ids for o in outs] == [hf_greedy(load_hf_model, p, sp.max_tokens) for p, sp in zip(prompts, params)]
    assert all(o.finished and o.finish_reason == "length" and o.time_to_first_token > 0 for o in outs)
    outs = llm.generate(prompts[1], params[1])  # a single prompt as token ids; the bar is on by default
    err = capsys.readouterr().err
    assert "generating" in err and "1/1" in err
    assert len(outs) == 1 and outs[0].token_ids == hf_greedy(load_hf_model, prompts[1], 6)
    assert_clean(llm.engine)


@pytest.mark.parametrize("total_gib, want", [(None, 8192), (40, 8192), (80, 16384), (141, 16384)])
def test_default_prefill_budget_follows_vllm_llm_class(monkeypatch, total_gib, want):
    """LLM's default max_num_batched_tokens: 16,384 on a GPU of 70 GiB or more, 8,192 on smaller ones and the CPU
    (vLLM's rule for its LLM class); an explicit value always wins (test_chunked_prefill_* pass their own)."""
    from types import SimpleNamespace

    from compiled_engine.memory_plan import default_max_num_batched_tokens

    if total_gib is None:
        assert default_max_num_batched_tokens(torch.device("cpu")) == want
        return
    props = SimpleNamespace(total_memory=total_gib * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    assert default_max_num_batched_tokens(torch.device("cuda", 0)) == want


def test_llm_resolves_the_default_prefill_budget(model_path):
    llm = make_llm(model_path, max_num_seqs=2, max_num_batched_tokens=None)
    assert llm.engine.scheduler.max_num_batched_tokens == 8192 == llm.runtime.config.max_num_batched_tokens  # CPU

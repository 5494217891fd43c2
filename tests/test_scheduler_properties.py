"""Hypothesis properties of continuous batching on the HF-verified tiny model (qwen3_5_text_untied), CPU fp32 eager.

The engine under test has a KV pool far smaller than its load: 4-token blocks, 29 usable blocks (116 tokens) for
up to 4 running sequences of up to 92 tokens, and a 24-token prefill budget. So streams preempt, recompute and chunk
all the time. One such engine serves every example of the module (it must be clean between examples); each
request's "solo" output comes from a second engine with ample blocks and no chunking, running that request alone,
cached per (prompt, sampling parameters).

* ``test_random_streams``: random request streams (prompt lengths 1..80, arrival steps, max_tokens, greedy and
  seeded sampling, aborts). Every finished request equals its solo run; an aborted one's tokens are a prefix of
  it; resource invariants hold after every step; a running sequence keeps its slot until it is preempted; in the
  end every block and slot is free. Preemption must actually have happened in some examples.
* ``test_state_machine``: a RuleBasedStateMachine (add, step, abort, abort an unknown id, forced preemption of any
  running sequence) with the same checks as invariants.

Both run under each scheduling policy (``POLICIES``): mixed steps as one varlen step or split into a decode step and
a prefill step, and prefill first, all three admitting without a growth reserve so that they preempt; and the
defaults (mixed steps, full growth reserve), under which the scheduler must never preempt by itself.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from compiled_engine import LLMEngine, SamplingParams
from tests.test_engine import MODEL, assert_clean, check_invariants, heavy_settings, make_llm, prompt

MAX_TOKENS = 12
MAX_PROMPT = 80
STREAM_ENGINE = dict(block_size=4, num_kv_blocks=30, max_model_len=96, max_num_seqs=4, max_num_batched_tokens=24)
# policy -> (LLM knobs, max_fused_decode_rows or None for the engine's own)
POLICIES = {
    "mixed": (dict(kv_growth_reserve=0.0), 1 << 20),
    "mixed_split": (dict(kv_growth_reserve=0.0), 0),
    "prefill_first": (dict(kv_growth_reserve=0.0, mixed_steps=False), None),
    "defaults": ({}, None),
}
SAMPLING = {  # name -> SamplingParams fields (seeded ones get the request's seed)
    "greedy": dict(temperature=0.0),
    "plain": dict(temperature=1.0),
    "top_k": dict(temperature=0.8, top_k=8),
    "top_p_min_p": dict(temperature=1.3, top_p=0.9, min_p=0.05),
}


def params_of(sampling: str, seed: int, max_tokens: int) -> SamplingParams:
    fields = dict(SAMPLING[sampling])
    if sampling != "greedy":
        fields["seed"] = seed
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **fields)


_SOLO: dict = {}  # model path -> (solo LLM, {(length, variant, sampling, seed): its MAX_TOKENS tokens})


class Harness:
    """The shared engine (with probes on the scheduler), the solo engine and its cache, and statistics."""

    def __init__(self, path, policy: str):
        self.path = path
        self.policy = policy
        self.preempts = POLICIES[policy][0].get("kv_growth_reserve", 1.0) == 0  # else the reserve rules it out
        # The solo runs do not depend on the policy: one solo engine and cache serve every policy's harness.
        if path not in _SOLO:
            _SOLO[path] = (make_llm(path, max_num_seqs=1, max_model_len=96, max_num_batched_tokens=256), {})
        self.solo_llm, self.solo_cache = _SOLO[path]
        self.examples = 0
        self.examples_with_preemption = 0
        self.largest_stream = 0
        self.num_preemptions = 0  # by the scheduler or forced by the state machine
        self.forced_preemptions = 0
        self._build()

    def _build(self) -> None:
        knobs, fused_rows = POLICIES[self.policy]
        self.llm = make_llm(self.path, **STREAM_ENGINE, **knobs)
        self.engine = self.llm.engine
        if fused_rows is not None:
            self.engine.max_fused_decode_rows = fused_rows
        self.last_slot: dict[int, int] = {}
        scheduler = self.engine.scheduler
        preempt = scheduler._preempt

        def recording_preempt(seq):
            self.last_slot.pop(seq.seq_id, None)
            self.num_preemptions += 1
            preempt(seq)

        scheduler._preempt = recording_preempt

    def start_example(self) -> LLMEngine:
        """The shared engine, clean. An example that failed may have left it dirty (its own failure is reported):
        then a fresh one, so that hypothesis's examples stay independent while it shrinks."""
        try:
            assert_clean(self.engine)
        except AssertionError:
            self._build()
        self.last_slot.clear()
        return self.engine

    def solo(self, length: int, variant: int, sampling: str, seed: int) -> list[int]:
        key = (length, variant, sampling, seed if sampling != "greedy" else 0)
        if key not in self.solo_cache:
            out = self.solo_llm.generate([prompt(length, variant)], params_of(sampling, seed, MAX_TOKENS),
                                         use_tqdm=False)[0]
            assert len(out.token_ids) == MAX_TOKENS
            self.solo_cache[key] = out.token_ids
        return self.solo_cache[key]

    def after_step(self) -> None:
        """Invariants after a step, and slot stability: a sequence keeps its slot until it is preempted."""
        check_invariants(self.engine)
        running = {s.seq_id: s.state_slot for s in self.engine.scheduler.running}
        for sid, slot in running.items():
            assert self.last_slot.setdefault(sid, slot) == slot, f"sequence {sid} changed slot while running"
        for sid in set(self.last_slot) - set(running):  # finished, aborted or preempted
            del self.last_slot[sid]


@pytest.fixture(scope="module", params=sorted(POLICIES))
def harness(build_hf_model, request):
    return Harness(build_hf_model(MODEL), request.param)


# --------------------------------------------------------------------------------------------------------------
# Random streams
# --------------------------------------------------------------------------------------------------------------

prompt_lengths = st.one_of(st.integers(1, MAX_PROMPT), st.sampled_from([1, 2, 3, 4, 5, 23, 24, 25, 63, 64, 65, 80]))
request_specs = st.fixed_dictionaries(
    {
        "length": prompt_lengths,
        "variant": st.integers(0, 1),
        "max_tokens": st.integers(1, MAX_TOKENS),
        "sampling": st.sampled_from(sorted(SAMPLING)),
        "seed": st.integers(0, 2),
        "arrival": st.integers(0, 12),
        "abort_after": st.one_of(st.none(), st.none(), st.none(), st.integers(0, 15)),
    }
)
streams = st.lists(request_specs, min_size=1, max_size=8)

# A stream that must preempt: four long prompts at once, each growing by 12 tokens, in 29 blocks of 4 tokens.
PREEMPTING_STREAM = [
    dict(length=n, variant=0, max_tokens=12, sampling=s, seed=1, arrival=0, abort_after=None)
    for n, s in ((70, "greedy"), (64, "plain"), (55, "greedy"), (48, "top_k"))
]


def run_stream(h: Harness, stream: list[dict]) -> int:
    """Runs one stream on the shared engine and checks it. Returns the number of preemptions."""
    engine = h.start_example()
    preemptions_before = engine.scheduler.num_preemptions
    ids = {}
    finals, aborted = {}, {}
    step = 0
    while True:
        for i, spec in enumerate(stream):
            if spec["arrival"] == step:
                tokens = prompt(spec["length"], spec["variant"])
                ids[i] = engine.add_request(f"s{i}", tokens, params_of(spec["sampling"], spec["seed"],
                                                                       spec["max_tokens"]))
            if spec["abort_after"] is not None and spec["arrival"] + spec["abort_after"] == step:
                if ids.get(i) in engine.requests:
                    aborted[i] = engine.abort_request(ids[i])
                    check_invariants(engine)
        if step > max(s["arrival"] for s in stream) and not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                finals[int(out.request_id[1:])] = out
        h.after_step()
        step += 1
        assert step < 2000, "the stream does not make progress"
    assert_clean(engine)
    for i, spec in enumerate(stream):
        solo = h.solo(spec["length"], spec["variant"], spec["sampling"], spec["seed"])
        if i in aborted:
            out = aborted[i]
            assert out.finish_reason == "abort" and out.token_ids == solo[: len(out.token_ids)], f"aborted {i}"
        else:
            out = finals[i]
            assert out.finish_reason == "length"
            assert out.token_ids == solo[: spec["max_tokens"]], f"request {i} ({spec}) differs from its solo run"
    return engine.scheduler.num_preemptions - preemptions_before


def test_random_streams(harness):
    h = harness

    @heavy_settings(20)
    @example(stream=PREEMPTING_STREAM)
    @given(stream=streams)
    def check(stream):
        preemptions = run_stream(h, stream)
        h.examples += 1
        h.examples_with_preemption += preemptions > 0
        h.largest_stream = max(h.largest_stream, sum(s["length"] + s["max_tokens"] for s in stream))

    check()
    print(f"\nstreams ({h.policy}): {h.examples} examples, {h.examples_with_preemption} preempted, largest stream "
          f"{h.largest_stream} tokens, {h.num_preemptions} preemptions in all")
    if h.preempts:
        assert h.examples_with_preemption >= 2, "the streams never ran out of KV blocks: the test proves nothing"
    else:
        assert h.examples_with_preemption == 0, "admission with the growth reserve still ran out of KV blocks"


# --------------------------------------------------------------------------------------------------------------
# State machine
# --------------------------------------------------------------------------------------------------------------


class EngineMachine(RuleBasedStateMachine):
    harness: Harness = None  # set by the test

    def __init__(self):
        super().__init__()
        self.h = type(self).harness
        self.engine = self.h.start_example()
        self.live: dict[str, dict] = {}
        self.count = 0

    def check_prefix(self, rid: str, token_ids: list[int], complete: bool) -> None:
        spec = self.live.pop(rid)
        solo = self.h.solo(spec["length"], spec["variant"], spec["sampling"], spec["seed"])
        if complete:
            assert token_ids == solo[: spec["max_tokens"]], f"{rid} ({spec}) differs from its solo run"
        else:
            assert token_ids == solo[: len(token_ids)], f"aborted {rid} ({spec}) differs from its solo run"

    @rule(length=prompt_lengths, variant=st.integers(0, 1), max_tokens=st.integers(1, MAX_TOKENS),
          sampling=st.sampled_from(sorted(SAMPLING)), seed=st.integers(0, 2))
    def add(self, length, variant, max_tokens, sampling, seed):
        rid = f"m{self.count}"
        self.count += 1
        self.engine.add_request(rid, prompt(length, variant), params_of(sampling, seed, max_tokens))
        self.live[rid] = dict(length=length, variant=variant, max_tokens=max_tokens, sampling=sampling, seed=seed)

    @rule(lengths=st.lists(st.sampled_from([52, 64, 71, MAX_PROMPT]), min_size=3, max_size=4), seed=st.integers(0, 2))
    def add_burst(self, lengths, seed):
        """Long prompts at once: more tokens than the KV pool holds, so the scheduler must preempt."""
        for i, length in enumerate(lengths):
            self.add(length, i % 2, MAX_TOKENS, sorted(SAMPLING)[(seed + i) % len(SAMPLING)], seed)

    @precondition(lambda self: self.live)
    @rule(steps=st.integers(1, 10))
    def step(self, steps):
        for _ in range(steps):
            for out in self.engine.step():
                if out.finished:
                    assert out.finish_reason == "length"
                    self.check_prefix(out.request_id, out.token_ids, complete=True)
            self.h.after_step()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        out = self.engine.abort_request(rid)
        assert out.finished and out.finish_reason == "abort"
        self.check_prefix(rid, out.token_ids, complete=False)

    @rule()
    def abort_unknown(self):
        with pytest.raises(ValueError, match="request id"):
            self.engine.abort_request("no-such-request")

    @precondition(lambda self: self.engine.scheduler.running)
    @rule(data=st.data())
    def preempt(self, data):
        """Preemption of any running sequence, at any point (mid-prefill too), must be harmless."""
        scheduler = self.engine.scheduler
        victim = data.draw(st.sampled_from(scheduler.running))
        scheduler._preempt(victim)
        self.h.forced_preemptions += 1

    @invariant()
    def resources_are_accounted_for(self):
        check_invariants(self.engine)

    def teardown(self):
        aborted = {rid: self.engine.abort_request(rid).token_ids for rid in list(self.live)}
        assert_clean(self.engine)
        for rid, token_ids in aborted.items():
            self.check_prefix(rid, token_ids, complete=False)


def test_state_machine(harness):
    EngineMachine.harness = harness
    preemptions_before, forced_before = harness.num_preemptions, harness.forced_preemptions
    try:
        run_state_machine_as_test(
            EngineMachine,
            settings=heavy_settings(15, stateful_step_count=40, suppress_health_check=list(HealthCheck)),
        )
    finally:
        EngineMachine.harness = None
    forced = harness.forced_preemptions - forced_before
    natural = harness.num_preemptions - preemptions_before - forced
    print(f"\nstate machine ({harness.policy}): {natural} preemptions by the scheduler, {forced} forced")
    if harness.preempts:
        assert natural > 0, "the scheduler never ran out of KV blocks in the state machine"
    else:
        assert natural == 0, "admission with the growth reserve still ran out of KV blocks"

"""Reliability of the engine and the runtime under interrupts and bad calls (CPU, fp32, eager, tiny HF model).

* ownership: ``LLM.generate`` refuses (RuntimeError naming them) while the engine holds requests the caller added
  through ``llm.engine.add_request``, instead of consuming their outputs;
* a KeyboardInterrupt at any point of ``generate`` (validation, queuing, stepping, finishing, admission) leaves no
  request, block or slot behind, and later calls give their solo greedy tokens; ``add_request`` is all or nothing,
  ``abort_request`` can be repeated after an interrupt, ``batched_admissions`` never leaves its queue of slot resets
  behind, and a failed ``step()`` aborts the requests it may have touched and keeps serving the others;
* the tensor-parallel executor stops its workers on any BaseException of a step (a fake worker handle, and real
  ranks: spawn + gloo);
* ``Runtime.build_step`` refuses a sequence twice, a sequence of another Runtime, counts that do not match the
  sequences, and new token ids outside the vocabulary, before any kernel sees them; ``add_request`` re-checks
  SamplingParams mutated after construction;
* a Hypothesis state machine over the public API mixes good and bad calls with interrupts injected at random
  Python calls inside compiled_engine (``sys.settrace``) and checks the resource accounting and the outputs.

Interrupts are injected with ``sys.settrace``: at the n-th 'call' event of a function defined in compiled_engine
(a signal's KeyboardInterrupt lands between bytecodes, which includes these points).
"""

from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compiled_engine import SamplingParams
from compiled_engine.executor import ModelExecutor
from tests.test_engine import GREEDY, MODEL, VOCAB, assert_clean, check_invariants, heavy_settings, make_llm, prompt

KNOBS = dict(max_model_len=48, max_num_seqs=3, block_size=8, max_num_batched_tokens=24, num_kv_blocks=12)


@pytest.fixture(scope="module")
def model_path(build_hf_model):
    return build_hf_model(MODEL)


@pytest.fixture(scope="module")
def llm(model_path):
    return make_llm(model_path, **KNOBS)


# With prefix caching: long enough for a 64-token snapshot boundary, prompts sharing it (``shared_prompt``).
PREFIX_KNOBS = dict(KNOBS, max_model_len=80, num_kv_blocks=24, enable_prefix_caching=True, prefix_snapshot_interval=64,
                    num_prefix_snapshots=2)


def shared_prompt(length: int, seed: int) -> list[int]:
    """A 64-token prefix every such prompt shares (even seeds) or one of its own (odd), then ``length`` tokens."""
    return prompt(64, seed % 2 * (seed + 1)) + prompt(length, seed + 100)


@pytest.fixture(scope="module")
def oracle(model_path):
    """Solo greedy tokens of one prompt, from an engine of its own that nothing here interrupts (cached)."""
    ref = make_llm(model_path, **dict(KNOBS, max_model_len=80, num_kv_blocks=24))
    cache: dict[tuple, list[int]] = {}

    def solo(tokens: list[int], max_tokens: int) -> list[int]:
        key = (tuple(tokens), max_tokens)
        if key not in cache:
            params = SamplingParams(max_tokens=max_tokens, **GREEDY)
            cache[key] = ref.generate([tokens], params, use_tqdm=False)[0].token_ids
        return cache[key]

    return solo


@pytest.fixture
def clean_llm(llm):
    assert_clean(llm.engine)
    yield llm
    for request_id in list(llm.engine.requests):
        llm.engine.abort_request(request_id)
    assert_clean(llm.engine)


class Interrupted(KeyboardInterrupt):
    """The injected interrupt (a KeyboardInterrupt, so ``except Exception`` does not catch it)."""


def interruptible(code, where: str = "/compiled_engine/") -> bool:
    """A call where the tests inject interrupts: a function of compiled_engine, not a generator (a generator's 'call'
    events include its resumption for close() at garbage collection, where an exception is only printed)."""
    return where in code.co_filename and not code.co_flags & inspect.CO_GENERATOR


@contextmanager
def interrupt_at_call(n: int, where: str = "/compiled_engine/", name: str | None = None):
    """Raise Interrupted at the n-th call (1-based) of a Python function defined in a file whose path contains
    ``where`` (and named ``name``, if given), inside the block. Yields a list that holds True once it fired."""
    fired: list[bool] = []
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        code = frame.f_code
        if event == "call" and interruptible(code, where) and (name is None or code.co_name == name):
            count += 1
            if count == n:
                fired.append(True)
                sys.settrace(None)
                raise Interrupted(f"injected at call {n}: {code.co_name}")
        return None

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield fired
    finally:
        sys.settrace(previous)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, **GREEDY)


# --------------------------------------------------------------------------------------------------------------
# 1. Ownership of requests
# --------------------------------------------------------------------------------------------------------------


def test_generate_refuses_while_the_engine_holds_the_callers_requests(clean_llm, oracle):
    """The engine's own request is neither stepped nor consumed by generate: it finishes for the engine's caller."""
    engine = clean_llm.engine
    engine.add_request("mine", prompt(5), greedy(3))
    with pytest.raises(RuntimeError, match="'mine'"):
        clean_llm.generate([prompt(4)], greedy(2), use_tqdm=False)
    assert list(engine.requests) == ["mine"] and len(engine.scheduler.waiting) == 1  # nothing queued, nothing run
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals["mine"].token_ids == oracle(prompt(5), 3)
    assert clean_llm.generate([prompt(4)], greedy(2), use_tqdm=False)[0].token_ids == oracle(prompt(4), 2)


# --------------------------------------------------------------------------------------------------------------
# 2. Interrupts
# --------------------------------------------------------------------------------------------------------------


def count_calls(fn) -> int:
    """How many compiled_engine Python calls ``fn()`` makes (its interrupt points)."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if event == "call" and interruptible(frame.f_code):
            count += 1
        return None

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def test_an_interrupt_anywhere_in_generate_leaves_a_clean_engine(clean_llm, oracle):
    """Every interrupt point of a small generate call (validation, queuing, admission, steps, finishing), one after
    the other: the engine is clean after each, and the next call gives the solo greedy tokens."""
    prompts = [prompt(3, 1), prompt(9, 2), prompt(2, 3)]
    params = [greedy(2), greedy(3), greedy(1)]
    want = [oracle(p, sp.max_tokens) for p, sp in zip(prompts, params)]
    total = count_calls(lambda: clean_llm.generate(prompts, params, use_tqdm=False))
    assert total > 50
    for n in range(1, total + 1, max(1, total // 60)):  # ~60 points spread over the whole call
        with interrupt_at_call(n) as fired:
            try:
                clean_llm.generate(prompts, params, use_tqdm=False)
            except Interrupted:
                pass
        assert fired, n
        assert_clean(clean_llm.engine)
        assert clean_llm.engine.runtime.caches._queued_resets is None
        assert [o.token_ids for o in clean_llm.generate(prompts, params, use_tqdm=False)] == want, n


def test_add_request_is_all_or_nothing(clean_llm):
    engine = clean_llm.engine
    total = count_calls(lambda: engine.add_request("probe", prompt(4), greedy(2)))
    engine.abort_request("probe")
    for n in range(1, total + 1):
        with interrupt_at_call(n) as fired:
            try:
                engine.add_request("r", prompt(4), greedy(2))
            except Interrupted:
                pass
        assert fired, n
        queued = "r" in engine.requests
        assert queued == any(s is not None and s.seq_id in engine._request_of_seq for s in engine.scheduler.waiting)
        assert len(engine.scheduler.waiting) == int(queued)
        if queued:
            engine.abort_request("r")
        assert_clean(engine)


def test_an_interrupted_finish_can_be_repeated(clean_llm, oracle):
    """An interrupt inside Scheduler.finish (here: as it calls CacheManager.release) used to leave the sequence out
    of its queue and its request half-forgotten: the cleanup's abort raised KeyError and the blocks and slot leaked."""
    engine = clean_llm.engine
    engine.add_request("a", prompt(6), greedy(4))
    engine.add_request("b", prompt(5), greedy(2))
    engine.step()  # both admitted and prefilled
    with interrupt_at_call(1, name="release") as fired:
        with pytest.raises(Interrupted):
            engine.abort_request("a")
    assert fired and "a" in engine.requests
    check_invariants(engine)
    engine.abort_request("a")  # repeated: now it frees everything
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals["b"].token_ids == oracle(prompt(5), 2)
    assert_clean(engine)


def test_an_interrupt_as_batched_admissions_starts_leaves_no_queued_resets(clean_llm, oracle):
    """Interrupted right after ``_queued_resets = []``: before the fix that line ran outside the try, the queue stayed
    forever, and every later admission queued its slot reset there and never ran it: stale state, wrong tokens."""
    engine = clean_llm.engine
    caches = engine.runtime.caches
    clean_llm.generate([prompt(7, 5)], greedy(3), use_tqdm=False)  # leave the slots' state dirty
    fired = []

    def trace(frame, event, arg):
        if frame.f_code.co_name == "batched_admissions" and event == "call":
            def local(frame, event, arg):
                if event == "line" and not fired and frame.f_locals["self"]._queued_resets is not None:
                    fired.append(True)
                    raise Interrupted("right after _queued_resets = []")
                return local
            return local
        return None

    engine.add_request("x", prompt(4, 6), greedy(2))
    sys.settrace(trace)
    try:
        with pytest.raises(Interrupted):
            engine.step()
    finally:
        sys.settrace(None)
    assert fired and caches._queued_resets is None
    assert list(engine.requests) == ["x"]  # interrupted before its admission: still waiting, untouched
    check_invariants(engine)
    assert [o.token_ids for o in iter_steps(engine) if o.finished] == [oracle(prompt(4, 6), 2)]
    prompts = [prompt(4, 6), prompt(6, 7)]
    outs = clean_llm.generate(prompts, greedy(3), use_tqdm=False)
    assert [o.token_ids for o in outs] == [oracle(p, 3) for p in prompts]


def test_a_failed_step_aborts_what_it_touched_and_keeps_the_rest(clean_llm, oracle):
    engine = clean_llm.engine
    engine.add_request("run", prompt(6, 1), greedy(3))
    engine.step()  # "run" admitted and prefilled
    engine.add_request("wait", prompt(5, 2), greedy(2))
    engine.scheduler.max_num_seqs = 1  # "wait" stays waiting in the next step
    try:
        with interrupt_at_call(1, name="decode"):
            with pytest.raises(Interrupted):
                engine.step()
    finally:
        engine.scheduler.max_num_seqs = KNOBS["max_num_seqs"]
    assert list(engine.requests) == ["wait"]
    check_invariants(engine)
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals["wait"].token_ids == oracle(prompt(5, 2), 2)


@pytest.fixture(scope="module")
def prefix_llm(model_path):
    return make_llm(model_path, **PREFIX_KNOBS)


def snapshot_rows_accounted(llm) -> bool:
    cache = llm.runtime.caches.prefix_cache
    rows = sorted(cache.free_rows + list(cache.row_of_hash.values()))
    return rows == list(range(PREFIX_KNOBS["num_prefix_snapshots"]))


def test_an_interrupted_prefix_hit_leaks_no_block_reference(prefix_llm, oracle):
    """Interrupted between two of the hit's block acquires (PrefixCache.apply): the sequence used to get its block
    table only after all of them, so the acquired ones were never released."""
    engine = prefix_llm.engine
    base = shared_prompt(3, 0)
    assert prefix_llm.generate([base], greedy(1), use_tqdm=False)[0].token_ids == oracle(base, 1)
    other = shared_prompt(5, 2)  # the same 64-token prefix: a hit of 8 blocks and the snapshot
    engine.add_request("hit", other, greedy(2))
    with interrupt_at_call(2, name="acquire") as fired:
        with pytest.raises(Interrupted):
            engine.step()
    assert fired and not engine.requests  # admitted half-way: aborted by the failed step
    assert_clean(engine)
    assert prefix_llm.generate([other], greedy(2), use_tqdm=False)[0].token_ids == oracle(other, 2)


def test_an_interrupted_snapshot_loses_no_row(prefix_llm, oracle):
    """Interrupted as it saves a snapshot: the row used to be taken from the free rows first, and was lost."""
    tokens = shared_prompt(4, 5)  # a prefix of its own: a new snapshot at 64 tokens
    with interrupt_at_call(1, name="save_state") as fired:
        with pytest.raises(Interrupted):
            prefix_llm.generate([tokens], greedy(2), use_tqdm=False)
    assert fired
    assert_clean(prefix_llm.engine)
    assert snapshot_rows_accounted(prefix_llm)
    assert prefix_llm.generate([tokens], greedy(2), use_tqdm=False)[0].token_ids == oracle(tokens, 2)
    assert snapshot_rows_accounted(prefix_llm)


def test_an_interrupted_eviction_loses_no_block(prefix_llm, oracle):
    """Interrupted as an allocation evicts an indexed block (BlockAllocator._forget, whose on_evict drops snapshots):
    the block used to be taken off the evictable list first, and was then in no list at all."""
    blocks = prefix_llm.runtime.caches.blocks
    for seed in range(1, 12, 2):  # prompts with prefixes of their own, until indexed blocks fill the cache
        prefix_llm.generate([shared_prompt(3, seed)], greedy(1), use_tqdm=False)
        if len(blocks.evictable) > 9:
            break
    assert not blocks.free or len(blocks.evictable) > 9
    tokens = shared_prompt(2, 21)
    with interrupt_at_call(1, name="_forget") as fired:
        with pytest.raises(Interrupted):
            prefix_llm.generate([tokens, shared_prompt(2, 23)], greedy(2), use_tqdm=False)
    assert fired
    assert_clean(prefix_llm.engine)
    assert snapshot_rows_accounted(prefix_llm)
    assert prefix_llm.generate([tokens], greedy(2), use_tqdm=False)[0].token_ids == oracle(tokens, 2)
    assert_clean(prefix_llm.engine)


# --------------------------------------------------------------------------------------------------------------
# 3. Tensor-parallel step interrupt
# --------------------------------------------------------------------------------------------------------------


class FakeWorkers:
    """The handle ModelExecutor.execute uses, recording what it is asked."""

    closed = False

    def __init__(self):
        self.calls: list[str] = []

    def send_step(self, step, all_logits):
        self.calls.append("send_step")

    def raise_worker_error(self, error):
        self.calls.append("raise_worker_error")
        raise error

    def abort(self):
        self.calls.append("abort")
        self.closed = True


def test_an_interrupt_between_send_step_and_the_local_forward_aborts_the_workers(monkeypatch):
    """Rank 0 interrupted after broadcasting a step: the workers sit in the step's collectives, so they are stopped
    (as after an error) and the KeyboardInterrupt reaches the caller."""
    executor = ModelExecutor.__new__(ModelExecutor)  # only execute() is exercised: no model needed
    executor.workers = FakeWorkers()

    def local(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(executor, "_execute_local", local)
    with pytest.raises(KeyboardInterrupt):
        executor.execute(object())
    assert executor.workers.calls == ["send_step", "raise_worker_error", "abort"]


def test_a_tp2_step_interrupted_after_its_broadcast_stops_the_workers(model_path, monkeypatch):
    """Real ranks (spawn + gloo, ~10 s): rank 0 is interrupted after send_step, before its own forward. The worker
    waits in the step's collectives; it is killed, the interrupt reaches the caller, generate leaves nothing queued,
    and the next call fails at once instead of hanging."""
    from compiled_engine import LLM

    llm = LLM(str(model_path), device="cpu", dtype="float32", enforce_eager=True, max_model_len=64,
              tensor_parallel_size=2)
    workers = llm.runtime.workers
    try:
        def interrupted(*args):
            raise KeyboardInterrupt

        monkeypatch.setattr(llm.runtime.executor, "_execute_local", interrupted)
        with pytest.raises(KeyboardInterrupt):
            llm.generate([prompt(5)], greedy(2), use_tqdm=False)
        assert workers.closed and not any(p.is_alive() for p in workers.processes)
        assert_clean(llm.engine)
        monkeypatch.undo()
        with pytest.raises(RuntimeError, match="workers are stopped"):
            llm.generate([prompt(5)], greedy(2), use_tqdm=False)
        assert_clean(llm.engine)
    finally:
        if not workers.closed:  # before the fix: kill the worker stuck in the step's collective
            workers.abort()
        llm.close()


# --------------------------------------------------------------------------------------------------------------
# 4. State refused, not corrupted
# --------------------------------------------------------------------------------------------------------------


def test_runtime_refuses_a_corrupting_step(clean_llm, model_path):
    runtime = clean_llm.runtime
    caches = runtime.caches
    free = caches.num_free_blocks, caches.num_free_slots
    a, b = runtime.add_sequence(prompt(5, 1)), runtime.add_sequence(prompt(4, 2))
    try:
        with pytest.raises(ValueError, match="more than once"):
            runtime.prefill([a, a])
        with pytest.raises(ValueError, match="2 sequences"):
            runtime.prefill([a, b], num_tokens=[3])
        other = make_llm(model_path, **KNOBS).runtime.add_sequence(prompt(5, 1))
        with pytest.raises(ValueError, match="another Runtime"):
            runtime.prefill([other])
        a.token_ids[2] = VOCAB  # an embedder's bad prompt edit
        with pytest.raises(ValueError, match="out of range"):
            runtime.prefill([a, b])
        a.token_ids[2] = 1
        for seq, n in ((a, 0), (b, 0)):
            assert seq.num_computed_tokens == n and not seq.block_table  # nothing reserved or moved on
        runtime.prefill([a, b])
        for bad in (VOCAB, -1):
            a.token_ids.append(bad)
            with pytest.raises(ValueError, match="out of range"):
                runtime.decode_step([a])
            a.token_ids.pop()
        a.token_ids.append(3)
        assert runtime.decode_step([a]).shape == (1, VOCAB)
        with pytest.raises(ValueError, match="more than once"):
            a.token_ids.append(4)
            runtime.decode_step([a, a])
    finally:
        runtime.release(a)
        runtime.release(b)
    assert (caches.num_free_blocks, caches.num_free_slots) == free


@pytest.mark.parametrize("field,value", [("top_p", 0.0), ("max_tokens", 0), ("temperature", -1.0),
                                         ("temperature", float("inf"))])
def test_add_request_rechecks_sampling_params_mutated_after_construction(clean_llm, field, value):
    params = greedy(2)
    setattr(params, field, value)
    with pytest.raises(ValueError, match=field):
        clean_llm.engine.add_request("m", prompt(3), params)
    assert not clean_llm.engine.requests and not clean_llm.engine.scheduler.waiting


def test_a_queued_request_keeps_the_params_it_was_given(clean_llm, oracle):
    params = greedy(2)
    clean_llm.engine.add_request("k", prompt(3), params)
    params.max_tokens = 40  # the caller's object, not the request's
    out = [o for o in iter_steps(clean_llm.engine) if o.finished]
    assert out[0].token_ids == oracle(prompt(3), 2)


def iter_steps(engine):
    while engine.has_unfinished_requests():
        yield from engine.step()


# --------------------------------------------------------------------------------------------------------------
# 5. Random calls with bad values and interrupts
# --------------------------------------------------------------------------------------------------------------

BAD_ADDS = {  # each takes the engine's max_model_len
    "empty prompt": lambda limit: ([], greedy(2)),
    "token id": lambda limit: ([1, VOCAB], greedy(2)),
    "top_p": lambda limit: (prompt(3), _mutated(top_p=0.0)),
    "max_tokens": lambda limit: (prompt(3), _mutated(max_tokens=0)),
    "temperature": lambda limit: (prompt(3), _mutated(temperature=-1.0)),
    "too long": lambda limit: (prompt(limit + 1), greedy(2)),
}


def _mutated(**fields) -> SamplingParams:
    params = greedy(2)
    for name, value in fields.items():
        setattr(params, name, value)
    return params


calls = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 7), st.integers(0, 3), st.integers(1, 4)),
        st.tuples(st.just("bad"), st.sampled_from(sorted(BAD_ADDS))),
        st.tuples(st.just("abort"), st.integers(0, 5)),
        st.tuples(st.just("step"), st.integers(1, 3)),
        st.tuples(st.just("generate"), st.lists(st.tuples(st.integers(1, 6), st.integers(0, 3), st.integers(1, 3)),
                                                min_size=1, max_size=3)),
    ),
    min_size=1,
    max_size=8,
)
# The n-th compiled_engine call of each call above gets the interrupt: early ones (add_request makes a handful of
# calls), or anywhere in a step or a generate (a few hundred).
interrupts = st.lists(st.one_of(st.none(), st.integers(1, 6), st.integers(1, 200)), min_size=8, max_size=8)


@pytest.mark.parametrize("overlap,prefix", [(False, False), (True, False), (False, True), (True, True)])
def test_random_calls_with_bad_values_and_interrupts(model_path, oracle, overlap, prefix):
    """After every call, interrupted or not: the engine's requests are the test's (none of an interrupted generate),
    the queues and the caches agree; at the end every finished output equals its solo greedy run and, once all is
    finished, every block, slot and snapshot row is free."""
    knobs = dict(overlap_decode=overlap, **(PREFIX_KNOBS if prefix else KNOBS))
    make_prompt = shared_prompt if prefix else prompt
    llm = make_llm(model_path, **knobs)
    failed = []  # a failed example leaves its engine dirty: the next one (Hypothesis shrinking) starts a fresh one
    fired_kinds: set[str] = set()  # the kinds of call an interrupt landed in, over all examples

    @heavy_settings(150)
    @given(calls=calls, interrupts=interrupts)
    def run(calls, interrupts):
        nonlocal llm
        if failed:
            llm = make_llm(model_path, **knobs)
            failed.clear()
        try:
            example(calls, interrupts)
        except BaseException:
            failed.append(True)
            raise

    def example(calls, interrupts):
        engine, caches = llm.engine, llm.runtime.caches
        expected: dict[str, tuple[list[int], int]] = {}  # request id -> (prompt, max_tokens) of the engine's requests
        counter = 0

        def check_finished(out):
            tokens, max_tokens = expected.pop(out.request_id)
            if out.finish_reason != "abort":
                assert out.token_ids == oracle(tokens, max_tokens), out.request_id

        for call, at in zip(calls, interrupts):
            kind = call[0]
            interrupted = False
            with interrupt_at_call(at) if at is not None else _nothing():
                try:
                    if kind == "add":
                        counter += 1
                        rid = f"q{counter}"
                        tokens = make_prompt(call[1], call[2])
                        expected[rid] = (tokens, call[3])
                        engine.add_request(rid, tokens, greedy(call[3]))
                    elif kind == "bad":
                        before = (dict(engine.requests), list(engine.scheduler.waiting))
                        with pytest.raises(ValueError):
                            engine.add_request("bad", *BAD_ADDS[call[1]](llm.runtime.max_model_len))
                        assert (dict(engine.requests), list(engine.scheduler.waiting)) == before
                    elif kind == "abort":
                        ids, rid = list(engine.requests), None
                        if ids:
                            rid = ids[call[1] % len(ids)]
                            out = engine.abort_request(rid)
                            assert out.finished and out.finish_reason == "abort"
                            expected.pop(rid)
                        else:
                            with pytest.raises(ValueError):
                                engine.abort_request("nobody")
                    elif kind == "step":
                        for _ in range(call[1]):
                            for out in engine.step():
                                if out.finished:
                                    check_finished(out)
                    else:  # generate: refused while the engine has requests
                        prompts = [make_prompt(n, s) for n, s, _ in call[1]]
                        params = [greedy(m) for _, _, m in call[1]]
                        if engine.requests:
                            with pytest.raises(RuntimeError):
                                llm.generate(prompts, params, use_tqdm=False)
                        else:
                            outs = llm.generate(prompts, params, use_tqdm=False)
                            assert [o.token_ids for o in outs] == [oracle(p, sp.max_tokens)
                                                                   for p, sp in zip(prompts, params)]
                except Interrupted:
                    interrupted = True
                    fired_kinds.add(kind)
                    if kind == "abort" and ids and rid in engine.requests:
                        # an interrupted abort is repeated (its contract: idempotent), as generate's cleanup does
                        engine.abort_request(rid)
                        expected.pop(rid)
            assert set(engine.requests) <= set(expected)  # no request of an interrupted generate is left
            if interrupted:  # requests that vanished (aborted by a failed step, or finished in a step cut short)
                for rid in [r for r in expected if r not in engine.requests]:
                    expected.pop(rid)
            else:  # a call that ran to its end loses no request without reporting it
                assert set(engine.requests) == set(expected)
            assert engine.has_unfinished_requests() == bool(engine.requests)
            assert caches._queued_resets is None
            if not prefix:  # check_invariants counts blocks as held once: no sharing
                check_invariants(engine)
        # Finish what is left, checking each output, then everything must be free.
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    check_finished(out)
        assert not expected
        assert_clean(engine)
        if prefix:  # every snapshot row is free or indexed (none lost to an interrupt), and no restore is pending
            assert snapshot_rows_accounted(llm) and caches.prefix_cache._queued_restores is None

    run()
    assert fired_kinds >= {"add", "step", "generate"}, fired_kinds  # the interrupts did land in the calls


@contextmanager
def _nothing():
    yield []

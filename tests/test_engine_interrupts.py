"""Reliability of the engine and the runtime under interrupts and bad calls (CPU, fp32, eager, tiny HF model).

* ownership: ``LLM.generate`` refuses (RuntimeError naming them) while the engine holds requests the caller added
  through ``llm.engine.add_request``, instead of consuming their outputs;
* a KeyboardInterrupt at any point of ``generate`` (validation, queuing, stepping, finishing, admission) leaves no
  request, block or slot behind, and later calls give their solo greedy tokens; ``add_request`` is all or nothing,
  ``abort_request`` can be repeated after an interrupt, ``batched_admissions`` never leaves its queue of slot resets
  behind, and a failed ``step()`` aborts the requests it may have touched and keeps serving the others;
* the tensor-parallel executor stops its workers on any BaseException of a step (a fake worker handle: the real
  spawn + gloo start-up takes longer than this file's budget);
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


@pytest.fixture(scope="module")
def oracle(model_path):
    """Solo greedy tokens of one prompt, from an engine of its own that nothing here interrupts (cached)."""
    ref = make_llm(model_path, **KNOBS)
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


@pytest.mark.parametrize("field,value", [("top_p", 0.0), ("max_tokens", 0), ("temperature", -1.0)])
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

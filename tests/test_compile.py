"""Compiled decode (graphs/) equals eager decode, on the CPU (Inductor's C++ backend; no CUDA graphs here).

Properties (docs/ARCHITECTURE.md, "Compile and capture"):
* compiled ≡ eager: logits about as close to float64 math from the same caches as eager's are (ORACLE_FACTOR in
  tests/compile_helpers.py), cache rows within fp32 rounding of eager's, and the same greedy tokens, over random
  batches — sizes across the buckets, random context lengths, random slots (a random subset of the live sequences,
  in random order), padding lanes;
* isolation: after a compiled step every pool row of a slot outside the batch, and every KV row the step did not
  write, is bit-identical to before (torch.equal); padding lanes write only to the null slot and the null block;
* a stream where sequences join, finish and reorder between steps: each one's logits equal its solo eager run;
* one CUDA graph per bucket and variant (greedy, sampling: at most three compiles each, graphs.expected_compiles),
  no graph break, nothing recompiled after warm-up; warm-up leaves live sequences alone;
* the sampling variant draws what ce::sample's reference draws from the graph's own logits.

Compiling is the expensive part (~20 s per bucket on a 2-core CI machine with a cold Inductor cache), so one
runner with three buckets (1, 2, 4) is built per module and shared by every test; each test releases what it adds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from compiled_engine.runtime import Runtime
from compiled_engine.sequence import Sequence
from compiled_engine.step import pack_step
from graphs import (
    BucketPolicy,
    DecodeGraphRunner,
    StaticDecodeInputs,
    default_bucket_sizes,
    expected_compiles,
)
from ops.library import NULL_BLOCK, NULL_SLOT
from ops.step import DecodeOutput, SamplingInputs, StepInputs
from tests.compile_helpers import (
    draw_sampling_inputs,
    reference_draw,
    assert_isolated,
    assert_logits_near_oracle,
    assert_rows_close,
    assert_same_greedy,
    assert_stream_step_close,
    cache_buffers,
    eager_decode_step,
    Float64Math,
    float64_logits,
    float64_twin,
    graph_stats,
    null_rows,
    padded_step,
    restore,
    rows,
    snapshot,
    written_rows,
)

BUCKETS = (1, 2, 4)
MAX_NUM_SEQS = 6  # > the largest bucket: batches of 5-6 take the eager fallback
MAX_MODEL_LEN = 128
BLOCK_SIZE = 16
NUM_KV_BLOCKS = 64
STEP_FIELDS = ("input_ids", "positions", "slot_mapping", "block_tables", "context_lens", "state_slots")
# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------


@torch.inference_mode()
def compare_step(rt: Runtime, runner: DecodeGraphRunner, seqs, sampling: SamplingInputs | None = None) -> DecodeOutput:
    """One decode step of ``seqs`` run eagerly and compiled from the same caches; checks; keeps the compiled state.
    ``sampling``: the step draws its tokens (the runner's sampling graph); they must be what ce::sample's reference
    draws from the graph's own logits."""
    step = rt.build_step(seqs, [1] * len(seqs), is_prefill=False)
    n = len(seqs)
    padded = runner.policy.covers(n) and runner.policy.bucket_for(n) > n
    model = rt.model
    before = snapshot(model)
    eager = model.compute_logits(model(step))
    eager_after = snapshot(model)
    eagers = [eager]
    restore(model, before)
    if padded:  # eager at the graph's row count too: the GEMMs round each row count differently
        bucket_step = padded_step(step, runner.policy.bucket_for(n), rt.config.block_size)
        eagers.append(model.compute_logits(model(bucket_step))[:n])
        restore(model, before)
    compiled = runner(step, sampling)
    assert compiled.logits.shape == eager.shape and compiled.logits.dtype == rt.dtype
    # Both are fp32 roundings of the same math, neither the truth: each is judged against float64 math from the same
    # caches, and the compiled one must be about as close to it as eager (ORACLE_FACTOR, tests/compile_helpers.py).
    assert_logits_near_oracle(compiled.logits.float(), eagers, float64_logits(model, step, before))
    if sampling is None:
        assert_same_greedy(compiled.tokens, eager)  # ce::argmax, inside the graph
        assert torch.equal(compiled.tokens, compiled.logits.argmax(dim=-1))
    else:
        assert torch.equal(compiled.tokens, reference_draw(compiled.logits, sampling))
    if runner.policy.covers(n):  # the graph's epilogue left the tokens as the next step's input ids
        assert torch.equal(runner.static.input_ids[:n], compiled.tokens)
    assert_isolated(model, before, step, block_size=rt.config.block_size, padded=padded)
    for name, buf in cache_buffers(model).items():  # the rows the step wrote hold what eager wrote
        written = torch.tensor(sorted(written_rows(name, step)), dtype=torch.long)
        assert_rows_close(rows(name, buf)[written], rows(name, eager_after[name])[written])
    return compiled


@torch.inference_mode()
def test_the_float64_oracle_is_hf_in_float64(qwen3_5_text_tied_path):
    """The oracle the compiled steps are judged by (``float64_logits``) against HF's modules in float64 math: a
    prefill of two sequences, then a decode step from the caches the oracle's own prefill left."""
    from tests import hf_models

    rt = Runtime.from_pretrained(str(qwen3_5_text_tied_path), device="cpu", dtype="float32", max_model_len=64,
                                 max_num_seqs=2)
    prompts, nexts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1]], [11, 13]
    seqs = [rt.add_sequence(list(p)) for p in prompts]
    prefill = rt.build_step(seqs, [len(p) for p in prompts], is_prefill=True)
    got_prefill = float64_logits(rt.model, prefill, snapshot(rt.model))
    for seq, token in zip(seqs, nexts):
        seq.token_ids.append(token)
    decode = rt.build_step(seqs, [1, 1], is_prefill=False)
    got_decode = float64_logits(rt.model, decode, snapshot(float64_twin(rt.model)))
    hf = hf_models.load_hf(qwen3_5_text_tied_path).double()
    with torch.inference_mode(False), torch.no_grad(), Float64Math():
        want_prefill = torch.stack([hf_models.hf_logits(hf, p)[-1] for p in prompts])
        want_decode = torch.stack([hf_models.hf_logits(hf, p + [t])[-1] for p, t in zip(prompts, nexts)])
    assert got_prefill.dtype == got_decode.dtype == want_decode.dtype == torch.float64
    torch.testing.assert_close(got_prefill, want_prefill, atol=1e-10, rtol=0)
    torch.testing.assert_close(got_decode, want_decode, atol=1e-10, rtol=0)


# --------------------------------------------------------------------------------------------------------------
# fixture: one runtime with a compiled decode, built with live sequences present
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled(qwen3_5_text_tied_path):
    """(runtime with ``decode_fn`` = the runner, runner, facts recorded while warming up)."""
    rt = Runtime.from_pretrained(
        str(qwen3_5_text_tied_path),
        device="cpu",
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
        num_kv_blocks=NUM_KV_BLOCKS,
        block_size=BLOCK_SIZE,
    )
    live = [rt.add_sequence([3, 1, 4, 1, 5, 9, 2, 6][:n]) for n in (3, 8, 20 % 8 + 1)]
    rt.prefill(live)
    before = snapshot(rt.model)
    graphs0, breaks0 = graph_stats()
    bar = io.StringIO()
    with contextlib.redirect_stderr(bar):
        runner = rt.compile_decode(buckets=BUCKETS, progress=True)
    graphs1, breaks1 = graph_stats()
    facts = {
        "graphs_compiled": graphs1 - graphs0,
        "graph_breaks": breaks1 - breaks0,
        "progress": bar.getvalue(),
        "warmup_changed": [
            name
            for name, buf in cache_buffers(rt.model).items()
            if not torch.equal(
                rows(name, buf)[sorted(set(range(rows(name, buf).shape[0])) - null_rows(name, BLOCK_SIZE))],
                rows(name, before[name])[sorted(set(range(rows(name, buf).shape[0])) - null_rows(name, BLOCK_SIZE))],
            )
        ],
    }
    for seq in live:
        rt.release(seq)
    return rt, runner, facts


# --------------------------------------------------------------------------------------------------------------
# bucket policy and static buffers (no compile)
# --------------------------------------------------------------------------------------------------------------


@given(max_num_seqs=st.integers(1, 700), data=st.data())
def test_default_buckets_cover_every_batch(max_num_seqs, data):
    sizes = default_bucket_sizes(max_num_seqs)
    assert sizes[0] == 1 and sizes[-1] == max_num_seqs and list(sizes) == sorted(set(sizes))
    policy = BucketPolicy.create(max_num_seqs)
    n = data.draw(st.integers(1, max_num_seqs))
    bucket = policy.bucket_for(n)
    assert bucket in sizes and bucket >= n
    assert all(s < n for s in sizes if s < bucket)  # the smallest bucket that fits


def test_default_buckets_256():
    assert default_bucket_sizes(256) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def test_bucket_policy_rejects_bad_input():
    policy = BucketPolicy.create(8, [4, 1, 2, 2])
    assert policy.sizes == (1, 2, 4) and policy.bucket_for(3) == 4
    for n in (0, 5):
        with pytest.raises(ValueError):
            policy.bucket_for(n)
    for bad in ([], [0, 1], [1.5], [16]):
        with pytest.raises(ValueError):
            BucketPolicy.create(8, bad)


def test_static_inputs_pad_lanes_and_stale_columns():
    static = StaticDecodeInputs(max_batch=4, max_blocks_per_seq=5, block_size=BLOCK_SIZE, device="cpu")
    wide = StepInputs(
        input_ids=torch.tensor([7, 8, 9, 10]),
        positions=torch.tensor([70, 71, 72, 73]),
        slot_mapping=torch.tensor([100, 200, 300, 400]),
        block_tables=torch.arange(1, 21, dtype=torch.int32).view(4, 5),
        context_lens=torch.tensor([71, 72, 73, 74], dtype=torch.int32),
        state_slots=torch.tensor([4, 3, 2, 1], dtype=torch.int32),
    )
    static.fill(wide)
    narrow = StepInputs(
        input_ids=torch.tensor([5]),
        positions=torch.tensor([17]),
        slot_mapping=torch.tensor([33]),
        block_tables=torch.tensor([[1, 2]], dtype=torch.int32),
        context_lens=torch.tensor([18], dtype=torch.int32),
        state_slots=torch.tensor([2], dtype=torch.int32),
    )
    static.fill(narrow)
    assert static.input_ids.tolist() == [5, 0, 0, 0] and static.positions.tolist() == [17, 0, 0, 0]
    assert static.slot_mapping.tolist() == [33] + [NULL_BLOCK * BLOCK_SIZE] * 3
    assert static.block_tables.tolist() == [[1, 2] + [NULL_BLOCK] * 3] + [[NULL_BLOCK] * 5] * 3
    assert static.context_lens.tolist() == [18, 0, 0, 0] and static.state_slots.tolist() == [2] + [NULL_SLOT] * 3
    with pytest.raises(ValueError):
        static.fill(StepInputs(*(t.repeat(5, *([1] * (t.dim() - 1))) for t in (
            narrow.input_ids, narrow.positions, narrow.slot_mapping, narrow.block_tables, narrow.context_lens,
            narrow.state_slots))))


def _decode_sequences(rows: list[tuple[int, int, int]], block_size: int) -> list[Sequence]:
    """Decode-ready sequences from (context, slot, first block): one uncomputed token, blocks first..first+k-1."""
    seqs = []
    for i, (context, slot, first) in enumerate(rows):
        seq = Sequence(i, [(7 * i + j) % 50 for j in range(context + 1)], 1, num_computed_tokens=context)
        seq.block_table = list(range(first, first + context // block_size + 1))
        seq.state_slot = slot
        seqs.append(seq)
    return seqs


@given(data=st.data())
def test_static_inputs_equal_a_freshly_padded_copy_of_each_step(data):
    """Whatever came before, after ``fill(step)`` row i < N holds the step's row i (its block table null beyond the
    step's width) and every other row is a padding lane; packed (pack_step) and field-by-field steps alike, and steps
    whose input ids are already in place (the graph's greedy tokens: rows 0..N-1 of the buffer, left as they are)."""
    max_batch, max_blocks, block_size = 6, 5, 4
    static = StaticDecodeInputs(max_batch, max_blocks, block_size, device="cpu")
    row = st.tuples(st.integers(0, max_blocks * block_size - 1), st.integers(1, 9), st.integers(1, 20))
    for _ in range(data.draw(st.integers(1, 8), label="steps")):
        seqs = _decode_sequences(data.draw(st.lists(row, min_size=1, max_size=max_batch), label="rows"), block_size)
        step = pack_step(seqs, [1] * len(seqs), False, block_size, torch.device("cpu"))
        if data.draw(st.booleans(), label="field by field"):
            step = dataclasses.replace(step, **{f: getattr(step, f).clone() for f in STEP_FIELDS})
        n, width = len(seqs), step.block_tables.shape[1]
        ids_before = static.input_ids.clone()
        in_place = data.draw(st.booleans(), label="input ids in place")
        if in_place:  # as a replay leaves them: the greedy tokens written over rows 0..bucket-1
            static.input_ids[:n] = step.input_ids
            ids_before = static.input_ids.clone()
            step = dataclasses.replace(step, input_ids=static.input_ids[:n])
        static.fill(step)
        pads = {"input_ids": 0, "positions": 0, "slot_mapping": NULL_BLOCK * block_size, "context_lens": 0,
                "state_slots": NULL_SLOT, "block_tables": NULL_BLOCK}
        for name in STEP_FIELDS:
            got, want = getattr(static, name), torch.full_like(getattr(static, name), pads[name])
            if name == "block_tables":
                want[:n, :width] = step.block_tables
            elif name == "input_ids" and in_place:
                want = ids_before  # untouched: a padding lane's token only has to be a valid id
            else:
                want[:n] = getattr(step, name)
            assert torch.equal(got, want), name
        if not in_place:  # compile_helpers.padded_step (compare_step's padded eager run) pads as the graph does
            padded = padded_step(step, max_batch, block_size)
            for name in STEP_FIELDS:
                got = getattr(static, name)
                assert torch.equal(got[:, :width] if name == "block_tables" else got, getattr(padded, name)), name


def _count_writes():
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountWrites(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.writes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.copy_, torch.ops.aten.fill_):
                self.writes.append((func.overloadpacket.__name__, args[0].numel() * args[0].element_size()))
            return func(*args, **(kwargs or {}))

    return CountWrites()


@pytest.mark.parametrize("ids_in_place", [False, True])
def test_static_inputs_fill_a_host_step_in_one_copy(ids_in_place):
    """A step built on the host lands in one copy (one host -> device copy on a GPU), whatever the batch does, and
    carries the block tables only when they changed; input ids in place are left out of it (and the same step again,
    with nothing run in between, is not copied at all)."""
    max_batch, max_blocks, block_size = 8, 6, 4
    static = StaticDecodeInputs(max_batch, max_blocks, block_size, device="cpu")
    rows = 16  # max_batch rounded up to 16 rows
    one_d_bytes = (3 if ids_in_place else 4) * rows * 8 + 2 * rows * 4  # [input_ids |] positions .. state_slots
    previous_n = 0
    for n, same_tables in ((1, False), (3, False), (3, True), (8, False), (2, False), (2, True)):
        seqs = _decode_sequences([(2 * i + 5, i + 1, 10 * i + 1) for i in range(n)], block_size)
        step = pack_step(seqs, [1] * n, False, block_size, torch.device("cpu"))
        if ids_in_place:
            static.input_ids[:n] = step.input_ids
            step = dataclasses.replace(step, input_ids=static.input_ids[:n])
        with _count_writes() as count:
            static.fill(step)
        table_bytes = 0 if same_tables else max(n, previous_n) * max_blocks * 4  # the rows either step used
        if same_tables and ids_in_place:  # the very step the buffers hold (no replay in between): nothing to copy
            assert count.writes == [], (n, count.writes)
        else:
            assert count.writes == [("copy_", one_d_bytes + table_bytes)], (n, count.writes)
        for name in STEP_FIELDS:
            got = getattr(static, name)[:n]
            assert torch.equal(got[:, : step.block_tables.shape[1]] if name == "block_tables" else got,
                               getattr(step, name)), (n, name)
        previous_n = n


def test_static_inputs_copy_nothing_when_the_graph_left_the_step():
    """The steady state: after a replay (simulated here by the graph's epilogue, ce::advance_decode_inputs) the next
    step of the same sequences, built on the host, is already in the buffers: no copy, and the buffers equal that
    step. A step that opens a KV block is copied (its table changed)."""
    block_size = 4
    static = StaticDecodeInputs(max_batch=4, max_blocks_per_seq=6, block_size=block_size, device="cpu")
    seqs = _decode_sequences([(5, 1, 1), (1, 2, 10), (9, 3, 20)], block_size)  # contexts 5, 1, 9
    step = pack_step(seqs, [1] * 3, False, block_size, torch.device("cpu"))
    static.fill(step)
    for i in range(4):
        greedy = torch.tensor([100 + i, 200 + i, 300 + i])
        logits = torch.nn.functional.one_hot(greedy, 400).float()
        torch.ops.ce.advance_decode_inputs(logits, *(t[:3] for t in static.tensors()[:3]), static.context_lens[:3],
                                           static.block_tables[:3], static.token_ring, static.ring_slot, block_size)
        ring_row = static.replayed()
        assert ring_row[:3].tolist() == greedy.tolist()
        opens_block = any((seq.num_computed_tokens + 1) % block_size == 0 for seq in seqs)
        for seq, token in zip(seqs, greedy.tolist()):  # the host's side of the same step
            seq.token_ids.append(token)
            if (seq.num_computed_tokens + 1) % block_size == 0:
                seq.block_table.append(50 + seq.seq_id)  # the scheduler reserves the block the next token opens
            seq.num_computed_tokens += 1
        step = dataclasses.replace(pack_step(seqs, [1] * 3, False, block_size, torch.device("cpu")),
                                   input_ids=static.input_ids[:3])
        with _count_writes() as count:
            static.fill(step)
        assert len(count.writes) == (1 if opens_block else 0), (i, count.writes)
        for name in STEP_FIELDS:
            got = getattr(static, name)[:3]
            assert torch.equal(got[:, : step.block_tables.shape[1]] if name == "block_tables" else got,
                               getattr(step, name)), (i, name)


# --------------------------------------------------------------------------------------------------------------
# compiled decode
# --------------------------------------------------------------------------------------------------------------


def test_one_graph_per_bucket_and_warmup_leaves_live_state_alone(compiled):
    rt, runner, facts = compiled
    assert facts["graphs_compiled"] == expected_compiles(BUCKETS, len(runner.variants))
    assert facts["graph_breaks"] == 0
    assert facts["warmup_changed"] == [], "warm-up changed non-null rows of live sequences"
    assert runner.warmed_up and set(runner.bucket_seconds) == set(BUCKETS)
    # compile_decode(progress=True) drew a bar that counted every bucket's variants to the end
    total = len(BUCKETS) * len(runner.variants)
    assert "compiling decode steps" in facts["progress"], facts["progress"]
    assert f"{total}/{total}" in facts["progress"].split("\r")[-1], facts["progress"]


@given(data=st.data())
def test_compiled_decode_matches_eager(compiled, data):
    """Random live sequences; each step decodes a random subset of them, in random order, through the runner."""
    rt, runner, _ = compiled
    vocab = rt.model_config.vocab_size
    token = st.integers(0, vocab - 1)
    num_live = data.draw(st.integers(1, MAX_NUM_SEQS), label="live sequences")
    prompts = [data.draw(st.lists(token, min_size=1, max_size=40), label=f"prompt {i}") for i in range(num_live)]
    seqs = [rt.add_sequence(p) for p in prompts]
    try:
        rt.prefill(seqs)
        for _ in range(data.draw(st.integers(1, 4), label="steps")):
            size = data.draw(st.integers(1, min(num_live, max(BUCKETS))), label="batch size")
            batch = data.draw(st.permutations(seqs), label="order")[:size]
            for seq in batch:
                seq.token_ids.append(data.draw(token))
            compare_step(rt, runner, batch)
    finally:
        for seq in seqs:
            rt.release(seq)


@given(data=st.data())
def test_stream_matches_solo_eager_runs(compiled, data):
    """Sequences join, finish (their slot and blocks are reused) and reorder between compiled steps; each one's
    logits at every step equal its solo eager run (teacher-forced: the same tokens are fed in both runs)."""
    rt, runner, _ = compiled
    vocab = rt.model_config.vocab_size
    token = st.integers(0, vocab - 1)
    n = data.draw(st.integers(2, 5), label="sequences")
    prompts = [data.draw(st.lists(token, min_size=1, max_size=33), label=f"prompt {i}") for i in range(n)]
    feeds = [data.draw(st.lists(token, min_size=1, max_size=5), label=f"tokens {i}") for i in range(n)]
    joins = [data.draw(st.integers(0, 3), label=f"joins at step {i}") for i in range(n)]

    solo: list[list[torch.Tensor]] = []
    for prompt, feed in zip(prompts, feeds):  # reference: each sequence alone, eager
        seq = rt.add_sequence(prompt)
        try:
            rt.prefill([seq])
            logits = []
            for t in feed:
                seq.token_ids.append(t)
                logits.append(eager_decode_step(rt, [seq])[0])
            solo.append(logits)
        finally:
            rt.release(seq)

    active: dict[int, object] = {}  # sequence index -> Sequence
    done = [0] * n
    step = 0
    try:
        while any(done[i] < len(feeds[i]) for i in range(n)):
            joining = [i for i in range(n) if joins[i] == step or (joins[i] < step and i not in active and done[i] == 0)]
            joining = [i for i in joining if i not in active][: MAX_NUM_SEQS - len(active)]
            if joining:
                for i in joining:  # prefilled one by one, as in the solo runs: only decode is batched here
                    active[i] = rt.add_sequence(prompts[i])
                    rt.prefill([active[i]])
            order = data.draw(st.permutations(sorted(active)), label=f"order at step {step}")[: max(BUCKETS)]
            if order:
                for i in order:
                    active[i].token_ids.append(feeds[i][done[i]])
                logits = rt.decode_step([active[i] for i in order])  # the runner (rt.decode_fn)
                for row, i in enumerate(order):
                    assert_stream_step_close(logits[row], solo[i][done[i]])
                    done[i] += 1
                    if done[i] == len(feeds[i]):  # finished: free its slot and blocks for the next ones
                        rt.release(active.pop(i))
            step += 1
    finally:
        for seq in active.values():
            rt.release(seq)


def test_no_recompile_after_warmup_and_stance_is_scoped(compiled):
    rt, runner, _ = compiled
    graphs0, breaks0 = graph_stats()
    seqs = [rt.add_sequence([i + 1] * (i + 2)) for i in range(MAX_NUM_SEQS)]
    try:
        rt.prefill(seqs)
        for size in (1, 2, 3, 4, 5, 6, 3, 1):  # every bucket, padded and not, and the eager fallback (5, 6)
            for seq in seqs[:size]:
                seq.token_ids.append(7)
            rt.decode_step(seqs[:size])
    finally:
        for seq in seqs:
            rt.release(seq)
    assert graph_stats() == (graphs0, breaks0)
    # Inputs the warm-up did not compile for (int32 token ids) would be a recompile: the runner's stance turns that
    # into an error ...
    tensors = list(runner.static.tensors())
    tensors[0] = tensors[0].int()
    with pytest.raises(Exception, match="(?i)recompil"):
        with torch.inference_mode(), runner._stance():
            runner._compiled(runner.model, *tensors, *runner.sampling.tensors(), 2, runner.static.block_size, False)
    # ... and the stance is scoped to the runner's calls: other compiled code in the process still compiles.
    assert torch.compile(lambda x: x * 2 + 1, backend="eager", fullgraph=True)(torch.ones(3)).tolist() == [3.0] * 3


def test_eager_fallback_beyond_the_largest_bucket(compiled):
    rt, runner, _ = compiled
    seqs = [rt.add_sequence([5, 6, 7][: 1 + i % 3]) for i in range(5)]
    try:
        rt.prefill(seqs)
        for seq in seqs:
            seq.token_ids.append(11)
        compare_step(rt, runner, seqs)  # 5 sequences > bucket 4: runs the eager model
    finally:
        for seq in seqs:
            rt.release(seq)


def test_compile_counter_one_frame_per_bucket(compiled):
    """The same function under a counting backend: the expected Dynamo frames, all ops in them, none after warm-up."""
    rt, _, _ = compiled
    counter = torch._dynamo.testing.CompileCounter()
    runner = DecodeGraphRunner(
        rt.model,
        max_num_seqs=MAX_NUM_SEQS,
        max_blocks_per_seq=MAX_MODEL_LEN // BLOCK_SIZE,
        device="cpu",
        buckets=BUCKETS,
        backend=counter,
    )
    runner.warmup()
    assert counter.frame_count == expected_compiles(BUCKETS, len(runner.variants)) and counter.op_count > 0
    seqs = [rt.add_sequence([2, 7, 1, 8][: i + 1]) for i in range(4)]
    try:
        rt.prefill(seqs)
        for size in (4, 3, 2, 1):
            for seq in seqs[:size]:
                seq.token_ids.append(9)
            compare_step(rt, runner, seqs[:size])
    finally:
        for seq in seqs:
            rt.release(seq)
    assert counter.frame_count == expected_compiles(BUCKETS, len(runner.variants))  # nothing compiled after warm-up


@given(data=st.data())
def test_compiled_sampled_decode_matches_the_sampler(compiled, data):
    """Random live sequences and per-row sampling parameters (greedy rows among them): the sampling graph's tokens
    are ce::sample's reference draw from its logits, the logits and caches those of the eager step."""
    rt, runner, _ = compiled
    vocab = rt.model_config.vocab_size
    token = st.integers(0, vocab - 1)
    num_live = data.draw(st.integers(1, MAX_NUM_SEQS), label="live sequences")
    # Every draw that can end the example comes before the first sequence is added: an example that hypothesis ends
    # mid-draw (an overrun) must leave no sequence behind, or later examples find the state slots taken.
    prompts = [data.draw(st.lists(token, min_size=1, max_size=20), label=f"prompt {i}") for i in range(num_live)]
    seqs = [rt.add_sequence(p) for p in prompts]
    try:
        rt.prefill(seqs)
        for _ in range(data.draw(st.integers(1, 3), label="steps")):
            size = data.draw(st.integers(1, min(num_live, max(BUCKETS))), label="batch size")
            batch = data.draw(st.permutations(seqs), label="order")[:size]
            for seq in batch:
                seq.token_ids.append(data.draw(token))
            sampling = draw_sampling_inputs(data, len(batch), vocab)
            compare_step(rt, runner, batch, sampling)
    finally:
        for seq in seqs:
            rt.release(seq)


def test_runner_rejects_bad_steps(compiled):
    rt, runner, _ = compiled
    seq = rt.add_sequence([1, 2, 3])
    try:
        prefill_step = rt.build_step([seq], [3], is_prefill=True)
        with pytest.raises(ValueError, match="prefill"):
            runner(prefill_step)
    finally:
        rt.release(seq)


@pytest.mark.parametrize("num_seqs", [1, 2, 3])  # the batch-1 graph, the dynamic-batch one, the largest (padded)
def test_replay_last_runs_the_next_greedy_step(compiled, num_seqs):
    """The bench's GPU-time probe: a replay without new inputs runs the next greedy step of the same sequences (the
    graph advanced its own inputs: ce::advance_decode_inputs): the same as that step built on the host (pack_step)
    and copied in, bit for bit, caches included; the greedy tokens also land in host memory."""
    rt, runner, _ = compiled
    seqs = [rt.add_sequence([4, 4, 2][: i + 1]) for i in range(num_seqs)]
    try:
        rt.prefill(seqs)
        for seq in seqs:
            seq.token_ids.append(13)
        first = rt.decode(seqs)
        greedy = first.tokens.tolist()
        assert first.host_tokens.tolist() == greedy
        before = snapshot(rt.model)
        replayed = runner.replay_last(len(seqs))
        replayed = (replayed.logits.clone(), replayed.tokens.clone(), replayed.host_tokens.tolist())
        after_replay = snapshot(rt.model)
        restore(rt.model, before)
        for seq, token in zip(seqs, greedy):  # the same step from the host: input ids copied, not in place
            seq.token_ids.append(token)
        built = rt.decode(seqs)
        assert torch.equal(replayed[0], built.logits) and torch.equal(replayed[1], built.tokens)
        assert replayed[2] == built.host_tokens.tolist() == built.tokens.tolist()
        for name, buf in cache_buffers(rt.model).items():  # every row but the null ones (padding lanes' garbage)
            live = sorted(set(range(rows(name, buf).shape[0])) - null_rows(name, BLOCK_SIZE))
            assert torch.equal(rows(name, buf)[live], rows(name, after_replay[name])[live]), name
        with pytest.raises(ValueError, match="no warmed-up graph"):
            runner.replay_last(MAX_NUM_SEQS + 1)
    finally:
        for seq in seqs:
            rt.release(seq)


def test_replay_last_stops_where_the_block_tables_end(compiled):
    """Back-to-back replays advance the sequences by themselves: they run while every context stays within
    max_model_len (the block tables' reach), and the next one raises instead of letting the attention read past the
    tables (on a GPU: an illegal address)."""
    rt, runner, _ = compiled
    seq = rt.add_sequence([4] * (MAX_MODEL_LEN - 4))
    try:
        rt.prefill([seq])
        seq.token_ids.append(13)
        rt.decode([seq])  # context MAX_MODEL_LEN - 3
        for _ in range(3):  # contexts MAX_MODEL_LEN - 2, MAX_MODEL_LEN - 1, MAX_MODEL_LEN
            runner.replay_last(1)
        with pytest.raises(ValueError, match="end of their block tables"):
            runner.replay_last(1)
    finally:
        rt.release(seq)


def test_ce_ops_are_inductor_fallbacks_with_their_tags_layout_constraint(compiled):
    """register_inductor_fallbacks (run by warmup) registered every ce op as the implicit path would have."""
    from torch._inductor import lowering
    from torch._library.utils import get_layout_constraint_tag

    from graphs.decode_graph import register_inductor_fallbacks
    from ops.library import OPS

    register_inductor_fallbacks(OPS)  # idempotent: the fixture's warmup already did it
    assert len(OPS) >= 10
    for op in OPS:
        assert op in lowering.lowerings, op
        want = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
        assert want is lowering.constrain_to_fake_tensors  # EXACT_STRIDES (ops/library.py)
        assert lowering._maybe_layout_constraints.get(op) is want, op


_FRESH_COMPILE = """
import io, logging, sys
import torch
records = []
class Collect(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())  # formats the message, as a handler that prints it would
log = logging.getLogger("torch._inductor.graph")
log.setLevel(logging.INFO)
log.addHandler(Collect())
from ops.step import DecodeOutput
from compiled_engine.runtime import Runtime
rt = Runtime.from_pretrained(sys.argv[1], device="cpu", dtype="float32", max_model_len=64, max_num_seqs=1,
                             num_kv_blocks=8, block_size=16)
rt.compile_decode(buckets=(1,))
print("FALLBACKS", [m.split(chr(10))[1][:60] for m in records if m.startswith("Creating implicit fallback")])
"""


def test_a_fresh_decode_compile_creates_no_implicit_fallback_for_a_ce_op(qwen3_5_text_tied_path, tmp_path):
    """The implicit path formats its log line from every input's IR, which before torch 2.13 happened eagerly and
    doubled with every layer before the op (run 20: minutes). In a fresh process, with that line logged, none of
    our ops may take it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
               TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0",
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    done = subprocess.run([sys.executable, "-c", _FRESH_COMPILE, str(qwen3_5_text_tied_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("FALLBACKS"))
    assert "ce." not in line and "ce::" not in line, line

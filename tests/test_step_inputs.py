"""pack_step's layout, and the prefill fields that spare FLA its per-layer host work (bench/NOTES.md, "Next" 3).

FLA's chunked delta rule memoises what it derives from ``cu_seqlens`` on the identity (``is``) of the tensor object
it is handed, and derives its chunk table on the device with a host sync when it is not given one. So:
  * pack_step puts an int64 copy of cu_seqlens and the chunk table (computed on the host) into its int64 buffer;
  * every linear layer of a step passes those very objects to ``ce::gated_delta_rule_prefill``;
  * the dispatcher hands the op's kernel the caller's own Python objects (so the identity survives the op boundary);
  * each step has new ones (so a memo hit is never stale).
FLA's kernels need a GPU; these checks do not (tests/test_kernels_cuda.py runs FLA with and without the fields).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compiled_engine.runtime import Runtime
from compiled_engine.step import pack_step
from ops.step import StepInputs
from ops.delta_rule import CHUNK_SIZE
from ops.library import NULL_BLOCK

BLOCK_SIZE = 16
ROOT = Path(__file__).resolve().parents[1]


def _fake_seqs(lengths, starts, slots):
    """What pack_step reads of a Sequence: tokens, computed count, block table (reserved), state slot."""
    seqs = []
    for i, (n, start, slot) in enumerate(zip(lengths, starts, slots)):
        blocks = -(-(start + n) // BLOCK_SIZE)
        seqs.append(SimpleNamespace(
            token_ids=[(7 * i + j) % 97 + 1 for j in range(start + n)],
            num_computed_tokens=start,
            block_table=[100 * (i + 1) + b for b in range(blocks)],
            state_slot=slot,
        ))
    return seqs


def _chunk_table_by_loop(lengths) -> list[list[int]]:
    return [[n, c] for n, length in enumerate(lengths) for c in range(-(-length // CHUNK_SIZE))]


def _byte_offset(t: torch.Tensor) -> int:
    return t.storage_offset() * t.element_size()


@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=9),
    start_seed=st.integers(0, 2**16),
)
def test_pack_step_prefill_fields(lengths, start_seed):
    starts = [(start_seed * (i + 3)) % 50 for i in range(len(lengths))]
    seqs = _fake_seqs(lengths, starts, slots=list(range(1, len(lengths) + 1)))
    step = pack_step(seqs, lengths, True, BLOCK_SIZE, torch.device("cpu"))
    cu = [0, *itertools.accumulate(lengths)]

    spans = list(zip(seqs, starts, lengths))
    assert step.input_ids.tolist() == [t for s, st_, n in spans for t in s.token_ids[st_ : st_ + n]]
    assert step.positions.tolist() == [p for st_, n in zip(starts, lengths) for p in range(st_, st_ + n)]
    assert step.slot_mapping.tolist() == [
        s.block_table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
        for s, st_, n in zip(seqs, starts, lengths)
        for p in range(st_, st_ + n)
    ]
    width = max(len(s.block_table) for s in seqs)
    assert step.block_tables.tolist() == [s.block_table + [NULL_BLOCK] * (width - len(s.block_table)) for s in seqs]
    assert step.context_lens.tolist() == [st_ + n for st_, n in zip(starts, lengths)]
    assert step.state_slots.tolist() == [s.state_slot for s in seqs]
    assert step.cu_seqlens.dtype == torch.int32 and step.cu_seqlens.tolist() == cu

    # The FLA fields: the same offsets as int64, and the chunk table, both in the int64 buffer (no extra copy).
    assert step.cu_seqlens_long.dtype == torch.long and step.cu_seqlens_long.tolist() == cu
    assert step.chunk_indices.dtype == torch.long and step.chunk_indices.shape[1] == 2
    assert step.chunk_indices.tolist() == _chunk_table_by_loop(lengths)
    assert step.chunk_indices.is_contiguous() and step.cu_seqlens_long.is_contiguous()
    base64 = step.input_ids.untyped_storage().data_ptr()
    for t in (step.positions, step.slot_mapping, step.cu_seqlens_long, step.chunk_indices):
        assert t.untyped_storage().data_ptr() == base64
    base32 = step.context_lens.untyped_storage().data_ptr()
    for t in (step.state_slots, step.cu_seqlens, step.block_tables):
        assert t.untyped_storage().data_ptr() == base32

    # Every field starts 16-byte aligned, whatever the counts: Triton specialises pointer arguments on it.
    for name in ("input_ids", "positions", "slot_mapping", "block_tables", "context_lens", "state_slots",
                 "cu_seqlens", "cu_seqlens_long", "chunk_indices"):
        assert _byte_offset(getattr(step, name)) % 16 == 0, name


@given(lengths=st.lists(st.integers(0, 300), min_size=1, max_size=9).filter(any), extra=st.integers(0, 3))
def test_pack_step_pads_the_chunk_table_with_skip_rows(lengths, extra):
    """``chunk_rows`` (a captured step's fixed table length): the table, then rows naming the chunk just past the last
    sequence's end. ``max_chunk_rows`` is a bound for every split of the tokens (counted chunk by chunk here)."""
    from ops.delta_rule import max_chunk_rows

    real = _chunk_table_by_loop(lengths)
    rows = max_chunk_rows(sum(lengths), len(lengths))
    assert len(real) <= rows
    seqs = _fake_seqs(lengths, [0] * len(lengths), slots=list(range(1, len(lengths) + 1)))
    step = pack_step(seqs, lengths, True, BLOCK_SIZE, torch.device("cpu"), chunk_rows=rows + extra)
    skip = [len(lengths) - 1, -(-lengths[-1] // CHUNK_SIZE)]
    assert step.chunk_indices.tolist() == real + [skip] * (rows + extra - len(real))
    assert _byte_offset(step.chunk_indices) % 16 == 0
    if real:
        with pytest.raises(ValueError, match="num_rows"):
            pack_step(seqs, lengths, True, BLOCK_SIZE, torch.device("cpu"), chunk_rows=len(real) - 1)


def test_pack_step_decode_has_no_prefill_fields():
    seqs = _fake_seqs([1, 1, 1], [5, 17, 40], slots=[3, 1, 2])
    step = pack_step(seqs, [1, 1, 1], False, BLOCK_SIZE, torch.device("cpu"))
    assert step.cu_seqlens is None and step.cu_seqlens_long is None and step.chunk_indices is None
    assert step.input_ids.tolist() == [s.token_ids[p] for s, p in zip(seqs, [5, 17, 40])]
    assert step.positions.tolist() == [5, 17, 40] and step.context_lens.tolist() == [6, 18, 41]
    assert step.state_slots.tolist() == [3, 1, 2]


def test_host_chunk_indices_equals_flas_own():
    """Our host table is exactly what FLA would compute on the device (zero-length sequences included). In a
    subprocess: FLA imported here would stay in sys.modules, where the bench harness (bench/common.py hide_fla)
    refuses to find it next to transformers' already imported Qwen3.5 modules."""
    if importlib.util.find_spec("fla") is None:
        pytest.skip("FLA is not installed")
    script = textwrap.dedent("""
        import itertools, torch
        from fla.ops.utils.index import prepare_chunk_indices
        from ops.delta_rule import CHUNK_SIZE, host_chunk_indices
        for lengths in ([1], [64], [65], [0, 1, 0], [300, 0, 63, 64, 129], [8192], [512] * 16):
            cu = [0, *itertools.accumulate(lengths)]
            want = prepare_chunk_indices(torch.tensor(cu, dtype=torch.long), CHUNK_SIZE)
            got = torch.tensor(host_chunk_indices(cu), dtype=torch.long).view(-1, 2)
            assert torch.equal(got, want), (lengths, got.tolist(), want.tolist())
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_dispatcher_hands_kernels_the_callers_objects():
    """FLA's memo compares with ``is``: it can hit across layers only if a ``torch.ops`` call (Library.define/impl,
    as ops.library registers our ops) passes its kernel the caller's own Python tensor objects, views and optional
    tensors included, under inference mode as the engine runs."""
    lib = torch.library.Library("ce_identity_probe", "DEF")
    lib.define("probe(Tensor x, Tensor cu, Tensor? cu_long=None, Tensor? chunks=None) -> Tensor")
    seen = []

    def kernel(x, cu, cu_long=None, chunks=None):
        seen.append((cu, cu_long, chunks))
        return x.clone()

    lib.impl("probe", kernel, "CPU")
    torch.library.register_fake(
        "ce_identity_probe::probe", lambda x, cu, cu_long=None, chunks=None: x.new_empty(x.shape), lib=lib
    )
    for mode in (torch.inference_mode, torch.no_grad):
        with mode():
            packed = torch.arange(16)
            cu, cu_long, chunks = packed[:4].int(), packed[4:8], packed[8:16].view(4, 2)
            seen.clear()
            for _ in range(3):  # three "layers"
                torch.ops.ce_identity_probe.probe(torch.zeros(2), cu, cu_long, chunks)
            assert all(c is cu and cl is cu_long and ch is chunks for c, cl, ch in seen), mode


@pytest.fixture(scope="module")
def runtime(qwen3_5_text_tied_path):
    return Runtime.from_pretrained(str(qwen3_5_text_tied_path), device="cpu", dtype="float32", max_model_len=256,
                                   max_num_seqs=4, num_kv_blocks=64, block_size=BLOCK_SIZE)


def test_every_linear_layer_gets_the_steps_own_objects(runtime, monkeypatch):
    """Within a step all linear layers hand the op the same cu_seqlens_long / chunk_indices objects (the step's);
    the next step has new ones."""
    real = torch.ops.ce.gated_delta_rule_prefill
    calls = []

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(torch.ops.ce, "gated_delta_rule_prefill", spy)
    steps: list[StepInputs] = []
    build_step = runtime.build_step

    def recording_build_step(*args, **kwargs):
        steps.append(build_step(*args, **kwargs))
        return steps[-1]

    monkeypatch.setattr(runtime, "build_step", recording_build_step)
    seqs = [runtime.add_sequence(list(range(1, n + 1))) for n in (70, 3, 130)]
    try:
        runtime.prefill(seqs, [40, 3, 130])
        runtime.prefill(seqs[:1], [30])
    finally:
        for seq in seqs:
            runtime.release(seq)

    num_linear = len(runtime.model_config.linear_attention_layers)
    assert len(steps) == 2 and len(calls) == 2 * num_linear
    for step, layer_calls in zip(steps, (calls[:num_linear], calls[num_linear:])):
        for args in layer_calls:
            cu, _, cu_long, chunks, graphed = args[8:]
            assert cu is step.cu_seqlens and cu_long is step.cu_seqlens_long and chunks is step.chunk_indices
            assert graphed is False  # an eager step: the delta rule may take its recurrent form
    assert steps[0].cu_seqlens_long is not steps[1].cu_seqlens_long
    assert steps[1].chunk_indices.tolist() == [[0, 0]]


def test_the_reference_rejects_fields_that_disagree_with_cu_seqlens():
    """The CPU reference checks the optional fields, so every CPU prefill (engine tests included) checks pack_step."""
    g = torch.Generator().manual_seed(0)
    T, Hk, Hv, K, V = 5, 1, 2, 4, 4
    args = [
        torch.randn(T, Hk, K, generator=g), torch.randn(T, Hk, K, generator=g), torch.randn(T, Hv, V, generator=g),
        torch.randn(T, Hv, generator=g), torch.randn(T, Hv, generator=g), torch.zeros(Hv), torch.zeros(Hv),
        torch.zeros(3, Hv, K, V), torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([1, 2], dtype=torch.int32),
    ]
    good_cu, good_chunks = torch.tensor([0, 2, 5]), torch.tensor([[0, 0], [1, 0]])
    torch.ops.ce.gated_delta_rule_prefill(*args, good_cu, good_chunks)
    for cu_long, chunks in [
        (torch.tensor([0, 3, 5]), None),
        (good_cu.int(), None),
        (None, torch.tensor([[0, 0]])),
        (None, torch.tensor([[0, 0], [1, 1]])),
        (None, torch.tensor([0, 0, 1, 0])),
    ]:
        with pytest.raises(ValueError):
            torch.ops.ce.gated_delta_rule_prefill(*args, cu_long, chunks)


@settings(max_examples=300)
@given(ops=st.lists(st.tuples(st.sampled_from(["grow", "release", "admit", "replace", "step"]),
                              st.integers(0, 5), st.integers(1, 40)), min_size=1, max_size=60))
def test_block_tables_follow_the_sequences_lists(ops):
    """CacheManager's slot-indexed block tables, read by pack_step instead of each sequence's list, always equal the
    lists themselves: through blocks appended, sequences released (a new, empty list) and re-admitted to any free
    slot, a list replaced by a shorter one, tables wider than the array, and the padding sequence on the null slot."""
    from compiled_engine.block_tables import BlockTables
    from compiled_engine.step import PaddingSequence
    from ops.library import NULL_SLOT

    num_slots = 5
    tables = BlockTables(num_slots, width=4)
    seqs = [SimpleNamespace(block_table=[], state_slot=None, token_ids=[1], num_computed_tokens=0) for _ in range(6)]
    free = list(range(1, num_slots))  # slot 0 is the null slot
    next_block = itertools.count(1)
    for op, i, n in ops:
        seq = seqs[i]
        if op == "admit" and seq.state_slot is None and free:
            seq.state_slot = free.pop()  # the last released first, as SlotAllocator hands them out
        elif op == "grow" and seq.state_slot is not None:
            seq.block_table.extend(next(next_block) for _ in range(n))
        elif op == "replace" and seq.state_slot is not None:
            seq.block_table = seq.block_table[: n % (len(seq.block_table) + 1)]
        elif op == "release" and seq.state_slot is not None:
            free.append(seq.state_slot)
            seq.block_table, seq.state_slot = [], None
        elif op == "step":
            live = [s for s in seqs if s.state_slot is not None]
            live.append(PaddingSequence(n, BLOCK_SIZE))
            width = max(len(s.block_table) for s in live) + i
            expected = [s.block_table + [NULL_BLOCK] * (width - len(s.block_table)) for s in live]
            assert tables.rows(live, width).tolist() == expected
            assert live[-1].state_slot == NULL_SLOT


def test_block_tables_rewrite_a_row_whose_slot_changed_hands():
    """A slot released by a long sequence and taken by a shorter one, or by the same sequence re-run from scratch,
    and a list cut short in place: no stale block of the earlier table survives in the row."""
    from compiled_engine.block_tables import BlockTables

    tables = BlockTables(3, width=2)
    a = SimpleNamespace(block_table=[5, 6, 7, 8, 9], state_slot=1)
    assert tables.rows([a], 5).tolist() == [[5, 6, 7, 8, 9]]
    b = SimpleNamespace(block_table=[11, 12], state_slot=1)  # a released slot 1; b took it
    assert tables.rows([b], 5).tolist() == [[11, 12, 0, 0, 0]]
    b.block_table = [21]  # b released and re-admitted to the same slot (a new list)
    assert tables.rows([b], 3).tolist() == [[21, 0, 0]]
    b.block_table.extend([22, 23])
    del b.block_table[1:]  # the same list, cut short
    assert tables.rows([b], 3).tolist() == [[21, 0, 0]]
    c = SimpleNamespace(block_table=[31, 32, 33, 34], state_slot=1)  # b released; c, longer, took the slot
    assert tables.rows([c], 4).tolist() == [[31, 32, 33, 34]]
    d = SimpleNamespace(block_table=[41, 42, 43, 44], state_slot=1)  # as long as c's
    assert tables.rows([d], 4).tolist() == [[41, 42, 43, 44]]


def test_pack_step_reads_the_block_tables_kept_by_slot():
    """pack_step with the slot-indexed tables packs what it packs from the sequences' lists."""
    from compiled_engine.block_tables import BlockTables

    seqs = _fake_seqs([1, 1, 1], [40, 3, 17], [3, 1, 2])
    tables = BlockTables(4, width=2)
    for is_prefill in (False, True):
        a = pack_step(seqs, [1, 1, 1], is_prefill, BLOCK_SIZE, torch.device("cpu"))
        b = pack_step(seqs, [1, 1, 1], is_prefill, BLOCK_SIZE, torch.device("cpu"), tables=tables)
        assert a.block_tables.tolist() == b.block_tables.tolist()
        assert b.block_tables.tolist()[1] == [100 * 2 + 0] + [NULL_BLOCK] * 2

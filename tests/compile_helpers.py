"""Helpers and tolerances shared by the compiled-decode tests on CPU (test_compile.py) and CUDA (test_compile_gpu.py)."""

from __future__ import annotations

import copy
import dataclasses
import weakref
from typing import Sequence

import torch
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from compiled_engine.runtime import Runtime
from graphs.static_inputs import PAD_CONTEXT_LEN, PAD_POSITION, PAD_TOKEN_ID
from ops.library import NULL_BLOCK, NULL_SLOT, REFERENCES
from ops.sample import sample_reference
from ops.step import SamplingInputs, StepInputs

# Inductor fuses and vectorises the reductions (norms, softmax) differently from eager, so fp32 results differ by
# rounding. On these tiny models logits reach ~25 and rounding differences reach ~2e-4 (HF's own fp32 logits are
# ~2e-4 from float64 here, tests/test_parity.py), so two fp32 computations may be ~4e-4 apart or more: compiled and
# eager logits must agree within 1e-4 + 4e-5 * max|logit| (~1e-3). Observed over ~300 random steps: median 2.5e-5,
# max 2.5e-4; hypothesis later found a step 6.4e-4 apart at max|logit| 22 (a 3-token prompt among 6 live sequences,
# decoded alone; the same at the 2026-11-30 session's first commit, before this session's changes). Used on CUDA
# (test_compile_gpu.py); on the CPU, test_compile.py judges both against a float64 oracle instead (ORACLE_FACTOR).
LOGIT_ATOL = 1e-4
LOGIT_SCALE_RTOL = 4e-5
# A stream compares against solo eager runs several steps back: batched vs solo decode GEMMs round differently and
# every earlier step's rounding is carried in the recurrent state. Observed over ~800 stream steps: median 4e-5, max
# 5.4e-4; over 10,761 more (two seeds x 500 examples, profile thorough; max|logit| 18-41): median 3.8e-5, max 9.9e-4,
# at most 4.3e-5 x max|logit|. Then hypothesis found a step 2.15e-3 apart at max|logit| 31.7 (6.8e-5 x), past the
# former fixed 2e-3: a stream, like a single step, amplifies rounding now and then, and rounding scales with the
# logits. So the bound does too: 1e-4 + 1.5e-4 x max|logit| (~3e-3 at 20, 2.2x the worst step known). A sequence that
# read another one's state or KV would be off by O(1), a bf16 rounding by ~5e-2.
STREAM_LOGIT_ATOL = 1e-4
STREAM_LOGIT_SCALE_RTOL = 1.5e-4
# The cache rows a step writes (KV, conv inputs, recurrent states) are activations of the same fp32 computation: they
# round apart like the logits, relative to their scale. Compiled and eager rows must agree within
# 1e-4 + 4e-5 * max|row value| of the buffer; hypothesis found a conv-state value of ~1.1 1.19e-4 apart (4 live
# sequences, one of 278 tokens, 3 decoded together). A sequence that read another one's rows would be off by O(1).
STATE_ATOL = 1e-4
STATE_SCALE_RTOL = 4e-5
# On the CPU (test_compile.py) the compiled step's logits and the eager step's are each judged against float64 math
# from the same caches (float64_logits): the compiled ones may be at most ORACLE_FACTOR x as far from it as the eager
# ones, plus a floor of ORACLE_FLOOR_EPS fp32 epsilons of max|logit|. Two fp32 computations of one step can differ
# ~10-20x in accuracy by luck alone, and most of that is the row count: the CPU GEMMs round each row count
# differently, and the graph runs the bucket's padded rows. So where the graph pads a step, eager runs it twice,
# unpadded and padded as the graph pads it (padded_step), and the compiled logits are judged against the larger of the
# two errors. Measured over 39,675 random steps (20 seeds x 500 examples of the two hypothesis tests, profile
# thorough; max|logit| 18-45): |eager - f64| 1.9 to 523 eps x max|logit| (median 8.9); against unpadded eager alone
# the ratio |compiled - f64| / |eager - f64| had a 99.9th percentile of 10.1 and a max of 23, its worst steps (83 of
# the 97 past 6) at 3 rows (bucket 4), where eager at 4 rows rounds exactly as the graph does (e.g. eager 9.0 eps at 3
# rows, 207.1 at 4, compiled 207.1). Against both: median 1.0, 99.9th percentile 3.9, max 13.4 (a 1-row step: eager
# 6.9 eps, compiled 92.4; a step that amplifies rounding, which eager escaped). The floor, 128 eps x max|logit| (~4e-4
# at max|logit| 25; between the compiled errors' 99th and 99.9th percentiles, 74 and 207), covers such a step: with it
# the worst step measured is 2.6x inside the bound. A wrong or lower-precision computation is off by far more: a TF32
# matmul by ~2^-11 relative (~4,000 eps), bf16 rounding by ~2^-9 (~5e-2 here), a wrong row by O(1).
ORACLE_FACTOR = 16.0
ORACLE_FLOOR_EPS = 128.0
# And eager itself must be within 2,048 fp32 epsilons x max|logit| of float64 (3.9x the worst step measured): the
# bound above grows with eager's error, so it must not pass a step where both went wrong together.
ORACLE_EAGER_EPS = 2048.0
TIE_MARGIN = 2e-3  # greedy tokens are compared where eager's top-2 logits are further apart than this (~2x LOGIT_ATOL
# at max|logit| ~20); the oracle bound above is a separate check of the logits themselves
STATE_BUFFERS = ("conv_state", "recurrent_state")
KV_BUFFERS = ("k_cache", "v_cache")


def assert_rows_close(compiled: torch.Tensor, eager: torch.Tensor) -> None:
    """Cache rows written by a compiled step against the eager step's (tolerance: STATE_ATOL's comment)."""
    scale = eager.abs().max().item() if eager.numel() else 0.0
    torch.testing.assert_close(compiled, eager, atol=STATE_ATOL + STATE_SCALE_RTOL * scale, rtol=0)


def cache_buffers(model) -> dict[str, torch.Tensor]:
    return {n: b for n, b in model.named_buffers() if n.rsplit(".", 1)[-1] in STATE_BUFFERS + KV_BUFFERS}


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: b.clone() for n, b in cache_buffers(model).items()}


def restore(model, snap: dict[str, torch.Tensor]) -> None:
    for n, b in cache_buffers(model).items():
        b.copy_(snap[n])


def rows(name: str, t: torch.Tensor) -> torch.Tensor:
    """A cache as rows: state pools by slot, KV caches by flat token row (block * block_size + offset)."""
    if name.rsplit(".", 1)[-1] in KV_BUFFERS:
        return t.reshape(-1, *t.shape[2:])
    return t


def null_rows(name: str, block_size: int) -> set[int]:
    if name.rsplit(".", 1)[-1] in KV_BUFFERS:
        return set(range(NULL_BLOCK * block_size, (NULL_BLOCK + 1) * block_size))
    return {NULL_SLOT}


def written_rows(name: str, step) -> set[int]:
    """Rows a step writes for its live lanes."""
    if name.rsplit(".", 1)[-1] in KV_BUFFERS:
        return set(step.slot_mapping.tolist())
    return set(step.state_slots.tolist())


def assert_isolated(model, before, step, *, block_size: int, padded: bool) -> None:
    """Rows outside the step's live lanes are bit-identical, except the null rows when padding lanes ran."""
    for name, buf in cache_buffers(model).items():
        after, prev = rows(name, buf), rows(name, before[name])
        written = written_rows(name, step)
        nulls = null_rows(name, block_size)
        untouched = [r for r in range(after.shape[0]) if r not in written and (not padded or r not in nulls)]
        idx = torch.tensor(untouched, dtype=torch.long)
        changed = (after[idx] != prev[idx]).flatten(1).any(1)
        assert not changed.any(), f"{name}: rows {idx[changed].tolist()} changed but the step does not own them"


def assert_logits_close(compiled: torch.Tensor, eager: torch.Tensor, atol: float | None = None) -> None:
    if atol is None:
        atol = LOGIT_ATOL + LOGIT_SCALE_RTOL * eager.abs().max().item()
    torch.testing.assert_close(compiled, eager, atol=atol, rtol=0)


# --------------------------------------------------------------------------------------------------------------
# A float64 oracle for a decode step (CPU)
# --------------------------------------------------------------------------------------------------------------


class Float64Math(TorchFunctionMode):
    """Runs a float64 model's step in float64 math throughout.

    ``model.double()`` alone is not enough: the ops' CPU references compute in fp32 whatever their inputs
    (``x.float()``, ``torch.empty(..., dtype=torch.float32)``: they mirror a bf16 model's fp32 math), so a float64
    model would still round to fp32 inside every norm, attention and recurrence (measured: its logits 5e-6 to 1e-4
    from float64 math, about as far as the fp32 eager step's). Under this mode those casts and allocations make
    float64 instead, and each ce op runs as its reference (ops/library.py ``REFERENCES``), called directly with the
    mode on too (a dispatched op would reach its kernel below the torch-function layer, outside the mode). Any fp32
    tensor the step makes raises, so the oracle never silently rounds to fp32. test_compile.py checks it against HF's
    modules under this mode (a prefill, then a decode step from the caches it left).
    """

    def __init__(self):
        super().__init__()
        # The ce ops' references by overload and by packet (``torch.ops.ce.x.default`` and ``torch.ops.ce.x``).
        self._references = {**REFERENCES, **{op.overloadpacket: ref for op, ref in REFERENCES.items()}}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        elif func is torch.Tensor.to:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        reference = self._references.get(func)
        if reference is not None:
            with self:  # a handler runs with its mode off: back on for the op's reference, called directly
                out = reference(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in tree_leaves(out)):
            raise AssertionError(f"the float64 oracle made an fp32 tensor ({func}): Float64Math misses a cast")
        return out


_FLOAT64_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def float64_twin(model):
    """A float64 copy of ``model``, made on first use and kept while ``model`` lives (the weights never change after
    loading)."""
    twin = _FLOAT64_TWINS.get(model)
    if twin is None:
        with torch.inference_mode(False):  # plain tensors, as the model's own parameters are
            twin = _FLOAT64_TWINS[model] = copy.deepcopy(model).double()
    return twin


def float64_logits(model, step, caches: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[N, vocab]`` float64 logits of each sequence's last token of ``step`` (a decode step's every row) in
    float64 math, from ``caches`` (``snapshot(model)`` taken before the step, or a float64 twin's), on
    ``float64_twin(model)``, whose caches are overwritten from ``caches`` (converted) at every call and hold the
    step's writes after it."""
    twin = float64_twin(model)
    restore(twin, caches)
    with Float64Math():
        return twin.decode_logits(twin(step)[step.last_token_indices()])


def padded_step(step: StepInputs, rows: int, block_size: int) -> StepInputs:
    """The decode ``step`` with padding lanes up to ``rows``, as a graph's bucket runs it (graphs/static_inputs.py):
    token 0, position 0, KV row 0 of the null block, a null block table, context 0, the null slot."""
    k = rows - step.num_sequences

    def pad(field: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([field, field.new_full((k, *field.shape[1:]), value)])
    return dataclasses.replace(
        step, input_ids=pad(step.input_ids, PAD_TOKEN_ID), positions=pad(step.positions, PAD_POSITION),
        slot_mapping=pad(step.slot_mapping, NULL_BLOCK * block_size), block_tables=pad(step.block_tables, NULL_BLOCK),
        context_lens=pad(step.context_lens, PAD_CONTEXT_LEN), state_slots=pad(step.state_slots, NULL_SLOT))


def assert_logits_near_oracle(compiled: torch.Tensor, eagers: Sequence[torch.Tensor], oracle: torch.Tensor) -> None:
    """The compiled step's logits are about as close to the float64 ``oracle`` as the eager step's (``eagers``: its
    logits unpadded, and padded as the graph pads it where it does; tolerance: ORACLE_FACTOR's comment)."""
    eps_scale = torch.finfo(torch.float32).eps * oracle.abs().max().item()
    eager_error = 0.0
    for eager in eagers:
        error = (eager.double() - oracle).abs().max().item()
        assert error <= ORACLE_EAGER_EPS * eps_scale, (
            f"max |eager - float64 oracle| {error:.3g} > {ORACLE_EAGER_EPS} fp32 eps x max|logit|")
        eager_error = max(eager_error, error)
    compiled_error = (compiled.double() - oracle).abs().max().item()
    floor = ORACLE_FLOOR_EPS * eps_scale
    bound = ORACLE_FACTOR * eager_error + floor
    assert compiled_error <= bound, (
        f"max |compiled - float64 oracle| {compiled_error:.3g} > {ORACLE_FACTOR} x eager's {eager_error:.3g} + "
        f"{floor:.3g} (compiled - eager: {(compiled - eagers[0]).abs().max().item():.3g})")


def assert_same_greedy(compiled: torch.Tensor, eager: torch.Tensor, margin: float = TIE_MARGIN) -> None:
    """``compiled``: logits ``[N, V]`` or greedy tokens ``[N]``; equal to eager's argmax wherever eager's top two
    logits are more than ``margin`` apart (a near-tie may flip under a different rounding)."""
    top2 = eager.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > margin
    tokens = compiled if compiled.dim() == 1 else compiled.argmax(-1)
    assert torch.equal(tokens[decided], eager.argmax(-1)[decided])


def assert_stream_step_close(compiled: torch.Tensor, eager: torch.Tensor) -> None:
    """One sequence's logits ``[V]`` at a step of a stream against its solo eager run's: within the stream bound
    (``STREAM_LOGIT_SCALE_RTOL``), and the same greedy token where eager's top two are more than twice it apart."""
    atol = STREAM_LOGIT_ATOL + STREAM_LOGIT_SCALE_RTOL * eager.abs().max().item()
    assert_logits_close(compiled, eager, atol=atol)
    assert_same_greedy(compiled[None], eager[None], margin=2 * atol)


@torch.inference_mode()
def eager_decode_step(rt: Runtime, seqs) -> torch.Tensor:
    step = rt.build_step(seqs, [1] * len(seqs), is_prefill=False)
    return rt.model.compute_logits(rt.model(step))


def graph_stats() -> tuple[int, int]:
    counters = torch._dynamo.utils.counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def draw_sampling_inputs(data, rows: int, vocab: int) -> SamplingInputs:
    """Per-row ce::sample parameters for ``rows`` rows, drawn with hypothesis's ``data``: greedy rows among sampled
    ones, top-k off, inside and past the vocabulary, top-p and min-p on and off, any seed and counter."""
    drawn = [data.draw(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.7]), st.integers(0, vocab + 2),
                                 st.sampled_from([1.0, 0.9, 0.3]), st.sampled_from([0.0, 0.05]),
                                 st.integers(0, 2**62), st.integers(0, 1000)), label="row params")
             for _ in range(rows)]
    temperature, top_k, top_p, min_p, seeds, counters = zip(*drawn)
    return SamplingInputs(
        temperature=torch.tensor(temperature, dtype=torch.float32), top_k=torch.tensor(top_k),
        top_p=torch.tensor(top_p, dtype=torch.float32), min_p=torch.tensor(min_p, dtype=torch.float32),
        seeds=torch.tensor(seeds), counters=torch.tensor(counters),
    )


def reference_draw(logits: torch.Tensor, sampling: SamplingInputs) -> torch.Tensor:
    """ce::sample's CPU reference draw (ops/sample.py) from ``logits`` with ``sampling``'s parameters."""
    return sample_reference(logits.cpu(), *(getattr(sampling, f.name) for f in dataclasses.fields(sampling)))

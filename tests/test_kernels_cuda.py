"""Every CUDA kernel of the ``ce`` ops against its reference, on a GPU (skipped without one).

The CUDA side goes through the registered op (``torch.ops.ce.*`` on CUDA tensors, i.e. the Triton/FLA kernels);
the reference is the op's plain-torch reference function, run on a clone of the same inputs (on the GPU for
speed; the references compute in fp32 whatever the input dtype, as they do on the CPU). Shapes follow the
Qwen3.5-0.8B layout (linear: Hk = Hv = 16, K = V = 128; attention: Hq = 8, Hkv = 2, D = 256) plus layouts with
Hv = 2-3 x Hk and head dim 128, random slot permutations, and padding lanes (null slot 0 / block 0, context 0).
bf16 activations with an fp32 (or bf16) state pool, and fp32 throughout with tight tolerances.

``ce::linear`` is checked against a float64 matmul on the model's weight shapes; it runs our skinny GEMM up to
``SKINNY_MAX_ROWS`` rows of bf16/fp16 and cuBLAS otherwise.

Padding lanes all point at the null slot/block and race with each other there by design, so comparisons leave out
slot 0 / block 0 and the padding lanes' outputs (except decode attention, whose padding lanes must be zeros).

On a fresh machine the time goes to compiles: each new (shape constants, dtype) of a kernel is a Triton compile, and
each new (layout, dtype) of FLA's chunked prefill a cold autotune sweep of its kernels (most of a minute). So the
parametrised tests choose their compiled variants (bf16 on the model's shapes; fp32, the compile tests' dtype, in
one case) and let hypothesis draw sizes and contents, and the tests that still draw layouts and dtypes keep few
examples. ``pytest -m "gpu and quick"`` runs one reference check of every op's CUDA kernel (the ``quick`` cases).
"""

from __future__ import annotations

import contextlib
import functools
import os

import pytest
import torch
import torch.nn.functional as F

import ops
from ops import (
    activation, attention_decode, attention_prologue, conv1d, delta_rule, gated_deltanet_decode, gated_deltanet_verify,
    kv_cache, layouts, norm, paged_attention, penalties, sample,
)
from ops.linear import SKINNY_MAX_ROWS
from ops.triton import gemv_kernels, sample_kernels
from tests import hf_models

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEV = "cuda"
ATTN_LAYOUTS = [(8, 2, 256), (16, 2, 128), (12, 4, 128)]  # (Hq, Hkv, D): Qwen3.5-0.8B, D=128 GQA 8, GQA 3
LINEAR_LAYOUTS = [(16, 16, 128, 128), (16, 32, 128, 128), (4, 12, 128, 128)]  # (Hk, Hv, K, V): r = 1, 2, 3
# The tiny test models' linear-attention layout (Hv = 2 Hk, K != V): the fp32 FLA prefill case uses it, so that it
# meets the FLA autotune key the compile tests' fp32 model prefills with, and the suite tunes fp32 once.
TINY_LINEAR_LAYOUT = (hf_models.LINEAR_KEY_HEADS, hf_models.LINEAR_VALUE_HEADS, hf_models.LINEAR_KEY_DIM,
                      hf_models.LINEAR_VALUE_DIM)
CONV_WIDTH = 4

# CE_NO_SHRINK=1 reports the first failing example without shrinking it: on a lent GPU with a time limit, one
# failure report beats a minimal one that arrives after the limit.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate) if os.environ.get("CE_NO_SHRINK") else tuple(Phase)

# bf16: one rounding of a bf16 output (2**-8 relative) plus bf16 operands inside the attention dots.
TOL = {torch.bfloat16: dict(atol=2e-2, rtol=2e-2), torch.float32: dict(atol=2e-4, rtol=2e-4)}
# Attention over thousands of random keys averages values of std 1 down to outputs of std ~0.05-0.03, near TOL's
# bf16 atol: a split dropped (1/16 of the keys) moves an element by about that atol but the output by ~25% of its
# norm, which this bound catches (bf16's own roundings: ~2e-3 of the norm over 1,000 keys).
ATTENTION_REL_NORM = {torch.bfloat16: 2e-2, torch.float32: 1e-3}


def _assert_attention_close(got, want, dtype):
    """Elementwise within TOL, and the whole output within ATTENTION_REL_NORM of the reference's norm."""
    torch.testing.assert_close(got, want, **TOL[dtype])
    _assert_close_relative(got, want, max_abs=float("inf"), max_rel_norm=ATTENTION_REL_NORM[dtype],
                           what="attention output")


QUICK = pytest.mark.quick  # one small case per op: pytest -m "gpu and quick"


def _case_id(value) -> str:
    if isinstance(value, tuple):  # a layout: 8x2x256
        return "x".join(map(str, value))
    return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}.get(value, str(value))


def cases(combos, quick=()) -> list:
    """``pytest.param`` of each tuple of ``combos``, its id the values joined by '-', marked quick if in ``quick``."""
    return [pytest.param(*c, id="-".join(map(_case_id, c)), marks=QUICK if c in quick else ()) for c in combos]


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


def _randn(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen, device=DEV) * scale).to(dtype)


def _live_slots(gen, count: int, num_slots: int) -> torch.Tensor:
    """``count`` distinct live slots (never the null slot 0), in random order."""
    return (torch.randperm(num_slots - 1, generator=gen, device=DEV)[:count] + 1).to(torch.int32)


def _paged_layout(gen, context_lens: list[int], block_size: int, extra_columns: int):
    """KV caches' block count and block tables over a random permutation of blocks 1.. (0 = null block)."""
    counts = [(c + block_size - 1) // block_size for c in context_lens]
    num_blocks = 1 + sum(counts) + 1
    perm = (torch.randperm(num_blocks - 1, generator=gen, device=DEV) + 1).to(torch.int32)
    width = max(counts + [1]) + extra_columns
    tables = torch.zeros(len(context_lens), width, dtype=torch.int32, device=DEV)
    used = 0
    for i, n in enumerate(counts):
        tables[i, :n] = perm[used : used + n]
        used += n
    return num_blocks, tables


# ----------------------------------------------------------------------------------------------------------------
# KV store
# ----------------------------------------------------------------------------------------------------------------


@given(
    num_tokens=st.integers(1, 256),
    layout=st.sampled_from(ATTN_LAYOUTS),
    block_size=st.sampled_from([16, 32]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    padding=st.integers(0, 8),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=6, deadline=None, phases=PHASES)
def test_store_kv_matches_reference(num_tokens, layout, block_size, dtype, padding, seed):
    gen = _seeded(seed)
    _, hkv, d = layout
    num_blocks = 2 + (num_tokens + padding) // block_size * 2
    k_cache = _randn(gen, num_blocks, block_size, hkv, d, dtype=dtype)
    v_cache = _randn(gen, num_blocks, block_size, hkv, d, dtype=dtype)
    live = torch.randperm((num_blocks - 1) * block_size, generator=gen, device=DEV)[:num_tokens] + block_size
    rows = torch.cat([live, torch.randint(0, block_size, (padding,), generator=gen, device=DEV)])  # pads: block 0
    key = _randn(gen, rows.shape[0], hkv, d, dtype=dtype)
    value = _randn(gen, rows.shape[0], hkv, d, dtype=dtype)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    kv_cache.store_kv_reference(key, value, want_k, want_v, rows)
    torch.ops.ce.store_kv(key, value, k_cache, v_cache, rows)
    # exact: pure data movement (block 0 is left out: duplicate padding rows race there)
    torch.testing.assert_close(k_cache[1:], want_k[1:], atol=0, rtol=0)
    torch.testing.assert_close(v_cache[1:], want_v[1:], atol=0, rtol=0)


# ----------------------------------------------------------------------------------------------------------------
# Paged attention
# ----------------------------------------------------------------------------------------------------------------


@given(
    batch=st.integers(1, 256),
    max_context=st.integers(1, 4096),
    layout=st.sampled_from(ATTN_LAYOUTS),
    block_size=st.sampled_from([16, 16, 32]),
    dtype=st.sampled_from([torch.bfloat16, torch.bfloat16, torch.float32]),
    padding_fraction=st.sampled_from([0.0, 0.25]),
    extra_columns=st.integers(0, 64),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=6, deadline=None, phases=PHASES)  # nearly every example compiles a split and a reduce variant
def test_paged_attention_decode_matches_reference(
    batch, max_context, layout, block_size, dtype, padding_fraction, extra_columns, seed
):
    gen = _seeded(seed)
    hq, hkv, d = layout
    lens = torch.randint(1, max_context + 1, (batch,), generator=gen, device=DEV)
    lens[torch.rand(batch, generator=gen, device=DEV) < padding_fraction] = 0  # padding lanes
    context_lens = lens.tolist()
    num_blocks, tables = _paged_layout(gen, context_lens, block_size, extra_columns)
    k_cache = _randn(gen, num_blocks, block_size, hkv, d, dtype=dtype)
    v_cache = _randn(gen, num_blocks, block_size, hkv, d, dtype=dtype)
    q = _randn(gen, batch, hq, d, dtype=dtype)
    lens = lens.to(torch.int32)
    scale = d**-0.5
    want = paged_attention.paged_attention_decode_reference(q, k_cache, v_cache, tables, lens, scale)
    got = torch.ops.ce.paged_attention_decode(q, k_cache, v_cache, tables, lens, scale)
    _assert_attention_close(got, want, dtype)
    assert torch.all(got[lens == 0] == 0), "padding lanes (context 0) must be zeros"


# The prefill kernel's compiled variants, (Hq, Hkv, D), block size, dtype: the model's (the quick case), then head
# dim 128 with GQA 8 and 3, 32-token blocks and fp32 (the dtype of the compile tests' model).
PAGED_PREFILL_VARIANTS = cases(
    [(ATTN_LAYOUTS[0], 16, torch.bfloat16), (ATTN_LAYOUTS[1], 32, torch.float32),
     (ATTN_LAYOUTS[2], 32, torch.bfloat16)],
    quick=[(ATTN_LAYOUTS[0], 16, torch.bfloat16)],
)


@pytest.mark.parametrize("layout, block_size, dtype", PAGED_PREFILL_VARIANTS)
@given(
    num_seqs=st.integers(1, 12),
    max_new=st.integers(1, 300),
    max_prefix=st.sampled_from([0, 64, 1000]),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=3, deadline=None, phases=PHASES)
def test_paged_attention_prefill_matches_reference(layout, block_size, dtype, num_seqs, max_new, max_prefix, seed):
    gen = _seeded(seed)
    hq, hkv, d = layout
    q_lens = torch.randint(1, max_new + 1, (num_seqs,), generator=gen, device=DEV)
    if num_seqs > 2:
        q_lens[1] = 0  # a sequence with no new tokens this step
    prefixes = torch.randint(0, max_prefix + 1, (num_seqs,), generator=gen, device=DEV)
    context_lens = (q_lens + prefixes).tolist()
    num_blocks, tables = _paged_layout(gen, context_lens, block_size, 2)
    k_cache = _randn(gen, num_blocks, block_size, hkv, d, dtype=dtype)
    v_cache = _randn(gen, num_blocks, block_size, hkv, d, dtype=dtype)
    cu = torch.zeros(num_seqs + 1, dtype=torch.int32, device=DEV)
    cu[1:] = q_lens.cumsum(0)
    q = _randn(gen, int(cu[-1]), hq, d, dtype=dtype)
    lens = torch.tensor(context_lens, dtype=torch.int32, device=DEV)
    scale = d**-0.5
    want = paged_attention.paged_attention_prefill_reference(q, k_cache, v_cache, cu, lens, tables, scale)
    got = torch.ops.ce.paged_attention_prefill(q, k_cache, v_cache, cu, lens, tables, scale)
    _assert_attention_close(got, want, dtype)


@pytest.mark.parametrize("by_rows", cases([(True,), (False,), (None,)], quick=[(True,), (False,)]))
@given(
    num_seqs=st.integers(1, 8),
    rows=st.integers(1, 5),
    max_prefix=st.sampled_from([0, 64, 1000]),
    gated=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=3, deadline=None, phases=PHASES)
def test_paged_attention_verify_matches_reference(by_rows, num_seqs, rows, max_prefix, gated, seed):
    """A verify step (``rows`` rows a sequence after its prefix) down either kernel (None: verify_by_rows' pick) at
    the model's attention shape, against the reference (the prefill op's, on those lengths); ``gated``: with the
    attention layer's output gate (a strided view of its projection's rows) applied by the kernels."""
    from ops.triton import paged_attention_kernels

    gen = _seeded(seed)
    hq, hkv, d = ATTN_LAYOUTS[0]
    context_lens = (torch.randint(0, max_prefix + 1, (num_seqs,), generator=gen, device=DEV) + rows).tolist()
    num_blocks, tables = _paged_layout(gen, context_lens, 16, 2)
    k_cache = _randn(gen, num_blocks, 16, hkv, d, dtype=torch.bfloat16)
    v_cache = _randn(gen, num_blocks, 16, hkv, d, dtype=torch.bfloat16)
    q = _randn(gen, num_seqs * rows, hq, d, dtype=torch.bfloat16)
    gate = _randn(gen, num_seqs * rows, hq, 2 * d, dtype=torch.bfloat16)[..., d:] if gated else None
    lens = torch.tensor(context_lens, dtype=torch.int32, device=DEV)
    want = paged_attention.paged_attention_verify_reference(q, k_cache, v_cache, lens, tables, rows, d**-0.5, gate)
    got = paged_attention_kernels.paged_attention_verify(q, k_cache, v_cache, lens, tables, rows, d**-0.5, gate,
                                                         by_rows=by_rows)
    _assert_attention_close(got, want, torch.bfloat16)


# ----------------------------------------------------------------------------------------------------------------
# Fused attention decode (q/k norm + RoPE + KV store + paged attention + output gate)
# ----------------------------------------------------------------------------------------------------------------

ROTARY_DIM, ROPE_THETA = 64, 1e7  # Qwen3.5-0.8B: partial_rotary_factor 0.25 of head_dim 256


def _attention_decode_args(gen, layout, tables, lens, block_size, num_blocks, dtype, position_offset=0):
    """The op's arguments: projected rows (a slice of wider rows), norm weights, inv_freq, positions, caches, the slot
    of each new token (position context_len - 1; the null row for padding lanes; none without ``tables``), tables,
    lens, heads, scale."""
    hq, hkv, d = layout
    width = sum(layouts.attention_decode_split_sizes(hq, hkv, d))
    projected = _randn(gen, lens.shape[0], width + 16, dtype=dtype, scale=2.0)[:, 8 : 8 + width]
    q_weight, k_weight = _randn(gen, d, dtype=dtype, scale=0.5), _randn(gen, d, dtype=dtype, scale=0.5)
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, ROTARY_DIM, 2, device=DEV, dtype=torch.float32) / ROTARY_DIM)
    k_cache = _randn(gen, num_blocks, block_size, hkv, d, dtype=dtype)
    v_cache = _randn(gen, num_blocks, block_size, hkv, d, dtype=dtype)
    pos = (lens - 1).clamp_min(0).long()
    slots = None if tables is None else _decode_slots(tables, lens, block_size)
    return [projected, q_weight, k_weight, 1e-6, inv_freq, pos + position_offset, k_cache, v_cache, slots, tables,
            lens, hq, hkv, d, d**-0.5]


def _decode_slots(tables, lens, block_size):
    pos = (lens - 1).clamp_min(0).long()
    rows = tables.gather(1, (pos // block_size)[:, None])[:, 0].long() * block_size + pos % block_size
    return torch.where(lens > 0, rows, 0)


def _assert_attention_decode_close(got, want, k_cache, want_k, v_cache, want_v, lens, dtype):
    """Outputs of live lanes, zeros for padding lanes; caches but the null block: v is a copy (exact), k normalised
    and rotated (a bf16 product may round a tie the other way: one ulp)."""
    live = lens > 0
    _assert_attention_close(got[live], want[live], dtype)
    assert torch.all(got[~live] == 0), "padding lanes (context 0) must be zeros"
    torch.testing.assert_close(k_cache[1:], want_k[1:], **TOL[dtype])
    torch.testing.assert_close(v_cache[1:], want_v[1:], atol=0, rtol=0)


@given(
    # 160 x 2 KV heads fill an H200 twice: the one-split path; 1 and 4 read the first key tile before the PDL wait
    batch=st.sampled_from([1, 4, 8, 64, 160]),
    max_context=st.integers(1, 1000),
    dtype=st.sampled_from([torch.bfloat16, torch.bfloat16, torch.float32]),
    padding_fraction=st.sampled_from([0.0, 0.25]),
    far_positions=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=6, deadline=None, phases=PHASES)  # nearly every example compiles a variant (split count, dtype)
def test_attention_decode_matches_reference(batch, max_context, dtype, padding_fraction, far_positions, seed):
    """Qwen3.5-0.8B's attention shapes (Hq 8, Hkv 2, D 256, rotary_dim 64, theta 1e7, block_size 16) against the
    reference. ``far_positions``: rotary positions up to 2**18 past the context (the op reads them as given), so
    cos/sin of angles up to ~2.6e5 rad are checked against torch's. Contexts past 64 tokens split (up to 16 splits):
    the reduce kernel merges them."""
    gen = _seeded(seed)
    block_size = 16
    lens = torch.randint(1, max_context + 1, (batch,), generator=gen, device=DEV)
    lens[torch.rand(batch, generator=gen, device=DEV) < padding_fraction] = 0  # padding lanes
    lens = lens.to(torch.int32)
    num_blocks, tables = _paged_layout(gen, lens.tolist(), block_size, 2)
    offset = torch.randint(0, 2**18, (batch,), generator=gen, device=DEV) if far_positions else 0
    args = _attention_decode_args(gen, ATTN_LAYOUTS[0], tables, lens, block_size, num_blocks, dtype, offset)
    want_k, want_v = args[6].clone(), args[7].clone()
    want = attention_decode.attention_decode_reference(*args[:6], want_k, want_v, *args[8:])
    got = torch.ops.ce.attention_decode(*args)
    assert got.shape == (batch, 8 * 256) and got.dtype == dtype and got.is_contiguous()
    _assert_attention_decode_close(got, want, args[6], want_k, args[7], want_v, lens, dtype)


@QUICK
@given(tokens=st.integers(1, 600), dtype=st.sampled_from([torch.bfloat16, torch.float32]),
       seed=st.integers(0, 2**31 - 1))
@settings(max_examples=3, deadline=None, phases=PHASES)
def test_attention_prologue_matches_reference(tokens, dtype, seed):
    """Qwen3.5-0.8B's attention shapes: a prompt's tokens at positions up to 2**18 and random cache rows, against the
    reference: q, and the caches (v a copy: exact; k normalised and rotated: a bf16 tie may round either way)."""
    gen = _seeded(seed)
    hq, hkv, d = ATTN_LAYOUTS[0]
    block_size, num_blocks = 16, tokens // 16 + 3
    lens = torch.full((tokens,), 1, dtype=torch.int32, device=DEV)
    args = _attention_decode_args(gen, ATTN_LAYOUTS[0], None, lens, block_size, num_blocks, dtype)
    positions = torch.randint(0, 2**18, (tokens,), generator=gen, device=DEV)
    slots = torch.randperm((num_blocks - 1) * block_size, generator=gen, device=DEV)[:tokens] + block_size
    call = (args[0], args[1], args[2], 1e-6, args[4], positions)
    want_k, want_v = args[6].clone(), args[7].clone()
    want = attention_prologue.attention_prologue_reference(*call, want_k, want_v, slots, hq, hkv, d)
    got = torch.ops.ce.attention_prologue(*call, args[6], args[7], slots, hq, hkv, d)
    assert got.shape == (tokens, hq, d) and got.is_contiguous()
    torch.testing.assert_close(got, want, **TOL[dtype])
    torch.testing.assert_close(args[6], want_k, **TOL[dtype])
    torch.testing.assert_close(args[7], want_v, atol=0, rtol=0)


@QUICK
def test_attention_decode_replays_in_cuda_graph_with_new_inputs():
    """Captured once (the split kernel and the reduce kernel, launched with PDL), replayed with new projected rows,
    contexts up to 1,024 (padding lanes included), positions and slots: each replay equals the reference run on clones
    of the caches. The split count comes from static shapes, so contexts longer than the captured ones are still
    right."""
    gen = _seeded(13)
    batch, block_size, max_blocks = 8, 16, 64
    bf16 = torch.bfloat16
    tables = (torch.arange(batch * max_blocks, device=DEV, dtype=torch.int32) + 1).view(batch, max_blocks)
    lens = torch.full((batch,), 3, dtype=torch.int32, device=DEV)
    args = _attention_decode_args(gen, ATTN_LAYOUTS[0], tables, lens, block_size, batch * max_blocks + 1, bf16)
    projected, positions, k_cache, v_cache, slots = args[0], args[5], args[6], args[7], args[8]

    torch.ops.ce.attention_decode(*args)  # compile the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ce.attention_decode(*args)
    for context in ([1000, 1, 0, 517, 1024, 33, 250, 999], [5, 700, 64, 1, 0, 1023, 16, 17]):
        new_lens = torch.tensor(context, dtype=torch.int32, device=DEV)
        new_rows = _randn(gen, batch, projected.shape[1], dtype=bf16, scale=2.0)
        new_positions = (new_lens - 1).clamp_min(0).long()
        new_slots = _decode_slots(tables, new_lens, block_size)
        want_k, want_v = k_cache.clone(), v_cache.clone()
        want = attention_decode.attention_decode_reference(new_rows, *args[1:5], new_positions, want_k, want_v,
                                                           new_slots, tables, new_lens, *args[11:])
        projected.copy_(new_rows)
        positions.copy_(new_positions)
        slots.copy_(new_slots)
        lens.copy_(new_lens)
        graph.replay()
        _assert_attention_decode_close(out, want, k_cache, want_k, v_cache, want_v, new_lens, bf16)


def test_attention_decode_split_merge_launches():
    """With the context split (batch 1, up to 1,024 tokens: 16 splits) ce::attention_decode is two launches, the
    split kernel and the reduce kernel, and no memset or fill; the result equals the reference, called twice in a
    row."""
    from ops.triton import attention_decode_kernels
    from ops.triton.paged_attention_kernels import decode_num_splits

    gen = _seeded(17)
    batch, block_size, max_blocks = 1, 16, 64
    tables = (torch.arange(batch * max_blocks, device=DEV, dtype=torch.int32) + 1).view(batch, max_blocks)
    lens = torch.tensor([900], dtype=torch.int32, device=DEV)
    args = _attention_decode_args(gen, ATTN_LAYOUTS[0], tables, lens, block_size, batch * max_blocks + 1,
                                  torch.bfloat16)
    assert decode_num_splits(batch, ATTN_LAYOUTS[0][1], max_blocks, block_size, lens.device) > 1

    def call():
        return attention_decode_kernels.attention_decode(*args)

    call()  # compile outside the profiled region
    torch.cuda.synchronize()
    for _ in range(2):
        want_k, want_v = args[6].clone(), args[7].clone()
        want = attention_decode.attention_decode_reference(*args[:6], want_k, want_v, *args[8:])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            got = call()
            torch.cuda.synchronize()
        kernels = [event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]
        assert sum("_attention_decode_kernel" in name for name in kernels) == 1, kernels
        assert sum("_paged_decode_reduce_kernel" in name for name in kernels) == 1, kernels
        assert not any("memset" in name.lower() or "fill" in name.lower() for name in kernels), kernels
        _assert_attention_decode_close(got, want, args[6], want_k, args[7], want_v, lens, torch.bfloat16)


@pytest.mark.parametrize("context", [1, 500, 8192, 8193, 8704, 9216])
def test_attention_decode_at_the_split_ceiling_matches_reference(context):
    """Batch 1 over a 9,216-token table (c1's engine) at ``MAX_SPLITS`` splits, the rule's count there on an H100 or
    H200: at 8,192 cached tokens or fewer each split takes at most one 64-token tile, past it two, and at short
    contexts nearly every split is empty (the reduce skips their accumulators). Against the reference, with the op's
    own split count as well."""
    from ops.triton import attention_decode_kernels
    from ops.triton.paged_attention_kernels import MAX_SPLITS

    gen = _seeded(context)
    block_size, max_blocks = 16, 9216 // 16
    tables = (torch.randperm(max_blocks, generator=gen, device=DEV) + 1).to(torch.int32).view(1, max_blocks)
    lens = torch.tensor([context], dtype=torch.int32, device=DEV)
    args = _attention_decode_args(gen, ATTN_LAYOUTS[0], tables, lens, block_size, max_blocks + 1, torch.bfloat16)
    for launch in (functools.partial(attention_decode_kernels.attention_decode, num_splits=MAX_SPLITS),
                   torch.ops.ce.attention_decode):
        want_k, want_v = args[6].clone(), args[7].clone()
        want = attention_decode.attention_decode_reference(*args[:6], want_k, want_v, *args[8:])
        got = launch(*args)
        _assert_attention_decode_close(got, want, args[6], want_k, args[7], want_v, lens, torch.bfloat16)


# ----------------------------------------------------------------------------------------------------------------
# Causal conv1d
# ----------------------------------------------------------------------------------------------------------------


@given(
    batch=st.integers(1, 256),
    channels=st.sampled_from([6144, 96, 200]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    padding=st.integers(0, 4),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=6, deadline=None, phases=PHASES)
def test_causal_conv1d_decode_matches_reference(batch, channels, dtype, padding, seed):
    gen = _seeded(seed)
    num_slots = batch + 3
    slots = torch.cat([_live_slots(gen, batch, num_slots), torch.zeros(padding, dtype=torch.int32, device=DEV)])
    x = _randn(gen, batch + padding, channels, dtype=dtype)
    weight = _randn(gen, channels, CONV_WIDTH, dtype=dtype, scale=0.5)
    state = _randn(gen, num_slots, channels, CONV_WIDTH - 1, dtype=dtype)
    want_state = state.clone()
    want = conv1d.causal_conv1d_decode_reference(x, weight, want_state, slots)
    got = torch.ops.ce.causal_conv1d_decode(x, weight, state, slots)
    torch.testing.assert_close(got[:batch], want[:batch], **TOL[dtype])
    torch.testing.assert_close(state[1:], want_state[1:], atol=0, rtol=0)  # the state is a shifted copy: exact


# Compiled variants, (sections, dtype): Qwen3.5-0.8B's q|k|v channels in bf16 (the quick case), then Qwen3-Next's
# wider v, and sections no multiple of 16 (small channel blocks, a section boundary inside what would be one block) in
# fp32.
@pytest.mark.parametrize("sections, dtype", cases([((2048, 2048, 2048), torch.bfloat16),
                                                   ((2048, 2048, 4096), torch.bfloat16), ((40, 40, 120), torch.float32)],
                                                  quick=[((2048, 2048, 2048), torch.bfloat16)]))
@given(num_seqs=st.integers(1, 16), max_len=st.integers(1, 300), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=3, deadline=None, phases=PHASES)
def test_causal_conv1d_prefill_matches_reference(sections, dtype, num_seqs, max_len, seed):
    gen = _seeded(seed)
    channels = sum(sections)
    num_slots = num_seqs + 3
    slots = _live_slots(gen, num_seqs, num_slots)
    seq_lens = torch.randint(1, max_len + 1, (num_seqs,), generator=gen, device=DEV)  # >= 1: see the reference
    cu = torch.zeros(num_seqs + 1, dtype=torch.int32, device=DEV)
    cu[1:] = seq_lens.cumsum(0)
    x = _randn(gen, int(cu[-1]), channels, dtype=dtype)
    weight = _randn(gen, channels, CONV_WIDTH, dtype=dtype, scale=0.5)
    state = _randn(gen, num_slots, channels, CONV_WIDTH - 1, dtype=dtype)
    want_state = state.clone()
    want = conv1d.causal_conv1d_prefill_reference(x, weight, want_state, cu, slots, sections)
    got = torch.ops.ce.causal_conv1d_prefill(x, weight, state, cu, slots, sections)
    assert all(part.is_contiguous() for part in got)
    torch.testing.assert_close(got, want, **TOL[dtype])
    torch.testing.assert_close(state, want_state, atol=0, rtol=0)


# ----------------------------------------------------------------------------------------------------------------
# Gated delta rule
# ----------------------------------------------------------------------------------------------------------------


def _gdr_inputs(gen, tokens, layout, dtype):
    hk, hv, dk, dv = layout
    q = _randn(gen, tokens, hk, dk, dtype=dtype)
    k = _randn(gen, tokens, hk, dk, dtype=dtype)
    v = _randn(gen, tokens, hv, dv, dtype=dtype)
    a = _randn(gen, tokens, hv, dtype=dtype, scale=2.0)
    b = _randn(gen, tokens, hv, dtype=dtype, scale=2.0)
    A_log = _randn(gen, hv, scale=0.5)  # fp32 parameters, as in the checkpoints
    dt_bias = _randn(gen, hv)
    return q, k, v, a, b, A_log, dt_bias


@given(
    batch=st.integers(1, 256),
    layout=st.sampled_from(LINEAR_LAYOUTS),
    dtype=st.sampled_from([torch.bfloat16, torch.bfloat16, torch.float32]),
    state_dtype=st.sampled_from([torch.float32, torch.float32, torch.bfloat16]),
    padding=st.integers(0, 4),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=6, deadline=None, phases=PHASES)  # up to 12 compiled variants (layout x dtype x pool dtype)
def test_gated_delta_rule_decode_matches_reference(batch, layout, dtype, state_dtype, padding, seed):
    gen = _seeded(seed)
    hk, hv, dk, dv = layout
    num_slots = batch + 2
    slots = torch.cat([_live_slots(gen, batch, num_slots), torch.zeros(padding, dtype=torch.int32, device=DEV)])
    q, k, v, a, b, A_log, dt_bias = _gdr_inputs(gen, batch + padding, layout, dtype)
    state = _randn(gen, num_slots, hv, dk, dv, dtype=state_dtype, scale=0.3)
    want_state = state.clone()
    want = delta_rule.gated_delta_rule_decode_reference(q, k, v, a, b, A_log, dt_bias, want_state, slots)
    got = torch.ops.ce.gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, state, slots)
    torch.testing.assert_close(got, want, **TOL[dtype])  # padding lanes too: from a zero state
    # fp32 state math in both; a bf16 pool may round a tie the other way (one bf16 ulp)
    state_tol = dict(atol=1e-4, rtol=1e-4) if state_dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(state[1:], want_state[1:], **state_tol)
    assert torch.equal(state[0], want_state[0]), "a padding lane wrote the null slot's state"


@given(batch=st.integers(1, 256), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=3, deadline=None, phases=PHASES)
def test_gated_delta_rule_decode_matches_fla_fused_recurrent(batch, seed):
    """FLA's recurrent kernel as an independent oracle, on the layout with Hv = 2 Hk (the head mapping is where the
    two could differ; every layout is checked against our reference above): one FLA compile."""
    fla_recurrent = pytest.importorskip("fla.ops.gated_delta_rule").fused_recurrent_gated_delta_rule
    layout = LINEAR_LAYOUTS[1]
    gen = _seeded(seed)
    num_slots = batch + 2
    slots = _live_slots(gen, batch, num_slots)
    q, k, v, a, b, A_log, dt_bias = _gdr_inputs(gen, batch, layout, torch.bfloat16)
    state = _randn(gen, num_slots, layout[1], layout[2], layout[3], scale=0.3)
    initial = state[slots.long()].clone()
    got = torch.ops.ce.gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, state, slots)
    g = -A_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias)
    beta = b.float().sigmoid()
    # FLA, one token per sequence: [B, 1, H, *] with the gathered states.
    want, want_final = fla_recurrent(
        q[:, None], k[:, None], v[:, None], g=g[:, None], beta=beta[:, None], scale=layout[2] ** -0.5,
        initial_state=initial, output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    torch.testing.assert_close(got, want[:, 0], **TOL[torch.bfloat16])
    torch.testing.assert_close(state[slots.long()], want_final.float(), atol=1e-3, rtol=1e-3)


def _assert_close_relative(got, want, *, max_abs, max_rel_norm, what):
    """Elementwise bound plus a Frobenius-norm bound: the second catches a small systematic error everywhere."""
    got, want = got.float(), want.float()
    err = (got - want).abs().max().item()
    rel = ((got - want).norm() / want.norm().clamp_min(1e-12)).item()
    assert err <= max_abs and rel <= max_rel_norm, f"{what}: max abs err {err:.3e}, relative norm err {rel:.3e}"


# ----------------------------------------------------------------------------------------------------------------
# Fused Gated DeltaNet decode (conv + delta rule + gated norm)
# ----------------------------------------------------------------------------------------------------------------


def _gated_deltanet_inputs(gen, rows, layout, dtype, state_dtype, num_slots, strided):
    """projected rows ([q | k | v | z | b | a], a slice of wider rows when ``strided``), weights and both pools."""
    hk, hv, dk, dv = layout
    sizes = layouts.gated_deltanet_split_sizes(hk, dk, hv, dv)
    channels, width = sum(sizes[:3]), sum(sizes)
    wide = _randn(gen, rows, width + 24, dtype=dtype)
    projected = wide[:, 8 : 8 + width] if strided else wide[:, :width].contiguous()
    projected[:, -2 * hv :] *= 2  # b and a, scaled as in _gdr_inputs
    conv_weight = _randn(gen, channels, CONV_WIDTH, dtype=dtype, scale=0.5)
    conv_state = _randn(gen, num_slots, channels, CONV_WIDTH - 1, dtype=dtype)
    A_log, dt_bias = _randn(gen, hv, scale=0.5), _randn(gen, hv)  # fp32 parameters, as in the checkpoints
    norm_weight = (_randn(gen, dv, scale=0.5) + 1.0).to(dtype)
    rec_state = _randn(gen, num_slots, hv, dk, dv, dtype=state_dtype, scale=0.3)
    return projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state


def _gated_deltanet_lanes(gen, layout, batch):
    """``batch`` live rows on random slots and two padding lanes on the null slot: (slots, the op's inputs) with
    strided bf16 projected rows and an fp32 state pool."""
    num_slots = batch + 2
    slots = torch.cat([_live_slots(gen, batch, num_slots), torch.zeros(2, dtype=torch.int32, device=DEV)])
    return slots, _gated_deltanet_inputs(gen, batch + 2, layout, torch.bfloat16, torch.float32, num_slots, True)


def _assert_gated_deltanet_states_close(conv_state, want_conv, rec_state, want_rec):
    """Pools but the null slot's conv history (padding lanes race on it). The conv state is a shifted copy: exact.
    The recurrent state: the kernel's and the reference's bf16 conv outputs may round a tie apart (fp32 sums in
    another order), moving a state column by ~1e-3; a bf16 pool may also round a tie the other way (one ulp)."""
    torch.testing.assert_close(conv_state[1:], want_conv[1:], atol=0, rtol=0)
    # Padding lanes neither read nor write a recurrent state: the null slot's is as it was, in both
    assert torch.equal(rec_state[0], want_rec[0]), "a padding lane wrote the null slot's recurrent state"
    fp32_pool = rec_state.dtype == torch.float32
    _assert_close_relative(rec_state[1:], want_rec[1:], max_abs=1e-2 if fp32_pool else 2e-2,
                           max_rel_norm=3e-4 if fp32_pool else 2e-3, what="recurrent state")


@given(
    batch=st.integers(1, 256),
    layout=st.sampled_from(LINEAR_LAYOUTS),
    dtype=st.sampled_from([torch.bfloat16, torch.bfloat16, torch.float32]),
    state_dtype=st.sampled_from([torch.float32, torch.float32, torch.bfloat16]),
    padding=st.integers(0, 4),
    strided=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=6, deadline=None, phases=PHASES)  # nearly every example compiles a variant of the fused kernel
def test_gated_deltanet_decode_matches_reference(batch, layout, dtype, state_dtype, padding, strided, seed):
    gen = _seeded(seed)
    hk, hv, dk, dv = layout
    num_slots = batch + 2
    slots = torch.cat([_live_slots(gen, batch, num_slots), torch.zeros(padding, dtype=torch.int32, device=DEV)])
    projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state = _gated_deltanet_inputs(
        gen, batch + padding, layout, dtype, state_dtype, num_slots, strided)
    want_conv, want_rec = conv_state.clone(), rec_state.clone()
    heads = (hk, dk, hv, dv, 1e-6)
    want = gated_deltanet_decode.gated_deltanet_decode_reference(
        projected, conv_weight, want_conv, A_log, dt_bias, norm_weight, want_rec, slots, *heads)
    got = torch.ops.ce.gated_deltanet_decode(
        projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state, slots, *heads)
    assert got.shape == (batch + padding, hv * dv) and got.dtype == dtype and got.is_contiguous()
    torch.testing.assert_close(got[:batch], want[:batch], **TOL[dtype])
    _assert_gated_deltanet_states_close(conv_state, want_conv, rec_state, want_rec)


@pytest.mark.parametrize("layout", LINEAR_LAYOUTS[:2], ids=_case_id)
def test_gated_deltanet_decode_past_the_fused_rule_matches_reference(layout):
    """300 sequences, past ``DECODE_LAUNCHES``'s last fused entry (256): the launcher's own pick, the unfused conv +
    delta rule + norm, against the reference (the property test reaches past 256 only with its padding lanes)."""
    from ops.triton import gated_deltanet_kernels

    batch = 300
    assert not gated_deltanet_kernels.decode_config(batch)[0], "300 sequences must be past the fused launches"
    hk, hv, dk, dv = layout
    slots, (projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state) = _gated_deltanet_lanes(
        _seeded(301), layout, batch)
    want_conv, want_rec = conv_state.clone(), rec_state.clone()
    heads = (hk, dk, hv, dv, 1e-6)
    want = gated_deltanet_decode.gated_deltanet_decode_reference(
        projected, conv_weight, want_conv, A_log, dt_bias, norm_weight, want_rec, slots, *heads)
    got = torch.ops.ce.gated_deltanet_decode(
        projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state, slots, *heads)
    torch.testing.assert_close(got[:batch], want[:batch], **TOL[torch.bfloat16])
    _assert_gated_deltanet_states_close(conv_state, want_conv, rec_state, want_rec)


@pytest.mark.parametrize("layout", LINEAR_LAYOUTS[:2], ids=_case_id)
@pytest.mark.parametrize("batch,block_v,warps,split_v", [(3, 32, 4, False), (16, 32, 4, False), (40, 64, 8, False),
                                                         (256, 32, 4, False), (1, 32, 4, True), (8, 32, 4, True)])
def test_gated_deltanet_decode_in_v_tiles_matches_reference(layout, batch, block_v, warps, split_v):
    """The fused kernel walking each value head's state in ``block_v``-wide tiles (the gated norm over the outputs
    parked in ``out``) with the warps the launch rule pairs with each tile, at small, mid and large batch (256, the
    rule's last fused batch; at 16 the rule's prefetch: each tile's loads before the previous tile's stores); and with
    the tiles over programs (``split_v``: the last program of each key head writes q and k's history and the gated
    norms) three steps in a row on the same pools, the per-key-head counts left at zero: against the reference."""
    from ops.triton import gated_deltanet_kernels

    hk, hv, dk, dv = layout
    slots, (projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state) = _gated_deltanet_lanes(
        _seeded(batch * 7 + block_v + split_v), layout, batch)
    want_conv, want_rec = conv_state.clone(), rec_state.clone()
    heads = (hk, dk, hv, dv, 1e-6)
    for _ in range(3 if split_v else 1):
        want = gated_deltanet_decode.gated_deltanet_decode_reference(
            projected, conv_weight, want_conv, A_log, dt_bias, norm_weight, want_rec, slots, *heads)
        got = gated_deltanet_kernels.gated_deltanet_decode(
            projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state, slots, *heads,
            num_warps=warps, fused=True, block_v=block_v, split_v=split_v)
        torch.testing.assert_close(got[:batch], want[:batch], **TOL[torch.bfloat16])
        _assert_gated_deltanet_states_close(conv_state, want_conv, rec_state, want_rec)
    if split_v:  # the launch made its counts (else this check would make them) and left them at zero
        assert int(gated_deltanet_kernels._counters[projected.device].abs().sum()) == 0


@QUICK
@pytest.mark.parametrize("batch", [3, 8])
def test_gated_deltanet_decode_replays_in_cuda_graph_with_new_inputs(batch):
    """Captured once, replayed with new projected rows and new slots (padding lanes on the second replay): each
    replay equals the reference run on clones of the pools. Hv = 2 Hk, strided projected rows. At 3 sequences the
    rule's launch splits each head's V tiles over programs (its per-head counts must be back at zero after every
    replay for the next one to pick its last program), at 8 it runs whole heads."""
    from ops.triton import gated_deltanet_kernels

    gen = _seeded(12 + batch)
    layout = LINEAR_LAYOUTS[1]
    hk, hv, dk, dv = layout
    num_slots = 2 * batch + 1
    projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state = _gated_deltanet_inputs(
        gen, batch, layout, torch.bfloat16, torch.float32, num_slots, strided=True)
    slots = _live_slots(gen, batch, num_slots)
    heads = (hk, dk, hv, dv, 1e-6)

    def step():
        return torch.ops.ce.gated_deltanet_decode(
            projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state, slots, *heads)

    assert gated_deltanet_kernels.decode_config(batch)[4] == (batch <= 4) and dv > 32, "the rule's launch changed"
    step()  # compile the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for padding in (0, 3):
        live = batch - padding
        new_slots = torch.cat([_live_slots(gen, live, num_slots),
                               torch.zeros(padding, dtype=torch.int32, device=DEV)])
        new_rows = _randn(gen, batch, projected.shape[1], dtype=torch.bfloat16)
        want_conv, want_rec = conv_state.clone(), rec_state.clone()
        want = gated_deltanet_decode.gated_deltanet_decode_reference(
            new_rows, conv_weight, want_conv, A_log, dt_bias, norm_weight, want_rec, new_slots, *heads)
        projected.copy_(new_rows)
        slots.copy_(new_slots)
        graph.replay()
        torch.testing.assert_close(out[:live], want[:live], **TOL[torch.bfloat16])
        _assert_gated_deltanet_states_close(conv_state, want_conv, rec_state, want_rec)


@given(
    live=st.integers(1, 64),
    layout=st.sampled_from(LINEAR_LAYOUTS),
    k=st.integers(1, 4),
    dtype=st.sampled_from([torch.bfloat16, torch.bfloat16, torch.float32]),
    state_dtype=st.sampled_from([torch.float32, torch.float32, torch.bfloat16]),
    padding=st.integers(0, 3),
    strided=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=6, deadline=None, phases=PHASES)  # each (k, layout, dtypes) compiles a variant of the kernel
def test_gated_deltanet_verify_matches_reference(live, layout, k, dtype, state_dtype, padding, strided, seed):
    """Speculative decoding's verify (k + 1 positions a sequence, the pools only read; the op's own launch) and
    commit (random accepted counts) against their references."""
    _check_verify_then_commit(_seeded(seed), layout, live, padding, k, dtype, state_dtype, strided,
                              torch.ops.ce.gated_deltanet_verify)


@pytest.mark.parametrize("layout", LINEAR_LAYOUTS[:2], ids=_case_id)
@pytest.mark.parametrize("live,k,block_v,warps,split_norm", [(1, 2, 32, 4, False), (40, 3, 64, 4, False),
                                                             (5, 1, 16, 2, False), (1, 2, 32, 4, True),
                                                             (13, 3, 64, 4, True), (3, 2, 16, 2, True)])
def test_gated_deltanet_verify_in_v_blocks_matches_reference(layout, live, k, block_v, warps, split_norm):
    """The verify kernel with each value head's columns split over programs (the gated norm a second launch, or by
    each key head's last program to count itself in: ``split_norm``, run twice so that the second launch finds the
    counts the first left at zero), then the commit from its history (keys, decays and q / k conv inputs are written
    by block 0 only)."""
    from ops.triton import gated_deltanet_kernels

    verify = functools.partial(gated_deltanet_kernels.gated_deltanet_verify, num_warps=warps, block_v=block_v,
                               split_norm=split_norm)
    for _ in range(2 if split_norm else 1):
        _check_verify_then_commit(_seeded(live * 11 + block_v), layout, live, 2, k, torch.bfloat16, torch.float32,
                                  True, verify)
    if split_norm:
        counts = gated_deltanet_kernels._counters[torch.device(DEV, torch.cuda.current_device())]
        assert int(counts.abs().sum()) == 0, "the split norm must leave its counts at zero"


def _check_verify_then_commit(gen, layout, live, padding, k, dtype, state_dtype, strided, verify):
    """``verify`` on ``live`` sequences then ``padding`` rows on the null slot, k + 1 positions each, then
    ce::gated_deltanet_commit of random accepted counts, against the references on clones: outputs, the pools left
    unchanged by the verify, the pools after the commit (but the null slot)."""
    hk, hv, dk, dv = layout
    n, positions, num_slots = live + padding, k + 1, live + 2
    slots = torch.cat([_live_slots(gen, live, num_slots), torch.zeros(padding, dtype=torch.int32, device=DEV)])
    projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state = _gated_deltanet_inputs(
        gen, n * positions, layout, dtype, state_dtype, num_slots, strided)
    width = layouts.gated_deltanet_history_offsets(hk, dk, hv, dv)[3]
    history = torch.full((n + 1, positions, width), float("nan"), device=DEV)
    want_history = history.clone()
    accepted = torch.randint(0, k + 1, (n,), generator=gen, device=DEV)
    heads = (hk, dk, hv, dv)
    want_conv, want_rec = conv_state.clone(), rec_state.clone()
    want = gated_deltanet_verify.gated_deltanet_verify_reference(
        projected, conv_weight, want_conv, A_log, dt_bias, norm_weight, want_rec, slots, want_history, *heads, 1e-6)
    got = verify(projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state, slots, history, *heads,
                 1e-6)
    assert got.shape == (n * positions, hv * dv) and got.dtype == dtype and got.is_contiguous()
    # A bf16 pool rounds the state after every position (kernel and reference alike), so a state the two compute one
    # fp32 ulp apart (another sum order) can round a tie apart at position i and move the outputs of later positions
    # by a bf16 ulp of the state: ~1e-3 on these inputs, over the fp32 tolerance. bf16's tolerance then.
    tol = TOL[torch.bfloat16] if torch.bfloat16 in (dtype, state_dtype) else TOL[torch.float32]
    torch.testing.assert_close(got[: live * positions], want[: live * positions], **tol)
    assert torch.equal(conv_state, want_conv) and torch.equal(rec_state, want_rec), "the verify wrote a pool"
    gated_deltanet_verify.gated_deltanet_commit_reference([want_conv], [want_rec], slots, [want_history], accepted,
                                                          *heads)
    torch.ops.ce.gated_deltanet_commit([conv_state], [rec_state], slots, [history], accepted, *heads)
    _assert_committed_states_close(conv_state, want_conv, rec_state, want_rec)


def _assert_committed_states_close(conv_state, want_conv, rec_state, want_rec):
    """As ``_assert_gated_deltanet_states_close``, for up to 5 positions in a row: a bf16 conv output that rounds a
    tie apart at one position moves every later state a little, so the recurrent state gets 2-3x the one-step
    bounds. The conv state is the inputs themselves: exact."""
    torch.testing.assert_close(conv_state[1:], want_conv[1:], atol=0, rtol=0)
    fp32_pool = rec_state.dtype == torch.float32
    _assert_close_relative(rec_state[1:], want_rec[1:], max_abs=2e-2 if fp32_pool else 4e-2,
                           max_rel_norm=1e-3 if fp32_pool else 5e-3, what="recurrent state")


@QUICK
def test_gated_deltanet_verify_replays_in_cuda_graph():
    """The Qwen3.5-0.8B layout, k = 2, bf16 with an fp32 pool: verify then commit captured once, replayed with new rows,
    slots and accepted counts; each replay equals the references on clones."""
    gen = _seeded(13)
    live, k, layout = 4, 2, LINEAR_LAYOUTS[0]
    hk, hv, dk, dv = layout
    positions, num_slots, heads = k + 1, 2 * live + 1, (hk, dk, hv, dv)
    projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state = _gated_deltanet_inputs(
        gen, live * positions, layout, torch.bfloat16, torch.float32, num_slots, strided=False)
    history = torch.zeros(live, positions, layouts.gated_deltanet_history_offsets(*heads)[3], device=DEV)
    slots = _live_slots(gen, live, num_slots)
    accepted = torch.zeros(live, dtype=torch.long, device=DEV)

    def step():
        out = torch.ops.ce.gated_deltanet_verify(
            projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state, slots, history, *heads, 1e-6)
        torch.ops.ce.gated_deltanet_commit([conv_state], [rec_state], slots, [history], accepted, *heads)
        return out

    step()  # compile the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(2):
        projected.copy_(_randn(gen, *projected.shape, dtype=torch.bfloat16))
        slots.copy_(_live_slots(gen, live, num_slots))
        accepted.copy_(torch.randint(0, k + 1, (live,), generator=gen, device=DEV))
        want_conv, want_rec, want_history = conv_state.clone(), rec_state.clone(), history.clone()
        want = gated_deltanet_verify.gated_deltanet_verify_reference(
            projected, conv_weight, want_conv, A_log, dt_bias, norm_weight, want_rec, slots, want_history, *heads,
            1e-6)
        gated_deltanet_verify.gated_deltanet_commit_reference([want_conv], [want_rec], slots, [want_history],
                                                              accepted, *heads)
        graph.replay()
        torch.testing.assert_close(out, want, **TOL[torch.bfloat16])
        _assert_committed_states_close(conv_state, want_conv, rec_state, want_rec)


@contextlib.contextmanager
def _patched(module, name: str, value):
    """``module.name = value`` for the block (hypothesis tests cannot take pytest's function-scoped monkeypatch)."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


@QUICK
@pytest.mark.parametrize("form", ["chunked", "recurrent"])
@given(num_seqs=st.integers(1, 8), max_len=st.integers(1, 300), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=6, deadline=None, phases=PHASES)
def test_gated_delta_rule_prefill_matches_reference(form, num_seqs, max_len, seed):
    """bf16 on the Qwen3.5-0.8B layout, both of the op's forms (FLA's chunked and recurrent kernels, chosen by the
    step's token count: forced here). One layout: FLA autotunes its chunked kernels per (layout, dtype), a cold sweep
    of most of a minute each (longer in fp32); Hv = 2 Hk and K != V are checked on the tiny layout in fp32 (the next
    test), where the compile tests' model has tuned FLA already."""
    from ops.triton import delta_rule_kernels

    gen = _seeded(seed)
    layout = LINEAR_LAYOUTS[0]
    hk, hv, dk, dv = layout
    num_slots = num_seqs + 2
    # a captured step's padding after the sequences, on the null slot: empty ones, then one with tokens (its state
    # starts from zeros, whatever the null slot's random row holds, and is not written back)
    slots = torch.cat([_live_slots(gen, num_seqs, num_slots), torch.zeros(3, dtype=torch.int32, device=DEV)])
    seq_lens = torch.randint(1, max_len + 1, (num_seqs + 3,), generator=gen, device=DEV)
    seq_lens[num_seqs: num_seqs + 2] = 0
    if num_seqs > 2:
        seq_lens[1] = 0  # a sequence with no tokens this step keeps its state
    num_seqs += 3
    cu = torch.zeros(num_seqs + 1, dtype=torch.int32, device=DEV)
    cu[1:] = seq_lens.cumsum(0)
    q, k, v, a, b, A_log, dt_bias = _gdr_inputs(gen, int(cu[-1]), layout, torch.bfloat16)
    state = _randn(gen, num_slots, hv, dk, dv, scale=0.3)
    want_state = state.clone()
    want = delta_rule.gated_delta_rule_prefill_reference(q, k, v, a, b, A_log, dt_bias, want_state, cu, slots)
    limit = 0 if form == "chunked" else 1 << 30
    with _patched(delta_rule_kernels, "RECURRENT_PREFILL_MAX_TOKENS", limit):
        got = torch.ops.ce.gated_delta_rule_prefill(q, k, v, a, b, A_log, dt_bias, state, cu, slots)
    # FLA's chunked kernel keeps q/k/w/u in bf16 between its stages; the reference is fp32 throughout.
    _assert_close_relative(got, want, max_abs=6e-2, max_rel_norm=1.5e-2, what="prefill output")
    _assert_close_relative(state, want_state, max_abs=6e-2, max_rel_norm=1.5e-2, what="prefill final state")
    assert torch.equal(state[0], want_state[0]), "the padding wrote the null slot"


@pytest.mark.parametrize("layout, dtype, state_dtype, max_abs, max_rel", [
    # fp32 throughout (tight), on the tiny layout: Hv = 2 Hk, K != V; the FLA key the compile tests' model tunes
    pytest.param(TINY_LINEAR_LAYOUT, torch.float32, torch.float32, 5e-3, 2e-3, id="fp32-tiny"),
    # a bf16 state pool on the model's layout: only the state kernel's key is new next to the bf16 reference test's
    pytest.param(LINEAR_LAYOUTS[0], torch.bfloat16, torch.bfloat16, 6e-2, 2e-2, id="bf16_pool-16x16x128x128"),
])
def test_gated_delta_rule_prefill_fp32_and_bf16_pool(layout, dtype, state_dtype, max_abs, max_rel):
    """fp32 activations (tight) and a bf16 state pool, one fixed case each."""
    gen = _seeded(7)
    cu = torch.tensor([0, 70, 71, 200, 200, 213], dtype=torch.int32, device=DEV)
    slots = torch.tensor([3, 1, 4, 0, 0], dtype=torch.int32, device=DEV)  # padding on the null slot: empty, 13 tokens
    q, k, v, a, b, A_log, dt_bias = _gdr_inputs(gen, 213, layout, dtype)
    state = _randn(gen, 5, layout[1], layout[2], layout[3], dtype=state_dtype, scale=0.3)
    want_state = state.clone()
    want = delta_rule.gated_delta_rule_prefill_reference(q, k, v, a, b, A_log, dt_bias, want_state, cu, slots)
    got = torch.ops.ce.gated_delta_rule_prefill(q, k, v, a, b, A_log, dt_bias, state, cu, slots)
    _assert_close_relative(got, want, max_abs=max_abs, max_rel_norm=max_rel, what=f"{dtype} output")
    _assert_close_relative(state, want_state, max_abs=max_abs, max_rel_norm=max_rel, what=f"{state_dtype} state")
    assert torch.equal(state[0], want_state[0]), "the padding wrote the null slot"


def _fla_fields(cu: torch.Tensor, num_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cu_seqlens_long and chunk_indices as pack_step makes them: 16-byte-aligned views of one new int64 tensor
    (the table padded to ``num_rows`` with skip rows, as a captured step's)."""
    bounds = cu.tolist()
    chunks = delta_rule.host_chunk_indices(bounds, num_rows=num_rows)
    at = -(-len(bounds) // 2) * 2
    packed = torch.zeros(at + len(chunks), dtype=torch.long)
    packed[: len(bounds)] = torch.tensor(bounds)
    packed[at:] = torch.tensor(chunks, dtype=torch.long)
    packed = packed.to(DEV)
    return packed[: len(bounds)], packed[at:].view(-1, 2)


def _kernel_names(fn) -> list[str]:
    """The CUDA kernels one call of ``fn`` launches, by name, in order (the profiler's device events)."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _kernels_launched(fn) -> int:
    return len(_kernel_names(fn))


def test_gated_delta_rule_prefill_recurrent_form_syncs_nothing():
    """The short steps' form (FLA's recurrent kernel) never waits for the GPU either (its sequence count is a shape)."""
    gen = _seeded(12)
    layout = LINEAR_LAYOUTS[0]
    cu = torch.tensor([0, 70, 70, 71, 200], dtype=torch.int32, device=DEV)
    slots = torch.tensor([3, 1, 4, 2], dtype=torch.int32, device=DEV)
    q, k, v, a, b, A_log, dt_bias = _gdr_inputs(gen, 200, layout, torch.bfloat16)
    state = _randn(gen, 5, layout[1], layout[2], layout[3], scale=0.3)
    fields = _fla_fields(cu)
    op = torch.ops.ce.gated_delta_rule_prefill
    from ops.triton import delta_rule_kernels

    assert 200 <= delta_rule_kernels.RECURRENT_PREFILL_MAX_TOKENS
    op(q, k, v, a, b, A_log, dt_bias, state.clone(), cu, slots, *fields)  # compiles outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        op(q, k, v, a, b, A_log, dt_bias, state.clone(), cu, slots, *fields)
        op(q, k, v, a, b, A_log, dt_bias, state.clone(), cu, slots)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("bounds", [[0, 70, 456], [0, 448, 512], [0, 1000, 1000], [0, 1, 64, 1024]])
def test_gated_delta_rule_prefill_skip_rows_change_nothing(bounds):
    """The chunked form with its chunk table padded by skip rows (a captured prompt step's fixed length, graphs/
    prefill_graph.py): output and states bit-identical to the exact table's, for a last sequence ending inside a
    chunk, on a chunk edge and empty; and no host sync."""
    from ops.triton import delta_rule_kernels

    gen = _seeded(13)
    layout = LINEAR_LAYOUTS[0]
    cu = torch.tensor(bounds, dtype=torch.int32, device=DEV)
    slots = torch.arange(1, len(bounds), dtype=torch.int32, device=DEV)
    q, k, v, a, b, A_log, dt_bias = _gdr_inputs(gen, bounds[-1], layout, torch.bfloat16)
    state = _randn(gen, len(bounds), layout[1], layout[2], layout[3], scale=0.3)
    op = torch.ops.ce.gated_delta_rule_prefill
    rows = delta_rule.max_chunk_rows(bounds[-1], len(bounds) - 1) + 1
    with _patched(delta_rule_kernels, "RECURRENT_PREFILL_MAX_TOKENS", 0):
        exact_state = state.clone()
        exact = op(q, k, v, a, b, A_log, dt_bias, exact_state, cu, slots, *_fla_fields(cu))
        padded_state = state.clone()
        fields = _fla_fields(cu, num_rows=rows)
        assert fields[1].shape[0] > len(delta_rule.host_chunk_indices(bounds)) // 2
        padded = op(q, k, v, a, b, A_log, dt_bias, padded_state, cu, slots, *fields)
        assert torch.equal(padded, exact) and torch.equal(padded_state, exact_state)
        fresh = _fla_fields(cu, num_rows=rows)  # a new step's fields (built on the host: .tolist() syncs)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            op(q, k, v, a, b, A_log, dt_bias, state.clone(), cu, slots, *fresh)
        finally:
            torch.cuda.set_sync_debug_mode(0)


def test_gated_delta_rule_prefill_graphed_takes_the_chunked_form():
    """A captured step's call (``graphed``) of 100 tokens, inside the recurrent form's range, runs the chunked form:
    bit-identical to the chunked form forced by the limit."""
    from ops.triton import delta_rule_kernels

    gen = _seeded(14)
    layout = LINEAR_LAYOUTS[0]
    cu = torch.tensor([0, 30, 100], dtype=torch.int32, device=DEV)
    slots = torch.tensor([1, 2], dtype=torch.int32, device=DEV)
    q, k, v, a, b, A_log, dt_bias = _gdr_inputs(gen, 100, layout, torch.bfloat16)
    state = _randn(gen, 3, layout[1], layout[2], layout[3], scale=0.3)
    op = torch.ops.ce.gated_delta_rule_prefill
    assert 100 <= delta_rule_kernels.RECURRENT_PREFILL_MAX_TOKENS
    graphed_state = state.clone()
    graphed = op(q, k, v, a, b, A_log, dt_bias, graphed_state, cu, slots, *_fla_fields(cu), True)
    with _patched(delta_rule_kernels, "RECURRENT_PREFILL_MAX_TOKENS", 0):
        chunked_state = state.clone()
        chunked = op(q, k, v, a, b, A_log, dt_bias, chunked_state, cu, slots, *_fla_fields(cu))
    assert torch.equal(graphed, chunked) and torch.equal(graphed_state, chunked_state)


def test_gated_delta_rule_prefill_fla_fields_change_nothing_and_sync_nothing():
    """With pack_step's cu_seqlens_long / chunk_indices: the same result as without, no host sync, and FLA's
    identity memo hits when the same objects come again (the next layer of the same step). The chunked form (456
    tokens: forced past RECURRENT_PREFILL_MAX_TOKENS), whose kernels take those fields."""
    from ops.triton import delta_rule_kernels

    with _patched(delta_rule_kernels, "RECURRENT_PREFILL_MAX_TOKENS", 0):
        _check_fla_fields()


def _check_fla_fields():
    gen = _seeded(11)
    layout = LINEAR_LAYOUTS[0]
    cu = torch.tensor([0, 70, 70, 71, 200, 456], dtype=torch.int32, device=DEV)  # a zero-length sequence too
    slots = torch.tensor([3, 1, 4, 2, 5], dtype=torch.int32, device=DEV)
    q, k, v, a, b, A_log, dt_bias = _gdr_inputs(gen, 456, layout, torch.bfloat16)
    state = _randn(gen, 6, layout[1], layout[2], layout[3], scale=0.3)
    args = (q, k, v, a, b, A_log, dt_bias)
    op = torch.ops.ce.gated_delta_rule_prefill

    plain_state = state.clone()
    plain = op(*args, plain_state, cu, slots)  # also warms FLA's autotuner (which syncs)
    fields = _fla_fields(cu)
    with_state = state.clone()
    got = op(*args, with_state, cu, slots, *fields)
    assert torch.equal(got, plain) and torch.equal(with_state, plain_state)

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call (.item(), .tolist(), ...) raises
    try:
        for _ in range(3):  # three layers of one step
            op(*args, state.clone(), cu, slots, *fields)
    finally:
        torch.cuda.set_sync_debug_mode(0)

    # Kernels per call: without the fields FLA copies cu_seqlens and builds the chunk table (and syncs); with new
    # fields it still derives its chunk offsets from them; with the same fields again (the next layer) it does not.
    fresh = _fla_fields(cu)
    without = _kernels_launched(lambda: op(*args, state.clone(), cu, slots))
    first = _kernels_launched(lambda: op(*args, state.clone(), cu, slots, *fresh))
    again = _kernels_launched(lambda: op(*args, state.clone(), cu, slots, *fresh))
    assert again < first < without, (again, first, without)


def test_eager_prefill_step_has_no_host_sync(qwen3_5_text_tied_path):
    """A whole eager prefill forward (the engine's path: pack_step, then every layer) never waits for the GPU.

    fp32, as the compile tests' model: the same kernel variants and FLA autotune key, compiled and tuned there (a bf16
    tiny model would be one more cold FLA sweep). The path's one dtype-dependent choice, ce::linear's kernel, is made
    on the host from shapes and dtypes, and at these row counts it is cuBLAS for both."""
    from compiled_engine.runtime import Runtime

    rt = Runtime.from_pretrained(str(qwen3_5_text_tied_path), device="cuda", dtype="float32", compile=False,
                                 max_model_len=512, max_num_seqs=4, num_kv_blocks=128, block_size=16)
    seqs = [rt.add_sequence([(5 * i + j) % 50 + 1 for j in range(n)]) for i, n in enumerate((300, 1, 64, 129))]
    try:
        with torch.inference_mode():
            step = rt.build_step(seqs, [len(s.token_ids) for s in seqs], is_prefill=True)
            rt.model(step)  # warm: autotuning and first compiles sync
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                hidden = rt.model(step)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            assert torch.isfinite(hidden.float()).all()
    finally:
        for seq in seqs:
            rt.release(seq)


# ----------------------------------------------------------------------------------------------------------------
# Linear: the skinny GEMM (M <= SKINNY_MAX_ROWS) and the dispatch to cuBLAS
# ----------------------------------------------------------------------------------------------------------------

# [N, K] of the Qwen3.5-0.8B weight matmuls, then two tensor-parallel (2-way) shards
LINEAR_SHAPES = {
    "gdn_in_proj": (8224, 1024),
    "gdn_out_proj": (1024, 2048),  # = attention o_proj
    "mlp_gate_up": (7168, 1024),
    "mlp_down": (1024, 3584),
    "attn_qkv": (5120, 1024),
    "lm_head": (248320, 1024),
    "tp2_gdn_in_proj": (4112, 1024),  # column-parallel: N halved
    "tp2_mlp_down": (1024, 1792),  # row-parallel: K halved
}


# ----------------------------------------------------------------------------------------------------------------
# RMSNorm (eager steps; compiled graphs fuse the same math themselves)
# ----------------------------------------------------------------------------------------------------------------

NORM_CASES = {  # (heads, dim, gated, strided) of the Qwen3.5-0.8B norms, with the views the model passes
    "layer_norm": (1, 1024, False, False),
    "q_norm": (8, 256, False, True),  # q: the first half of each head's [q | gate] in the qkv output
    "k_norm": (2, 256, False, True),
    "gated_norm": (16, 128, True, True),  # gate: z, a slice of the in_proj output
}


def _norm_inputs(gen, tokens, heads, dim, gated, strided, dtype):
    if strided:
        x = _randn(gen, tokens, heads, 2 * dim, dtype=dtype, scale=3.0)[..., :dim]
        gate = _randn(gen, tokens, 5 + heads * dim, dtype=dtype)[:, 5:].view(tokens, heads, dim)
    else:
        x, gate = _randn(gen, tokens, heads, dim, dtype=dtype, scale=3.0), _randn(gen, tokens, heads, dim, dtype=dtype)
    return x, _randn(gen, dim, dtype=dtype, scale=0.5), gate if gated else None


# Each (norm, dtype, row count class) is a compiled variant: bf16 at 1 row (decode), 7 (a ragged row block) and 2,048
# (prefill); fp32 (the compile tests' dtype; it changes the roundings) at 7.
@pytest.mark.parametrize("dtype, name, tokens", cases(
    [(torch.bfloat16, name, tokens) for name in NORM_CASES for tokens in (1, 7, 2048)]
    + [(torch.float32, name, 7) for name in NORM_CASES],
    quick=[(torch.bfloat16, "layer_norm", 1), (torch.bfloat16, "gated_norm", 7)],
))
def test_rms_norm_matches_reference_and_float64(name, tokens, dtype):
    heads, dim, gated, strided = NORM_CASES[name]
    x, weight, gate = _norm_inputs(_seeded(tokens), tokens, heads, dim, gated, strided, dtype)
    got = torch.ops.ce.rms_norm(x, weight, gate, 1e-6, not gated)
    assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous()
    # The reference rounds where the kernel rounds: at most one output rounding apart (fp32 sums in another order).
    torch.testing.assert_close(got, norm.rms_norm_reference(x, weight, gate, 1e-6, not gated), **TOL[dtype])
    # float64 math with no intermediate rounding: the gated norm's two bf16 roundings inside are within TOL too.
    xd = x.double()
    normed = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    want = normed * weight.double() * F.silu(gate.double()) if gated else normed * (1.0 + weight.double())
    torch.testing.assert_close(got.double(), want, **{k: 2 * v for k, v in TOL[dtype].items()})


@pytest.mark.parametrize("dtype, tokens", cases(
    [(torch.bfloat16, 1), (torch.bfloat16, 16), (torch.bfloat16, 2048), (torch.float32, 16)],
    quick=[(torch.bfloat16, 1)],
))
def test_add_rms_norm_matches_reference_and_float64(tokens, dtype):
    """A decoder layer's residual add + norm (hidden 1,024): against the reference, and the norm of the rounded sum
    in float64; replayed in a CUDA graph with new inputs (it is launched with PDL)."""
    gen = _seeded(tokens)
    x, residual = _randn(gen, tokens, 1024, dtype=dtype, scale=3.0), _randn(gen, tokens, 1024, dtype=dtype, scale=3.0)
    weight = _randn(gen, 1024, dtype=dtype, scale=0.5)
    summed, normed = torch.ops.ce.add_rms_norm(x, residual, weight, 1e-6)
    want_sum, want_norm = norm.add_rms_norm_reference(x, residual, weight, 1e-6)
    torch.testing.assert_close(summed, want_sum, atol=0, rtol=0)  # one rounding of an exact fp32 sum
    torch.testing.assert_close(normed, want_norm, **TOL[dtype])
    sd = summed.double()
    want = sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + weight.double())
    torch.testing.assert_close(normed.double(), want, **{k: 2 * v for k, v in TOL[dtype].items()})
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = torch.ops.ce.add_rms_norm(x, residual, weight, 1e-6)
    x.copy_(_randn(gen, tokens, 1024, dtype=dtype, scale=3.0))
    graph.replay()
    for got, want in zip(captured, norm.add_rms_norm_reference(x, residual, weight, 1e-6)):
        torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.parametrize("dtype, rows", cases(
    [(torch.bfloat16, 1), (torch.bfloat16, 7), (torch.bfloat16, 2048), (torch.float32, 7)],
    quick=[(torch.bfloat16, 7)],
))
def test_silu_mul_matches_reference_and_float64(rows, dtype):
    """The MLP's silu(gate) * up on Qwen3.5-0.8B's gate_up rows (I = 3,584), and on strided rows."""
    gen = _seeded(rows)
    for gate_up in (_randn(gen, rows, 2 * 3584, dtype=dtype, scale=3.0),
                    _randn(gen, rows, 2 * 3584 + 64, dtype=dtype, scale=3.0)[:, 32:-32]):
        got = torch.ops.ce.silu_mul(gate_up)
        assert got.shape == (rows, 3584) and got.dtype == dtype and got.is_contiguous()
        torch.testing.assert_close(got, activation.silu_mul_reference(gate_up), **TOL[dtype])
        gate, up = gate_up.double()[:, :3584], gate_up.double()[:, 3584:]
        torch.testing.assert_close(got.double(), gate * torch.sigmoid(gate) * up,
                                   **{k: 2 * v for k, v in TOL[dtype].items()})


@pytest.mark.parametrize("penalised", cases([(1,), (64,)], quick=[(64,)]))
def test_apply_penalties_equals_reference_at_the_models_vocabulary(penalised):
    """ce::apply_penalties_ on Qwen3.5's vocabulary: ``penalised`` rows of 96 out of order, prompts of 2,048 and
    outputs of 512 tokens (padded, repeated), every penalty on, the rows and tokens views of one table as the sampler
    uploads them: the CUDA kernel's logits equal the reference's bit for bit, the other rows untouched."""
    gen, vocab = _seeded(penalised), 248320
    logits = _randn(gen, 96, vocab, scale=4.0)
    table = torch.cat([torch.randperm(96, generator=gen, device=DEV)[:penalised, None],
                       torch.randint(0, vocab, (penalised, 2048), generator=gen, device=DEV),
                       torch.randint(0, 4096, (penalised, 512), generator=gen, device=DEV)], dim=1)
    rows, prompt, output = table[:, 0], table[:, 1:2049], table[:, 2049:]
    output[:, 400:] = vocab  # padding
    presence, frequency = _randn(gen, penalised), _randn(gen, penalised)
    repetition = torch.rand(penalised, generator=gen, device=DEV) + 0.5
    got, want = logits.clone(), logits.clone()
    torch.ops.ce.apply_penalties_(got, rows, prompt, output, presence, frequency, repetition)
    penalties.apply_penalties_reference(want, rows, prompt, output, presence, frequency, repetition)
    assert torch.equal(got, want)
    others = torch.ones(96, dtype=torch.bool, device=DEV)
    others[rows] = False
    assert torch.equal(got[others], logits[others]) and not torch.equal(got, logits)


def _linear_inputs(gen, rows, n, k, dtype=torch.bfloat16):
    return _randn(gen, rows, k, dtype=dtype), _randn(gen, n, k, dtype=dtype, scale=k**-0.5)  # outputs ~ N(0, 1)


def _assert_linear_close(got, x, weight):
    """Against float64: one rounding of the output (elementwise), and an fp32-accumulation-sized error overall
    (accumulating in bf16 would miss the norm bound by far at K >= 1024)."""
    want = x.double() @ weight.double().T
    _assert_close_relative(got, want, max_abs=2e-2, max_rel_norm=4e-3, what=f"linear {tuple(weight.shape)}")


# Rows 1 (the one-row GEMV), 2, 3 and 5 (the few-rows GEMV, 3 and 5 as a power of two + 1; from 3 the vocabulary on
# the tensor-core loop), configs by rule (gemv_kernels.skinny_config; test_linear_every_rule_config tries each one),
# and 16 (past SKINNY_MAX_ROWS: cuBLAS, against the same float64).
# Quick: the GEMV with the L2 prefetch, and two rows on an N = 1,024 matrix.
@pytest.mark.parametrize("name, rows", cases(
    [(name, rows) for name in LINEAR_SHAPES for rows in (1, 2, 3, 5, 16)],
    quick=[("gdn_in_proj", 1), ("gdn_out_proj", 2)],
))
def test_linear_skinny_gemm_on_model_shapes(name, rows):
    n, k = LINEAR_SHAPES[name]
    x, weight = _linear_inputs(_seeded(rows), rows, n, k)
    got = torch.ops.ce.linear(x, weight)
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    _assert_linear_close(got, x, weight)


@given(
    rows=st.integers(1, SKINNY_MAX_ROWS),
    n=st.integers(1, 3000),
    k=st.integers(1, 2500),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=4, deadline=None, phases=PHASES)
def test_linear_skinny_gemm_ragged_shapes(rows, n, k, dtype, seed):
    x, weight = _linear_inputs(_seeded(seed), rows, n, k, dtype)
    got = torch.ops.ce.linear(x, weight)
    assert got.shape == (rows, n) and got.dtype == dtype
    torch.testing.assert_close(got.double(), x.double() @ weight.double().T, **TOL[torch.bfloat16])


def _check_skinny_configs(gen, rows, name, configs):
    """Each of ``configs`` on the model shape ``name`` at ``rows`` rows: plain, with the SiLU gate and (one row, the
    only place it runs) with the residual add + norm in the prologue, against float64 through the prologue's
    roundings (the sum exactly)."""
    n, k = LINEAR_SHAPES[name]
    x, weight = _linear_inputs(gen, rows, n, k)
    gate_up = _randn(gen, rows, 2 * k, dtype=torch.bfloat16)
    residual, norm_weight = _randn(gen, rows, k, dtype=torch.bfloat16), _randn(gen, k, dtype=torch.bfloat16)
    want_sum, normed = norm.add_rms_norm_reference(x, residual, norm_weight, 1e-6)
    for config in configs:
        _assert_linear_close(gemv_kernels.skinny_gemm(x, weight, config), x, weight)
        gated = gemv_kernels.skinny_gemm(gate_up, weight, config, gated=True)
        _assert_linear_close(gated, activation.silu_mul_reference(gate_up), weight)
        if rows > 1:
            continue
        out, summed = gemv_kernels.add_rms_norm_skinny_gemm(x, residual, norm_weight, 1e-6, weight, config)
        torch.testing.assert_close(summed, want_sum, atol=0, rtol=0)
        _assert_linear_close(out, normed, weight)


@pytest.mark.parametrize("rows", [1, 2, 3, 8])
def test_linear_every_rule_config(rows):
    """The rule's config (gemv_kernels.skinny_config: the one-row GEMV at 1 row, the few-rows GEMV above; ce::linear
    runs it up to SKINNY_MAX_ROWS rows, bench/gemv_chain.py up to GEMV_MAX_ROWS) on a narrow and a wide model
    shape (_check_skinny_configs)."""
    gen = _seeded(rows)
    for name in ("mlp_down", "gdn_in_proj"):
        _check_skinny_configs(gen, rows, name, [gemv_kernels.skinny_config(rows, *LINEAR_SHAPES[name])])


@pytest.mark.parametrize("rows", [3, 8, 13, 16])
def test_linear_tensor_core_loop(rows):
    """The skinny GEMM's tensor-core loop (``DOT`` configs: x's rows padded to 8 or 16 as the mma's narrow side, the
    weight tile the wide one) on a narrow and a wide model shape (_check_skinny_configs): bench/gemv_chain.py's
    candidates."""
    gen = _seeded(100 + rows)
    for name, configs in (("mlp_down", [(16, 256, 1, 3), (32, 128, 1, 3)]),
                          ("gdn_in_proj", [(64, 128, 2, 3), (64, 128, 4, 3), (64, 256, 2, 2)])):
        _check_skinny_configs(gen, rows, name, [gemv_kernels._config(*c, dot=True) for c in configs])


def test_skinny_gemm_l2_prefetch():
    """The weight's L2 prefetch (ops/triton/l2_prefetch.py) is in the compiled GEMV where it is on, and changes no
    bit of the result: a hint, not a value (the same call with the l2_prefetch option off)."""
    from ops.options import use_options
    from ops.triton import l2_prefetch

    if not l2_prefetch.l2_prefetch_enabled():
        pytest.skip("no L2 prefetch here (pre-Hopper GPU or CE_L2_PREFETCH=0)")
    for name in ("gdn_in_proj", "mlp_gate_up"):  # 15-17 MB: prefetched
        n, k = LINEAR_SHAPES[name]
        x, weight = _linear_inputs(_seeded(21), 1, n, k)
        assert l2_prefetch.l2_prefetch_flags(weight, 512)["PREFETCH_L2"]
        prefetched = gemv_kernels.skinny_gemm(x, weight)
        _assert_linear_close(prefetched, x, weight)
        with use_options(l2_prefetch=False):
            assert not l2_prefetch.l2_prefetch_flags(weight, 512)["PREFETCH_L2"]
            torch.testing.assert_close(gemv_kernels.skinny_gemm(x, weight), prefetched, atol=0, rtol=0)
    compiled = [kernel for cache in gemv_kernels._skinny_gemm_kernel.device_caches.values() for kernel in cache[0].values()]
    assert any("cp.async.bulk.prefetch.L2" in kernel.asm["ptx"] for kernel in compiled)
    lm_head = torch.empty(248320, 1024, dtype=torch.bfloat16, device="cuda")  # 508 MB: larger than half the L2
    assert not l2_prefetch.l2_prefetch_flags(lm_head, 31040)["PREFETCH_L2"]


def test_linear_dispatch():
    """Up to SKINNY_MAX_ROWS rows of bf16/fp16: our kernel; more rows, or fp32: cuBLAS, F.linear's bits exactly."""
    gen = _seeded(9)
    n, k = LINEAR_SHAPES["gdn_out_proj"]
    for rows, dtype in [(SKINNY_MAX_ROWS + 1, torch.bfloat16), (64, torch.float16), (4, torch.float32)]:
        x, weight = _linear_inputs(gen, rows, n, k, dtype)
        torch.testing.assert_close(torch.ops.ce.linear(x, weight), F.linear(x, weight), atol=0, rtol=0)
    x, weight = _linear_inputs(gen, SKINNY_MAX_ROWS, n, k)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.ops.ce.linear(x, weight)
        torch.cuda.synchronize()
    assert any("_skinny_gemm_kernel" in event.name for event in prof.events())


def test_linear_replays_in_cuda_graph():
    """Compiled by the eager call, captured (configs by rule: nothing is benchmarked or waited for on the host), and
    replayed with new inputs: the same config, so the same bits as an eager call."""
    gen = _seeded(13)
    for name in ("gdn_out_proj", "mlp_gate_up"):  # N = 1024 and a wide N
        n, k = LINEAR_SHAPES[name]
        for rows in (1, SKINNY_MAX_ROWS):
            x, weight = _linear_inputs(gen, rows, n, k)
            torch.ops.ce.linear(x, weight)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = torch.ops.ce.linear(x, weight)
            x.copy_(_randn(gen, rows, k, dtype=torch.bfloat16))
            graph.replay()
            torch.testing.assert_close(out, torch.ops.ce.linear(x, weight), atol=0, rtol=0)
            _assert_linear_close(out, x, weight)


# Rows 1, 2 and 5: our skinny GEMM (the one-row and the few-rows GEMV, 5 as 4 + 1); 16: ce::silu_mul + cuBLAS.
@pytest.mark.parametrize("name, rows", cases(
    [(name, rows) for name in ("mlp_down", "tp2_mlp_down") for rows in (1, 2, 5, 16)],
    quick=[("mlp_down", 1)],
))
def test_silu_mul_linear_on_model_shapes(name, rows):
    """The MLP's activation + down projection: our skinny GEMM with the activation in its x loads up to
    SKINNY_MAX_ROWS rows, ce::silu_mul + cuBLAS above; against float64 (through the two bf16 roundings the unfused
    ops make)."""
    n, k = LINEAR_SHAPES[name]
    gen = _seeded(rows)
    gate_up = _randn(gen, rows, 2 * k, dtype=torch.bfloat16)
    weight = _randn(gen, n, k, dtype=torch.bfloat16, scale=k**-0.5)
    got = torch.ops.ce.silu_mul_linear(gate_up, weight)
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    activated = activation.silu_mul_reference(gate_up)  # bf16, rounded as the kernel rounds its x loads
    _assert_linear_close(got, activated, weight)
    gate, up = gate_up.double()[:, :k], gate_up.double()[:, k:]
    want = (gate * torch.sigmoid(gate) * up) @ weight.double().T
    _assert_close_relative(got, want, max_abs=5e-2, max_rel_norm=8e-3, what=f"silu_mul_linear {name}")
    graph_inputs = gate_up.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ce.silu_mul_linear(graph_inputs, weight)
    graph_inputs.copy_(_randn(gen, rows, 2 * k, dtype=torch.bfloat16))
    graph.replay()
    torch.testing.assert_close(out, torch.ops.ce.silu_mul_linear(graph_inputs, weight), atol=0, rtol=0)


# Row 1: the one-row GEMV with the norm in its prologue; 2, 3 and 5: ce::add_rms_norm + the few-rows GEMV; 16:
# ce::add_rms_norm + cuBLAS.
@pytest.mark.parametrize("name, rows", cases(
    [(name, rows) for name in ("gdn_in_proj", "mlp_gate_up", "attn_qkv") for rows in (1, 2, 3, 5, 16)],
    quick=[("attn_qkv", 1), ("attn_qkv", 3)],
))
def test_add_rms_norm_linear_on_model_shapes(name, rows):
    """A layer's residual add + norm + the projection after it: our skinny GEMM computing the norm in its prologue
    at one row, ce::add_rms_norm then our skinny GEMM up to SKINNY_MAX_ROWS rows, then cuBLAS above. The sum exactly
    as the reference rounds it; the projection of the norm against float64; replayed in a CUDA graph with new
    inputs."""
    n, k = LINEAR_SHAPES[name]
    gen = _seeded(rows)
    x, residual = _randn(gen, rows, k, dtype=torch.bfloat16, scale=3.0), _randn(gen, rows, k, dtype=torch.bfloat16)
    norm_weight = _randn(gen, k, dtype=torch.bfloat16, scale=0.5)
    weight = _randn(gen, n, k, dtype=torch.bfloat16, scale=k**-0.5)
    out, summed = torch.ops.ce.add_rms_norm_linear(x, residual, norm_weight, 1e-6, weight)
    assert out.shape == (rows, n) and summed.shape == (rows, k)
    launched = " ".join(_kernel_names(lambda: torch.ops.ce.add_rms_norm_linear(x, residual, norm_weight, 1e-6,
                                                                                 weight)))
    # the path ops/linear.py says it takes: the fused GEMV at one row, the norm kernel then ours up to
    # SKINNY_MAX_ROWS, the norm kernel then cuBLAS above (a silent fallback would pass on the numbers alone)
    assert ("_add_rms_norm_kernel" in launched) == (rows > 1), launched
    assert ("_skinny_gemm_kernel" in launched) == (rows <= SKINNY_MAX_ROWS), launched
    want_sum, normed = norm.add_rms_norm_reference(x, residual, norm_weight, 1e-6)
    torch.testing.assert_close(summed, want_sum, atol=0, rtol=0)
    _assert_linear_close(out, normed, weight)  # normed: bf16, rounded as the kernel rounds its x loads
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_out, captured_sum = torch.ops.ce.add_rms_norm_linear(x, residual, norm_weight, 1e-6, weight)
    x.copy_(_randn(gen, rows, k, dtype=torch.bfloat16, scale=3.0))
    graph.replay()
    eager_out, eager_sum = torch.ops.ce.add_rms_norm_linear(x, residual, norm_weight, 1e-6, weight)
    torch.testing.assert_close(captured_out, eager_out, atol=0, rtol=0)
    torch.testing.assert_close(captured_sum, eager_sum, atol=0, rtol=0)


# Rows 1-3 and 5: our skinny GEMM writing silu(gate) * up (the norm in its prologue at one row; 3 and 5 rows as a
# power of two + 1); 16: ce::add_rms_norm, cuBLAS, ce::silu_mul. A gate_up as wide as a vocabulary at 3 rows: the
# rule's tensor-core loop, which has no epilogue, then ce::silu_mul.
@pytest.mark.parametrize("n, rows", cases([(7168, 1), (7168, 2), (7168, 3), (7168, 5), (7168, 16), (2 * 40000, 3)],
                                          quick=[(7168, 1), (7168, 3)]))
def test_add_rms_norm_linear_silu_mul_on_model_shapes(n, rows):
    """The MLP's norm, gate_up projection and activation in one op: bit for bit the unfused ops (ce::add_rms_norm_linear
    then ce::silu_mul: the same GEMV sums, rounded and activated as ce::silu_mul does), no activation kernel launched
    where the skinny GEMM's epilogue runs; against float64 through the same roundings; replayed in a CUDA graph."""
    k = LINEAR_SHAPES["mlp_gate_up"][1]
    gen = _seeded(rows)
    x, residual = _randn(gen, rows, k, dtype=torch.bfloat16, scale=3.0), _randn(gen, rows, k, dtype=torch.bfloat16)
    norm_weight = _randn(gen, k, dtype=torch.bfloat16, scale=0.5)
    weight = _randn(gen, n, k, dtype=torch.bfloat16, scale=k**-0.5)

    def fused():
        return torch.ops.ce.add_rms_norm_linear_silu_mul(x, residual, norm_weight, 1e-6, weight)

    out, summed = fused()
    assert out.shape == (rows, n // 2) and summed.shape == (rows, k)
    gate_up, unfused_sum = torch.ops.ce.add_rms_norm_linear(x, residual, norm_weight, 1e-6, weight)
    torch.testing.assert_close(out, torch.ops.ce.silu_mul(gate_up), atol=0, rtol=0)
    torch.testing.assert_close(summed, unfused_sum, atol=0, rtol=0)
    # the projection itself against float64, from the norm's reference (no other test has this shape's)
    _assert_linear_close(gate_up, norm.add_rms_norm_reference(x, residual, norm_weight, 1e-6)[1], weight)
    launched = " ".join(_kernel_names(fused))
    epilogue = rows <= SKINNY_MAX_ROWS and gemv_kernels.takes_gated_out(rows, n, k)
    assert epilogue == (n == 7168 and rows <= SKINNY_MAX_ROWS)
    assert ("_silu_mul_kernel" in launched) == (not epilogue), launched
    assert ("_skinny_gemm_kernel" in launched) == (rows <= SKINNY_MAX_ROWS), launched
    # Against float64 from the projection's bf16 values: two bf16 roundings (silu's output, the product), each within
    # 2**-8 of its value, so every output lies within ~2**-7 of the exact silu(gate) * up, relatively.
    gate, up = gate_up.double().chunk(2, dim=1)
    want = gate * torch.sigmoid(gate) * up
    err = (out.double() - want).abs()
    assert (err <= 1.01 * 2**-7 * want.abs() + 1e-30).all(), f"max relative err {(err / want.abs()).max():.3e}"
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_out, _ = fused()
    x.copy_(_randn(gen, rows, k, dtype=torch.bfloat16, scale=3.0))
    graph.replay()
    torch.testing.assert_close(captured_out, fused()[0], atol=0, rtol=0)


@QUICK
def test_advance_decode_inputs_on_the_static_buffers():
    """On the decode graph's own buffers (graphs/static_inputs.py): the greedy tokens become the input ids, the
    fields (each a storage of its own over one allocation) advance as the reference says, and the tokens reach the
    token ring, pinned host memory the kernel writes through its device address, readable on the host once the kernel
    is done."""
    from graphs.static_inputs import StaticDecodeInputs
    from ops.decode_inputs import advance_decode_inputs_reference

    static = StaticDecodeInputs(max_batch=5, max_blocks_per_seq=4, block_size=16, device=DEV)
    n = 4
    logits = torch.nn.functional.one_hot(torch.tensor([7, 8, 9, 0], device=DEV), 248320).to(torch.bfloat16)
    static.positions[:n] = torch.tensor([15, 20, 63, 0])  # opens block 1; inside block 1; past the table; padding
    static.context_lens[:n] = torch.tensor([16, 21, 64, 0], dtype=torch.int32)
    static.block_tables[:n] = torch.tensor([[3, 6, 0, 0], [2, 4, 0, 0], [1, 5, 8, 9], [0, 0, 0, 0]], dtype=torch.int32)
    fields = lambda: (static.input_ids[:n], static.positions[:n], static.slot_mapping[:n], static.context_lens[:n],  # noqa: E731
                      static.block_tables[:n], static.token_ring, static.ring_slot)
    want = [t.cpu().clone() for t in fields()]
    want[5] = static.token_ring_host.clone()
    advance_decode_inputs_reference(logits.cpu(), *want, block_size=16)
    slot = static.ring_slot.item()
    tokens = torch.ops.ce.advance_decode_inputs(logits, *fields(), 16)
    torch.cuda.synchronize()
    assert tokens.tolist() == static.input_ids[:n].tolist() == [7, 8, 9, 0]
    assert static.token_ring_host[slot % static.token_ring_host.shape[0], :n].tolist() == [7, 8, 9, 0]
    for got, expected in zip(fields(), want):
        assert torch.equal(got.cpu(), expected)
    assert static.positions[:n].tolist() == [16, 21, 64, 0] and static.slot_mapping[:3].tolist() == [6 * 16, 4 * 16 + 5, 0]


# bf16 after the skinny GEMV (1 and 2 rows) and cuBLAS (64); fp32 (cuBLAS, fp32 loads) once.
@pytest.mark.parametrize("dtype, rows", cases(
    [(torch.bfloat16, 1), (torch.bfloat16, 2), (torch.bfloat16, 64), (torch.float32, 3)],
    quick=[(torch.bfloat16, 1)],
))
def test_argmax_matches_torch_after_lm_head_in_cuda_graph(rows, dtype):
    """ce::argmax of the lm_head's output (a PDL skinny GEMM before it, as in the decode graph) equals torch.argmax
    of the same logits, eager and replayed in a CUDA graph with new inputs; ties (the first index wins, across and
    inside chunks), a NaN (wins over +inf) and a row of -inf only follow torch's rule."""
    gen = _seeded(rows)
    hidden = _randn(gen, rows, 1024, dtype=dtype)
    lm_head = _randn(gen, 248320, 1024, dtype=dtype, scale=1024**-0.5)

    def step():
        logits = torch.ops.ce.linear(hidden, lm_head)
        return logits, torch.ops.ce.argmax(logits)

    logits, tokens = step()
    assert tokens.dtype == torch.long and torch.equal(tokens, torch.argmax(logits, dim=-1))
    special = _randn(gen, 4, 248320, dtype=dtype)
    special[0, [7, 200000]] = 40.0  # tie across chunks
    special[1, [5000, 5001]] = 40.0  # tie inside a chunk
    special[2, [9, 100]] = float("nan")
    special[2, 3] = float("inf")
    special[3] = float("-inf")
    assert torch.equal(torch.ops.ce.argmax(special), torch.argmax(special, dim=-1))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_logits, captured_tokens = step()
    for _ in range(2):
        hidden.copy_(_randn(gen, rows, 1024, dtype=dtype))
        graph.replay()
        assert torch.equal(captured_tokens, torch.argmax(captured_logits, dim=-1))


# (temperature, top_k, top_p, min_p) cycled over the rows of the ce::sample tests: greedy, plain, each filter, all
# of them, k > V, and the serving defaults (top-k 20 / top-p 0.95 and top-k 50 / top-p 0.8).
SAMPLE_CONFIGS = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 20, 0.95, 0.0), (1.2, 0, 0.9, 0.0),
                  (0.6, 40, 1.0, 0.05), (1.0, 1000, 0.8, 0.01), (1.5, 248320 + 5, 0.5, 0.0), (0.9, 0, 1.0, 0.2),
                  (1.0, 50, 0.8, 0.0), (2.0, 0, 0.99, 0.0)]


def _sample_params(rows: int, gen: torch.Generator, vocab: int = 248320):
    configs = [SAMPLE_CONFIGS[i % len(SAMPLE_CONFIGS)] for i in range(rows)]
    columns = list(zip(*configs))
    return (torch.tensor(columns[0], device=DEV), torch.tensor(columns[1], device=DEV).clamp(max=vocab + 5),
            torch.tensor(columns[2], device=DEV), torch.tensor(columns[3], device=DEV),
            torch.randint(-(2**62), 2**62, (rows,), generator=gen, device=DEV),
            torch.randint(0, 10**6, (rows,), generator=gen, device=DEV))


def _sample_on_cpu(logits, *params):
    """ce::sample's reference on the CPU: the GPU kernel must draw its tokens bit for bit across devices."""
    return sample.sample_reference(logits.cpu(), *(p.cpu() if torch.is_tensor(p) else p for p in params))


# bf16 (the served dtype: 4-bit radix passes over 16-bit keys) at 1 and 64 rows; fp32 (32-bit keys) at 8. Quick: one
# bf16 row.
@pytest.mark.parametrize("rows, dtype", cases(
    [(1, torch.bfloat16), (64, torch.bfloat16), (8, torch.float32)], quick=[(1, torch.bfloat16)],
))
def test_sample_matches_reference_after_lm_head_in_cuda_graph(rows, dtype):
    """ce::sample on V = 248,320 rows of the lm_head's output (strided rows; a PDL skinny GEMM before it, as in the
    decode graph) equals the reference token for token (the CPU reference first: bit-exact across devices; then the
    reference run on the GPU, quicker): greedy and sampled rows, every filter; ties at the k-th largest across
    chunks, -inf / NaN entries, the use_top_k / use_top_p switches, the radix passes alone (the row path off); eager,
    then replayed in a CUDA graph with new hidden states and counters. The sampled rows really sample (not all their
    tokens are the argmax)."""
    gen = _seeded(rows + 100)
    hidden = _randn(gen, rows, 1024, dtype=dtype)
    lm_head = _randn(gen, 248320 + 64, 1024, dtype=dtype, scale=2 * 1024**-0.5)
    params = _sample_params(rows, gen)

    def step():
        logits = torch.ops.ce.linear(hidden, lm_head)[:, :248320]
        return logits, torch.ops.ce.sample(logits, *params)

    logits, tokens = step()
    assert tokens.dtype == torch.long and torch.equal(tokens.cpu(), _sample_on_cpu(logits, *params))
    special = logits.clone()
    special[0, [7, 100000, 200000, 248319]] = special[0].max()  # tied maxima across chunks
    special[-1, ::1000] = special[-1].max()  # 249 ties at the top: top-k 20 / 40 cut inside them
    special[-1, 5] = float("nan")
    special[0, 3::7] = float("-inf")
    for flags in ((True, True), (False, True), (True, False)):  # (the reference on the GPU from here on: faster)
        want = sample.sample_reference(special, *params, *flags)
        assert torch.equal(torch.ops.ce.sample(special, *params, *flags), want), flags
        radix_only = sample_kernels.sample(special, *params, *flags, row_candidates=0)
        assert torch.equal(radix_only, want), flags
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_logits, captured_tokens = step()
    non_argmax = 0
    for _ in range(3):
        hidden.copy_(_randn(gen, rows, 1024, dtype=dtype))
        params[5].add_(1)  # the next output position: new noise
        graph.replay()
        want = sample.sample_reference(captured_logits, *params)
        assert torch.equal(captured_tokens, want)
        non_argmax += (want != captured_logits.float().argmax(-1)).sum().item()
    assert rows < 8 or non_argmax > 0


def test_sample_many_small_rows_and_batch_invariance():
    """5,000 rows of 40 logits (bf16, on a coarse grid: ties everywhere) with every configuration equal the CPU
    reference token for token; and a row of a batch of 64 (V = 248,320) draws the same token alone."""
    gen = _seeded(7)
    rows, vocab = 5000, 40
    logits = (_randn(gen, rows, vocab, scale=2.0) * 2).round().to(torch.bfloat16)
    params = _sample_params(rows, gen, vocab)
    tokens = torch.ops.ce.sample(logits, *params)
    assert torch.equal(tokens.cpu(), _sample_on_cpu(logits, *params))
    big = _randn(gen, 64, 248320, dtype=torch.bfloat16, scale=3.0)
    big_params = _sample_params(64, gen)
    together = torch.ops.ce.sample(big, *big_params)
    for i in (0, 2, 5, 63):
        alone = torch.ops.ce.sample(big[i : i + 1], *(p[i : i + 1] for p in big_params))
        assert alone.item() == together[i].item()


def test_linear_chain_with_pdl_in_cuda_graph():
    """Back-to-back skinny GEMMs, each reading the one before (launched with PDL where the GPU has it), replayed
    in a CUDA graph: every output equals the eager chain's, so no kernel read its x before the previous wrote it."""
    gen = _seeded(21)
    weights = [_randn(gen, 1024, 1024, dtype=torch.bfloat16, scale=1024**-0.5) for _ in range(6)]
    x = _randn(gen, 1, 1024, dtype=torch.bfloat16)

    def chain(h):
        outs = []
        for i, w in enumerate(weights):
            h = torch.ops.ce.silu_mul_linear(torch.cat([h, h], dim=-1), w) if i % 2 else torch.ops.ce.linear(h, w)
            outs.append(h)
        return outs

    chain(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = chain(x)
    for _ in range(3):
        x.copy_(_randn(gen, 1, 1024, dtype=torch.bfloat16))
        graph.replay()
        for got, want in zip(outs, chain(x)):
            torch.testing.assert_close(got, want, atol=0, rtol=0)


# ----------------------------------------------------------------------------------------------------------------
# CUDA-graph capture of the decode ops (no host syncs, static grid) and opcheck of every op
# ----------------------------------------------------------------------------------------------------------------


@QUICK
def test_decode_ops_replay_in_cuda_graph_with_new_inputs():
    """Capture one decode step's ops, then refill the static inputs (new contexts, slots, values) and replay.

    A host sync inside an op would fail the capture; a grid or split count derived from the first call's values
    would give wrong results on the replay with longer contexts.
    """
    gen = _seeded(11)
    batch, hq, hkv, d, bs, max_blocks = 8, 8, 2, 256, 16, 64
    hk, hv, dk, dv = LINEAR_LAYOUTS[0]
    channels, num_slots, num_blocks = 6144, batch + 2, batch * max_blocks + 1
    bf16 = torch.bfloat16
    k_cache = _randn(gen, num_blocks, bs, hkv, d, dtype=bf16)
    v_cache = _randn(gen, num_blocks, bs, hkv, d, dtype=bf16)
    conv_state = _randn(gen, num_slots, channels, CONV_WIDTH - 1, dtype=bf16)
    rec_state = _randn(gen, num_slots, hv, dk, dv, scale=0.3)
    weight = _randn(gen, channels, CONV_WIDTH, dtype=bf16, scale=0.5)
    A_log, dt_bias = _randn(gen, hv, scale=0.5), _randn(gen, hv)
    tables = (torch.arange(batch * max_blocks, device=DEV, dtype=torch.int32) + 1).view(batch, max_blocks)
    static = {
        "q": _randn(gen, batch, hq, d, dtype=bf16), "key": _randn(gen, batch, hkv, d, dtype=bf16),
        "value": _randn(gen, batch, hkv, d, dtype=bf16), "x": _randn(gen, batch, channels, dtype=bf16),
        "lq": _randn(gen, batch, hk, dk, dtype=bf16), "lk": _randn(gen, batch, hk, dk, dtype=bf16),
        "lv": _randn(gen, batch, hv, dv, dtype=bf16), "a": _randn(gen, batch, hv, dtype=bf16),
        "b": _randn(gen, batch, hv, dtype=bf16),
        "context_lens": torch.full((batch,), 3, dtype=torch.int32, device=DEV),
        "slots": torch.arange(1, batch + 1, dtype=torch.int32, device=DEV),
    }

    def step(s, kc, vc, cs, rs):
        lens = s["context_lens"]
        pos = (lens - 1).clamp_min(0).long()
        rows = tables.gather(1, (pos // bs)[:, None].to(torch.int64))[:, 0].long() * bs + pos % bs
        torch.ops.ce.store_kv(s["key"], s["value"], kc, vc, rows)
        attn = torch.ops.ce.paged_attention_decode(s["q"], kc, vc, tables, lens, d**-0.5)
        conv = torch.ops.ce.causal_conv1d_decode(s["x"], weight, cs, s["slots"])
        rec = torch.ops.ce.gated_delta_rule_decode(s["lq"], s["lk"], s["lv"], s["a"], s["b"], A_log, dt_bias, rs,
                                                   s["slots"])
        return attn, conv, rec

    step(static, k_cache, v_cache, conv_state, rec_state)  # compile the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step(static, k_cache, v_cache, conv_state, rec_state)

    for context in ([1000, 1, 0, 517, 1024, 33, 250, 999], [5, 700, 64, 1, 0, 1023, 16, 17]):
        fresh = {name: (torch.randn(t.shape, generator=gen, device=DEV).to(t.dtype) if t.is_floating_point() else t)
                 for name, t in static.items()}
        fresh["context_lens"] = torch.tensor(context, dtype=torch.int32, device=DEV)
        fresh["slots"] = _live_slots(gen, batch, num_slots)
        refs = [t.clone() for t in (k_cache, v_cache, conv_state, rec_state)]
        # Reference step on clones: references for every op, through the same step function.
        want = _reference_step(fresh, tables, *refs, weight, A_log, dt_bias, d, bs)
        for name, t in static.items():
            t.copy_(fresh[name])
        graph.replay()
        live = fresh["context_lens"] > 0
        torch.testing.assert_close(outs[0][live], want[0][live], **TOL[bf16])
        assert torch.all(outs[0][~live] == 0)
        torch.testing.assert_close(outs[1], want[1], **TOL[bf16])
        torch.testing.assert_close(outs[2], want[2], **TOL[bf16])
        torch.testing.assert_close(k_cache[1:], refs[0][1:], atol=0, rtol=0)
        torch.testing.assert_close(v_cache[1:], refs[1][1:], atol=0, rtol=0)
        torch.testing.assert_close(conv_state, refs[2], atol=0, rtol=0)
        torch.testing.assert_close(rec_state, refs[3], atol=1e-4, rtol=1e-4)


def _reference_step(s, tables, kc, vc, cs, rs, weight, A_log, dt_bias, d, bs):
    lens = s["context_lens"]
    pos = (lens - 1).clamp_min(0).long()
    rows = tables.gather(1, (pos // bs)[:, None].to(torch.int64))[:, 0].long() * bs + pos % bs
    kv_cache.store_kv_reference(s["key"], s["value"], kc, vc, rows)
    attn = paged_attention.paged_attention_decode_reference(s["q"], kc, vc, tables, lens, d**-0.5)
    conv = conv1d.causal_conv1d_decode_reference(s["x"], weight, cs, s["slots"])
    rec = delta_rule.gated_delta_rule_decode_reference(s["lq"], s["lk"], s["lv"], s["a"], s["b"], A_log, dt_bias, rs,
                                                       s["slots"])
    return attn, conv, rec


def _opcheck_cases():
    gen = _seeded(3)
    bf16 = torch.bfloat16
    hq, hkv, d, bs = 8, 2, 256, 16
    k_cache = _randn(gen, 9, bs, hkv, d, dtype=bf16)
    v_cache = _randn(gen, 9, bs, hkv, d, dtype=bf16)
    tables = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0], [0, 0, 0, 0]], dtype=torch.int32, device=DEV)
    decode_lens = torch.tensor([40, 20, 0], dtype=torch.int32, device=DEV)
    hk, hv, dk, dv = LINEAR_LAYOUTS[0]  # the prefill's FLA autotune key is then the bf16 reference test's
    channels = 96
    cu = torch.tensor([0, 5, 6, 40], dtype=torch.int32, device=DEV)
    slots3 = torch.tensor([2, 1, 3], dtype=torch.int32, device=DEV)
    q, k, v, a, b, A_log, dt_bias = _gdr_inputs(gen, 40, (hk, hv, dk, dv), bf16)
    qd, kd, vd, ad, bd, _, _ = _gdr_inputs(gen, 3, (hk, hv, dk, dv), bf16)
    fused = _gated_deltanet_inputs(gen, 3, (hk, hv, dk, dv), bf16, torch.float32, 4, strided=True)
    return {
        "store_kv": (torch.ops.ce.store_kv.default,
                     (_randn(gen, 3, hkv, d, dtype=bf16), _randn(gen, 3, hkv, d, dtype=bf16), k_cache.clone(),
                      v_cache.clone(), torch.tensor([17, 40, 3], device=DEV))),
        "paged_attention_decode": (torch.ops.ce.paged_attention_decode.default,
                                   (_randn(gen, 3, hq, d, dtype=bf16), k_cache, v_cache, tables,
                                    torch.tensor([40, 20, 0], dtype=torch.int32, device=DEV), d**-0.5)),
        # wider tables (null-block columns): up to 256 tokens, so the kernel splits the context (4 splits at batch 3)
        # and the reduce kernel runs
        "attention_decode": (torch.ops.ce.attention_decode.default,
                             tuple(_attention_decode_args(gen, (hq, hkv, d), F.pad(tables, (0, 12)), decode_lens, bs, 9,
                                                          bf16))),
        "attention_prologue": (torch.ops.ce.attention_prologue.default,
                               tuple(_attention_decode_args(gen, (hq, hkv, d), tables, decode_lens, bs, 9, bf16)[:9])
                               + (hq, hkv, d)),
        "paged_attention_prefill": (torch.ops.ce.paged_attention_prefill.default,
                                    (_randn(gen, 12, hq, d, dtype=bf16), k_cache, v_cache,
                                     torch.tensor([0, 10, 12], dtype=torch.int32, device=DEV),
                                     torch.tensor([40, 20], dtype=torch.int32, device=DEV), tables[:2], d**-0.5)),
        # 2 sequences x 3 rows: few enough that the kernel runs each row as a decode query (verify_by_rows); the
        # output gate a strided view, as the attention layer passes it
        "paged_attention_verify": (torch.ops.ce.paged_attention_verify.default,
                                   (_randn(gen, 6, hq, d, dtype=bf16), k_cache, v_cache,
                                    torch.tensor([40, 20], dtype=torch.int32, device=DEV), tables[:2], 3, d**-0.5,
                                    _randn(gen, 6, hq, 2 * d, dtype=bf16)[..., d:])),
        "causal_conv1d_prefill": (torch.ops.ce.causal_conv1d_prefill.default,
                                  (_randn(gen, 40, channels, dtype=bf16), _randn(gen, channels, 4, dtype=bf16),
                                   _randn(gen, 4, channels, 3, dtype=bf16), cu, slots3,
                                   [channels // 4, channels // 4, channels // 2])),
        "causal_conv1d_decode": (torch.ops.ce.causal_conv1d_decode.default,
                                 (_randn(gen, 3, channels, dtype=bf16), _randn(gen, channels, 4, dtype=bf16),
                                  _randn(gen, 4, channels, 3, dtype=bf16), slots3)),
        "gated_delta_rule_prefill": (torch.ops.ce.gated_delta_rule_prefill.default,
                                     (q, k, v, a, b, A_log, dt_bias, _randn(gen, 4, hv, dk, dv, scale=0.3), cu,
                                      slots3)),
        "gated_delta_rule_decode": (torch.ops.ce.gated_delta_rule_decode.default,
                                    (qd, kd, vd, ad, bd, A_log, dt_bias, _randn(gen, 4, hv, dk, dv, scale=0.3),
                                     slots3)),
        "gated_deltanet_decode": (torch.ops.ce.gated_deltanet_decode.default,
                                  (*fused, slots3, hk, dk, hv, dv, 1e-6)),
        "linear": (torch.ops.ce.linear.default, (_randn(gen, 2, 256, dtype=bf16), _randn(gen, 512, 256, dtype=bf16))),
        "silu_mul": (torch.ops.ce.silu_mul.default, (_randn(gen, 5, 2 * 3584 + 64, dtype=bf16)[:, 32:-32],)),
        "add_rms_norm": (torch.ops.ce.add_rms_norm.default,
                         (_randn(gen, 3, 1024, dtype=bf16), _randn(gen, 3, 1024, dtype=bf16), _randn(gen, 1024, dtype=bf16),
                          1e-6)),
        "add_rms_norm_linear": (torch.ops.ce.add_rms_norm_linear.default,
                                (_randn(gen, 2, 1024, dtype=bf16), _randn(gen, 2, 1024, dtype=bf16),
                                 _randn(gen, 1024, dtype=bf16), 1e-6, _randn(gen, 7168, 1024, dtype=bf16))),
        "add_rms_norm_linear_one_row": (torch.ops.ce.add_rms_norm_linear.default,  # the norm in the GEMV's prologue
                                        (_randn(gen, 1, 1024, dtype=bf16), _randn(gen, 1, 1024, dtype=bf16),
                                         _randn(gen, 1024, dtype=bf16), 1e-6, _randn(gen, 7168, 1024, dtype=bf16))),
        "silu_mul_linear": (torch.ops.ce.silu_mul_linear.default,
                            (_randn(gen, 2, 2 * 3584, dtype=bf16), _randn(gen, 1024, 3584, dtype=bf16))),
        "add_rms_norm_linear_silu_mul": (torch.ops.ce.add_rms_norm_linear_silu_mul.default,
                                         (_randn(gen, 2, 1024, dtype=bf16), _randn(gen, 2, 1024, dtype=bf16),
                                          _randn(gen, 1024, dtype=bf16), 1e-6, _randn(gen, 7168, 1024, dtype=bf16))),
        "add_rms_norm_linear_silu_mul_one_row": (torch.ops.ce.add_rms_norm_linear_silu_mul.default,
                                                 (_randn(gen, 1, 1024, dtype=bf16), _randn(gen, 1, 1024, dtype=bf16),
                                                  _randn(gen, 1024, dtype=bf16), 1e-6,
                                                  _randn(gen, 7168, 1024, dtype=bf16))),
        "rms_norm": (torch.ops.ce.rms_norm.default,
                     (_randn(gen, 5, 16, 256, dtype=bf16)[..., :128], _randn(gen, 128, dtype=bf16),
                      _randn(gen, 5, 16, 128, dtype=bf16), 1e-6, False)),
        "argmax": (torch.ops.ce.argmax.default, (_randn(gen, 3, 248320 + 64, dtype=bf16)[:, :248320],)),
        "sample": (torch.ops.ce.sample.default,
                   (_randn(gen, 3, 248320 + 64, dtype=bf16)[:, :248320], *_sample_params(3, gen), True, True)),
        "advance_decode_inputs": (
            torch.ops.ce.advance_decode_inputs.default,
            (_randn(gen, 3, 248320, dtype=bf16),)
            + tuple(t.to(DEV) for t in (torch.tensor([5, 6, 7]), torch.tensor([15, 9, 0]), torch.tensor([40, 17, 0]),
                                      torch.tensor([16, 10, 0], dtype=torch.int32),
                                      torch.tensor([[2, 5], [1, 3], [0, 0]], dtype=torch.int32),
                                      torch.zeros(4, 16, dtype=torch.long), torch.tensor([1]))) + (16,),
        ),
    }


OPCHECK_NAMES = ["store_kv", "paged_attention_decode", "attention_decode", "attention_prologue",
                 "paged_attention_prefill",
                 "paged_attention_verify",
                 "causal_conv1d_prefill",
                 "causal_conv1d_decode", "gated_delta_rule_prefill", "gated_delta_rule_decode", "gated_deltanet_decode",
                 "linear", "rms_norm",
                 "silu_mul", "silu_mul_linear", "add_rms_norm", "add_rms_norm_linear", "add_rms_norm_linear_one_row",
                 "add_rms_norm_linear_silu_mul", "add_rms_norm_linear_silu_mul_one_row", "argmax",
                 "advance_decode_inputs", "sample"]


@pytest.mark.parametrize("name", OPCHECK_NAMES)
def test_opcheck_on_cuda(name):
    op, args = _opcheck_cases()[name]
    torch.library.opcheck(op, args)


KERNEL_NAMES = {
    "store_kv": "_store_kv_kernel",
    "paged_attention_decode": "_paged_decode_kernel",
    "attention_decode": "_attention_decode_kernel",
    "attention_prologue": "_attention_prologue_kernel",
    "paged_attention_prefill": "_paged_prefill_kernel",
    "paged_attention_verify": "_paged_decode_kernel",
    "causal_conv1d_prefill": "_conv_prefill_out_kernel",
    "causal_conv1d_decode": "_conv_decode_kernel",
    "gated_delta_rule_prefill": "gated_delta_rule_fwd",  # FLA's kernels (chunk_..., or fused_recurrent_... when short)
    "gated_delta_rule_decode": "_gdr_decode_kernel",
    "gated_deltanet_decode": "_gated_deltanet_decode_kernel",
    "linear": "_skinny_gemm_kernel",  # 2 rows of bf16 (at most SKINNY_MAX_ROWS)
    "rms_norm": "_rms_norm_kernel",
    "silu_mul": "_silu_mul_kernel",
    "silu_mul_linear": "_skinny_gemm_kernel",
    "add_rms_norm": "_add_rms_norm_kernel",
    "add_rms_norm_linear": "_skinny_gemm_kernel",  # after _add_rms_norm_kernel: 2 rows
    "add_rms_norm_linear_one_row": "_skinny_gemm_kernel",
    "add_rms_norm_linear_silu_mul": "_skinny_gemm_kernel",  # after _add_rms_norm_kernel: 2 rows
    "add_rms_norm_linear_silu_mul_one_row": "_skinny_gemm_kernel",
    "argmax": "_argmax_chunks_kernel",
    "sample": "_sample_final_kernel",
    "advance_decode_inputs": "_next_decode_inputs_kernel",
}


@pytest.mark.parametrize("name", OPCHECK_NAMES)
def test_cuda_op_runs_our_kernel(name):
    """The CUDA dispatch of each op launches its Triton/FLA kernel, not the plain-torch reference fallback."""
    op, args = _opcheck_cases()[name]
    op(*args)  # compile outside the profiled region
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        op(*args)
        torch.cuda.synchronize()
    launched = {event.name for event in prof.events()}
    assert any(KERNEL_NAMES[name] in kernel for kernel in launched), sorted(launched)

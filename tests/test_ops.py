"""The ``torch.ops.ce`` ops on CPU: opcheck, and hypothesis tests against independent oracles.

Oracles (none of them shares code with ops/):
  * gated delta rule: a float64 token-by-token loop written from docs/ARCHITECTURE.md "Model math", and HF transformers'
    torch chunked/recurrent gated delta rule; plus the internal ``chunked_reference`` ≡ ``recurrent_reference``;
  * causal conv1d: ``torch.nn.functional.conv1d`` in float64 with left zero padding (or the slot's history), SiLU;
  * fused Gated DeltaNet decode: the conv and delta-rule oracles and the gated norm's formula, composed;
  * paged attention: ``torch.nn.functional.scaled_dot_product_attention`` in float64 over dense K/V;
  * fused attention decode: the model's unfused decode ops (bitwise), and the norm, RoPE, SDPA and gate formulas in
    float64;
  * store_kv: reading rows back;
  * linear: a float64 matmul;
  * rms_norm: the norm's formula in float64 (docs/ARCHITECTURE.md "Model math"), and the compiled path against the eager one;
  * silu_mul: ``x * sigmoid(x) * up`` in float64.
In-place ops also must not touch pool rows outside the batch (``torch.equal``), and padding lanes (slot 0 / block 0)
write nothing but the null row.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import ops
from ops import NULL_BLOCK, NULL_SLOT
from ops import delta_rule as dr
from ops.activation import silu_mul
from ops.linear import SKINNY_MAX_ROWS, linear, silu_mul_linear
from ops.linear import add_rms_norm_linear_op, add_rms_norm_linear_silu_mul_op
from ops.norm import rms_norm

ce = torch.ops.ce

# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------

SEEDS = st.integers(0, 2**31 - 1)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g: torch.Generator, *shape: int, scale: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def _cu_seqlens(lengths) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def _live_slots(g: torch.Generator, n: int, num_slots: int) -> torch.Tensor:
    """n distinct random slots, never the null slot 0."""
    return (torch.randperm(num_slots - 1, generator=g)[:n] + 1).to(torch.int32)


def _assert_rows_unchanged(before: torch.Tensor, after: torch.Tensor, touched) -> None:
    """Rows of a pool (dim 0) not in ``touched`` are bit-identical."""
    keep = torch.ones(before.shape[0], dtype=torch.bool)
    keep[torch.as_tensor(list(touched), dtype=torch.long)] = False
    assert torch.equal(before[keep], after[keep]), "the op wrote rows outside the batch"


def _tol(dtype: torch.dtype) -> dict:
    return {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}[dtype]


def _opcheck(op, args) -> None:
    # test_autograd_registration is meaningless here (no autograd formulas: inference only) but harmless.
    torch.library.opcheck(op, args)


# --------------------------------------------------------------------------------------------------------------
# gated delta rule
# --------------------------------------------------------------------------------------------------------------


def _delta_inputs(g, T, Hk, Hv, K, V, dtype=torch.float32, qk_scale=1.0):
    """Raw (pre-l2norm) inputs. ``qk_scale=1e-3`` makes |q|^2, |k|^2 ~ 1e-5: the l2norm eps (1e-6) then matters."""
    return dict(
        q=_randn(g, T, Hk, K, scale=qk_scale, dtype=dtype),
        k=_randn(g, T, Hk, K, scale=qk_scale, dtype=dtype),
        v=_randn(g, T, Hv, V, dtype=dtype),
        a=_randn(g, T, Hv, dtype=dtype),
        b=_randn(g, T, Hv, scale=1.5, dtype=dtype),
        A_log=torch.empty(Hv).uniform_(0.05, 3.0, generator=g).log(),  # decay rate 0.05 .. 3 per softplus unit
        dt_bias=_randn(g, Hv, scale=0.5),
    )


def _delta_oracle(q, k, v, a, b, A_log, dt_bias, state):
    """Float64 token-by-token gated delta rule, written from docs/ARCHITECTURE.md (not from ops/). -> (o [L,Hv,V], state)."""
    q, k, v, a, b, A_log, dt_bias = (x.double() for x in (q, k, v, a, b, A_log, dt_bias))
    S = state.double().clone()
    L, Hk, K = q.shape
    Hv = v.shape[1]
    key_head = torch.arange(Hv) // (Hv // Hk)  # value head j reads key head j // r
    out = torch.zeros(v.shape, dtype=torch.float64)
    for t in range(L):
        qt, kt = q[t, key_head], k[t, key_head]  # [Hv, K]
        qt = qt / torch.sqrt((qt * qt).sum(-1, keepdim=True) + 1e-6) / math.sqrt(K)
        kt = kt / torch.sqrt((kt * kt).sum(-1, keepdim=True) + 1e-6)
        decay = torch.exp(-torch.exp(A_log) * F.softplus(a[t] + dt_bias))  # [Hv]
        beta = torch.sigmoid(b[t])
        S = S * decay[:, None, None]
        u = (v[t] - (S * kt[:, :, None]).sum(1)) * beta[:, None]  # (float64 einsum is ~1 ms a call on CPU)
        S = S + kt[:, :, None] * u[:, None, :]
        out[t] = (S * qt[:, :, None]).sum(1)
    return out, S


def _split(x: dict, start: int, end: int) -> dict:
    return {n: (t[start:end] if n not in ("A_log", "dt_bias") else t) for n, t in x.items()}


HEADS = st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 2, 3]))  # (Hk, r): Hv = r * Hk
LENGTHS = st.one_of(st.sampled_from([1, 2, 63, 64, 65, 130]), st.integers(1, 140))
QK_SCALES = st.sampled_from([1.0, 1e-3])


@given(length=LENGTHS, heads=HEADS, K=st.sampled_from([8, 16]), V=st.sampled_from([8, 32]), qk_scale=QK_SCALES,
       seed=SEEDS)
def test_chunked_reference_equals_recurrent_reference(length, heads, K, V, qk_scale, seed):
    Hk, r = heads
    g = _gen(seed)
    x = _delta_inputs(g, length, Hk, r * Hk, K, V, qk_scale=qk_scale)
    q, k, gate, beta = dr.prepare_inputs(x["q"], x["k"], x["a"], x["b"], x["A_log"], x["dt_bias"], r * Hk)
    state = _randn(g, r * Hk, K, V, scale=0.5)
    o_rec, s_rec = dr.recurrent_reference(q, k, x["v"], gate, beta, state)
    o_chk, s_chk = dr.chunked_reference(q, k, x["v"], gate, beta, state)
    torch.testing.assert_close(o_chk, o_rec, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s_chk, s_rec, atol=1e-4, rtol=1e-4)
    # and the internal reference equals the independent float64 oracle
    o_ref, s_ref = _delta_oracle(**x, state=state)
    torch.testing.assert_close(o_rec.double(), o_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s_rec.double(), s_ref, atol=1e-4, rtol=1e-4)


@given(
    lengths=st.lists(LENGTHS, min_size=1, max_size=4),
    padding=st.lists(st.integers(0, 5), max_size=3),
    heads=HEADS,
    qk_scale=QK_SCALES,
    seed=SEEDS,
    pool_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_gated_delta_rule_prefill_varlen(lengths, padding, heads, qk_scale, seed, pool_dtype):
    """Packed varlen prefill ≡ the float64 oracle per sequence ≡ each sequence alone; pool rows outside untouched.

    Padding sequences (``padding``: their lengths, empty or not) point at the null slot: each ≡ the oracle from a zero
    state, whatever the null slot holds, and none writes the pool.
    """
    Hk, r = heads
    Hv, K, V = r * Hk, 16, 32
    g = _gen(seed)
    all_lengths = lengths + padding
    x = _delta_inputs(g, sum(all_lengths), Hk, Hv, K, V, qk_scale=qk_scale)
    num_slots = len(lengths) + 3
    pool = _randn(g, num_slots, Hv, K, V, scale=0.5, dtype=pool_dtype)  # the null slot's row too: not zeros
    slots = torch.cat([_live_slots(g, len(lengths), num_slots),
                       torch.full((len(padding),), NULL_SLOT, dtype=torch.int32)])
    cu = _cu_seqlens(all_lengths)
    before = pool.clone()
    out = ce.gated_delta_rule_prefill(**x, state=pool, cu_seqlens=cu, state_slots=slots)
    assert out.shape == x["v"].shape and out.dtype == x["v"].dtype
    _assert_rows_unchanged(before, pool, slots[: len(lengths)].tolist())
    assert torch.equal(before[NULL_SLOT], pool[NULL_SLOT])  # padding writes nothing
    for i in range(len(lengths), len(all_lengths)):
        s, e = cu[i].item(), cu[i + 1].item()
        o_ref, _ = _delta_oracle(**_split(x, s, e), state=torch.zeros_like(before[NULL_SLOT]))
        torch.testing.assert_close(out[s:e].double(), o_ref, atol=1e-4, rtol=1e-4)
    tol = dict(atol=1e-4, rtol=1e-4) if pool_dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for i, slot in enumerate(slots[: len(lengths)].tolist()):
        s, e = cu[i].item(), cu[i + 1].item()
        o_ref, s_ref = _delta_oracle(**_split(x, s, e), state=before[slot])
        torch.testing.assert_close(out[s:e].double(), o_ref, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(pool[slot].double(), s_ref.to(pool_dtype).double(), **tol)
        # the same sequence alone, in a fresh copy of the pool
        alone = before.clone()
        o_alone = ce.gated_delta_rule_prefill(
            **_split(x, s, e), state=alone, cu_seqlens=_cu_seqlens([e - s]), state_slots=slots[i : i + 1]
        )
        torch.testing.assert_close(o_alone, out[s:e], atol=1e-5, rtol=1e-5)
        same = dict(atol=1e-5, rtol=1e-5) if pool_dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)  # 1 ulp
        torch.testing.assert_close(alone[slot], pool[slot], **same)


@given(
    prefix=st.lists(st.one_of(st.sampled_from([1, 63, 64, 65]), st.integers(1, 80)), min_size=1, max_size=3),
    steps=st.integers(1, 5),
    padding=st.integers(0, 2),
    continue_with=st.sampled_from(["decode", "prefill"]),
    heads=HEADS,
    seed=SEEDS,
)
def test_gated_delta_rule_prefill_then_continue_equals_one_prefill(prefix, steps, padding, continue_with, heads, seed):
    """Prefill n tokens, then m decode steps (batched, with padding lanes) or a second prefill chunk of m tokens
    ≡ one prefill of n + m tokens: outputs and final states."""
    Hk, r = heads
    Hv, K, V = r * Hk, 16, 32
    g = _gen(seed)
    n_seq = len(prefix)
    seqs = [_delta_inputs(g, n + steps, Hk, Hv, K, V) for n in prefix]
    shared = {"A_log": seqs[0]["A_log"], "dt_bias": seqs[0]["dt_bias"]}
    for s in seqs:
        s.update(shared)
    num_slots = n_seq + 2
    init = _randn(g, num_slots, Hv, K, V, scale=0.5)
    slots = _live_slots(g, n_seq, num_slots)

    def pack(parts):
        return {n: (torch.cat([p[n] for p in parts]) if n not in shared else shared[n]) for n in parts[0]}

    # one prefill of n + m tokens
    whole_pool = init.clone()
    whole = ce.gated_delta_rule_prefill(
        **pack(seqs), state=whole_pool, cu_seqlens=_cu_seqlens([n + steps for n in prefix]), state_slots=slots
    )
    # prefill n, then continue
    pool = init.clone()
    first = ce.gated_delta_rule_prefill(
        **pack([_split(s, 0, n) for s, n in zip(seqs, prefix)]), state=pool, cu_seqlens=_cu_seqlens(prefix),
        state_slots=slots,
    )
    before_continue = pool.clone()
    pad_slots = torch.full((padding,), NULL_SLOT, dtype=torch.int32)
    if continue_with == "decode":
        rest = []
        for t in range(steps):
            lanes = [_split(s, n + t, n + t + 1) for s, n in zip(seqs, prefix)]
            lanes += [_split(_delta_inputs(g, 1, Hk, Hv, K, V), 0, 1) for _ in range(padding)]  # padding lanes
            batch = {k: v for k, v in pack(lanes).items()}
            rest.append(ce.gated_delta_rule_decode(**batch, state=pool, state_slots=torch.cat([slots, pad_slots])))
        rest_by_seq = [torch.stack([step[i] for step in rest]) for i in range(n_seq)]
    else:
        lanes = [_split(s, n, n + steps) for s, n in zip(seqs, prefix)]
        out = ce.gated_delta_rule_prefill(
            **pack(lanes), state=pool, cu_seqlens=_cu_seqlens([steps] * n_seq + [0] * padding),
            state_slots=torch.cat([slots, pad_slots]),
        )
        rest_by_seq = list(out.split(steps))
    touched = slots.tolist() + ([NULL_SLOT] if padding and continue_with == "decode" else [])
    _assert_rows_unchanged(before_continue, pool, touched)
    bounds = _cu_seqlens([n + steps for n in prefix]).tolist()
    first_bounds = _cu_seqlens(prefix).tolist()
    for i, n in enumerate(prefix):
        w = whole[bounds[i] : bounds[i + 1]]
        torch.testing.assert_close(first[first_bounds[i] : first_bounds[i + 1]], w[:n], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rest_by_seq[i], w[n:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pool[slots.long()], whole_pool[slots.long()], atol=1e-4, rtol=1e-4)


@given(batch=st.integers(1, 4), padding=st.integers(0, 3), heads=HEADS, qk_scale=QK_SCALES, seed=SEEDS,
       pool_dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_gated_delta_rule_decode_matches_oracle(batch, padding, heads, qk_scale, seed, pool_dtype):
    """One decode step ≡ the float64 oracle from each slot's state; a padding lane (the null slot) ≡ the oracle from
    a zero state, and writes no state at all, the null slot's included."""
    Hk, r = heads
    Hv, K, V = r * Hk, 16, 32
    g = _gen(seed)
    x = _delta_inputs(g, batch + padding, Hk, Hv, K, V, qk_scale=qk_scale)
    num_slots = batch + 3
    pool = _randn(g, num_slots, Hv, K, V, scale=0.5, dtype=pool_dtype)
    slots = torch.cat([_live_slots(g, batch, num_slots), torch.full((padding,), NULL_SLOT, dtype=torch.int32)])
    before = pool.clone()
    out = ce.gated_delta_rule_decode(**x, state=pool, state_slots=slots)
    assert out.shape == x["v"].shape and out.dtype == x["v"].dtype
    _assert_rows_unchanged(before, pool, slots[:batch].tolist())
    for i, slot in enumerate(slots[:batch].tolist()):
        o_ref, s_ref = _delta_oracle(**_split(x, i, i + 1), state=before[slot])
        torch.testing.assert_close(out[i : i + 1].double(), o_ref, atol=1e-5, rtol=1e-5)
        tol = dict(atol=1e-5, rtol=1e-5) if pool_dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(pool[slot], s_ref.to(pool_dtype), **tol)
    for i in range(batch, batch + padding):
        o_ref, _ = _delta_oracle(**_split(x, i, i + 1), state=torch.zeros_like(before[NULL_SLOT]))
        torch.testing.assert_close(out[i : i + 1].double(), o_ref, atol=1e-5, rtol=1e-5)


def test_gated_delta_rule_matches_hf_torch_kernels():
    """Our prefill and decode ≡ HF transformers' torch chunked / recurrent gated delta rule (the oracle's code)."""
    from tests import hf_models  # noqa: F401  (FLA hidden first)
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    g = _gen(0)
    T, Hk, r, K, V = 70, 2, 2, 16, 32
    Hv = r * Hk
    x = _delta_inputs(g, T + 1, Hk, Hv, K, V)
    state0 = _randn(g, Hv, K, V, scale=0.5)
    gate = -x["A_log"].exp() * F.softplus(x["a"] + x["dt_bias"])
    beta = x["b"].sigmoid()
    qh = x["q"].repeat_interleave(r, dim=1)[None]
    kh = x["k"].repeat_interleave(r, dim=1)[None]
    hf_out, hf_state = m.torch_chunk_gated_delta_rule(
        qh[:, :T], kh[:, :T], x["v"][None, :T], g=gate[None, :T], beta=beta[None, :T],
        initial_state=state0[None].clone(), output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    hf_step, hf_state2 = m.torch_recurrent_gated_delta_rule(
        qh[:, T:], kh[:, T:], x["v"][None, T:], g=gate[None, T:], beta=beta[None, T:],
        initial_state=hf_state.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    pool = torch.zeros(2, Hv, K, V)
    pool[1] = state0
    slot = torch.tensor([1], dtype=torch.int32)
    out = ce.gated_delta_rule_prefill(**_split(x, 0, T), state=pool, cu_seqlens=_cu_seqlens([T]), state_slots=slot)
    torch.testing.assert_close(out, hf_out[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pool[1], hf_state[0], atol=1e-4, rtol=1e-4)
    step = ce.gated_delta_rule_decode(**_split(x, T, T + 1), state=pool, state_slots=slot)
    torch.testing.assert_close(step, hf_step[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pool[1], hf_state2[0], atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------------------------------------------
# causal conv1d
# --------------------------------------------------------------------------------------------------------------


def _conv_oracle(history: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(depthwise causal conv) in float64 via F.conv1d. history [C, W-1] (pre-conv inputs), x [L, C] -> [L, C]."""
    C, W = weight.shape
    inp = torch.cat([history.double(), x.double().t()], dim=1)[None]  # [1, C, W-1+L]
    return F.silu(F.conv1d(inp, weight.double()[:, None, :], groups=C))[0].t()


@given(
    lengths=st.lists(st.one_of(st.sampled_from([1, 2, 3, 4, 5, 64, 65]), st.integers(1, 40)), min_size=1, max_size=4),
    pad_lengths=st.lists(st.sampled_from([0, 1]), max_size=2),
    sections=st.sampled_from([[4, 0, 0], [24, 0, 0], [8, 8, 8], [4, 4, 16], [0, 16, 8]]),
    width=st.sampled_from([2, 4]),
    fresh=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
def test_causal_conv1d_prefill(lengths, pad_lengths, sections, width, fresh, dtype, seed):
    """Varlen prefill ≡ F.conv1d (float64) with left zero padding (fresh slot) or the slot's history, + SiLU, split
    along the channels into its sections; the state written back is the last W-1 pre-conv inputs; rows outside the
    batch untouched; padding lanes (zero- or one-token, on the null slot) write nothing but the null slot."""
    _check_conv_prefill(lengths, pad_lengths, sections, width, fresh, dtype, seed)


def test_causal_conv1d_prefill_zero_length_lane():
    """Regression: a zero-length sequence in cu_seqlens used to crash the reference (unfold of W-1 rows, size W)."""
    _check_conv_prefill([3, 5], [0, 0], sections=[4, 0, 0], width=4, fresh=False, dtype=torch.float32, seed=0)
    _check_conv_prefill([1], [0], sections=[2, 2, 0], width=2, fresh=True, dtype=torch.float32, seed=1)


def test_causal_conv1d_prefill_rejects_bad_sections():
    x, weight, pool = torch.zeros(3, 8), torch.zeros(8, 4), torch.zeros(2, 8, 3)
    cu, slots = _cu_seqlens([3]), torch.tensor([1], dtype=torch.int32)
    for sections in ([4, 4, 4], [2, 2, 2, 2], [8], [10, -2, 0]):
        with pytest.raises(ValueError, match="sections"):
            ce.causal_conv1d_prefill(x, weight, pool, cu, slots, sections)


def _check_conv_prefill(lengths, pad_lengths, sections, width, fresh, dtype, seed):
    channels = sum(sections)
    padding = len(pad_lengths)
    g = _gen(seed)
    all_lengths = lengths + pad_lengths
    x = _randn(g, sum(all_lengths), channels, dtype=dtype)
    weight = _randn(g, channels, width, scale=width**-0.5, dtype=dtype)
    num_slots = len(lengths) + 3
    pool = _randn(g, num_slots, channels, width - 1, dtype=dtype)
    slots = torch.cat([_live_slots(g, len(lengths), num_slots), torch.full((padding,), NULL_SLOT, dtype=torch.int32)])
    if fresh:
        pool[slots.long()] = 0  # a newly allocated slot is zeroed
    cu = _cu_seqlens(all_lengths)
    before = pool.clone()
    parts = ce.causal_conv1d_prefill(x, weight, pool, cu, slots, sections)
    assert [p.shape for p in parts] == [(x.shape[0], w) for w in sections]
    assert all(p.is_contiguous() and p.dtype == dtype for p in parts)
    out = torch.cat(parts, dim=-1)
    _assert_rows_unchanged(before, pool, slots.tolist())  # padding lanes may write the null slot only
    if not any(pad_lengths):
        assert torch.equal(before[NULL_SLOT], pool[NULL_SLOT]), "zero-length lanes must not write"
    for i, slot in enumerate(slots[: len(lengths)].tolist()):
        s, e = cu[i].item(), cu[i + 1].item()
        if fresh:  # the textbook form: left zero padding
            ref = F.silu(
                F.conv1d(x[s:e].double().t()[None], weight.double()[:, None, :], padding=width - 1, groups=channels)
            )[0, :, : e - s].t()
        else:
            ref = _conv_oracle(before[slot], x[s:e], weight)
        torch.testing.assert_close(out[s:e].double(), ref, **_tol(dtype))
        history = torch.cat([before[slot], x[s:e].t()], dim=1)  # [C, W-1+L]
        assert torch.equal(pool[slot], history[:, -(width - 1) :]), "conv state must be the last W-1 inputs"


@given(batch=st.integers(1, 4), padding=st.integers(0, 3), channels=st.sampled_from([4, 24]),
       width=st.sampled_from([2, 4]), dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=SEEDS)
def test_causal_conv1d_decode(batch, padding, channels, width, dtype, seed):
    """One decode step ≡ F.conv1d (float64) over [history, x]; the state shifts by one; padding lanes write only
    the null slot; other rows untouched."""
    g = _gen(seed)
    x = _randn(g, batch + padding, channels, dtype=dtype)
    weight = _randn(g, channels, width, scale=width**-0.5, dtype=dtype)
    num_slots = batch + 3
    pool = _randn(g, num_slots, channels, width - 1, dtype=dtype)
    slots = torch.cat([_live_slots(g, batch, num_slots), torch.full((padding,), NULL_SLOT, dtype=torch.int32)])
    before = pool.clone()
    out = ce.causal_conv1d_decode(x, weight, pool, slots)
    assert out.shape == x.shape and out.dtype == dtype
    _assert_rows_unchanged(before, pool, slots.tolist())
    for i, slot in enumerate(slots[:batch].tolist()):
        ref = _conv_oracle(before[slot], x[i : i + 1], weight)
        torch.testing.assert_close(out[i : i + 1].double(), ref, **_tol(dtype))
        assert torch.equal(pool[slot], torch.cat([before[slot], x[i : i + 1].t()], dim=1)[:, 1:])


@given(prefix=st.lists(st.integers(1, 20), min_size=1, max_size=3), steps=st.integers(1, 6), padding=st.integers(0, 2),
       width=st.sampled_from([2, 4]), seed=SEEDS)
def test_causal_conv1d_prefill_then_decode_equals_one_prefill(prefix, steps, padding, width, seed):
    g = _gen(seed)
    channels = 12
    n_seq = len(prefix)
    xs = [_randn(g, n + steps, channels) for n in prefix]
    weight = _randn(g, channels, width, scale=width**-0.5)
    num_slots = n_seq + 2
    init = _randn(g, num_slots, channels, width - 1)
    slots = _live_slots(g, n_seq, num_slots)
    whole_pool = init.clone()
    whole, _, _ = ce.causal_conv1d_prefill(torch.cat(xs), weight, whole_pool, _cu_seqlens([n + steps for n in prefix]),
                                        slots, [channels, 0, 0])
    pool = init.clone()
    ce.causal_conv1d_prefill(torch.cat([x[:n] for x, n in zip(xs, prefix)]), weight, pool, _cu_seqlens(prefix), slots,
                             [channels, 0, 0])
    lanes = torch.cat([slots, torch.full((padding,), NULL_SLOT, dtype=torch.int32)])
    rest = []
    for t in range(steps):
        step_x = torch.cat([torch.stack([x[n + t] for x, n in zip(xs, prefix)]), _randn(g, padding, channels)])
        rest.append(ce.causal_conv1d_decode(step_x, weight, pool, lanes)[:n_seq])
    bounds = _cu_seqlens([n + steps for n in prefix]).tolist()
    for i, n in enumerate(prefix):
        got = torch.stack([r[i] for r in rest])
        torch.testing.assert_close(got, whole[bounds[i] + n : bounds[i + 1]], atol=1e-5, rtol=1e-5)
    assert torch.equal(pool[slots.long()], whole_pool[slots.long()])


# --------------------------------------------------------------------------------------------------------------
# fused Gated DeltaNet decode (conv + delta rule + gated norm)
# --------------------------------------------------------------------------------------------------------------


@given(batch=st.integers(1, 3), padding=st.integers(0, 2), heads=HEADS, strided=st.booleans(), seed=SEEDS,
       pool_dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_gated_deltanet_decode_matches_oracles(batch, padding, heads, strided, seed, pool_dtype):
    """ce::gated_deltanet_decode ≡ the float64 oracles composed on the in_proj row [q | k | v | z | b | a]:
    silu(F.conv1d) over [history, x] on the q|k|v channels, the delta-rule oracle, then the gated norm's formula
    with z (docs/ARCHITECTURE.md "Model math"); the conv state shifts by one; padding lanes write only the null slot's
    conv history, never a recurrent state."""
    Hk, r = heads
    Hv, K, V, W = r * Hk, 8, 16, 4
    key_dim, value_dim = Hk * K, Hv * V
    C = 2 * key_dim + value_dim
    P = C + value_dim + 2 * Hv
    g = _gen(seed)
    wide = _randn(g, batch + padding, P + 6)
    projected = wide[:, 3 : 3 + P] if strided else wide[:, :P].contiguous()
    conv_weight = _randn(g, C, W, scale=W**-0.5)
    num_slots = batch + 3
    conv_pool = _randn(g, num_slots, C, W - 1)
    rec_pool = _randn(g, num_slots, Hv, K, V, scale=0.5, dtype=pool_dtype)
    A_log = torch.empty(Hv).uniform_(0.05, 3.0, generator=g).log()
    dt_bias = _randn(g, Hv, scale=0.5)
    norm_weight = _randn(g, V, scale=0.5) + 1.0
    slots = torch.cat([_live_slots(g, batch, num_slots), torch.full((padding,), NULL_SLOT, dtype=torch.int32)])
    conv_before, rec_before = conv_pool.clone(), rec_pool.clone()
    out = ce.gated_deltanet_decode(projected, conv_weight, conv_pool, A_log, dt_bias, norm_weight, rec_pool, slots,
                                   Hk, K, Hv, V, 1e-6)
    assert out.shape == (batch + padding, value_dim) and out.dtype == projected.dtype
    _assert_rows_unchanged(conv_before, conv_pool, slots.tolist())
    _assert_rows_unchanged(rec_before, rec_pool, slots[:batch].tolist())
    for i, slot in enumerate(slots[:batch].tolist()):
        x = projected[i : i + 1]
        mixed = _conv_oracle(conv_before[slot], x[:, :C], conv_weight)  # [1, C] float64
        q, k = mixed[:, :key_dim].view(1, Hk, K), mixed[:, key_dim : 2 * key_dim].view(1, Hk, K)
        v = mixed[:, 2 * key_dim :].view(1, Hv, V)
        b, a = x[:, C + value_dim : C + value_dim + Hv], x[:, C + value_dim + Hv :]
        o, s_ref = _delta_oracle(q, k, v, a, b, A_log, dt_bias, rec_before[slot])
        o = o[0]  # [Hv, V]
        z = x[0, C : C + value_dim].double().view(Hv, V)
        want = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_weight.double() * F.silu(z)
        torch.testing.assert_close(out[i].double().view(Hv, V), want, atol=1e-5, rtol=1e-5)
        assert torch.equal(conv_pool[slot], torch.cat([conv_before[slot], x[:, :C].t()], dim=1)[:, 1:])
        tol = dict(atol=1e-5, rtol=1e-5) if pool_dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(rec_pool[slot], s_ref.to(pool_dtype), **tol)


# --------------------------------------------------------------------------------------------------------------
# KV store and paged attention
# --------------------------------------------------------------------------------------------------------------


def _kv_setup(g, contexts, block_size, Hkv, D, dtype, spare_blocks=2, stale_tail=False, padding=0):
    """A garbage-filled paged cache holding, for each sequence, ``contexts[i]`` tokens of dense K/V at random
    non-contiguous blocks (never block 0), then ``padding`` padding lanes (context 0). Returns caches, block tables
    ``[N + padding, max_blocks]``, dense K/V per live sequence.

    Table entries past a sequence's last block (and a padding lane's whole row) are the null block, or with
    ``stale_tail`` random live block ids (stale entries an engine may leave): an op must read only
    ``ceil(context_len / block_size)`` blocks."""
    blocks_per_seq = [math.ceil(c / block_size) for c in contexts]
    num_blocks = 1 + sum(blocks_per_seq) + spare_blocks
    k_cache = _randn(g, num_blocks, block_size, Hkv, D, scale=30.0, dtype=dtype)  # garbage: huge if ever read
    v_cache = _randn(g, num_blocks, block_size, Hkv, D, scale=30.0, dtype=dtype)
    ids = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    max_blocks = max(blocks_per_seq + [1]) + 1
    tables = torch.full((len(contexts), max_blocks), NULL_BLOCK, dtype=torch.int32)
    dense = []
    for i, (ctx, nb) in enumerate(zip(contexts, blocks_per_seq)):
        own = [ids.pop() for _ in range(nb)]
        tables[i, :nb] = torch.tensor(own, dtype=torch.int32)
        k = _randn(g, ctx, Hkv, D, dtype=dtype)
        v = _randn(g, ctx, Hkv, D, dtype=dtype)
        for pos in range(ctx):  # write directly (independent of store_kv)
            k_cache[own[pos // block_size], pos % block_size] = k[pos]
            v_cache[own[pos // block_size], pos % block_size] = v[pos]
        dense.append((k, v))
    tables = torch.cat([tables, torch.full((padding, max_blocks), NULL_BLOCK, dtype=torch.int32)])
    if stale_tail:
        used = torch.arange(max_blocks)[None, :] < torch.tensor(blocks_per_seq + [0] * padding)[:, None]
        stale = torch.randint(1, num_blocks, tables.shape, generator=g, dtype=torch.int32)
        tables = torch.where(used, tables, stale)
    return k_cache, v_cache, tables, dense


def _sdpa_oracle(q, k, v, first_position, scale):
    """q [Lq, Hq, D] at positions first_position.., k/v [Lk, Hkv, D] at 0..: float64 SDPA with a causal mask."""
    Lq, Lk = q.shape[0], k.shape[0]
    mask = torch.arange(Lk)[None, :] <= (first_position + torch.arange(Lq))[:, None]
    out = F.scaled_dot_product_attention(
        q.double().transpose(0, 1)[None], k.double().transpose(0, 1)[None], v.double().transpose(0, 1)[None],
        attn_mask=mask, scale=scale, enable_gqa=True,
    )
    return out[0].transpose(0, 1)  # [Lq, Hq, D]


ATTN_SHAPES = st.tuples(
    st.sampled_from([1, 2]),  # Hkv
    st.sampled_from([1, 2, 4]),  # group: Hq = group * Hkv
    st.sampled_from([8, 32]),  # head_dim
    st.sampled_from([4, 16]),  # block_size
)


@given(
    contexts=st.lists(
        st.one_of(st.integers(1, 70), st.sampled_from([1, 4, 15, 16, 17, 32, 64])), min_size=1, max_size=4
    ),
    padding=st.integers(0, 2),
    shapes=ATTN_SHAPES,
    stale_tail=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
def test_paged_attention_decode_matches_sdpa(contexts, padding, shapes, stale_tail, dtype, seed):
    """One query per sequence over its cached tokens ≡ float64 SDPA; GQA; random non-contiguous blocks; padding
    lanes (context 0) give zeros; nothing is written."""
    Hkv, group, D, block_size = shapes
    Hq = Hkv * group
    g = _gen(seed)
    k_cache, v_cache, tables, dense = _kv_setup(g, contexts, block_size, Hkv, D, dtype, stale_tail=stale_tail,
                                                padding=padding)
    lens = torch.tensor(contexts + [0] * padding, dtype=torch.int32)
    q = _randn(g, len(contexts) + padding, Hq, D, dtype=dtype)
    scale = D**-0.5
    k_before, v_before = k_cache.clone(), v_cache.clone()
    out = ce.paged_attention_decode(q, k_cache, v_cache, tables, lens, scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)
    for i, (k, v) in enumerate(dense):
        ref = _sdpa_oracle(q[i : i + 1], k, v, contexts[i] - 1, scale)
        torch.testing.assert_close(out[i : i + 1].double(), ref, **_tol(dtype))
    assert torch.equal(out[len(contexts) :], torch.zeros_like(out[len(contexts) :])), "padding lanes must be zeros"


@given(
    seqs=st.lists(
        st.tuples(st.integers(0, 40), st.one_of(st.integers(1, 20), st.sampled_from([1, 16, 64, 65]))),  # (cached, new)
        min_size=1,
        max_size=3,
    ),
    padding=st.integers(0, 2),
    shapes=ATTN_SHAPES,
    stale_tail=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
def test_paged_attention_prefill_matches_sdpa(seqs, padding, shapes, stale_tail, dtype, seed):
    """New tokens attend causally to a cached prefix plus themselves (positions offset by the prefix); GQA;
    zero-length padding sequences contribute no rows."""
    Hkv, group, D, block_size = shapes
    Hq = Hkv * group
    g = _gen(seed)
    contexts = [c + n for c, n in seqs]
    k_cache, v_cache, tables, dense = _kv_setup(g, contexts, block_size, Hkv, D, dtype, stale_tail=stale_tail,
                                                padding=padding)
    lens = torch.tensor(contexts + [0] * padding, dtype=torch.int32)
    new = [n for _, n in seqs]
    cu = _cu_seqlens(new + [0] * padding)
    q = _randn(g, sum(new), Hq, D, dtype=dtype)
    scale = 0.7 * D**-0.5
    k_before, v_before = k_cache.clone(), v_cache.clone()
    out = ce.paged_attention_prefill(q, k_cache, v_cache, cu, lens, tables, scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)
    for i, ((cached, n), (k, v)) in enumerate(zip(seqs, dense)):
        s, e = cu[i].item(), cu[i + 1].item()
        ref = _sdpa_oracle(q[s:e], k, v, cached, scale)
        torch.testing.assert_close(out[s:e].double(), ref, **_tol(dtype))


@given(
    cached=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    rows=st.integers(1, 5),
    shapes=ATTN_SHAPES,
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    gated=st.booleans(),
    seed=SEEDS,
)
def test_paged_attention_verify_matches_sdpa(cached, rows, shapes, dtype, gated, seed):
    """A verify step: every sequence scores ``rows`` tokens (its last one and its drafts) after its cached prefix,
    each attending causally to the prefix and the rows before it; GQA. ``gated``: times the sigmoid of a gate read
    through a strided view (the attention layer's, a slice of its projection's rows)."""
    Hkv, group, D, block_size = shapes
    g = _gen(seed)
    contexts = [c + rows for c in cached]
    k_cache, v_cache, tables, dense = _kv_setup(g, contexts, block_size, Hkv, D, dtype)
    q = _randn(g, rows * len(cached), Hkv * group, D, dtype=dtype)
    gate = _randn(g, rows * len(cached), Hkv * group, 2 * D, dtype=dtype)[..., D:] if gated else None
    scale = 0.7 * D**-0.5
    out = ce.paged_attention_verify(q, k_cache, v_cache, torch.tensor(contexts, dtype=torch.int32), tables, rows,
                                    scale, gate)
    assert out.shape == q.shape and out.dtype == dtype
    for i, (prefix, (k, v)) in enumerate(zip(cached, dense)):
        ref = _sdpa_oracle(q[i * rows : (i + 1) * rows], k, v, prefix, scale)
        if gated:
            ref = ref * torch.sigmoid(gate[i * rows : (i + 1) * rows].double())
        torch.testing.assert_close(out[i * rows : (i + 1) * rows].double(), ref, **_tol(dtype))


@given(
    n_tokens=st.integers(1, 20),
    padding=st.integers(0, 3),
    shapes=st.tuples(st.sampled_from([1, 2]), st.sampled_from([8, 32]), st.sampled_from([4, 16])),
    dtypes=st.sampled_from(
        [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)]
    ),
    seed=SEEDS,
)
def test_store_kv_roundtrip(n_tokens, padding, shapes, dtypes, seed):
    """Rows written at random non-null slots read back as the keys/values (cast to the cache dtype); padding
    tokens (slot_mapping 0: block 0, offset 0) write only that row; every other row is untouched."""
    Hkv, D, block_size = shapes
    in_dtype, cache_dtype = dtypes
    g = _gen(seed)
    num_blocks = 1 + math.ceil(n_tokens / block_size) + 2
    k_cache = _randn(g, num_blocks, block_size, Hkv, D, dtype=cache_dtype)
    v_cache = _randn(g, num_blocks, block_size, Hkv, D, dtype=cache_dtype)
    rows = torch.randperm((num_blocks - 1) * block_size, generator=g)[:n_tokens] + block_size  # never block 0
    null_row = NULL_BLOCK * block_size
    slot_mapping = torch.cat([rows, torch.full((padding,), null_row)]).to(torch.int64)
    key = _randn(g, n_tokens + padding, Hkv, D, dtype=in_dtype)
    value = _randn(g, n_tokens + padding, Hkv, D, dtype=in_dtype)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    ce.store_kv(key, value, k_cache, v_cache, slot_mapping)
    for cache, before, src in ((k_cache, k_before, key), (v_cache, v_before, value)):
        flat, flat_before = cache.view(-1, Hkv, D), before.view(-1, Hkv, D)
        assert torch.equal(flat[rows], src[:n_tokens].to(cache_dtype))
        touched = rows.tolist() + ([null_row] if padding else [])
        _assert_rows_unchanged(flat_before, flat, touched)
        if padding:  # the null row holds one of the padding tokens
            assert any(torch.equal(flat[null_row], src[n_tokens + j].to(cache_dtype)) for j in range(padding))


# --------------------------------------------------------------------------------------------------------------
# fused attention decode (q/k norm + RoPE + KV store + paged attention + output gate)
# --------------------------------------------------------------------------------------------------------------


def _decode_slots(tables: torch.Tensor, lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """The cache row of each sequence's new token (position context_len - 1); the null row for padding lanes."""
    rows = [int(tables[i, (n - 1) // block_size]) * block_size + (n - 1) % block_size if n else NULL_BLOCK * block_size
            for i, n in enumerate(lens.tolist())]
    return torch.tensor(rows, dtype=torch.int64)


def _zero_centred_norm_oracle(x, weight, eps):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.double())


def _rope_oracle(x, position, rotary_dim, theta):
    """NeoX rotate-half RoPE of x [H, D] (float64) on its first rotary_dim channels (docs/ARCHITECTURE.md "Model math")."""
    half = rotary_dim // 2
    angle = position * theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / rotary_dim)
    x1, x2 = x[:, :half], x[:, half:rotary_dim]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin(), x[:, rotary_dim:]], -1)


@given(
    tokens=st.integers(1, 7),
    shapes=st.sampled_from([(1, 1, 8, 1), (2, 4, 8, 4), (2, 2, 32, 2)]),  # Hkv, group, head_dim, head_dim / rotary
    strided=st.booleans(),
    seed=SEEDS,
)
def test_attention_prologue_equals_oracle(tokens, shapes, strided, seed):
    """ce::attention_prologue on float64 inputs ≡ a float64 oracle of docs/ARCHITECTURE.md's formulas: q and k
    zero-centred-normalised over head_dim, then rotate-half RoPE at each token's position; k and v in the cache at
    each token's slot, every other cache row unchanged."""
    from compiled_engine.layers import RotaryEmbedding

    Hkv, group, D, rotary_div = shapes
    Hq, rotary_dim, theta, block_size = group * Hkv, D // rotary_div, 100.0, 4
    g = _gen(seed)
    dtype = torch.float64
    num_blocks = 1 + (tokens + block_size - 1) // block_size + 2
    k_cache = _randn(g, num_blocks, block_size, Hkv, D, dtype=dtype)
    v_cache = _randn(g, num_blocks, block_size, Hkv, D, dtype=dtype)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    slots = (torch.randperm((num_blocks - 1) * block_size, generator=g)[:tokens] + block_size).long()  # not block 0
    positions = torch.randint(0, 300, (tokens,), generator=g)
    width = 2 * Hq * D + 2 * Hkv * D
    wide = _randn(g, tokens, width + 6, scale=2.0, dtype=dtype)
    projected = wide[:, 3 : 3 + width] if strided else wide[:, :width].contiguous()
    q_weight, k_weight = _randn(g, D, scale=0.5, dtype=dtype), _randn(g, D, scale=0.5, dtype=dtype)
    inv_freq = RotaryEmbedding(rotary_dim, theta).inv_freq
    q = ce.attention_prologue(projected, q_weight, k_weight, 1e-6, inv_freq, positions, k_cache, v_cache, slots,
                              Hq, Hkv, D)
    assert q.shape == (tokens, Hq, D) and q.is_contiguous()
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slots] = True
    for t in range(tokens):
        row = projected[t]
        q_t = row[: 2 * Hq * D].view(Hq, 2, D)[:, 0]  # per head [q_h | gate_h]
        k_t, v_t = row[2 * Hq * D :].view(2, Hkv, D).unbind(0)
        position = int(positions[t])
        want_q = _rope_oracle(_zero_centred_norm_oracle(q_t, q_weight, 1e-6), position, rotary_dim, theta)
        want_k = _rope_oracle(_zero_centred_norm_oracle(k_t, k_weight, 1e-6), position, rotary_dim, theta)
        # fp32 inside the op (norm statistics, angles): 1e-4
        torch.testing.assert_close(q[t], want_q, atol=1e-4, rtol=1e-4)
        block, offset = divmod(int(slots[t]), block_size)
        torch.testing.assert_close(k_cache[block, offset], want_k, atol=1e-4, rtol=1e-4)
        assert torch.equal(v_cache[block, offset], v_t)
    flat = lambda c: c.view(-1, Hkv, D)  # noqa: E731
    assert torch.equal(flat(k_cache)[~written], flat(before_k)[~written])
    assert torch.equal(flat(v_cache)[~written], flat(before_v)[~written])


@given(
    contexts=st.lists(st.one_of(st.integers(1, 70), st.sampled_from([1, 2, 16, 17, 65])), min_size=1, max_size=3),
    padding=st.integers(0, 2),
    shapes=st.tuples(
        st.sampled_from([1, 2]),  # Hkv
        st.sampled_from([1, 4]),  # group: Hq = group * Hkv
        st.sampled_from([8, 32]),  # head_dim
        st.sampled_from([4, 2, 1]),  # rotary_dim = head_dim / this: partial (the model's 1/4) or full
        st.sampled_from([4, 128]),  # block_size: smaller and larger than the CUDA kernel's key tiles (16-64 tokens)
    ),
    strided=st.booleans(),
    seed=SEEDS,
)
def test_attention_decode_equals_unfused_ops_and_oracle(contexts, padding, shapes, strided, seed):
    """ce::attention_decode on float64 inputs ≡ the model's unfused decode path (ce::attention_prologue: norms, RoPE
    and the KV store; ce::paged_attention_decode, attn * sigmoid(gate)): the same output and
    the same cache writes, bitwise; and ≡ a float64 oracle of docs/ARCHITECTURE.md's formulas (zero-centred norm, rotate-half
    RoPE, SDPA over the cached tokens plus the new one, the gate). Padding lanes (context 0, the null row): zeros."""
    from compiled_engine.layers import RotaryEmbedding

    Hkv, group, D, rotary_div, block_size = shapes
    Hq, rotary_dim, theta = group * Hkv, D // rotary_div, 100.0  # a small theta: every channel pair turns visibly
    g = _gen(seed)
    dtype = torch.float64
    k_cache, v_cache, tables, dense = _kv_setup(g, contexts, block_size, Hkv, D, dtype, padding=padding)
    lens = torch.tensor(contexts + [0] * padding, dtype=torch.int32)
    batch = lens.shape[0]
    positions = (lens - 1).clamp_min(0).long()
    slots = _decode_slots(tables, lens, block_size)
    width = 2 * Hq * D + 2 * Hkv * D
    wide = _randn(g, batch, width + 6, scale=2.0, dtype=dtype)
    projected = wide[:, 3 : 3 + width] if strided else wide[:, :width].contiguous()
    q_weight, k_weight = _randn(g, D, scale=0.5, dtype=dtype), _randn(g, D, scale=0.5, dtype=dtype)
    rotary = RotaryEmbedding(rotary_dim, theta)
    eps, scale = 1e-6, D**-0.5
    k_fused, v_fused = k_cache.clone(), v_cache.clone()
    out = ce.attention_decode(projected, q_weight, k_weight, eps, rotary.inv_freq, positions, k_fused, v_fused, slots,
                              tables, lens, Hq, Hkv, D, scale)
    assert out.shape == (batch, Hq * D) and out.dtype == dtype

    # The unfused path, as compiled_engine/attention.py computes decode with the flash-attn backend (and did before
    # this op with ours).
    gate = projected[:, : 2 * Hq * D].reshape(batch, Hq, 2 * D)[..., D:]
    q = ce.attention_prologue(projected, q_weight, k_weight, eps, rotary.inv_freq, positions, k_cache, v_cache, slots,
                              Hq, Hkv, D)
    attn = ce.paged_attention_decode(q, k_cache, v_cache, tables, lens, scale)
    assert torch.equal(out, attn.reshape(batch, -1) * torch.sigmoid(gate.reshape(batch, -1)))
    assert torch.equal(k_fused, k_cache) and torch.equal(v_fused, v_cache)
    assert torch.equal(out[len(contexts) :], torch.zeros_like(out[len(contexts) :])), "padding lanes must be zeros"

    for i, (length, (k_dense, v_dense)) in enumerate(zip(contexts, dense)):
        row = projected[i].double()
        q_i, gate_i = row[: 2 * Hq * D].view(Hq, 2, D).unbind(1)  # per head [q_h | gate_h]
        k_i, v_i = row[2 * Hq * D :].view(2, Hkv, D).unbind(0)
        q_i = _rope_oracle(_zero_centred_norm_oracle(q_i, q_weight, eps), length - 1, rotary_dim, theta)
        k_i = _rope_oracle(_zero_centred_norm_oracle(k_i, k_weight, eps), length - 1, rotary_dim, theta)
        keys = torch.cat([k_dense[: length - 1].double(), k_i[None]])  # the cached tokens, then the new one
        values = torch.cat([v_dense[: length - 1].double(), v_i[None]])
        want = _sdpa_oracle(q_i[None], keys, values, length - 1, scale)[0] * torch.sigmoid(gate_i)
        # fp32 inside the op (norm statistics, angles, attention): 1e-4
        torch.testing.assert_close(out[i].view(Hq, D), want, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------------------------------------------
# linear
# --------------------------------------------------------------------------------------------------------------


@given(
    rows=st.integers(1, 20),  # across the CUDA kernel's switch from our skinny GEMM to cuBLAS (SKINNY_MAX_ROWS)
    k=st.one_of(st.sampled_from([1, 16, 64]), st.integers(1, 70)),
    n=st.one_of(st.sampled_from([1, 16, 64]), st.integers(1, 70)),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
def test_linear_matches_float64_matmul(rows, k, n, dtype, seed):
    g = _gen(seed)
    x = _randn(g, rows, k, dtype=dtype)
    weight = _randn(g, n, k, scale=k**-0.5, dtype=dtype)
    out = ce.linear(x, weight)
    assert out.shape == (rows, n) and out.dtype == dtype
    torch.testing.assert_close(out.double(), x.double() @ weight.double().T, **_tol(dtype))


def test_skinny_rows_within_the_kernel():
    """ce::linear sends at most SKINNY_MAX_ROWS rows to the Triton skinny GEMM, which takes at most GEMV_MAX_ROWS."""
    gemv_kernels = pytest.importorskip("ops.triton.gemv_kernels")
    assert 1 <= SKINNY_MAX_ROWS <= gemv_kernels.GEMV_MAX_ROWS


@given(lead=st.sampled_from([(), (3,), (2, 3), (0,)]), seed=SEEDS)
def test_linear_wrapper_flattens_leading_dims(lead, seed):
    """ops.linear.linear: x [..., K] -> [..., N] (leading dimensions, none at all, or zero rows)."""
    g = _gen(seed)
    x = _randn(g, *lead, 12)
    weight = _randn(g, 5, 12)
    out = linear(x, weight)
    assert out.shape == (*lead, 5)
    torch.testing.assert_close(out.double(), x.double() @ weight.double().T, atol=1e-5, rtol=1e-5)


@given(
    tokens=st.integers(0, 9),
    dim=st.sampled_from([8, 48, 1024]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
def test_add_rms_norm_matches_float64(tokens, dim, dtype, seed):
    """ce::add_rms_norm (a decoder layer's residual add + norm): the sum, and the zero-centred norm of the sum as
    rounded to the activations' dtype (HF's residual adds round there), against float64."""
    g = _gen(seed)
    x, residual = _randn(g, tokens, dim, scale=3.0, dtype=dtype), _randn(g, tokens, dim, scale=3.0, dtype=dtype)
    weight = _randn(g, dim, scale=0.5, dtype=dtype)
    summed, normed = ce.add_rms_norm(x, residual, weight, 1e-6)
    assert summed.shape == normed.shape == (tokens, dim) and summed.dtype == normed.dtype == dtype
    torch.testing.assert_close(summed.double(), x.double() + residual.double(), **_tol(dtype))
    sd = summed.double()
    want = sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + weight.double())
    torch.testing.assert_close(normed.double(), want, **_tol(dtype))


@given(
    tokens=st.integers(0, 20),  # across the CUDA kernel's switch from our skinny GEMM to cuBLAS (SKINNY_MAX_ROWS)
    k=st.sampled_from([8, 48, 1024]),
    n=st.integers(1, 40),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
def test_add_rms_norm_linear_matches_float64(tokens, k, n, dtype, seed):
    """ce::add_rms_norm_linear (residual add + norm + the projection after them): the sum, and the projection of
    the norm of the rounded sum, against float64."""
    g = _gen(seed)
    x, residual = _randn(g, tokens, k, scale=3.0, dtype=dtype), _randn(g, tokens, k, scale=3.0, dtype=dtype)
    norm_weight = _randn(g, k, scale=0.5, dtype=dtype)
    weight = _randn(g, n, k, scale=k**-0.5, dtype=dtype)
    out, summed = add_rms_norm_linear_op(x, residual, norm_weight, 1e-6, weight)
    assert out.shape == (tokens, n) and summed.shape == (tokens, k) and out.dtype == summed.dtype == dtype
    torch.testing.assert_close(summed.double(), x.double() + residual.double(), **_tol(dtype))
    sd = summed.double()
    normed = sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + norm_weight.double())
    torch.testing.assert_close(out.double(), normed @ weight.double().T, **{key: 2 * v for key, v in _tol(dtype).items()})


@given(
    tokens=st.integers(0, 9),
    k=st.sampled_from([8, 48]),
    half=st.integers(1, 20),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
def test_add_rms_norm_linear_silu_mul_matches_float64(tokens, k, half, dtype, seed):
    """ce::add_rms_norm_linear_silu_mul (residual add + norm + the MLP's gate_up projection + its activation): the
    sum, and ``silu(gate) * up`` of the projection of the norm, against float64."""
    g = _gen(seed)
    x, residual = _randn(g, tokens, k, scale=3.0, dtype=dtype), _randn(g, tokens, k, scale=3.0, dtype=dtype)
    norm_weight = _randn(g, k, scale=0.5, dtype=dtype)
    weight = _randn(g, 2 * half, k, scale=k**-0.5, dtype=dtype)
    out, summed = add_rms_norm_linear_silu_mul_op(x, residual, norm_weight, 1e-6, weight)
    assert out.shape == (tokens, half) and summed.shape == (tokens, k) and out.dtype == summed.dtype == dtype
    torch.testing.assert_close(summed.double(), x.double() + residual.double(), **_tol(dtype))
    sd = summed.double()
    normed = sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + norm_weight.double())
    gate, up = (normed @ weight.double().T).chunk(2, dim=-1)
    torch.testing.assert_close(out.double(), gate * torch.sigmoid(gate) * up,
                               **{key: 3 * v for key, v in _tol(dtype).items()})


@given(
    lead=st.sampled_from([(), (1,), (3,), (2, 3), (0,)]),
    k=st.integers(1, 40),
    n=st.integers(1, 40),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
def test_silu_mul_linear_matches_float64(lead, k, n, dtype, seed):
    """ops.linear.silu_mul_linear (ce::silu_mul_linear: the MLP's activation and down projection) against
    ``(silu(gate) * up) @ weight.T`` in float64."""
    g = _gen(seed)
    gate_up = _randn(g, *lead, 2 * k, scale=3.0, dtype=dtype)
    weight = _randn(g, n, k, scale=k**-0.5, dtype=dtype)
    out = silu_mul_linear(gate_up, weight)
    assert out.shape == (*lead, n) and out.dtype == dtype
    gate, up = gate_up.double()[..., :k], gate_up.double()[..., k:]
    want = (gate * torch.sigmoid(gate) * up) @ weight.double().T
    torch.testing.assert_close(out.double(), want, **{key: 2 * v for key, v in _tol(dtype).items()})
    with pytest.raises(ValueError, match="2 x weight"):
        silu_mul_linear(gate_up[..., 1:], weight)


@given(
    tokens=st.integers(0, 9),
    heads=st.sampled_from([0, 1, 3]),  # 0: a 2-D x [T, D] (the layer norms); else [T, H, D] (per-head norms)
    dim=st.sampled_from([8, 48]),
    gated=st.booleans(),
    strided=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
def test_rms_norm_matches_float64(tokens, heads, dim, gated, strided, dtype, seed):
    """ops.norm.rms_norm (eager: ce::rms_norm) against the formula in float64, on the views the model passes."""
    g = _gen(seed)
    lead = (tokens,) if heads == 0 else (tokens, heads)
    if strided:  # the first half of wider rows, as q is of the attention's [q | gate] rows
        x = _randn(g, *lead, 2 * dim, scale=3.0, dtype=dtype)[..., :dim]
    else:
        x = _randn(g, *lead, dim, scale=3.0, dtype=dtype)
    weight = _randn(g, dim, scale=0.5, dtype=dtype)
    gate = _randn(g, *lead, dim, dtype=dtype) if gated else None
    out = rms_norm(x, weight, 1e-6, zero_centred=not gated, gate=gate)
    assert out.shape == x.shape and out.dtype == dtype
    xd = x.double()
    normed = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    want = normed * weight.double() * F.silu(gate.double()) if gated else normed * (1.0 + weight.double())
    torch.testing.assert_close(out.double(), want, **_tol(dtype))


@given(
    lead=st.sampled_from([(0,), (1,), (5,), (2, 3)]),
    half=st.integers(1, 40),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
def test_silu_mul_matches_float64(lead, half, dtype, seed):
    """ops.activation.silu_mul (eager: ce::silu_mul) on [..., gate | up] against float64."""
    gate_up = _randn(_gen(seed), *lead, 2 * half, scale=3.0, dtype=dtype)
    out = silu_mul(gate_up)
    assert out.shape == (*lead, half) and out.dtype == dtype
    gate, up = gate_up.double()[..., :half], gate_up.double()[..., half:]
    torch.testing.assert_close(out.double(), gate * torch.sigmoid(gate) * up, **_tol(dtype))


def test_rms_norm_compiled_path_equals_eager():
    """Inside torch.compile rms_norm is plain torch (Inductor fuses it with its neighbours), outside it is the op:
    the two paths give the same values, and the compiled graph does not call the op."""
    g = _gen(7)
    x, z = _randn(g, 5, 4, 16, scale=2.0), _randn(g, 5, 4, 16)
    weight = _randn(g, 16)

    def norms(x, z, weight):
        return rms_norm(x, weight, 1e-6, zero_centred=True), rms_norm(x, weight, 1e-6, zero_centred=False, gate=z)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(norms, backend=backend, fullgraph=True)(x, z, weight)
    for got, want in zip(compiled, norms(x, z, weight)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert graphs and "rms_norm" not in graphs[0].code


# --------------------------------------------------------------------------------------------------------------
# opcheck: schema (mutations declared), fake kernel, AOT dispatch — realistic small inputs with null slot/block
# --------------------------------------------------------------------------------------------------------------


def _opcheck_cases():
    g = _gen(123)
    Hk, Hv, K, V, T = 2, 4, 8, 16, 7
    x = _delta_inputs(g, T, Hk, Hv, K, V)
    state = _randn(g, 5, Hv, K, V, scale=0.5)
    cu = _cu_seqlens([4, 3, 0])
    slots3 = torch.tensor([3, 1, NULL_SLOT], dtype=torch.int32)
    d = _delta_inputs(g, 3, Hk, Hv, K, V)
    C, W = 6, 4
    conv_x = _randn(g, T, C)
    conv_w = _randn(g, C, W)
    conv_state = _randn(g, 5, C, W - 1)
    k_cache, v_cache, tables, _ = _kv_setup(g, [5, 9], 4, 2, 8, torch.float32, padding=1)
    lens = torch.tensor([5, 9, 0], dtype=torch.int32)
    inv_freq = 1.0 / 100.0 ** (torch.arange(0, 4, 2, dtype=torch.float32) / 4)  # rotary_dim 4 of head_dim 8
    return {
        "store_kv": (
            ce.store_kv.default,
            (_randn(g, 3, 2, 8), _randn(g, 3, 2, 8), k_cache.clone(), v_cache.clone(),
             torch.tensor([5, 13, 0], dtype=torch.int64)),
        ),
        "paged_attention_decode": (
            ce.paged_attention_decode.default, (_randn(g, 3, 4, 8), k_cache, v_cache, tables, lens, 8**-0.5)
        ),
        "paged_attention_prefill": (
            ce.paged_attention_prefill.default,
            (_randn(g, 5, 4, 8), k_cache, v_cache, _cu_seqlens([2, 3, 0]), lens, tables, 8**-0.5),
        ),
        "paged_attention_verify": (  # 2 rows a sequence, the padding lane's context 0
            ce.paged_attention_verify.default, (_randn(g, 6, 4, 8), k_cache, v_cache, lens, tables, 2, 8**-0.5)
        ),
        # the optional flash-attn backend: same contract, same CPU reference (its CUDA kernel: flash-attn)
        "flash_paged_attention_decode": (
            ce.flash_paged_attention_decode.default, (_randn(g, 3, 4, 8), k_cache, v_cache, tables, lens, 8**-0.5)
        ),
        "flash_paged_attention_prefill": (
            ce.flash_paged_attention_prefill.default,
            (_randn(g, 5, 4, 8), k_cache, v_cache, _cu_seqlens([2, 3, 0]), lens, tables, 8**-0.5),
        ),
        "attention_prologue": (  # projected rows [q_gate | k | v] as a slice of wider rows; Hq 4, Hkv 2, D 8
            ce.attention_prologue.default,
            (_randn(g, 3, 2 * 4 * 8 + 2 * 2 * 8 + 4)[:, 2:-2], _randn(g, 8), _randn(g, 8), 1e-6, inv_freq,
             torch.tensor([4, 8, 0]), k_cache.clone(), v_cache.clone(), torch.tensor([5, 13, 0]), 4, 2, 8),
        ),
        "attention_decode": (  # projected rows [q_gate | k | v] as a slice of wider rows; Hq 4, Hkv 2, D 8
            ce.attention_decode.default,
            (_randn(g, 3, 2 * 4 * 8 + 2 * 2 * 8 + 4)[:, 2:-2], _randn(g, 8), _randn(g, 8), 1e-6, inv_freq,
             (lens - 1).clamp_min(0).long(), k_cache.clone(), v_cache.clone(), _decode_slots(tables, lens, 4), tables,
             lens, 4, 2, 8, 8**-0.5),
        ),
        "causal_conv1d_prefill": (ce.causal_conv1d_prefill.default,
                                  (conv_x, conv_w, conv_state.clone(), cu, slots3, [2, 2, 2])),
        "linear": (ce.linear.default, (_randn(g, 3, 8), _randn(g, 5, 8))),
        "causal_conv1d_decode": (
            ce.causal_conv1d_decode.default, (_randn(g, 3, C), conv_w, conv_state.clone(), slots3)
        ),
        "gated_delta_rule_prefill": (
            ce.gated_delta_rule_prefill.default,
            (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], state.clone(), cu, slots3),
        ),
        "gated_delta_rule_decode": (
            ce.gated_delta_rule_decode.default,
            (d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"], state.clone(), slots3),
        ),
        "gated_deltanet_decode": (  # projected rows [q | k | v | z | b | a] as a slice of wider rows
            ce.gated_deltanet_decode.default,
            (_randn(g, 3, 2 * Hk * K + 2 * Hv * V + 2 * Hv + 4)[:, 2:-2], _randn(g, 2 * Hk * K + Hv * V, W),
             _randn(g, 5, 2 * Hk * K + Hv * V, W - 1), d["A_log"], d["dt_bias"], _randn(g, V), state.clone(), slots3,
             Hk, K, Hv, V, 1e-6),
        ),
        "silu_mul": (ce.silu_mul.default, (_randn(g, 5, 20)[:, 2:18],)),
        "silu_mul_linear": (ce.silu_mul_linear.default, (_randn(g, 3, 16), _randn(g, 5, 8))),
        "moe_route": (ce.moe_route.default, (_randn(g, 5, 6), 2, True)),
        "moe_align_block_size": (ce.moe_align_block_size.default,
                                 (torch.tensor([[3, 1], [1, 0], [3, 5], [2, 1]], dtype=torch.int32), 6, 4)),
        "fused_moe": (ce.fused_moe.default, (_randn(g, 4, 8), _randn(g, 6, 10, 8), _randn(g, 6, 8, 5),
                                             torch.rand(4, 2, generator=g),
                                             torch.tensor([[3, 1], [1, 0], [3, 5], [2, 1]], dtype=torch.int32))),
        "routed_moe": (ce.routed_moe.default, (_randn(g, 4, 8), _randn(g, 4, 6), _randn(g, 6, 10, 8), _randn(g, 6, 8, 5),
                                               2, True)),
        "add_rms_norm": (ce.add_rms_norm.default, (_randn(g, 3, 8), _randn(g, 3, 8), _randn(g, 8), 1e-6)),
        "add_rms_norm_linear": (ce.add_rms_norm_linear.default,
                                (_randn(g, 3, 8), _randn(g, 3, 8), _randn(g, 8), 1e-6, _randn(g, 5, 8))),
        "add_rms_norm_linear_silu_mul": (ce.add_rms_norm_linear_silu_mul.default,
                                         (_randn(g, 3, 8), _randn(g, 3, 8), _randn(g, 8), 1e-6, _randn(g, 6, 8))),
        "rms_norm": (ce.rms_norm.default, (_randn(g, 3, 2, 16)[..., :8], _randn(g, 8), _randn(g, 3, 2, 8), 1e-6, False)),
        "argmax": (ce.argmax.default, (_randn(g, 3, 40)[:, 4:],)),  # rows of a wider tensor
        "sample": (  # greedy, sampled with top-k / top-p / min-p; rows of a wider tensor
            ce.sample.default,
            (_randn(g, 3, 40)[:, 4:], torch.tensor([0.0, 1.0, 0.7]), torch.tensor([0, 5, 0]),
             torch.tensor([1.0, 0.9, 0.5]), torch.tensor([0.0, 0.0, 0.1]), torch.tensor([1, 2, 3]),
             torch.tensor([4, 5, 6]), True, True),
        ),
        "apply_penalties_": (  # rows 2 and 0 of 3, strided logits; padded token tables
            ce.apply_penalties_.default,
            (_randn(g, 3, 24)[:, 2:-2], torch.tensor([2, 0]), torch.tensor([[1, 3, 20], [5, 20, 20]]),
             torch.tensor([[1, 1, 7], [4, 20, 20]]), torch.tensor([0.5, -0.5]), torch.tensor([0.25, 1.0]),
             torch.tensor([1.2, 0.8])),
        ),
        "gated_deltanet_verify": (  # 3 sequences (the last padding) x 2 positions; projected rows of wider rows
            ce.gated_deltanet_verify.default,
            (_randn(g, 6, 2 * Hk * K + 2 * Hv * V + 2 * Hv + 4)[:, 2:-2], _randn(g, 2 * Hk * K + Hv * V, W),
             _randn(g, 5, 2 * Hk * K + Hv * V, W - 1), d["A_log"], d["dt_bias"], _randn(g, V), state.clone(), slots3,
             torch.zeros(4, 3, 3 * Hk * K + 2 * Hv * V + Hv), Hk, K, Hv, V, 1e-6),
        ),
        "gated_deltanet_commit": (
            ce.gated_deltanet_commit.default,  # two layers
            ([_randn(g, 5, 2 * Hk * K + Hv * V, W - 1) for _ in range(2)], [state.clone(), state.clone()], slots3,
             [_randn(g, 4, 3, 3 * Hk * K + 2 * Hv * V + Hv) for _ in range(2)], torch.tensor([2, 0, 1]), Hk, K, Hv, V),
        ),
        "advance_decode_inputs": (
            ce.advance_decode_inputs.default,
            (_randn(g, 3, 40)[:, 4:], torch.tensor([5, 6, 7]), torch.tensor([3, 9, 0]), torch.tensor([40, 17, 0]),
             torch.tensor([4, 10, 0], dtype=torch.int32), torch.tensor([[2, 5], [1, 3], [0, 0]], dtype=torch.int32),
             torch.zeros(2, 16, dtype=torch.long), torch.tensor([1]), 8),
        ),
        "logprobs": (ce.logprobs.default, (_randn(g, 3, 40)[:, 4:], torch.tensor([0, 5, 35]), 4)),  # wider rows
    }


OPCHECK_CASES = _opcheck_cases()


@pytest.mark.parametrize("name", list(OPCHECK_CASES))
def test_opcheck(name):
    op, args = OPCHECK_CASES[name]
    _opcheck(op, args)


def test_advance_decode_inputs_by_hand():
    """The greedy tokens and the next step's inputs, worked out by hand (block size 16): a row crossing into its
    second block, a row whose next position is past its table (the null block's row 0), a padding lane (context 0:
    unchanged); the tokens become the input ids and land in ring row 5 % 2 = 1."""
    positions, slot_mapping = torch.tensor([15, 31, 4]), torch.tensor([3 * 16 + 15, 7 * 16 + 15, 0])
    context_lens = torch.tensor([16, 32, 0], dtype=torch.int32)
    tables = torch.tensor([[3, 7], [2, 7], [0, 0]], dtype=torch.int32)
    ring, ring_slot = torch.zeros(2, 4, dtype=torch.long), torch.tensor([5])
    logits = torch.zeros(3, 20)
    logits[0, 11], logits[1, [12, 15]], logits[2, 13] = 1.0, 2.0, float("nan")  # 11; 12 (first of a tie); 13 (NaN)
    input_ids = torch.tensor([1, 2, 3])
    tokens = ce.advance_decode_inputs(logits, input_ids, positions, slot_mapping, context_lens, tables, ring, ring_slot,
                                      16)
    assert tokens.tolist() == input_ids.tolist() == [11, 12, 13]
    assert positions.tolist() == [16, 32, 4] and context_lens.tolist() == [17, 33, 0]
    assert slot_mapping.tolist() == [7 * 16 + 0, 0, 0]
    assert ring.tolist() == [[0, 0, 0, 0], [11, 12, 13, 0]] and ring_slot.tolist() == [6]


def test_opcheck_gated_delta_rule_prefill_with_fla_fields():
    """The optional cu_seqlens_long / chunk_indices arguments (views of one int64 buffer, as pack_step makes them)."""
    op, args = OPCHECK_CASES["gated_delta_rule_prefill"]
    cu = args[8]
    packed = torch.tensor([*cu.tolist(), 0, *dr.host_chunk_indices(cu.tolist())], dtype=torch.long)
    n = cu.shape[0]
    _opcheck(op, (*args, packed[:n], packed[n + 1 :].view(-1, 2)))
    _opcheck(op, (*args, packed[:n], packed[n + 1 :].view(-1, 2), True))  # graphed: a captured step's call


def test_gated_delta_rule_prefill_reference_takes_skip_rows():
    """A chunk table padded with skip rows (a captured step's) is accepted and changes nothing; skip rows that name a
    chunk inside a sequence, or a table cut short, are refused."""
    op, args = OPCHECK_CASES["gated_delta_rule_prefill"]
    cu = args[8].tolist()
    state = args[7]
    plain_state = state.clone()
    plain = dr.gated_delta_rule_prefill_reference(*args[:7], plain_state, *args[8:])
    table = dr.host_chunk_indices(cu, num_rows=len(dr.host_chunk_indices(cu)) // 2 + 2)
    assert table[-2:] == [len(cu) - 2, -(-(cu[-1] - cu[-2]) // dr.CHUNK_SIZE)]
    padded_state = state.clone()
    got = dr.gated_delta_rule_prefill_reference(*args[:7], padded_state, *args[8:],
                                                chunk_indices=torch.tensor(table).view(-1, 2))
    assert torch.equal(got, plain) and torch.equal(padded_state, plain_state)
    inside = table[:-2] + [0, 0]
    for bad in (inside, table[:2]):  # a skip row inside sequence 0; the second sequence's chunk left out
        with pytest.raises(ValueError, match="chunk_indices"):
            dr.gated_delta_rule_prefill_reference(*args[:7], state.clone(), *args[8:],
                                                  chunk_indices=torch.tensor(bad).view(-1, 2))


def test_every_op_is_covered():
    """Every op registered under torch.ops.ce has an opcheck case here (a new op must add one)."""
    registered = {
        name
        for name in dir(ce)
        if not name.startswith("_") and isinstance(getattr(ce, name), torch._ops.OpOverloadPacket)
    }
    assert registered == set(OPCHECK_CASES), registered ^ set(OPCHECK_CASES)
    assert ops.NULL_SLOT == 0 and ops.NULL_BLOCK == 0

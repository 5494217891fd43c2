"""The sparse-MoE ops (ops/moe.py): routing, the block-aligned sort, the fused experts.

* ``ce::moe_route`` against a float64 softmax / top-k written here; ``ce::fused_moe``'s reference against a float64
  per-token sum over its k experts (a different loop order from the reference's per-expert one);
* ``ce::moe_align_block_size``'s layout properties (every row once, blocks of one expert, experts in order, the
  padding, the static length), on random routings, with experts that get no row and with one expert taking all;
* (opcheck of the three ops: tests/test_ops.py's OPCHECK_CASES)
* the Triton kernels under ``TRITON_INTERPRET=1`` on the CPU (hypothesis: random routings, all rows to one expert,
  empty experts, tiny shapes): the grouped GEMMs against the reference, with the one-program align kernel and with
  the torch sort, the few-tokens GEMVs against float64, the align kernel against the torch version, the route kernel
  against its reference, ``ce::routed_moe`` down each of its paths; in a child process as
  tests/test_kernels_interpreter.py does;
* on a GPU (marked ``gpu``): the kernel in bf16 on the Qwen3.5-35B-A3B expert shape against the reference.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ops  # noqa: F401  (registers the ce ops)
from ops.layouts import moe_align_block_size
from ops.moe import (
    fused_moe_op, fused_moe_reference, moe_align_block_size_op, moe_route_op, moe_route_reference, routed_moe_op,
)
from tests import background

REPO = Path(__file__).resolve().parents[1]


@st.composite
def routings(draw, max_tokens=12, max_experts=9):
    """(T, E, k, ids [T, k] int32): distinct experts per token; sometimes every token on the same k experts."""
    experts = draw(st.integers(1, max_experts))
    top_k = draw(st.integers(1, min(4, experts)))
    tokens = draw(st.integers(1, max_tokens))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    if draw(st.booleans()):  # all tokens to the same experts (one expert when k == 1)
        ids = torch.arange(top_k).repeat(tokens, 1)
    else:  # a random subset of the experts in use: some get no row
        used = max(top_k, draw(st.integers(1, experts)))
        pool = torch.randperm(experts, generator=g)[:used]
        ids = torch.stack([pool[torch.randperm(used, generator=g)[:top_k]] for _ in range(tokens)])
    return tokens, experts, top_k, ids.to(torch.int32)


def float64_moe(x, gate_up, down, weights, ids):
    """Per token, per chosen expert, in float64."""
    x, gate_up, down, weights = (t.double() for t in (x, gate_up, down, weights))
    out = torch.zeros_like(x)
    inter = down.shape[-1]
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            h = gate_up[e] @ x[t]
            out[t] += weights[t, j] * (down[e] @ (torch.nn.functional.silu(h[:inter]) * h[inter:]))
    return out


def test_route_equals_float64_softmax_topk():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 10, generator=g) * 3
    probs = torch.softmax(logits.double(), dim=-1)
    for renormalize in (False, True):
        weights, ids = moe_route_op(logits, 3, renormalize)
        assert ids.dtype == torch.int32 and weights.dtype == torch.float32
        want_ids = probs.argsort(dim=-1, descending=True)[:, :3]
        assert torch.equal(ids.long(), want_ids)
        want = probs.gather(1, want_ids)
        want = want / want.sum(-1, keepdim=True) if renormalize else want
        torch.testing.assert_close(weights.double(), want, atol=1e-6, rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(routings(), st.sampled_from([1, 4, 16]))
def test_align_layout(routing, block_m):
    tokens, experts, top_k, ids = routing
    sorted_rows, block_experts, num_padded = moe_align_block_size_op(ids, experts, block_m)
    n = tokens * top_k
    # A static length (the step's shape, whatever the routing): every expert's rows padded to whole blocks fit in
    # n + (block_m - 1) per expert that can hold a row, rounded up to a block
    bound = -(-(n + min(experts, n) * (block_m - 1)) // block_m) * block_m
    assert sorted_rows.shape[0] == bound and sorted_rows.shape[0] % block_m == 0
    assert block_experts.shape[0] == sorted_rows.shape[0] // block_m
    flat = ids.reshape(-1).tolist()
    counts = [flat.count(e) for e in range(experts)]
    padded = [-(-c // block_m) * block_m for c in counts]
    assert num_padded.tolist() == [sum(padded)]
    assert sorted(r for r in sorted_rows.tolist() if r < n) == list(range(n))  # every row once
    assert all(r == n for r in sorted_rows[sum(padded):].tolist())  # the tail is padding
    start = 0
    for e in range(experts):  # expert e's rows in row order, then padding, in blocks of expert e
        segment = sorted_rows[start : start + padded[e]].tolist()
        assert segment == [r for r in range(n) if flat[r] == e] + [n] * (padded[e] - counts[e])
        assert all(b == e for b in block_experts[start // block_m : (start + padded[e]) // block_m].tolist())
        start += padded[e]


@settings(max_examples=20, deadline=None)
@given(routings(max_tokens=6, max_experts=6))
def test_fused_moe_reference_equals_float64(routing):
    tokens, experts, top_k, ids = routing
    g = torch.Generator().manual_seed(tokens * 31 + experts)
    hidden, inter = 16, 12
    x = torch.randn(tokens, hidden, generator=g)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3
    down = torch.randn(experts, hidden, inter, generator=g) * 0.3
    weights = torch.rand(tokens, top_k, generator=g)
    got = fused_moe_op(x, gate_up, down, weights, ids)
    torch.testing.assert_close(got.double(), float64_moe(x, gate_up, down, weights, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("renormalize", [False, True])
def test_routed_moe_equals_float64_routing_and_experts(renormalize):
    """ce::routed_moe (CPU: its reference) = float64 softmax and top-k, then the float64 experts."""
    g = torch.Generator().manual_seed(5)
    tokens, experts, top_k, hidden, inter = 6, 8, 3, 16, 12
    x = torch.randn(tokens, hidden, generator=g)
    logits = torch.randn(tokens, experts, generator=g) * 3
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3
    down = torch.randn(experts, hidden, inter, generator=g) * 0.3
    probs = torch.softmax(logits.double(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    got = routed_moe_op(x, logits, gate_up, down, top_k, renormalize)
    torch.testing.assert_close(got.double(), float64_moe(x, gate_up, down, weights, ids), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# The Triton kernel in the interpreter (child process: TRITON_INTERPRET=1 must be set before triton decorates)
# ----------------------------------------------------------------------------------------------------------------


def _child_checks() -> dict:
    from hypothesis import HealthCheck, Phase

    from ops.triton import moe_kernels

    results = {}

    @settings(max_examples=12, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(routings(max_tokens=10, max_experts=8), st.sampled_from([16, 32]), st.sampled_from([16, 32]),
           st.sampled_from([(16, 24), (40, 20)]), st.booleans())
    def run(routing, block_m, block_n, dims, strided):
        tokens, experts, top_k, ids = routing
        hidden, inter = dims  # neither always a multiple of the tiles
        g = torch.Generator().manual_seed(tokens * 131 + experts * 7 + top_k)
        x = torch.randn(tokens, hidden + (3 if strided else 0), generator=g)[:, :hidden]
        gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3
        down = torch.randn(experts, hidden, inter, generator=g) * 0.3
        weights = torch.rand(tokens, top_k, generator=g)
        want = fused_moe_reference(x, gate_up, down, weights, ids)
        got = moe_kernels.fused_moe(x, gate_up, down, weights, ids, block_m=block_m, block_n=block_n, block_k=16)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)

    @settings(max_examples=12, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(routings(max_tokens=6, max_experts=8), st.sampled_from([2, 4, 8]), st.sampled_from([8, 16, 64]),
           st.sampled_from([(16, 24), (40, 20), (21, 13)]), st.booleans())
    def gemv(routing, block_n, block_k, dims, strided):
        """The few-tokens path (``experts_gemv``): chunks along K that do not divide H or I, column blocks past the
        end, experts chosen by several tokens."""
        tokens, experts, top_k, ids = routing
        hidden, inter = dims
        g = torch.Generator().manual_seed(tokens * 131 + experts * 7 + top_k)
        x = torch.randn(tokens, hidden + (3 if strided else 0), generator=g)[:, :hidden]
        gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3
        down = torch.randn(experts, hidden, inter, generator=g) * 0.3
        weights = torch.rand(tokens, top_k, generator=g)
        tiles = dict(block_n=block_n, block_k=block_k, num_warps=1)
        got = moe_kernels.experts_gemv(x, gate_up, down, weights, ids, dict(gate_up=tiles, down=tiles))
        torch.testing.assert_close(got.double(), float64_moe(x, gate_up, down, weights, ids), atol=1e-4, rtol=1e-4)
        if tokens <= moe_kernels.MOE_GEMV_MAX_TOKENS:  # and the op's own dispatch, at its default tiles
            got = moe_kernels.fused_moe(x, gate_up, down, weights, ids)
            torch.testing.assert_close(got.double(), float64_moe(x, gate_up, down, weights, ids), atol=1e-4,
                                       rtol=1e-4)

    @settings(max_examples=25, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(routings(max_tokens=40, max_experts=40), st.sampled_from([1, 4, 16]))
    def align(routing, block_m):
        _, experts, _, ids = routing
        got = moe_kernels.moe_align(ids, experts, block_m)
        want = moe_align_block_size(ids, experts, block_m)
        for name, a, b in zip(("sorted_rows", "block_experts", "num_padded"), got, want):
            assert torch.equal(a, b), f"{name}: kernel {a.tolist()} != torch {b.tolist()}"

    @settings(max_examples=20, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(st.integers(1, 5), st.integers(1, 300), st.integers(1, 8), st.booleans(), st.booleans(),
           st.integers(0, 2**16))
    def route(tokens, experts, top_k, renormalize, strided, seed):
        top_k = min(top_k, experts)
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(tokens, experts + (4 if strided else 0), generator=g)[:, :experts] * 3
        weights, ids = moe_kernels.moe_route(logits, top_k, renormalize)
        want_weights, want_ids = moe_route_reference(logits, top_k, renormalize)
        assert torch.equal(ids, want_ids), f"ids {ids.tolist()} != {want_ids.tolist()}"
        torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)

    @settings(max_examples=12, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
    @given(st.integers(1, 2 * moe_kernels.MOE_GEMV_MAX_TOKENS), st.integers(2, 40), st.integers(1, 4),
           st.booleans(), st.booleans(), st.integers(0, 2**16))
    def routed(tokens, experts, top_k, renormalize, strided, seed):
        """ce::routed_moe's kernels (the route, then the GEMVs up to MOE_GEMV_MAX_TOKENS tokens, the align and the
        grouped GEMMs above) against the float64 experts of the reference's routing."""
        top_k = min(top_k, experts)
        g = torch.Generator().manual_seed(seed)
        hidden, inter = 24, 20
        x = torch.randn(tokens, hidden, generator=g)
        logits = torch.randn(tokens, experts + (3 if strided else 0), generator=g)[:, :experts] * 3
        gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3
        down = torch.randn(experts, hidden, inter, generator=g) * 0.3
        weights, ids = moe_route_reference(logits, top_k, renormalize)
        got = moe_kernels.routed_moe(x, logits, gate_up, down, top_k, renormalize)
        torch.testing.assert_close(got.double(), float64_moe(x, gate_up, down, weights, ids), atol=1e-4, rtol=1e-4)

    def run_with_sorted_align():  # the align of many rows (the torch sort) under the grouped GEMMs
        limit = moe_kernels.ALIGN_KERNEL_MAX_ROWS
        moe_kernels.ALIGN_KERNEL_MAX_ROWS = 0
        try:
            run()
        finally:
            moe_kernels.ALIGN_KERNEL_MAX_ROWS = limit

    def routed_without_gemv():  # the grouped GEMMs at every token count
        limit = moe_kernels.MOE_GEMV_MAX_TOKENS
        moe_kernels.MOE_GEMV_MAX_TOKENS = 0
        try:
            routed()
        finally:
            moe_kernels.MOE_GEMV_MAX_TOKENS = limit

    checks = [("fused_moe_hypothesis", run), ("moe_align_kernel", align),
              ("fused_moe_sorted_align", run_with_sorted_align), ("moe_route_kernel", route),
              ("routed_moe_kernels", routed), ("experts_gemv", gemv), ("routed_moe_grouped", routed_without_gemv)]
    for name, check in checks:
        try:
            check()
            results[name] = None
        except Exception as error:  # noqa: BLE001  (reported to the parent)
            results[name] = f"{type(error).__name__}: {error}"[-3000:]
    return results


CHILD_ARGV = [sys.executable, __file__, "--child"]


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    return background.child_json(CHILD_ARGV)


@pytest.mark.background_child(CHILD_ARGV)  # started in the background: tests/background.py
def test_fused_moe_kernel_matches_reference_in_interpreter(interpreter_results):
    assert set(interpreter_results) == {"fused_moe_hypothesis", "moe_align_kernel", "fused_moe_sorted_align",
                                        "routed_moe_kernels", "moe_route_kernel", "experts_gemv",
                                        "routed_moe_grouped"}
    for name, error in interpreter_results.items():
        assert error is None, f"{name}: {error}"


# ----------------------------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [pytest.param(8, marks=pytest.mark.quick), 1, 64, 256, 2048])
def test_fused_moe_kernel_on_the_35b_a3b_expert_shape(tokens):
    """bf16, 256 experts, top-8, H 2048, I 512: the kernel (the op's CUDA path) against the CPU-order reference."""
    from ops.triton import moe_kernels

    g = torch.Generator(device="cuda").manual_seed(tokens)
    experts, top_k, hidden, inter = 256, 8, 2048, 512
    x = torch.randn(tokens, hidden, device="cuda", generator=g).bfloat16()
    gate_up = (torch.randn(experts, 2 * inter, hidden, device="cuda", generator=g) * hidden**-0.5).bfloat16()
    down = (torch.randn(experts, hidden, inter, device="cuda", generator=g) * inter**-0.5).bfloat16()
    logits = torch.randn(tokens, experts, device="cuda", generator=g)
    weights, ids = moe_route_op(logits, top_k, True)
    got = fused_moe_op(x, gate_up, down, weights, ids)
    want = fused_moe_reference(x, gate_up, down, weights, ids)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    # ce::routed_moe (what the model runs: the GEMVs at 1 token) on the same router logits, and its grouped GEMMs
    torch.testing.assert_close(routed_moe_op(x, logits, gate_up, down, top_k, True).float(), want.float(), atol=2e-2,
                               rtol=2e-2)
    if tokens <= moe_kernels.MOE_GEMV_MAX_TOKENS:
        grouped = moe_kernels.fused_moe(x, gate_up, down, weights, ids, **moe_kernels.moe_config(tokens * top_k,
                                                                                                   experts))
        torch.testing.assert_close(grouped.float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("renormalize", [pytest.param(True, marks=pytest.mark.quick), False])
def test_route_kernel_on_gpu(renormalize):
    """Router logits of 256 experts (a strided view, as the model's split hands them), top-8. fp32: bf16 logits tie
    often enough that the order of tied experts (unspecified in torch.topk) would decide the test."""
    g = torch.Generator(device="cuda").manual_seed(3)
    logits = (torch.randn(300, 256 + 70, device="cuda", generator=g) * 2)[:, 3:259]
    weights, ids = moe_route_op(logits, 8, renormalize)
    want_weights, want_ids = moe_route_reference(logits.cpu(), 8, renormalize)
    assert torch.equal(ids.cpu(), want_ids)
    torch.testing.assert_close(weights.cpu(), want_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.gpu
def test_fused_moe_kernel_hypothesis_on_gpu():
    from hypothesis import HealthCheck

    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
    @given(routings(max_tokens=300, max_experts=64), st.sampled_from([torch.float32, torch.bfloat16]))
    def run(routing, dtype):
        tokens, experts, top_k, ids = routing
        g = torch.Generator().manual_seed(tokens + experts)
        hidden, inter = 256, 96
        x = torch.randn(tokens, hidden, generator=g).to("cuda", dtype)
        gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5).to("cuda", dtype)
        down = (torch.randn(experts, hidden, inter, generator=g) * inter**-0.5).to("cuda", dtype)
        weights = torch.rand(tokens, top_k, generator=g).cuda()
        ids = ids.cuda()
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        got = fused_moe_op(x, gate_up, down, weights, ids)
        torch.testing.assert_close(got.float(), fused_moe_reference(x, gate_up, down, weights, ids).float(),
                                   atol=tol, rtol=tol)

    run()


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1")
    sys.path.insert(0, str(REPO))
    from tests import interpreter

    interpreter.install()  # Triton's interpreter without its repeated patching
    print(json.dumps(_child_checks()))

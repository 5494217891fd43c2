"""Sparse mixture-of-experts ops (Qwen3.5-MoE, Qwen3-Next): the router's top-k and the routed experts' MLP.

* ``ce::moe_route(router_logits [T, E], top_k, renormalize) -> (weights [T, k] fp32, ids [T, k] int32)``: softmax
  in fp32 over the experts, the k largest probabilities (torch.topk's order), divided by their sum when
  ``renormalize`` (HF's ``norm_topk_prob``). The CUDA kernel does it in one launch per step (one program per
  token); ties go to the lower expert index there, torch.topk's order is unspecified.
* ``ce::moe_align_block_size(ids [T, k] int32, num_experts, block_m) -> (sorted_rows, block_experts,
  num_padded)``: the routed rows sorted by expert in blocks of ``block_m`` rows of one expert each
  (ops/layouts.py ``moe_align_block_size``: static shapes, no host sync). ``ce::fused_moe``'s kernel builds it
  itself; the op is what tests and the microbench call.
* ``ce::fused_moe(x [T, H], gate_up [E, 2I, H], down [E, H, I], weights [T, k], ids [T, k]) -> [T, H]``:
  ``sum_j weights[t, j] * down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t]))`` with ``e = ids[t, j]``, where
  ``gate_up[e] = [gate (I rows) | up (I rows)]`` (HF's fused expert layout). The CUDA kernel is a Triton grouped
  GEMM over the expert-sorted rows, or for up to 8 tokens two GEMVs that read each row's expert from the ids
  (ops/triton/moe_kernels.py); the reference a loop over the experts that got rows. Both sum a token's k expert
  outputs in fp32 and round once.
* ``ce::routed_moe(x, router_logits, gate_up, down, top_k, renormalize) -> [T, H]``: ``ce::moe_route`` then
  ``ce::fused_moe``, what a sparse layer runs (compiled_engine/moe.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ops.layouts import moe_align_block_size, moe_padded_rows
from ops.library import define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import moe_kernels


def moe_route_reference(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def _moe_route_fake(router_logits, top_k, renormalize):
    rows = router_logits.shape[0]
    return (router_logits.new_empty((rows, top_k), dtype=torch.float32),
            router_logits.new_empty((rows, top_k), dtype=torch.int32))


moe_route_op = define_op(
    "moe_route(Tensor router_logits, int top_k, bool renormalize) -> (Tensor, Tensor)",
    reference=moe_route_reference,
    cuda=moe_kernels.moe_route if HAVE_TRITON else None,
    fake=_moe_route_fake,
)


def _moe_align_fake(topk_ids, num_experts, block_m):
    length = moe_padded_rows(topk_ids.numel(), num_experts, block_m)
    return (topk_ids.new_empty((length,), dtype=torch.int32),
            topk_ids.new_empty((length // block_m,), dtype=torch.int32),
            topk_ids.new_empty((1,), dtype=torch.int32))


moe_align_block_size_op = define_op(
    "moe_align_block_size(Tensor topk_ids, int num_experts, int block_m) -> (Tensor, Tensor, Tensor)",
    reference=moe_align_block_size,
    fake=_moe_align_fake,
)


def fused_moe_reference(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """The loop of HF's experts module over the experts that got rows, summing in fp32. Rounded where the kernel
    rounds: gate and up in x's dtype, the activation, and the product before the down projection."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    for expert in torch.unique(ids).tolist():
        tokens, slot = torch.where(ids == expert)
        gate, up = F.linear(x[tokens], gate_up[expert]).chunk(2, dim=-1)
        activated = F.silu(gate) * up
        routed = F.linear(activated, down[expert]).float() * topk_weights[tokens, slot, None].float()
        out.index_add_(0, tokens, routed)
    return out.to(x.dtype)


def _like_x_fake(x, *args):
    return x.new_empty(x.shape)


fused_moe_op = define_op(
    "fused_moe(Tensor x, Tensor gate_up, Tensor down, Tensor topk_weights, Tensor topk_ids) -> Tensor",
    reference=fused_moe_reference,
    cuda=moe_kernels.fused_moe if HAVE_TRITON else None,
    fake=_like_x_fake,
)


def routed_moe_reference(x, router_logits, gate_up, down, top_k: int, renormalize: bool) -> torch.Tensor:
    weights, ids = moe_route_reference(router_logits, top_k, renormalize)
    return fused_moe_reference(x, gate_up, down, weights, ids)


routed_moe_op = define_op(
    "routed_moe(Tensor x, Tensor router_logits, Tensor gate_up, Tensor down, int top_k, bool renormalize) -> Tensor",
    reference=routed_moe_reference,
    cuda=moe_kernels.routed_moe if HAVE_TRITON else None,
    fake=_like_x_fake,
)


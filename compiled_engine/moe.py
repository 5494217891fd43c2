"""The sparse mixture-of-experts MLP of Qwen3.5-MoE and Qwen3-Next (HF's ``*SparseMoeBlock``).

For the normed hidden state x of a token (HF transformers' modeling files are the reference):
  * router: ``softmax(gate(x))`` in fp32 over the E experts, the top k, renormalised to sum 1 when
    ``norm_topk_prob`` (always for Qwen3.5-MoE);
  * routed experts: ``sum_j w_j * down_e(silu(gate_e(x)) * up_e(x))`` over the k chosen experts; with the router,
    one op: ``ce::routed_moe`` (``ce::moe_route``, then ``ce::fused_moe``: GEMVs for a few tokens, grouped GEMMs above);
  * shared expert: a SwiGLU MLP every token takes, scaled by ``sigmoid(shared_expert_gate(x))``;
  * output: routed + scaled shared.

The three projections of x that every token needs (the shared expert's gate and up, the router, the shared gate)
are one matrix ``input_proj = [shared_expert.gate_proj | shared_expert.up_proj | gate (the router, E rows) |
shared_expert_gate (1 row)]``: one GEMM instead of three. The routing weights stay fp32 up to the weighted sum
(HF rounds them to the model's dtype first: bf16 models differ by that rounding). The experts' weights are HF's
fused layout, ``gate_up [E, 2I, H]`` and ``down [E, H, I]``, held flattened to 2-D (``[E * 2I, H]``,
``[E * H, I]``) so that each per-expert checkpoint tensor fills a row range (compiled_engine/loader.py).

Tensor parallel: every expert is cut by its intermediate dimension, as the dense MLP is (each rank holds I/world of
every expert's gate, up and down; the shared expert likewise), and the router and the shared gate are replicated.
So each rank routes exactly as the others, computes a partial sum of every routed and shared expert output, and
the one all-reduce the dense MLP already pays completes them. Expert parallelism (whole experts per rank) would need
a token dispatch and combine (all-to-all) of data-dependent sizes, which a static-shape decode graph cannot hold
without padding to the worst case, and its load follows the routing skew; cutting by I keeps every rank's work equal
whatever the routing. Its cost: each rank's GEMMs are narrower (I / world columns).
"""

from __future__ import annotations

import torch
from torch import nn

from compiled_engine.config import ModelConfig
from compiled_engine.distributed import TensorParallel
from compiled_engine.layers import empty_parameter
from ops.linear import linear, silu_mul_linear
from ops.moe import routed_moe_op


class SparseMoE(nn.Module):
    def __init__(self, config: ModelConfig, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        hidden = config.hidden_size
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        self.expert_intermediate = config.moe_intermediate_size // tp.world_size
        self.shared_intermediate = config.shared_expert_intermediate_size // tp.world_size
        self.input_proj = empty_parameter(2 * self.shared_intermediate + self.num_experts + 1, hidden)
        self.shared_down = empty_parameter(hidden, self.shared_intermediate)
        self.experts_gate_up = empty_parameter(self.num_experts * 2 * self.expert_intermediate, hidden)
        self.experts_down = empty_parameter(self.num_experts * hidden, self.expert_intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MoE output for normed rows x ``[T, H]`` (summed over the tensor-parallel ranks)."""
        hidden = x.shape[-1]
        shared_gate_up, router_logits, shared_gate = linear(x, self.input_proj).split(
            [2 * self.shared_intermediate, self.num_experts, 1], dim=-1
        )
        gate_up = self.experts_gate_up.view(self.num_experts, 2 * self.expert_intermediate, hidden)
        down = self.experts_down.view(self.num_experts, hidden, self.expert_intermediate)
        routed = routed_moe_op(x, router_logits, gate_up, down, self.top_k, self.renormalize)
        shared = silu_mul_linear(shared_gate_up, self.shared_down)
        return self.tp.all_reduce(routed + torch.sigmoid(shared_gate) * shared)

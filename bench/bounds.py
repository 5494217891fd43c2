"""The performance model (docs/ARCHITECTURE.md, "Performance model"): how fast decode could possibly be on this machine.

Decode is memory-bound. One decode step of a batch of B sequences must at least
  * read every weight once: ``weight_bytes`` (a tied embedding is read once, as lm_head; an untied model's input
    embedding is not counted, since a step reads only B of its rows);
  * read and write every sequence's linear-attention state: ``2 x state_bytes`` per sequence (fp32 recurrent state
    + conv state), and
  * read the K/V of every cached token of every sequence: ``kv_bytes_per_token x context``.
A sparse-MoE model's step reads only the experts its tokens were routed to: ``weight_bytes`` counts everything but
the routed experts (attention and linear-attention weights, the routers, the shared experts, lm_head), and a batch
of B adds ``expected_experts(B) x expert_bytes``, the distinct experts B tokens touch under uniform routing
(``E x (1 - (1 - k/E)^B)`` per layer; random weights route about uniformly): k experts at batch 1, nearly all of
them at batch 256 of a 256-expert top-8 model.
So ``bytes/step = weight_bytes + B x (2 x state_bytes + kv_bytes_per_token x context)`` (plus the experts) and the
bound is
``tok/s <= B x bandwidth / bytes_per_step``; at batch 1 it is about ``bandwidth / weight_bytes``. The bandwidth is a
device-to-device copy measured in the same run (bench/bandwidth.py), never a datasheet number.
Prefill is compute-bound (~2 x params FLOPs per token) and is left out of these bounds: a workload bound built
from them is a decode-only lower bound on time, so the fraction reported against it is conservative.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class ModelBytes:
    params: int  # distinct parameters (a tied embedding counted once)
    weight_bytes: int  # bytes one decode step reads from the weights
    recurrent_state_bytes: int  # per sequence, all linear layers
    conv_state_bytes: int  # per sequence, all linear layers
    kv_bytes_per_token: int  # K and V, all attention layers
    expert_bytes: int = 0  # one routed expert in every sparse layer (gate, up, down); not in weight_bytes
    num_experts: int = 0
    top_k: int = 0

    def expected_experts(self, batch: int) -> float:
        """Distinct experts per sparse layer that ``batch`` tokens touch, in expectation under uniform routing."""
        if not self.num_experts:
            return 0.0
        return self.num_experts * (1 - (1 - self.top_k / self.num_experts) ** batch)

    def weight_bytes_at(self, batch: int) -> float:
        """Bytes a decode step of ``batch`` tokens reads from the weights: ``weight_bytes`` plus the routed experts
        they touch (a dense model: ``weight_bytes``)."""
        return self.weight_bytes + self.expected_experts(batch) * self.expert_bytes

    @property
    def state_bytes(self) -> int:
        return self.recurrent_state_bytes + self.conv_state_bytes

    def as_dict(self) -> dict:
        return {**asdict(self), "state_bytes": self.state_bytes, "weight_bytes_at_batch_1": self.weight_bytes_at(1)}


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def state_and_kv_bytes(config, dtype: torch.dtype, state_dtype: torch.dtype = torch.float32) -> tuple[int, int, int]:
    """(recurrent state bytes, conv state bytes) per sequence and KV bytes per token, from a ModelConfig."""
    linear, full = len(config.linear_attention_layers), len(config.full_attention_layers)
    recurrent = linear * config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    conv = linear * config.conv_dim * (config.linear_conv_kernel_dim - 1)
    kv = full * 2 * config.num_key_value_heads * config.head_dim
    return recurrent * _size(state_dtype), conv * _size(dtype), kv * _size(dtype)


def model_bytes(model, dtype: torch.dtype, state_dtype: torch.dtype = torch.float32) -> ModelBytes:
    """From a loaded compiled_engine HybridModel: its parameters as they sit in memory (dtype per tensor). A
    tensor-parallel rank's model gives its own shard's bytes, state and KV included (its heads: 1 / world of each):
    what that rank's GPU must move in a step, the bound of a sharded step."""
    seen: set[int] = set()
    params = weight = 0
    embed = model.embed_tokens
    tied = embed.data_ptr() == model.lm_head.data_ptr()
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        params += p.numel()
        if name == "embed_tokens" and not tied:
            continue  # a step reads B rows of an untied input embedding, not the matrix
        weight += p.numel() * p.element_size()
    recurrent, conv, kv = (size // model.tp.world_size for size in state_and_kv_bytes(model.config, dtype, state_dtype))
    c = model.config
    expert = 0
    for layer in model.layers:  # the routed experts leave weight_bytes: a step reads only those it routes to
        if getattr(layer, "sparse", False):
            routed = layer.mlp.experts_gate_up.nbytes + layer.mlp.experts_down.nbytes
            weight -= routed
            expert += routed // c.num_experts
    return ModelBytes(params, weight, recurrent, conv, kv, expert, c.num_experts if expert else 0,
                      c.num_experts_per_tok if expert else 0)


def model_bytes_from_config(config, dtype: torch.dtype, state_dtype: torch.dtype = torch.float32) -> ModelBytes:
    """The same from a ModelConfig alone (no weights loaded); A_log and dt_bias are fp32 as the loader keeps them."""
    c = config
    h, size = c.hidden_size, _size(dtype)
    mlp = 3 * h * c.intermediate_size + 2 * h  # gate, up, down + the two layer norms
    num_sparse = len(c.moe_layers)
    expert = 3 * h * c.moe_intermediate_size  # one routed expert's gate, up, down
    # a sparse layer without its routed experts: router, shared gate, shared expert, the two layer norms
    moe = (c.num_experts + 1) * h + 3 * h * c.shared_expert_intermediate_size + 2 * h
    hv = c.linear_num_value_heads
    linear_mixer = (c.conv_dim + c.linear_value_dim + 2 * hv) * h + c.conv_dim * c.linear_conv_kernel_dim
    linear_mixer += c.linear_value_head_dim + h * c.linear_value_dim  # gated norm, out_proj
    attention = (2 * c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim * h
    attention += h * c.num_attention_heads * c.head_dim + 2 * c.head_dim  # o_proj, q_norm, k_norm
    n_lin, n_full = len(c.linear_attention_layers), len(c.full_attention_layers)
    body = n_lin * linear_mixer + n_full * attention + (c.num_hidden_layers - num_sparse) * mlp + h  # + final norm
    body += num_sparse * moe
    embedding = c.vocab_size * h
    routed = num_sparse * c.num_experts * expert
    params = body + embedding + (0 if c.tie_word_embeddings else embedding) + n_lin * 2 * hv + routed
    weight = (body + embedding) * size + n_lin * 2 * hv * 4  # lm_head (= the tied embedding) read once
    recurrent, conv, kv = state_and_kv_bytes(c, dtype, state_dtype)
    return ModelBytes(params, weight, recurrent, conv, kv, num_sparse * expert * size,
                      c.num_experts if num_sparse else 0, c.num_experts_per_tok if num_sparse else 0)


def decode_step_bytes(mb: ModelBytes, batch: int, context: float) -> float:
    """Bytes one decode step of ``batch`` sequences at mean ``context`` tokens must move."""
    return mb.weight_bytes_at(batch) + batch * (2 * mb.state_bytes + mb.kv_bytes_per_token * context)


def decode_bound(mb: ModelBytes, bandwidth: float, batch: int = 1, context: float = 0.0) -> dict:
    """The memory bound of one decode step: bytes, seconds and tokens/s (``bandwidth`` in bytes/s)."""
    step_bytes = decode_step_bytes(mb, batch, context)
    step_s = step_bytes / bandwidth
    return {
        "batch": batch,
        "context": context,
        "bytes_per_step": step_bytes,
        "ms_per_step": step_s * 1e3,
        "tok_s": batch / step_s,
        "bandwidth_GBps": bandwidth / 1e9,
    }


def workload_decode_bound(
    mb: ModelBytes,
    bandwidth: float,
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    max_num_seqs: int,
) -> dict:
    """Decode-only memory bound of a whole offline workload.

    Ideal schedule: requests are admitted in order whenever a state slot is free (at most ``max_num_seqs`` run
    together) and every step decodes every running sequence; each step costs ``decode_step_bytes`` at the running
    sequences' true contexts. Prefill is free here, so the real bound is lower: the fraction is conservative.
    """
    if len(prompt_lens) != len(output_lens):
        raise ValueError("prompt_lens and output_lens differ in length")
    pending = list(zip(prompt_lens, output_lens))[::-1]
    running: list[list[int]] = []  # [context, tokens left]
    total_bytes = 0.0
    steps = 0
    while pending or running:
        while pending and len(running) < max_num_seqs:
            prompt, out = pending.pop()
            running.append([prompt, out])
        context_sum = sum(r[0] for r in running)
        total_bytes += decode_step_bytes(mb, len(running), 0.0) + mb.kv_bytes_per_token * context_sum
        steps += 1
        for r in running:
            r[0] += 1
            r[1] -= 1
        running = [r for r in running if r[1] > 0]
    seconds = total_bytes / bandwidth
    tokens = sum(output_lens)
    return {
        "kind": "decode-only memory bound (prefill excluded: conservative)",
        "decode_steps": steps,
        "bytes": total_bytes,
        "seconds": seconds,
        "output_tok_s": tokens / seconds,
        "max_num_seqs": max_num_seqs,
        "bandwidth_GBps": bandwidth / 1e9,
    }

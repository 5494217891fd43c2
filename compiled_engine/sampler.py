"""Token sampling on the device, with no host synchronisation inside: the ``ce::sample`` op (ops/sample.py).

Randomness is counter-based: the uniform noise for (request seed, output index, vocab id) is a hash of those
three integers computed on the device (splitmix64). A seeded request therefore draws the same tokens whatever
else is in the batch, after a preemption, and across processes, and no torch.Generator state is shared.
Sampling is a Gumbel-max draw (the exponential race) among the tokens that top-k, top-p and min-p keep.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ops.sample import sample_op, uniform_noise

__all__ = ["SamplingBatch", "sample", "uniform_noise"]


@dataclass
class SamplingBatch:
    """Per-row sampling parameters of one step, as device tensors (built once per step on the host)."""

    temperature: torch.Tensor  # [B] fp32, 0 = greedy
    top_k: torch.Tensor  # [B] int64, 0 = off
    top_p: torch.Tensor  # [B] fp32
    min_p: torch.Tensor  # [B] fp32
    seeds: torch.Tensor  # [B] int64
    counters: torch.Tensor  # [B] int64: index of the token being drawn in the request's output
    suppress_rows: torch.Tensor  # [n] int64 } (row, token) pairs whose logits are set to -inf
    suppress_tokens: torch.Tensor  # [n] int64 } (EOS/stop tokens before min_tokens)
    all_greedy: bool
    use_top_k: bool
    use_top_p: bool


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Next token per row ``[B]`` int64 from logits ``[B, vocab]`` (model dtype or fp32; rows may be strided):
    ``ce::sample`` after setting the suppressed (row, token) pairs to -inf (min_tokens)."""
    if batch.suppress_rows.numel():
        minus_inf = torch.tensor(float("-inf"), dtype=logits.dtype)
        logits = logits.index_put((batch.suppress_rows, batch.suppress_tokens), minus_inf)
    if batch.all_greedy:
        return logits.argmax(dim=-1)
    return sample_op(logits, batch.temperature, batch.top_k, batch.top_p, batch.min_p, batch.seeds, batch.counters,
                     batch.use_top_k, batch.use_top_p)

"""Token sampling on the device, with no host synchronisation inside.

Randomness is counter-based: the uniform noise for (request seed, output index, vocab id) is a hash of those
three integers computed on the device (splitmix64). A seeded request therefore draws the same tokens whatever
else is in the batch, after a preemption, and across processes, and no torch.Generator state is shared.
Sampling uses the exponential race: ``argmax(p / E)`` with ``E = -log(U)`` picks token i with probability ``p_i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # signed int64 views of the splitmix64 constants
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _logical_shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (64 - bits)) - 1)  # torch's >> on int64 is arithmetic


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    x = x + _GOLDEN
    x = (x ^ _logical_shift_right(x, 30)) * _MIX1
    x = (x ^ _logical_shift_right(x, 27)) * _MIX2
    return x ^ _logical_shift_right(x, 31)


def uniform_noise(seeds: torch.Tensor, counters: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """U(0, 1) noise ``[B, vocab]`` that depends only on (seed, counter, vocab id)."""
    vocab = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    row = _splitmix64(_splitmix64(seeds.long()) ^ counters.long())
    # Top 23 bits: (bits + 0.5) / 2**23 is exact in fp32 and at most 1 - 2**-24 < 1. With 24 bits the largest value
    # rounded to 1.0, so E = -log(U) was 0 and p / E inf or NaN: that token won whatever its probability (even a
    # filtered or suppressed one), in ~1.5% of the draws at a 248k vocabulary.
    bits = _logical_shift_right(_splitmix64(row[:, None] ^ vocab[None, :] * _GOLDEN), 41)
    return (bits.float() + 0.5) * (1.0 / (1 << 23))


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
    use_min_p: bool


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Next token per row ``[B]`` int64 from fp32 logits ``[B, vocab]``."""
    logits = logits.float()
    if batch.suppress_rows.numel():
        logits = logits.index_put((batch.suppress_rows, batch.suppress_tokens), torch.tensor(float("-inf")))
    greedy_tokens = logits.argmax(dim=-1)
    if batch.all_greedy:
        return greedy_tokens
    temperature = torch.where(batch.temperature > 0, batch.temperature, torch.ones_like(batch.temperature))
    logits = logits / temperature[:, None]
    if batch.use_top_k or batch.use_top_p:
        logits = _apply_top_k_top_p(logits, batch)
    probs = logits.softmax(dim=-1)
    if batch.use_min_p:
        threshold = batch.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < threshold, 0.0)
    exponential = -torch.log(uniform_noise(batch.seeds, batch.counters, logits.shape[-1]))
    sampled = (probs / exponential).argmax(dim=-1)
    return torch.where(batch.temperature > 0, sampled, greedy_tokens)


def _apply_top_k_top_p(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(batch.top_k > 0, batch.top_k, torch.full_like(batch.top_k, vocab))
    drop = ranks >= k[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the tokens ranked before it already reach top_p (the most likely token always stays).
    # Rows with top_p == 1 drop nothing: their fp32 cumsum can round up to 1 before the tail, which would cut
    # tokens only because another row of the batch uses top_p.
    mass_before = probs.cumsum(dim=-1) - probs
    drop = (mass_before >= batch.top_p[:, None]) & (batch.top_p[:, None] < 1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)

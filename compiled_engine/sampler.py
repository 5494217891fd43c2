"""Token sampling on the device, with no host synchronisation inside: the ``ce::sample`` op (ops/sample.py).

Randomness is counter-based: the uniform noise for (request seed, output index, vocab id) is a hash of those
three integers computed on the device (splitmix64). A seeded request therefore draws the same tokens whatever
else is in the batch, after a preemption, and across processes, and no torch.Generator state is shared.
Sampling is a Gumbel-max draw (the exponential race) among the tokens that top-k, top-p and min-p keep.
A logit bias and then penalties (presence, frequency, repetition; from the row's tokens) change a row's logits first
(``apply_logit_bias``, ``apply_penalties``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ops.sample import sample_op, uniform_noise

__all__ = ["LogitBias", "Penalties", "SamplingBatch", "apply_logit_bias", "apply_penalties", "sample", "uniform_noise"]


@dataclass
class LogitBias:
    """Biases added to single logits of a step, on the device: ``bias[i]`` to (``rows[i]``, ``tokens[i]``)."""

    rows: torch.Tensor  # [n] int64
    tokens: torch.Tensor  # [n] int64
    bias: torch.Tensor  # [n] fp32


def apply_logit_bias(logits: torch.Tensor, logit_bias: LogitBias) -> torch.Tensor:
    """``logits`` ``[B, V]`` in fp32 with the biases added (a new tensor)."""
    out = logits.to(torch.float32, copy=True)
    return out.index_put_((logit_bias.rows, logit_bias.tokens), logit_bias.bias, accumulate=True)


@dataclass
class Penalties:
    """The penalised rows of a step and their tokens, on the device. Token lists are padded with the vocabulary size
    (a column dropped after counting)."""

    rows: torch.Tensor  # [P] int64: rows of the step's logits
    prompt_tokens: torch.Tensor  # [P, Lp] int64
    output_tokens: torch.Tensor  # [P, Lo] int64: the tokens generated so far (less ``last_tokens``, if given)
    last_tokens: torch.Tensor | None  # [P] int64: each row's last generated token, where only the device has it
    presence: torch.Tensor  # [P] fp32
    frequency: torch.Tensor  # [P] fp32
    repetition: torch.Tensor  # [P] fp32


def apply_penalties(logits: torch.Tensor, penalties: Penalties) -> torch.Tensor:
    """``logits`` ``[B, V]`` in fp32 with the penalties applied to their rows (a new tensor), as vLLM and OpenAI
    define them: a token in the prompt or the output has a positive logit divided by the repetition penalty and a
    negative one multiplied by it; then a token generated c > 0 times loses frequency x c + presence."""
    vocab = logits.shape[-1]
    rows = logits.index_select(0, penalties.rows).float()
    n, device = rows.shape[0], rows.device
    ones = torch.ones(penalties.output_tokens.shape, dtype=torch.float32, device=device)
    counts = torch.zeros(n, vocab + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, penalties.output_tokens, ones)
    if penalties.last_tokens is not None:
        counts.scatter_add_(1, penalties.last_tokens[:, None], torch.ones(n, 1, dtype=torch.float32, device=device))
    seen = torch.zeros(n, vocab + 1, dtype=torch.bool, device=device)
    seen.scatter_(1, penalties.prompt_tokens, True)
    counts, seen = counts[:, :vocab], seen[:, :vocab]
    generated = counts > 0
    repetition = torch.where(seen | generated, penalties.repetition[:, None], 1.0)
    rows = torch.where(rows > 0, rows / repetition, rows * repetition)
    rows = rows - penalties.frequency[:, None] * counts - penalties.presence[:, None] * generated
    return logits.to(torch.float32, copy=True).index_copy_(0, penalties.rows, rows)


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
    logit_bias: LogitBias | None = None
    penalties: Penalties | None = None


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Next token per row ``[B]`` int64 from logits ``[B, vocab]`` (model dtype or fp32; rows may be strided):
    ``ce::sample`` after the logit bias, the penalties (vLLM's order) and setting the suppressed (row, token) pairs to
    -inf (min_tokens)."""
    if batch.logit_bias is not None:
        logits = apply_logit_bias(logits, batch.logit_bias)
    if batch.penalties is not None:
        logits = apply_penalties(logits, batch.penalties)
    if batch.suppress_rows.numel():
        minus_inf = torch.tensor(float("-inf"), dtype=logits.dtype)
        logits = logits.index_put((batch.suppress_rows, batch.suppress_tokens), minus_inf)
    if batch.all_greedy:
        return logits.argmax(dim=-1)
    return sample_op(logits, batch.temperature, batch.top_k, batch.top_p, batch.min_p, batch.seeds, batch.counters,
                     batch.use_top_k, batch.use_top_p)

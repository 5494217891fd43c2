"""``ce::logprobs``: each row's log-probability of its chosen token and its ``k`` most likely tokens, from the logits
the step produced (no second forward).

``ce::logprobs(logits [B, V], tokens [B] int64, k) -> (chosen [B] fp32, top_logprobs [B, k] fp32, top_ids [B, k]
int64)``: ``log_softmax`` of the raw logits in fp32 (the model's distribution: before temperature, top-k/p or any
suppression, vLLM's default ``raw_logprobs``), gathered at ``tokens``, and its top ``k`` in descending order (ties:
torch.topk's order). Logits are bf16, fp16 or fp32; rows may be strided. ``k`` may be 0.

Why an op: the engine applies it only to a step some row of which asked for logprobs, on the logits the step already
wrote, right after its tokens are known; as an op the compiled decode epilogue can take it in later, next to
``ce::sample`` and ``ce::advance_decode_inputs``, with nothing changing for its callers. The CUDA implementation is
the reference for now (two reductions over ``[B, V]``).
"""

from __future__ import annotations

import torch

from ops.library import define_op

MAX_LOGPROBS = 20  # the most top-n logprobs a request may ask for (vLLM's default max_logprobs, OpenAI's limit)


def logprobs_reference(
    logits: torch.Tensor, tokens: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if logits.dim() != 2 or tokens.shape != (logits.shape[0],):
        raise ValueError(f"logprobs: logits [B, V] and tokens [B], got {tuple(logits.shape)} {tuple(tokens.shape)}")
    if not 0 <= k <= logits.shape[1]:
        raise ValueError(f"logprobs: k must be in [0, {logits.shape[1]}], got {k}")
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, tokens.long()[:, None])[:, 0]
    top = logprobs.topk(k, dim=-1)
    return chosen, top.values, top.indices


def _logprobs_fake(logits, tokens, k):
    rows = logits.shape[0]
    return (logits.new_empty((rows,), dtype=torch.float32), logits.new_empty((rows, k), dtype=torch.float32),
            logits.new_empty((rows, k), dtype=torch.long))


logprobs_op = define_op(
    "logprobs(Tensor logits, Tensor tokens, int k) -> (Tensor, Tensor, Tensor)",
    reference=logprobs_reference,
    fake=_logprobs_fake,
)

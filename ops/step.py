"""The tensors of one step: its inputs (StepInputs, everything a forward needs besides the weights and the caches)
and what a decode step returns (DecodeOutput, HostTokens).

Every op of a step reads slices of a StepInputs; the model reads it and nothing else; graph capture
(graphs/static_inputs.py) keeps a fixed-address copy of it. No globals: a reader can see every input of a step here,
and every tensor the step mutates is a cache/pool buffer of a layer.

Prefill packs the new tokens of N sequences back to back (varlen); decode has exactly one token per sequence,
so T == N. A prefill step may lead with ``decode_rows`` sequences of one token each (a mixed step's decode rows):
the linear layers run those through their decode kernels and the rest, the prompt part, through the chunked path. In a bucketed (CUDA-graphed) decode batch, padding lanes point at the null slot and the null block
with ``context_lens == 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] int64: the new tokens
    positions: torch.Tensor  # [T] int64: their absolute positions (RoPE)
    slot_mapping: torch.Tensor  # [T] int64: KV-cache row (block * block_size + offset) each new token is written to
    block_tables: torch.Tensor  # [N, max_blocks] int32: KV blocks of each sequence (0 = null block beyond its end)
    context_lens: torch.Tensor  # [N] int32: cached tokens of each sequence after this step (prefix + new)
    state_slots: torch.Tensor  # [N] int32: the row of each sequence in every linear layer's state pools
    cu_seqlens: torch.Tensor | None = None  # [N + 1] int32: prefill only; sequence n owns tokens [cu[n], cu[n+1])
    is_prefill: bool = False  # a Python bool: prefill and decode are different graphs
    # Prefill only, optional: what the chunked delta rule (FLA) would otherwise derive from cu_seqlens in every linear
    # layer, with a host sync each time (ops/delta_rule.py). Every layer passes these very objects: FLA memoises on
    # their identity, so they are made anew for each step and never refilled in place.
    cu_seqlens_long: torch.Tensor | None = None  # [N + 1] int64: cu_seqlens again
    chunk_indices: torch.Tensor | None = None  # [num_chunks, 2] int64: (sequence, chunk of it) per 64-token chunk
    # Prefill only: the step is captured into a CUDA graph (graphs/prefill_graph.py), where launches cost nothing, so
    # its ops take their forms of least GPU time (the delta rule its chunked form at every length).
    graphed: bool = False
    # A verify step of speculative decoding (a prefill step in every other respect): each sequence scores the same
    # number of tokens, its last one and its drafts; the linear layers keep what each position adds to the state
    # apart (their verify history) and leave the pools unchanged until the model's commit_verify.
    speculative: bool = False
    # Prefill only: the first ``decode_rows`` sequences have one token each, the step's first tokens. The linear
    # layers compute them as a decode step computes a row, from the pools' state in one kernel, and the prompt part
    # (the other sequences) through the chunked prefill path: a one-token sequence there is a chunk of its own in
    # every FLA kernel and moves its state ~5 times (compiled_engine/gated_deltanet.py). A Python int: each value is
    # a different graph. With decode rows, ``prompt_cu_seqlens`` holds the prompt part's offsets from its first
    # token (``cu_seqlens[decode_rows:] - decode_rows``), and ``cu_seqlens_long`` and ``chunk_indices`` are the
    # prompt part's (the delta rule's hints).
    decode_rows: int = 0
    prompt_cu_seqlens: torch.Tensor | None = None  # [N - decode_rows + 1] int32

    @property
    def num_sequences(self) -> int:
        return self.state_slots.shape[0]

    @property
    def linear_cu_seqlens(self) -> torch.Tensor:
        """The prompt part's offsets (the chunked linear-attention path's): ``cu_seqlens`` without decode rows."""
        return self.cu_seqlens if self.decode_rows == 0 else self.prompt_cu_seqlens

    def last_token_indices(self) -> torch.Tensor:
        """Index of each sequence's last new token in the packed token dimension."""
        if self.is_prefill:
            return (self.cu_seqlens[1:] - 1).long()
        return torch.arange(self.input_ids.shape[0], device=self.input_ids.device)


class HostTokens(NamedTuple):
    """Tokens on their way to the host: ``tokens`` (host memory) holds them once ``ready`` has passed (a CUDA event
    recorded after the work that writes them; None: they are there already)."""

    tokens: torch.Tensor
    ready: torch.cuda.Event | None

    def tolist(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.tokens.tolist()


class DecodeOutput(NamedTuple):
    """What a decode step produces on the device: ``logits`` ``[N, vocab]`` in the model's dtype, and ``tokens``
    ``[N]`` int64, the step's next tokens: each row's argmax (torch.argmax's rule), or with sampling inputs the
    tokens ``ce::sample`` drew, computed in the same graph so that the engine needs no kernel of its own for them.
    ``host_tokens``: the same tokens in host memory, where the decode graph writes them there itself
    (graphs/decode_graph.py), so that reading them back needs no copy."""

    logits: torch.Tensor
    tokens: torch.Tensor
    host_tokens: HostTokens | None = None


@dataclass
class SamplingInputs:
    """Per-row parameters of a sampled decode step, ``ce::sample``'s (ops/sample.py), ``[N]`` each, on the host or
    the device: a row with ``temperature`` 0 is greedy."""

    temperature: torch.Tensor  # fp32
    top_k: torch.Tensor  # int64, 0 = off
    top_p: torch.Tensor  # fp32, 1 = off
    min_p: torch.Tensor  # fp32, 0 = off
    seeds: torch.Tensor  # int64
    counters: torch.Tensor  # int64: the index of the token being drawn in each request's output

    def on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The fields in ``ce::sample``'s argument order, on ``device``."""
        return tuple(t.to(device) for t in (self.temperature, self.top_k, self.top_p, self.min_p, self.seeds,
                                             self.counters))

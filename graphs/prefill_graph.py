"""Captured prompt steps: one CUDA graph per token bucket, for prompt steps of one sequence.

    graphs = PrefillGraphs(model, buckets=(16, ..., 512, 1024, ..., 8192), max_blocks_per_seq=..., block_size=16,
                           device="cuda")
    graphs.capture()                  # every bucket, largest first
    logits = graphs(step)             # a prefill StepInputs of 2 sequences and a bucket's tokens -> fp32 [2, vocab]

    # speculative decoding's prompt step, whose MTP pass drafts after it (compiled_engine/speculative.py ``draft``)
    graphs = PrefillGraphs(model, buckets, ..., drafter=partial(draft, model, num_drafts=k, ...))
    hidden, logits = graphs.forward_keeping_hidden(step)                 # [bucket, H], fp32 [2, vocab]
    drafts = graphs.draft(step, hidden, next_ids, rows, seq_rows)        # the one drafting sequence's [1, k]

Why: a prompt step is host work as much as GPU work. Eager, it launches ~590 kernels from Python one by one: on an
H200 the first token of a prompt of up to 512 tokens came ~16 ms after its arrival and of 1,024-4,096 tokens ~30 ms,
where the step's GPU work takes a few ms; captured, 2.9 ms at 16 tokens, 4.3 at 512, 5.8 at 1,024, 15.8 at 4,096
(bench/NOTES.md, "Prefill graphs"). The step is a few copies and one replay.

What a graph is: the model's eager prompt step (the same ops and kernels, no torch.compile) on fixed-address inputs
of one shape, 2 sequences and ``bucket`` tokens, followed by the logits of both sequences' last tokens. The runtime
makes a step of one sequence that shape by packing a padding sequence after it, on the null slot and the null
block, with the bucket's remaining tokens (``Runtime.prefill``; the memory plan's start-up steps are made the same
way): the padding's results go to rows nobody reads, and every op computes each sequence apart from the others.
Any step of 2 sequences and a bucket's tokens may replay it: the graph is a function of the step's tensors only.

What makes a prompt step capturable: every op sizes its grid from shapes and reads each sequence's lengths, slots
and tables from tensors, and nothing reads a device value on the host (tests/test_kernels_cuda.py checks that an
eager prompt step never synchronises). The step is marked ``graphed``: launches cost nothing in a graph, so the
delta rule takes its chunked form (FLA) at every length, not the recurrent form that spares an eager step's host
time. The chunked form sizes its grid from its chunk table's length, which depends on where the sequences end: the
runtime pads a bucket's table to one length with skip rows (``ops.delta_rule.host_chunk_indices``), and the table is
data copied in like the other fields. FLA memoises what it derives from the int64 offsets on their tensor's
identity, so the capture hands it a view of its own, not the warm-up's: the derivation is recorded in the graph and
recomputed at every replay.

With a ``drafter`` (speculative decoding) each bucket has a second graph: the MTP layer's pass over the step's rows
and the drafts after its first sequence's last row, on the hidden states the prompt graph leaves in a buffer and
the next tokens the caller samples in between (``draft``): a speculative prompt step is two replays, where eager it
is the prompt step's launches and the MTP pass's. The prompt graph is the same step, but for the copy of its hidden
states into that buffer.

Buckets stop at ``RuntimeConfig.max_prefill_capture_tokens`` (8,192 by default: an 8,192-token prompt's step took
37 ms eager on an H200 of which ~27 were GPU work, and the graphs' memory pool, the largest step's activations held
for good, grows with it).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from ops.delta_rule import host_chunk_indices, max_chunk_rows
from ops.library import NULL_BLOCK, NULL_SLOT
from ops.step import StepInputs

NUM_SEQUENCES = 2  # a step's sequence and its padding
SMALLEST_BUCKET = 16
# Buckets are powers of two up to this, then every this many tokens: a prompt pads by less than a bucket, at most
# ~3 ms of an H200's prompt rate, where a captured step saves ~10-25 ms of launches.
LARGE_BUCKET_STEP = 1024


def prefill_buckets(max_tokens: int, max_num_batched_tokens: int, max_model_len: int) -> tuple[int, ...]:
    """The token buckets of the captured prompt steps: powers of two from 16 to ``LARGE_BUCKET_STEP``, then every
    ``LARGE_BUCKET_STEP`` tokens; none past ``max_tokens`` (``RuntimeConfig.max_prefill_capture_tokens``), the step
    budget or ``max_model_len`` (the padding's positions stay inside it)."""
    largest = min(max_tokens, max_num_batched_tokens, max_model_len)
    buckets, b = [], SMALLEST_BUCKET
    while b <= largest:
        buckets.append(b)
        b = b * 2 if b < LARGE_BUCKET_STEP else b + LARGE_BUCKET_STEP
    return tuple(buckets)


class PrefillGraphs:
    """One captured prompt step per bucket, over one set of input buffers sized for the largest bucket (each graph
    reads their first ``bucket`` rows) and one memory pool (captured largest first, the smaller graphs reuse it)."""

    def __init__(self, model: nn.Module, buckets: Sequence[int], max_blocks_per_seq: int, block_size: int,
                 device: torch.device, drafter: Drafter | None = None):
        if not buckets or min(buckets) < 1:
            raise ValueError(f"need token buckets >= 1, got {list(buckets)}")
        self.model = model
        self.buckets = tuple(sorted(set(buckets)))
        self.device = torch.device(device)
        self._null_row = NULL_BLOCK * block_size  # the null block's first KV row
        rows, n = self.buckets[-1], NUM_SEQUENCES
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.slot_mapping = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.block_tables = torch.full((n, max_blocks_per_seq), NULL_BLOCK, dtype=torch.int32, device=self.device)
        self.context_lens = torch.zeros(n, dtype=torch.int32, device=self.device)
        self.state_slots = torch.full((n,), NULL_SLOT, dtype=torch.int32, device=self.device)
        self.cu_seqlens = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.cu_seqlens_long = torch.zeros(n + 1, dtype=torch.long, device=self.device)
        self.chunk_indices = torch.zeros(max_chunk_rows(rows, n), 2, dtype=torch.long, device=self.device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}  # each graph's output buffer
        # Speculative decoding: the drafts' graph of each bucket, their inputs (the prompt graph writes ``hidden``;
        # the drafting sequence's last row and its row of the block tables) and outputs
        self.drafter = drafter
        self.hidden: torch.Tensor | None = None  # [rows, H], made by the first (largest) bucket's warm-up
        self.next_ids = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.draft_rows = torch.zeros(1, dtype=torch.long, device=self.device)
        self.draft_seq_rows = torch.zeros(1, dtype=torch.long, device=self.device)
        self._draft_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._drafts: dict[int, torch.Tensor] = {}
        self._loaded: StepInputs | None = None  # the step whose fields the input buffers hold

    def bucket(self, num_tokens: int) -> int | None:
        """The smallest bucket that holds ``num_tokens`` tokens, or None."""
        return next((b for b in self.buckets if b >= num_tokens), None)

    def covers(self, step: StepInputs) -> bool:
        """Whether ``step`` can replay a captured graph: a prefill step of 2 sequences and a bucket's tokens, its chunk
        table padded to the bucket's length (``Runtime.build_step`` with ``pad_to``)."""
        bucket = step.input_ids.shape[0]
        return (step.is_prefill and not step.speculative and step.num_sequences == NUM_SEQUENCES
                and bucket in self._graphs and step.block_tables.shape[1] <= self.block_tables.shape[1]
                and step.chunk_indices is not None and step.chunk_indices.shape[0] == _chunk_rows(bucket))

    def covers_draft(self, step: StepInputs, rows: torch.Tensor) -> bool:
        """Whether the drafts after ``step`` (a step ``covers`` holds for) from ``rows`` can replay a captured graph:
        one drafting sequence, the step's first (the padding never drafts)."""
        return self.drafter is not None and rows.shape == (1,) and self.covers(step)

    def _step(self, bucket: int) -> StepInputs:
        """The bucket's step on the buffers. Its int64 offsets are a new view on every call: FLA memoises on their
        identity, and a capture must record its own derivation, not reuse the warm-up's (see the module docstring)."""
        return StepInputs(self.input_ids[:bucket], self.positions[:bucket], self.slot_mapping[:bucket],
                          self.block_tables, self.context_lens, self.state_slots, self.cu_seqlens, is_prefill=True,
                          cu_seqlens_long=self.cu_seqlens_long[:],
                          chunk_indices=self.chunk_indices[: _chunk_rows(bucket)], graphed=True)

    def _forward(self, step: StepInputs) -> torch.Tensor:
        hidden = self.model(step)
        if self.drafter is not None:
            if self.hidden is None:  # the largest bucket's warm-up, before any capture
                self.hidden = hidden.new_zeros(self.input_ids.shape[0], hidden.shape[1])
            self.hidden[: hidden.shape[0]].copy_(hidden)
        return self.model.compute_logits(hidden[step.last_token_indices()])

    def _draft(self, step: StepInputs) -> torch.Tensor:
        bucket = step.input_ids.shape[0]
        return self.drafter(step, self.hidden[:bucket], self.next_ids[:bucket], self.draft_rows, self.draft_seq_rows)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket's step, largest first. Each runs once eagerly first (its kernels compile there, not
        in the capture), on a step of padding only: both sequences on the null slot and the null block."""
        pool = torch.cuda.graph_pool_handle()
        for bucket in reversed(self.buckets):
            bounds = [0, bucket // 2, bucket]
            self.cu_seqlens.copy_(torch.tensor(bounds, dtype=torch.int32))
            self.cu_seqlens_long.copy_(self.cu_seqlens)
            table = host_chunk_indices(bounds, num_rows=_chunk_rows(bucket))
            self.chunk_indices[: _chunk_rows(bucket)].copy_(torch.tensor(table, dtype=torch.long).view(-1, 2))
            self.context_lens.copy_(torch.tensor([bucket // 2, bucket - bucket // 2], dtype=torch.int32))
            self.state_slots.fill_(NULL_SLOT)
            self.block_tables.fill_(NULL_BLOCK)
            self.slot_mapping.fill_(self._null_row)
            self._forward(self._step(bucket))
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._logits[bucket] = self._forward(self._step(bucket))  # a step of its own: see _step
            self._graphs[bucket] = graph
            if self.drafter is not None:  # from the first sequence's last row, on the padding's hidden states
                self.draft_rows.fill_(bucket // 2 - 1)
                self.draft_seq_rows.zero_()
                self._draft(self._step(bucket))
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._drafts[bucket] = self._draft(self._step(bucket))
                self._draft_graphs[bucket] = graph
        self._loaded = None
        torch.cuda.synchronize(self.device)

    def __call__(self, step: StepInputs) -> torch.Tensor:
        """Replay the graph of ``step``'s bucket on ``step`` (``covers`` must hold): fp32 logits ``[2, vocab]`` of
        each sequence's last token, a tensor of the caller's own (the graph's buffer is copied)."""
        self._load(step)
        return self._replay(step.input_ids.shape[0]).clone()

    def forward_keeping_hidden(self, step: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``self(step)`` with a drafter: ``(hidden [bucket, H], logits)``, both the caller's own tensors."""
        logits = self(step)
        return self.hidden[: step.input_ids.shape[0]].clone(), logits

    def draft(self, step: StepInputs, hidden: torch.Tensor, next_ids: torch.Tensor, rows: torch.Tensor,
              seq_rows: torch.Tensor) -> torch.Tensor:
        """The drafter's drafts ``[1, k]`` after ``step`` (``covers_draft`` must hold) from its ``hidden`` states
        (``forward_keeping_hidden``'s: while ``step`` was the last replayed, the buffer still holds them), ``next_ids``
        ``[bucket]`` (each row's next token), the drafting row ``rows`` and its row of the block tables
        ``seq_rows``: the bucket's drafts graph replayed, its output copied."""
        bucket = step.input_ids.shape[0]
        if self._loaded is not step:  # another step replayed in between: its fields and hidden states back in
            self._load(step)
            self.hidden[:bucket].copy_(hidden)
        self.next_ids[:bucket].copy_(next_ids)
        self.draft_rows.copy_(rows)
        self.draft_seq_rows.copy_(seq_rows)
        return self._replay_draft(bucket).clone()

    def _load(self, step: StepInputs) -> None:
        """Copy ``step``'s fields into the input buffers."""
        bucket = step.input_ids.shape[0]
        width = step.block_tables.shape[1]
        self.input_ids[:bucket].copy_(step.input_ids)
        self.positions[:bucket].copy_(step.positions)
        self.slot_mapping[:bucket].copy_(step.slot_mapping)
        self.block_tables[:, :width].copy_(step.block_tables)
        self.block_tables[:, width:].fill_(NULL_BLOCK)
        self.context_lens.copy_(step.context_lens)
        self.state_slots.copy_(step.state_slots)
        self.cu_seqlens.copy_(step.cu_seqlens)
        self.cu_seqlens_long.copy_(step.cu_seqlens_long)
        self.chunk_indices[: _chunk_rows(bucket)].copy_(step.chunk_indices)
        self._loaded = step

    def _replay(self, bucket: int) -> torch.Tensor:
        """Run the bucket's step on the buffers as they are; returns its logits buffer."""
        self._graphs[bucket].replay()
        return self._logits[bucket]

    def _replay_draft(self, bucket: int) -> torch.Tensor:
        """Run the bucket's drafts on the buffers as they are; returns its drafts buffer."""
        self._draft_graphs[bucket].replay()
        return self._drafts[bucket]


# (step, hidden [T, H], next_ids [T], rows [D], seq_rows [D]) -> drafts [D, k]: speculative decoding's ``draft``
Drafter = Callable[[StepInputs, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _chunk_rows(bucket: int) -> int:
    """The chunk table's length in a bucket's step: the most chunks its 2 sequences can have."""
    return max_chunk_rows(bucket, NUM_SEQUENCES)

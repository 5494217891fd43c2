"""Captured prompt steps: one CUDA graph per (token bucket, sequence bucket, decode lanes), for prompt and mixed steps.

    graphs = PrefillGraphs(model, buckets=(16, ..., 512, 1024, ..., 8192), max_blocks_per_seq=..., block_size=16,
                           device="cuda", max_sequences=256, decode_lanes=16)
    graphs.capture()                  # every (tokens, sequences, lanes) key, largest first
    key = graphs.bucket(num_tokens, num_sequences, decode_rows)   # the smallest graph that holds the step
    logits = graphs(step)             # a prefill StepInputs of the key's shape -> fp32 [its sequences, vocab]

    # speculative decoding's prompt step, whose MTP pass drafts after it (speculative.py ``draft``)
    graphs = PrefillGraphs(model, buckets, ..., drafter=partial(draft, model, num_drafts=k, ...), max_sequences=...)
    hidden, logits = graphs.forward_keeping_hidden(step)                 # [bucket, H], fp32 [sequences + 1, vocab]
    drafts = graphs.draft(step, hidden, next_ids, rows, seq_rows)        # the D drafting sequences' [D, k]

Why: a prompt step is host work as much as GPU work. Eager, it launches ~590 kernels from Python one by one: on an
H200 the first token of a prompt of up to 512 tokens came ~16 ms after its arrival and of 1,024-4,096 tokens ~30 ms,
where the step's GPU work takes a few ms; captured, 2.9 ms at 16 tokens, 4.3 at 512, 5.8 at 1,024, 15.8 at 4,096
(bench/NOTES.md, "Prefill graphs"). Steps of several sequences are as common as steps of one: prompts that arrive
together share a step, and every mixed step (the scheduler's default) holds a new prompt's chunk beside the running
requests' decode rows, so without a graph each arrival would stall every running request for an eager step. The
step is a few copies and one replay.

Mixed keys: a mixed step's decode rows lead it, one token each, and the linear layers compute them through their
decode op (``StepInputs.decode_rows``, compiled_engine/gated_deltanet.py). A graph holds a fixed number of them, so
a key with ``decode_lanes`` (``RuntimeConfig.mixed_decode_lanes``) holds that many one-token lanes first, the step's
decode rows and then padding lanes (one token on the null slot and block: the decode op reads the null slot's
recurrent state as zeros and writes none back), and after them its prompt part, which is padded as a prompt step is (below). Its tokens and
sequences count the prompt part. Mixed keys exist for prompt parts of up to ``MIXED_PROMPT_SEQUENCES`` sequences at
every token bucket; a step of more decode rows, or of more prompts, takes a key without lanes, where its decode rows
go through the chunked path as a prompt's tokens do. Not captured with a drafter.

What a graph is: the model's eager prompt step (the same ops and kernels, no torch.compile) on fixed-address inputs
of one shape, ``tokens`` tokens in ``sequences + 1`` sequences, followed by the logits of every sequence's last
token. The runtime makes a step of n <= ``sequences`` sequences that shape by packing padding sequences after them,
all on the null slot and the null block (``Runtime.prefill``; the memory plan's start-up steps are made the same
way): ``sequences - n`` empty ones, then one of the remaining tokens (empty too if there are none). The padding's
results go to rows nobody reads, and every op computes each sequence apart from the others (an empty sequence has
no tokens to compute). Any step of that shape may replay the graph: it is a function of the step's tensors only.
Sequence buckets grow two-fold (1, 2, 4, 8, ...: ``sequence_buckets``), so a step pads by fewer sequences than it
holds. A padding sequence is not free: the key's chunk table holds a row for each sequence the key may have (each
may end in a partial chunk), and FLA's chunk kernels compute every row, skip rows included, on masked loads; in each
linear layer FLA also copies an empty sequence's initial state to its final one (1 MiB each way at Qwen3.5-0.8B's
shape; the pool's null slot is neither read nor written); and it costs a logits row. Against that, each bucket is a
graph per token bucket to capture at start-up (bench/NOTES.md has both measured).

What makes a step capturable: every op sizes its grid from shapes and reads each sequence's lengths, slots and
tables from tensors, and nothing reads a device value on the host (tests/test_kernels_cuda.py checks that an eager
prompt step never synchronises). The step is marked ``graphed``: launches cost nothing in a graph, so the delta rule
takes its chunked form (FLA) at every length, not the recurrent form that spares an eager step's host time. The
chunked form sizes its grid from its chunk table's length, which depends on where the sequences end: the runtime
pads a key's table to one length with skip rows (``ops.delta_rule.host_chunk_indices``), and the table is data
copied in like the other fields. FLA memoises what it derives from the int64 offsets on their tensor's identity, so
the capture hands it a view of its own, not the warm-up's: the derivation is recorded in the graph and recomputed at
every replay. Every graph writes its logits into one buffer outside the graphs' pool (``__call__`` copies them out):
a buffer a graph would keep for good, and the pool would hold one ``[sequences + 1, vocab]`` fp32 tensor per key.

With a ``drafter`` (speculative decoding) each key has a second graph: the MTP layer's pass over the step's rows and
the drafts after the last rows of as many sequences as the key holds, on the hidden states the prompt graph leaves in
a buffer and the next tokens the caller samples in between (``draft``): a speculative prompt step is two replays,
where eager it is the prompt step's launches and the MTP pass's. The sequences that draft (those whose prompt the
step completes) take the first draft rows; the rest draft from row 0 into the padding sequence's null blocks, and
their drafts are dropped. The prompt graph is the same step, but for the copy of its hidden states into that buffer.

Token buckets stop at ``RuntimeConfig.max_prefill_capture_tokens`` (8,192 by default: an 8,192-token prompt's step
took 37 ms eager on an H200 of which ~27 were GPU work, and the graphs' memory pool, the largest step's activations
held for good, grows with it), sequence buckets at ``RuntimeConfig.max_prefill_capture_seqs`` (and max_num_seqs).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from ops.delta_rule import host_chunk_indices, max_chunk_rows
from ops.library import NULL_BLOCK, NULL_SLOT
from ops.step import StepInputs

SMALLEST_BUCKET = 16
# Buckets are powers of two up to this, then every this many tokens: a prompt pads by less than a bucket, at most
# ~3 ms of an H200's prompt rate, where a captured step saves ~10-25 ms of launches.
LARGE_BUCKET_STEP = 1024
SEQUENCE_BUCKET_GROWTH = 2  # sequence buckets 1, 2, 4, 8, ...
# Mixed keys (decode lanes) are captured for prompt parts of up to this many sequences: a mixed step holds the chunk of
# a prompt or two beside its decode rows (more prompts arrive together at a wave's start, with no decode rows yet).
MIXED_PROMPT_SEQUENCES = 4


def prefill_buckets(max_tokens: int, max_num_batched_tokens: int, max_model_len: int) -> tuple[int, ...]:
    """The token buckets of the captured prompt steps: powers of two from 16 to ``LARGE_BUCKET_STEP``, then every
    ``LARGE_BUCKET_STEP`` tokens; none past ``max_tokens`` (``RuntimeConfig.max_prefill_capture_tokens``), the step
    budget or twice ``max_model_len``: a step of several sequences may hold more tokens than one sequence, and the
    capture's step (two halves) and a step's padding sequence (less than the bucket below, or ``LARGE_BUCKET_STEP``)
    stay within ``max_model_len`` tokens (their positions inside it)."""
    largest = min(max_tokens, max_num_batched_tokens, 2 * max_model_len)
    buckets, b = [], SMALLEST_BUCKET
    while b <= largest:
        buckets.append(b)
        b = b * 2 if b < LARGE_BUCKET_STEP else b + LARGE_BUCKET_STEP
    return tuple(buckets)


def sequence_buckets(max_sequences: int) -> tuple[int, ...]:
    """The sequence buckets of the captured steps (a step's sequences, its padding not counted): 1, then
    ``SEQUENCE_BUCKET_GROWTH`` times the last, up to ``max_sequences``, which is the last."""
    if max_sequences < 1:
        raise ValueError(f"need max_sequences >= 1, got {max_sequences}")
    buckets = [1]
    while buckets[-1] < max_sequences:
        buckets.append(min(buckets[-1] * SEQUENCE_BUCKET_GROWTH, max_sequences))
    return tuple(buckets)


# A graph's (tokens, sequences, decode lanes): that many decode lanes (one token each) first, then the prompt part,
# that many tokens in that many sequences and a padding one
Key = tuple[int, int, int]


class PrefillGraphs:
    """One captured prompt step per key (token bucket, sequence bucket), over one set of input buffers sized for the
    largest (each graph reads their first rows) and one memory pool (captured largest first, the smaller graphs reuse
    it)."""

    def __init__(self, model: nn.Module, buckets: Sequence[int], max_blocks_per_seq: int, block_size: int,
                 device: torch.device, drafter: Drafter | None = None, max_sequences: int = 1, decode_lanes: int = 0):
        if not buckets or min(buckets) < 1:
            raise ValueError(f"need token buckets >= 1, got {list(buckets)}")
        if max(buckets) > 2 * max_blocks_per_seq * block_size:
            raise ValueError(f"token buckets past twice a sequence's blocks ({max_blocks_per_seq} of {block_size}): "
                             f"{list(buckets)}")
        self.model = model
        self.buckets = tuple(sorted(set(buckets)))
        self.sequence_buckets = sequence_buckets(max_sequences)
        if decode_lanes and drafter is not None:
            raise ValueError("mixed keys (decode_lanes) are not captured with a drafter")
        self.decode_lanes = decode_lanes
        # Every sequence bucket at every token bucket that holds one token a sequence; with decode lanes the same
        # again for prompt parts of up to MIXED_PROMPT_SEQUENCES sequences, after the lanes.
        self.keys: tuple[Key, ...] = tuple(
            (t, s, lanes) for lanes in sorted({0, decode_lanes}) for t in self.buckets for s in self.sequence_buckets
            if s <= t and (lanes == 0 or s <= MIXED_PROMPT_SEQUENCES))
        self.device = torch.device(device)
        self._max_len = max_blocks_per_seq * block_size  # the most tokens a padding sequence may hold
        self._null_row = NULL_BLOCK * block_size  # the null block's first KV row
        rows, n = self.buckets[-1] + decode_lanes, self.sequence_buckets[-1] + 1 + decode_lanes
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.slot_mapping = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.block_tables = torch.full((n, max_blocks_per_seq), NULL_BLOCK, dtype=torch.int32, device=self.device)
        self.context_lens = torch.zeros(n, dtype=torch.int32, device=self.device)
        self.state_slots = torch.full((n,), NULL_SLOT, dtype=torch.int32, device=self.device)
        self.cu_seqlens = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.cu_seqlens_long = torch.zeros(n + 1, dtype=torch.long, device=self.device)  # the prompt part's
        self.prompt_cu_seqlens = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        self.chunk_indices = torch.zeros(max_chunk_rows(rows, n), 2, dtype=torch.long, device=self.device)
        self._graphs: dict[Key, torch.cuda.CUDAGraph] = {}
        self.logits: torch.Tensor | None = None  # [n, vocab] fp32, every graph's output; made by the first warm-up
        # Speculative decoding: the drafts' graph of each bucket, their inputs (the prompt graph writes ``hidden``;
        # the drafting sequence's last row and its row of the block tables) and outputs
        self.drafter = drafter
        self.hidden: torch.Tensor | None = None  # [rows, H], made by the first (largest) bucket's warm-up
        self.next_ids = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.draft_rows = torch.zeros(n - 1, dtype=torch.long, device=self.device)
        self.draft_seq_rows = torch.zeros(n - 1, dtype=torch.long, device=self.device)
        self._draft_graphs: dict[Key, torch.cuda.CUDAGraph] = {}
        self._drafts: dict[Key, torch.Tensor] = {}
        self._loaded: StepInputs | None = None  # the step whose fields the input buffers hold

    def bucket(self, num_tokens: int, num_sequences: int = 1, decode_rows: int = 0) -> Key | None:
        """The smallest key that holds a step of ``num_tokens`` tokens in ``num_sequences`` sequences (its padding
        sequence within a sequence's blocks), or None. ``decode_rows``: the step's leading one-token sequences, which
        a mixed key (up to ``decode_lanes`` of them) computes as decode rows; where none holds the step, a key of
        lanes 0 may (the step's decode rows then take the prompt path: ``Runtime.prefill``)."""
        if decode_rows and decode_rows <= self.decode_lanes:
            key = self._bucket(num_tokens - decode_rows, num_sequences - decode_rows, self.decode_lanes)
            if key is not None:
                return key
        return self._bucket(num_tokens, num_sequences, 0)

    def _bucket(self, num_tokens: int, num_sequences: int, lanes: int) -> Key | None:
        most = MIXED_PROMPT_SEQUENCES if lanes else self.sequence_buckets[-1]
        seqs = next((s for s in self.sequence_buckets if s >= max(num_sequences, 1) and s <= most), None)
        tokens = next((t for t in self.buckets if t >= max(num_tokens, seqs or 0)), None)
        if seqs is None or tokens is None or tokens - num_tokens > self._max_len:
            return None
        return tokens, seqs, lanes

    def covers(self, step: StepInputs) -> bool:
        """Whether ``step`` can replay a captured graph: a prefill step of a key's shape (its sequences and a padding
        one), its chunk table padded to the key's length (``Runtime.build_step`` with ``pad_to``)."""
        key = _key(step)
        return (step.is_prefill and not step.speculative and key in self._graphs
                and step.block_tables.shape[1] <= self.block_tables.shape[1]
                and step.chunk_indices is not None and step.chunk_indices.shape[0] == _chunk_rows(key))

    def covers_draft(self, step: StepInputs, rows: torch.Tensor) -> bool:
        """Whether the drafts after ``step`` (a step ``covers`` holds for) from ``rows`` (one row each of 1 to the
        key's sequences: the padding never drafts) can replay a captured graph."""
        return self.drafter is not None and 1 <= rows.shape[0] <= _key(step)[1] and self.covers(step)

    def _step(self, key: Key) -> StepInputs:
        """The key's step on the buffers. Its int64 offsets are a new view on every call: FLA memoises on their
        identity, and a capture must record its own derivation, not reuse the warm-up's (see the module docstring)."""
        tokens, n, lanes = _shape(key)
        prompt = key[1] + 2  # the prompt part's offsets
        return StepInputs(self.input_ids[:tokens], self.positions[:tokens], self.slot_mapping[:tokens],
                          self.block_tables[:n], self.context_lens[:n], self.state_slots[:n],
                          self.cu_seqlens[: n + 1], is_prefill=True, cu_seqlens_long=self.cu_seqlens_long[:prompt],
                          chunk_indices=self.chunk_indices[: _chunk_rows(key)], graphed=True, decode_rows=lanes,
                          prompt_cu_seqlens=self.prompt_cu_seqlens[:prompt] if lanes else None)

    def _forward(self, step: StepInputs) -> torch.Tensor:
        hidden = self.model(step)
        if self.drafter is not None:
            if self.hidden is None:  # the largest bucket's warm-up, before any capture
                self.hidden = hidden.new_zeros(self.input_ids.shape[0], hidden.shape[1])
            self.hidden[: hidden.shape[0]].copy_(hidden)
        logits = self.model.compute_logits(hidden[step.last_token_indices()])
        if self.logits is None:  # the largest key's warm-up, before any capture: outside the graphs' pool
            self.logits = logits.new_empty(self.state_slots.shape[0], logits.shape[1])
        out = self.logits[: logits.shape[0]]
        out.copy_(logits)
        return out

    def _draft(self, step: StepInputs) -> torch.Tensor:
        tokens, rows = step.input_ids.shape[0], _key(step)[1]
        return self.drafter(step, self.hidden[:tokens], self.next_ids[:tokens], self.draft_rows[:rows],
                            self.draft_seq_rows[:rows])

    @torch.inference_mode()
    def capture(self, progress: bool = False) -> None:
        """Capture every key's step, largest first. Each runs once eagerly first (its kernels compile there, not in
        the capture), on a step of padding only: every sequence on the null slot and the null block, the tokens in
        the first and the last, the sequences between them empty. ``progress``: a progress bar over the keys."""
        pool = torch.cuda.graph_pool_handle()
        for key in tqdm(sorted(self.keys, key=_shape, reverse=True), desc="capturing prompt steps", unit="step",
                        disable=not progress):
            tokens, n, lanes = _shape(key)
            part = key[0]  # the prompt part's tokens
            lengths = [1] * lanes + [part // 2] + [0] * (key[1] - 1) + [part - part // 2]
            bounds = [sum(lengths[:i]) for i in range(n + 1)]
            prompt = [b - lanes for b in bounds[lanes:]]
            self.cu_seqlens[: n + 1].copy_(torch.tensor(bounds, dtype=torch.int32))
            self.prompt_cu_seqlens[: len(prompt)].copy_(torch.tensor(prompt, dtype=torch.int32))
            self.cu_seqlens_long[: len(prompt)].copy_(self.prompt_cu_seqlens[: len(prompt)])
            table = host_chunk_indices(prompt, num_rows=_chunk_rows(key))
            self.chunk_indices[: _chunk_rows(key)].copy_(torch.tensor(table, dtype=torch.long).view(-1, 2))
            self.context_lens[:n].copy_(torch.tensor(lengths, dtype=torch.int32))
            self.state_slots.fill_(NULL_SLOT)
            self.block_tables.fill_(NULL_BLOCK)
            self.slot_mapping.fill_(self._null_row)
            self._forward(self._step(key))
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._forward(self._step(key))  # a step of its own: see _step
            self._graphs[key] = graph
            if self.drafter is not None:  # from the first sequence's last row, on the padding's hidden states
                self.draft_rows.fill_(part // 2 - 1)
                self.draft_seq_rows.zero_()
                self._draft(self._step(key))
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._drafts[key] = self._draft(self._step(key))
                self._draft_graphs[key] = graph
        self._loaded = None
        torch.cuda.synchronize(self.device)

    def __call__(self, step: StepInputs) -> torch.Tensor:
        """Replay the graph of ``step``'s key on ``step`` (``covers`` must hold): fp32 logits of each sequence's last
        token, a row a sequence of the step (its decode lanes, then its prompt part and the padding's last), a tensor
        of the caller's own (the graphs' buffer is copied)."""
        self._load(step)
        return self._replay(_key(step)).clone()

    def forward_keeping_hidden(self, step: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``self(step)`` with a drafter: ``(hidden [tokens, H], logits)``, both the caller's own tensors."""
        logits = self(step)
        return self.hidden[: step.input_ids.shape[0]].clone(), logits

    def draft(self, step: StepInputs, hidden: torch.Tensor, next_ids: torch.Tensor, rows: torch.Tensor,
              seq_rows: torch.Tensor) -> torch.Tensor:
        """The drafter's drafts ``[D, k]`` after ``step`` (``covers_draft`` must hold) from its ``hidden`` states
        (``forward_keeping_hidden``'s: while ``step`` was the last replayed, the buffer still holds them), ``next_ids``
        ``[tokens]`` (each row's next token), the D drafting rows ``rows`` and their rows of the block tables
        ``seq_rows``: the key's drafts graph replayed, its first D drafts copied."""
        tokens, key, d = step.input_ids.shape[0], _key(step), rows.shape[0]
        if self._loaded is not step:  # another step replayed in between: its fields and hidden states back in
            self._load(step)
            self.hidden[:tokens].copy_(hidden)
        self.next_ids[:tokens].copy_(next_ids)
        self.draft_rows[:d].copy_(rows)
        self.draft_seq_rows[:d].copy_(seq_rows)
        self.draft_rows[d : key[1]].fill_(0)  # the rest draft from row 0 into the padding sequence's null blocks
        self.draft_seq_rows[d : key[1]].fill_(key[1])
        return self._replay_draft(key)[:d].clone()

    def _load(self, step: StepInputs) -> None:
        """Copy ``step``'s fields into the input buffers."""
        key = _key(step)
        tokens, n, lanes = _shape(key)
        prompt = key[1] + 2
        width = step.block_tables.shape[1]
        self.input_ids[:tokens].copy_(step.input_ids)
        self.positions[:tokens].copy_(step.positions)
        self.slot_mapping[:tokens].copy_(step.slot_mapping)
        self.block_tables[:n, :width].copy_(step.block_tables)
        self.block_tables[:n, width:].fill_(NULL_BLOCK)
        self.context_lens[:n].copy_(step.context_lens)
        self.state_slots[:n].copy_(step.state_slots)
        self.cu_seqlens[: n + 1].copy_(step.cu_seqlens)
        if lanes:
            self.prompt_cu_seqlens[:prompt].copy_(step.prompt_cu_seqlens)
        self.cu_seqlens_long[:prompt].copy_(step.cu_seqlens_long)
        self.chunk_indices[: _chunk_rows(key)].copy_(step.chunk_indices)
        self._loaded = step

    def _replay(self, key: Key) -> torch.Tensor:
        """Run the key's step on the buffers as they are; returns the logits buffer's rows of its sequences."""
        self._graphs[key].replay()
        return self.logits[: _shape(key)[1]]

    def _replay_draft(self, key: Key) -> torch.Tensor:
        """Run the key's drafts on the buffers as they are; returns its drafts buffer."""
        self._draft_graphs[key].replay()
        return self._drafts[key]


# (step, hidden [T, H], next_ids [T], rows [D], seq_rows [D]) -> drafts [D, k]: speculative decoding's ``draft``
Drafter = Callable[[StepInputs, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _key(step: StepInputs) -> Key:
    lanes = step.decode_rows
    return step.input_ids.shape[0] - lanes, step.num_sequences - 1 - lanes, lanes


def _shape(key: Key) -> tuple[int, int, int]:
    """A key's step: its tokens, its sequences (decode lanes, prompt part, padding one) and its decode lanes."""
    tokens, seqs, lanes = key
    return tokens + lanes, seqs + 1 + lanes, lanes


def _chunk_rows(key: Key) -> int:
    """The chunk table's length in a key's step: the most chunks its prompt part's sequences (and the padding one)
    can have."""
    return max_chunk_rows(key[0], key[1] + 1)

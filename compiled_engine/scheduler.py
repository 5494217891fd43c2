"""Scheduler: continuous batching with chunked prefill and preemption by recompute (nano-vllm lineage).

Each ``schedule()`` returns one batch. With ``mixed_steps`` (the default) the policy is decode first, as vLLM v1's
and SGLang's chunked prefill:
  * when prefill work exists (a prompt still being computed, a waiting request, a preempted sequence to recompute),
    the step is one varlen prefill step that carries every decode-ready running sequence (exactly one uncomputed
    token: its last sampled one) as a 1-token chunk first, then prefill chunks filling the rest of
    ``max_num_batched_tokens`` (which counts the decode tokens too): continuing prompts, then admissions;
  * otherwise it is a decode step of every running sequence (the compiled decode graph on a GPU).
So a decode-ready sequence waits for at most one step, however much prefill work streams in. Without
``mixed_steps`` a step is either a prefill step (continuing prompts and admissions only) or, when none can be
built, a decode step: prefill goes first and decoding sequences wait while prefill steps follow each other.

Admission (either policy) keeps room to grow: a waiting sequence is admitted only if the free KV blocks, after this
step's blocks and its own, still cover ``kv_growth_reserve`` (a fraction, default 1) of the blocks that every running
sequence and itself still need to reach its length limit (``Sequence.length_limit``: prompt + max_tokens, at most
max_model_len; unknown limits reserve nothing). At 1, sequences admitted with known limits are never preempted for
blocks; at 0, admission counts this step's blocks only. The first sequence is admitted whenever its step fits, so a
request that needs the whole cache still runs.

A sequence holds its state slot from admission until it finishes, is aborted or is preempted. When the decode-ready
sequences need KV blocks and none are free, the most recently admitted running sequence is preempted: its blocks and
slot are freed and it goes back to the front of the waiting queue with its tokens so far; it is recomputed later and
its output is unchanged.
With prefix caching, admission starts a sequence after its cached prefix, prefill chunks end at snapshot
boundaries (compiled_engine/prefix_cache.py), and a waiting sequence whose prefix a running sequence is computing
right now is held back (keeping its place; the ones behind it may pass) until that prefix's snapshot exists, so
requests that arrive together with a shared prefix compute it once, not once each.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from compiled_engine.cache_manager import CacheManager
from compiled_engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    is_prefill: bool
    seqs: list[Sequence]
    num_tokens: list[int]  # tokens computed for each sequence in this step
    # The leading sequences that compute their one uncomputed token (decode-ready): all of a decode step; in a mixed
    # prefill step, the decode rows in front of the prefill chunks. Only these can hold an overlapped engine's
    # placeholder token.
    num_decode: int = 0


class Scheduler:
    def __init__(
        self,
        caches: CacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        *,
        mixed_steps: bool = True,
        kv_growth_reserve: float = 1.0,
        decode_tokens: int = 1,
        max_model_len: int | None = None,
    ):
        """``caches``: who holds which blocks and slots; the scheduler asks it whether a step fits.
        ``mixed_steps``: decode rows ride in prefill steps (decode first); else prefill steps go first.
        ``kv_growth_reserve``: the share of the running sequences' growth to their length limits that admission
        keeps free (see the module docstring). ``decode_tokens``: the tokens whose KV blocks a decode-ready sequence
        needs in a step (1; 1 + k with speculative decoding: its verify step scores its last token and k drafts),
        at most up to ``max_model_len``. (The token budget still counts a decode row as one token.)"""
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
        if not 0 <= kv_growth_reserve <= 1:
            raise ValueError(f"kv_growth_reserve must be in [0, 1], got {kv_growth_reserve}")
        self.caches = caches
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.mixed_steps = mixed_steps
        self.kv_growth_reserve = kv_growth_reserve
        self.decode_tokens = decode_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.num_preemptions = 0
        # Counters (cumulative): steps by kind (a mixed step counts as a prefill step too), prompt tokens computed
        # by prefill chunks (not decode rows), and how many times a waiting sequence was held back for a prefix that
        # a running one was computing.
        self.num_prefill_steps = 0
        self.num_mixed_steps = 0
        self.num_decode_steps = 0
        self.num_prefill_tokens = 0
        self.num_held_back = 0

    def schedule(self) -> ScheduledBatch | None:
        if self.mixed_steps:
            batch = self._schedule_mixed()
        else:
            batch = self._schedule_prefill()
            if batch is None:
                batch = self._schedule_decode()
        if batch is not None:
            if batch.is_prefill:
                self.num_prefill_steps += 1
                self.num_mixed_steps += batch.num_decode > 0
                self.num_prefill_tokens += sum(batch.num_tokens[batch.num_decode :])
            else:
                self.num_decode_steps += 1
        return batch

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free everything it holds. Idempotent, and safe to repeat after an
        interrupt: the resources are freed first (while the sequence is still queued, so an interrupted call leaves
        it where the next one finds it), then it leaves its queue (no Python call there, nothing to interrupt)."""
        self.caches.release(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED

    def decode_fits(self) -> bool:
        """Whether every running sequence's next decode step finds its KV blocks free (no preemption)."""
        return sum(self._decode_blocks(s) for s in self.running) <= self.caches.num_free_blocks

    # -------------------------------------------------------------------------------------------------- policy
    def _schedule_mixed(self) -> ScheduledBatch | None:
        """Decode first: the decode-ready sequences (preempting for their blocks), then prefill chunks in the same
        step when there are any; a plain decode step when there are none."""
        ready = self._decode_ready()
        if self.waiting or any(s.num_uncomputed_tokens > 1 for s in self.running):
            batch = self._schedule_prefill(ready)
            if batch is not None:
                return batch
        if ready:
            return ScheduledBatch(False, ready, [1] * len(ready), len(ready))
        return self._schedule_stuck()

    def _decode_ready(self) -> list[Sequence]:
        """The running sequences with one uncomputed token, after preempting from the back until their next KV
        blocks fit."""
        ready = [s for s in self.running if s.num_uncomputed_tokens == 1]
        while ready:
            need = sum(self._decode_blocks(s) for s in ready)
            if need <= self.caches.num_free_blocks:
                break
            victim = self.running[-1]
            self._preempt(victim)
            if victim in ready:
                ready.remove(victim)
        return ready

    def _decode_blocks(self, seq: Sequence) -> int:
        """KV blocks a decode-ready sequence's next step takes (``decode_tokens`` of them, up to max_model_len)."""
        n = self.decode_tokens
        if self.max_model_len is not None:
            n = min(n, self.max_model_len - seq.num_computed_tokens)
        return self.caches.blocks_needed(seq, n)

    def _schedule_prefill(self, decode: list[Sequence] | None = None) -> ScheduledBatch | None:
        """A prefill step: the ``decode`` rows (one token each, their blocks known to fit) first, then the next chunks
        of running prompts, then admissions, within the token budget and the free blocks. None when it would hold
        no prefill chunk."""
        decode = decode or []
        budget = self.max_num_batched_tokens - len(decode)
        blocks_free = self.caches.num_free_blocks - sum(self._decode_blocks(s) for s in decode)
        seqs, counts = list(decode), [1] * len(decode)
        # Sequences already running with a prompt still being computed (chunked prefill) come first.
        for seq in self.running:
            if seq.num_uncomputed_tokens > 1 and budget > 0:
                n = self._chunk(seq, seq.num_computed_tokens, budget)
                need = self.caches.blocks_needed(seq, n)
                if need > blocks_free:
                    break
                blocks_free -= need
                seqs.append(seq)
                counts.append(n)
                budget -= n
        # Then waiting sequences (their fresh slots zeroed and prefix-cache hits restored together, after the loop).
        with self.caches.batched_admissions():
            self._admit(seqs, counts, budget, blocks_free)
        if len(seqs) == len(decode):
            return None
        return ScheduledBatch(True, seqs, counts, len(decode))

    def _admit(self, seqs: list[Sequence], counts: list[int], budget: int, blocks_free: int) -> None:
        """Admit waiting sequences into this prefill batch (appending to ``seqs`` and ``counts``), first come first
        served, while the token budget, the free blocks (less the growth reserve) and ``max_num_seqs`` allow.

        With prefix caching, a sequence whose prefix a running sequence is computing right now (its chained block
        hash at a snapshot boundary beyond its own cached prefix is one the running sequence will snapshot) is held
        back, keeping its place at the front of the queue, until that snapshot exists: admitting it would compute
        the same tokens a second time. The sequences behind it may go first.
        """
        prefix_cache = self.caches.prefix_cache
        pending: set[bytes] | None = None  # upcoming snapshot keys of the running sequences (built when needed)
        growth: int | None = None  # blocks the running sequences still need after this step (built when needed)
        held: list[Sequence] = []
        try:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                seq = self.waiting[0]
                hit = self.caches.find_cached_prefix(seq)
                cached = hit.num_tokens if hit is not None else 0
                if prefix_cache is not None and self.running and seq.reads_prefix_cache:
                    if pending is None:
                        pending = {key for s in self.running for key in prefix_cache.upcoming_snapshot_keys(s)}
                    if pending and prefix_cache.would_wait_for(seq, cached, pending):
                        held.append(self.waiting.popleft())
                        self.num_held_back += 1
                        continue
                n = self._chunk(seq, cached, budget)
                need = self.caches.blocks_to_admit(hit, n)
                if need > blocks_free:
                    break
                own = 0
                if self.kv_growth_reserve and self.running:  # the first sequence always goes when its step fits
                    if growth is None:
                        growth = self._running_growth(seqs, counts)
                    own = self.caches.growth_blocks(seq, -(-(cached + n) // self.caches.block_size))
                    if need + math.ceil(self.kv_growth_reserve * (growth + own)) > blocks_free:
                        break
                blocks_free -= need
                if growth is not None:
                    growth += own
                self.waiting.popleft()
                self.caches.assign_slot(seq, hit)
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                seqs.append(seq)
                counts.append(n)
                budget -= n
                if pending is not None:
                    pending.update(prefix_cache.upcoming_snapshot_keys(seq))
        finally:
            self.waiting.extendleft(reversed(held))  # back at the front, in their order

    def _running_growth(self, seqs: list[Sequence], counts: list[int]) -> int:
        """Blocks the running sequences still need to reach their length limits once this step (``seqs`` computing
        ``counts`` tokens) has taken its blocks."""
        step = {seq.seq_id: n for seq, n in zip(seqs, counts)}
        size = self.caches.block_size
        total = 0
        for seq in self.running:
            n = step.get(seq.seq_id, 0)
            held = max(len(seq.block_table), -(-(seq.num_computed_tokens + n) // size))
            total += self.caches.growth_blocks(seq, held)
        return total

    def _chunk(self, seq: Sequence, start: int, budget: int) -> int:
        """Tokens to compute from ``start``: all that remain, within the budget and the sequence's own chunk limit,
        ending at a snapshot boundary."""
        n = min(len(seq.token_ids) - start, budget, seq.max_chunk_tokens or budget)
        limit = self.caches.max_chunk(start)
        return n if limit is None else min(n, limit)

    def _schedule_decode(self) -> ScheduledBatch | None:
        ready = self._decode_ready()
        if ready:
            return ScheduledBatch(False, ready, [1] * len(ready), len(ready))
        return self._schedule_stuck()

    def _schedule_stuck(self) -> ScheduledBatch | None:
        """Only prefill work is left (or every decode-ready sequence was just preempted) and it found no blocks a
        moment ago: retry it, preempting from the back one sequence at a time until it fits."""
        while self.running:
            batch = self._schedule_prefill()
            if batch is not None:
                return batch
            self._preempt(self.running[-1])
        return self._schedule_prefill()

    def _preempt(self, seq: Sequence) -> None:
        self.caches.release(seq)  # first, as in finish(): an interrupt here leaves the sequence running, holding all
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

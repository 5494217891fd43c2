"""Scheduler: continuous batching with chunked prefill and preemption by recompute (nano-vllm lineage).

Each ``schedule()`` returns one batch, either
  * prefill: sequences with more than one uncomputed token (a new prompt, the next chunk of a long prompt, or a
    preempted sequence being recomputed), at most ``max_num_batched_tokens`` tokens in all; or
  * decode: every running sequence with exactly one uncomputed token (its last sampled token).
Prefill goes first, so new requests join while others decode. A sequence holds its state slot from admission
until it finishes, is aborted or is preempted. When a decode step needs a KV block and none is free, the most
recently admitted running sequence is preempted: its blocks and slot are freed and it goes back to the front of
the waiting queue with its tokens so far; it is recomputed later and its output is unchanged.
With prefix caching, admission starts a sequence after its cached prefix, prefill chunks end at snapshot
boundaries (compiled_engine/prefix_cache.py), and a waiting sequence whose prefix a running sequence is computing
right now is held back (keeping its place; the ones behind it may pass) until that prefix's snapshot exists, so
requests that arrive together with a shared prefix compute it once, not once each.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from compiled_engine.cache_manager import CacheManager
from compiled_engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    is_prefill: bool
    seqs: list[Sequence]
    num_tokens: list[int]  # tokens computed for each sequence in this step


class Scheduler:
    def __init__(self, caches: CacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        """``caches``: who holds which blocks and slots; the scheduler asks it whether a step fits."""
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
        self.caches = caches
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.num_preemptions = 0
        # Counters (cumulative): steps by kind, prompt tokens computed by prefill steps, and how many times a
        # waiting sequence was held back for a prefix that a running one was computing.
        self.num_prefill_steps = 0
        self.num_decode_steps = 0
        self.num_prefill_tokens = 0
        self.num_held_back = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def schedule(self) -> ScheduledBatch | None:
        batch = self._schedule_prefill()
        if batch is None:
            batch = self._schedule_decode()
        if batch is not None:
            if batch.is_prefill:
                self.num_prefill_steps += 1
                self.num_prefill_tokens += sum(batch.num_tokens)
            else:
                self.num_decode_steps += 1
        return batch

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free everything it holds."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.caches.release(seq)
        seq.status = SequenceStatus.FINISHED

    # -------------------------------------------------------------------------------------------------- policy
    def _schedule_prefill(self) -> ScheduledBatch | None:
        budget = self.max_num_batched_tokens
        seqs, counts = [], []
        blocks_free = self.caches.num_free_blocks
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
        if not seqs:
            return None
        return ScheduledBatch(True, seqs, counts)

    def _admit(self, seqs: list[Sequence], counts: list[int], budget: int, blocks_free: int) -> None:
        """Admit waiting sequences into this prefill batch (appending to ``seqs`` and ``counts``), first come first
        served, while the token budget, the free blocks and ``max_num_seqs`` allow.

        With prefix caching, a sequence whose prefix a running sequence is computing right now (its chained block
        hash at a snapshot boundary beyond its own cached prefix is one the running sequence will snapshot) is held
        back, keeping its place at the front of the queue, until that snapshot exists: admitting it would compute
        the same tokens a second time. The sequences behind it may go first.
        """
        prefix_cache = self.caches.prefix_cache
        pending: set[bytes] | None = None  # upcoming snapshot keys of the running sequences (built when needed)
        held: list[Sequence] = []
        try:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                seq = self.waiting[0]
                hit = self.caches.find_cached_prefix(seq)
                cached = hit.num_tokens if hit is not None else 0
                if prefix_cache is not None and self.running:
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
                blocks_free -= need
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

    def _chunk(self, seq: Sequence, start: int, budget: int) -> int:
        """Tokens to compute from ``start``: all that remain, within the budget, ending at a snapshot boundary."""
        n = min(len(seq.token_ids) - start, budget)
        limit = self.caches.max_chunk(start)
        return n if limit is None else min(n, limit)

    def _schedule_decode(self) -> ScheduledBatch | None:
        ready = [s for s in self.running if s.num_uncomputed_tokens == 1]
        while ready:
            need = sum(self.caches.blocks_needed(s, 1) for s in ready)
            if need <= self.caches.num_free_blocks:
                return ScheduledBatch(False, ready, [1] * len(ready))
            victim = self.running[-1]
            self._preempt(victim)
            if victim in ready:
                ready.remove(victim)
        # Only prefill work is left (or every decode-ready sequence was just preempted) and it found no blocks a
        # moment ago: retry it, preempting from the back one sequence at a time until it fits.
        while self.running:
            batch = self._schedule_prefill()
            if batch is not None:
                return batch
            self._preempt(self.running[-1])
        return self._schedule_prefill()

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.caches.release(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

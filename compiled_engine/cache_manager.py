"""CacheManager: which KV blocks and which state slot each sequence holds, and the prefix cache's index.

The cache tensors are buffers of the model's layers (compiled_engine/cache.py); this object decides which of their
rows a sequence owns. It hands blocks and slots out, takes them back, says how many blocks a step or an admission
needs (``blocks_needed``: the one formula), and enters computed blocks and state snapshots into the prefix cache.
The scheduler asks it whether a step fits; the Runtime reserves a step's blocks through it.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence as Seq

from compiled_engine.block_tables import BlockTables
from compiled_engine.cache import BlockAllocator, CacheConfig, SlotAllocator
from compiled_engine.prefix_cache import PrefixCache, PrefixHit
from compiled_engine.sequence import Sequence


class OutOfBlocksError(RuntimeError):
    """The KV cache has no free block for the requested step."""


def blocks_needed(num_tokens: int, num_held: int, block_size: int) -> int:
    """KV blocks to add to ``num_held`` so that ``num_tokens`` tokens fit (0 when they already do)."""
    return max(0, -(-num_tokens // block_size) - num_held)


class CacheManager:
    def __init__(
        self,
        cache_config: CacheConfig,
        reset_slots: Callable[[list[int]], None],
        prefix_cache: PrefixCache | None = None,
    ):
        """``reset_slots(slots)`` zeroes state slots (on every rank: ModelExecutor.reset_state_slots);
        ``prefix_cache``: its snapshot pool already allocated (compiled_engine.memory_plan), or None when off."""
        self.block_size = cache_config.block_size
        self.blocks = BlockAllocator(cache_config.num_kv_blocks)
        self.slots = SlotAllocator(cache_config.num_state_slots)
        self.prefix_cache = prefix_cache
        if prefix_cache is not None:
            prefix_cache.bind_blocks(self.blocks)
        self._reset_slots = reset_slots
        self._queued_resets: list[int] | None = None  # fresh slots to zero, inside batched_admissions()
        self.block_tables = BlockTables(cache_config.num_state_slots)  # what a step's packing reads its tables from

    @property
    def num_free_blocks(self) -> int:
        return self.blocks.num_free

    @property
    def num_free_slots(self) -> int:
        return self.slots.num_free

    # -------------------------------------------------------------------------------------------- block counts
    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks a step computing ``num_new_tokens`` more tokens of a running sequence takes from the free pool."""
        return blocks_needed(seq.num_computed_tokens + num_new_tokens, len(seq.block_table), self.block_size)

    def blocks_to_admit(self, hit: PrefixHit | None, num_new_tokens: int) -> int:
        """Blocks that admitting a waiting sequence takes from the free pool, computing ``num_new_tokens`` tokens after
        its prefix-cache ``hit``: the hit's shared blocks need no allocation, but those of them nobody holds now
        (evictable) leave the free pool."""
        if hit is None:
            return blocks_needed(num_new_tokens, 0, self.block_size)
        return blocks_needed(hit.num_tokens + num_new_tokens, len(hit.blocks), self.block_size) + hit.num_evictable

    def growth_blocks(self, seq: Sequence, num_held: int) -> int:
        """Blocks a sequence holding ``num_held`` still needs to reach its length limit (0 when the limit is unknown).
        Its KV never holds its last token (nothing computes it), so the limit's last token takes no block."""
        if seq.length_limit is None:
            return 0
        return blocks_needed(seq.length_limit - 1, num_held, self.block_size)

    def max_chunk(self, start: int) -> int | None:
        """The most tokens a prefill chunk starting at token ``start`` may compute: up to the next snapshot boundary
        with prefix caching (snapshots are taken only there), no limit (None) without."""
        if self.prefix_cache is None:
            return None
        interval = self.prefix_cache.interval
        return interval - start % interval

    # ---------------------------------------------------------------------------------------------- admission
    def find_cached_prefix(self, seq: Sequence) -> PrefixHit | None:
        """The prefix-cache hit a sequence would get if admitted now (None when caching is off, the sequence reads no
        cached prefix, or nothing hits)."""
        return self.prefix_cache.find(seq) if self.prefix_cache is not None and seq.reads_prefix_cache else None

    def assign_slot(self, seq: Sequence, hit: PrefixHit | None = None) -> None:
        """Give the sequence a state slot: zeroed, or restored from the prefix-cache ``hit`` (sharing its blocks)."""
        if self.slots.num_free == 0:
            raise RuntimeError(f"all {self.slots.num_slots - 1} state slots are in use (max_num_seqs)")
        seq.state_slot = self.slots.allocate()
        seq.num_cached_tokens = 0
        if hit is not None:
            self.prefix_cache.apply(seq, hit)
        elif self._queued_resets is not None:  # inside batched_admissions(): zeroed with the others at its end
            self._queued_resets.append(seq.state_slot)
        else:
            self._reset_slots([seq.state_slot])

    @contextlib.contextmanager
    def batched_admissions(self) -> Iterator[None]:
        """Within the block, ``assign_slot``'s state work is queued and done when it ends: one fill per state tensor
        for all the fresh slots, one gather and one scatter for all the prefix-cache restores. Nothing may read an
        assigned slot inside the block (the scheduler only admits there; the step runs after it)."""
        if self._queued_resets is not None:  # nested: the outermost block does the work
            yield
            return
        # Everything from the first change on is inside the try: an interrupt anywhere (even while the restores'
        # context is being built) still clears the queue, so later admissions zero their slots again.
        try:
            self._queued_resets = []
            restores = (self.prefix_cache.batched_restores() if self.prefix_cache is not None
                        else contextlib.nullcontext())
            with restores:
                yield
        finally:
            queued, self._queued_resets = self._queued_resets, None
            if queued:
                self._reset_slots(queued)

    def release(self, seq: Sequence) -> None:
        """Free the sequence's KV blocks and state slot; it can be re-run from scratch (preemption). Idempotent: each
        resource is released, then forgotten, so a call interrupted between two of them can be repeated."""
        self.blocks.release(seq.block_table)
        seq.block_table = []
        seq.num_indexed_blocks = 0
        if seq.state_slot is not None:
            self.slots.release(seq.state_slot)
            seq.state_slot = None
        seq.num_computed_tokens = 0

    # ------------------------------------------------------------------------------------------------ steps
    def reserve_blocks(self, seqs: Seq[Sequence], counts: Seq[int]) -> None:
        """Append to each sequence's block table the blocks its next ``counts[i]`` tokens need, all or none."""
        size = self.block_size
        needs = [blocks_needed(s.num_computed_tokens + n, len(s.block_table), size) for s, n in zip(seqs, counts)]
        total = sum(needs)
        if total > self.blocks.num_free:
            raise OutOfBlocksError(f"step needs {total} KV blocks, {self.blocks.num_free} free")
        if total:  # in decode, a sequence needs a new block once every block_size steps
            for seq, need in zip(seqs, needs):
                for _ in range(need):
                    seq.block_table.append(self.blocks.allocate())

    def record_prefixes(self, seqs: Seq[Sequence]) -> None:
        """Enter the sequences' newly computed blocks and boundary states in the prefix cache (if on). Steps do it
        themselves; LLMEngine calls it again once an overlapped step's input tokens are read back."""
        if self.prefix_cache is not None:
            for seq in seqs:
                self.prefix_cache.record(seq)

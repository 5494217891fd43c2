"""Prefix caching for hybrid models: shared KV blocks plus snapshots of the linear layers' state.

Full-attention layers can reuse any cached prefix block, but a linear-attention layer keeps no per-token cache:
a prefix hit is usable only up to a point where a snapshot of EVERY linear layer's recurrent and conv state
exists. Snapshots are taken at snapshot boundaries (multiples of ``interval`` tokens, itself a multiple of the
block size and of FLA's 64-token chunk): the scheduler ends prefill chunks at boundaries, and after each step
the state of a sequence sitting exactly on a boundary is copied into the snapshot pool.

* KV blocks are indexed by chained block hashes (nano-vllm style): the hash of block i covers tokens
  ``[0, (i + 1) * block_size)``, so one hash identifies a whole prefix. The index lives in BlockAllocator.
* Snapshots live in their own preallocated pool (``num_snapshots`` rows per linear layer, the budget), keyed by
  the hash of the block that ends at the boundary, evicted LRU, and dropped when that block is evicted.
* A hit (``find`` then ``apply``) shares the KV blocks up to the last boundary covered by both cached blocks and a
  snapshot, restores the snapshot into the sequence's state slot, and skips those tokens. At least one prompt token
  is always recomputed, since the next token's logits are needed. The scheduler restores all the hits of one
  scheduling pass together (``batched_restores``).
* In-flight prefixes: ``upcoming_snapshot_keys`` of the running sequences name the snapshots they are about to
  take; the scheduler holds back a waiting sequence that ``would_wait_for`` one of them rather than computing the
  same prefix twice at the same time.
"""

from __future__ import annotations

import contextlib
import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from compiled_engine.cache import BlockAllocator
from compiled_engine.config import LINEAR_ATTENTION
from compiled_engine.model import HybridModel
from compiled_engine.sequence import Sequence
from compiled_engine.step import upload
from ops.delta_rule import CHUNK_SIZE


SAVE, RESTORE = "save", "restore"  # snapshot copy directions (slot -> row, row -> slot)


def chain_hash(previous: bytes, tokens: list[int]) -> bytes:
    """Hash of a full block given the hash of the prefix before it (128-bit: collisions are not a concern)."""
    digest = hashlib.blake2b(previous, digest_size=16)
    digest.update(array("q", tokens).tobytes())
    return digest.digest()


@dataclass
class PrefixHit:
    num_tokens: int  # tokens skipped: a snapshot boundary
    blocks: list[int]  # the shared KV blocks covering them
    snapshot_row: int
    num_evictable: int  # of those blocks, how many are currently unowned (acquiring them reduces free blocks)


class PrefixCache:
    def __init__(
        self,
        model: HybridModel,
        block_size: int,
        interval: int,
        num_snapshots: int,
        device: torch.device,
        dtype: torch.dtype,
        state_dtype: torch.dtype,
        mirror: Callable[[str, int, int], None] | None = None,
    ):
        if interval <= 0 or interval % block_size or interval % CHUNK_SIZE:
            raise ValueError(
                f"prefix_snapshot_interval must be a positive multiple of block_size ({block_size}) and of "
                f"{CHUNK_SIZE}, got {interval}"
            )
        if num_snapshots < 1:
            raise ValueError(f"num_prefix_snapshots must be >= 1, got {num_snapshots}")
        self.model = model
        self.blocks: BlockAllocator | None = None  # bound once the KV cache is planned (bind_blocks)
        self.block_size = block_size
        self.interval = interval
        self.linear_layers = [layer.mixer for layer in model.layers if layer.layer_type == LINEAR_ATTENTION]
        # Snapshot pool: one row per snapshot in each linear layer, shaped like that layer's state pools.
        self.recurrent = [
            torch.empty((num_snapshots, *m.recurrent_state.shape[1:]), device=device, dtype=state_dtype)
            for m in self.linear_layers
        ]
        self.conv = [
            torch.empty((num_snapshots, *m.conv_state.shape[1:]), device=device, dtype=dtype)
            for m in self.linear_layers
        ]
        self.row_of_hash: OrderedDict[bytes, int] = OrderedDict()  # LRU: least recently used first
        self.free_rows = list(range(num_snapshots - 1, -1, -1))
        # With tensor parallelism, rank 0 keeps the index and LRU; every rank holds its shard of the snapshots, so
        # each copy is mirrored to the other ranks first (``mirror(SAVE | RESTORE, row, slot)``).
        self.mirror = mirror
        self._queued_restores: list[tuple[int, int]] | None = None  # (row, slot) inside batched_restores()

    def bind_blocks(self, blocks: BlockAllocator) -> None:
        """Use ``blocks``' content index; a snapshot is dropped when the block ending at its boundary is evicted."""
        self.blocks = blocks
        blocks.on_evict = self._drop_snapshot

    @property
    def num_snapshots(self) -> int:
        return len(self.row_of_hash)

    @property
    def snapshot_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.recurrent + self.conv)

    # --------------------------------------------------------------------------------------------- hashing
    def _hashes(self, seq: Sequence, full: int) -> list[bytes]:
        """``seq.block_hashes``, extended to at least ``full`` blocks (not copied: it may be longer)."""
        hashes = seq.block_hashes
        size = self.block_size
        if full * size > seq.num_known_tokens:  # a placeholder's hash would be memoised, and wrong, for good
            raise AssertionError(f"sequence {seq.seq_id}: hashing {full} blocks of {seq.num_known_tokens} known tokens")
        while len(hashes) < full:
            i = len(hashes)
            hashes.append(chain_hash(hashes[-1] if hashes else b"", seq.token_ids[i * size : (i + 1) * size]))
        return hashes

    # ------------------------------------------------------------------------------------------------- hits
    def find(self, seq: Sequence) -> PrefixHit | None:
        """The longest usable cached prefix of a sequence about to be admitted (no side effects).

        That is the largest snapshot boundary whose snapshot exists and whose blocks are all indexed. Boundaries
        are tried from the top, so a miss costs one dictionary lookup per boundary rather than one per block.
        """
        usable = len(seq.token_ids) - 1  # the last token is always computed: its logits pick the next token
        boundary = usable // self.interval * self.interval
        if boundary == 0:
            return None
        hashes = self._hashes(seq, boundary // self.block_size)
        while boundary > 0:
            num_blocks = boundary // self.block_size
            row = self.row_of_hash.get(hashes[num_blocks - 1])
            if row is not None:
                shared = [self.blocks.lookup(h) for h in hashes[:num_blocks]]
                if None not in shared:
                    evictable = sum(1 for b in shared if self.blocks.refcount[b] == 0)
                    return PrefixHit(boundary, shared, row, evictable)
            boundary -= self.interval
        return None

    def upcoming_snapshot_keys(self, seq: Sequence) -> list[bytes]:
        """Keys of the snapshots the running ``seq`` will take as it computes the tokens it already has.

        Prefill chunks end at every boundary (Scheduler._chunk), so these are the boundaries in
        ``(num_computed_tokens, num_known_tokens]`` (a placeholder's boundary is named once its token is known).
        """
        first = seq.num_computed_tokens // self.interval * self.interval + self.interval
        last = seq.num_known_tokens // self.interval * self.interval
        if first > last:
            return []
        hashes = self._hashes(seq, last // self.block_size)
        return [hashes[b // self.block_size - 1] for b in range(first, last + 1, self.interval)]

    def would_wait_for(self, seq: Sequence, cached: int, pending: set[bytes]) -> bool:
        """Whether a waiting ``seq`` whose cached prefix is ``cached`` tokens gets a longer one from ``pending``.

        ``pending``: upcoming snapshot keys of running sequences. A chained hash names a whole prefix, so a key
        of ``seq`` in ``pending`` means a running sequence is computing the same tokens right now; admitting
        ``seq`` would compute them a second time.
        """
        usable = len(seq.token_ids) - 1
        last = usable // self.interval * self.interval
        if last <= cached:
            return False
        hashes = self._hashes(seq, last // self.block_size)
        return any(hashes[b // self.block_size - 1] in pending for b in range(cached + self.interval, last + 1,
                                                                              self.interval))

    def apply(self, seq: Sequence, hit: PrefixHit) -> None:
        """Share the hit's blocks and restore its snapshot into the sequence's (already assigned) slot."""
        # One block at a time, each acquired and then held: an interrupt between two acquires leaves the sequence
        # holding exactly the blocks it acquired, which its release gives back (no reference leaks).
        for block in hit.blocks:
            self.blocks.acquire(block)
            seq.block_table.append(block)
        seq.num_indexed_blocks = len(hit.blocks)  # they are the index's own blocks
        if self.mirror is not None:
            self.mirror(RESTORE, hit.snapshot_row, seq.state_slot)
        if self._queued_restores is not None:
            self._queued_restores.append((hit.snapshot_row, seq.state_slot))
        else:
            self.restore_state(hit.snapshot_row, seq.state_slot)
        seq.num_computed_tokens = hit.num_tokens
        seq.num_cached_tokens = hit.num_tokens
        self.row_of_hash.move_to_end(seq.block_hashes[hit.num_tokens // self.block_size - 1])

    # ------------------------------------------------------------------------------------------ after a step
    def record(self, seq: Sequence) -> None:
        """Index the sequence's newly full blocks; snapshot its state if it sits exactly on a boundary.

        Called for every sequence after every step: a decode step that fills no block and reaches no boundary
        returns after two integer tests. Only known tokens are hashed: a step whose input was a placeholder (an
        overlapped decode step's) leaves its last block and boundary to the call its engine makes once that token
        is read back, which comes before the next step can change the state (LLMEngine._step_overlapped).
        """
        computed = seq.num_computed_tokens
        known = min(computed, seq.num_known_tokens)
        full = known // self.block_size
        if full > seq.num_indexed_blocks:
            hashes = self._hashes(seq, full)
            for i in range(seq.num_indexed_blocks, full):
                self.blocks.index(seq.block_table[i], hashes[i])
            seq.num_indexed_blocks = full
        if known == computed and computed and computed % self.interval == 0:
            self._take_snapshot(seq.block_hashes[full - 1], seq.state_slot)

    def _take_snapshot(self, key: bytes, slot: int) -> None:
        if key in self.row_of_hash:
            self.row_of_hash.move_to_end(key)
            return
        if not self.free_rows:
            _, row = self.row_of_hash.popitem(last=False)
            self.free_rows.append(row)
        # The row stays free until its state is saved: an interrupt in the copies loses neither the row nor indexes a
        # half-written snapshot.
        row = self.free_rows[-1]
        if self.mirror is not None:
            self.mirror(SAVE, row, slot)
        self.save_state(slot, row)
        self.free_rows.pop()
        self.row_of_hash[key] = row

    # ------------------------------------------------------------------------------ the state copies themselves
    def save_state(self, slot: int, row: int) -> None:
        """Copy a slot's state of every linear layer into snapshot ``row``."""
        for mixer, recurrent, conv in zip(self.linear_layers, self.recurrent, self.conv):
            recurrent[row].copy_(mixer.recurrent_state[slot])
            conv[row].copy_(mixer.conv_state[slot])

    def restore_state(self, row: int, slot: int) -> None:
        """Copy snapshot ``row`` into a slot's state of every linear layer."""
        for mixer, recurrent, conv in zip(self.linear_layers, self.recurrent, self.conv):
            mixer.recurrent_state[slot].copy_(recurrent[row])
            mixer.conv_state[slot].copy_(conv[row])

    @contextlib.contextmanager
    def batched_restores(self) -> Iterator[None]:
        """Within the block, the snapshot restores of ``apply`` are queued, then done together when it ends: two
        copies per linear layer for all the hits of a scheduling pass, instead of two per layer per hit (on a GPU,
        255 hits x 18 layers x 2 = 9,180 small copies become 36 gathers and 36 scatters). Nothing may read a
        restored slot inside the block (the scheduler only admits there; the step runs after it)."""
        if self._queued_restores is not None:  # nested: the outermost block does the copies
            yield
            return
        self._queued_restores = []
        try:
            yield
        finally:
            queued, self._queued_restores = self._queued_restores, None
            if len(queued) == 1:
                self.restore_state(*queued[0])
            elif queued:
                self.restore_states([row for row, _ in queued], [slot for _, slot in queued])

    def restore_states(self, rows: list[int], slots: list[int]) -> None:
        """``restore_state(rows[i], slots[i])`` for every i, as one gather and one scatter per state tensor (the slots
        must be distinct)."""
        if not self.recurrent:
            return
        device = self.recurrent[0].device
        rows_t, slots_t = (upload(torch.tensor(values, dtype=torch.long), device) for values in (rows, slots))
        for mixer, recurrent, conv in zip(self.linear_layers, self.recurrent, self.conv):
            mixer.recurrent_state.index_copy_(0, slots_t, recurrent.index_select(0, rows_t))
            mixer.conv_state.index_copy_(0, slots_t, conv.index_select(0, rows_t))

    def _drop_snapshot(self, block: int, content_hash: bytes) -> None:
        row = self.row_of_hash.pop(content_hash, None)
        if row is not None:
            self.free_rows.append(row)

"""Caches and the allocators that hand them out.

* KV cache: for each full-attention layer (the MTP layer's too, when the model has one), separate ``k_cache`` /
  ``v_cache`` tensors ``[num_kv_blocks, block_size, kv_heads, head_dim]`` in the model dtype. Block 0 is the null
  block. The MTP layer's cache shares the target's block tables: a block holds both for its positions.
* State pools: for each linear-attention layer, ``recurrent_state [num_slots, Hv, K, V]`` (fp32 by default) and
  ``conv_state [num_slots, conv_dim, kernel - 1]`` in the model dtype. Slot 0 is the null slot.
The tensors are registered as buffers of the layer that uses them (allocate_*), so the model's forward reads
and mutates them without any global context.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch

from compiled_engine.config import LINEAR_ATTENTION
from compiled_engine.model import HybridModel
from compiled_engine.step import upload
from ops.layouts import gated_deltanet_history_offsets
from ops.library import NULL_BLOCK, NULL_SLOT


@dataclass(frozen=True)
class CacheConfig:
    """The cache sizes a Runtime settled on (knobs validated in RuntimeConfig, blocks from the memory plan)."""

    block_size: int  # tokens per KV block
    num_kv_blocks: int  # including the null block
    num_state_slots: int  # including the null slot: max_num_seqs + 1
    state_dtype: torch.dtype = torch.float32  # recurrent state; conv state uses the model dtype


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def attention_mixers(model: HybridModel) -> list:
    """Every attention layer that owns a KV cache: the target's full-attention layers, then the MTP layer's."""
    mixers = [layer.mixer for layer in model.layers if layer.layer_type != LINEAR_ATTENTION]
    if model.mtp is not None:
        mixers.append(model.mtp.attention)
    return mixers


def kv_bytes_per_block(model: HybridModel, block_size: int, dtype: torch.dtype) -> int:
    """KV bytes of one block across all attention layers (of this rank's shard)."""
    return sum(2 * block_size * m.num_kv_heads * m.head_dim * _element_size(dtype) for m in attention_mixers(model))


def allocate_state_pools(
    model: HybridModel, num_slots: int, device: torch.device, dtype: torch.dtype, state_dtype: torch.dtype
) -> None:
    """Give every linear layer its conv and recurrent state pools (buffers), all rows zero."""
    for layer in model.layers:
        if layer.layer_type == LINEAR_ATTENTION:
            m = layer.mixer
            kernel = m.conv_weight.shape[1]
            m.conv_state = torch.zeros(num_slots, m.conv_dim, kernel - 1, device=device, dtype=dtype)
            m.recurrent_state = torch.zeros(
                num_slots, m.num_v_heads, m.head_k_dim, m.head_v_dim, device=device, dtype=state_dtype
            )


def allocate_kv_cache(
    model: HybridModel, num_blocks: int, block_size: int, device: torch.device, dtype: torch.dtype
) -> None:
    """Give every attention layer its own ``k_cache`` and ``v_cache`` (two allocations, buffers)."""
    for m in attention_mixers(model):
        shape = (num_blocks, block_size, m.num_kv_heads, m.head_dim)
        m.k_cache = None  # free the old cache before allocating the new one
        m.v_cache = None
        m.k_cache = torch.zeros(shape, device=device, dtype=dtype)
        m.v_cache = torch.zeros(shape, device=device, dtype=dtype)


def allocate_verify_history(model: HybridModel, num_drafts: int, rows: int) -> None:
    """Give every linear layer the verify history of speculative decoding with ``num_drafts`` drafts a sequence,
    ``[rows, num_drafts + 1, D]`` fp32 (compiled_engine/gated_deltanet.py), for verify steps of up to ``rows``
    sequences: ~40 KB a position at Qwen3.5-0.8B's shape, against a 1 MiB recurrent state."""
    for layer in model.layers:
        if layer.layer_type == LINEAR_ATTENTION:
            m = layer.mixer
            width = gated_deltanet_history_offsets(m.num_k_heads, m.head_k_dim, m.num_v_heads, m.head_v_dim)[3]
            m.verify_history = None  # free the old history before allocating the new one
            m.verify_history = torch.empty((rows, num_drafts + 1, width), device=m.recurrent_state.device,
                                           dtype=torch.float32)


def reset_state_slot(model: HybridModel, slot: int) -> None:
    """Zero one slot's rows in every linear layer: a fresh sequence starts from zero state."""
    reset_state_slots(model, [slot])


def reset_state_slots(model: HybridModel, slots: list[int]) -> None:
    """Zero these slots' rows in every linear layer, one fill per state tensor whatever their number (a prefill
    step admitting 15 sequences would otherwise make 15 x 18 x 2 = 540 small fills one by one)."""
    mixers = [layer.mixer for layer in model.layers if layer.layer_type == LINEAR_ATTENTION]
    if not slots or not mixers:
        return
    index = upload(torch.tensor(slots, dtype=torch.long), mixers[0].recurrent_state.device)
    for mixer in mixers:
        mixer.conv_state.index_fill_(0, index, 0)
        mixer.recurrent_state.index_fill_(0, index, 0)


class BlockAllocator:
    """KV blocks with reference counts and an index of full blocks by content hash (for prefix caching).

    Block 0 (the null block) is never handed out. A block whose last holder releases it goes back to the free
    list, unless its content is indexed: then it stays reusable by hash, in LRU order, until a new allocation
    needs it ("evictable"); evicting it calls ``on_evict(block, hash)`` so dependent snapshots can be dropped.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free: list[int] = [b for b in range(num_blocks - 1, -1, -1) if b != NULL_BLOCK]
        self.evictable: OrderedDict[int, None] = OrderedDict()  # refcount 0, content indexed; oldest first
        self.refcount = [0] * num_blocks
        self.block_of_hash: dict[bytes, int] = {}
        self.hash_of_block: dict[int, bytes] = {}
        self.on_evict: Callable[[int, bytes], None] | None = None

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take: free ones and evictable cached ones."""
        return len(self.free) + len(self.evictable)

    def allocate(self) -> int:
        if self.free:
            block = self.free.pop()
        elif self.evictable:
            # Unindexed first, taken second: an interrupt in _forget (on_evict runs Python code) leaves the block
            # evictable, where the next allocation finds it again, not lost.
            block = next(iter(self.evictable))
            self._forget(block)
            del self.evictable[block]
        else:
            raise RuntimeError("out of KV blocks")
        self.refcount[block] = 1
        return block

    def acquire(self, block: int) -> None:
        """Share an indexed block (a prefix-cache hit)."""
        if self.refcount[block] == 0:
            del self.evictable[block]
        self.refcount[block] += 1

    def release(self, blocks: list[int]) -> None:
        for block in reversed(blocks):
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                if block in self.hash_of_block:
                    self.evictable[block] = None
                else:
                    self.free.append(block)

    def index(self, block: int, content_hash: bytes) -> None:
        """Record that ``block`` holds the full block whose chained hash is ``content_hash``."""
        if content_hash not in self.block_of_hash and block not in self.hash_of_block:
            self.block_of_hash[content_hash] = block
            self.hash_of_block[block] = content_hash

    def lookup(self, content_hash: bytes) -> int | None:
        return self.block_of_hash.get(content_hash)

    def _forget(self, block: int) -> None:
        content_hash = self.hash_of_block.pop(block, None)
        if content_hash is None:  # forgotten already, by a call an interrupt cut short before the block was taken
            return
        del self.block_of_hash[content_hash]
        if self.on_evict is not None:
            self.on_evict(block, content_hash)


class SlotAllocator:
    """Free list of state slots; slot 0 (the null slot) is never handed out."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.free: list[int] = [s for s in range(num_slots - 1, -1, -1) if s != NULL_SLOT]

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self) -> int:
        if not self.free:
            raise RuntimeError("out of state slots")
        return self.free.pop()

    def release(self, slot: int) -> None:
        self.free.append(slot)

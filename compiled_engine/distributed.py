"""Tensor parallelism primitives over torch.distributed.

``TensorParallel`` is passed explicitly to the layers that communicate (no global context). The collectives are
torch.distributed's functional ones, which dynamo traces, so a sharded decode step still compiles with
``fullgraph=True`` and the all-reduces are captured in its CUDA graph.

Sharding (``shard_sections``): every sharded checkpoint tensor is a concatenation of sections laid out head by
head (e.g. ``in_proj_qkv = [q | k | v]``); each section is cut into ``world_size`` equal contiguous parts and rank
r keeps part r of every section. Heads stay whole, and a key head stays on the rank of its value heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

# all_gather_tensor is deprecated in newer torch in favour of all_gather_single (same semantics); use what exists.
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor


@dataclass(frozen=True)
class TensorParallel:
    rank: int
    world_size: int
    group: dist.ProcessGroup | None = None  # None: the default group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks (the output of a row-parallel linear)."""
        if self.world_size == 1:
            return x
        return funcol.all_reduce(x, "sum", self.group or dist.group.WORLD)

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate the ranks' shards along the last dimension (vocab-parallel logits)."""
        if self.world_size == 1:
            return x
        gathered = _all_gather(x.contiguous(), 0, self.group or dist.group.WORLD)  # [world * T, V/world]
        return torch.cat(gathered.chunk(self.world_size, dim=0), dim=-1)


SINGLE = TensorParallel(rank=0, world_size=1)


def shard_sections(tensor: torch.Tensor, sections: list[int], dim: int, tp: TensorParallel) -> torch.Tensor:
    """Rank ``tp.rank``'s part of each section of ``tensor`` along ``dim``, concatenated."""
    if tp.world_size == 1:
        return tensor
    parts = []
    for section in tensor.split(sections, dim=dim):
        size = section.shape[dim] // tp.world_size
        parts.append(section.narrow(dim, tp.rank * size, size))
    return torch.cat(parts, dim=dim)


def check_divisible(config, world_size: int) -> None:
    """Heads (and the MLP and expert widths) must split evenly over the ranks."""
    checks = {
        "num_key_value_heads": config.num_key_value_heads,
        "num_attention_heads": config.num_attention_heads,
        "linear_num_key_heads": config.linear_num_key_heads,
        "linear_num_value_heads": config.linear_num_value_heads,
        "intermediate_size": config.intermediate_size,
    }
    if config.moe_layers:  # experts and the shared expert are cut by their intermediate dimension
        checks["moe_intermediate_size"] = config.moe_intermediate_size
        checks["shared_expert_intermediate_size"] = config.shared_expert_intermediate_size
    bad = {name: value for name, value in checks.items() if value % world_size}
    if bad:
        detail = ", ".join(f"{name}={value}" for name, value in bad.items())
        raise ValueError(f"tensor_parallel_size={world_size} does not divide {detail}")

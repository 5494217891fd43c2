"""Bucket policy: the decode batch sizes that get a compiled graph (one CUDA graph each).

A decode batch of N sequences runs the graph of the smallest bucket >= N; lanes N..bucket-1 are padding. Every
bucket costs a compile + capture at start-up and a graph's worth of memory, and every padding lane costs a wasted
lane of compute (its recurrent state, the bulk of a lane's bytes, the decode ops skip), so the sizes are dense
where batches are small (where a step is launch-bound and a single extra lane is a large fraction of the work) and
sparser as they grow:

    1, 2, 4, 8,  16, 24, 32 (step 8),  48 ... 128 (step 16),  160 ... 256 (step 32),  320, 384, ... (step 64)

Worst-case padding waste: 44% at 9 sequences, ~30% at 17 and 33, ~20% from 129 up; 17 graphs for
``max_num_seqs=256``.
The list stops at ``max_num_seqs`` exactly (appended if it is not already a bucket): no batch can be larger, so a
larger bucket would only be padding.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Sequence


def default_bucket_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The default policy above, covering 1..max_num_seqs."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes = [1, 2, 4, 8]
    size = 8
    while size < max_num_seqs:
        step = 8 if size < 32 else 16 if size < 128 else 32 if size < 256 else 64
        size += step
        sizes.append(size)
    return tuple(s for s in sizes if s < max_num_seqs) + (max_num_seqs,)


@dataclass(frozen=True)
class BucketPolicy:
    """Sorted, distinct bucket sizes; ``bucket_for(n)`` is the graph a batch of ``n`` sequences runs."""

    sizes: tuple[int, ...]

    def __post_init__(self):
        sizes = self.sizes
        if not sizes:
            raise ValueError("a bucket policy needs at least one size")
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in sizes):
            raise ValueError(f"bucket sizes must be positive ints, got {list(sizes)}")
        if list(sizes) != sorted(set(sizes)):
            raise ValueError(f"bucket sizes must be strictly increasing, got {list(sizes)}")

    @classmethod
    def create(cls, max_num_seqs: int, sizes: Iterable[int] | None = None) -> "BucketPolicy":
        """The default policy for ``max_num_seqs``, or the given sizes (sorted, deduplicated).

        Given sizes may stop short of ``max_num_seqs`` (graph only the small, launch-bound batches); a larger
        batch then has no bucket and the caller runs it without a graph. Sizes above ``max_num_seqs`` are dropped:
        no batch can use them.
        """
        if sizes is None:
            return cls(default_bucket_sizes(max_num_seqs))
        sizes = list(sizes)
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in sizes):
            raise ValueError(f"bucket sizes must be positive ints, got {sizes}")
        kept = tuple(sorted({s for s in sizes if s <= max_num_seqs}))
        if not kept:
            raise ValueError(f"no bucket size in {sizes} is <= max_num_seqs={max_num_seqs}")
        return cls(kept)

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    def covers(self, n: int) -> bool:
        return 1 <= n <= self.sizes[-1]

    def bucket_for(self, n: int) -> int:
        """The smallest bucket >= n. Raises ValueError when ``n`` < 1 or larger than every bucket."""
        if not self.covers(n):
            raise ValueError(f"batch of {n} sequences has no bucket (buckets: {list(self.sizes)})")
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def __iter__(self):
        return iter(self.sizes)

    def __len__(self) -> int:
        return len(self.sizes)


def bucket_for(n: int, sizes: Sequence[int]) -> int:
    """Functional form: the smallest of the (sorted) ``sizes`` that is >= n."""
    return BucketPolicy(tuple(sizes)).bucket_for(n)

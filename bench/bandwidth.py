"""Copy bandwidth of the benchmark device: the ``bandwidth`` of every bound (bench/bounds.py).

A large device-to-device ``copy_`` moves ``2 x nbytes`` (read the source, write the destination). On CUDA each copy
is timed with CUDA events after warm-up copies and the median is kept; on the CPU perf_counter times it.
The buffers (1 GiB by default on CUDA) are far larger than any cache, so this is DRAM/HBM bandwidth as a real
kernel sees it -- the achievable number, not the datasheet's.
"""

from __future__ import annotations

import statistics
import time

import torch


def measure_copy_bandwidth(
    device: torch.device | str, nbytes: int | None = None, iters: int = 10, warmup: int = 3
) -> dict:
    """``{"GBps": median, "bytes_per_copy": 2 * nbytes, "samples_GBps": [...], ...}`` for ``device``."""
    device = torch.device(device)
    if nbytes is None:
        nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    numel = nbytes // 4
    src = torch.ones(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    moved = 2 * numel * 4
    for _ in range(warmup):
        dst.copy_(src)
    seconds = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds.append(time.perf_counter() - t0)
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()  # hand the buffers back: the engine's memory plan must not see them as used
    samples = sorted(moved / s / 1e9 for s in seconds)
    return {
        "GBps": statistics.median(samples),
        "max_GBps": samples[-1],
        "samples_GBps": samples,
        "bytes_per_copy": moved,
        "method": f"median of {iters} device-to-device copy_ of {numel * 4 / 2**20:.0f} MiB (read + write counted)"
        + (", CUDA events" if device.type == "cuda" else ", perf_counter"),
    }

"""Kernel variants compiled side by side at start-up: ``run_in_threads`` runs calls that launch kernels on a thread
pool (the sampler's warm-up: compiled_engine/sampler.py, ``warm_up_sampling``).

A warm-up that meets many Triton kernel variants for the first time compiles each at its first launch, one after
another. Triton's compiler runs mostly outside the GIL (its MLIR and LLVM passes in C++; ptxas and the launcher's C
compiler as child processes), so the same calls on a few threads compile their variants side by side (bench/NOTES.md,
"Measurements behind the library's choices"). The calls share the device's current stream, so their kernels run one
after another as they would on one thread; each call must write only buffers no other call reads. A variant that two
calls meet may compile twice. Nothing here times or tunes kernels: a ``triton.autotune`` kernel would time its
configs against the other threads' work.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed

import torch

DEFAULT_THREADS = 8


def run_in_threads(calls: Iterable[Callable[[], object]], device: torch.device, threads: int = DEFAULT_THREADS,
                   done: Callable[[], object] | None = None) -> None:
    """Run ``calls`` on ``threads`` threads, each under ``torch.inference_mode`` with ``device`` current; waits for
    all of them, then raises the first call's error, if one failed. ``done``: called on the caller's thread as each
    call finishes (a progress bar's update)."""

    def run(call: Callable[[], object]) -> None:
        with torch.inference_mode(), torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            call()

    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="compile") as pool:
        futures = [pool.submit(run, call) for call in calls]
        for _ in as_completed(futures):
            if done is not None:
                done()
    for future in futures:
        future.result()


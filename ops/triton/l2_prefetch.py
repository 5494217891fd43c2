"""Prefetch a kernel's weights into L2 before it waits for the kernels before it.

A batch-1 decode step is a chain of dependent kernels, most of them latency-bound (each hop costs a few µs over its DRAM
time even with PDL). While one kernel runs, the DRAM mostly idles, and the next kernel, launched early with PDL
(ops/triton/pdl.py), sits at ``gdc_wait``. Its weights are constant during the step, so it may read them before the wait
(PDL protocol, step 2); registers hold only a first chunk of them, but the L2 (50 MB on an H200) holds a whole matrix of
this model (at most 17 MB). So, before the wait, the first ``programs`` programs of the grid (those launched first,
while the kernel before is still running) split the weight into that many contiguous slabs and ask the TMA unit to bring
each one into L2 (``cp.async.bulk.prefetch.L2``: one instruction per 64 KB, issued by one thread, nothing waited for).
After the wait the kernel's loads hit L2 instead of DRAM.

A prefetch is a hint: it changes no value, only where a later load finds its data. Hopper or newer (sm_90: the
bulk prefetch instruction), CUDA only (the interpreter cannot run inline PTX); the ``l2_prefetch`` option
(ops/options.py, ``CE_L2_PREFETCH=0``) turns it off.
Matrices larger than half the L2 (the lm_head: 508 MB) are not prefetched: they would evict themselves, and a kernel
that large is bandwidth-bound anyway. Every other weight is prefetched whole: leaving the smaller ones out, or having
each program prefetch only its own rows, measured slower (bench/NOTES.md, "Removed alternatives").

The gain at batch 1 is small: the prefetched kernels get faster and their predecessors slower, whose own loads queue
behind the prefetches (bench/NOTES.md, "L2 prefetch").
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from ops.options import current_options

PIECE_BYTES = tl.constexpr(65536)  # bytes per prefetch instruction: well under the instruction's 32-bit size field
DEFAULT_L2_BYTES = 50 * 2**20  # H100 / H200, where the device does not report its L2 size


@functools.cache
def bulk_prefetch_supported() -> bool:
    """Whether bulk prefetches can run here: Hopper or newer (sm_90: the instruction), not the interpreter (no inline
    PTX)."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
    return not interpreted and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def l2_prefetch_enabled() -> bool:
    """Whether weights are prefetched: the ``l2_prefetch`` option (ops/options.py), where bulk prefetches can run."""
    return current_options().l2_prefetch and bulk_prefetch_supported()


@functools.cache
def _device_facts(index: int) -> tuple[int, int]:
    """(streaming multiprocessors, L2 bytes) of CUDA device ``index``."""
    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count, getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES


def l2_prefetch_flags(weight: torch.Tensor, programs: int) -> dict:
    """Launch arguments of a kernel of ``programs`` programs with the :func:`prefetch_l2_slab` prologue for
    ``weight``: its ``PREFETCH_L2`` constexpr and ``prefetch_programs`` (how many programs, the first ones and at
    most one per SM, share the prefetch). On where :func:`l2_prefetch_enabled` and ``weight`` is one contiguous,
    16-byte aligned CUDA buffer of at most half the L2."""
    off = {"PREFETCH_L2": False, "prefetch_programs": 1}
    if not (l2_prefetch_enabled() and weight.is_cuda and weight.is_contiguous() and weight.data_ptr() % 16 == 0):
        return off
    index = weight.device.index if weight.device.index is not None else torch.cuda.current_device()
    sms, l2_bytes = _device_facts(index)
    nbytes = weight.numel() * weight.element_size()
    if nbytes % 16 or nbytes > l2_bytes // 2:
        return off
    return {"PREFETCH_L2": True, "prefetch_programs": min(sms, programs)}


@triton.jit
def _bulk_prefetch_l2(address, nbytes):
    """One ``cp.async.bulk.prefetch.L2`` of ``nbytes`` (a multiple of 16) from ``address`` (16-byte aligned), issued by
    thread 0 of the program only. The output is a dummy: inline PTX must produce a value; not pure, so it is kept."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [address, nbytes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def prefetch_l2_slab(base, total_bytes, program, programs):
    """Program ``program`` (of the first ``programs``) prefetches its 1/``programs`` slab of the ``total_bytes``
    (a multiple of 16) starting at ``base``; a program past ``programs`` does nothing."""
    if program < programs:
        slab = tl.cdiv(tl.cdiv(total_bytes, programs), 16) * 16
        start = program.to(tl.int64) * slab
        stop = tl.minimum(start + slab, total_bytes)
        bytes_base = base.to(tl.pointer_type(tl.int8))
        for piece in range(start, stop, PIECE_BYTES):
            _bulk_prefetch_l2(bytes_base + piece, tl.minimum(stop - piece, PIECE_BYTES).to(tl.int32))

"""Programmatic dependent launch (PDL) for the decode kernels: overlap a kernel's start with its predecessor's end.

A batch-1 decode step is a chain of short dependent kernels (a few µs each). Launched plainly, each starts only once
the one before it has finished and flushed its writes, which costs a few µs of launch, ramp-up and tail per kernel
(bench/NOTES.md, "PDL"). On Hopper and newer, a kernel launched with the ``launch_pdl`` option may start while the
kernel before it still runs, as soon as that one has executed ``gdc_launch_dependents`` in every program (or
finished). It must then execute ``gdc_wait`` before it reads anything an earlier kernel wrote, or writes anything
an earlier kernel may still read; ``gdc_wait`` returns once the earlier kernel has completed and its writes are
visible. What comes before the wait may only read what no earlier kernel of the step writes: the weights, the step's
inputs (copied in before its first kernel, which is not a PDL launch), and state that only this kernel writes in a
step (the fused GDN kernel's conv history and recurrent state of its own layer; the decode attention kernel's KV
cache of its own layer, at the cached positions).

The protocol of every PDL kernel here, in this order:
  1. ``gdc_launch_dependents()``: the next kernel may be scheduled (it cannot get past its own wait before this one
     completes, so this is safe at the very start);
  2. loads of weights (constant during a step), and of what else no earlier kernel of the step writes (above);
  3. ``gdc_wait()``;
  4. everything else: loads of activations and states, all stores.

A kernel launched without PDL after a PDL kernel waits for it as usual, so PDL and plain kernels (Inductor's,
cuBLAS) mix freely; the overlap only happens between two adjacent PDL kernels. Captured into a CUDA graph, the
dependency becomes a programmatic edge (CUDA 12.3 on).
"""

from __future__ import annotations

import functools
import os

import torch

from ops.options import current_options


@functools.cache
def pdl_supported() -> bool:
    """Whether kernels can be launched with PDL here: a Hopper or newer GPU, a Triton with the launch option and the
    ``griddepcontrol`` intrinsics (3.4 on), and not the interpreter."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    try:
        import triton.language as tl
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    has_option = "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})
    has_intrinsics = hasattr(tl.extra.cuda, "gdc_wait") and hasattr(tl.extra.cuda, "gdc_launch_dependents")
    return has_option and has_intrinsics and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def pdl_flags(tensor: torch.Tensor) -> dict:
    """Launch arguments for a PDL-capable kernel (its ``USE_PDL`` constexpr and Triton's ``launch_pdl`` option)
    working on ``tensor``'s device: PDL on CUDA where supported and the ``pdl`` option is on (ops/options.py; off to
    compare, or where a driver mishandles PDL inside CUDA graphs), off on the CPU (the interpreter)."""
    use = tensor.is_cuda and current_options().pdl and pdl_supported()
    return {"USE_PDL": True, "launch_pdl": True} if use else {"USE_PDL": False}

"""The ``ce`` op library and the helper that registers one op.

``torch.library.Library.define/impl`` is used rather than ``@torch.library.custom_op``: it costs ~2 µs a call
instead of ~7-12 µs, which matters wherever no CUDA graph replays (prefill, CPU).
"""

from __future__ import annotations

from typing import Callable

import torch

NAMESPACE = "ce"
LIB = torch.library.Library(NAMESPACE, "DEF")
OPS: list[torch._ops.OpOverload] = []  # every op define_op has registered, in definition order
REFERENCES: dict[torch._ops.OpOverload, Callable] = {}  # each op's reference (its CPU kernel), by op

# Reserved rows. Padding lanes of a bucketed decode batch point at them; no live sequence ever owns them.
NULL_SLOT = 0  # row 0 of every state pool (recurrent and conv)
NULL_BLOCK = 0  # block 0 of every KV cache

# Inductor may otherwise hand a custom op other layouts than eager does (torch versions differ in their default):
# the kernels are proven on the layouts eager mode passes, so compiled graphs must pass the same strides.
_exact = getattr(torch.Tag, "needs_exact_strides", None)
EXACT_STRIDES = (_exact,) if _exact is not None else ()


DEVICE_BUFFERS: list[Callable[[torch.device], object]] = []  # makers of kernels' per-device buffers (prepare_device)


def prepare_device(device: torch.device) -> None:
    """Make the kernels' persistent per-device buffers on ``device`` (``DEVICE_BUFFERS``). A buffer made inside a
    CUDA-graph capture or cudagraph trees' warm-up would live in the graph's private memory pool, so the graph runners
    call this first."""
    for make in DEVICE_BUFFERS:
        make(device)


def define_op(
    schema: str,
    *,
    reference: Callable,
    fake: Callable,
    cuda: Callable | None = None,
) -> Callable:
    """Define ``ce::<name>`` from ``schema`` and register its kernels; returns the op overload.

    ``reference`` is the CPU kernel. ``cuda`` defaults to the reference (plain torch runs on any device) until a
    real kernel exists.
    """
    name = schema.split("(", 1)[0]
    LIB.define(schema, tags=EXACT_STRIDES)
    LIB.impl(name, reference, "CPU")
    LIB.impl(name, cuda if cuda is not None else reference, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=LIB)
    op = getattr(getattr(torch.ops, NAMESPACE), name).default
    OPS.append(op)
    REFERENCES[op] = reference
    return op

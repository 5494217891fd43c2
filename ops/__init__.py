"""Custom ops of compiled_engine, registered under the ``torch.ops.ce`` namespace.

Each op family lives in its own module and provides:
  * a schema (``Tensor(a!)`` marks every argument the op writes, so the compiler keeps those writes),
  * a fake (meta) kernel, so ``torch.compile`` can trace through it,
  * a CPU reference in plain torch: the definition of correct,
  * a CUDA kernel (Triton or FLA) where one exists; until then the reference also serves CUDA.

Layers, lowest first (each imports only its own layer and those below): the leaf modules ``options``
(KernelOptions: the CE_* switches), ``layouts`` (argument layouts an op and its kernel share) and ``library`` (op
registration, reserved rows); the kernel modules in ``ops/triton``; the op modules, which register those kernels.

Importing this package registers everything. Conventions shared by all ops:
  * state slot 0 and KV block 0 are reserved "null" rows: padding lanes of a bucketed batch point there,
    so they never touch a live sequence (never -1: aten indexing wraps -1 to the last row);
  * ``cu_seqlens`` is int32 ``[N + 1]`` with ``cu_seqlens[0] == 0`` (varlen packing, flash-attn style);
  * slot indices and block tables are int32, ``slot_mapping`` (a flat KV row per token) is int64.
"""

# importing the op modules registers their ops
from ops import (  # noqa: F401
    activation, argmax, attention_decode, attention_prologue, conv1d, decode_inputs, delta_rule, flash_attention, gated_deltanet_decode,
    gated_deltanet_verify, kv_cache, linear, logprobs, moe, norm, paged_attention, penalties, sample,
)
from ops.library import NULL_BLOCK, NULL_SLOT

__all__ = [
    "NULL_BLOCK", "NULL_SLOT", "activation", "argmax", "attention_decode", "attention_prologue", "conv1d", "decode_inputs", "delta_rule",
    "flash_attention", "gated_deltanet_decode", "gated_deltanet_verify", "kv_cache", "linear", "logprobs", "moe",
    "norm", "paged_attention", "penalties", "sample",
]

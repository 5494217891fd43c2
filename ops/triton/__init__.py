"""CUDA implementations of the ``ce`` ops: our own Triton kernels, plus FLA where it already does the job.

One module per op family, each holding the ``@triton.jit`` kernels and a launcher with the op's exact signature:

  kv_cache_kernels          store_kv
  paged_attention_kernels   paged_attention_decode (split-K flash-decoding), paged_attention_prefill (varlen)
  attention_decode_kernels  attention_decode (q/k norm + RoPE + KV store + split-K decode attention + output gate
                            of a decode step, one launch: the last split program of a KV head merges the splits)
  conv1d_kernels            causal_conv1d_prefill (varlen, state by slot), causal_conv1d_decode (in place)
  delta_rule_kernels        gated_delta_rule_decode (our kernel, state pool in place), gated_delta_rule_prefill (FLA)
  gated_deltanet_kernels    gated_deltanet_decode (conv + delta rule + gated norm of a decode step, one launch)
  gemv_kernels              skinny_gemm (linear and silu_mul_linear at M <= 16: GEMV / padded tensor-core tiles,
                            split-K, autotuned)
  activation_kernels        silu_mul (the SwiGLU MLP's silu(gate) * up, one pass)
  argmax_kernels            argmax (each row's greedy token: chunk winners, then the row's, two launches)
  decode_inputs_kernels     advance_decode_inputs (the decode graph's epilogue: greedy tokens, the next step's inputs)
  sample_kernels            sample (greedy / temperature / top-k / top-p / min-p: radix-select thresholds, then a
                            Gumbel-max draw with in-kernel splitmix64 noise; one launch per pass over (B, chunks))
  norm_kernels              rms_norm (zero-centred or gated by silu, one pass per row, strided rows), add_rms_norm
                            (a layer's residual add + norm)

and two helpers: ``pdl``, programmatic dependent launch, the protocol the decode kernels follow (launch flags, when to
wait); ``l2_prefetch``, the skinny GEMM's prefetch of its weight into L2 before that wait.

This package itself imports neither triton nor FLA: the op modules register :func:`lazy_kernel` wrappers as their
``cuda=`` implementations, so ``import ops`` works on CPU-only machines without triton, and triton is first
imported when a CUDA tensor first reaches an op (or a test imports a kernel module directly, e.g. under
``TRITON_INTERPRET=1``, where the launchers also accept CPU tensors).
"""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_kernel(module: str, name: str) -> Callable:
    """A function that imports ``ops.triton.<module>`` on its first call and then forwards to ``<name>``.

    The indirection costs one Python frame per call (~0.1 µs), against the ~2 µs the dispatcher already costs.
    """
    impl: Callable | None = None

    def call(*args):
        nonlocal impl
        if impl is None:
            impl = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        return impl(*args)

    call.__name__ = f"{name}_cuda"
    call.__qualname__ = call.__name__
    return call

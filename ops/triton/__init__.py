"""CUDA implementations of the ``ce`` ops: our own Triton kernels, plus FLA where it already does the job.

One module per op family, each holding the ``@triton.jit`` kernels and a launcher with the op's exact signature:

  kv_cache_kernels          store_kv
  paged_attention_kernels   paged_attention_decode (split-K flash-decoding), paged_attention_prefill (varlen)
  attention_decode_kernels  attention_decode (q/k norm + RoPE + KV store + split-K decode attention + output gate
                            of a decode step, one launch, plus the paged decode's reduce kernel for a split context)
  attention_prologue_kernels  attention_prologue (q/k norm + RoPE + KV store of the unfused steps: prefill, verify)
  conv1d_kernels            causal_conv1d_prefill (varlen, state by slot), causal_conv1d_decode (in place)
  delta_rule_kernels        gated_delta_rule_decode (our kernel, state pool in place), gated_delta_rule_prefill (FLA)
  gated_deltanet_kernels    gated_deltanet_decode (conv + delta rule + gated norm of a decode step, one launch)
  gemv_kernels              skinny_gemm, add_rms_norm_skinny_gemm (linear, silu_mul_linear,
                            add_rms_norm_linear_silu_mul's gate_up at 1-5 rows, add_rms_norm_linear at one row: a
                            one-row and a few-rows GEMV, configs by rule)
  moe_kernels               fused_moe (a sparse MoE layer's routed experts: two grouped GEMMs over the rows
                            sorted by expert, the activation fused into the first), moe_align (that sort in one
                            program for a decode step's few rows)
  activation_kernels        silu_mul (the SwiGLU MLP's silu(gate) * up, one pass)
  argmax_kernels            argmax (each row's greedy token: chunk winners, then the row's, two launches)
  decode_inputs_kernels     advance_decode_inputs (the decode graph's epilogue: greedy tokens, the next step's inputs)
  sample_kernels            sample (greedy / temperature / top-k / top-p / min-p: radix-select thresholds, then a
                            Gumbel-max draw with in-kernel splitmix64 noise; one launch per pass over (B, chunks))
  penalty_kernels           apply_penalties_ (presence / frequency / repetition penalties: the rows' tokens as dense
                            codes by two scatters, then one in-place pass over the penalised rows)
  norm_kernels              rms_norm (zero-centred or gated by silu, one pass per row, strided rows), add_rms_norm
                            (a layer's residual add + norm)

and three helper modules: ``pdl``, programmatic dependent launch, the protocol the decode kernels follow (launch
flags, when to wait); ``l2_prefetch``, the skinny GEMM's prefetch of its weight into L2 before that wait;
``compile_threads``, a warm-up's first launches on a thread pool (their variants compiled side by side); and, here,
``unit_stride`` for the launchers.

Imports go one way: an op module (ops/<family>.py) imports its kernel module and registers the launcher as the op's
CUDA kernel; a kernel module imports triton, torch, other kernel modules here, and the leaf modules below both
(ops.layouts: argument layouts and checks an op and its kernel share; ops.options: the kernel options; ops.library:
the reserved null rows), never an op module. FLA is imported only inside the launchers that call it.

Where triton is not installed (it is a dependency on Linux only), ``HAVE_TRITON`` is False: the op modules import no
kernel module and register their CPU references for CUDA too, so ``import ops`` still works. A triton that is
installed but fails to import raises at ``import ops`` instead of silently falling back.
"""

from __future__ import annotations

import importlib.util

HAVE_TRITON = importlib.util.find_spec("triton") is not None


def unit_stride(*vectors):
    """The 1-D index and parameter vectors of a launch (slots, lengths, positions, norm weights, gates' parameters),
    which its kernel reads with unit stride: each as it is, or a contiguous copy of a strided view. One vector
    gives one tensor, several a tuple."""
    kept = tuple(vector.contiguous() for vector in vectors)
    return kept[0] if len(kept) == 1 else kept

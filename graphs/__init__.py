"""Compiled decode: bucket policy, static input buffers with padding lanes, torch.compile + CUDA-graph capture.

    from graphs import compile_decode
    runtime.decode_fn = compile_decode(runtime)   # compiles and captures every bucket at start-up

Modules: ``buckets`` (which batch sizes get a graph), ``static_inputs`` (fixed-address step buffers, padding lanes),
``decode_graph`` (DecodeGraphRunner, compile_decode), ``measure`` (eager vs compiled prefill and decode timings,
``python -m graphs.measure``). See DESIGN.md, "Compile rules".

Prefill is NOT compiled. Measured with ``graphs.measure`` (the same varlen StepInputs through the eager model and
through ``torch.compile(dynamic=True, fullgraph=True)``; median of 10 calls, every call from zeroed state):

    H200, torch 2.11, Qwen3.5-0.8B shape (24 layers, bf16, random weights):
        1 x 512 tokens     eager 45.9 ms   compiled 40.5 ms   1.14x
        1 x 2048 tokens    eager 47.2 ms   compiled 53.9 ms   0.87x
        8 x 1024 tokens    eager 61.6 ms   compiled 50.7 ms   1.21x
        first call: 61 s to compile, and 67 s again for the 8-sequence batch (a second graph despite dynamic=True)
    CPU (2 shared cores, torch 2.13, fp32), 0.8B layer shapes, 4 layers, vocab 4096:
        1 x 64 / 1 x 256 / 1 x 1024 / 4 x 256 tokens: 1.07x / 1.08x / 0.94x / 1.21x  (first call 6 s)
    CPU, the tiny test model (8 layers, hidden 64):
        1 x 16 / 1 x 128 / 1 x 512 / 4 x 128 tokens: 1.15x / 1.33x / 1.49x / 1.02x  (first call 9 s)

Recommendation: do not compile prefill now. The gain is -13%..+21% on the GPU, while the cost is a minute or more of
compile per prefill graph at start-up and recompiles for new shape classes in the middle of serving (dynamic=True
still specialised on the batch of one), which the decode path's "no compile after warm-up" rule forbids. The
numbers also say where the prefill time goes: 512 and 2048 tokens take the same ~46 ms, so eager prefill at these
sizes is bound by the host (op launch overhead and host syncs inside the varlen ops), not by the GPU (8192 tokens are
~13 TFLOP, ~17 ms at the H200's bf16 rate). Fix that first (fewer, fused launches and no host syncs in the prefill
ops); then re-measure with ``python -m graphs.measure --shape 0.8b --device cuda`` — compiling only the dense
per-layer blocks (norms, projections, MLP) with bucketed token counts is the variant to try if it then pays.
"""

from graphs.buckets import BucketPolicy, bucket_for, default_bucket_sizes
from graphs.decode_graph import DecodeGraphRunner, compile_decode, decode_forward, expected_compiles
from graphs.static_inputs import StaticDecodeInputs

__all__ = [
    "BucketPolicy",
    "DecodeGraphRunner",
    "StaticDecodeInputs",
    "bucket_for",
    "compile_decode",
    "decode_forward",
    "default_bucket_sizes",
    "expected_compiles",
]

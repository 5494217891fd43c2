"""Compiled decode: bucket policy, static input buffers with padding lanes, torch.compile + CUDA-graph capture.

    from graphs import compile_decode
    runtime.decode_fn = compile_decode(runtime)   # compiles and captures every bucket at start-up

Modules: ``buckets`` (which batch sizes get a graph), ``static_inputs`` (fixed-address step buffers, padding lanes),
``decode_graph`` (DecodeGraphRunner, compile_decode). See DESIGN.md, "Compile rules".

Prefill is not compiled (measurement and recommendation below).
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

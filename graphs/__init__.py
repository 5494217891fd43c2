"""Compiled decode: which batch sizes get a graph, the fixed-address step buffers, and the capture itself.

    runner = DecodeGraphRunner(model, max_num_seqs=..., max_blocks_per_seq=..., device="cuda")
    runner.warmup()          # compile and capture every bucket, largest first
    out = runner(step)       # a decode StepInputs -> DecodeOutput (the graph's own buffers)

Modules: ``buckets`` (which batch sizes get a graph), ``static_inputs`` (fixed-address step buffers, padding lanes),
``decode_graph`` (DecodeGraphRunner). The runner knows the model only as a module whose forward takes a StepInputs
(``compiled_engine.step``) and which has ``decode_logits``; it imports nothing else of compiled_engine. Who builds
it: ``compiled_engine.executor.ModelExecutor.compile_decode``. Prefill is not compiled (bench/NOTES.md, "Prefill
compile", has the measurement and the reasons), but a prompt or mixed step is captured as it runs
eagerly, one CUDA graph per token bucket and sequence bucket (``prefill_graph``: PrefillGraphs, built by
``ModelExecutor.compile_prefill``). docs/ARCHITECTURE.md, "Compile and capture", states the rules a graph depends on.
"""

from graphs.buckets import BucketPolicy, bucket_for, default_bucket_sizes
from graphs.decode_graph import DecodeGraphRunner, decode_forward, eager_decode, expected_compiles
from graphs.prefill_graph import PrefillGraphs, prefill_buckets, sequence_buckets
from graphs.static_inputs import StaticDecodeInputs, StaticSamplingInputs

__all__ = [
    "BucketPolicy",
    "DecodeGraphRunner",
    "PrefillGraphs",
    "StaticDecodeInputs",
    "StaticSamplingInputs",
    "bucket_for",
    "decode_forward",
    "eager_decode",
    "default_bucket_sizes",
    "expected_compiles",
    "prefill_buckets",
    "sequence_buckets",
]

"""Does compiling pay? Eager vs compiled prefill, and eager vs graph-replayed decode, on one machine.

    python -m bench.compile_measure --shape 0.8b --device cuda --dtype bfloat16            # random Qwen3.5-0.8B shape
    python -m bench.compile_measure --model PATH --device cpu --dtype float32 --no-decode

Prefill: the same varlen StepInputs runs through the eager model and through ``torch.compile(dynamic=True,
fullgraph=True)`` of the same function (prompt lengths vary, so a static-shape prefill graph would recompile for
every new length). Reported: median ms per call after warm-up, and the seconds the compiled function took to
compile on first use of each case (later cases may reuse a graph). Decode: eager ``model(step)`` vs the
DecodeGraphRunner, per step, the host's ``build_step`` included in both (it is what the runtime really pays).
Prints one JSON line per case, then a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from compiled_engine.cache import reset_state_slot

# Qwen3.5-0.8B's text shape (docs/ARCHITECTURE.md, "Performance model").
SHAPES = {
    "0.8b": dict(
        vocab_size=248320,
        hidden_size=1024,
        intermediate_size=3584,
        num_hidden_layers=24,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
    ),
}


def random_checkpoint(shape: str, folder: Path, layers: int | None = None, vocab: int | None = None) -> Path:
    """A Qwen3_5ForCausalLM of the given shape with transformers' random init, saved in bf16 (timing only)."""
    import transformers

    kwargs = dict(SHAPES[shape])
    if layers:
        kwargs["num_hidden_layers"] = layers
    if vocab:
        kwargs["vocab_size"] = vocab
    config = transformers.Qwen3_5TextConfig(
        **kwargs,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = transformers.Qwen3_5ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    return folder


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn, device: torch.device, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def prefill_forward(model, step):
    hidden = model(step)
    return model.compute_logits(hidden[step.last_token_indices()])


@torch.inference_mode()
def measure_prefill(rt, cases, repeats: int) -> list[dict]:
    """cases: (num_sequences, tokens each). The same StepInputs is re-run: cache writes land in the same rows."""
    from graphs.decode_graph import register_inductor_fallbacks
    from ops.library import OPS

    register_inductor_fallbacks(OPS)  # as the decode runner does: torch <= 2.12 would print deep IR otherwise
    compiled = torch.compile(prefill_forward, dynamic=True, fullgraph=True)
    results = []
    for num_seqs, length in cases:
        vocab = rt.model_config.vocab_size
        seqs = [rt.add_sequence([(7 * i + j) % (vocab - 1) + 1 for j in range(length)]) for i in range(num_seqs)]
        try:
            step = rt.build_step(seqs, [length] * num_seqs, is_prefill=True)

            def fresh(fn):
                # Every call starts from zeroed state, as a new prompt does (re-running on the state a previous
                # call left would compound it towards denormals, which are slow on CPUs), in both variants.
                for seq in seqs:
                    reset_state_slot(rt.model, seq.state_slot)
                return fn(rt.model, step)

            t0 = time.perf_counter()
            fresh(compiled)
            _sync(rt.device)
            compile_s = time.perf_counter() - t0
            eager_ms = median_ms(lambda: fresh(prefill_forward), rt.device, repeats)
            compiled_ms = median_ms(lambda: fresh(compiled), rt.device, repeats)
        finally:
            for seq in seqs:
                rt.release(seq)
        tokens = num_seqs * length
        row = dict(
            what="prefill",
            sequences=num_seqs,
            tokens=tokens,
            eager_ms=round(eager_ms, 3),
            compiled_ms=round(compiled_ms, 3),
            speedup=round(eager_ms / compiled_ms, 3),
            eager_tok_s=round(tokens / eager_ms * 1e3),
            compiled_tok_s=round(tokens / compiled_ms * 1e3),
            first_call_s=round(compile_s, 1),
        )
        print(json.dumps(row), flush=True)
        results.append(row)
    return results


@torch.inference_mode()
def measure_decode(rt, batch_sizes, context: int, steps: int) -> list[dict]:
    t0 = time.perf_counter()
    runner = rt.compile_decode(buckets=sorted(batch_sizes))
    startup = time.perf_counter() - t0
    results = []
    for batch in batch_sizes:
        vocab = rt.model_config.vocab_size
        seqs = [rt.add_sequence([(3 * i + j) % (vocab - 1) + 1 for j in range(context)]) for i in range(batch)]
        try:
            rt.prefill(seqs)

            def step_with(fn):
                for seq in seqs:
                    seq.token_ids.append(5)
                return fn(rt.build_step(seqs, [1] * batch, is_prefill=False))

            eager_ms = median_ms(lambda: step_with(lambda s: rt.model.compute_logits(rt.model(s))), rt.device, steps)
            graph_ms = median_ms(lambda: step_with(runner), rt.device, steps)
        finally:
            for seq in seqs:
                rt.release(seq)
        row = dict(
            what="decode",
            batch=batch,
            context=context,
            eager_ms=round(eager_ms, 3),
            graph_ms=round(graph_ms, 3),
            speedup=round(eager_ms / graph_ms, 2),
            graph_tok_s=round(batch / graph_ms * 1e3),
        )
        print(json.dumps(row), flush=True)
        results.append(row)
    print(json.dumps(dict(what="decode_startup", buckets=sorted(batch_sizes), seconds=round(startup, 1))), flush=True)
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint folder (default: a random --shape model)")
    parser.add_argument("--shape", default="0.8b", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, help="override the shape's layer count")
    parser.add_argument("--vocab", type=int, help="override the shape's vocabulary")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--prefill-cases", default="1x128,1x512,1x2048,4x512,16x512")
    parser.add_argument("--decode-batches", default="1,8,32,128")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-prefill", action="store_true")
    parser.add_argument("--no-decode", action="store_true")
    args = parser.parse_args(argv)

    from compiled_engine.runtime import Runtime

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or random_checkpoint(args.shape, Path(tmp), args.layers, args.vocab)
        cases = [tuple(int(x) for x in c.split("x")) for c in args.prefill_cases.split(",") if c]
        batches = [int(b) for b in args.decode_batches.split(",") if b]
        longest = max([length for _, length in cases] + [args.context + 64])
        rt = Runtime.from_pretrained(
            str(path),
            device=args.device,
            dtype=args.dtype,
            compile=False,  # measure_decode compiles, timed
            max_model_len=longest + 64,
            max_num_seqs=max([n for n, _ in cases] + batches),
        )
        print(json.dumps(dict(what="setup", device=str(rt.device), dtype=str(rt.dtype), torch=torch.__version__)))
        if not args.no_prefill:
            measure_prefill(rt, cases, args.repeats)
        if not args.no_decode:
            measure_decode(rt, batches, args.context, args.repeats)


if __name__ == "__main__":
    main()

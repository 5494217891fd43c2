"""latency: batch 1, a 128-token prompt, 512 greedy new tokens (ignore_eos).

What is timed (after one warm-up request of the same prompt length):
  * engine: one request driven through ``LLMEngine.add_request`` / ``step()``, a timestamp when each token reaches
    the caller in an output (the host has read it back, so its step is done). TTFT = add_request -> the first
    token; each later interval is one decode step (scheduler + runtime decode + sampler + the device->host token
    copy; with overlap_decode the host's part overlaps the next step's GPU work). Decode tok/s = (new_tokens - 1)
    / (last token - first token). Repeated ``repeats`` times; the median run is reported.
  * runtime: the same prompt through ``Runtime.prefill`` / ``decode_step`` + argmax with no scheduler or sampler,
    to separate the runtime's step time from the engine's host overhead.
  * graph replay (CUDA, compiled decode): the batch-1 decode graph replayed ``replays`` times back to back on one
    step's inputs, timed with CUDA events: the GPU time of a step with no host work between steps. Against the
    engine's step time it says whether a step is GPU-bound (equal) or waits for the host. ``host_ms_per_replay``
    is the host's cost of one replay call (Dynamo guards, cudagraph-tree bookkeeping, the graph launch). The
    skinny GEMM's configs are recorded beside it (the 2..16-row autotuner's picks can differ between processes).
Bound: batch-1 decode reads every weight once, so tok/s <= copy bandwidth / weight_bytes (bench/bounds.py).
Achieved bandwidth = weight_bytes x decode steps/s (as gpt-fast reports it); its fraction of the copy bandwidth
equals the fraction of the bound.
"""

from __future__ import annotations

import random
import time

import torch

from bench.bounds import decode_bound
from bench.common import Context, distribution, greedy, random_prompt, ratio, save_plot


def requirements(prompt_len: int = 128, new_tokens: int = 512, **_) -> tuple[int, int]:
    return 1, prompt_len + new_tokens + 1


def run(
    ctx: Context,
    prompt_len: int = 128,
    new_tokens: int = 512,
    repeats: int = 3,
    warmup_tokens: int = 16,
    seed: int = 0,
    replays: int = 200,
) -> dict:
    if new_tokens < 2:
        raise ValueError("latency needs new_tokens >= 2 (one prefill token, at least one decode step)")
    ctx.require(*requirements(prompt_len, new_tokens))
    llm = ctx.llm()
    prompt = random_prompt(random.Random(seed), prompt_len, ctx.model_config.vocab_size)
    llm.generate([prompt], greedy(min(warmup_tokens, new_tokens)), use_tqdm=False)  # warm-up

    runs = [_engine_run(ctx, llm.engine, prompt, new_tokens) for _ in range(repeats)]
    median_run = sorted(runs, key=lambda r: r["decode_tok_s"])[len(runs) // 2]
    runtime_only = _runtime_run(ctx, llm.runtime, prompt, new_tokens)
    graph_replay = _graph_replay_run(ctx, llm.runtime, prompt, replays)

    mb = ctx.model_bytes()
    bw = ctx.bandwidth()["bytes_per_s"]
    bound = decode_bound(mb, bw, batch=1, context=prompt_len + new_tokens / 2)
    bound_weights_only = bw / mb.weight_bytes

    def with_bandwidth(r: dict) -> dict:
        achieved = mb.weight_bytes * r["decode_tok_s"]  # batch 1: one step per token
        return {
            **r,
            "achieved_bandwidth_GBps": achieved / 1e9,
            "fraction_of_copy_bandwidth": achieved / bw,
        }

    ours = with_bandwidth({k: v for k, v in median_run.items() if k != "step_ms"})
    result = ctx.metadata("latency")
    result.update(
        {
            "workload": {"batch": 1, "prompt_len": prompt_len, "new_tokens": new_tokens, "greedy": True,
                         "ignore_eos": True, "repeats": repeats, "seed": seed},
            "ours": ours,
            "repeats_decode_tok_s": [r["decode_tok_s"] for r in runs],
            "runtime_only": with_bandwidth(runtime_only),
            "graph_replay": graph_replay and with_bandwidth(graph_replay),
            "bound": {
                "tok_s": bound_weights_only,
                "formula": "copy_bandwidth / weight_bytes",
                "weight_bytes": mb.weight_bytes,
                "with_state_and_kv_tok_s": bound["tok_s"],
                "with_state_and_kv": bound,
            },
            "fraction_of_bound": ours["decode_tok_s"] / bound_weights_only,
        }
    )
    result["plot"] = save_plot(ctx, "latency", lambda plt: _draw(plt, median_run["step_ms"], 1e3 / bound_weights_only))
    ctx.write("latency", result)
    return result


def run_hf(ctx: Context, result: dict, prompt_len: int = 128, new_tokens: int = 512, seed: int = 0,
           hf_new_tokens: int = 64, **_) -> dict:
    """HF generate on the same prompt (``hf_new_tokens`` of them): TTFT and decode tok/s from per-step timestamps."""
    from bench.hf import hf_decode_rate, hf_generate, hf_kernels

    model = ctx.hf_model()
    prompt = random_prompt(random.Random(seed), prompt_len, ctx.model_config.vocab_size)
    hf_tokens = max(2, min(hf_new_tokens, new_tokens))
    if ctx.device.type == "cuda":  # this shape's first-call JIT / autotuning stays out of the numbers
        hf_generate(model, [prompt], 4)
    hf = hf_decode_rate(model, [prompt], hf_tokens)
    hf["kernels"] = hf_kernels()
    hf["note"] = f"HF generated {hf_tokens} tokens (ours: {new_tokens}); decode tok/s is a per-step rate"
    result["hf"] = hf
    result["ratio_vs_hf"] = {
        "decode_tok_s": ratio(result["ours"]["decode_tok_s"], hf["decode_tok_s"]),
        "ttft": ratio(hf["ttft_ms"], result["ours"]["ttft_ms"]),  # > 1: ours is faster
    }
    ctx.write("latency", result)
    return result


def _engine_run(ctx: Context, engine, prompt: list[int], new_tokens: int) -> dict:
    ctx.sync()
    start = time.perf_counter()
    request_id = engine.add_request(None, prompt, greedy(new_tokens))
    stamps, first, finished = [], None, False
    while not finished:
        # No device sync here: a token in an output has been read back to the host, so its step is done, and a sync
        # would stop overlap_decode from running the next step ahead (it did, until 2026-11-29's run 6).
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            if out.request_id == request_id:
                stamps.append(now)
                first = first if first is not None else now
                finished = out.finished
    step_s = [b - a for a, b in zip(stamps, stamps[1:])]
    decode_s = stamps[-1] - stamps[0]
    return {
        "ttft_ms": (first - start) * 1e3,
        "decode_steps": len(step_s),
        "decode_s": decode_s,
        "decode_tok_s": len(step_s) / decode_s,
        "ms_per_step": distribution(step_s, 1e3),
        "step_ms": [s * 1e3 for s in step_s],
    }


@torch.inference_mode()
def _runtime_run(ctx: Context, runtime, prompt: list[int], new_tokens: int) -> dict:
    seq = runtime.add_sequence(prompt)
    try:
        ctx.sync()
        start = time.perf_counter()
        seq.token_ids.append(int(runtime.prefill([seq])[0].argmax()))
        first = time.perf_counter()
        step_s = []
        for _ in range(new_tokens - 1):
            t0 = time.perf_counter()
            seq.token_ids.append(int(runtime.decode_step([seq], copy=False)[0].argmax()))  # .item() synchronises
            step_s.append(time.perf_counter() - t0)
        decode_s = time.perf_counter() - first
    finally:
        runtime.release(seq)
    return {
        "ttft_ms": (first - start) * 1e3,
        "decode_steps": len(step_s),
        "decode_s": decode_s,
        "decode_tok_s": len(step_s) / decode_s,
        "ms_per_step": distribution(step_s, 1e3),
        "note": "Runtime.prefill/decode_step + argmax only: no scheduler, sampler or request bookkeeping",
    }


@torch.inference_mode()
def _graph_replay_run(ctx: Context, runtime, prompt: list[int], replays: int) -> dict | None:
    from graphs.decode_graph import DecodeGraphRunner

    runner = runtime.decode_fn
    if ctx.device.type != "cuda" or not isinstance(runner, DecodeGraphRunner):
        return None
    seq = runtime.add_sequence(prompt)
    try:
        seq.token_ids.append(int(runtime.prefill([seq])[0].argmax()))
        runtime.decode_step([seq], copy=False)  # copies a live batch-1 step into the graph's static buffers
        for _ in range(3):
            runner.replay_last(1)
        ctx.sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host_start = time.perf_counter()
        start.record()
        for _ in range(replays):
            runner.replay_last(1)
        host_s = time.perf_counter() - host_start
        end.record()
        end.synchronize()
        gpu_ms = start.elapsed_time(end) / replays
    finally:
        runtime.release(seq)
    return {
        "replays": replays,
        "ms_per_step": gpu_ms,
        "decode_tok_s": 1e3 / gpu_ms,
        "host_ms_per_replay": host_s / replays * 1e3,
        "skinny_gemm_picks": _skinny_gemm_picks(),
        "note": "one batch-1 step's graph replayed back to back (CUDA events): GPU time without per-step host work",
    }


def _skinny_gemm_picks() -> dict:
    """The skinny GEMM's configs, as strings: the 2..16-row autotuner's pick per key, and the one-row rule's configs
    (``gemv_config``: narrow outputs, everything else)."""
    from ops.triton import gemv_kernels

    picks = {f"rows=2 {key}": str(config) for key, config in gemv_kernels.dot_autotuner().cache.items()}
    picks["rows=1 N <= %d" % gemv_kernels.GEMV_NARROW_N] = str(gemv_kernels.GEMV_NARROW)
    picks["rows=1 wider"] = str(gemv_kernels.GEMV_WIDE)
    return picks


def _draw(plt, step_ms: list[float], bound_ms: float) -> None:
    plt.plot(range(1, len(step_ms) + 1), step_ms, lw=0.8, label="ours: decode step")
    plt.axhline(bound_ms, color="k", ls="--", lw=1, label=f"bound: weights / copy bandwidth ({bound_ms:.3f} ms)")
    plt.xlabel("decode step")
    plt.ylabel("ms / step")
    plt.yscale("log")
    plt.title("batch-1 decode latency")
    plt.legend()

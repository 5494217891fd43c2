"""latency: batch 1, a 128-token prompt, 512 greedy new tokens (ignore_eos).

What is timed (after one warm-up request of the same prompt length):
  * engine between graphs (CUDA): one more request under the torch profiler, and what the GPU does between two of
    its decode graphs (copies, gaps): ``engine_between_graphs``.
  * engine: one request driven through ``LLMEngine.add_request`` / ``step()``, a timestamp when each token reaches
    the caller in an output (the host has read it back, so its step is done). TTFT = add_request -> the first
    token; each later interval is one decode step (scheduler + runtime decode + sampler + the device->host token
    copy; with overlap_decode the host's part overlaps the next step's GPU work). Decode tok/s = (new_tokens - 1)
    / (last token - first token). Repeated ``repeats`` times; the median run is reported.
  * runtime: the same prompt through ``Runtime.prefill`` / ``decode`` (greedy tokens) with no scheduler or sampler,
    to separate the runtime's step time from the engine's host overhead.
  * graph replay (CUDA, compiled decode): the batch-1 decode graph replayed ``replays`` times back to back with no
    new inputs (each replay is the next greedy step of the same sequence: the graph advances its own inputs),
    timed with CUDA events: the GPU time of a step with no host work between steps. Against the
    engine's step time it says whether a step is GPU-bound (equal) or waits for the host. ``host_ms_per_replay``
    is the host's cost of one replay call (Dynamo guards, cudagraph-tree bookkeeping, the graph launch).
Bound: batch-1 decode reads every weight once (of a MoE model's routed experts, the k it routes to), so tok/s <=
copy bandwidth / the weight bytes a batch-1 step reads (``ModelBytes.weight_bytes_at(1)``, bench/bounds.py).
Achieved bandwidth = those bytes x decode steps/s (as gpt-fast reports it); its fraction of the copy bandwidth
equals the fraction of the bound.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

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
    between_graphs = _engine_between_graphs(ctx, llm.engine, prompt)
    runtime_only = _runtime_run(ctx, llm.runtime, prompt, new_tokens)
    graph_replay = _graph_replay_run(ctx, llm.runtime, prompt, replays)

    mb = ctx.model_bytes()
    bw = ctx.bandwidth()["bytes_per_s"]
    bound = decode_bound(mb, bw, batch=1, context=prompt_len + new_tokens / 2)
    step_weight_bytes = mb.weight_bytes_at(1)
    bound_weights_only = bw / step_weight_bytes

    def with_bandwidth(r: dict) -> dict:
        achieved = step_weight_bytes * r["decode_tok_s"]  # batch 1: one step per token
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
            "engine_between_graphs": between_graphs,
            "graph_replay": graph_replay and with_bandwidth(graph_replay),
            "bound": {
                "tok_s": bound_weights_only,
                "formula": "copy_bandwidth / weight_bytes_at_batch_1",
                "weight_bytes_at_batch_1": step_weight_bytes,
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


GRAPH_LAST_KERNEL = "_next_decode_inputs_kernel"  # ce::advance_decode_inputs ends every decode graph (only there)


def _engine_between_graphs(ctx: Context, engine, prompt: list[int], new_tokens: int = 64) -> dict | None:
    """What the GPU does between two decode graphs of the engine's batch-1 loop (CUDA, compiled decode): one more
    request under the torch profiler; for each decode step after the first few, the time from the end of a graph
    (its last kernel) to the start of the next graph's first kernel, and the copies and kernels in that window."""
    if ctx.device.type != "cuda":
        return None
    import json
    import tempfile

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _engine_run(ctx, engine, prompt, new_tokens)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    ops = sorted(((e["name"], float(e["ts"]), float(e["dur"])) for e in events
                  if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda op: op[1])
    ends = [i for i, (name, _, _) in enumerate(ops) if name.startswith(GRAPH_LAST_KERNEL)]
    gaps, between = [], {}
    for i in ends[4:]:  # the first steps follow the prefill
        end = ops[i][1] + ops[i][2]
        j = i + 1
        while j < len(ops) and not (ops[j][0].startswith("triton") or ops[j][0].startswith("_")):
            name = ops[j][0][:60]
            between.setdefault(name, []).append(ops[j][2])
            j += 1
        if j < len(ops):
            gaps.append(ops[j][1] - end)
    if not gaps:
        return {"error": f"no decode graphs found among {len(ops)} GPU ops"}
    steps = len(gaps)
    return {
        "steps": steps,
        "gap_us": distribution(gaps, 1.0),
        "ops_in_gap": {name: {"per_step": len(d) / steps, "us_median": sorted(d)[len(d) // 2]}
                       for name, d in between.items()},
        # The profiler slows the host: in a process whose host is slow the engine falls behind under it, and the
        # gaps (with nothing in them) are host time that the unprofiled steps do not have (run 34: 134 µs here
        # while the same process's engine step equalled its graph).
        "note": "end of a decode graph's last kernel -> start of the next graph's first kernel (torch profiler; "
                "an empty gap is the host, slowed by profiling)",
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
            seq.token_ids.append(int(runtime.decode([seq]).tokens[0]))  # int() synchronises
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
        "note": "Runtime.prefill + Runtime.decode's greedy tokens only: no scheduler, sampler or request bookkeeping",
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
        runtime.decode([seq])  # copies a live batch-1 step into the graph's static buffers
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
        path = profiled_critical_path(lambda: runner.replay_last(1), CRITICAL_PATH_REPLAYS)
    finally:
        runtime.release(seq)
    return {
        "replays": replays,
        "ms_per_step": gpu_ms,
        "decode_tok_s": 1e3 / gpu_ms,
        "host_ms_per_replay": host_s / replays * 1e3,
        "critical_path": path,
        "note": "one batch-1 step's graph replayed back to back (CUDA events): GPU time without per-step host work",
    }


CRITICAL_PATH_REPLAYS = 12


def profiled_critical_path(replay, replays: int) -> dict:
    """``replays`` back-to-back replays under the torch profiler (CUPTI records each kernel of a graph replay), then
    :func:`critical_path` of their kernels."""
    import json
    import tempfile

    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    kernels = [(e["name"], str(e.get("args", {}).get("grid", "")), float(e["ts"]), float(e["dur"]))
               for e in events if e.get("cat") == "kernel"]
    return critical_path(kernels, replays)


def critical_path(kernels: list[tuple[str, str, float, float]], replays: int) -> dict:
    """Where a step's time goes when its kernels overlap (PDL): each kernel is charged the time from the previous
    kernel's end to its own end, so the charges of a step add up to its span and a kernel that mostly overlapped the
    one before costs little. ``kernels``: (name, grid, start µs, duration µs) of ``replays`` identical steps; the
    first step (which waited on whatever ran before) is left out. Returns per (name, grid) the kernels per step,
    their µs per step (charged, and their own durations summed, which overlap), and the step's span."""
    kernels = sorted(kernels, key=lambda k: k[2])
    if replays < 2 or not kernels or len(kernels) % replays:
        return {"error": f"{len(kernels)} kernels in {replays} replays: not one step's worth each"}
    per_step = len(kernels) // replays
    rows: dict[str, dict] = {}
    spans = []
    for r in range(1, replays):
        previous_end = max(start + duration for _, _, start, duration in kernels[(r - 1) * per_step : r * per_step])
        step_start = previous_end
        for name, grid, start, duration in kernels[r * per_step : (r + 1) * per_step]:
            end = start + duration
            row = rows.setdefault(f"{name[:80]} grid={grid}", {"count": 0, "charged_us": 0.0, "duration_us": 0.0})
            row["count"] += 1
            row["charged_us"] += max(0.0, end - previous_end)
            row["duration_us"] += duration
            previous_end = max(previous_end, end)
        spans.append(previous_end - step_start)
    steps = replays - 1
    table = {key: {"per_step": row["count"] / steps, "charged_us_per_step": row["charged_us"] / steps,
                   "duration_us_per_step": row["duration_us"] / steps}
             for key, row in sorted(rows.items(), key=lambda kv: -kv[1]["charged_us"])}
    return {"kernels_per_step": per_step, "span_us": sum(spans) / steps, "by_kernel": table}


def critical_path_lines(path: dict | None, title: str, top: int, indent: int = 11) -> list[str]:
    """A critical path (bench/latency.py ``critical_path``) as summary lines: ``title`` with the step's span, then its
    ``top`` kernels by the µs charged to them; none where there is no path."""
    if not path or "by_kernel" not in path:
        return []
    lines = [f"{'':<{indent}} {title}: {path['span_us']:.1f} µs, {path['kernels_per_step']} kernels; µs charged (end "
             f"after the previous end) per step:"]
    return lines + [f"{'':<{indent + 2}} {row['charged_us_per_step']:8.1f} µs  x{row['per_step']:<3.0f} "
                    f"(own {row['duration_us_per_step']:.1f})  {name}"
                    for name, row in list(path["by_kernel"].items())[:top]]


def _draw(plt, step_ms: list[float], bound_ms: float) -> None:
    plt.plot(range(1, len(step_ms) + 1), step_ms, lw=0.8, label="ours: decode step")
    plt.axhline(bound_ms, color="k", ls="--", lw=1, label=f"bound: weights / copy bandwidth ({bound_ms:.3f} ms)")
    plt.xlabel("decode step")
    plt.ylabel("ms / step")
    plt.yscale("log")
    plt.title("batch-1 decode latency")
    plt.legend()

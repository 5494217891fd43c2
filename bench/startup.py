"""startup: how long until the engine serves its first token -- load, compile and capture -- cold and warm.

Each measurement is a fresh subprocess (``python -m bench.startup CHILD-ARGS``), so compile caches are real:
  * cold: a new, empty ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``;
  * warm: the same directories again (populated by the cold run).
Inside the child, timed with synchronised perf_counter:
  * import_s: importing torch + compiled_engine;
  * load_s: ``Runtime.from_pretrained`` (config, weights to the device, cache allocation), of which memory_plan_s:
    ``memory_plan.allocate_caches`` (its start-up steps at the largest shapes, then the caches);
  * warm_up_sampling_s: the sampler's kernels compiled at ``LLMEngine`` start-up (``warm_up_sampling``);
  * autotune_s / autotune_runs / autotune_by_kernel: the Triton autotuner's benchmarks anywhere in the process (FLA's
    prefill kernels, ours), from Triton's autotuning listener, where the installed Triton has one;
  * compile_capture_s: ``Runtime.compile_decode`` (inside ``from_pretrained``) -- torch.compile of the decode step and the warm-up/capture of every
    bucket's CUDA graph (0 with enforce_eager);
  * capture_prefill_s: ``ModelExecutor.compile_prefill`` (inside ``from_pretrained``) -- the warm-up and capture of
    every prompt-step key (graphs/prefill_graph.py; 0 where none is captured), and ``prefill_keys``, how many;
  * first_generate_s: the first ``generate`` (a short prompt, a few tokens): lazy JIT work (Triton prefill kernels,
    autotuning) lands here; second_generate_s: the same again, for contrast;
  * to_first_token_s: process start -> the first generate's end. The parent also records the subprocess wall time.
The engine configuration (max_num_seqs, max_model_len) is the run's, so a later run with the same configuration and
``-p startup.cache_dir=DIR`` reuses the warm caches. Bound: none applies (no roofline for compilation); the load
rate (checkpoint bytes / load_s) is reported beside it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PROCESS_START = time.perf_counter()

MARKER = "BENCH_STARTUP_RESULT "


def requirements(**_) -> tuple[int, int]:
    """A serving configuration (17 decode buckets up to 256); --max-num-seqs / --max-model-len override it."""
    return 256, 4096


def run(
    ctx,
    cache_dir: str | None = None,
    prompt_len: int = 16,
    new_tokens: int = 4,
    timeout_s: float = 900,
    total_timeout_s: float | None = None,
) -> dict:
    """``timeout_s`` bounds each subprocess; ``total_timeout_s`` both (the warm one gets what the cold one left).
    The JSON is written after the cold run too, so a caller's own timeout during the warm run loses only that."""
    ctx.require(*requirements())
    seqs, length = ctx.engine_limits()
    cache_dir = os.path.abspath(cache_dir) if cache_dir else tempfile.mkdtemp(prefix="bench-startup-")
    if os.path.isdir(cache_dir) and os.listdir(cache_dir):
        raise ValueError(f"startup cache_dir {cache_dir!r} is not empty: the cold run needs an empty one")
    child_args = {
        "model": ctx.model.path,
        "device": str(ctx.device),
        "dtype": str(ctx.dtype).removeprefix("torch."),
        "enforce_eager": ctx.enforce_eager,
        "max_num_seqs": seqs,
        "max_model_len": length,
        "max_num_batched_tokens": ctx.opts.max_num_batched_tokens,
        "num_kv_blocks": ctx.opts.num_kv_blocks,
        "max_prefill_capture_tokens": ctx.opts.max_prefill_capture_tokens,
        "max_prefill_capture_seqs": ctx.opts.max_prefill_capture_seqs,
        "mixed_decode_lanes": ctx.opts.mixed_decode_lanes,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
    }
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
    env["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), *filter(None, [env.get("PYTHONPATH")])])
    start = time.perf_counter()
    total = math.inf if total_timeout_s is None else total_timeout_s
    phases = {"cold": _run_child(child_args, env, min(timeout_s, total)),
              "warm": {"error": "not run yet"}}
    result = _result(ctx, cache_dir, child_args, phases)
    ctx.write("startup", result)
    remaining = total - (time.perf_counter() - start)
    if "error" in phases["cold"]:  # a warm run over a half-filled cache would mean nothing
        phases["warm"] = {"error": "skipped: the cold run failed"}
    elif remaining < 10:
        phases["warm"] = {"error": f"skipped: total_timeout_s={total_timeout_s} spent by the cold run"}
    else:
        phases["warm"] = _run_child(child_args, env, min(timeout_s, remaining))
    result = _result(ctx, cache_dir, child_args, phases)
    ctx.write("startup", result)
    return result


def _result(ctx, cache_dir: str, child_args: dict, phases: dict) -> dict:
    files = [os.path.join(ctx.model.path, f) for f in os.listdir(ctx.model.path) if f.endswith(".safetensors")]
    checkpoint_bytes = sum(os.path.getsize(f) for f in files)
    result = ctx.metadata("startup")
    result.update(
        {
            "workload": {k: child_args[k] for k in ("prompt_len", "new_tokens", "enforce_eager", "max_num_seqs",
                                                     "max_model_len", "max_prefill_capture_tokens",
                                                     "max_prefill_capture_seqs", "mixed_decode_lanes")},
            "cache_dir": cache_dir,
            "cold": phases["cold"],
            "warm": phases["warm"],
            "warm_speedup_to_first_token": _div(phases["cold"].get("to_first_token_s"),
                                                phases["warm"].get("to_first_token_s")),
            "bound": {
                "note": "no roofline applies to start-up; load rate = checkpoint bytes / load_s",
                "checkpoint_bytes": checkpoint_bytes,
                "load_GBps_cold": _div(checkpoint_bytes / 1e9, phases["cold"].get("load_s")),
                "load_GBps_warm": _div(checkpoint_bytes / 1e9, phases["warm"].get("load_s")),
            },
            "fraction_of_bound": None,
        }
    )
    return result


def _div(a, b):
    return a / b if a is not None and b else None


def _run_child(child_args: dict, env: dict, timeout_s: float) -> dict:
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.startup", json.dumps(child_args)],
            env=env, capture_output=True, text=True, timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s} s", "process_wall_s": time.perf_counter() - start}
    wall = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit code {proc.returncode}", "stderr_tail": proc.stderr[-3000:], "process_wall_s": wall}
    return {**json.loads(lines[-1][len(MARKER):]), "process_wall_s": wall}


def child(args: dict) -> dict:
    t0 = time.perf_counter()
    import torch

    import compiled_engine.llm as llm_module
    from compiled_engine.executor import ModelExecutor
    from compiled_engine.runtime import Runtime
    from compiled_engine.sampling_params import SamplingParams

    device = torch.device(args["device"])

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    timings = {"import_s": time.perf_counter() - t0, "compile_capture_s": 0.0, "capture_prefill_s": 0.0,
               "prefill_keys": 0, "memory_plan_s": 0.0, "warm_up_sampling_s": 0.0}
    _listen_to_autotuning(timings)
    original_load, original_compile = Runtime.from_pretrained.__func__, Runtime.compile_decode
    original_prefill = ModelExecutor.compile_prefill

    def timed_from_pretrained(cls, *a, **k):
        start = time.perf_counter()
        runtime = original_load(cls, *a, **k)
        sync()
        timings["load_s"] = (time.perf_counter() - start - timings["compile_capture_s"]
                             - timings["capture_prefill_s"])
        return runtime

    def timed_prefill(self, *a, **k):
        start = time.perf_counter()
        graphs = original_prefill(self, *a, **k)
        sync()
        timings["capture_prefill_s"] += time.perf_counter() - start
        timings["prefill_keys"] = 0 if graphs is None else len(graphs.keys)
        return graphs

    def timed_compile(self, *a, **k):
        start = time.perf_counter()
        runner = original_compile(self, *a, **k)
        sync()
        timings["compile_capture_s"] += time.perf_counter() - start
        return runner

    def timed(module, name: str, key: str):
        original = getattr(module, name)

        def wrapper(*a, **k):
            start = time.perf_counter()
            out = original(*a, **k)
            sync()
            timings[key] += time.perf_counter() - start
            return out

        setattr(module, name, wrapper)

    import compiled_engine.engine as engine_module
    import compiled_engine.runtime as runtime_module

    timed(runtime_module, "allocate_caches", "memory_plan_s")
    timed(engine_module, "warm_up_sampling", "warm_up_sampling_s")
    Runtime.from_pretrained = classmethod(timed_from_pretrained)
    Runtime.compile_decode = timed_compile
    ModelExecutor.compile_prefill = timed_prefill
    kwargs = {k: args[k] for k in ("device", "dtype", "enforce_eager", "max_num_seqs", "max_model_len",
                                   "max_num_batched_tokens")}
    for knob in ("num_kv_blocks", "max_prefill_capture_tokens", "max_prefill_capture_seqs", "mixed_decode_lanes"):
        if args.get(knob) is not None:
            kwargs[knob] = args[knob]
    start = time.perf_counter()
    llm = llm_module.LLM(args["model"], **kwargs)
    sync()
    timings["llm_init_s"] = time.perf_counter() - start
    from bench.common import decode_fn_info  # after the timed imports

    timings.update(decode_fn_info(llm.runtime.decode_fn))
    prompt = [(7 * i) % min(10000, llm.runtime.model_config.vocab_size - 1) for i in range(args["prompt_len"])]
    params = SamplingParams(temperature=0.0, max_tokens=args["new_tokens"], ignore_eos=True)
    for name in ("first_generate_s", "second_generate_s"):
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        sync()
        timings[name] = time.perf_counter() - start
        if name == "first_generate_s":
            timings["to_first_token_s"] = time.perf_counter() - _PROCESS_START
    timings["compiled"] = not args["enforce_eager"]
    if device.type == "cuda":
        timings["peak_memory_GiB"] = torch.cuda.max_memory_allocated(device) / 2**30
    return timings


def _listen_to_autotuning(timings: dict) -> None:
    """Sum the Triton autotuner's benchmark time into ``timings`` (``knobs.autotuning.listener``; a Triton without
    it leaves the keys out)."""
    try:
        from triton import knobs
    except ImportError:
        return
    if not hasattr(knobs.autotuning, "listener"):
        return
    timings.update(autotune_s=0.0, autotune_runs=0, autotune_by_kernel={})

    def listener(fn=None, duration=None, cache_hit=False, **_):
        if cache_hit or duration is None:
            return
        timings["autotune_s"] += duration
        timings["autotune_runs"] += 1
        name = getattr(fn, "__name__", str(fn))
        timings["autotune_by_kernel"][name] = timings["autotune_by_kernel"].get(name, 0.0) + duration

    knobs.autotuning.listener = listener


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bench.startup CHILD-ARGS-JSON (run by the startup scenario)")
    print(MARKER + json.dumps(child(json.loads(sys.argv[1]))), flush=True)

"""prefix: many requests sharing a long prefix (default 256 requests, a 2048-token shared prefix, 64-token unique
suffixes, 64 greedy new tokens each), with prefix caching off and on.

What is timed: one ``LLM.generate`` of all requests, per mode, after a warm-up whose prompts use a DIFFERENT prefix
(kernels warm, prefix cache cold: the first request of the timed run computes the shared prefix). The warm-up has
as many requests as the timed run (``warmup_requests``, default ``num_requests``) and 2 new tokens each, so its
prefill steps have the timed run's shapes: a Triton kernel specialised on a step's sequence count (e.g. a power of
two of it) compiles during the warm-up, not inside a timed TTFT. ``-p prefix.warmup_requests=2`` is the old, lighter
warm-up. Reported: wall time, output tok/s, total (prompt + output) tok/s, TTFT/TPOT percentiles, cached prompt
tokens when the engine reports them (``RequestOutput.num_cached_tokens``), the on/off speed-up, and where the time
went: engine steps by kind, prompt tokens computed by prefill steps, host seconds in prefill and in decode steps,
and the slowest steps (kind, sequences, tokens, seconds), for the warm-up and the timed run.
"on" needs ``LLM(..., enable_prefix_caching=True)``; an engine that rejects the keyword (TypeError) is reported as
"prefix caching not available", and "off" then runs the engine as it is (it has no prefix cache).
Bound: the decode-only memory bound of the workload (bench/bounds.py); with the shared prefix computed once, the
prefill an ideal engine must do is ``unique_prompt_tokens`` (reported beside it).
"""

from __future__ import annotations

import random
import time

from bench.bounds import workload_decode_bound
from bench.common import Context, StepLog, greedy, random_prompt, request_timings

UNAVAILABLE = "prefix caching not available"
OWN_ENGINES = True  # builds its own LLMs (caching off / on): the driver runs it after the shared-engine scenarios


def requirements(num_requests: int = 256, prefix_len: int = 2048, suffix_len: int = 64, new_tokens: int = 64, **_):
    return min(num_requests, 256), prefix_len + suffix_len + new_tokens + 1


def workload(num_requests, prefix_len, suffix_len, seed, vocab_size) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = random_prompt(rng, prefix_len, vocab_size)
    return [prefix + random_prompt(rng, suffix_len, vocab_size) for _ in range(num_requests)]


def run(
    ctx: Context,
    num_requests: int = 256,
    prefix_len: int = 2048,
    suffix_len: int = 64,
    new_tokens: int = 64,
    seed: int = 0,
    warmup_requests: int | None = None,
) -> dict:
    ctx.require(*requirements(num_requests, prefix_len, suffix_len, new_tokens))
    vocab = ctx.model_config.vocab_size
    prompts = workload(num_requests, prefix_len, suffix_len, seed, vocab)
    warmup = workload(num_requests if warmup_requests is None else warmup_requests, prefix_len, suffix_len, seed + 1,
                      vocab)
    modes: dict[str, dict] = {}
    for mode, enabled in (("off", False), ("on", True)):
        current = ctx.current_llm()
        try:
            if current is not None and getattr(current.runtime.config, "enable_prefix_caching", False) == enabled:
                llm = current  # the shared engine already is this mode
            else:
                llm = ctx.llm(enable_prefix_caching=enabled)
        except TypeError as e:
            if "enable_prefix_caching" not in str(e):
                raise
            if enabled:
                modes[mode] = {"available": False, "note": f"{UNAVAILABLE}: LLM rejects enable_prefix_caching ({e})"}
                continue
            llm = ctx.llm()  # an engine without the knob has no prefix cache: this is "off"
        warmup_steps = None
        if warmup:
            with StepLog(llm) as log:
                llm.generate(warmup, greedy(2), use_tqdm=False)
            warmup_steps = log.summary()
        with StepLog(llm) as log:
            timed = _timed(ctx, llm, prompts, new_tokens)
        modes[mode] = {"available": True, **timed, "steps": log.summary(), "warmup_steps": warmup_steps,
                       "engine": ctx.engine_summary(),
                       "enable_prefix_caching": getattr(llm.runtime.config, "enable_prefix_caching", None)}

    mb = ctx.model_bytes()
    bound = workload_decode_bound(mb, ctx.bandwidth()["bytes_per_s"], [len(p) for p in prompts],
                                  [new_tokens] * num_requests, ctx.engine_limits()[0])
    bound["unique_prompt_tokens"] = prefix_len + num_requests * suffix_len
    bound["prompt_tokens"] = sum(len(p) for p in prompts)
    result = ctx.metadata("prefix")
    result.update(
        {
            "workload": {"num_requests": num_requests, "prefix_len": prefix_len, "suffix_len": suffix_len,
                         "new_tokens": new_tokens, "seed": seed, "greedy": True, "ignore_eos": True},
            "off": modes["off"],
            "on": modes["on"],
            "prefix_caching_available": modes["on"]["available"],
            "speedup_on_vs_off": (
                modes["on"]["output_tok_s"] / modes["off"]["output_tok_s"] if modes["on"]["available"] else None
            ),
            "bound": bound,
            "fraction_of_bound": {
                m: modes[m]["output_tok_s"] / bound["output_tok_s"] for m in modes if modes[m]["available"]
            },
        }
    )
    ctx.write("prefix", result)
    return result


def _timed(ctx: Context, llm, prompts: list[list[int]], new_tokens: int) -> dict:
    ctx.sync()
    start = time.perf_counter()
    outputs = llm.generate(prompts, greedy(new_tokens), use_tqdm=False)
    ctx.sync()
    wall = time.perf_counter() - start
    generated = sum(len(o.token_ids) for o in outputs)
    prompt_tokens = sum(len(p) for p in prompts)
    return {
        "wall_s": wall,
        "output_tokens": generated,
        "output_tok_s": generated / wall,
        "total_tok_s": (generated + prompt_tokens) / wall,
        "cached_prompt_tokens": sum(getattr(o, "num_cached_tokens", 0) or 0 for o in outputs),
        "hit_rate": sum(1 for o in outputs if getattr(o, "num_cached_tokens", 0)) / len(outputs),
        "snapshot_bytes": _snapshot_bytes(llm),
        **request_timings(outputs),
    }


def _snapshot_bytes(llm) -> int | None:
    """Memory of the prefix cache's snapshot pool (None with caching off)."""
    cache = getattr(llm.runtime, "prefix_cache", None)
    return None if cache is None else cache.snapshot_bytes

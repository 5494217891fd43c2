"""sweep: decode tok/s against batch size (1, 8, 32, 64, 128, 256) at a fixed context, beside the bound.

For each batch B: B requests with ``prompt_len``-token random prompts go into the engine; it is stepped until every
request has its first token (all prefill done), then ``warmup_steps`` decode steps run untimed, then ``steps``
decode steps are timed (a synchronised timestamp around them; every step should give each request a token, else
``missing_tokens`` counts the shortfall). Requests are FINAL_ONLY, as in LLM.generate. Decode tok/s = B x steps /
time. The engine step includes scheduling, the runtime decode, sampling and the device->host copy of the tokens.
Bound at batch B (bench/bounds.py): bytes/step = weights + B x (2 x state + KV bytes/token x context), context =
the mean context during the timed steps; tok/s <= B x copy bandwidth / bytes/step.
With ``--vs-hf``: HF generate of 1 + ``hf_steps`` tokens on the same prompts, decode tok/s from per-step timestamps.
"""

from __future__ import annotations

import random
import time

from bench.bounds import decode_bound
from bench.common import Context, greedy, random_prompt, ratio, save_plot

DEFAULT_BATCHES = (1, 8, 32, 64, 128, 256)


def requirements(batches=DEFAULT_BATCHES, prompt_len: int = 512, steps: int = 64, warmup_steps: int = 4, **_):
    return max(batches), prompt_len + warmup_steps + steps + 2


def run(
    ctx: Context,
    batches=DEFAULT_BATCHES,
    prompt_len: int = 512,
    steps: int = 64,
    warmup_steps: int = 4,
    seed: int = 0,
) -> dict:
    batches = _batches(batches)
    ctx.require(*requirements(batches, prompt_len, steps, warmup_steps))
    llm = ctx.llm()
    mb = ctx.model_bytes()
    bw = ctx.bandwidth()["bytes_per_s"]
    context = prompt_len + 1 + warmup_steps + steps / 2  # mean context of the timed steps
    rows = []
    for batch in batches:
        prompts = [random_prompt(random.Random(seed * 7919 + i), prompt_len, ctx.model_config.vocab_size)
                   for i in range(batch)]
        row = _measure(ctx, llm.engine, prompts, steps, warmup_steps)
        bound = decode_bound(mb, bw, batch, context)
        row["bound_tok_s"] = bound["tok_s"]
        row["bound_ms_per_step"] = bound["ms_per_step"]
        row["fraction_of_bound"] = row["decode_tok_s"] / bound["tok_s"]
        row["achieved_bandwidth_GBps"] = bound["bytes_per_step"] / (row["ms_per_step"] / 1e3) / 1e9
        rows.append(row)
    result = ctx.metadata("sweep")
    result.update(
        {
            "workload": {"batches": batches, "prompt_len": prompt_len, "timed_decode_steps": steps,
                         "warmup_steps": warmup_steps, "greedy": True, "ignore_eos": True, "seed": seed},
            "rows": rows,
            "bound": {
                "formula": "B * copy_bandwidth / (weight_bytes + B * (2 * state_bytes + kv_bytes_per_token * context))",
                "context": context,
                "weight_bytes": mb.weight_bytes,
                "state_bytes": mb.state_bytes,
                "kv_bytes_per_token": mb.kv_bytes_per_token,
                "tok_s": [r["bound_tok_s"] for r in rows],
            },
            "fraction_of_bound": [r["fraction_of_bound"] for r in rows],
        }
    )
    result["plot"] = save_plot(ctx, "sweep", lambda plt: _draw(plt, result))
    ctx.write("sweep", result)
    return result


def run_hf(ctx: Context, result: dict, batches=DEFAULT_BATCHES, prompt_len: int = 512, seed: int = 0,
           hf_steps: int = 8, **_) -> dict:
    from bench.hf import hf_decode_rate, hf_generate, hf_kernels

    model = ctx.hf_model()
    vocab = ctx.model_config.vocab_size
    for row in result["rows"]:
        batch = row["batch"]
        prompts = [random_prompt(random.Random(seed * 7919 + i), prompt_len, vocab) for i in range(batch)]
        if ctx.device.type == "cuda":  # this batch's first-call JIT / autotuning stays out of the numbers
            hf_generate(model, prompts, 2)
        hf = hf_decode_rate(model, prompts, hf_steps + 1)
        row["hf_decode_tok_s"] = hf["decode_tok_s"]
        row["hf_ms_per_step"] = hf["ms_per_step"]
        row["ratio_vs_hf"] = ratio(row["decode_tok_s"], hf["decode_tok_s"])
    result["hf"] = {"decode_steps": hf_steps, "kernels": hf_kernels(),
                    "method": "one generate of 1 + hf_steps tokens on the same prompts (no padding); decode time "
                              "from synchronised per-step timestamps (bench/hf.py hf_decode_rate)"}
    result["ratio_vs_hf"] = [r["ratio_vs_hf"] for r in result["rows"]]
    result["plot"] = save_plot(ctx, "sweep", lambda plt: _draw(plt, result))
    ctx.write("sweep", result)
    return result


def _batches(batches) -> list[int]:
    if isinstance(batches, int):
        batches = [batches]
    batches = sorted({int(b) for b in batches})
    if not batches or batches[0] < 1:
        raise ValueError(f"batch sizes must be >= 1, got {batches}")
    return batches


def _measure(ctx: Context, engine, prompts: list[list[int]], steps: int, warmup_steps: int) -> dict:
    batch = len(prompts)
    new_tokens = 1 + warmup_steps + steps
    # FINAL_ONLY, as LLM.generate and vLLM's offline benchmarks: no per-step outputs to build. Progress is read off
    # the requests themselves.
    ids = [engine.add_request(None, p, greedy(new_tokens, final_only=True)) for p in prompts]
    requests = [engine.requests[i] for i in ids]
    ctx.sync()
    prefill_start = time.perf_counter()
    while any(r.seq.num_generated_tokens == 0 for r in requests):  # prefill (chunked) until every request has a token
        engine.step()
    prefill_s = time.perf_counter() - prefill_start
    for _ in range(warmup_steps):
        engine.step()
    ctx.sync()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    ctx.sync()
    seconds = time.perf_counter() - start
    for _ in range(2):  # with overlap_decode the last step is still in flight: its tokens land one step() later
        if any(i in engine.requests for i in ids):
            engine.step()
    # Every timed step should have given every request one token (a preemption would cost some).
    missing = sum(new_tokens - r.seq.num_generated_tokens for r in requests)
    leftover = [i for i in ids if i in engine.requests]
    for request_id in leftover:  # only after a preemption; frees the cache for the next batch size
        engine.abort_request(request_id)
    return {
        "batch": batch,
        "decode_tok_s": batch * steps / seconds,
        "ms_per_step": seconds / steps * 1e3,
        "prefill_s": prefill_s,
        "missing_tokens": missing,
        "aborted_requests": len(leftover),
    }


def _draw(plt, result: dict) -> None:
    rows = result["rows"]
    batches = [r["batch"] for r in rows]
    plt.plot(batches, [r["decode_tok_s"] for r in rows], "o-", label="ours")
    plt.plot(batches, [r["bound_tok_s"] for r in rows], "k--", label="bound (copy bandwidth)")
    if rows and "hf_decode_tok_s" in rows[0]:
        plt.plot(batches, [r["hf_decode_tok_s"] for r in rows], "s-", label="HF transformers")
    plt.xscale("log", base=2)
    plt.yscale("log")
    plt.xlabel("batch size")
    plt.ylabel("decode tok/s")
    plt.title(f"decode throughput at context {result['bound']['context']:.0f}")
    plt.legend()

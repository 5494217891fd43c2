"""sweep: decode tok/s against batch size (1, 2, 4, ... 256) at contexts of 512 and 8,192 tokens, beside the bound.

For each context (``prompt_len``: one length or a list) and batch B: B requests with ``prompt_len``-token random
prompts go into the engine; it is stepped, prefill first, until every request has its first token, then
``warmup_steps`` decode steps run untimed, then ``steps`` decode steps are timed (a synchronised timestamp around
them; every step should give each request a token, else ``missing_tokens`` counts the shortfall). Requests are
FINAL_ONLY, as in LLM.generate. Decode tok/s = B x steps / time. The engine step includes scheduling, the runtime
decode, sampling and the device->host copy of the tokens.
Bound of each cell (bench/bounds.py ``decode_bound``, the one formula of the performance model): bytes/step =
weights + B x (2 x state + KV bytes/token x context) (+ the routed experts B tokens touch, for a sparse-MoE model):
every weight read once, every sequence's recurrent and conv
state read and written, every cached K/V read at the cell's context = the mean context during the timed steps
(``prompt_len + 1 + warmup_steps + steps / 2``); tok/s <= B x copy bandwidth / bytes/step.
A cell the engine cannot run whole (B over ``max_num_seqs``, a sequence over ``max_model_len``, or B sequences'
KV blocks over the cache) is skipped, with the reason under ``skipped``.
With ``--vs-hf``: HF generate of 1 + ``hf_steps`` tokens on the same prompts, decode tok/s from per-step timestamps.
"""

from __future__ import annotations

import math
import random
import time

from bench.bounds import decode_bound
from bench.common import Context, greedy, random_prompt, ratio, save_plot

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_PROMPT_LENS = (512, 8192)


def requirements(batches=DEFAULT_BATCHES, prompt_len=DEFAULT_PROMPT_LENS, steps: int = 64, warmup_steps: int = 4,
                 **_):
    return max(_batches(batches)), max(_prompt_lens(prompt_len)) + warmup_steps + steps + 2


def run(
    ctx: Context,
    batches=DEFAULT_BATCHES,
    prompt_len=DEFAULT_PROMPT_LENS,
    steps: int = 64,
    warmup_steps: int = 4,
    seed: int = 0,
) -> dict:
    batches, prompt_lens = _batches(batches), _prompt_lens(prompt_len)
    ctx.require(*requirements(batches, prompt_lens, steps, warmup_steps))
    llm = ctx.llm()
    mb = ctx.model_bytes()
    bw = ctx.bandwidth()["bytes_per_s"]
    engine = ctx.engine_summary() or {}
    rows, skipped = [], []
    for length in prompt_lens:
        context = length + 1 + warmup_steps + steps / 2  # mean context of the timed steps
        for batch in batches:
            reason = _cannot_run(engine, batch, length + warmup_steps + steps + 2)
            if reason:
                skipped.append({"prompt_len": length, "batch": batch, "reason": reason})
                continue
            prompts = [random_prompt(random.Random(seed * 7919 + i), length, ctx.model_config.vocab_size)
                       for i in range(batch)]
            row = {"prompt_len": length, "context": context, **_measure(ctx, llm.engine, prompts, steps, warmup_steps)}
            bound = decode_bound(mb, bw, batch, context)
            row["bound_tok_s"] = bound["tok_s"]
            row["bound_ms_per_step"] = bound["ms_per_step"]
            row["fraction_of_bound"] = row["decode_tok_s"] / bound["tok_s"]
            row["achieved_bandwidth_GBps"] = bound["bytes_per_step"] / (row["ms_per_step"] / 1e3) / 1e9
            rows.append(row)
    result = ctx.metadata("sweep")
    result.update(
        {
            "workload": {"batches": batches, "prompt_len": prompt_lens, "timed_decode_steps": steps,
                         "warmup_steps": warmup_steps, "greedy": True, "ignore_eos": True, "seed": seed},
            "rows": rows,
            "skipped": skipped,
            "bound": {
                "formula": "B * copy_bandwidth / (weight_bytes_at(B) + B * (2 * state_bytes + kv_bytes_per_token * context))",
                "contexts": sorted({r["context"] for r in rows}),
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


def run_hf(ctx: Context, result: dict, seed: int = 0, hf_steps: int = 8, **_) -> dict:
    from bench.hf import hf_decode_rate, hf_generate, hf_kernels

    model = ctx.hf_model()
    vocab = ctx.model_config.vocab_size
    for row in result["rows"]:  # the same cells, the same prompts
        batch = row["batch"]
        prompts = [random_prompt(random.Random(seed * 7919 + i), row["prompt_len"], vocab) for i in range(batch)]
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


def _prompt_lens(prompt_len) -> list[int]:
    if isinstance(prompt_len, int):
        prompt_len = [prompt_len]
    lengths = sorted({int(n) for n in prompt_len})
    if not lengths or lengths[0] < 1:
        raise ValueError(f"prompt lengths must be >= 1, got {lengths}")
    return lengths


def _cannot_run(engine: dict, batch: int, seq_len: int) -> str | None:
    """Why the engine cannot hold ``batch`` sequences of ``seq_len`` tokens at once (None: it can)."""
    max_num_seqs, max_model_len = engine.get("max_num_seqs"), engine.get("max_model_len")
    block_size, blocks = engine.get("block_size"), engine.get("num_kv_blocks")
    if max_num_seqs and batch > max_num_seqs:
        return f"batch {batch} > max_num_seqs={max_num_seqs}"
    if max_model_len and seq_len > max_model_len:
        return f"{seq_len} tokens per sequence > max_model_len={max_model_len}"
    if block_size and blocks and batch * math.ceil(seq_len / block_size) > blocks - 1:
        return (f"{batch} sequences of {seq_len} tokens need {batch * math.ceil(seq_len / block_size)} KV blocks; "
                f"the cache has {blocks - 1}")
    return None


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
    # Prefill first while the prompts are computed: with mixed steps the first requests would decode (and, past
    # new_tokens prompt steps, finish) while the later prompts are still computed, and the timed steps would run
    # fewer rows than the cell's batch.
    mixed, engine.scheduler.mixed_steps = engine.scheduler.mixed_steps, False
    try:
        while any(r.seq.num_generated_tokens == 0 for r in requests):  # until every request has its first token
            engine.step()
    finally:
        engine.scheduler.mixed_steps = mixed
    prefill_s = time.perf_counter() - prefill_start
    for _ in range(warmup_steps):
        engine.step()
    ctx.sync()
    before = [r.seq.num_generated_tokens for r in requests]
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    ctx.sync()
    seconds = time.perf_counter() - start
    # Every timed step should have given every request one token (a preemption, or a request that finished early,
    # would cost some). With overlap_decode a step's tokens are counted one step() later, at both ends alike.
    missing = sum(max(0, steps - (r.seq.num_generated_tokens - b)) for r, b in zip(requests, before))
    for _ in range(2):  # with overlap_decode the last step is still in flight: its tokens land one step() later
        if any(i in engine.requests for i in ids):
            engine.step()
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
    for length in sorted({r["prompt_len"] for r in rows}):
        cell = [r for r in rows if r["prompt_len"] == length]
        batches = [r["batch"] for r in cell]
        line = plt.plot(batches, [r["decode_tok_s"] for r in cell], "o-", label=f"ours, context {length}")[0]
        plt.plot(batches, [r["bound_tok_s"] for r in cell], "--", color=line.get_color(),
                 label=f"bound, context {length}")
        if cell and "hf_decode_tok_s" in cell[0]:
            plt.plot(batches, [r["hf_decode_tok_s"] for r in cell], "s:", color=line.get_color(),
                     label=f"HF transformers, context {length}")
    plt.xscale("log", base=2)
    plt.yscale("log")
    plt.xlabel("batch size")
    plt.ylabel("decode tok/s")
    plt.title("decode throughput against batch size (bound: copy bandwidth)")
    plt.legend(fontsize=7)

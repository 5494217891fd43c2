"""throughput: nano-vllm's offline workload -- 256 requests, prompt and output lengths uniform in [100, 1024],
random prompt token ids, seed 0, greedy, ignore_eos.

What is timed: one ``LLM.generate`` of all requests (queued at once), after a small warm-up; synchronised wall time.
Output tok/s = generated tokens / wall time. Per request (engine perf_counter timestamps): TTFT = first token -
arrival (all arrive at the start, so queueing counts), TPOT = (finished - first token) / (output tokens - 1).
Bound (bench/bounds.py ``workload_decode_bound``): the decode-only memory bound of the same requests under an ideal
schedule at ``max_num_seqs`` concurrency; prefill is free there, so the fraction is conservative.
With ``--vs-hf``: the first ``--hf-limit`` requests through HF ``generate`` in pad-left batches (``--hf-batch-size``,
grouped by output length, each batch running its longest output), counting only each request's own output length
as useful tokens. The same subset also runs through our engine (before HF, while ours is built; again after HF only
where ``--hf-max-time`` cut HF short, and never with ``--ours-from``), so two ratios are reported: ours on the full
workload / HF on its subset, and ours / HF on the identical subset.
"""

from __future__ import annotations

import random
import time

import torch

from bench.bounds import workload_decode_bound
from bench.common import Context, StepLog, greedy, random_prompt, ratio, request_timings, save_plot


def workload(num_requests: int = 256, min_len: int = 100, max_len: int = 1024, seed: int = 0, vocab_size: int = 10001):
    """(prompts, output lengths), drawn as nano-vllm's bench.py draws them."""
    rng = random.Random(seed)
    prompts, outputs = [], []
    for _ in range(num_requests):
        prompts.append(random_prompt(rng, rng.randint(min_len, max_len), vocab_size))
    for _ in range(num_requests):
        outputs.append(rng.randint(min_len, max_len))
    return prompts, outputs


def requirements(num_requests: int = 256, max_len: int = 1024, **_) -> tuple[int, int]:
    return min(num_requests, 256), 2 * max_len + 1


def run(
    ctx: Context,
    num_requests: int = 256,
    min_len: int = 100,
    max_len: int = 1024,
    seed: int = 0,
    warmup_requests: int = 4,
    profile_first_step: bool = True,
) -> dict:
    """``profile_first_step``: profile the timed run's first step (bench.common.StepLog); it was ~10 s on the H200
    (bench/NOTES.md) and the profile says where that goes. It adds cProfile's overhead to that one step."""
    ctx.require(*requirements(num_requests, max_len))
    llm = ctx.llm()
    prompts, output_lens = workload(num_requests, min_len, max_len, seed, ctx.model_config.vocab_size)
    _warmup(llm, prompts[:warmup_requests])
    ours = _timed_generate(ctx, llm, prompts, output_lens, profile_first_step)

    mb = ctx.model_bytes()
    bound = workload_decode_bound(mb, ctx.bandwidth()["bytes_per_s"], [len(p) for p in prompts], output_lens,
                                  llm.runtime.config.max_num_seqs)
    result = ctx.metadata("throughput")
    result.update(
        {
            "workload": {"num_requests": num_requests, "len_range": [min_len, max_len], "seed": seed,
                         "prompt_tokens": sum(len(p) for p in prompts), "output_tokens": sum(output_lens),
                         "token_ids": "random in [0, min(10000, vocab-1)]", "greedy": True, "ignore_eos": True},
            "ours": ours,
            "bound": bound,
            "fraction_of_bound": ours["output_tok_s"] / bound["output_tok_s"],
        }
    )
    limit = min(ctx.opts.hf_limit or num_requests, num_requests)
    if ctx.opts.vs_hf and limit < num_requests:
        # Ours on the subset HF will run, timed now: after HF, ours would be built again (on the 35B-A3B shape the
        # two models do not fit the GPU at once, and a build takes minutes).
        same = _timed_generate(ctx, llm, prompts[:limit], output_lens[:limit])
        result["ours_on_first_requests"] = {k: same[k] for k in ("output_tok_s", "wall_s", "output_tokens")}
        result["ours_on_first_requests"]["requests"] = limit
    result["plot"] = save_plot(ctx, "throughput", lambda plt: _draw(plt, ours))
    ctx.write("throughput", result)
    return result


def run_hf(ctx: Context, result: dict, num_requests: int = 256, min_len: int = 100, max_len: int = 1024,
           seed: int = 0, hf_sort: bool = True, **_) -> dict:
    from bench.hf import hf_generate, hf_kernels, hf_useful_throughput

    prompts, output_lens = workload(num_requests, min_len, max_len, seed, ctx.model_config.vocab_size)
    limit = min(ctx.opts.hf_limit or num_requests, num_requests)
    sub_prompts, sub_outputs = prompts[:limit], output_lens[:limit]
    model = ctx.hf_model()
    if ctx.device.type == "cuda":  # first-call JIT / autotuning stays out of the numbers
        hf_generate(model, sub_prompts[:2], 4)
    hf = hf_useful_throughput(model, sub_prompts, sub_outputs, ctx.opts.hf_batch_size, ctx.opts.hf_max_time, hf_sort)
    hf["kernels"] = hf_kernels()
    hf["ran"] = (
        f"HF generate, requests 0..{limit - 1} of the {num_requests}-request workload "
        f"({hf['requests_run']} run), pad-left batches of {ctx.opts.hf_batch_size}"
        f"{' grouped by output length' if hf_sort else ''}, each batch max_new_tokens = its longest output, "
        f"greedy, EOS disabled; useful tokens = each request's own output length"
        + ("; TRUNCATED by --hf-max-time" if hf["truncated"] else "")
    )
    result["hf"] = hf
    # Ours on exactly the requests HF ran (its batches may have stopped early under --hf-max-time).
    ran = sorted(i for b in hf["batches"] for i in b["requests"])
    first = result.get("ours_on_first_requests")
    if len(ran) == num_requests:
        same = {k: result["ours"][k] for k in ("output_tok_s", "wall_s", "output_tokens")}
    elif first is not None and ran == list(range(first["requests"])):
        same = {k: first[k] for k in ("output_tok_s", "wall_s", "output_tokens")}
    elif result.get("ours_from"):  # ours is an earlier run's (--ours-from): no engine here to time HF's subset
        same = None
    else:
        llm = ctx.llm()
        same = _timed_generate(ctx, llm, [sub_prompts[i] for i in ran], [sub_outputs[i] for i in ran])
        same = {k: same[k] for k in ("output_tok_s", "wall_s", "output_tokens")}
    if same is not None:
        same["requests"] = len(ran)
    result["ours_on_hf_subset"] = same
    result["ratio_vs_hf"] = {
        "full_workload_vs_hf_subset": ratio(result["ours"]["output_tok_s"], hf["useful_output_tok_s"]),
        "same_requests": ratio(same["output_tok_s"], hf["useful_output_tok_s"]) if same else None,
        "note": "ours: output tok/s; HF: useful output tok/s on the requests it ran",
    }
    ctx.write("throughput", result)
    return result


def _warmup(llm, prompts: list[list[int]]) -> None:
    if prompts:
        llm.generate(prompts, greedy(4), use_tqdm=False)


def _timed_generate(ctx: Context, llm, prompts: list[list[int]], output_lens: list[int],
                    profile_first_step: bool = False, sampling: dict | None = None,
                    keep_token_ids: bool = False) -> dict:
    """One timed ``LLM.generate`` of the requests, greedy unless ``sampling`` gives SamplingParams fields (request
    ``i`` then gets ``seed=i``: the same tokens on every run). ``keep_token_ids``: the result carries every request's
    tokens under ``token_ids`` (for a comparison; not for the JSON)."""
    from compiled_engine.sampling_params import SamplingParams

    extra = sampling or {"temperature": 0.0}
    params = [SamplingParams(max_tokens=n, ignore_eos=True, **({"seed": i} if sampling else {}), **extra)
              for i, n in enumerate(output_lens)]
    preemptions_before = llm.engine.scheduler.num_preemptions
    ctx.sync()
    allocator_before = _allocator_counters(ctx.device)
    start = time.perf_counter()
    with StepLog(llm, profile_first_step=profile_first_step) as log:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    ctx.sync()
    wall = time.perf_counter() - start
    allocator = {k: v - allocator_before[k] for k, v in _allocator_counters(ctx.device).items()}
    generated = sum(len(o.token_ids) for o in outputs)
    if generated != sum(output_lens):
        raise RuntimeError(f"generated {generated} tokens, expected {sum(output_lens)} (ignore_eos not honoured?)")
    prompt_tokens = sum(len(p) for p in prompts)
    timed = {
        "requests": len(prompts),
        "wall_s": wall,
        "output_tokens": generated,
        "output_tok_s": generated / wall,
        "total_tok_s": (generated + prompt_tokens) / wall,
        "requests_per_s": len(prompts) / wall,
        "preemptions": llm.engine.scheduler.num_preemptions - preemptions_before,
        "allocator": allocator,
        "steps": log.summary(),  # the first and slowest steps: where a cold first step shows
        **request_timings(outputs),
        "ttft_s_per_request": [o.first_token_time - o.arrival_time for o in outputs],
        "tpot_s_per_request": [(o.finished_time - o.first_token_time) / (len(o.token_ids) - 1)
                               for o in outputs if len(o.token_ids) > 1],
    }
    if keep_token_ids:
        timed["token_ids"] = [list(o.token_ids) for o in outputs]
    return timed


def _allocator_counters(device: torch.device) -> dict:
    """CUDA caching-allocator counters: during the timed run, ``num_alloc_retries`` (a cudaMalloc failed and the
    cache was flushed, synchronising the device) and ``num_device_alloc`` (cudaMalloc calls) should stay near zero.
    Recorded to explain the ~10 s first prefill step of the H200 runs (bench/NOTES.md)."""
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    return {k: stats.get(k, 0) for k in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")}


def _draw(plt, ours: dict) -> None:
    ttft = sorted(ours["ttft_s_per_request"])
    tpot = sorted(ours["tpot_s_per_request"])
    for index, (values, label) in enumerate(((ttft, "TTFT (s since the workload started)"), (tpot, "TPOT (ms)"))):
        plt.subplot(1, 2, index + 1)
        scale = 1e3 if index else 1.0
        plt.plot([v * scale for v in values], [(i + 1) / len(values) for i in range(len(values))])
        plt.ticklabel_format(axis="x", useOffset=False)
        plt.xlabel(label)
        plt.ylabel("fraction of requests")
        plt.grid(alpha=0.3)
    plt.suptitle(f"throughput: {ours['requests']} requests, {ours['output_tok_s']:.0f} output tok/s")

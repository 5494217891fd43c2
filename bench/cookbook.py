"""cookbook: SGLang's published Qwen3.5-0.8B (and Qwen3.5-35B-A3B) bf16 H200 serving cells, reproduced on our engine.

The cells (SGLang 0.5.16, the Qwen3.5 cookbook's benchmarks, ``qwen3.5-benchmarks.jsx``, PR 32323): ``bench_serving``
with ``--dataset-name random --random-input-len 8192 --random-output-len 1024 --random-range-ratio 1.0`` (every
prompt exactly 8,192 tokens, every output exactly 1,024, ignore_eos), ``--max-concurrency`` 1, 16 (low-latency
recipe) and 1024 (high-throughput recipe), ``--warmup-requests 64 --flush-cache``; P50 latencies. Their tok/s
counts input plus output: output tok/s x (8192 + 1024) / 1024.

Workload, per concurrency ``c``: ``max(c, min_requests)`` requests (``num_requests`` overrides), each a random
prompt of ``input_len`` token ids (seeded; drawn as bench.common.random_prompt draws them) asking for exactly
``output_len`` greedy tokens with ignore_eos. How they arrive (a closed loop, as ``bench_serving --max-concurrency``
with ``--request-rate inf``): the first ``min(c, requests)`` are added at t=0, then one more as soon as one
finishes (in the same host turn, before the next ``step()``), until the cell's requests are all done. Before each
cell, ``warmup_requests`` requests of ``input_len`` prompts (another seed, so a prefix cache cannot reuse them) and
``warmup_output_len`` tokens run through the same loop at ``min(c, warmup_requests)``, untimed.

The engine is the shared ``LLM``'s (``LLM(...).engine``, with ``overlap_decode`` as LLM has it), driven through
``LLMEngine.add_request`` / ``step`` with CUMULATIVE outputs: every step reports every request that got a token, as
a streaming server would. Definitions (SGLang's):
  * TTFT = first token - arrival (engine timestamps: ``RequestOutput.arrival_time`` is ``add_request``'s time, so
    queueing counts);
  * TPOT, per request = (finished - first token) / (output tokens - 1);
  * ITL = the gaps between a request's successive token arrivals at the client (host time when the ``step()``
    that returned the token returned), pooled over all requests;
  * E2E = finished - arrival;
  * tok/s over the cell's wall time (the first ``add_request`` to the last output): output tok/s = generated tokens /
    wall, total tok/s = (prompt + generated tokens) / wall (SGLang's figure).
p50 and p99 of each; SGLang's published values sit beside ours (compared only where the shape and the GPU, an H200,
are theirs).

Memory plan: the engine is built for ``max(concurrency)`` sequences of ``input_len + output_len`` tokens (unless
``--max-num-seqs`` / ``--max-model-len`` say otherwise). The result reports its KV capacity in tokens and how many
full-length requests it holds at once; a cell whose ``c`` exceeds that still keeps ``c`` requests in flight at the
client (as SGLang's client does against its server's limit): the excess waits in the engine's queue, and a KV
shortfall shows as preemptions (recompute). A cell whose requests do not fit ``max_model_len`` is skipped, with the
reason.

Bound (bench/bounds.py, one formula): a decode step of ``b = min(c, what the engine holds)`` sequences at the mean
decode context ``input_len + output_len / 2`` moves weights + b x (2 x state + KV bytes/token x context): its time
is the TPOT bound; the output tok/s bound is ``workload_decode_bound`` of the cell's requests at ``b`` in flight
(decode only: prefill is free there, so the fraction is conservative).
"""

from __future__ import annotations

import math
import sys
import time
import traceback

import torch

from bench.bounds import decode_bound, workload_decode_bound
from bench.common import PROMPT_TOKEN_CEILING, Context, device_info, distribution, ratio, save_plot

DEFAULT_CONCURRENCY = (1, 16, 64, 256, 1024)

# SGLang's published cells (SGLang 0.5.16; sgl-cookbook qwen3.5-benchmarks.jsx, PR 32323): H200, Qwen3.5-0.8B bf16,
# tp 1. ``total_tok_s`` is their tokens_per_sec_per_gpu = output tok/s x (isl + osl) / osl; latencies are P50.
SGLANG = {
    "source": "SGLang 0.5.16, Qwen3.5 cookbook benchmarks (sgl-cookbook qwen3.5-benchmarks.jsx, PR 32323): H200, "
              "Qwen3.5-0.8B bf16, tp 1, bench_serving random 8192 in / 1024 out, --random-range-ratio 1.0, "
              "--warmup-requests 64, --flush-cache; P50 latencies; tok/s = output tok/s x (8192 + 1024) / 1024",
    "input_len": 8192,
    "output_len": 1024,
    "cells": {
        1: {"recipe": "low-latency", "ttft_ms": 53, "tpot_ms": 1.07, "total_tok_s": 8003},
        16: {"recipe": "low-latency", "ttft_ms": 454, "tpot_ms": 1.47, "total_tok_s": 74681},
        1024: {"recipe": "high-throughput", "ttft_ms": 31920, "tpot_ms": 39.01, "total_tok_s": 103327},
        4096: {"recipe": "high-throughput", "ttft_ms": 268655, "tpot_ms": 44.92, "total_tok_s": 103300},
    },
}


# Their Qwen3.5-35B-A3B bf16 cells on one H200 (same source and workload; the TPOTs alone, as issue 24 quotes them).
SGLANG_35B_A3B = {
    "source": "SGLang 0.5.16, Qwen3.5 cookbook benchmarks: H200, Qwen3.5-35B-A3B bf16, tp 1, bench_serving random "
              "8192 in / 1024 out; P50 TPOT",
    "input_len": 8192,
    "output_len": 1024,
    "cells": {1: {"recipe": "low-latency", "tpot_ms": 2.16}, 16: {"recipe": "low-latency", "tpot_ms": 7.29}},
}
SGLANG_BY_MODEL = {"qwen3.5-35b-a3b": SGLANG_35B_A3B}  # other models are set beside the 0.8B cells


def sglang_reference(model_name: str) -> dict:
    return SGLANG_BY_MODEL.get(model_name, SGLANG)


def requirements(concurrency=DEFAULT_CONCURRENCY, input_len: int = 8192, output_len: int = 1024, **_):
    return max(_concurrency(concurrency)), input_len + output_len


def run(
    ctx: Context,
    concurrency=DEFAULT_CONCURRENCY,
    input_len: int = 8192,
    output_len: int = 1024,
    min_requests: int = 16,
    num_requests=None,
    warmup_requests: int = 64,
    warmup_output_len: int = 16,
    seed: int = 0,
) -> dict:
    """``num_requests``: requests per cell, one int for every cell or one per concurrency (default
    ``max(c, min_requests)``)."""
    levels = _concurrency(concurrency)
    counts = _request_counts(levels, num_requests, min_requests)
    ctx.require(*requirements(levels, input_len, output_len))
    llm = ctx.llm()
    engine = llm.engine
    plan = memory_plan(ctx.engine_summary() or {}, input_len + output_len)
    mb = ctx.model_bytes()
    bw = ctx.bandwidth()["bytes_per_s"]
    vocab = ctx.model_config.vocab_size
    cells: list[dict] = []
    result = ctx.metadata("cookbook")
    reference = sglang_reference(ctx.model.name)
    result.update(
        {
            "workload": {
                "input_len": input_len, "output_len": output_len, "concurrency": levels, "requests": counts,
                "warmup_requests": warmup_requests, "warmup_output_len": warmup_output_len, "seed": seed,
                "token_ids": f"random in [0, min({PROMPT_TOKEN_CEILING}, vocab-1)]", "greedy": True,
                "ignore_eos": True, "output_kind": "CUMULATIVE",
                "arrivals": "closed loop: min(c, requests) added at t=0, then one per completion until the cell's "
                            "requests are done (bench_serving --max-concurrency c --request-rate inf)",
            },
            "memory_plan": plan,
            "cells": cells,
            "bound": {
                "formula": "TPOT >= (weight_bytes_at(b) + b * (2 * state_bytes + kv_bytes_per_token * context)) / "
                           "copy_bandwidth, b = min(c, requests, requests_at_once), context = input + output / 2; "
                           "output tok/s <= workload_decode_bound(cell's requests, b in flight) (decode only)",
                "weight_bytes": mb.weight_bytes, "state_bytes": mb.state_bytes,
                "kv_bytes_per_token": mb.kv_bytes_per_token,
            },
            "fraction_of_bound": {},
            "sglang": {"source": reference["source"], "input_len": reference["input_len"],
                       "output_len": reference["output_len"],
                       "cells": {str(k): v for k, v in reference["cells"].items()},
                       "same_shape": (input_len, output_len) == (reference["input_len"], reference["output_len"]),
                       "same_gpu": same_gpu(ctx)},
        }
    )
    for c, n in zip(levels, counts):
        try:
            cell = _cell(ctx, engine, plan, mb, bw, vocab, c, n, input_len, output_len, warmup_requests,
                         warmup_output_len, seed)
            if "skipped" not in cell:  # SGLang's cell beside ours
                cell["sglang"] = _sglang_cell(reference, c, input_len, output_len, cell, result["sglang"]["same_gpu"])
            cells.append(cell)
        except Exception as e:  # one cell failing (e.g. out of memory) must not lose the others
            print(f"[bench] cookbook c={c} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            cells.append({"concurrency": c, "requests": n, "error": f"{type(e).__name__}: {e}"[:500],
                          "traceback": traceback.format_exc()})
        result["fraction_of_bound"][str(c)] = cells[-1].get("fraction_of_bound")
        ctx.write("cookbook", result)  # after every cell: a run cut short keeps the cells it finished
    result["plot"] = save_plot(ctx, "cookbook", lambda plt: _draw(plt, result))
    ctx.write("cookbook", result)
    return result


def _cell(ctx: Context, engine, plan: dict, mb, bw: float, vocab: int, c: int, n: int, input_len: int,
          output_len: int, warmup_requests: int, warmup_output_len: int, seed: int) -> dict:
    """One concurrency: warm-up, the timed closed loop and its bound (``run`` puts SGLang's cell beside it)."""
    cell = {"concurrency": c, "requests": n, "fits": c <= plan["requests_at_once"]}
    if plan["max_model_len"] and input_len + output_len > plan["max_model_len"]:
        cell["skipped"] = (f"{input_len} + {output_len} tokens do not fit max_model_len={plan['max_model_len']}: "
                           f"raise --max-model-len")
        return cell
    if not cell["fits"]:
        cell["note"] = (f"c={c} exceeds the {plan['requests_at_once']} full-length requests the engine holds at "
                        f"once: the client still keeps {c} in flight; the rest wait in the engine's queue "
                        f"(or are preempted when KV runs short)")
    if warmup_requests:
        warm = random_prompts(seed + 1_000_003, warmup_requests, input_len, vocab)
        serve(ctx, engine, warm, warmup_output_len, min(c, len(warm)), tag=f"cookbook-c{c}-warmup")
    prompts = random_prompts(seed * 7919 + c, n, input_len, vocab)
    cell.update(serve(ctx, engine, prompts, output_len, c, tag=f"cookbook-c{c}"))
    batch = max(1, min(c, n, plan["requests_at_once"]))
    step = decode_bound(mb, bw, batch, input_len + output_len / 2)
    whole = workload_decode_bound(mb, bw, [input_len] * n, [output_len] * n, batch)
    cell["bound"] = {"batch": batch, "context": step["context"], "tpot_ms": step["ms_per_step"],
                     "output_tok_s": whole["output_tok_s"]}
    cell["fraction_of_bound"] = cell["output_tok_s"] / whole["output_tok_s"]
    print(f"[bench] cookbook c={c}: {cell['total_tok_s']:.0f} tok/s in+out, TPOT p50 "
          f"{_fmt(cell['tpot_ms'].get('p50'), '.2f')} ms", file=sys.stderr, flush=True)
    return cell


def _concurrency(concurrency) -> list[int]:
    if isinstance(concurrency, int):
        concurrency = [concurrency]
    levels = sorted({int(c) for c in concurrency})
    if not levels or levels[0] < 1:
        raise ValueError(f"concurrency levels must be >= 1, got {levels}")
    return levels


def _request_counts(levels: list[int], num_requests, min_requests: int) -> list[int]:
    if num_requests is None:
        return [max(c, min_requests) for c in levels]
    if isinstance(num_requests, int):
        return [num_requests] * len(levels)
    if len(num_requests) != len(levels):
        raise ValueError(f"num_requests {num_requests} needs one count per concurrency level {levels}")
    return [int(n) for n in num_requests]


def random_prompts(seed: int, count: int, length: int, vocab_size: int) -> list[list[int]]:
    """``count`` prompts of ``length`` random token ids in [0, min(10000, vocab - 1)] (bench.common.random_prompt's
    range), drawn with torch: a cell of 1,024 prompts of 8,192 tokens takes well under a second."""
    high = min(PROMPT_TOKEN_CEILING, vocab_size - 1)
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, high + 1, (count, length), generator=generator).tolist()


def memory_plan(engine: dict, request_len: int) -> dict:
    """What the engine holds: KV capacity in tokens and how many ``request_len``-token requests fit at once (the
    runtime's "concurrency limit" log line, for this request length)."""
    block_size, blocks = engine.get("block_size"), engine.get("num_kv_blocks")
    max_num_seqs = engine.get("max_num_seqs")
    plan = {"max_num_seqs": max_num_seqs, "max_model_len": engine.get("max_model_len"), "block_size": block_size,
            "num_kv_blocks": blocks, "request_len": request_len}
    if not (block_size and blocks and max_num_seqs):
        return {**plan, "kv_tokens": None, "requests_fit_in_kv": None, "requests_at_once": max_num_seqs or 1}
    usable = blocks - 1  # block 0 is the null block
    fit = usable // math.ceil(request_len / block_size)
    return {**plan, "kv_tokens": usable * block_size, "requests_fit_in_kv": fit,
            "requests_at_once": max(1, min(max_num_seqs, fit))}


def serve(ctx: Context, engine, prompts: list[list[int]], output_len: int | list[int], concurrency: int,
          tag: str) -> dict:
    """The closed loop: ``concurrency`` requests in flight through ``engine.add_request`` / ``step`` until all of
    ``prompts`` are done; every request's tokens are checked to be exactly ``output_len`` (one for every request, or
    each its own)."""
    from compiled_engine.sampling_params import RequestOutputKind, SamplingParams

    if engine.has_unfinished_requests():
        raise RuntimeError("the engine has unfinished requests: a cell needs it to itself")
    lengths = output_len if isinstance(output_len, list) else [output_len] * len(prompts)
    wanted: dict[str, int] = {}  # request id -> its output length
    preemptions = getattr(getattr(engine, "scheduler", None), "num_preemptions", None)
    kinds_before = _step_kinds(engine)
    arrivals: dict[str, list[float]] = {}  # request id -> client time of each of its tokens
    finals: dict[str, object] = {}
    submitted = 0

    def submit() -> None:
        nonlocal submitted
        request_id = f"{tag}-r{submitted}"
        wanted[request_id] = lengths[submitted]
        params = SamplingParams(temperature=0.0, max_tokens=lengths[submitted], ignore_eos=True,
                                output_kind=RequestOutputKind.CUMULATIVE)
        engine.add_request(request_id, prompts[submitted], params)
        arrivals[request_id] = []
        submitted += 1

    in_flight_max = steps = 0
    ctx.sync()
    start = time.perf_counter()
    try:
        while submitted < min(concurrency, len(prompts)):
            submit()
        while len(finals) < len(prompts):
            in_flight_max = max(in_flight_max, submitted - len(finals))
            outputs = engine.step()
            now = time.perf_counter()
            steps += 1
            for out in outputs:
                arrivals[out.request_id].extend([now] * len(out.new_token_ids))
                if out.finished:
                    finals[out.request_id] = out
                    if submitted < len(prompts):
                        submit()
            if not outputs and not engine.has_unfinished_requests() and len(finals) < len(prompts):
                raise RuntimeError(f"{tag}: the engine went idle with {len(prompts) - len(finals)} requests "
                                   f"unreported")
    except BaseException:  # leave the engine empty for the next cell (best effort after a failed step)
        for request_id in arrivals.keys() - finals.keys():
            try:
                engine.abort_request(request_id)
            except Exception:
                pass
        raise
    ctx.sync()
    wall = time.perf_counter() - start

    wrong = {rid: (wanted[rid], len(o.token_ids), len(arrivals[rid]), o.finish_reason) for rid, o in finals.items()
             if not len(o.token_ids) == len(arrivals[rid]) == wanted[rid]}
    if wrong:
        raise RuntimeError(f"{tag}: {len(wrong)} requests did not get exactly the tokens they asked for "
                           f"(asked, final, streamed, reason): {dict(list(wrong.items())[:4])}")
    ttft, tpot, e2e, itl = [], [], [], []
    for rid, out in finals.items():
        ttft.append(out.first_token_time - out.arrival_time)
        e2e.append(out.finished_time - out.arrival_time)
        if wanted[rid] > 1:
            tpot.append((out.finished_time - out.first_token_time) / (wanted[rid] - 1))
        times = arrivals[rid]
        itl += [b - a for a, b in zip(times, times[1:])]
    generated = sum(len(o.token_ids) for o in finals.values())
    prompt_tokens = sum(len(o.prompt_token_ids) for o in finals.values())
    after = getattr(getattr(engine, "scheduler", None), "num_preemptions", None)
    kinds_after = _step_kinds(engine)
    return {
        "wall_s": wall,
        "output_tokens": generated,
        "prompt_tokens": prompt_tokens,
        "output_tok_s": generated / wall,
        "total_tok_s": (generated + prompt_tokens) / wall,
        "requests_per_s": len(prompts) / wall,
        "in_flight_max": in_flight_max,
        "engine_steps": steps,
        "preemptions": None if preemptions is None or after is None else after - preemptions,
        # the scheduler's steps by kind (a mixed step: decode rows and prompt chunks in one step)
        "step_kinds": None if kinds_before is None else {k: kinds_after[k] - v for k, v in kinds_before.items()},
        "ttft_ms": distribution(ttft, 1e3),
        "tpot_ms": distribution(tpot, 1e3),
        "itl_ms": distribution(itl, 1e3),
        "e2e_ms": distribution(e2e, 1e3),
        "ttft_s_per_request": ttft,
        "tpot_s_per_request": tpot,
    }


def _step_kinds(engine) -> dict | None:
    scheduler = getattr(engine, "scheduler", None)
    if scheduler is None or not hasattr(scheduler, "num_mixed_steps"):
        return None
    return {"decode": scheduler.num_decode_steps, "mixed": scheduler.num_mixed_steps,
            "prefill_only": scheduler.num_prefill_steps - scheduler.num_mixed_steps}


def same_gpu(ctx: Context) -> bool:
    """Whether this run's GPU is the one SGLang's cells were measured on (an H200): the ratios need it."""
    return "H200" in device_info(ctx.device)["name"]


def _sglang_cell(reference: dict, c: int, input_len: int, output_len: int, cell: dict, gpu: bool) -> dict | None:
    """SGLang's published numbers for this concurrency, and ours / theirs (>1: ours larger -- better for tok/s,
    worse for latencies). None where SGLang published no cell; the ratios only where the shape and the GPU (``gpu``)
    are theirs (and only of the numbers they published)."""
    theirs = reference["cells"].get(c)
    if theirs is None:
        return None
    same = (input_len, output_len) == (reference["input_len"], reference["output_len"])
    out = {**theirs, "same_shape": same, "same_gpu": gpu}
    if same and gpu:
        ours = {"ttft_ms_p50": cell["ttft_ms"].get("p50"), "tpot_ms_p50": cell["tpot_ms"].get("p50"),
                "total_tok_s": cell["total_tok_s"]}
        out["ours_over_sglang"] = {key: ratio(value, theirs[key.removesuffix("_p50")])
                                   for key, value in ours.items() if key.removesuffix("_p50") in theirs}
    return out


def _fmt(value, spec: str) -> str:
    return "-" if value is None else f"{value:{spec}}"


def summary_lines(head: str, r: dict) -> list[str]:
    """One line for the engine's memory plan, one per cell with SGLang's published number in brackets."""
    w, plan = r["workload"], r["memory_plan"]
    same, gpu = r["sglang"]["same_shape"], r["sglang"].get("same_gpu", True)  # results before the key: H200 runs
    lines = [f"{head} {w['input_len']} in / {w['output_len']} out, closed loop; engine: {plan['max_num_seqs']} "
             f"state slots, KV {_fmt(plan['kv_tokens'], ',')} tokens = {_fmt(plan['requests_fit_in_kv'], ',')} "
             f"requests of {plan['request_len']:,} at once | [bracketed: SGLang 0.5.16, H200, P50"
             f"{'' if same else ', measured at 8192 in / 1024 out: NOT this shape'}"
             f"{'' if gpu else ', NOT this GPU'}]"]
    for cell in r["cells"]:
        c = cell["concurrency"]
        if "skipped" in cell or "error" in cell:
            lines.append(f"{'':<11} c={c}: " + (f"skipped: {cell['skipped']}" if "skipped" in cell
                                                 else f"ERROR: {cell['error'][:200]}"))
            continue
        theirs = cell.get("sglang") or {}

        def pair(key: str, spec: str) -> str:  # "p50/p99 [SGLang's p50]"
            d = cell[key]
            text = f"{_fmt(d.get('p50'), spec)}/{_fmt(d.get('p99'), spec)} ms"
            return text + (f" [{theirs[key]:{spec}}]" if key in theirs else "")

        tok_s = f"{cell['total_tok_s']:,.0f} tok/s in+out" + (
            f" [{theirs['total_tok_s']:,}]" if "total_tok_s" in theirs else "")
        lines.append(
            f"{'':<11} c={c:<5} TTFT p50/p99 {pair('ttft_ms', '.0f')} | TPOT p50/p99 {pair('tpot_ms', '.2f')} "
            f"(bound {cell['bound']['tpot_ms']:.2f}) | ITL p50/p99 {pair('itl_ms', '.2f')} | {tok_s}, "
            f"{cell['output_tok_s']:,.0f} out, {100 * cell['fraction_of_bound']:.1f}% of bound | "
            f"{cell['requests']} req, preempted {_fmt(cell['preemptions'], 'd')}"
            + ("" if cell["fits"] else " | exceeds what the engine holds")
        )
    return lines


def _draw(plt, result: dict) -> None:
    cells = [c for c in result["cells"] if "skipped" not in c and "error" not in c]
    xs = [c["concurrency"] for c in cells]
    theirs = {int(k): v for k, v in result["sglang"]["cells"].items()}
    label = "SGLang 0.5.16" + ("" if result["sglang"]["same_shape"] else " (8192/1024: not this shape)")
    label += "" if result["sglang"].get("same_gpu", True) else " (H200: not this GPU)"
    for index, (key, ylabel) in enumerate((("tpot_ms", "TPOT p50 (ms)"), ("total_tok_s", "tok/s (input + output)"))):
        plt.subplot(1, 2, index + 1)
        ours = [c[key].get("p50") if key == "tpot_ms" else c[key] for c in cells]
        plt.plot(xs, ours, "o-", label="ours")
        points = sorted((k, v[key]) for k, v in theirs.items() if key in v)
        plt.plot([p[0] for p in points], [p[1] for p in points], "s--", label=label)
        plt.xscale("log", base=2)
        plt.yscale("log")
        plt.xlabel("concurrency")
        plt.ylabel(ylabel)
        plt.grid(alpha=0.3)
        plt.legend(fontsize=7)
    w = result["workload"]
    plt.suptitle(f"cookbook: {w['input_len']} in / {w['output_len']} out, closed loop")

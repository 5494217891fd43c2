"""step_profile: where the time of a decode step (at a few batch sizes) and of a prefill step goes (torch profiler).

Decode, for each batch size B: B sequences with a ``context``-token prompt are prefilled, then ``steps`` decode steps run the
engine's own path (``Runtime.decode``'s greedy tokens + ``.tolist()``, the step's one device -> host copy), first timed
plainly (wall ms per step), then again under ``torch.profiler``. Per step it reports:
  * wall ms, and GPU ms: the summed duration of the step's kernels and copies (the GPU is busy this long);
  * host ms = wall - GPU: each step waits for its tokens, so host work and GPU work of a step do not overlap and
    the difference is time the GPU sat idle waiting for the host (input packing, graph launch, sampling, Python);
  * kernels launched per step, and GPU time by category (bench/step_profile.py ``CATEGORIES``) with the top
    kernels by total time;
  * device -> host copies per step: each one (``.item()``, ``.tolist()``, a ``repeat_interleave`` sizing its output)
    makes the host wait for the GPU to drain. The step's own read-back is one; a prefill step used to add one per
    linear layer (FLA deriving its chunk table, bench/NOTES.md "Next" 3).
Prefill: ``prefill_seqs`` fresh sequences of ``prefill_len`` tokens in one ``Runtime.prefill`` step (8,192 tokens
by default: the engine's ``max_num_batched_tokens``), measured the same way (its logits' argmax read back).
Engine decode: the same batch sizes through ``LLMEngine.step`` (scheduler, sampler, bookkeeping, and
``overlap_decode`` as the engine is configured), timed and profiled the same way; with overlap the GPU should be
busy for the whole step (wall ~ GPU ms) unless the host's work per step is longer than the GPU's. Each has the
same bound as the runtime rows (the batch-256 target of issue 9 is judged on this engine row). The host's largest
Python functions over those steps (cProfile, which slows them) say where its time goes; the same for the prefill step.
On a CPU there are no device kernels: only wall ms is reported (the harness's smoke test runs it there).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict

import torch

from bench.bounds import decode_bound
from bench.common import Context, profiled_call, random_prompt

# Kernel name -> category, first match wins (names are lower-cased). Our Triton kernels are named after their op
# (ops/triton/*); Inductor's generated kernels start with "triton_"; cuBLAS/CUTLASS GEMMs carry gemm-ish names.
CATEGORIES = (
    ("linear: Triton skinny GEMM", ("skinny_gemm",)),
    ("linear: cuBLAS", ("gemm", "gemv", "cutlass", "nvjet", "xmma", "splitkreduce")),
    ("delta rule", ("gdr_", "delta_rule", "recurrent")),
    ("conv1d", ("conv",)),
    ("attention", ("paged_decode", "paged_prefill", "attention")),
    ("KV store", ("store_kv",)),
    ("Inductor-fused (norms, rotary, gates, residuals)", ("triton_",)),
    ("copies and fills", ("memcpy", "memset", "copy", "fill")),
    ("argmax and reductions", ("argmax", "reduce")),
    ("decode epilogue (greedy tokens, next inputs)", ("next_decode_inputs",)),
)


def category(kernel_name: str) -> str:
    name = kernel_name.lower()
    for label, keys in CATEGORIES:
        if any(k in name for k in keys):
            return label
    return "other"


def requirements(batches=(1, 256), context: int = 1024, steps: int = 20, prefill_seqs: int = 16,
                 prefill_len: int = 512, **_) -> tuple[int, int]:
    batches = [batches] if isinstance(batches, int) else list(batches)
    # the engine rows generate up to engine_max_tokens after their context (_profile_engine_decode)
    return (max(batches + [prefill_seqs]),
            max(context + engine_max_tokens(max(batches), steps) + 1, prefill_len + 1))


def engine_max_tokens(batch: int, steps: int) -> int:
    """The engine rows' max_tokens: room for the 2 warm-up steps and 3 x ``steps`` measured ones (timed, under
    torch.profiler, under cProfile) once every request has its first token, and for the tokens the first requests
    decode while the later prompts are still being computed (mixed steps: at least one prompt of at most the token
    budget completes a step)."""
    return 4 * steps + 16 + batch


def run(ctx: Context, batches=(1, 256), context: int = 1024, steps: int = 20, prefill_seqs: int = 16,
        prefill_len: int = 512, top: int = 12, seed: int = 0, engine: bool = True) -> dict:
    batches = [batches] if isinstance(batches, int) else list(batches)
    ctx.require(*requirements(batches, context, steps, prefill_seqs, prefill_len))
    runtime = ctx.llm().runtime
    rng = random.Random(seed)
    mb, bandwidth = ctx.model_bytes(), ctx.bandwidth()["bytes_per_s"]
    rows = []
    for batch in batches:
        seqs = [runtime.add_sequence(random_prompt(rng, context, ctx.model_config.vocab_size)) for _ in range(batch)]
        try:
            row = _profile_batch(ctx, runtime, seqs, steps, top)
        finally:
            for seq in seqs:
                runtime.release(seq)
        row["bound_ms"] = decode_bound(mb, bandwidth, batch, context + steps)["ms_per_step"]
        row["fraction_of_bound"] = row["bound_ms"] / row["wall_ms"]
        rows.append(row)
    engine_rows = []
    for batch in batches if engine else ():  # engine=False: the runtime rows alone (a 512 x 8,192 batch prefills once)
        row = _profile_engine_decode(ctx, batch, context, steps, top, rng)
        # The timed steps start past the first token and the 2 warm-up steps (context + 3 tokens); the runtime rows'
        # bound uses context + steps, within 1% of this one at context 1,024.
        row["bound_ms"] = decode_bound(mb, bandwidth, batch, context + 3 + steps)["ms_per_step"]
        row["fraction_of_bound"] = row["bound_ms"] / row["wall_ms"]
        engine_rows.append(row)
    prompts = [random_prompt(rng, prefill_len, ctx.model_config.vocab_size) for _ in range(prefill_seqs)]
    prefill = profile_steps(ctx, lambda: _prefill_once(runtime, prompts), repeats=3, top=top)
    prefill.update(sequences=prefill_seqs, tokens=prefill_seqs * prefill_len,
                   tok_s=prefill_seqs * prefill_len / (prefill["wall_ms"] / 1e3))
    # Where a prefill step's host time goes (the step launches ~60 kernels a layer eagerly; on an H200 the GPU sat
    # idle about half of it: bench/NOTES.md "Runs 71-73").
    _, prefill["host_functions_per_step"] = profiled_call(
        lambda: [_prefill_once(runtime, prompts) for _ in range(3)], top, 3)
    engine_prefill = _profile_engine_prefill(ctx, prompts, top) if engine else None
    result = ctx.metadata("step_profile")
    result.update({
        "workload": {"batches": batches, "context": context, "steps": steps, "greedy": True, "seed": seed,
                     "prefill_seqs": prefill_seqs, "prefill_len": prefill_len, "engine": engine},
        "rows": rows,
        "engine_rows": engine_rows,
        "prefill": prefill,
        "engine_prefill": engine_prefill,
        "bound": {"formula": "decode step bytes (weights + state read/write + KV read) / copy bandwidth",
                  "ms_per_step": [r["bound_ms"] for r in rows]},
        "fraction_of_bound": [r["fraction_of_bound"] for r in rows],
        "engine_fraction_of_bound": [r["fraction_of_bound"] for r in engine_rows],
        "method": "wall: perf_counter around `steps` steps, the device synchronised before and after them (an "
                  "overlapped engine step leaves its GPU work in flight); GPU: summed durations of the device events "
                  "torch.profiler records during the same number of steps; host = wall - GPU",
    })
    ctx.write("step_profile", result)
    return result


@torch.inference_mode()
def _profile_batch(ctx: Context, runtime, seqs, steps: int, top: int) -> dict:
    group = max(1, runtime.config.max_num_batched_tokens // len(seqs[0].token_ids))  # prefill steps of engine size
    for i in range(0, len(seqs), group):
        for seq, token in zip(seqs[i : i + group], runtime.prefill(seqs[i : i + group]).argmax(dim=-1).tolist()):
            seq.token_ids.append(token)

    def decode_step() -> None:
        tokens = runtime.decode(seqs).tokens.tolist()  # the engine's one device -> host copy
        for seq, token in zip(seqs, tokens):
            seq.token_ids.append(token)

    return {"batch": len(seqs), **profile_steps(ctx, decode_step, repeats=steps, top=top)}


def _profile_engine_decode(ctx: Context, batch: int, context: int, steps: int, top: int, rng) -> dict:
    """Decode steps of ``batch`` requests through ``LLMEngine.step``, once every request has its first token."""
    from compiled_engine.sampling_params import RequestOutputKind, SamplingParams

    engine = ctx.llm().engine
    params = SamplingParams(temperature=0.0, max_tokens=engine_max_tokens(batch, steps), ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    ids = [engine.add_request(None, random_prompt(rng, context, ctx.model_config.vocab_size), params)
           for _ in range(batch)]
    try:
        while any(engine.requests[i].first_token_time is None for i in ids if i in engine.requests):
            engine.step()
        if any(i not in engine.requests for i in ids):
            raise RuntimeError(f"batch {batch}: a request finished before the last prompt was computed; "
                               f"engine_max_tokens assumes a prompt of {context} tokens fits one step's budget")
        row = {"batch": batch, "overlap_decode": engine.overlap_decode, **profile_steps(ctx, engine.step, steps, top)}
        _, row["host_functions_per_step"] = profiled_call(lambda: [engine.step() for _ in range(steps)], top, steps)
        return row
    finally:
        for request_id in ids:
            if request_id in engine.requests:
                engine.abort_request(request_id)
        while engine.step():  # an overlapped step still in flight
            pass


def _profile_engine_prefill(ctx: Context, prompts: list[list[int]], top: int) -> dict:
    """The same prompts as requests through ``LLMEngine.step`` to their first token (``max_tokens=1``): the time to
    first token as the engine serves it (scheduling, the prompt step, sampling, the read-back, bookkeeping), beside
    the runtime's bare prompt step above."""
    from compiled_engine.sampling_params import RequestOutputKind, SamplingParams

    engine = ctx.llm().engine
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)

    def first_tokens() -> None:
        for prompt in prompts:
            engine.add_request(None, prompt, params)
        while engine.has_unfinished_requests():
            engine.step()

    row = {**profile_steps(ctx, first_tokens, repeats=3, top=top), "sequences": len(prompts)}
    _, row["host_functions_per_step"] = profiled_call(lambda: [first_tokens() for _ in range(3)], top, 3)
    return row


@torch.inference_mode()
def _prefill_once(runtime, prompts: list[list[int]]) -> None:
    seqs = [runtime.add_sequence(p) for p in prompts]
    try:
        runtime.prefill(seqs).argmax(dim=-1).tolist()
    finally:
        for seq in seqs:
            runtime.release(seq)


def profile_steps(ctx: Context, step, repeats: int, top: int) -> dict:
    """Wall ms per ``step()`` over ``repeats`` steps, the device synchronised before and after, then the same under
    torch.profiler (CUDA): GPU ms a step, by kernel category and the ``top`` kernels (bench/spec.py profiles a
    speculative round with it). The sync after charges an overlapped step's in-flight work to the steps timed, plus
    the first step's host time, which nothing overlaps: a few repeats overestimate an overlapped step a little."""

    def timed(n: int) -> float:
        # Synchronised at both ends: an overlapped engine step returns with the step it launched still running, so
        # without the final sync n steps would time n launches but only n - 1 steps of GPU work.
        ctx.sync()
        start = time.perf_counter()
        for _ in range(n):
            step()
        ctx.sync()
        return (time.perf_counter() - start) / n * 1e3

    timed(2)  # warm: first replays, allocator, autotuning
    row = {"wall_ms": timed(repeats)}
    if ctx.device.type != "cuda":
        return row
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        profiled_wall_ms = timed(repeats)
    per_kernel_us: dict[str, float] = defaultdict(float)
    launches = device_to_host = 0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel_us[event.name] += event.time_range.elapsed_us()
            launches += 1
            device_to_host += "dtoh" in event.name.lower()  # "Memcpy DtoH (Device -> Pageable)" and the like
    by_category: dict[str, float] = defaultdict(float)
    for name, us in per_kernel_us.items():
        by_category[category(name)] += us
    gpu_ms = sum(per_kernel_us.values()) / repeats / 1e3
    ranked = sorted(per_kernel_us.items(), key=lambda kv: -kv[1])[:top]
    row.update(
        profiled_wall_ms=profiled_wall_ms,
        gpu_ms=gpu_ms,
        host_ms=max(0.0, row["wall_ms"] - gpu_ms),
        kernels_per_step=launches / repeats,
        device_to_host_copies_per_step=device_to_host / repeats,
        gpu_ms_by_category={k: v / repeats / 1e3 for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])},
        top_kernels=[{"name": name[:120], "ms_per_step": us / repeats / 1e3, "category": category(name)}
                     for name, us in ranked],
        # The host-side ops whose own kernels take the most GPU time, by input shapes: which call a kernel name
        # (a copy, a fill) belongs to.
        top_ops=[{"op": e.key, "shapes": str(e.input_shapes)[:200], "calls_per_step": e.count / repeats,
                  "ms_per_step": e.self_device_time_total / repeats / 1e3}
                 for e in sorted(prof.key_averages(group_by_input_shape=True),
                                 key=lambda e: -e.self_device_time_total)[:3 * top]
                 if e.self_device_time_total > 0],
    )
    return row


def summary_lines(head: str, result: dict) -> list[str]:
    lines = [f"{head} decode at context {result['workload']['context']}:"]
    for r in result["rows"]:
        lines += _row_lines(f"batch {r['batch']}", r, f" | bound {r['bound_ms']:.3f} ms ({100 * r['fraction_of_bound']:.1f}%)")
    for r in result.get("engine_rows", []):
        lines += _row_lines(f"engine batch {r['batch']}{' overlapped' if r['overlap_decode'] else ''}", r,
                            f" | bound {r['bound_ms']:.3f} ms ({100 * r['fraction_of_bound']:.1f}%)")
    p = result["prefill"]
    lines += _row_lines(f"prefill {p['sequences']} x {p['tokens'] // p['sequences']} tokens", p,
                        f" | {p['tok_s']:.0f} tok/s") + _host_lines(p)
    if result.get("engine_prefill"):
        e = result["engine_prefill"]
        lines += _row_lines("the same prompts through LLMEngine.step to their first token", e, "") + _host_lines(e)
    return lines


def _host_lines(r: dict) -> list[str]:
    """The ops whose kernels take the most GPU time, and the host's largest functions, of a profiled row."""
    lines = []
    if r.get("top_ops"):
        lines.append(f"{'':<15}GPU ms by op: " + ", ".join(
            f"{o['op']} {o['shapes'][:60]} x{o['calls_per_step']:g} {o['ms_per_step']:.3f}" for o in r["top_ops"][:8]))
    host = r.get("host_functions_per_step")
    if host:
        lines.append(f"{'':<15}host, by self time (cProfile, ms a step): " + ", ".join(
            f"{f['function']} {1e3 * f['self_s']:.2f}" for f in host["by_self_time"][:8]))
    return lines


def _row_lines(label: str, r: dict, extra: str) -> list[str]:
    if "gpu_ms" not in r:
        return [f"{'':<11} {label}: {r['wall_ms']:.3f} ms/step{extra} (no device profile on this device)"]
    lines = [f"{'':<11} {label}: {r['wall_ms']:.3f} ms/step = GPU {r['gpu_ms']:.3f} + host {r['host_ms']:.3f}, "
             f"{r['kernels_per_step']:.0f} kernels/step, {r.get('device_to_host_copies_per_step', 0):.0f} device->host "
             f"copies/step{extra}"]
    return lines + [f"{'':<15}{ms:8.3f} ms  {name}" for name, ms in r["gpu_ms_by_category"].items()]

"""spec: MTP speculative decoding (issue 23) against plain decoding, at batch 1, 8 and 64 and k = 1, 2, 3.

Workload: ``batch`` random prompts of ``prompt_len`` tokens, ``new_tokens`` greedy tokens each (ignore_eos), one
``LLM.generate``. Reported, per batch:

* ``baseline``: the engine without speculative decoding (the shared engine: compiled decode on CUDA unless
  ``--enforce-eager``): output tok/s, TTFT/TPOT, and one decode step's cost (``decode_ms``, at that batch and a
  ``prompt_len`` context, the step's tokens read back as the engine does);
* per k: an engine with ``speculative_config={"method": "mtp", "num_speculative_tokens": k}`` (greedy rounds
  compiled like the decode graph unless ``--enforce-eager``; prefill eager as always): output tok/s with the
  checkpoint's MTP head (and its acceptance: accepted / drafted), then with
  a forced-acceptance drafter at each ``rates`` (``LLMEngine.draft_script``: the known greedy continuation of each
  request by position, each draft right with that probability, else a wrong token; a table on the device that
  replaces the MTP head's drafts, speculative_config ``scripted_drafts``). ``LLM`` overlaps its steps
  (``overlap_decode``), so rounds chain (the next round launched from the device's results before the host reads a
  round back: compiled_engine/engine.py ``_read_round``), the forced ones as the MTP head's: the head still runs in
  them, so a forced round costs what a head's round costs. The speed-up over
  the baseline (``speedup``: output tok/s, the prompt's step included; ``decode_speedup``: the baseline's TPOT p50
  over the run's, decoding alone: the prompt's step of a speculative engine also drafts, and at 128 new tokens an
  eager prompt step of tens of ms weighs on ``speedup``); and the step costs at that batch: ``verify_ms`` (the
  target's verify step: k+1 tokens a sequence, eager), ``verify_graph_ms`` (the same captured in a CUDA graph: GPU
  time, against the baseline's ``decode_graph_ms``, a decode graph's replay: ``verify_graph_vs_decode_graph``, the
  issue's "verify step against a decode step"), ``compiled_verify_graph_ms`` (the verify as a compiled round runs
  it, under torch.compile like the decode graph it is held against, then captured:
  ``compiled_verify_graph_vs_decode_graph``; with compiled rounds only),
  ``round_ms`` (a greedy round as the engine runs it: verify, acceptance, commit, MTP drafts, compiled and captured
  on CUDA unless ``--enforce-eager``; the read-back included; ``chained_round_ms``: the period of rounds chained back
  to back, each launched before the one before it is read back, as the engine runs the MTP head's rounds, and
  ``tokens_per_round`` over its ratio to the baseline's TPOT the speed-up that period predicts (a check on the forced
  curve, which chains); on CUDA ``round_profile``: its kernels by category under torch.profiler,
  bench/step_profile.py; ``verify_graph_critical_path``, ``compiled_verify_graph_critical_path`` and
  ``round_critical_path``: the verify graphs' and the captured round graph's kernels per name and grid,
  bench/latency.py's critical path),
  ``eager_decode_ms`` (an eager decode step of the
  speculative runtime), their ratios to the baseline decode step; and ``round_vs_baseline_tpot``, the round against
  the baseline's TPOT p50 (the baseline engine overlaps a step's host work with the next step's GPU work, which
  ``decode_ms`` does not: at k tokens a round the speed-up is about ``tokens_per_round / round_vs_baseline_tpot``).
* ``bound``: per batch, the non-speculative decode bound (bench/bounds.py: one read of the weights per token), and
  ``fraction_of_bound`` of every run (speculation exists to pass 1);
* ``rule``: per batch, the best k at each forced acceptance rate and whether drafting pays there at all, and the
  ``disable_by_batch_size`` (speculative_config) that follows at each rate: the largest measured batch that pays.
* ``auto_<rate>``: the forced runs again with the engine's drafting rule on (``auto_disable``,
  compiled_engine/drafting_rule.py: drafting stops where the engine's own timings say it does not pay), and
  ``auto_mtp`` the MTP head's run with it; the other runs have it off
  (the engines are built with ``auto_disable`` so that their plain decode step is compiled too).

``-p spec.draft_vocab_size=N``: the speculative engines draft over the first N token ids only (speculative_config's
``draft_vocab_size``), so each draft reads N rows of the lm_head instead of all 248,320.

``-p spec.repeats=N`` (3): every configuration's ``LLM.generate`` is timed N times and reported by its run of median
wall time (``walls_s`` has them all): a run's tok/s carries its prompt step, eager and host-bound, whose time moves
from one run to the next.

Each finished (k, batch) cell prints its runs' ``speedup/decode_speedup`` on stderr and rewrites spec.json with every
cell so far, marked ``"partial": true``, so a run cut at a device call's time limit keeps them; the complete result
(rule, bounds, fractions) replaces it at the end.

With random weights the MTP head's acceptance says nothing about a real checkpoint: the forced-acceptance curve is
the result. The outputs of every speculative run are checked against the baseline's (greedy: token for token).

The forced drafter's continuation comes from the speculative engine itself (a run whose drafts are all wrong), not
from the baseline: in bf16 the verify step's logits (k+1 rows a sequence, other GEMM kernels) differ from a decode
step's in the last bits, and on logits without a wide top-1 margin (the random model's since RANDOM_VERSION v3) a
greedy token can flip, after which a baseline continuation is wrong at every later position (run 56: acceptance 0 at
forced 1). ``outputs_differing_from_continuation`` checks that a run follows that continuation (0 expected: fp32,
the smoke test); ``outputs_differing_from_baseline`` counts the flips. In bf16 on the v3 model the continuation too
depends on which drafts were accepted (run 57: every forced run left it, acceptance 0.18 at forced 1): the forced
curve needs logits with a wide top-1 margin, ``--model qwen3.5-0.8b-confident`` (bench/models.py ``EMBEDDING_STD``).
"""

from __future__ import annotations

import random
import sys
import time

import torch

from bench.bounds import workload_decode_bound
from bench.common import Context, greedy, random_prompt, request_timings
from bench.latency import CRITICAL_PATH_REPLAYS, critical_path_lines, profiled_critical_path
from bench.step_profile import profile_steps
from compiled_engine.drafting_rule import DraftingRule

OWN_ENGINES = True  # builds an engine per k: the driver runs it after the shared-engine scenarios


def requirements(batches=(1, 8, 64), prompt_len: int = 128, new_tokens: int = 128, ks=(1, 2, 3), **_):
    return max(_as_list(batches)), prompt_len + new_tokens + 2 * max(_as_list(ks)) + 1


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def forced_script(references: dict[tuple, list[int]], prompt_len: int, rate: float, vocab: int, seed: int = 0):
    """``draft_script``: each request's known greedy continuation (found by its prompt) by position, each draft right
    with probability ``rate``, else a token the continuation does not have there; a request's coins are its own
    (seeded by ``seed`` and its prompt), whichever chunk or slot asks."""

    def script(request_id: str, prompt: list[int]) -> list[int]:
        ref = references[tuple(prompt[:prompt_len])]
        rng = random.Random(hash((seed, *prompt)))
        # Position prompt_len + i holds ref[i]; ref[0] comes from the prompt's step, never from a draft.
        drafts = [ref[i] if rng.random() < rate else (ref[i] + 1 + rng.randrange(vocab - 1)) % vocab
                  for i in range(1, len(ref))]
        return [-1] * (len(prompt) + 1) + drafts

    return script


def run(
    ctx: Context,
    batches=(1, 8, 64),
    ks=(1, 2, 3),
    rates=(0.0, 0.5, 0.8, 1.0),
    prompt_len: int = 128,
    new_tokens: int = 128,
    step_iters: int = 20,
    seed: int = 0,
    draft_vocab_size: int | None = None,
    repeats: int = 3,
) -> dict:
    """``draft_vocab_size``: the MTP drafts over the first that many token ids (speculative_config's knob).
    ``repeats``: timed ``LLM.generate`` runs of every configuration; its figures are the run of median wall time's."""
    if repeats < 1:
        raise ValueError(f"spec.repeats must be >= 1, got {repeats}")
    batches, ks, rates = _as_list(batches), _as_list(ks), _as_list(rates)
    ctx.require(*requirements(batches, prompt_len, new_tokens, ks))
    vocab = ctx.model_config.vocab_size
    rng = random.Random(seed)
    prompts = [random_prompt(rng, prompt_len, vocab) for _ in range(max(batches))]
    warmup = [random_prompt(rng, prompt_len, vocab) for _ in range(max(batches))]

    base = ctx.llm()
    baseline, references = {}, {}
    for b in batches:
        base.generate(warmup[:b], greedy(8), use_tqdm=False)
        timed, runs = _timed(ctx, base, prompts[:b], new_tokens, repeats)
        references[b] = {tuple(p): o.token_ids for p, o in zip(prompts[:b], runs[0])}
        baseline[b] = {**timed, "decode_ms": _decode_ms(ctx, base.runtime, prompts[:b], step_iters),
                       "decode_graph_ms": _decode_graph_ms(ctx, base.runtime, prompts[:b], step_iters)}

    per_k: dict[int, dict] = {}
    for k in ks:
        llm = ctx.llm(speculative_config={"method": "mtp", "num_speculative_tokens": k,
                                          "draft_vocab_size": draft_vocab_size, "auto_disable": True,
                                          "scripted_drafts": True})
        per_k[k] = {}
        for b in batches:
            llm.engine.drafting_rule = None
            llm.engine.draft_script = None
            llm.generate(warmup[:b], greedy(8), use_tqdm=False)
            cell = {"mtp": _spec_run(ctx, llm, prompts[:b], new_tokens, references[b], repeats)}
            llm.engine.draft_script = forced_script(references[b], prompt_len, 0.0, vocab, seed)  # every draft wrong
            own = {tuple(p): o.token_ids for p, o in zip(
                prompts[:b], llm.generate(prompts[:b], greedy(new_tokens), use_tqdm=False))}
            for rate in rates:
                llm.engine.draft_script = forced_script(own, prompt_len, rate, vocab, seed)
                cell[f"forced_{rate:g}"] = _spec_run(ctx, llm, prompts[:b], new_tokens, references[b], repeats, own)
            for rate in rates:
                llm.engine.draft_script = forced_script(own, prompt_len, rate, vocab, seed)
                cell[f"auto_{rate:g}"] = _spec_run(ctx, llm, prompts[:b], new_tokens, references[b], repeats, own,
                                                   rule=True)
            llm.engine.draft_script = None  # the MTP head's own drafts
            cell["auto_mtp"] = _spec_run(ctx, llm, prompts[:b], new_tokens, references[b], repeats, rule=True)
            llm.engine.drafting_rule = None
            llm.engine.draft_script = None
            base_tpot = baseline[b]["tpot_ms"]["p50"]
            for entry in cell.values():
                entry["speedup"] = entry["output_tok_s"] / baseline[b]["output_tok_s"]
                tpot = entry["tpot_ms"]["p50"]
                entry["decode_speedup"] = base_tpot / tpot if tpot and base_tpot else None
            done = ", ".join(f"{name} {entry['speedup']:.2f}x/{entry['decode_speedup'] or 0:.2f}x"
                             for name, entry in cell.items())
            print(f"[bench] spec k={k} batch {b}: {done}", file=sys.stderr, flush=True)
            costs = _spec_step_ms(ctx, llm.runtime, prompts[:b], k, step_iters)
            decode = baseline[b]["decode_ms"]
            costs.update({"verify_vs_decode": costs["verify_ms"] / decode, "round_vs_decode": costs["round_ms"] / decode,
                          "eager_decode_vs_decode": costs["eager_decode_ms"] / decode})
            # The same round against what a token costs the baseline engine (TPOT p50: its steps overlap the host's
            # work with the GPU's, where decode_ms waits for each step's tokens): the ratio the speed-up divides by.
            tpot = baseline[b]["tpot_ms"]["p50"]
            costs["round_vs_baseline_tpot"] = costs["round_ms"] / tpot if tpot else None
            if costs["chained_round_ms"] is not None and tpot:
                costs["chained_round_vs_baseline_tpot"] = costs["chained_round_ms"] / tpot
            decode_graph = baseline[b]["decode_graph_ms"]
            if costs["verify_graph_ms"] is not None and decode_graph is not None:
                costs["verify_graph_vs_decode_graph"] = costs["verify_graph_ms"] / decode_graph
            if costs["compiled_verify_graph_ms"] is not None and decode_graph is not None:
                costs["compiled_verify_graph_vs_decode_graph"] = costs["compiled_verify_graph_ms"] / decode_graph
            cell["steps"] = costs
            per_k[k][b] = cell
            # Every finished cell on disk at once: a run cut at its time limit keeps them (spec.json, "partial").
            ctx.write("spec", {**ctx.metadata("spec"), "partial": True, "baseline": baseline, "speculative": per_k})
    ctx.release_llm()

    rule = {}
    for b in batches:
        rule[b] = {}
        for rate in rates:
            best = max(ks, key=lambda k: per_k[k][b][f"forced_{rate:g}"]["output_tok_s"])
            speedup = per_k[best][b][f"forced_{rate:g}"]["speedup"]
            rule[b][f"{rate:g}"] = {"best_k": best, "speedup": speedup, "draft": speedup > 1.0}
    # speculative_config's disable_by_batch_size at each acceptance rate: the largest measured batch where the best
    # k still pays (None: drafting pays at none of them).
    rule["disable_by_batch_size"] = {
        f"{rate:g}": max((b for b in batches if rule[b][f"{rate:g}"]["draft"]), default=None) for rate in rates
    }
    # The non-speculative decode bound (one read of the weights per token): speculation exists to pass it.
    mb, bandwidth = ctx.model_bytes(), ctx.bandwidth()["bytes_per_s"]
    bound = {b: workload_decode_bound(mb, bandwidth, [prompt_len] * b, [new_tokens] * b, b) for b in batches}
    fraction = {b: {"baseline": baseline[b]["output_tok_s"] / bound[b]["output_tok_s"],
                    **{f"k{k}_{name}": entry["output_tok_s"] / bound[b]["output_tok_s"]
                       for k in ks for name, entry in per_k[k][b].items() if name != "steps"}}
                for b in batches}
    result = ctx.metadata("spec")
    result.update({
        "bound": bound,
        "fraction_of_bound": fraction,
        "workload": {"batches": batches, "ks": ks, "rates": rates, "prompt_len": prompt_len,
                     "new_tokens": new_tokens, "greedy": True, "ignore_eos": True, "seed": seed,
                     "draft_vocab_size": draft_vocab_size},
        "baseline": baseline,
        "speculative": per_k,
        "rule": rule,
        "targets": {"batch1_k2_rate0.8_speedup": ">= 1.8", "verify_k2_vs_decode": "<= 1.25",
                    "rate0_speedup": ">= 0.9 or drafting off"},
    })
    ctx.write("spec", result)
    return result


def _timed(ctx: Context, llm, prompts: list[list[int]], new_tokens: int, repeats: int,
           before_each=None) -> tuple[dict, list[list]]:
    """``repeats`` runs of one ``LLM.generate`` each (``before_each()`` before every run): the figures of the run of
    median wall time (of an even count, the slower middle one), every run's wall in ``walls_s``; and every run's
    outputs. One run is one sample of the eager prompt step, whose host-bound time moves between processes and
    machines (47.6 and 86.0 ms for the same batch-1 step in runs 90 and 94: bench/NOTES.md)."""
    runs = []
    for _ in range(repeats):
        if before_each is not None:
            before_each()
        ctx.sync()
        start = time.perf_counter()
        outputs = llm.generate(prompts, greedy(new_tokens), use_tqdm=False)
        ctx.sync()
        runs.append((time.perf_counter() - start, outputs))
    wall, outputs = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    generated = sum(len(o.token_ids) for o in outputs)
    return {"wall_s": wall, "walls_s": [w for w, _ in runs], "output_tokens": generated,
            "output_tok_s": generated / wall, **request_timings(outputs)}, [o for _, o in runs]


class _LoggedRule(DraftingRule):
    """The engine's drafting rule, logging each measurement it is handed: (kind, rows, ms, accepted drafts)."""

    def __init__(self, num_drafts: int):
        super().__init__(num_drafts=num_drafts)  # as the engine builds its own (auto_disable)
        self.log: list[tuple] = []

    def record_round(self, rows, seconds, drafted_rows, accepted_drafts):
        self.log.append(("round", rows, round(seconds * 1e3, 4), drafted_rows, accepted_drafts))
        super().record_round(rows, seconds, drafted_rows, accepted_drafts)

    def record_plain(self, rows, seconds):
        self.log.append(("plain", rows, round(seconds * 1e3, 4)))
        super().record_plain(rows, seconds)


def _spec_run(ctx: Context, llm, prompts, new_tokens, references, repeats: int, continuation=None,
              rule: bool = False) -> dict:
    """``_timed`` of the speculative engine; acceptance over all its runs, and the outputs of every run checked (a
    count of the (run, request) pairs that differ). ``rule``: each run with a fresh drafting rule, the last one's
    log reported."""
    engine = llm.engine
    before = (engine.num_draft_tokens, engine.num_accepted_tokens, engine.num_verified_rows, engine.num_chained_rounds)
    k = engine.num_speculative_tokens
    fresh_rule = (lambda: setattr(engine, "drafting_rule", _LoggedRule(k))) if rule else None
    timed, runs = _timed(ctx, llm, prompts, new_tokens, repeats, fresh_rule)
    drafted = engine.num_draft_tokens - before[0]
    accepted = engine.num_accepted_tokens - before[1]
    rounds = engine.num_verified_rows - before[2]
    mismatches = sum(o.token_ids != references[tuple(p)] for outputs in runs for p, o in zip(prompts, outputs))
    entry = {**timed, "acceptance": accepted / drafted if drafted else None,
             "tokens_per_round": (accepted + rounds) / rounds if rounds else None,
             "chained_rounds": engine.num_chained_rounds - before[3], "outputs_differing_from_baseline": mismatches}
    rule = engine.drafting_rule
    if isinstance(rule, _LoggedRule):  # what the rule saw and decided, step by step
        entry["rule"] = {"rounds": sum(kind == "round" for kind, *_ in rule.log),
                         "plain_steps": sum(kind == "plain" for kind, *_ in rule.log),
                         "accepted": rule.accepted, "round_ms": {d: s * 1e3 for d, s in rule.round_s.items()},
                         "plain_ms": {d: s * 1e3 for d, s in rule.plain_s.items()}, "log": rule.log}
    if continuation is not None:
        entry["outputs_differing_from_continuation"] = sum(
            o.token_ids != continuation[tuple(p)] for outputs in runs for p, o in zip(prompts, outputs))
    return entry


def _started(runtime, prompts):
    """Sequences of ``prompts``, prefilled, each with its next token appended (uncomputed)."""
    seqs = [runtime.add_sequence(p) for p in prompts]
    logits = runtime.prefill(seqs)
    for seq, token in zip(seqs, logits.argmax(dim=-1).tolist()):
        seq.token_ids.append(token)
    return seqs


def _decode_ms(ctx: Context, runtime, prompts, iters: int) -> float:
    """One decode step of ``prompts`` as the engine runs it (the tokens read back), in ms."""
    seqs = _started(runtime, prompts)
    try:
        for i in range(iters + 2):  # two warm-up steps
            if i == 2:
                ctx.sync()
                start = time.perf_counter()
            tokens = runtime.decode(seqs).tokens.tolist()
            for seq, token in zip(seqs, tokens):
                seq.token_ids.append(token)
        ctx.sync()
        return (time.perf_counter() - start) / iters * 1e3
    finally:
        for seq in seqs:
            runtime.release(seq)


def _decode_graph_ms(ctx: Context, runtime, prompts, iters: int) -> float | None:
    """GPU time of one replay of the decode graph of ``prompts`` (back-to-back replays, CUDA events), in ms; None
    without the runner's graphs. The sequences are garbage afterwards (``DecodeGraphRunner.replay_last``)."""
    from graphs.decode_graph import DecodeGraphRunner

    runner = runtime.decode_fn
    # Tensor parallel: a replay on rank 0 alone would wait in its collectives for the workers.
    if ctx.device.type != "cuda" or not isinstance(runner, DecodeGraphRunner) or runtime.model.tp.world_size > 1:
        return None
    seqs = _started(runtime, prompts)
    try:
        runtime.decode(seqs)  # a live step in the graph's static buffers
        return _replay_ms(lambda: runner.replay_last(len(seqs)), iters)
    finally:
        for seq in seqs:
            runtime.release(seq)


@torch.inference_mode()
def _replay_ms(replay, iters: int) -> float:
    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


@torch.inference_mode()
def _verify_graph(runtime, seqs, drafts, iters: int, compiled: bool = False) -> tuple[float, dict]:
    """GPU time of a verify step alone (the target's forward of k+1 tokens a sequence and its logits' argmax, the
    work a round's verify does) captured into a CUDA graph of its own and replayed, in ms: the number to hold
    against a decode graph's replay (``decode_graph_ms``); and where that time goes, per kernel and grid
    (bench/latency.py's critical path). It writes KV at the verified positions and the linear layers' verify
    history; the pools stay as they are. Eager (``compiled`` False): the model's ops as they are, the logits' argmax
    torch's. ``compiled``: the verify as a round runs it (compiled_engine/speculative.py ``fused_round``: the
    decode logits and ``ce::argmax``) under ``torch.compile(fullgraph=True)``, as the round and the decode graph
    it is held against are compiled, so that Inductor's kernels replace the eager elementwise ops."""
    from compiled_engine.speculative import pack_verify_step
    from ops.argmax import argmax_op

    step = pack_verify_step(seqs, drafts, runtime.config.block_size, runtime.device)
    model = runtime.model

    def forward():
        if compiled:
            return argmax_op(model.decode_logits(model(step)))
        return model.compute_logits(model(step)).argmax(dim=-1)

    if compiled:
        forward = torch.compile(forward, fullgraph=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # Triton's JIT and autotuning happen here, outside the capture
        forward()
        forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    return _replay_ms(graph.replay, iters), profiled_critical_path(graph.replay, CRITICAL_PATH_REPLAYS)


def _spec_step_ms(ctx: Context, runtime, prompts, k: int, iters: int) -> dict:
    """In ms: a verify step alone (the unfused eager path: the target's forward of k+1 tokens a sequence, host time
    included; and on CUDA the same captured into a graph: ``verify_graph_ms``, GPU time), a whole greedy round as the
    engine runs it (``Runtime.fused_round``: compiled when the runtime is; the read-back and ``advance`` included),
    and an eager decode step of the speculative runtime. (A lone verify step leaves the pools as they are.)"""
    seqs = _started(runtime, prompts)
    drafts = [[0] * k for _ in seqs]

    def one_round() -> None:  # as the engine runs a greedy round: the round, its read-back, advance
        nonlocal drafts
        spec, results = runtime.fused_round(seqs, drafts)
        host = results.rows()
        runtime.advance(spec, [r[0] for r in host], [r[1 : k + 2] for r in host])
        drafts = [r[k + 2 :] for r in host]

    verify_s = round_s = 0.0
    try:
        for i in range(iters + 2):  # two warm-up rounds
            ctx.sync()
            start = time.perf_counter()
            runtime.verify(seqs, drafts)  # reserves nothing new after the first call; the pools stay as they are
            ctx.sync()
            verified = time.perf_counter()
            one_round()
            done = time.perf_counter()
            if i >= 2:
                verify_s += verified - start
                round_s += done - verified
        single_gpu = ctx.device.type == "cuda" and runtime.model.tp.world_size == 1  # (as _decode_graph_ms)
        verify_graph, verify_path = _verify_graph(runtime, seqs, drafts, iters) if single_gpu else (None, None)
        rounds_compiled = runtime.speculative_round is not None
        compiled_verify, compiled_verify_path = (_verify_graph(runtime, seqs, drafts, iters, compiled=True)
                                                 if single_gpu and rounds_compiled else (None, None))
        # Where a round's time goes: its kernels by category (CUDA; a few rounds more, each 1 to k+1 tokens).
        profile = profile_steps(ctx, one_round, iters, top=12) if ctx.device.type == "cuda" else None
        chained = _chained_round_ms(ctx, runtime, seqs, drafts, k, iters)
        eager = _decode_loop(ctx, runtime, seqs, iters)
        # Last (its replays commit the same round again and again: the sequences are released after it): the
        # captured round's graph per kernel and grid.
        round_path = _round_critical_path(runtime, seqs, k, one_round) if single_gpu else None
    finally:
        for seq in seqs:
            runtime.release(seq)
    return {"verify_ms": verify_s / iters * 1e3, "verify_graph_ms": verify_graph,
            "compiled_verify_graph_ms": compiled_verify, "round_ms": round_s / iters * 1e3,
            "chained_round_ms": chained, "eager_decode_ms": eager, "round_profile": profile,
            "verify_graph_critical_path": verify_path, "compiled_verify_graph_critical_path": compiled_verify_path,
            "round_critical_path": round_path}


def _chained_round_ms(ctx: Context, runtime, seqs, drafts, k: int, iters: int) -> float | None:
    """A chained round's period in ms (``Runtime.chain_round``, as ``LLMEngine`` chains its rounds under
    ``overlap_decode``): one packed round, then up to ``iters`` rounds each launched before the round before it is
    read back and advanced; wall time over the rounds, the packed one's launch included. None where rounds cannot
    chain (tensor parallelism, prefix caching)."""
    ctx.sync()
    start = time.perf_counter()
    spec, results = runtime.fused_round(seqs, drafts, chain_rounds=iters + 1)
    rounds = 1
    while rounds <= iters and runtime.can_chain(spec):
        kept, following, following_results = runtime.chain_round(spec, results)
        host = kept.rows()
        runtime.advance(spec, [r[0] for r in host], [r[1 : k + 2] for r in host])
        spec, results = following, following_results
        rounds += 1
    host = results.rows()
    runtime.advance(spec, [r[0] for r in host], [r[1 : k + 2] for r in host])
    ctx.sync()
    return (time.perf_counter() - start) / rounds * 1e3 if rounds > 1 else None


def _round_critical_path(runtime, seqs, k: int, one_round) -> dict | None:
    """bench/latency.py's critical path of the captured round graph of ``seqs`` (None where rounds are not captured),
    its buffers loaded by one more round."""
    compiled = runtime.executor.speculative_round
    if compiled is None or not compiled.captured or not compiled.covers(len(seqs), k):
        return None
    one_round()
    bucket = compiled.policy.bucket_for(len(seqs))
    return profiled_critical_path(lambda: compiled.run(bucket, False), CRITICAL_PATH_REPLAYS)


def _decode_loop(ctx: Context, runtime, seqs, iters: int) -> float:
    ctx.sync()
    start = time.perf_counter()
    for _ in range(iters):
        tokens = runtime.decode(seqs).tokens.tolist()
        for seq, token in zip(seqs, tokens):
            seq.token_ids.append(token)
    ctx.sync()
    return (time.perf_counter() - start) / iters * 1e3


def _speedups(entry: dict) -> str:
    """``1.21x`` (output tok/s over the baseline's, the prompt's step included) and, after a slash, the decode-only
    speed-up (the baseline's TPOT p50 over the run's) where known; then the TTFT p50 in brackets."""
    decode = entry.get("decode_speedup")
    return (f"{entry['speedup']:.2f}x" + ("" if decode is None else f"/{decode:.2f}x")
            + f" (TTFT {entry['ttft_ms']['p50']:.1f} ms)")


def summary_lines(head: str, r: dict) -> list[str]:
    """One line per (k, batch): the speed-up over plain decoding with the MTP head and at each forced acceptance rate
    (output tok/s / TPOT: ``_speedups``), and the verify step's cost in decode steps; then the baseline per batch."""
    lines = []
    for b, base in r["baseline"].items():
        lines.append(f"{head} batch {b}: baseline {base['output_tok_s']:.1f} tok/s, TTFT {base['ttft_ms']['p50']:.1f} "
                     f"ms, decode step {base['decode_ms']:.3f} ms")
    lines.append(f"{'':<11} drafting pays up to batch (by forced acceptance): {r['rule']['disable_by_batch_size']}")
    for k, cells in r["speculative"].items():
        for b, cell in cells.items():
            forced = ", ".join(f"{name.removeprefix('forced_')}: {_speedups(e)}" for name, e in cell.items()
                               if name.startswith("forced_"))
            auto = ", ".join(f"{name.removeprefix('auto_').replace('mtp', 'MTP head')}: {_speedups(e)}"
                             for name, e in cell.items() if name.startswith("auto_"))
            mtp = cell["mtp"]
            acceptance = "-" if mtp["acceptance"] is None else f"{mtp['acceptance']:.2f}"
            graphed = cell["steps"].get("verify_graph_vs_decode_graph")
            compiled = cell["steps"].get("compiled_verify_graph_vs_decode_graph")
            graphed = ("" if graphed is None else f" (as graphs: {graphed:.2f}"
                       + ("" if compiled is None else f", compiled as a round's: {compiled:.2f}") + ")")
            lines.append(f"{'':<11} k={k} batch {b}: MTP head {_speedups(mtp)}, acceptance {acceptance} | forced "
                         f"acceptance {forced} | verify {cell['steps']['verify_vs_decode']:.2f}{graphed}, round "
                         f"{cell['steps']['round_vs_decode']:.2f} decode steps"
                         + (f" ({cell['steps']['round_vs_baseline_tpot']:.2f} baseline TPOTs)"
                            if cell["steps"].get("round_vs_baseline_tpot") else "")
                         + (f", chained {cell['steps']['chained_round_vs_baseline_tpot']:.2f} baseline TPOTs"
                            if cell["steps"].get("chained_round_vs_baseline_tpot") else ""))
            if auto:
                lines.append(f"{'':<11}   with the drafting rule (auto_disable), by forced acceptance: {auto}")
            profile = cell["steps"].get("round_profile")
            if profile:
                top = ", ".join(f"{name} {ms:.3f}" for name, ms in list(profile["gpu_ms_by_category"].items())[:4])
                lines.append(f"{'':<11}   a round's GPU {profile['gpu_ms']:.3f} ms of {profile['wall_ms']:.3f} wall, "
                             f"{profile['kernels_per_step']:.0f} kernels: {top}")
            for label, key in (("verify graph", "verify_graph_critical_path"),
                               ("compiled verify graph", "compiled_verify_graph_critical_path"),
                               ("round graph", "round_critical_path")):
                lines += critical_path_lines(cell["steps"].get(key), label, top=10, indent=13)
    return lines

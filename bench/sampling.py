"""sampling: what sampling costs -- one chat-like offline workload run greedy, then sampled.

Workload: ``num_requests`` requests (default 256), prompt lengths uniform in [``min_prompt_len``, ``max_prompt_len``]
(256-2,048) and output lengths uniform in [``min_output_len``, ``max_output_len``] (32-512), random prompt token ids,
seed 0, ignore_eos. It runs through one ``LLM.generate`` per run (all requests queued at once, as the throughput
scenario does): greedy (temperature 0), then sampled (``temperature`` 0.8, ``top_p`` 0.95, ``top_k`` 50; request
``i`` seeded with ``i``; any of ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty`` set: those too,
which samples every step from the logits outside the decode graph), ``rounds`` times in turn (default 2), so a cold first step does not land on one side only;
a warm-up of ``warmup_requests`` short requests runs both ways first.

Reported (the last round; every round's tok/s under ``rounds``): output tok/s (generated tokens / synchronised wall
time), TTFT and TPOT of each; the ratio sampled / greedy output tok/s; how many sampled requests' tokens differ
from their greedy tokens (a check that the sampled run sampled) and whether every round sampled the same tokens
(the per-request seeds). Bound (bench/bounds.py ``workload_decode_bound``): the decode-only memory bound of the
workload at ``max_num_seqs`` in flight, the same for both runs (sampling moves no more weight, state or KV bytes).
"""

from __future__ import annotations

import random

from bench.bounds import workload_decode_bound
from bench.common import Context, random_prompt, ratio
from bench.throughput import _timed_generate, _warmup

NEUTRAL_PENALTIES = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def workload(num_requests: int = 256, min_prompt_len: int = 256, max_prompt_len: int = 2048,
             min_output_len: int = 32, max_output_len: int = 512, seed: int = 0, vocab_size: int = 10001):
    """(prompts, output lengths): prompt lengths first, then output lengths, from one seeded generator."""
    rng = random.Random(seed)
    prompts = [random_prompt(rng, rng.randint(min_prompt_len, max_prompt_len), vocab_size)
               for _ in range(num_requests)]
    outputs = [rng.randint(min_output_len, max_output_len) for _ in range(num_requests)]
    return prompts, outputs


def requirements(num_requests: int = 256, max_prompt_len: int = 2048, max_output_len: int = 512, **_):
    return min(num_requests, 256), max_prompt_len + max_output_len


def run(
    ctx: Context,
    num_requests: int = 256,
    min_prompt_len: int = 256,
    max_prompt_len: int = 2048,
    min_output_len: int = 32,
    max_output_len: int = 512,
    temperature: float = 0.8,
    top_p: float = 0.95,
    top_k: int = 50,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    seed: int = 0,
    warmup_requests: int = 4,
    rounds: int = 2,
) -> dict:
    """``rounds``: greedy then sampled, this many times; the last round is the headline, every round is kept (the
    first one's figures in the summary too: what a fresh process pays, compiles on first use included)."""
    ctx.require(*requirements(num_requests, max_prompt_len, max_output_len))
    llm = ctx.llm()
    prompts, output_lens = workload(num_requests, min_prompt_len, max_prompt_len, min_output_len, max_output_len,
                                    seed, ctx.model_config.vocab_size)
    sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k}
    penalties = {"repetition_penalty": repetition_penalty, "presence_penalty": presence_penalty,
                 "frequency_penalty": frequency_penalty}
    sampling.update({k: v for k, v in penalties.items() if v != NEUTRAL_PENALTIES[k]})
    _warmup(llm, prompts[:warmup_requests])
    if warmup_requests:
        _timed_generate(ctx, llm, prompts[:warmup_requests], [4] * min(warmup_requests, num_requests),
                        sampling=sampling)
    runs: dict[str, list[dict]] = {"greedy": [], "sampled": []}
    for _ in range(max(1, rounds)):  # alternating: a cold first step (a prefill shape seen first) costs both alike
        runs["greedy"].append(_timed_generate(ctx, llm, prompts, output_lens, keep_token_ids=True))
        runs["sampled"].append(_timed_generate(ctx, llm, prompts, output_lens, sampling=sampling,
                                               keep_token_ids=True))
    greedy, sampled = runs["greedy"][-1], runs["sampled"][-1]  # the headline: the last (warmest) round
    differ = sum(g != s for g, s in zip(greedy["token_ids"], sampled["token_ids"]))
    repeatable = all(r["token_ids"] == sampled["token_ids"] for r in runs["sampled"])  # per-request seeds
    for run_ in runs["greedy"] + runs["sampled"]:
        del run_["token_ids"]
    mb = ctx.model_bytes()
    bound = workload_decode_bound(mb, ctx.bandwidth()["bytes_per_s"], [len(p) for p in prompts], output_lens,
                                  llm.runtime.config.max_num_seqs)
    result = ctx.metadata("sampling")
    result.update(
        {
            "workload": {"num_requests": num_requests, "prompt_len_range": [min_prompt_len, max_prompt_len],
                         "output_len_range": [min_output_len, max_output_len], "seed": seed,
                         "prompt_tokens": sum(len(p) for p in prompts), "output_tokens": sum(output_lens),
                         "token_ids": "random in [0, min(10000, vocab-1)]", "ignore_eos": True,
                         "sampling": {**sampling, "seed": "request index"}},
            "greedy": greedy,
            "sampled": sampled,
            "rounds": {kind: [r["output_tok_s"] for r in rs] for kind, rs in runs.items()},
            "sampled_over_greedy": ratio(sampled["output_tok_s"], greedy["output_tok_s"]),
            "sampled_requests_differing_from_greedy": differ,
            "sampled_tokens_repeat_across_rounds": repeatable,
            "bound": bound,
            "fraction_of_bound": {"greedy": greedy["output_tok_s"] / bound["output_tok_s"],
                                  "sampled": sampled["output_tok_s"] / bound["output_tok_s"]},
        }
    )
    ctx.write("sampling", result)
    return result


def summary_lines(head: str, r: dict) -> list[str]:
    g, s, w = r["greedy"], r["sampled"], r["workload"]
    p = w["sampling"]
    return [f"{head} {g['requests']} req: greedy {g['output_tok_s']:,.0f} output tok/s ({g['wall_s']:.1f} s) | "
            f"sampled (T {p['temperature']}, top_p {p['top_p']}, top_k {p['top_k']}"
            f"{''.join(f', {k} {p[k]}' for k in NEUTRAL_PENALTIES if k in p)}) {s['output_tok_s']:,.0f} "
            f"tok/s ({s['wall_s']:.1f} s) | sampled/greedy {r['sampled_over_greedy']:.3f} | bound "
            f"{r['bound']['output_tok_s']:,.0f} tok/s | {r['sampled_requests_differing_from_greedy']} of "
            f"{g['requests']} sampled outputs differ from greedy"
            + (f" | first round: greedy {r['rounds']['greedy'][0]:,.0f}, sampled {r['rounds']['sampled'][0]:,.0f} "
               "tok/s" if len(r["rounds"]["sampled"]) > 1 else "")]

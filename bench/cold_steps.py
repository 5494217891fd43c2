"""Which kernel variants a served burst still compiles after start-up, and what that costs its first requests.

    TRITON_CACHE_DIR=$(mktemp -d) python3 bench/cold_steps.py --model qwen3.5-0.8b --out /tmp/cold_steps

Start-up (the memory plan's steps, the captured graphs) is meant to meet every Triton kernel variant a served step
needs, so that none compiles in the middle of a request. Triton compiles a variant per class of each integer
argument (1, a multiple of 16, anything else) and per pointer alignment, and FLA's autotuned kernels time their
configs on a key's first call: a variant start-up never met costs the step that first meets it a compile (and a
tune), seconds where the step takes milliseconds. Run it on an empty Triton cache: a variant found on disk loads in
milliseconds and hides what a new machine pays.

After start-up this installs Triton's ``jit_cache_hook`` (called where a kernel meets a variant its process has not
compiled yet) and sends bursts of requests through ``LLM.generate``: ``--bursts`` gives each as ``PxT`` (P requests
arriving together, prompts of T tokens), in each of ``--modes`` (greedy; sampled with top-k and top-p, temperature
alone, top-p alone, top-k alone; top-p with presence, frequency and repetition penalties; top-k with every token
under ``min_tokens``, whose decode rows leave the graph), each for ``--max-tokens``
tokens. For each burst it reports the wall ms of its first run and of a second run of fresh prompts
of the same shape, and the variants that compiled during the first (kernel and argument types).
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from pathlib import Path

import triton

from bench.common import Context, Options, random_prompt, write_json
from compiled_engine import SamplingParams

DEFAULT_BURSTS = "1x512,2x512,4x512,8x512,12x512,16x512,24x512,32x512,64x128,3x3000,1x8192"


class VariantLog:
    """Every Triton kernel variant compiled in this process from ``install`` on (name and argument types)."""

    def __init__(self):
        self.seen: list[str] = []

    def install(self) -> None:
        triton.knobs.runtime.jit_cache_hook = self._hook

    def _hook(self, **kwargs):
        self.seen.append(kwargs["repr"])
        return None  # go on compiling

    def since(self, mark: int) -> list[str]:
        return self.seen[mark:]


def _parse(burst: str) -> tuple[int, int]:
    requests, tokens = burst.split("x")
    return int(requests), int(tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3.5-0.8b")
    p.add_argument("--bursts", default=DEFAULT_BURSTS, help="comma-separated PxT")
    p.add_argument("--modes", default="greedy,sampled,temperature,top_p,top_k,penalties,min_tokens",
                   help="comma-separated sampling settings, each burst in each")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--max-num-seqs", type=int, default=None, help="the engine's (default: the largest burst)")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run (no Triton kernels there)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    bursts = [_parse(b) for b in args.bursts.split(",") if b]
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    ctx = Context(Options(model=args.model, device=args.device, dtype=dtype, max_num_seqs=args.max_num_seqs))
    ctx.require(max(r for r, _ in bursts), max(t for _, t in bursts) + args.max_tokens + 16)
    start = time.perf_counter()
    llm = ctx.llm()
    print(f"engine built in {time.perf_counter() - start:.1f} s")
    variants = VariantLog()
    variants.install()
    vocab = llm.runtime.model_config.vocab_size
    rng = random.Random(0)
    common = dict(max_tokens=args.max_tokens, ignore_eos=True, seed=0)
    modes = {"greedy": SamplingParams(temperature=0.0, **common),
             "sampled": SamplingParams(temperature=0.8, top_p=0.95, top_k=50, **common),
             "temperature": SamplingParams(temperature=1.0, **common),
             "top_p": SamplingParams(temperature=0.7, top_p=0.9, **common),
             "top_k": SamplingParams(temperature=0.7, top_k=20, **common),
             "penalties": SamplingParams(temperature=0.7, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.5,
                                         repetition_penalty=1.1, **common),
             # stop tokens kept (no ignore_eos) and suppressed to the end: every decode row leaves the graph
             "min_tokens": SamplingParams(temperature=0.7, top_k=20, min_tokens=args.max_tokens,
                                          **dict(common, ignore_eos=False))}
    modes = {name: modes[name] for name in args.modes.split(",")}
    rows = []
    for requests, tokens in bursts:
        for mode, params in modes.items():
            times, compiled = [], []
            for _ in range(2):
                prompts = [random_prompt(rng, tokens, vocab) for _ in range(requests)]
                mark = len(variants.seen)
                ctx.sync()
                t0 = time.perf_counter()
                llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
                ctx.sync()
                times.append((time.perf_counter() - t0) * 1e3)
                compiled.append(variants.since(mark))
            row = {"burst": f"{requests}x{tokens}", "mode": mode, "first_ms": times[0], "again_ms": times[1],
                   "compiled_first": compiled[0], "compiled_again": compiled[1]}
            rows.append(row)
            print(f"{row['burst']:>8} {mode:>11}: first {times[0]:9.1f} ms, again {times[1]:8.1f} ms, "
                  f"{len(compiled[0])} variants compiled in the first ({len(compiled[1])} in the second)", flush=True)
            for name in compiled[0] + compiled[1]:
                print(f"         {name[:400]}")
    if args.out:
        write_json(Path(args.out) / "cold_steps.json", {"max_tokens": args.max_tokens, "rows": rows})


if __name__ == "__main__":
    main()

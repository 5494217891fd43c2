"""What a prompt step of several sequences costs against one of one sequence, and what capturing them does.

    python3 bench/prompt_steps.py --model qwen3.5-0.8b --out /tmp/prompt_steps
    python3 bench/prompt_steps.py --model qwen3.5-0.8b --max-prefill-capture-seqs 1 --out /tmp/one_seq   # the A side
    python3 bench/prompt_steps.py --model qwen3.5-0.8b --mixed-decode-lanes 0 --out /tmp/chunked  # decode rows chunked

Several sequences share a step when prompts arrive together, and in every mixed step (``mixed_steps``, the
default): a new prompt's chunk beside the running requests' decode rows. The runtime replays a captured graph for
such a step up to ``max_prefill_capture_seqs`` sequences (graphs/prefill_graph.py); past that, or with
``--max-prefill-capture-seqs 1``, the step runs eagerly, its ~590 kernels launched one by one from Python. A mixed
step's decode rows go through the linear layers' decode kernels (``--mixed-decode-lanes``, 16 by default: that many
in a captured step; 0: through the chunked path as a prompt's tokens). For each shape ``P x T + D`` (P new prompts
of T tokens and D decode rows, each row one token of a sequence that already holds ``--context`` tokens) this times
``Runtime.prefill`` on that step as the engine would run it, decode rows first (``step ms``: wall ms
from the call to its logits on the host, median of ``--repeats``), beside the same step with its decode rows last
(``rows last ms``: rows that do not lead the step take the chunked path, in a key without decode lanes: the step as
``--mixed-decode-lanes 0`` runs it), the step of one sequence of the same total tokens (captured, where a bucket
holds it) and the decode graph of D rows: an eager step costs its launches where a captured one costs its GPU
work. ``--shapes ''`` times no step (a served stream alone).

``--serve C``: then what it does to a served stream. A closed loop keeps C requests in flight through
``LLMEngine.add_request`` / ``step`` (``--requests`` in all, one more as each finishes), prompts of ``--input-len``
tokens, greedy outputs of a length drawn uniformly from [``--output-len`` / 2, 3 ``--output-len`` / 2] (ignore_eos),
so that requests finish and arrive one at a time, each arrival's prompt in a mixed step beside the others' decode
rows (bench/cookbook.py's ``serve`` loop, each request's output length its own). It reports what that loop
measures: output tok/s, TTFT, TPOT and ITL (the gap between a request's successive tokens) at p50 / p99, and the
steps by kind. ``--max-prefill-capture-seqs 1`` gives the engine that captures steps of one sequence only.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import time
from pathlib import Path

import torch

from bench.common import Context, Options, random_prompt
from bench.cookbook import serve

# (new prompts, tokens each, decode rows)
DEFAULT_SHAPES = "1x256+15,1x1024+15,1x256+63,1x2048+63,4x128+0,16x64+0,2x1024+0"


def _parse(shape: str) -> tuple[int, int, int]:
    prompts, rest = shape.split("x")
    tokens, rows = rest.split("+")
    return int(prompts), int(tokens), int(rows)


def _wall_ms(ctx: Context, fn, repeats: int) -> float:
    """Median wall ms of ``fn`` (which reads its result back to the host), the device idle before each call."""
    times = []
    for _ in range(repeats):
        ctx.sync()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def _shape(ctx: Context, runtime, prompts: int, tokens: int, rows: int, context: int, repeats: int,
           rng: random.Random) -> dict:
    vocab = runtime.model_config.vocab_size
    decoding = [runtime.add_sequence(random_prompt(rng, context, vocab)) for _ in range(rows)]
    try:
        for seq in decoding:
            runtime.prefill([seq])
            seq.token_ids.append(rng.randrange(vocab))

        def mixed(rows_first: bool = True):
            fresh = [runtime.add_sequence(random_prompt(rng, tokens, vocab)) for _ in range(prompts)]
            try:
                if rows_first:
                    runtime.prefill([*decoding, *fresh], [1] * rows + [tokens] * prompts).argmax(-1).tolist()
                else:
                    runtime.prefill([*fresh, *decoding], [tokens] * prompts + [1] * rows).argmax(-1).tolist()
            finally:
                for seq in fresh:
                    runtime.release(seq)
            for seq in decoding:
                seq.token_ids.append(rng.randrange(vocab))

        def single():
            seq = runtime.add_sequence(random_prompt(rng, prompts * tokens + rows, vocab))
            try:
                runtime.prefill([seq]).argmax(-1).tolist()
            finally:
                runtime.release(seq)

        def decode():
            runtime.decode(decoding).tokens.tolist()
            for seq in decoding:
                seq.token_ids.append(rng.randrange(vocab))

        def rows_last():
            mixed(rows_first=False)

        for fn in (mixed, rows_last, single):
            fn()  # compiles / autotunes outside the timing
        row = {"shape": f"{prompts}x{tokens}+{rows}", "tokens": prompts * tokens + rows,
               "step_ms": _wall_ms(ctx, mixed, repeats), "rows_last_ms": _wall_ms(ctx, rows_last, repeats),
               "one_sequence_ms": _wall_ms(ctx, single, repeats)}
        if rows:
            decode()
            row["decode_graph_ms"] = _wall_ms(ctx, decode, repeats)
        return row
    finally:
        for seq in decoding:
            runtime.release(seq)


def _serve(ctx: Context, llm, concurrency: int, requests: int, input_len: int, output_len: int, seed: int) -> dict:
    """The served stream: bench/cookbook.py's closed loop, with each request's output length its own."""
    rng = random.Random(seed)
    vocab = llm.runtime.model_config.vocab_size
    prompts = [random_prompt(rng, input_len, vocab) for _ in range(requests)]
    lengths = [rng.randint(max(1, output_len // 2), output_len * 3 // 2) for _ in range(requests)]
    cell = serve(ctx, llm.engine, prompts, lengths, concurrency, tag=f"prompt-steps-c{concurrency}")
    return {"concurrency": concurrency, "requests": requests, "input_len": input_len, "output_len": output_len,
            **{k: v for k, v in cell.items() if not k.endswith("_per_request")}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3.5-0.8b")
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated PxT+D")
    p.add_argument("--context", type=int, default=512, help="tokens each decode row's sequence holds")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run (no graphs there)")
    p.add_argument("--max-prefill-capture-seqs", type=int, default=None, help="the engine's (default: its own)")
    p.add_argument("--mixed-decode-lanes", type=int, default=None, help="the engine's (default: its own)")
    p.add_argument("--serve", type=int, default=0, help="also a served stream at this concurrency (0: none)")
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--out", default=None)
    p.add_argument("-v", "--verbose", action="store_true", help="the engine's INFO log (the prompt steps' capture time)")
    args = p.parse_args()
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    shapes = [_parse(s) for s in args.shapes.split(",") if s]
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    ctx = Context(Options(model=args.model, device=args.device, dtype=dtype,
                          max_prefill_capture_seqs=args.max_prefill_capture_seqs,
                          mixed_decode_lanes=args.mixed_decode_lanes))
    if shapes:
        ctx.require(max(p + r for p, _, r in shapes), max(args.context + 4 * args.repeats + 64,
                                                         max(p * t + r for p, t, r in shapes) + 64))
    if args.serve:
        ctx.require(args.serve, args.input_len + args.output_len * 3 // 2 + 16)
    start = time.perf_counter()
    llm = ctx.llm()
    runtime = llm.runtime
    graphs = runtime.executor.prefill_graphs
    keys = [] if graphs is None else sorted(graphs.keys)
    print(f"engine built in {time.perf_counter() - start:.1f} s; captured prompt steps (tokens, sequences, decode "
          f"lanes): {keys}")
    rng = random.Random(0)
    rows = [_shape(ctx, runtime, *s, args.context, args.repeats, rng) for s in shapes]
    print(f"{'shape':>12} {'tokens':>7} {'step ms':>9} {'rows last ms':>13} {'one sequence ms':>16} "
          f"{'decode graph ms':>16}")
    for r in rows:
        print(f"{r['shape']:>12} {r['tokens']:7d} {r['step_ms']:9.2f} {r['rows_last_ms']:13.2f} "
              f"{r['one_sequence_ms']:16.2f} {r.get('decode_graph_ms', float('nan')):16.3f}")
    served = None
    if args.serve:
        served = _serve(ctx, llm, args.serve, args.requests, args.input_len, args.output_len, seed=1)
        ttft, itl = served["ttft_ms"], served["itl_ms"]
        print(f"served c={served['concurrency']}: {served['output_tok_s']:.0f} output tok/s, TTFT p50/p99 "
              f"{ttft['p50']:.1f} / {ttft['p99']:.1f} ms, ITL p50/p99 {itl['p50']:.2f} / {itl['p99']:.2f} ms, "
              f"steps {served['step_kinds']}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "prompt_steps.json").write_text(json.dumps(
            {"context": args.context, "max_prefill_capture_seqs": args.max_prefill_capture_seqs,
             "mixed_decode_lanes": args.mixed_decode_lanes,
             "captured_keys": keys, "rows": rows, "served": served}, indent=1))


if __name__ == "__main__":
    main()

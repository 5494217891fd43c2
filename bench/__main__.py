"""Command line of the benchmark harness.

    python -m bench latency --model qwen3.5-0.8b --vs-hf
    python -m bench latency,sweep,throughput --model qwen3.5-0.8b --vs-hf --hf-limit 128 --out /tmp/run
    python -m bench all --model tiny --device cpu -p throughput.num_requests=8
    python -m bench report /tmp/run /tmp/startup --out /tmp/merged

Several scenarios in one invocation share one engine (built once for the largest need) and one HF model. The
startup scenario runs first (its subprocesses then have the device to themselves); then every scenario's own
measurement; then, with ``--vs-hf``, every scenario's HF measurement; prefix (which builds engines with prefix
caching on and off) runs last. Each scenario writes ``<out>/<scenario>.json``
as soon as it has a result; a failing scenario writes its error there and the others still run (exit code 1).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import sys
import time
import traceback
from pathlib import Path

from bench import SCENARIOS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", help=f"one of {', '.join(SCENARIOS)}, a comma-separated list, 'all', or 'report'")
    p.add_argument("dirs", nargs="*", help="report: result folders to merge")
    p.add_argument("--model", default="tiny", help="tiny | qwen3.5-0.8b (random weights; qwen3.5-0.8b-confident: wide top-1 margins, for spec) | a checkpoint folder")
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--out", default=None, help="output folder (default: bench/results/<scenario>-<timestamp>)")
    p.add_argument("--vs-hf", action="store_true", help="also run the same requests through HF transformers")
    p.add_argument("--enforce-eager", action="store_true", help="no torch.compile / CUDA graphs")
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: what the scenarios need")
    p.add_argument("--max-model-len", type=int, default=None, help="default: what the scenarios need")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget of a prefill step (default: LLM's: 16384 on a GPU of 70 GiB or more, else 8192)")
    p.add_argument("--num-kv-blocks", type=int, default=None, help="default: the runtime's memory plan")
    p.add_argument("--max-prefill-capture-tokens", type=int, default=None,
                   help="the largest prompt step replayed from a CUDA graph (0: none; default: the runtime's, 8192)")
    p.add_argument("--max-prefill-capture-seqs", type=int, default=None,
                   help="the most sequences of a prompt or mixed step replayed from a CUDA graph (1: steps of one "
                        "sequence only; default: the runtime's, 256)")
    p.add_argument("--mixed-decode-lanes", type=int, default=None,
                   help="a mixed step's decode rows through the linear layers' decode kernels, this many in a captured "
                        "step (0: through the chunked path; default: the runtime's, 16)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="shard our engine over N GPUs")
    p.add_argument("--enable-prefix-caching", action="store_true", help="prefix caching on in every scenario")
    p.add_argument("--no-overlap-decode", dest="overlap_decode", action="store_false",
                   help="LLM(overlap_decode=False): read each step's tokens back before the next is built")
    p.add_argument("--no-mixed-steps", dest="mixed_steps", action="store_false",
                   help="LLM(mixed_steps=False): prefill steps go first; decoding sequences wait for them")
    p.add_argument("--kv-growth-reserve", type=float, default=None,
                   help="LLM(kv_growth_reserve=...): share of the running sequences' growth that admission keeps free "
                        "(default: LLM's, 1)")
    p.add_argument("--speculative-config", type=json.loads, default=None, metavar="JSON",
                   help='LLM(speculative_config=...) for every scenario\'s engine, e.g. '
                        '\'{"method": "mtp", "num_speculative_tokens": 2}\' (the spec scenario builds its own)')
    p.add_argument("--state-dtype", default=None, choices=["float32", "bfloat16"],
                   help="LLM(state_dtype=...): the recurrent state pool's dtype (default: the checkpoint's "
                        "mamba_ssm_dtype, float32 when it names none; bfloat16 halves the state's bytes, as vLLM's "
                        "--mamba-ssm-cache-dtype and SGLang's --mamba-ssm-dtype)")
    p.add_argument("--bandwidth-mib", type=int, default=None, help="copy-bandwidth buffer (default 1024 cuda, 64 cpu)")
    p.add_argument("--hf-limit", type=int, default=None, help="HF runs only the first N requests of a workload")
    p.add_argument("--hf-batch-size", type=int, default=64, help="HF pad-left batch size")
    p.add_argument("--ours-from", default=None, metavar="DIR",
                   help="with --vs-hf: our side of each scenario from DIR/<scenario>.json, an earlier run of the same "
                        "model and parameters, instead of running it (HF alone runs; e.g. a large model whose build "
                        "and HF run do not fit one device call)")
    p.add_argument("--hf-max-time", type=float, default=None,
                   help="seconds: HF starts no batch past this and cuts a running one (reported as truncated)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="[SCENARIO.]NAME=VALUE",
                   help="a scenario size, e.g. -p latency.new_tokens=8 or -p batches=1,2 (repeatable)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def earlier_result(folder: Path, scenario: str, model: str) -> dict:
    """``--ours-from``: a scenario's result as an earlier run wrote it, checked to be of the same model."""
    path = folder / f"{scenario}.json"
    if not path.is_file():
        raise SystemExit(f"--ours-from: no {path}")
    result = json.loads(path.read_text())
    if result.get("model", {}).get("name") != model:
        raise SystemExit(f"--ours-from: {path} is of model {result.get('model', {}).get('name')!r}, not {model!r}")
    result["ours_from"] = str(path)
    return result


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    if "," in text:
        return [parse_value(part) for part in text.split(",") if part]
    return text


def scenario_kwargs(names: list[str], modules: dict, params: list[str]) -> dict[str, dict]:
    """``-p`` values routed to each scenario's ``run``/``run_hf`` keyword arguments; unknown names raise."""
    accepted = {
        n: {k for fn in (getattr(modules[n], "run"), getattr(modules[n], "run_hf", None)) if fn
            for k, v in inspect.signature(fn).parameters.items()
            if k not in ("ctx", "result") and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)}
        for n in names
    }
    kwargs: dict[str, dict] = {n: {} for n in names}
    for item in params:
        if "=" not in item:
            raise SystemExit(f"-p {item!r}: expected NAME=VALUE or SCENARIO.NAME=VALUE")
        key, value = item.split("=", 1)
        scenario, _, name = key.rpartition(".")
        targets = [scenario] if scenario else [n for n in names if name in accepted[n]]
        if scenario and scenario not in names:
            raise SystemExit(f"-p {item!r}: scenario {scenario!r} is not part of this run ({', '.join(names)})")
        if not targets or any(name not in accepted[t] for t in targets):
            raise SystemExit(f"-p {item!r}: no scenario of this run takes {name!r} "
                             f"(accepted: {', '.join(f'{n}: {sorted(a)}' for n, a in accepted.items())})")
        for t in targets:
            kwargs[t][name] = parse_value(value)
    return kwargs


def _split(fn, kwargs: dict) -> dict:
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    if args.scenario == "report":
        from bench.report import report

        if not args.dirs or not args.out:
            raise SystemExit("usage: python -m bench report DIR [DIR ...] --out DIR")
        return report(args.dirs, args.out)
    if args.dirs:
        raise SystemExit(f"unexpected arguments {args.dirs}")
    names = list(SCENARIOS) if args.scenario == "all" else [s for s in args.scenario.split(",") if s]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise SystemExit(f"unknown scenario(s) {unknown}: choose from {', '.join(SCENARIOS)}, 'all' or 'report'")
    names = sorted(dict.fromkeys(names), key=lambda n: n != "startup")  # startup first: a quiet device
    modules = {n: importlib.import_module(f"bench.{n}") for n in names}
    kwargs = scenario_kwargs(names, modules, args.param)
    return run(names, modules, kwargs, args, argv)


def run(names, modules, kwargs, args, argv) -> int:
    from bench.common import Context, Options, default_out_dir
    from bench.report import header, summary_lines

    if args.ours_from and not args.vs_hf:
        raise SystemExit("--ours-from takes our results from an earlier run for --vs-hf; without --vs-hf nothing runs")

    out = args.out or str(default_out_dir("-".join(names) if len(names) < len(SCENARIOS) else "all"))
    opts = Options(
        model=args.model, device=args.device, dtype=args.dtype, enforce_eager=args.enforce_eager, vs_hf=args.vs_hf,
        out=out, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens, num_kv_blocks=args.num_kv_blocks,
        max_prefill_capture_tokens=args.max_prefill_capture_tokens,
        max_prefill_capture_seqs=args.max_prefill_capture_seqs, mixed_decode_lanes=args.mixed_decode_lanes,
        tensor_parallel_size=args.tensor_parallel_size, enable_prefix_caching=args.enable_prefix_caching,
        overlap_decode=args.overlap_decode, mixed_steps=args.mixed_steps, kv_growth_reserve=args.kv_growth_reserve,
        speculative_config=args.speculative_config, state_dtype=args.state_dtype,
        bandwidth_mib=args.bandwidth_mib, hf_limit=args.hf_limit, hf_batch_size=args.hf_batch_size,
        hf_max_time=args.hf_max_time, argv=argv,
    )
    ctx = Context(opts)
    for n in names:  # one engine for the largest need of the run
        ctx.require(*modules[n].requirements(**kwargs[n]))
    results: dict[str, dict] = {}
    failed = False

    def attempt(name: str, fn, *a) -> None:
        nonlocal failed
        start = time.perf_counter()
        try:
            results[name] = fn(ctx, *a, **_split(fn, kwargs[name]))
            key = "elapsed_s" if fn.__name__ == "run" else "hf_elapsed_s"
            results[name][key] = time.perf_counter() - start  # harness time, for budgeting runs
            ctx.write(name, results[name])
        except Exception as e:  # keep going: one broken scenario must not lose the others' numbers
            failed = True
            print(f"[bench] {name} ({fn.__name__}) failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            message, trace = f"{type(e).__name__}: {e}", traceback.format_exc()
            if fn.__name__ == "run_hf":  # our numbers stand; only the comparison is missing
                results[name].update({"hf_error": message, "hf_traceback": trace})
            else:
                results[name] = {**ctx.partial(name), "scenario": name, "error": message, "traceback": trace}
            ctx.write(name, results[name])

    try:
        # Scenarios that build engines of their own (prefix: caching on/off) go last, after every HF part, so the
        # shared engine is built once.
        shared = [n for n in names if not getattr(modules[n], "OWN_ENGINES", False)]
        for name in shared:
            if args.ours_from:
                results[name] = earlier_result(Path(args.ours_from), name, ctx.model.name)
                continue
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            attempt(name, modules[name].run)
        if args.vs_hf:
            for name in shared:
                run_hf = getattr(modules[name], "run_hf", None)
                if run_hf is not None and "error" not in results[name]:
                    print(f"[bench] {name} vs HF ...", file=sys.stderr, flush=True)
                    attempt(name, run_hf, results[name])
        for name in names:
            if name not in shared:
                print(f"[bench] {name} ...", file=sys.stderr, flush=True)
                attempt(name, modules[name].run)
    finally:  # TP workers sit in a collective until told to stop: an exit without close() hung (run_tp2, 2026-11-29)
        ctx.release_llm()
    lines = header(results) + summary_lines(results)
    print("\n".join(lines))
    print(f"[bench] results in {out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

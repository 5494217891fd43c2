"""Command line.

    python -m compiled_engine generate --prompt "..." [--model PATH] [options]
    python -m compiled_engine serve [MODEL] --host 127.0.0.1 --port 8000 [engine knobs]   (compiled_engine/server.py)

With no model it runs the embedded tiny default model (built on first use into a cache folder).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from compiled_engine.llm import LLM
from compiled_engine.sampling_params import SamplingParams


SPECULATIVE_HELP = ('MTP speculative decoding, vLLM\'s JSON: \'{"method": "mtp", "num_speculative_tokens": 2}\' '
                    "(optional disable_by_batch_size, draft_vocab_size, auto_disable)")


def speculative_config(text: str) -> dict:
    """``--speculative-config``'s JSON object (its keys are checked by the runtime)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m compiled_engine", description=__doc__)
    # The engine flags both commands take (engine_kwargs passes them on).
    engine = argparse.ArgumentParser(add_help=False)
    engine.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    engine.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    engine.add_argument("--max-model-len", type=int, default=None)
    engine.add_argument("--max-num-seqs", type=int, default=256)
    engine.add_argument("--enforce-eager", action="store_true", help="no torch.compile / CUDA graphs")
    engine.add_argument("--speculative-config", type=speculative_config, default=None, metavar="JSON",
                        help=SPECULATIVE_HELP)
    engine.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", parents=[engine], help="generate text for one or more prompts")
    gen.add_argument("--model", default=None, help="checkpoint folder (default: the embedded tiny model)")
    gen.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")

    srv = sub.add_parser("serve", parents=[engine], help="an OpenAI-compatible HTTP server (compiled_engine/server.py)")
    srv.add_argument("model", nargs="?", default=None, help="checkpoint folder (default: the embedded tiny model)")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--served-model-name", default=None, help="the name clients pass as `model` (default: MODEL)")
    srv.add_argument("--max-waiting", type=int, default=None,
                     help="requests waiting for admission beyond this get 503 (default: no limit)")
    srv.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=None,
                     help="run the engine loop in a process of its own (no GIL shared with the HTTP server); "
                          "default: on when the engine runs on CUDA, off (a thread) on the CPU")
    srv.add_argument("--stream-interval", type=int, default=1,
                     help="stream a request's tokens every N tokens after its first (fewer, larger chunks)")
    srv.add_argument("--max-num-batched-tokens", type=int, default=None)
    srv.add_argument("--num-kv-blocks", type=int, default=None)
    srv.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    srv.add_argument("--tensor-parallel-size", type=int, default=1)
    srv.add_argument("--enable-prefix-caching", action="store_true")
    srv.add_argument("--no-overlap-decode", dest="overlap_decode", action="store_false")
    srv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return generate(args) if args.command == "generate" else serve(args)
    except (ValueError, FileNotFoundError, NotImplementedError) as error:  # bad input: a message, not a traceback
        print(f"error: {error}", file=sys.stderr)
        return 2


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The LLM knobs of the flags both commands take."""
    return dict(device=args.device, dtype=args.dtype, enforce_eager=True if args.enforce_eager else None,
                max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                speculative_config=args.speculative_config)


def generate(args: argparse.Namespace) -> int:
    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    llm = LLM(args.model, **engine_kwargs(args))
    start = time.perf_counter()
    outputs = llm.generate(args.prompt, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.token_ids) for o in outputs)
    for prompt, out in zip(args.prompt, outputs):
        print(f"prompt: {prompt!r}")
        print(f"output: {out.text!r}  ({len(out.token_ids)} tokens, finish_reason={out.finish_reason})")
    print(f"{generated} tokens in {elapsed:.2f} s: {generated / elapsed:.1f} tokens/s")
    return 0


def serve(args: argparse.Namespace) -> int:
    try:
        from compiled_engine import server  # FastAPI and uvicorn only when serving
    except ModuleNotFoundError as error:
        raise SystemExit(f"serve needs the server's packages ({error.name} is missing): "
                         "pip install -e '.[serve]'") from error

    app = server.build_server(
        args.model,
        served_model_name=args.served_model_name,
        max_waiting=args.max_waiting,
        stream_interval=args.stream_interval,
        engine_process=args.engine_process,
        **engine_kwargs(args),
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_kv_blocks=args.num_kv_blocks,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
        enable_prefix_caching=args.enable_prefix_caching,
        overlap_decode=args.overlap_decode,
    )
    server.serve(app, args.host, args.port, args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())

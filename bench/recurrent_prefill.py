"""recurrent_prefill: where ``ce::gated_delta_rule_prefill``'s recurrent form (FLA's one-kernel walk, token by token)
stops paying against its chunked form (FLA's seven kernels, chunks of 64 tokens), and what the choice does to a
prompt's time to first token. Both forms run in one process: ``RECURRENT_PREFILL_MAX_TOKENS``
(ops/triton/delta_rule_kernels.py) is set around each measurement.

  * ``op``: the op alone on the Qwen3.5-0.8B linear layers' shapes (16 key and 16 value heads of 128), bf16, fp32
    state pool, with the step fields pack_step hands it (``cu_seqlens_long``, ``chunk_indices``): one sequence of T
    tokens, and 8 sequences of T / 8. ``wall_us``: a call's share of 18 calls in a row (a prompt step's GDN layers,
    nothing synchronising between them): what the host and the GPU together take, eager; ``gpu_us``: the same 18
    calls captured in one CUDA graph, the median of 10 replays (the GPU's time alone).
  * ``ttft``: ``LLM.generate`` of one prompt of T tokens with ``max_tokens=1`` (its wall time is the time to first
    token: admission, the eager prompt step, the first token's read-back), on the 0.8B shape with random weights,
    eager decode (no decode graph is needed for one token); median of ``--repeats``. Then ``captured``: the same
    with the prompt steps captured (``ModelExecutor.compile_prefill``, what a compiled runtime does at start-up:
    graphs/prefill_graph.py), for the T its buckets hold; a captured step takes the chunked form at every length
    (``StepInputs.graphed``), whatever the limit.

    python bench/recurrent_prefill.py --out DIR [--tokens 16,64,128,256,512,1024,2048] [--repeats 5]

DIR/recurrent_prefill.json has every number; the log prints them as they come.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.attention_prefill_sweep import time_ms  # noqa: E402
from ops import delta_rule  # noqa: E402  (registers the ce ops)
from ops.triton import delta_rule_kernels  # noqa: E402

FORMS = {"chunked": 0, "recurrent": 1 << 30}  # RECURRENT_PREFILL_MAX_TOKENS forcing each form
LAYERS = 18  # the 0.8B model's linear (GDN) layers: the op's calls in one prompt step


@contextlib.contextmanager
def _form(name: str):
    old = delta_rule_kernels.RECURRENT_PREFILL_MAX_TOKENS
    delta_rule_kernels.RECURRENT_PREFILL_MAX_TOKENS = FORMS[name]
    try:
        yield
    finally:
        delta_rule_kernels.RECURRENT_PREFILL_MAX_TOKENS = old


def _op_inputs(lengths: list[int], gen: torch.Generator) -> tuple:
    heads, dim, dev = 16, 128, "cuda"
    tokens = sum(lengths)

    def randn(*shape, scale=1.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(dtype)

    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    cu = torch.tensor(bounds, dtype=torch.int32, device=dev)
    cu_long = cu.long()
    chunks = torch.tensor(delta_rule.host_chunk_indices(bounds), dtype=torch.long, device=dev).view(-1, 2)
    slots = torch.arange(1, len(lengths) + 1, dtype=torch.int32, device=dev)
    state = randn(len(lengths) + 1, heads, dim, dim, scale=0.3, dtype=torch.float32)
    args = (randn(tokens, heads, dim), randn(tokens, heads, dim), randn(tokens, heads, dim), randn(tokens, heads),
            randn(tokens, heads), randn(heads, scale=0.5, dtype=torch.float32),
            randn(heads, dtype=torch.float32))
    return args, state, cu, slots, cu_long, chunks


def _time_op(lengths: list[int], gen: torch.Generator) -> dict:
    args, state, cu, slots, cu_long, chunks = _op_inputs(lengths, gen)
    op = torch.ops.ce.gated_delta_rule_prefill

    work = state.clone()  # the timed calls' pool: each form's checked call starts from ``state`` itself

    def layers():
        for _ in range(LAYERS):
            op(*args, work, cu, slots, cu_long, chunks)

    row = {"tokens": sum(lengths), "sequences": len(lengths)}
    outputs = {}
    for name in FORMS:
        with _form(name):
            s = state.clone()
            outputs[name] = (op(*args, s, cu, slots, cu_long, chunks), s)  # also warms FLA's autotuner
            layers()
            torch.cuda.synchronize()
            walls = []
            for _ in range(5):
                start = time.perf_counter()
                layers()
                torch.cuda.synchronize()
                walls.append((time.perf_counter() - start) / LAYERS * 1e6)
            gpu = None
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    layers()
                gpu = time_ms(graph.replay, repeats=10) * 1e3 / LAYERS  # the median replay, µs a call
            except Exception as e:  # noqa: BLE001 - a form that cannot be captured keeps its wall time
                print(f"  {name}: no CUDA graph ({type(e).__name__}: {e})", flush=True)
            row[name] = {"wall_us": min(walls), "gpu_us": gpu}
    (o_c, s_c), (o_r, s_r) = outputs["chunked"], outputs["recurrent"]
    row["max_abs_diff"] = {"out": (o_c.float() - o_r.float()).abs().max().item(),
                           "state": (s_c - s_r).abs().max().item()}
    return row


def _ttft(tokens: list[int], repeats: int) -> dict:
    from bench.common import random_prompt
    from bench.models import device_llm, resolve_model
    from compiled_engine.llm import LLM
    from compiled_engine.sampling_params import SamplingParams
    from graphs import prefill_buckets

    spec = resolve_model("qwen3.5-0.8b", "cuda")
    kwargs = dict(device="cuda", dtype="bfloat16", enforce_eager=True, max_num_seqs=1,
                  max_model_len=max(tokens) + 16)
    llm = device_llm(spec.path, **kwargs) if spec.on_device else LLM(spec.path, **kwargs)
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rows = []
    for n in tokens:
        row = {"tokens": n}
        for name in FORMS:
            with _form(name):
                times = []
                for _ in range(repeats + 1):  # the first: warm-up (FLA's autotuner at a new shape)
                    prompt = random_prompt(rng, n, llm.engine.runtime.model_config.vocab_size)
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    llm.generate([prompt], params, use_tqdm=False)
                    times.append((time.perf_counter() - start) * 1e3)
                row[name] = {"ttft_ms": statistics.median(times[1:]), "all_ms": times[1:]}
        rows.append(row)
        print(f"  ttft T={n}: chunked {row['chunked']['ttft_ms']:.1f} ms, recurrent {row['recurrent']['ttft_ms']:.1f} ms",
              flush=True)
    runtime = llm.engine.runtime
    buckets = prefill_buckets(runtime.config.max_prefill_capture_tokens, runtime.config.max_num_batched_tokens,
                              runtime.max_model_len)
    start = time.perf_counter()
    runtime.executor.compile_prefill(buckets)
    capture_s = time.perf_counter() - start
    for row in rows:
        if row["tokens"] > buckets[-1]:
            continue
        times = []
        for _ in range(repeats + 1):
            prompt = random_prompt(rng, row["tokens"], runtime.model_config.vocab_size)
            torch.cuda.synchronize()
            start = time.perf_counter()
            llm.generate([prompt], params, use_tqdm=False)
            times.append((time.perf_counter() - start) * 1e3)
        row["captured"] = {"ttft_ms": statistics.median(times[1:]), "all_ms": times[1:]}
        print(f"  ttft T={row['tokens']}: captured {row['captured']['ttft_ms']:.1f} ms", flush=True)
    llm.close()
    return {"rows": rows, "buckets": buckets, "capture_s": capture_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", default="16,64,128,256,512,1024,2048")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-ttft", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    result = {"device": torch.cuda.get_device_name(), "layers": LAYERS, "op": [], "ttft": None}

    def save():
        (out / "recurrent_prefill.json").write_text(json.dumps(result, indent=2))

    gen = torch.Generator(device="cuda").manual_seed(0)
    for n in tokens:
        for lengths in ([n], [n // 8] * 8 if n >= 8 else None):
            if lengths is None:
                continue
            row = _time_op(lengths, gen)
            result["op"].append(row)
            save()
            c, r = row["chunked"], row["recurrent"]
            fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
            print(f"  op T={row['tokens']} in {row['sequences']}: wall µs a call chunked {fmt(c['wall_us'])} / "
                  f"recurrent {fmt(r['wall_us'])}; GPU {fmt(c['gpu_us'])} / {fmt(r['gpu_us'])}; max |diff| out "
                  f"{row['max_abs_diff']['out']:.2e} state {row['max_abs_diff']['state']:.2e}", flush=True)
    if not args.skip_ttft:
        result["ttft"] = _ttft(tokens, args.repeats)
        save()


if __name__ == "__main__":
    main()

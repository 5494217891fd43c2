"""The collectives of one tensor-parallel decode step, timed alone (GPU: NCCL; CPU: gloo).

A decode step of a sharded model (compiled_engine/distributed.py) does two all-reduces per layer on ``[batch,
hidden]`` in the model dtype (the row-parallel outputs of the mixer and of the MLP or MoE block), one more for the
vocab-parallel embedding lookup, and one all-gather of the vocab-parallel logits ``[batch, vocab / world]``. This runs exactly those, with torch.distributed's
functional collectives as the engine's compiled step does, for each batch size: on CUDA captured in one CUDA graph
per kind (the decode graph holds them the same way), replayed back to back and timed with CUDA events; on the CPU
eagerly. ``step_collectives_ms`` is what a step spends in them when nothing overlaps them: the share of the TP=2
step time that the weights' bandwidth bound does not count. Eager (uncaptured) times are reported beside: the host
cost of launching them one by one.

    python -m bench.allreduce_microbench --model qwen3.5-27b --batches 1,64,256 --out DIR [--world-size 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp

from compiled_engine.distributed import _all_gather

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def model_config(spec: str):
    """A bench model name (bench/models.py) or a checkpoint folder -> its ModelConfig, without building weights."""
    from bench.models import DEVICE_RANDOM_MODELS, NAMED_MODELS, resolve_model
    from compiled_engine.config import ModelConfig

    named = {**NAMED_MODELS, **DEVICE_RANDOM_MODELS}
    if spec in named:
        return ModelConfig.from_dict(named[spec])
    return ModelConfig.from_pretrained(resolve_model(spec).path)


def timed_ms(fn, device: torch.device, iters: int, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean ms of ``iters`` back-to-back calls (every rank runs the same loop)."""
    fn()
    samples = []
    for _ in range(repeats):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / iters)
        else:
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - start) * 1e3 / iters)
    return statistics.median(samples)


def captured(fn, device: torch.device):
    """``fn`` captured in a CUDA graph (warmed up first: NCCL's communicator is created on first use); the replay
    runs exactly the recorded collectives. On the CPU, ``fn`` itself."""
    if device.type != "cuda":
        return fn
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def rank_main(rank: int, world: int, init_file: str, args: dict, out_file: str) -> None:
    cuda = args["device"] == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    group, dtype = dist.group.WORLD, DTYPES[args["dtype"]]
    layers, hidden, vocab_shard = args["layers"], args["hidden"], -(-args["vocab"] // world)
    reduces = 2 * layers + 1  # the mixers', the MLPs', the embedding's
    rows = []
    for batch in args["batches"]:
        x = torch.randn(batch, hidden, device=device).to(dtype)
        logits = torch.randn(batch, vocab_shard, device=device).to(dtype)

        def all_reduces():
            for _ in range(reduces):
                funcol.wait_tensor(funcol.all_reduce(x, "sum", group))

        def all_gather():
            funcol.wait_tensor(_all_gather(logits, 0, group))

        iters, error = args["iters"], None
        try:
            reduce_fn, gather_fn = captured(all_reduces, device), captured(all_gather, device)
        except RuntimeError as failure:  # capture refused: the eager collectives are still worth timing
            reduce_fn, gather_fn, error = all_reduces, all_gather, repr(failure)[:300]
        reduce_ms = timed_ms(reduce_fn, device, iters)
        gather_ms = timed_ms(gather_fn, device, iters)
        eager_ms = timed_ms(lambda: (all_reduces(), all_gather()), device, max(1, iters // 4))
        reduce_bytes = batch * hidden * x.element_size()
        rows.append({
            "batch": batch,
            "all_reduces_per_step": reduces,
            "all_reduce_bytes": reduce_bytes,
            "all_reduce_us": reduce_ms * 1e3 / reduces,
            "all_reduce_algbw_GBps": reduce_bytes / (reduce_ms / reduces * 1e-3) / 1e9,
            "all_reduces_ms": reduce_ms,
            "all_gather_bytes": batch * vocab_shard * world * logits.element_size(),
            "all_gather_us": gather_ms * 1e3,
            "step_collectives_ms": reduce_ms + gather_ms,
            "eager_step_collectives_ms": eager_ms,
            "captured": cuda and error is None,
            "capture_error": error,
        })
    if rank == 0:
        Path(out_file).write_text(json.dumps(rows))
    # Done: exit without tearing the group down. A rank whose peer has already left can abort inside gloo's
    # teardown ("terminate called without an active exception"), which would fail a run whose numbers are in.
    dist.barrier()
    os._exit(0)


def run(model: str, batches: list[int], world_size: int = 2, device: str | None = None, dtype: str | None = None,
        iters: int = 50) -> dict:
    """Spawn ``world_size`` ranks, time the collectives of ``model``'s decode step at each batch; rank 0's times."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    if device == "cuda" and torch.cuda.device_count() < world_size:
        raise SystemExit(f"--world-size {world_size} needs that many GPUs; {torch.cuda.device_count()} visible")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off, as the engine keeps it
    config = model_config(model)
    args = dict(device=device, dtype=dtype, layers=config.num_hidden_layers, hidden=config.hidden_size,
                vocab=config.vocab_size, batches=list(batches), iters=iters)
    with tempfile.TemporaryDirectory() as work:
        init_file, out_file = os.path.join(work, "init"), os.path.join(work, "rows.json")
        mp.start_processes(rank_main, args=(world_size, init_file, args, out_file), nprocs=world_size,
                           start_method="spawn")
        rows = json.loads(Path(out_file).read_text())
    return {"scenario": "allreduce_microbench", "model": model, "world_size": world_size, "device": device,
            "dtype": dtype, "layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
            "vocab_size": config.vocab_size, "iters": iters, "rows": rows,
            "device_name": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3.5-0.8b", help="a bench model name or a checkpoint folder")
    p.add_argument("--batches", default="1,64,256")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--device", default=None, choices=["cuda", "cpu"])
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", default=None, help="folder for allreduce_<model>.json")
    args = p.parse_args(argv)
    result = run(args.model, [int(b) for b in args.batches.split(",") if b], args.world_size, args.device,
                 args.dtype, args.iters)
    for row in result["rows"]:
        print(json.dumps(row))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        name = Path(args.model).name if os.path.isdir(args.model) else args.model
        (Path(args.out) / f"allreduce_{name}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

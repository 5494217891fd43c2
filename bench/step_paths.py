"""The decode graph's critical path at several batch sizes, side by side: which kernels grow with the batch.

    python3 bench/step_paths.py --model qwen3.5-0.8b --batches 1,2,4,8,16 --context 512 --out /tmp/step_paths

For each batch B: B sequences with random ``context``-token prompts are prefilled, one decode step copies them into
the graph's static buffers, then the graph of B sequences is replayed back to back (``DecodeGraphRunner.replay_last``:
GPU time without the host's per-step work, as ``bench latency``'s graph row) and profiled. Each kernel is charged the
time from the previous kernel's end to its own end (bench/latency.py ``critical_path``), so a step's charges add up
to its span. Kernels are grouped by name (the grid differs with the batch); the table gives each group's charged µs a
step at every batch, largest growth over the first batch first. CUDA only. ``--gdn-launch`` runs every batch with one
GDN decode launch (gated_deltanet_kernels.DECODE_LAUNCHES replaced for the process): the launch rule's data in the
graph, where each kernel overlaps its neighbours. ``--max-splits`` does the same for the attention's split ceiling,
``--splits`` for its split count at given batches.
"""

from __future__ import annotations

import argparse
import math
import random
import re
from pathlib import Path

import torch

from bench.common import Context, Options, random_prompt, write_json
from bench.latency import profiled_critical_path
from ops.triton import attention_decode_kernels, gated_deltanet_kernels, paged_attention_kernels


def _group(kernel: str) -> str:
    """A kernel row's group: its name without the grid and without Triton's / Inductor's numeric suffixes."""
    name = kernel.split(" grid=")[0]
    return re.sub(r"_\d+$", "", name)[:60]


@torch.inference_mode()
def _paths(runtime, batch: int, context: int, replays: int, seed: int) -> dict:
    rng = random.Random(seed)
    seqs = [runtime.add_sequence(random_prompt(rng, context, runtime.model_config.vocab_size)) for _ in range(batch)]
    try:
        for seq, logits in zip(seqs, runtime.prefill(seqs)):
            seq.token_ids.append(int(logits.argmax()))
        runtime.decode(seqs)  # copies the live step into the graph's static buffers
        runner = runtime.decode_fn
        for _ in range(3):
            runner.replay_last(batch)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            runner.replay_last(batch)
        end.record()
        end.synchronize()
        path = profiled_critical_path(lambda: runner.replay_last(batch), 12)
    finally:
        for seq in seqs:
            runtime.release(seq)
    groups: dict[str, float] = {}
    for key, row in path.get("by_kernel", {}).items():
        groups[_group(key)] = groups.get(_group(key), 0.0) + row["charged_us_per_step"]
    return {"ms_per_step": start.elapsed_time(end) / replays, "span_us": path.get("span_us"),
            "kernels_per_step": path.get("kernels_per_step"), "groups_us": groups, "path": path}


def _gdn_launches(spec: str) -> tuple:
    """``--gdn-launch`` as a one-entry DECODE_LAUNCHES covering every batch (``unfused``: an entry no batch fits)."""
    if spec == "unfused":
        return ((0, None, 8, False, False),)
    parts = spec.split(":")
    split = parts[3:] == ["split"]
    if split:
        parts = parts[:3]
    if len(parts) != 3 or parts[2] not in ("0", "1") or not (parts[0] == "head" or parts[0].isdigit()) \
            or not parts[1].isdigit():
        raise SystemExit(f"--gdn-launch takes BLOCK_V:WARPS:PREFETCH[:split] (BLOCK_V 'head' or a number, PREFETCH 0 "
                         f"or 1, split: the V tiles over programs) or 'unfused', got {spec!r}")
    block_v, warps, prefetch = parts
    return ((1 << 30, None if block_v == "head" else int(block_v), int(warps), prefetch == "1", split),)


def _pairs(spec: str) -> list[tuple[int, int]]:
    """'A:B,C:D' -> [(A, B), (C, D)]."""
    return [tuple(int(x) for x in entry.split(":")) for entry in spec.split(",")]


def _override_splits(counts: dict[int, int]) -> None:
    """ce::attention_decode's split count from ``counts`` (batch -> splits) where it names the batch, else the rule's
    (for the process: the launcher reads the rule by name at every call)."""
    rule = paged_attention_kernels.decode_num_splits

    def decode_num_splits(batch, *shapes):
        return counts.get(batch) or rule(batch, *shapes)

    attention_decode_kernels.decode_num_splits = decode_num_splits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3.5-0.8b")
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--replays", type=int, default=100)
    p.add_argument("--top", type=int, default=24)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="the engine's (its block tables' width sets the attention's split count); default: what the "
                        "replays need")
    p.add_argument("--gdn-launch", default=None,
                   help="the GDN decode's launch at every batch instead of gated_deltanet_kernels.DECODE_LAUNCHES's: "
                        "'BLOCK_V:WARPS:PREFETCH[:split]' for the fused kernel (BLOCK_V 'head': whole heads; PREFETCH "
                        "0/1; split: the V tiles over programs), or 'unfused'")
    p.add_argument("--max-splits", type=int, default=None,
                   help="the attention's split ceiling instead of paged_attention_kernels.MAX_SPLITS's "
                        "(a power of two)")
    p.add_argument("--splits", default=None,
                   help="ce::attention_decode's split count at given batches instead of paged_attention_kernels."
                        "decode_num_splits's: 'B:S,...' (S splits at batch B, a power of two; the rule's elsewhere)")
    p.add_argument("--attention-stages", default=None,
                   help="ce::attention_decode's split-kernel stages by batch instead of attention_decode_kernels."
                        "DECODE_STAGES's: 'B:S,...' (S up to B sequences, Triton's default above; '0:0': the default "
                        "everywhere)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.gdn_launch:
        gated_deltanet_kernels.DECODE_LAUNCHES = _gdn_launches(args.gdn_launch)
    if args.max_splits:
        paged_attention_kernels.MAX_SPLITS = args.max_splits
    if args.splits:
        _override_splits(dict(_pairs(args.splits)))
    if args.attention_stages:
        attention_decode_kernels.DECODE_STAGES = tuple(_pairs(args.attention_stages)) + ((math.inf, None),)
    ctx = Context(Options(model=args.model, device="cuda", dtype="bfloat16"))
    # The replays advance every sequence one position each: the block tables must reach the last one.
    ctx.require(max(batches), max(args.max_model_len or 0, args.context + args.replays + 64))
    runtime = ctx.llm().runtime
    results = {b: _paths(runtime, b, args.context, args.replays, seed=b) for b in batches}

    first = results[batches[0]]["groups_us"]
    names = sorted({g for r in results.values() for g in r["groups_us"]},
                   key=lambda g: -(results[batches[-1]]["groups_us"].get(g, 0.0) - first.get(g, 0.0)))
    print("batch:            " + "".join(f"{b:>9}" for b in batches))
    print("graph ms/step:    " + "".join(f"{results[b]['ms_per_step']:9.3f}" for b in batches))
    print("span µs:          " + "".join(f"{results[b]['span_us'] or 0:9.1f}" for b in batches))
    print("kernels/step:     " + "".join(f"{results[b]['kernels_per_step'] or 0:9d}" for b in batches))
    for name in names[: args.top]:
        print(f"{name[:60]:60s}" + "".join(f"{results[b]['groups_us'].get(name, 0.0):9.1f}" for b in batches))
    if args.out:
        write_json(Path(args.out) / "step_paths.json", {"context": args.context, "results": results})


if __name__ == "__main__":
    main()

"""Where a chained speculative round's wall time goes beyond its graph (run 168): the engine at batch 1, k = 2,
forced acceptance 0.8 (bench spec's scripted drafts), one LLM.generate under torch.profiler. For each CUDA-graph
launch of the run: when the host launched it, when its first kernel started and its last ended on the GPU; between
consecutive graphs the GPU's idle gap, split into "the host launched late" (launch after the previous graph's end)
and the device's own latency. Prints percentiles and the first rounds; writes the chrome trace.

    python3 round_gaps.py MODEL OUT [new_tokens]
"""
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd()))
from bench.common import Context, Options, greedy, random_prompt  # noqa: E402
from bench.spec import forced_script  # noqa: E402

model, out = sys.argv[1], Path(sys.argv[2])
new_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 128
out.mkdir(parents=True, exist_ok=True)
device = "cuda" if torch.cuda.is_available() else "cpu"
ctx = Context(Options(model=model, device=device, dtype="bfloat16" if device == "cuda" else "float32",
                      max_num_seqs=1, max_model_len=512))
vocab = ctx.model_config.vocab_size
rng = random.Random(0)
prompt, warm = random_prompt(rng, 128, vocab), random_prompt(rng, 128, vocab)
llm = ctx.llm(speculative_config={"method": "mtp", "num_speculative_tokens": 2, "draft_vocab_size": min(32768, vocab),
                                  "scripted_drafts": True})
engine = llm.engine
llm.generate([warm], greedy(8), use_tqdm=False)
engine.draft_script = forced_script({tuple(prompt): [0] * (new_tokens + 1)}, 128, 0.0, vocab)
own = llm.generate([prompt], greedy(new_tokens), use_tqdm=False)[0].token_ids
engine.draft_script = forced_script({tuple(prompt): own}, 128, 0.8, vocab)
llm.generate([prompt], greedy(new_tokens), use_tqdm=False)  # warm
ctx.sync()
chained = engine.num_chained_rounds
start = time.perf_counter()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                            if device == "cuda" else [torch.profiler.ProfilerActivity.CPU]) as prof:
    result = llm.generate([prompt], greedy(new_tokens), use_tqdm=False)[0]
    ctx.sync()
wall = time.perf_counter() - start
print(f"generate under the profiler: {wall * 1e3:.1f} ms, {len(result.token_ids)} tokens, "
      f"{engine.num_chained_rounds - chained} chained rounds")
trace = out / "trace.json"
prof.export_chrome_trace(str(trace))
events = json.load(open(trace))["traceEvents"]
launches = {e["args"]["correlation"]: e for e in events
            if e.get("ph") == "X" and e.get("name") in ("cudaGraphLaunch", "cudaGraphLaunch_v10000")
            and "correlation" in e.get("args", {})}
gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
by_graph = {}
loose = []
for e in gpu:
    c = e.get("args", {}).get("correlation")
    if c in launches:
        by_graph.setdefault(c, []).append(e)
    else:
        loose.append(e)
graphs = []
for c, kernels in by_graph.items():
    first = min(k["ts"] for k in kernels)
    last = max(k["ts"] + k["dur"] for k in kernels)
    graphs.append({"launch": launches[c]["ts"], "launch_end": launches[c]["ts"] + launches[c]["dur"], "first": first,
                   "last": last, "kernels": len(kernels)})
graphs.sort(key=lambda g: g["first"])
rows = []
for prev, g in zip(graphs, graphs[1:]):
    between = [e for e in loose if prev["last"] <= e["ts"] < g["first"]]
    rows.append({"kernels": g["kernels"], "span_us": g["last"] - g["first"], "gap_us": g["first"] - prev["last"],
                 "host_late_us": max(0.0, g["launch_end"] - prev["last"]),
                 "launch_to_start_us": g["first"] - g["launch_end"],
                 "loose_between": [(e["name"][:40], round(e["dur"], 1)) for e in between]})


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


big = [r for r in rows if r["kernels"] > 100]
print(f"{len(graphs)} graph launches, {len(big)} of more than 100 kernels; loose GPU ops {len(loose)}")
for key in ("span_us", "gap_us", "host_late_us", "launch_to_start_us"):
    vals = [r[key] for r in big]
    if vals:
        print(f"  {key:>20}: p10 {pct(vals, .1):8.1f}  p50 {pct(vals, .5):8.1f}  p90 {pct(vals, .9):8.1f}")
for r in rows[:30]:
    print(json.dumps(r))
# Every idle gap of the GPU over 10 us, whatever launched the work around it
ordered = sorted(gpu, key=lambda e: e["ts"])
end, gaps = None, []
for e in ordered:
    if end is not None and e["ts"] - end > 10:
        gaps.append((round(e["ts"] - end, 1), before[:50], e["name"][:50]))
    if end is None or e["ts"] + e["dur"] > end:
        end, before = e["ts"] + e["dur"], e["name"]
busy = sum(e["dur"] for e in ordered)
if ordered:
    print(f"GPU span {ordered[-1]['ts'] + ordered[-1]['dur'] - ordered[0]['ts']:.0f} us; {len(gaps)} idle gaps over 10 us, "
          f"{sum(g[0] for g in gaps):.0f} us in all")
    pairs = {}
    for g in gaps:
        pairs.setdefault((g[1], g[2]), []).append(g[0])
    for (a, b), v in sorted(pairs.items(), key=lambda x: -sum(x[1]))[:12]:
        print(f"  {len(v):4d} gaps, {sum(v):8.0f} us (p50 {pct(v, .5):6.1f}): after {a} | before {b}")
names = {}
for e in loose:
    names[e["name"][:60]] = names.get(e["name"][:60], 0) + 1
print("loose GPU ops by name:", sorted(names.items(), key=lambda x: -x[1])[:15])
cpu = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25)
print(cpu)
json.dump(rows, open(out / "gaps.json", "w"), indent=1)

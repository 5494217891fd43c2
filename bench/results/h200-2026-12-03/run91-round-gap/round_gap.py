"""Where a compiled round's wall goes beyond its graph: host stamps and CUDA events around each piece of
Runtime.fused_round + read-back + advance, at batch 1 and 8, k = 2 (bench spec's engine and model)."""
import statistics, sys, time
import torch
from bench.common import Context, Options
from bench.spec import _started

opts = Options(model="qwen3.5-0.8b-confident", device="cuda", dtype="bfloat16", max_num_seqs=8, max_model_len=512)
ctx = Context(opts)
k = 2
llm = ctx.llm(speculative_config={"method": "mtp", "num_speculative_tokens": k, "auto_disable": True})
rt = llm.runtime
ex = rt.executor
rnd = ex.speculative_round
import random
rng = random.Random(0)
V = ctx.model_config.vocab_size
for b in (1, 8):
    prompts = [[rng.randrange(V) for _ in range(128)] for _ in range(b)]
    seqs = _started(rt, prompts)
    drafts = [[0] * k for _ in seqs]
    rows = []
    for it in range(40):
        torch.cuda.synchronize()
        e = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        t0 = time.perf_counter()
        rt._reserve_draft_blocks(seqs, [k + 1] * b, [k - 1] * b, 0)
        starts = [s.num_computed_tokens for s in seqs]
        length, bucket = rnd.pack(seqs, drafts)
        t1 = time.perf_counter()
        e[0].record()
        rnd.load(length, None, b)
        e[1].record()
        t2 = time.perf_counter()
        acc, tok, new = (t[:b] for t in rnd.run(bucket, False))
        t3 = time.perf_counter()
        e[2].record()
        host = torch.cat([acc[:, None], tok, new], dim=1).tolist()
        t4 = time.perf_counter()
        e[3].record()
        from compiled_engine.speculative import SpeculativeStep
        spec = SpeculativeStep(list(seqs), None, None, starts, [k + 1] * b, None)
        rt.advance(spec, [r[0] for r in host], [r[1:k + 2] for r in host])
        drafts = [r[k + 2:] for r in host]
        t5 = time.perf_counter()
        torch.cuda.synchronize()
        if it >= 5:
            rows.append(((t1 - t0) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6, (t4 - t3) * 1e6, (t5 - t4) * 1e6,
                         (t5 - t0) * 1e6, e[0].elapsed_time(e[1]) * 1e3, e[1].elapsed_time(e[2]) * 1e3,
                         e[2].elapsed_time(e[3]) * 1e3))
    # back-to-back replays of the same graph
    torch.cuda.synchronize()
    s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s0.record()
    for _ in range(20):
        rnd.run(bucket, False)
    s1.record()
    torch.cuda.synchronize()
    names = ["pack", "load", "replay call", "cat+tolist", "advance", "wall", "gpu copy", "gpu graph(ev)", "gpu cat"]
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"batch {b}: " + ", ".join(f"{n} {m:.1f}" for n, m in zip(names, med)) +
          f" | b2b replay {s0.elapsed_time(s1) / 20 * 1e3:.1f} µs", flush=True)
    # and under the profiler: the GPU timeline of 3 rounds
    for s in seqs:
        rt.release(s)

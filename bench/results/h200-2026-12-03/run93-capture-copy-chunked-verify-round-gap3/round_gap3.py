"""A compiled round through the runtime's own path (after 09c88af / 9cca4c6 / ceb260b): fused_round, rows(), advance,
each stamped on the host, the GPU's time between two rounds from CUDA events; then the graph replayed back to back."""
import random, statistics, time
import torch
from bench.common import Context, Options
from bench.spec import _started

GPU = torch.cuda.is_available()  # off the GPU: a dry run of this script on the tiny model
opts = (Options(model="qwen3.5-0.8b-confident", device="cuda", dtype="bfloat16", max_num_seqs=8, max_model_len=512)
        if GPU else Options(model="tiny", device="cpu", dtype="float32", max_num_seqs=8, max_model_len=512))
if not GPU:
    torch.cuda.synchronize = lambda *a: None
ctx = Context(opts)
k = 2
llm = ctx.llm(speculative_config={"method": "mtp", "num_speculative_tokens": k, "auto_disable": True})
rt = llm.runtime
rnd = rt.executor.speculative_round
rng = random.Random(0)
V = ctx.model_config.vocab_size
for b in (1, 8):
    seqs = _started(rt, [[rng.randrange(V) for _ in range(128)] for _ in range(b)])
    drafts = [[0] * k for _ in seqs]
    rows = []
    torch.cuda.synchronize()
    for it in range(45):
        t0 = time.perf_counter()
        spec, res = rt.fused_round(seqs, drafts); t1 = time.perf_counter()
        host = res.rows(); t2 = time.perf_counter()
        rt.advance(spec, [r[0] for r in host], [r[1:k + 2] for r in host]); t3 = time.perf_counter()
        drafts = [r[k + 2:] for r in host]
        if it >= 5:
            rows.append([(t1 - t0) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6, (t3 - t0) * 1e6])
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"batch {b}: " + ", ".join(f"{n} {m:.1f}" for n, m in
                                      zip(["fused_round (launch)", "rows (waits)", "advance", "wall"], med)), flush=True)
    bucket = rnd.policy.bucket_for(b) if GPU else None
    if not GPU:
        for s in seqs:
            rt.release(s)
        continue
    graph, _ = rnd._graphs[bucket, False]
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(40):
        graph.replay()
    e1.record(); torch.cuda.synchronize()
    print(f"batch {b}: graph back to back {e0.elapsed_time(e1) / 40 * 1e3:.1f} us", flush=True)
    for s in seqs:
        rt.release(s)

# The prompt step with drafts against without (bench spec's TTFT: ~47 ms plain, ~60-65 ms speculative in run 90).
def stamp():
    torch.cuda.synchronize()
    return time.perf_counter()
pieces = {"prefill": [], "prefill_for_drafts": [], "argmax": [], "draft_after_prefill": [], "drafts tolist": []}
for it in range(12):
    p = [rng.randrange(V) for _ in range(128)]
    seq = rt.add_sequence(p); t0 = stamp()
    rt.prefill([seq]); t1 = stamp()
    rt.release(seq)
    seq = rt.add_sequence(p[::-1]); t2 = stamp()
    spec = rt.prefill_for_drafts([seq]); t3 = stamp()
    nt = spec.logits.argmax(dim=-1); t4 = stamp()
    d = rt.draft_after_prefill(spec, nt); t5 = stamp()
    d.tolist(); t6 = stamp()
    rt.release(seq)
    if it >= 2:
        for name, v in zip(pieces, (t1 - t0, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
            pieces[name].append(v * 1e3)
print("prompt step, batch 1, 128 tokens (ms, medians of 10): " +
      ", ".join(f"{n} {statistics.median(v):.2f}" for n, v in pieces.items()), flush=True)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if GPU else [])) as prof:
    seq = rt.add_sequence([rng.randrange(V) for _ in range(128)])
    spec = rt.prefill_for_drafts([seq])
    d = rt.draft_after_prefill(spec, spec.logits.argmax(dim=-1)).tolist()
    rt.release(seq)
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30), flush=True)

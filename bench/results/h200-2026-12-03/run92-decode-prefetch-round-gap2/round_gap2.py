"""A compiled round's host pieces, finer (after run 91): each piece stamped, the pack done twice (cold, hot)."""
import random, statistics, time
import torch
from bench.common import Context, Options
from bench.spec import _started
from compiled_engine.speculative import SpeculativeStep, pack_verify_into

opts = Options(model="qwen3.5-0.8b-confident", device="cuda", dtype="bfloat16", max_num_seqs=8, max_model_len=512)
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
    for it in range(40):
        torch.cuda.synchronize()
        ts = [time.perf_counter()]
        rt._reserve_draft_blocks(seqs, [k + 1] * b, [k - 1] * b, 0); ts.append(time.perf_counter())
        starts = [s.num_computed_tokens for s in seqs]
        bucket = rnd.policy.bucket_for(b)
        if rnd._staged is not None:
            rnd._staged.synchronize()
        ts.append(time.perf_counter())
        out = rnd._stage.numpy(); ts.append(time.perf_counter())
        length = pack_verify_into(out, seqs, drafts, rnd.block_size, bucket, k, rnd.table_width); ts.append(time.perf_counter())
        length = pack_verify_into(out, seqs, drafts, rnd.block_size, bucket, k, rnd.table_width); ts.append(time.perf_counter())
        rnd.packed[:length].copy_(rnd._stage[:length], non_blocking=True); ts.append(time.perf_counter())
        rnd._staged = torch.cuda.Event(); rnd._staged.record(); ts.append(time.perf_counter())
        acc, tok, new = (t[:b] for t in rnd.run(bucket, False)); ts.append(time.perf_counter())
        cat = torch.cat([acc[:, None], tok, new], dim=1); ts.append(time.perf_counter())
        host = cat.tolist(); ts.append(time.perf_counter())
        spec = SpeculativeStep(list(seqs), None, None, starts, [k + 1] * b, None)
        rt.advance(spec, [r[0] for r in host], [r[1:k + 2] for r in host]); ts.append(time.perf_counter())
        drafts = [r[k + 2:] for r in host]
        # a hot repeat of the pre-launch host work (nothing waited for in between)
        t0 = time.perf_counter()
        pack_verify_into(out, seqs, drafts, rnd.block_size, bucket, k, rnd.table_width)
        t1 = time.perf_counter()
        if it >= 5:
            rows.append([(b_ - a) * 1e6 for a, b_ in zip(ts, ts[1:])] + [(ts[-1] - ts[0]) * 1e6, (t1 - t0) * 1e6])
    names = ["reserve", "event sync", "numpy()", "pack cold", "pack again", "copy_", "event", "replay", "cat",
             "tolist (waits)", "advance", "wall", "pack after advance"]
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"batch {b}: " + ", ".join(f"{n} {m:.1f}" for n, m in zip(names, med)), flush=True)
    for s in seqs:
        rt.release(s)

"""Can a captured CUDA graph take its step input from pinned host memory the host rewrites between replays?
(1) an H2D copy_ from a pinned CPU tensor captured into the graph; (2) a copy_ from the pinned memory's device view
(graphs.static_inputs.host_visible) captured; each checked over replays with the host buffer rewritten between them."""
import time
import torch
from graphs.static_inputs import host_visible

dev = torch.device("cuda")
n = 1000
for name in ("h2d from pinned", "d2d from host_visible"):
    try:
        if name == "h2d from pinned":
            host = torch.zeros(n, dtype=torch.long, pin_memory=True); src = host
        else:
            host, src = host_visible((n,), dev)
        dst = torch.zeros(n, dtype=torch.long, device=dev)
        out = torch.zeros(n, dtype=torch.long, device=dev)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            dst.copy_(src, non_blocking=True); torch.add(dst, 1, out=out)  # warm
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dst.copy_(src, non_blocking=True)
            torch.add(dst, 1, out=out)
        ok = True
        for r in range(5):
            host.copy_(torch.arange(n) * (r + 7))
            g.replay(); torch.cuda.synchronize()
            ok &= torch.equal(out.cpu(), torch.arange(n) * (r + 7) + 1)
        t0 = time.perf_counter()
        for _ in range(200):
            g.replay()
        torch.cuda.synchronize()
        nodes = "?"
        print(f"{name}: correct over replays: {ok}; {(time.perf_counter() - t0) / 200 * 1e6:.1f} us a replay", flush=True)
    except Exception as e:
        print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)

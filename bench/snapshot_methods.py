"""snapshot_methods: two ways to take prefix-cache snapshots during prefill (issue 6), timed on FLA's chunk kernel.

A snapshot is every linear layer's recurrent state [Hv, K, V] (fp32) (and conv state) at a boundary every
``interval`` tokens. For one linear layer of Qwen3.5-0.8B (bench/models.py: 16 key and value heads, K = V = 128;
bf16 q/k/v, fp32 gates and state) and ``seqs`` fresh sequences of ``seq_len`` tokens in one packed varlen batch
(4 x 2,048 = 8,192 tokens, one engine prefill step), it times:

  * ``baseline``: one ``chunk_gated_delta_rule`` call, final state out, no snapshots;
  * ``chunk_ends`` (what the engine does: the scheduler ends prefill chunks at boundaries): ``seq_len / interval``
    calls of ``interval`` tokens per sequence, each starting from the previous call's final state, each final state
    copied into a snapshot buffer;
  * ``per_chunk_states``: one call through FLA's forward pieces (l2norm, chunk_local_cumsum, fwd_intra,
    chunk_gated_delta_rule_fwd_h, chunk_fwd_o, as ``chunk_gated_delta_rule_fwd`` runs them) keeping the per-chunk
    states ``h`` it computes anyway: ``h[c]`` is the state BEFORE 64-token chunk c (of the packed chunk list,
    sequence n's chunks starting at ``chunk_offsets[n]``), so the state after ``interval * j`` tokens is
    ``h[chunk_offsets[n] + j * interval / 64]`` and the last boundary is the final state. Those are gathered into
    the snapshot buffer. ``h`` has k's dtype, so these snapshots are bf16-rounded (the others are fp32).

Before timing, the script asserts that the methods agree: per_chunk_states' boundary states equal chunk_ends' to
bf16 rounding, the final states and the outputs to bf16 tolerance (``check`` in the result).

Per method: ``wall_ms``, the median over ``repeats`` calls of CUDA events recorded around the call on an idle stream
(so it includes the host's time: FLA's per-call Python and launches); ``gpu_ms``, the summed duration of the device
kernels of one call (torch.profiler, mean over ``repeats``); ``host_ms`` = wall - GPU; kernels per call. Each in two
modes of handing FLA the varlen layout (ops/delta_rule.py): ``hinted``, one int64 ``cu_seqlens`` object per step and
the chunk table built on the host (``chunk_indices``), as every layer after the first of an engine step sees them
(FLA's memo on the tensor's identity hits, no sync); ``fresh``, a fresh int64 copy per call and no table, so FLA
derives it on the device with a host sync (the op without hints). The conv state at a boundary is the last
``conv_kernel - 1`` conv inputs before it: the same cheap gather in both methods, not timed. The "bound" is the
baseline: snapshots at no extra cost. ``extra_wall_ms_per_step`` is one layer's extra times the 18 linear layers; in
the engine chunk_ends' extra calls are whole extra steps (every layer) when fewer than max_num_batched_tokens /
interval sequences are prefilling, and nothing extra when the step is still full of interval-token pieces.

    python -m bench snapshot_methods --out /tmp/snap              # on a GPU; -p snapshot_methods.seqs=16 ...
On a CPU the scenario only records why it was skipped (FLA's kernels are Triton: CUDA only).
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F

from bench.common import Context
from bench.models import QWEN3_5_0_8B_CONFIG

CHUNK = 64  # FLA's chunk length
METHODS = ("baseline", "chunk_ends", "per_chunk_states")
MODES = ("hinted", "fresh")


def requirements(**_) -> tuple[int, int]:
    return 1, 1  # no engine: synthetic inputs straight into FLA


def shape(config: dict = QWEN3_5_0_8B_CONFIG) -> dict:
    k_heads, v_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    key_dim, value_dim = config["linear_key_head_dim"], config["linear_value_head_dim"]
    layers = config["num_hidden_layers"]
    return {"k_heads": k_heads, "v_heads": v_heads, "key_dim": key_dim, "value_dim": value_dim,
            "conv_dim": 2 * k_heads * key_dim + v_heads * value_dim, "conv_kernel": config["linear_conv_kernel_dim"],
            "linear_layers": layers - layers // config["full_attention_interval"]}


def make_inputs(seqs: int, seq_len: int, s: dict, device, seed: int = 0) -> dict:
    """Packed varlen inputs as the engine hands them to FLA: [1, T, H, D] bf16 q/k/v, fp32 log-decay g and beta."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t = seqs * seq_len

    def randn(*size, dtype=torch.bfloat16):
        return torch.randn(*size, generator=gen).to(device=device, dtype=dtype)

    return {
        "q": randn(1, t, s["k_heads"], s["key_dim"]),
        "k": randn(1, t, s["k_heads"], s["key_dim"]),
        "v": randn(1, t, s["v_heads"], s["value_dim"]),
        "g": F.logsigmoid(randn(1, t, s["v_heads"], dtype=torch.float32) + 4),  # ~-0.02/token: ~50-token memory
        "beta": randn(1, t, s["v_heads"], dtype=torch.float32).sigmoid(),
        "h0": torch.zeros(seqs, s["v_heads"], s["key_dim"], s["value_dim"], device=device),  # fresh prompts
        **layout(seqs, seq_len, device),
    }


def layout(seqs: int, seq_len: int, device) -> dict:
    """int64 cu_seqlens and FLA's chunk table [(sequence, chunk of it)], both built on the host, as pack_step does."""
    chunks = -(-seq_len // CHUNK)
    table = torch.stack([torch.arange(seqs).repeat_interleave(chunks), torch.arange(chunks).repeat(seqs)], 1)
    return {"cu": torch.arange(0, seqs * seq_len + 1, seq_len).to(device), "chunk_indices": table.to(device)}


def split_at_boundaries(x: dict, seqs: int, seq_len: int, interval: int) -> list[dict]:
    """The same tokens as ``seq_len // interval`` packed batches of ``interval`` tokens per sequence (the prefill
    steps the scheduler makes when chunks end at boundaries), packed ahead of time as the engine's step would be."""
    parts = []
    for j in range(seq_len // interval):
        part = {}
        for name in ("q", "k", "v", "g", "beta"):
            full = x[name].view(seqs, seq_len, *x[name].shape[2:])
            part[name] = full[:, j * interval:(j + 1) * interval].reshape(1, seqs * interval, *x[name].shape[2:])
        parts.append({**part, **layout(seqs, interval, x["cu"].device)})
    return parts


def boundary_chunks(seqs: int, seq_len: int, interval: int, device) -> torch.Tensor:
    """Indices into the packed per-chunk states h of the states at the inner boundaries (after interval * j tokens,
    j = 1 .. seq_len / interval - 1), sequence-major. The state after the last boundary is the final state."""
    per_seq = -(-seq_len // CHUNK)
    inner = torch.arange(1, seq_len // interval, device=device) * (interval // CHUNK)
    return (torch.arange(seqs, device=device)[:, None] * per_seq + inner[None, :]).reshape(-1)


class Methods:
    """The three ways to run the layer; each method fills ``self.snap`` [seqs, boundaries, Hv, K, V] fp32."""

    def __init__(self, x: dict, seqs: int, seq_len: int, interval: int, hinted: bool = True):
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        self.chunk_gated_delta_rule = chunk_gated_delta_rule
        self.x, self.seqs, self.hinted = x, seqs, hinted
        self.parts = split_at_boundaries(x, seqs, seq_len, interval)
        self.inner = boundary_chunks(seqs, seq_len, interval, x["v"].device)
        self.scale = x["q"].shape[-1] ** -0.5
        self.snap = torch.zeros(seqs, len(self.parts), *x["h0"].shape[1:], device=x["v"].device)

    def varlen(self, t: dict) -> dict:
        if self.hinted:  # the step's objects, as layers 2.. of an engine step pass them
            return {"cu_seqlens": t["cu"], "chunk_indices": t["chunk_indices"]}
        return {"cu_seqlens": t["cu"].clone(), "chunk_indices": None}  # FLA derives the table (a host sync)

    def call(self, t: dict, h0: torch.Tensor):
        return self.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], scale=self.scale,
                                           initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                           **self.varlen(t))

    def baseline(self):
        return self.call(self.x, self.x["h0"])

    def chunk_ends(self):
        state, outs = self.x["h0"], []
        for j, part in enumerate(self.parts):
            o, state = self.call(part, state)
            self.snap[:, j].copy_(state)
            outs.append(o)
        return outs, state

    def per_chunk_states(self):
        from fla.modules.norm.l2norm import l2norm_fwd
        from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
        from fla.ops.common.chunk_o import chunk_fwd_o
        from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
        from fla.ops.utils import chunk_local_cumsum
        from fla.ops.utils.constant import RCP_LN2
        from fla.ops.utils.index import prepare_chunk_indices

        x = self.x
        varlen = self.varlen(x)
        cu, idx = varlen["cu_seqlens"], varlen["chunk_indices"]
        q, _ = l2norm_fwd(x["q"])
        k, _ = l2norm_fwd(x["k"])
        idx = prepare_chunk_indices(cu, CHUNK) if idx is None else idx
        g = chunk_local_cumsum(x["g"], chunk_size=CHUNK, scale=RCP_LN2, cu_seqlens=cu, chunk_indices=idx)
        w, u, _ = chunk_gated_delta_rule_fwd_intra(k=k, v=x["v"], g=g, beta=x["beta"], cu_seqlens=cu,
                                                   chunk_indices=idx, chunk_size=CHUNK)
        h, v_new, final = chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=g, initial_state=x["h0"],
                                                       output_final_state=True, cu_seqlens=cu, chunk_indices=idx,
                                                       chunk_size=CHUNK)
        o = chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=g, scale=self.scale, cu_seqlens=cu, chunk_indices=idx,
                        chunk_size=CHUNK)
        # h: [1, chunks, Hv, K, V] in k's dtype; the snapshots are the states before the boundary chunks, then final
        if self.inner.numel():
            self.snap[:, :-1].copy_(h[0].index_select(0, self.inner).view(self.seqs, -1, *h.shape[2:]))
        self.snap[:, -1].copy_(final)
        return o.to(q.dtype), final


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


def check(m: Methods, seqs: int, seq_len: int) -> dict:
    """Run each method once and assert they agree (apples to apples). Relative max errors in the result."""
    o_base, final_base = m.baseline()
    outs, final_ends = m.chunk_ends()
    snap_ends = m.snap.clone()
    o_ends = torch.cat([o.view(seqs, -1, *o.shape[2:]) for o in outs], 1).view_as(o_base)
    m.snap.zero_()
    o_states, final_states = m.per_chunk_states()
    inner = len(m.parts) > 1
    errors = {
        "boundary_states_vs_chunk_ends": rel_err(m.snap[:, :-1], snap_ends[:, :-1]) if inner else 0.0,  # bf16 h
        "final_state_vs_chunk_ends": rel_err(final_states, final_ends),
        "final_state_baseline_vs_chunk_ends": rel_err(final_base, final_ends),
        "output_vs_baseline": rel_err(o_states, o_base),
        "output_chunk_ends_vs_baseline": rel_err(o_ends, o_base),
    }
    for name, err in errors.items():  # bf16 rounding is 2**-8; a wrong chunk index is off by O(1)
        assert err <= 1e-2, f"snapshot methods disagree: {name} relative max error {err:.3g}"
    assert snap_ends.abs().amax(dim=(-1, -2, -3)).min() > 0, "a snapshot was never written"
    return {"relative_max_error": errors, "per_chunk_state_dtype": str(m.x["k"].dtype).removeprefix("torch."),
            "snapshot_dtype": "float32"}


def time_method(fn, repeats: int, warmup: int) -> dict:
    for _ in range(warmup):  # Triton autotuning and JIT outside the timing
        fn()
    torch.cuda.synchronize()
    walls = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()  # an idle stream: the start event fires when the host starts the call
        start.record()
        fn()
        end.record()
        end.synchronize()
        walls.append(start.elapsed_time(end))
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    wall, gpu = statistics.median(walls), sum(e.time_range.elapsed_us() for e in kernels) / repeats / 1e3
    return {"wall_ms": wall, "wall_ms_min": min(walls), "gpu_ms": gpu, "host_ms": max(0.0, wall - gpu),
            "kernels_per_call": len(kernels) / repeats}


def run(ctx: Context, seqs: int = 4, seq_len: int = 2048, interval: int = 512, repeats: int = 20, warmup: int = 3,
        modes=MODES, seed: int = 0) -> dict:
    if interval % CHUNK or seq_len % interval:
        raise ValueError(f"interval must be a multiple of {CHUNK} dividing seq_len, got {interval} and {seq_len}")
    modes = [modes] if isinstance(modes, str) else list(modes)
    s = shape()
    result = ctx.metadata("snapshot_methods")
    result.update({
        "workload": {"seqs": seqs, "seq_len": seq_len, "interval": interval, "tokens": seqs * seq_len,
                     "snapshots_per_seq": seq_len // interval, "layer_shape": s, "qkv_dtype": "bfloat16",
                     "state_dtype": "float32", "modes": modes, "repeats": repeats, "seed": seed},
        "bound": None, "fraction_of_bound": None,
    })
    if ctx.device.type != "cuda":
        result["skipped"] = ("snapshot_methods needs a CUDA device: it times FLA's Triton chunk kernels, which do "
                             "not run on the CPU. Run `python -m bench snapshot_methods` on a GPU.")
        print(f"[bench] snapshot_methods skipped: {result['skipped']}", file=sys.stderr, flush=True)
        return result
    import fla
    from fla.utils import find_spec_cached

    x = make_inputs(seqs, seq_len, s, ctx.device, seed)
    checks, times = {}, {}
    for mode in modes:
        m = Methods(x, seqs, seq_len, interval, hinted=mode == "hinted")
        checks[mode] = check(m, seqs, seq_len)
        times[mode] = {name: time_method(getattr(m, name), repeats, warmup) for name in METHODS}
        base = times[mode]["baseline"]
        for r in times[mode].values():
            r["extra_wall_ms"], r["extra_gpu_ms"] = r["wall_ms"] - base["wall_ms"], r["gpu_ms"] - base["gpu_ms"]
            r["fraction_of_bound"] = base["wall_ms"] / r["wall_ms"]
            # the same extra in every linear layer of a prefill step (the engine's other layers not counted)
            r["extra_wall_ms_per_step"] = r["extra_wall_ms"] * s["linear_layers"]
    faster = {mode: min(("chunk_ends", "per_chunk_states"), key=lambda n: t[n]["wall_ms"]) for mode, t in times.items()}
    result.update({
        "fla": {"version": getattr(fla, "__version__", None),
                # FlashQLA (when installed, on SM90+) replaces the Triton chunk path in chunk_gated_delta_rule, so
                # baseline and chunk_ends would run it while per_chunk_states runs FLA's Triton pieces
                "flash_qla_installed": find_spec_cached("flash_qla") is not None},
        "check": checks,
        "methods": times,
        "faster": faster,
        "bound": {"what": "baseline: snapshots at no extra cost",
                  "wall_ms": {mode: t["baseline"]["wall_ms"] for mode, t in times.items()}},
        "fraction_of_bound": {mode: {n: t[n]["fraction_of_bound"] for n in ("chunk_ends", "per_chunk_states")}
                              for mode, t in times.items()},
        "method": "wall: median of CUDA events around one call started on an idle stream (host included); GPU: "
                  "summed device kernel durations per call (torch.profiler); host = wall - GPU",
    })
    ctx.write("snapshot_methods", result)
    return result


def summary_lines(head: str, r: dict) -> list[str]:
    w = r["workload"]
    if "skipped" in r:
        return [f"{head} skipped: {r['skipped']}"]
    lines = [f"{head} {w['seqs']} x {w['seq_len']} tokens, snapshot every {w['interval']}: one layer's wall ms = GPU "
             f"+ host, and the extra wall ms of a {w['layer_shape']['linear_layers']}-linear-layer step"]
    for mode, methods in r["methods"].items():
        for name, m in methods.items():
            lines.append(f"{'':<11} {mode:<6} {name:<17} {m['wall_ms']:8.3f} = {m['gpu_ms']:7.3f} + "
                         f"{m['host_ms']:7.3f} ({m['kernels_per_call']:3.0f} kernels) "
                         f"{m['extra_wall_ms_per_step']:+8.2f} ms/step")
        err = r["check"][mode]["relative_max_error"]["boundary_states_vs_chunk_ends"]
        lines.append(f"{'':<11} {mode:<6} faster: {r['faster'][mode]} (per_chunk_states' snapshots are "
                     f"{r['check'][mode]['per_chunk_state_dtype']}, rel. err {err:.1e} vs chunk_ends)")
    return lines

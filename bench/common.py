"""What every scenario shares: the run Context (model, LLM, HF model, bandwidth, bounds), result metadata, JSON
output, workloads, statistics and (optional) plots.

Timing rule for every scenario: synchronise the device before reading a host timer (``Context.sync``). The engine's
``step()`` already ends in a device->host copy of the sampled tokens, so engine-level timestamps are synchronous.
"""

from __future__ import annotations

import datetime
import gc
import importlib.metadata
import json
import math
import os
import platform
import random
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from bench.bandwidth import measure_copy_bandwidth
from bench.bounds import ModelBytes, model_bytes, model_bytes_from_config
from bench.models import ModelSpec, device_llm, resolve_model, shape_summary

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
PROMPT_TOKEN_CEILING = 10000  # nano-vllm's workload draws prompt token ids from [0, 10000]


@dataclass
class Options:
    """Command-line options shared by all scenarios (see bench/__main__.py)."""

    model: str = "tiny"
    device: str | None = None
    dtype: str | None = None
    enforce_eager: bool = False
    vs_hf: bool = False
    out: str | None = None
    max_num_seqs: int | None = None  # default: what the scenarios of the run need
    max_model_len: int | None = None  # default: what the scenarios of the run need
    max_num_batched_tokens: int | None = None  # default: LLM's (16,384 on a GPU of 70 GiB or more, else 8,192)
    num_kv_blocks: int | None = None  # default: the runtime's memory plan
    max_prefill_capture_tokens: int | None = None  # default: the runtime's (RuntimeConfig)
    max_prefill_capture_seqs: int | None = None  # default: the runtime's (RuntimeConfig)
    mixed_decode_lanes: int | None = None  # default: the runtime's (RuntimeConfig)
    tensor_parallel_size: int = 1  # shard our engine over this many GPUs (HF always runs on one)
    enable_prefix_caching: bool = False  # for every scenario's engine (prefix runs both modes regardless)
    overlap_decode: bool = True  # LLM(overlap_decode=...) for every scenario's engine (LLM's default)
    mixed_steps: bool = True  # LLM(mixed_steps=...) for every scenario's engine (LLM's default)
    kv_growth_reserve: float | None = None  # LLM(kv_growth_reserve=...); default: LLM's
    speculative_config: dict | None = None  # LLM(speculative_config=...) for every scenario's engine
    state_dtype: str | None = None  # LLM(state_dtype=...): the recurrent state pool's; default: the checkpoint's
    bandwidth_mib: int | None = None  # copy buffer size; default 1024 on CUDA, 64 on CPU
    hf_limit: int | None = None  # HF runs at most this many requests of a workload (throughput, prefix)
    hf_batch_size: int = 64  # HF pad-left batch size
    hf_max_time: float | None = None  # seconds: HF stops starting batches past this, and caps a batch with it
    argv: list[str] = field(default_factory=list)


def hide_fla() -> None:
    """Make ``import fla`` fail, so HF transformers uses its torch paths: FLA's Triton kernels crash on the CPU.

    Must run before transformers imports its Qwen3.5 / Qwen3-Next modeling modules (the choice is made at import).
    """
    loaded = [m for m in ("transformers.models.qwen3_5.modeling_qwen3_5",) if m in sys.modules]
    if loaded and isinstance(sys.modules.get("fla"), type(sys)):
        raise RuntimeError(f"{loaded} already imported with FLA visible: hide FLA before importing transformers models")
    for name in [n for n in sys.modules if n == "fla" or n.startswith("fla.")]:
        sys.modules[name] = None  # type: ignore[assignment]
    sys.modules["fla"] = None  # type: ignore[assignment]
    sys.modules.setdefault("causal_conv1d", None)  # type: ignore[arg-type]


class Context:
    """One benchmark run: the resolved model and device, and the expensive objects, built once and shared."""

    def __init__(self, opts: Options):
        from compiled_engine.config import ModelConfig
        from compiled_engine.runtime import resolve_device, resolve_dtype

        self.opts = opts
        self.device = resolve_device(opts.device)
        self.dtype = resolve_dtype(opts.dtype, self.device)
        if self.device.type == "cpu":
            hide_fla()
        self.model: ModelSpec = resolve_model(opts.model, self.device)
        self.model_config = ModelConfig.from_pretrained(self.model.path)
        self.out_dir = Path(opts.out) if opts.out else None
        self._partials: dict[str, dict] = {}  # scenario -> its last write, where that was partial (``write``)
        self.need_seqs, self.need_len = 1, 1
        self._llm = None
        self._llm_key: tuple | None = None
        self._hf = None
        self._bandwidth: dict | None = None
        self.llm_build_s: float | None = None

    # ------------------------------------------------------------------------------------------------ engine
    def require(self, max_num_seqs: int, max_model_len: int) -> None:
        """A scenario needs an engine with at least this many sequences of at least this length."""
        self.need_seqs = max(self.need_seqs, max_num_seqs)
        self.need_len = max(self.need_len, max_model_len)

    def engine_limits(self) -> tuple[int, int]:
        return (self.opts.max_num_seqs or self.need_seqs, self.opts.max_model_len or self.need_len)

    @property
    def enforce_eager(self) -> bool:
        return self.opts.enforce_eager or self.device.type != "cuda"

    def llm_kwargs(self, **extra) -> dict:
        seqs, length = self.engine_limits()
        kwargs = dict(
            device=str(self.device),
            dtype=self.dtype,
            enforce_eager=self.enforce_eager,
            max_model_len=length,
            max_num_seqs=seqs,
            max_num_batched_tokens=self.opts.max_num_batched_tokens,
        )
        if self.opts.num_kv_blocks:
            kwargs["num_kv_blocks"] = self.opts.num_kv_blocks
        if self.opts.max_prefill_capture_tokens is not None:
            kwargs["max_prefill_capture_tokens"] = self.opts.max_prefill_capture_tokens
        if self.opts.max_prefill_capture_seqs is not None:
            kwargs["max_prefill_capture_seqs"] = self.opts.max_prefill_capture_seqs
        if self.opts.mixed_decode_lanes is not None:
            kwargs["mixed_decode_lanes"] = self.opts.mixed_decode_lanes
        if self.opts.enable_prefix_caching:
            kwargs["enable_prefix_caching"] = True
        kwargs["overlap_decode"] = self.opts.overlap_decode
        kwargs["mixed_steps"] = self.opts.mixed_steps
        if self.opts.kv_growth_reserve is not None:
            kwargs["kv_growth_reserve"] = self.opts.kv_growth_reserve
        if self.opts.tensor_parallel_size != 1:
            kwargs["tensor_parallel_size"] = self.opts.tensor_parallel_size
        if self.opts.speculative_config is not None:
            kwargs["speculative_config"] = self.opts.speculative_config
        if self.opts.state_dtype is not None:
            kwargs["state_dtype"] = getattr(torch, self.opts.state_dtype)
        return {**kwargs, **extra}

    def llm(self, **extra):
        """The shared LLM, (re)built when the scenarios' needs or ``extra`` LLM kwargs changed."""
        from compiled_engine.llm import LLM

        key = (self.engine_limits(), tuple(sorted(extra.items())))
        if self._llm is not None and self._llm_key == key:
            return self._llm
        self.release_llm()
        start = time.perf_counter()
        if self.model.on_device:
            self._release_hf()  # a device-drawn model and HF's copy do not fit the device together
        build = device_llm if self.model.on_device else LLM
        llm = build(self.model.path, **self.llm_kwargs(**extra))  # TypeError for an unknown kwarg
        self.sync()
        self.llm_build_s = time.perf_counter() - start
        self._llm, self._llm_key = llm, key
        return llm

    def current_llm(self):
        """The engine built last, if it still covers the scenarios' needs; else None."""
        if self._llm is not None and self._llm_key[0] == self.engine_limits():
            return self._llm
        return None

    def _release_hf(self) -> None:
        if self._hf is not None:
            self._hf = None
            gc.collect()
            torch.cuda.empty_cache()

    def release_llm(self) -> None:
        """Close the shared engine (its tensor-parallel workers stop now, not whenever the interpreter exits)."""
        if self._llm is None:
            return
        llm, self._llm, self._llm_key = self._llm, None, None
        llm.close()
        del llm
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def engine_summary(self) -> dict | None:
        if self._llm is None:
            return None
        rt = self._llm.runtime
        return {
            "max_num_seqs": rt.config.max_num_seqs,
            "max_model_len": rt.max_model_len,
            "block_size": rt.config.block_size,
            "num_kv_blocks": rt.cache_config.num_kv_blocks,
            "state_dtype": str(rt.config.state_dtype).removeprefix("torch."),
            "max_num_batched_tokens": self._llm.engine.scheduler.max_num_batched_tokens,
            "enforce_eager": self.enforce_eager,
            "enable_prefix_caching": rt.config.enable_prefix_caching,
            "overlap_decode": self._llm.engine.overlap_decode,
            "mixed_steps": self._llm.engine.scheduler.mixed_steps,
            "kv_growth_reserve": self._llm.engine.scheduler.kv_growth_reserve,
            "tensor_parallel_size": rt.model.tp.world_size,
            "speculative_config": asdict(rt.speculative_config) if rt.speculative_config else None,
            "attention_backend": rt.config.attention_backend,
            "llm_build_s": self.llm_build_s,  # LLM(...) in this process: load + compile + capture
            **decode_fn_info(rt.decode_fn),
        }

    # ------------------------------------------------------------------------------------------------ bounds
    def model_bytes(self) -> ModelBytes:
        if self._llm is not None:
            rt = self._llm.runtime
            return model_bytes(rt.model, self.dtype, rt.config.state_dtype)
        return model_bytes_from_config(self.model_config, self.dtype)

    def bandwidth(self) -> dict:
        """Copy bandwidth of the device, measured once per run (bytes/s in ``bytes_per_s``)."""
        if self._bandwidth is None:
            nbytes = self.opts.bandwidth_mib << 20 if self.opts.bandwidth_mib else None
            self._bandwidth = measure_copy_bandwidth(self.device, nbytes)
            self._bandwidth["bytes_per_s"] = self._bandwidth["GBps"] * 1e9
        return self._bandwidth

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------------------------------------ HF
    def hf_model(self):
        """HF transformers' model of the same folder, dtype and device (FLA kernels on a GPU when installed), warmed
        up once by a short generate (first-call CUDA / Triton JIT work stays out of every measurement)."""
        if self._hf is None:
            from bench.hf import hf_generate, load_hf

            if self.model.on_device:  # no checkpoint: HF builds its own random copy, after ours is released
                from bench.hf import random_hf

                self.release_llm()
                self._hf = random_hf(self.model.path, self.device, self.dtype)
                hf_generate(self._hf, [[1] * 16, [2] * 12], 3)
                return self._hf

            self._hf = load_hf(self.model.path, self.device, self.dtype)
            hf_generate(self._hf, [[1] * 16, [2] * 12], 3)  # padded batch: the pad-left path warms up too
        return self._hf

    # ------------------------------------------------------------------------------------------------ output
    def metadata(self, scenario: str) -> dict:
        from ops.options import current_options

        mb = self.model_bytes()
        return {
            "scenario": scenario,
            "command": shlex.join([os.path.basename(sys.executable), "-m", "bench", *self.opts.argv]),
            "git": git_info(),
            "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
            "device": device_info(self.device),
            "versions": versions(),
            "model": {
                "name": self.model.name,
                "path": self.model.path,
                "random_weights": self.model.random_weights,
                "shape": shape_summary(self.model_config),
                **mb.as_dict(),
            },
            "dtype": str(self.dtype).removeprefix("torch."),
            "engine": self.engine_summary(),
            "kernel_options": asdict(current_options()),  # CE_PDL, CE_L2_PREFETCH, ... as this process reads them
            "copy_bandwidth": {k: v for k, v in self.bandwidth().items() if k != "bytes_per_s"},
        }

    def write(self, scenario: str, result: dict) -> Path | None:
        """``result`` as ``scenario``'s JSON. One marked ``"partial": true`` (bench spec writes one after each finished
        cell) is also kept here: a scenario that then fails keeps it beside its error (``partial``)."""
        self._partials[scenario] = result if result.get("partial") else {}
        if self.out_dir is None:
            return None
        return write_json(self.out_dir / f"{scenario}.json", result)

    def partial(self, scenario: str) -> dict:
        """The partial result ``scenario`` last wrote in this process, if its last write was one; else {}."""
        return self._partials.get(scenario, {})


# ---------------------------------------------------------------------------------------------------- metadata
def git_info() -> dict:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except Exception as e:  # no git, not a checkout: best effort
        return {"commit": None, "error": f"{type(e).__name__}: {e}"[:200]}


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "type": "cuda",
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_GiB": round(props.total_memory / 2**30, 1),
            "count": torch.cuda.device_count(),
        }
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return {"type": "cpu", "name": name, "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}


def versions() -> dict:
    def dist(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": dist("transformers"),
        "triton": dist("triton"),
        "fla-core": dist("fla-core") or dist("flash-linear-attention"),
    }


# ---------------------------------------------------------------------------------------------------- output
def _clean(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (torch.device, Path)):
        return str(value)
    return value


def write_json(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.partial")
    with open(tmp, "w") as f:
        json.dump(_clean(data), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


def default_out_dir(name: str) -> Path:
    return RESULTS_DIR / f"{name}-{datetime.datetime.now():%Y%m%d-%H%M%S}"


# ---------------------------------------------------------------------------------------------------- workloads
def random_prompt(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    high = min(PROMPT_TOKEN_CEILING, vocab_size - 1)
    return [rng.randint(0, high) for _ in range(length)]


def greedy(max_tokens: int, final_only: bool = False):
    """Greedy, ignore_eos; ``final_only``: the engine reports the request only when it finishes (as LLM.generate)."""
    from compiled_engine.sampling_params import RequestOutputKind, SamplingParams

    kind = RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.CUMULATIVE
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=kind)


# ---------------------------------------------------------------------------------------------------- statistics
def percentile(values, q: float) -> float | None:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def distribution(values, scale: float = 1.0) -> dict:
    """p50/p90/p99/mean/max of ``values * scale`` (e.g. seconds -> ms with scale=1e3)."""
    data = [v * scale for v in values if v is not None]
    if not data:
        return {"n": 0}
    return {
        "n": len(data),
        "mean": sum(data) / len(data),
        "p50": percentile(data, 50),
        "p90": percentile(data, 90),
        "p99": percentile(data, 99),
        "max": max(data),
    }


def ratio(ours: float | None, theirs: float | None) -> float | None:
    if not ours or not theirs:
        return None
    return ours / theirs


def request_timings(outputs) -> dict:
    """TTFT and TPOT distributions (ms) of finished RequestOutputs (engine perf_counter timestamps)."""
    ttft, tpot = [], []
    for o in outputs:
        if o.first_token_time is None:
            continue
        ttft.append(o.first_token_time - o.arrival_time)
        if o.finished_time is not None and len(o.token_ids) > 1:
            tpot.append((o.finished_time - o.first_token_time) / (len(o.token_ids) - 1))
    return {"ttft_ms": distribution(ttft, 1e3), "tpot_ms": distribution(tpot, 1e3)}


# ---------------------------------------------------------------------------------------------------- plots
def pyplot():
    """matplotlib.pyplot with the Agg backend, or None where matplotlib is not installed (plots are skipped)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    return plt


def save_plot(ctx: Context, name: str, draw) -> str | None:
    """``draw(plt)`` draws one figure; it is saved as ``<out>/<name>.png``. None when skipped."""
    plt = pyplot()
    if plt is None or ctx.out_dir is None:
        return None
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    path = ctx.out_dir / f"{name}.png"
    fig = plt.figure(figsize=(7, 4.5))
    try:
        draw(plt)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path.name


class StepLog:
    """Times every engine step of one ``generate`` (host wall time between the step's call and its return). A
    synchronous step reads its tokens back inside the call, so it includes its device time; with ``overlap_decode``
    a call waits for the previous step's tokens instead, so a step's device time is charged to the next call (the
    totals hold; the split by kind is approximate).

    Wraps ``llm.engine.step`` and ``llm.engine.scheduler.schedule`` on the instances for the duration of the ``with``
    block; an engine without them is left alone and the summary is empty.
    """

    SLOWEST = 5

    def __init__(self, llm, profile_first_step: bool = False):
        """``profile_first_step``: run the first step under cProfile (Triton compiles and autotuning show there, and
        waits for the GPU in the call that waits) and keep its largest entries in the summary. That one step then
        also carries cProfile's overhead."""
        self.engine = getattr(llm, "engine", None)
        self.scheduler = getattr(self.engine, "scheduler", None)
        self.steps: list[tuple[str, int, int, float]] = []  # (kind, sequences, tokens, seconds)
        self.held_back = 0
        self.profile_first_step = profile_first_step
        self.first_step_profile: dict | None = None

    def __enter__(self) -> "StepLog":
        if self.engine is None or self.scheduler is None:
            return self
        engine, scheduler = self.engine, self.scheduler
        step, schedule = engine.step, scheduler.schedule
        held_before = getattr(scheduler, "num_held_back", 0)
        batch_of_step = []

        def logged_schedule():
            batch = schedule()
            batch_of_step.append(batch)
            return batch

        def logged_step():
            batch_of_step.clear()
            profiled = self.profile_first_step and not self.steps
            start = time.perf_counter()
            if profiled:
                outputs, self.first_step_profile = profiled_call(step)
            else:
                outputs = step()
            seconds = time.perf_counter() - start
            batch = batch_of_step[0] if batch_of_step else None
            if batch is not None:
                kind = "prefill" if batch.is_prefill else "decode"
                self.steps.append((kind, len(batch.seqs), sum(batch.num_tokens), seconds))
            return outputs

        wrapped_before = ("step" in vars(engine), "schedule" in vars(scheduler))

        def restore():
            for obj, name, original, was_attribute in ((engine, "step", step, wrapped_before[0]),
                                                       (scheduler, "schedule", schedule, wrapped_before[1])):
                if was_attribute:
                    setattr(obj, name, original)
                else:
                    delattr(obj, name)  # back to the class's method
            self.held_back = getattr(scheduler, "num_held_back", 0) - held_before

        engine.step, scheduler.schedule = logged_step, logged_schedule
        self._restore = restore
        return self

    def __exit__(self, *exc) -> None:
        restore = getattr(self, "_restore", None)
        if restore is not None:
            restore()

    def summary(self) -> dict:
        by_kind = {}
        for kind in ("prefill", "decode"):
            steps = [s for s in self.steps if s[0] == kind]
            by_kind[kind] = {"steps": len(steps), "tokens": sum(s[2] for s in steps),
                             "host_s": sum(s[3] for s in steps)}
        slowest = sorted(self.steps, key=lambda s: -s[3])[: self.SLOWEST]
        summary = {**by_kind, "held_back": self.held_back,
                   "first": [_step_row(s) for s in self.steps[: self.SLOWEST]],
                   "slowest": [_step_row(s) for s in slowest]}
        if self.first_step_profile is not None:
            summary["first_step_profile"] = self.first_step_profile
        return summary


def profiled_call(fn, top: int = 25, calls: int = 1) -> tuple[object, dict]:
    """``fn()`` under cProfile: its result and the ``top`` Python functions by cumulative and by self time, in seconds
    per one of the ``calls`` that ``fn`` makes. Time the host spends waiting for the GPU shows up in the call that
    waits (a ``.tolist()`` or synchronize). cProfile only: torch.profiler added ~2 s to a profiled engine step
    (CPU-measured), which would distort the run it explains."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    try:
        result = fn()
    finally:
        profile.disable()
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (primitive calls, calls, self s, cumulative s, _)

    def largest(column: int) -> list[dict]:
        rows = sorted(stats.items(), key=lambda item: -item[1][column])[:top]
        return [{"function": f"{name} ({'/'.join(file.rsplit('/', 2)[-2:])}:{line})", "calls": n / calls,
                 "self_s": round(own / calls, 6), "cum_s": round(cum / calls, 6)}
                for (file, line, name), (_, n, own, cum, _) in rows]

    return result, {"by_cumulative_time": largest(3), "by_self_time": largest(2)}


def _step_row(step: tuple[str, int, int, float]) -> dict:
    kind, seqs, tokens, seconds = step
    return {"kind": kind, "seqs": seqs, "tokens": tokens, "s": round(seconds, 4)}


def decode_fn_info(decode_fn) -> dict:
    """What the compiled decode reports about its own start-up (graphs.DecodeGraphRunner), if anything."""
    info = {"decode_fn": type(decode_fn).__name__ if not callable(getattr(decode_fn, "__func__", None)) else "eager"}
    for attr in ("startup_seconds", "bucket_seconds", "buckets"):
        value = getattr(decode_fn, attr, None)
        if value is not None:
            info[f"decode_{attr}"] = {str(k): v for k, v in value.items()} if isinstance(value, dict) else value
    return info

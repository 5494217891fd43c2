"""Compiled decode: one ``torch.compile(mode="reduce-overhead")`` graph (one CUDA graph) per bucketed batch size.

    runner = DecodeGraphRunner(model, max_num_seqs=256, max_blocks_per_seq=512, device="cuda")
    runner.warmup()                       # compile + capture every bucket, largest first
    out = runner(step)                    # step: an unpadded decode StepInputs from Runtime.build_step
    out.logits, out.tokens         # the graph's own buffers: valid until the runner's next call

Per step the host does only this: validate shapes, bring the static buffers to the step (nothing when the step is
what the last replay left there: the same sequences decoding on greedily; otherwise one copy for a step built on the
host: graphs/static_inputs.py), replay the bucket's CUDA graph, and return views of the live rows of its outputs.
The graphs are captured by the runner itself (``capture="runner"``, the default): the model is compiled without
cudagraph trees and each bucket's compiled call is captured into a ``torch.cuda.CUDAGraph``, so a replay is one
``graph.replay()``. ``capture="trees"`` leaves capture and replay to torch's reduce-overhead (cudagraph trees),
which costs ~0.3 ms of host time per step in guards and bookkeeping (``CUDA_GRAPH_CAPTURES``).
Everything from token ids to logits and greedy tokens, the in-place cache/state updates included, is one graph:
traced with ``fullgraph=True`` (a graph break raises), static tensor shapes with the bucket size as the only
symbolic value (at most three compiles: see ``expected_compiles``), every kernel a ``torch.ops.ce`` custom op or an
aten op; one CUDA graph per bucket.

What makes the CUDA graphs real rather than silently skipped (each one a rule of docs/ARCHITECTURE.md, "Compile and
capture"):
* every tensor the graph reads lives at a fixed address: weights and caches are module parameters/buffers, the
  step inputs are the static buffers, marked ``mark_static_address``;
* the caches are mutated only through custom ops that declare the mutation (``Tensor(a!)``);
* nothing in the step reads a device value on the host (``.item()``/``.tolist()`` would break the graph, which
  ``fullgraph=True`` turns into an error). The CPU reference kernels do call ``.tolist()``, but inside opaque
  custom ops that Dynamo does not trace.

After warm-up the compiled calls (cudagraph trees' replays, batches beyond the graphs) run under
``set_stance("fail_on_recompile")``, scoped to the call (the stance is
process-global; a context manager keeps unrelated compiled code in the process unaffected): a guard that fails
after start-up is a bug (a dtype or device that changed, a cache that was reallocated) and raises instead of
compiling for tens of seconds in the middle of serving.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import time
import types
from typing import Callable, Iterable

import torch
from torch import nn
from tqdm.auto import tqdm

from ops.sample import sample_op
from ops.step import DecodeOutput, HostTokens, SamplingInputs, StepInputs
from graphs.buckets import BucketPolicy
from graphs.static_inputs import StaticDecodeInputs, StaticSamplingInputs
from ops.decode_inputs import advance_decode_inputs
from ops.library import OPS, prepare_device
from ops.options import CUDA_GRAPH_CAPTURES, current_options

logger = logging.getLogger(__name__)

DEFAULT_MODE = "reduce-overhead"
# Who captures and replays the CUDA graphs of mode="reduce-overhead" (CUDA_GRAPH_CAPTURES; the default is the
# cuda_graphs option of ops/options.py, CE_CUDA_GRAPHS):
#   "runner": the runner, around a torch.compile without cudagraphs: one torch.cuda.CUDAGraph per bucket, replayed
#             with graph.replay() (~0.01 ms of host time a step);
#   "trees":  torch's cudagraph trees (mode="reduce-overhead" as torch implements it): every replay goes through
#             Dynamo's guards, AOTAutograd's wrappers and the trees' bookkeeping (~0.3 ms of host time a step:
#             bench/NOTES.md, "Runner capture against cudagraph trees").


def decode_forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    state_slots: torch.Tensor,
    token_ring: torch.Tensor,
    ring_slot: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    batch: int,
    block_size: int,
    sample: bool,
) -> DecodeOutput:
    """The traced function: static buffers (first ``batch`` rows) -> the model's ``DecodeOutput`` (logits
    ``[batch, vocab]`` in the model's dtype, the step's tokens ``[batch]``).

    The full buffers are the inputs and the bucket's rows are sliced inside the graph, so the graph's inputs are
    always the same static tensors (sliced views as inputs would be "new" inputs that reduce-overhead copies).
    ``sample`` (a Python bool: each value is a graph of its own) draws the tokens with ``ce::sample`` from the
    sampling buffers (graphs/static_inputs.py, StaticSamplingInputs); otherwise they are the greedy tokens. The
    epilogue, ``ce::advance_decode_inputs``, takes the greedy tokens (or the drawn ones) and turns the step's inputs
    into the next step's, for the steady state in which the same sequences decode on (graphs/static_inputs.py): the
    tokens into ``input_ids[:batch]`` and into row ``ring_slot`` of the host-visible ``token_ring`` (the ring slot
    incremented), and positions, slot_mapping and context_lens one position further for live rows.
    """
    step = StepInputs(
        input_ids=input_ids[:batch],
        positions=positions[:batch],
        slot_mapping=slot_mapping[:batch],
        block_tables=block_tables[:batch],
        context_lens=context_lens[:batch],
        state_slots=state_slots[:batch],
        cu_seqlens=None,
        is_prefill=False,
    )
    logits = model.decode_logits(model(step))
    tokens = None
    if sample:
        tokens = sample_op(logits, temperature[:batch], top_k[:batch], top_p[:batch], min_p[:batch], seeds[:batch],
                           counters[:batch])
    tokens = advance_decode_inputs(logits, step.input_ids, step.positions, step.slot_mapping, step.context_lens,
                                   step.block_tables, token_ring, ring_slot, block_size, tokens)
    return DecodeOutput(logits, tokens)


def expected_compiles(buckets: Iterable[int], variants: int = 2) -> int:
    """Dynamo/Inductor compiles for a warm-up of ``buckets`` (largest first) under automatic dynamic shapes, for
    ``variants`` values of ``sample`` (DecodeGraphRunner.variants: 2 by default, 1 without sampling graphs).

    Per variant: the largest bucket is compiled static; the first smaller bucket >= 2 triggers one recompile with the
    batch size symbolic, which every other bucket >= 2 reuses; batch 1 is specialised (Dynamo never makes 0 or 1
    symbolic). A new value of ``sample`` starts that sequence again.
    """
    sizes = sorted(set(buckets))
    largest = sizes[-1]
    return variants * (1 + any(2 <= b < largest for b in sizes) + (1 in sizes and largest != 1))


_runner_ids = itertools.count()


def private_copy(fn: Callable, suffix: str) -> Callable:
    """A copy of ``fn`` with its own code object.

    Dynamo keeps compiled graphs (and counts recompiles against ``recompile_limit``) per code object. A private
    code object per runner (or compiled speculative round: compiled_engine/speculative.py) means each one's buckets
    are counted on their own (two runners in one process, as in tests, do not add up towards the limit) and its
    graphs are freed with it.
    """
    name = f"{fn.__name__}_{suffix}"
    replace = {"co_name": name}
    if hasattr(fn.__code__, "co_qualname"):  # Python >= 3.11
        replace["co_qualname"] = name
    code = fn.__code__.replace(**replace)
    copy = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__doc__ = fn.__doc__
    return copy


def enable_compile_caches() -> None:
    """Turn on Inductor's on-disk FX graph cache and AOTAutograd cache where this torch has them.

    Compiled artifacts are then reused across processes (keyed on the graph, shapes, torch version and config), so
    a restart recompiles nothing. Both default to on in recent torch; an explicit environment setting (e.g.
    ``TORCHINDUCTOR_FX_GRAPH_CACHE=0`` while debugging) is respected. Cache folder: ``TORCHINDUCTOR_CACHE_DIR``.
    """
    import torch._inductor.config as inductor_config

    if "TORCHINDUCTOR_FX_GRAPH_CACHE" not in os.environ and hasattr(inductor_config, "fx_graph_cache"):
        inductor_config.fx_graph_cache = True
    try:
        import torch._functorch.config as functorch_config
    except ImportError:  # pragma: no cover (very old torch)
        return
    if "TORCHINDUCTOR_AUTOGRAD_CACHE" not in os.environ and hasattr(functorch_config, "enable_autograd_cache"):
        functorch_config.enable_autograd_cache = True


def register_inductor_fallbacks(ops: Iterable[torch._ops.OpOverload]) -> None:
    """Register custom ops with Inductor as fallbacks (opaque calls) before it compiles, as its implicit path would.

    Why: when Inductor first meets a custom op in a graph, torch <= 2.12 formats every input of that call for an
    INFO log line, eagerly, logged or not (``operator_str`` in ``GraphLowering.call_function``; torch 2.13 formats
    it lazily). An input's IR prints its own inputs' IR, so the text doubles with every residual-connected layer
    before the call: an op first used at the end of the 24-layer decode graph kept Inductor busy for minutes
    (bench/NOTES.md, "Start-up overrun"; reproduced on the CPU with torch 2.13 and ``TORCH_LOGS=inductor``). An op
    already registered skips that path. The layout constraint is the one the
    implicit path derives from the op's tags (ops/library.py tags every op ``needs_exact_strides``). Internal
    APIs, the same in torch 2.11 and 2.13; where they are missing, Inductor's implicit path runs as before.
    """
    try:
        from torch._inductor import lowering
        from torch._library.utils import get_layout_constraint_tag
    except ImportError:  # pragma: no cover (a torch without these modules)
        return
    if not all(hasattr(lowering, name) for name in ("lowerings", "make_fallback", "tag_to_layout_constraint")):
        return  # pragma: no cover
    for op in ops:
        if op not in lowering.lowerings:
            constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
            lowering.make_fallback(op, layout_constraint=constraint)


def raise_recompile_limit(num_graphs: int) -> None:
    """Let Dynamo keep ``num_graphs`` graphs of one function (one per bucket) without giving up on it.

    Each bucket is a recompile of the same function (a new value of its int ``batch`` argument). The limit is
    ``recompile_limit`` (renamed from ``cache_size_limit`` in torch 2.7); ``accumulated_recompile_limit`` bounds
    the same count across guard families. Only ever raised, never lowered.
    """
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(config, name) and getattr(config, name) < num_graphs:
            setattr(config, name, num_graphs)


def _fail_on_recompile() -> contextlib.AbstractContextManager:
    if hasattr(torch.compiler, "set_stance"):
        return torch.compiler.set_stance("fail_on_recompile")
    return contextlib.nullcontext()  # pragma: no cover (torch < 2.6: no stances)


def _block_size_of(model: nn.Module) -> int:
    """KV block size from the model's allocated caches (1 when it has no attention layer: nothing to pad)."""
    for module in model.modules():
        cache = getattr(module, "k_cache", None)
        if isinstance(cache, torch.Tensor):
            return cache.shape[1]
    return 1


def _check_caches_allocated(model: nn.Module) -> None:
    for name, module in model.named_modules():
        for buffer in ("k_cache", "v_cache", "conv_state", "recurrent_state"):
            if buffer in module._buffers and module._buffers[buffer] is None:
                raise ValueError(
                    f"{name}.{buffer} is not allocated: build the runner after the caches "
                    "(compiled_engine.cache.allocate_kv_cache and allocate_state_pools, which Runtime calls)"
                )


class DecodeGraphRunner:
    """Bucketed, compiled (and on CUDA, graph-captured) decode step of a HybridModel.

    ``__call__(step)`` takes an unpadded decode StepInputs and returns its ``DecodeOutput``. A batch larger
    than the largest bucket (only possible with explicit ``buckets`` short of ``max_num_seqs``) runs the eager
    model instead.

    ``backend`` overrides ``mode`` with a custom torch.compile backend (debugging, graph counting in tests).
    ``capture`` ("runner" or "trees", see ``CUDA_GRAPH_CAPTURES``) defaults to the ``cuda_graphs`` option
    (ops/options.py), read here, when the runner is built.
    The runner holds the caches' addresses: if the caches are reallocated, build a new runner.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        device: str | torch.device,
        buckets: Iterable[int] | None = None,
        mode: str | None = DEFAULT_MODE,
        fullgraph: bool = True,
        backend: str | Callable | None = None,
        capture: str | None = None,
        sampling: bool = True,
    ):
        """``sampling``: also compile and capture, for every bucket, the variant that samples (``ce::sample``)."""
        _check_caches_allocated(model)
        self.model = model
        self.device = torch.device(device)
        self.policy = BucketPolicy.create(max_num_seqs, buckets)
        self.max_num_seqs = max_num_seqs
        self.static = StaticDecodeInputs(self.policy.max_size, max_blocks_per_seq, _block_size_of(model), self.device)
        self.sampling = StaticSamplingInputs(self.policy.max_size, self.device)
        self.variants = (False, True) if sampling else (False,)  # the ``sample`` values that get graphs
        self.mode = mode if backend is None else None
        self.fullgraph = fullgraph
        self.name = f"runner{next(_runner_ids)}"
        fn = private_copy(decode_forward, self.name)
        # dynamic=None ("automatic dynamic"): the largest bucket compiles with static shapes, the next bucket makes
        # Dynamo recompile once with the batch size symbolic (every tensor shape stays static: the step inputs are
        # full static buffers, sliced to the bucket inside the graph), and batch 1 gets its own specialised graph.
        # So at most three compiles whatever the number of buckets (17 by default: compiling each one separately
        # takes minutes for the Qwen3.5-0.8B shape), and still one CUDA graph per bucket: cudagraph trees record one
        # per distinct batch size.
        compile_kwargs = dict(fullgraph=fullgraph, dynamic=None)
        cuda_graphs = self.device.type == "cuda" and backend is None and (mode or "").startswith("reduce-overhead")
        capture = capture or current_options().cuda_graphs
        if capture not in CUDA_GRAPH_CAPTURES:
            raise ValueError(f"capture must be one of {CUDA_GRAPH_CAPTURES}, got {capture!r}")
        # The runner's own graphs need a compile without cudagraph trees: "default" is reduce-overhead without them.
        self.capture = capture if cuda_graphs else None
        if backend is not None:
            self._compiled = torch.compile(fn, backend=backend, **compile_kwargs)
        else:
            compile_mode = "default" if self.capture == "runner" else mode
            self._compiled = torch.compile(fn, mode=compile_mode, **compile_kwargs)
        self._stance: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        # capture == "runner": (bucket, sample) -> (its CUDA graph, the output buffers the graph writes), filled by
        # warmup().
        self._graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, DecodeOutput]] = {}
        self._pool = None  # the memory pool the runner's graphs share (set by warmup)
        # The tokens the last replay returned: the graph also left them in static.input_ids[:n].
        self._last_tokens: torch.Tensor | None = None
        self.warmed_up = False
        self.startup_seconds: float | None = None
        self.bucket_seconds: dict[int, float] = {}
        if self.policy.max_size < max_num_seqs:
            logger.info(
                "decode buckets %s stop short of max_num_seqs=%d: larger batches run eagerly",
                list(self.policy.sizes),
                max_num_seqs,
            )

    # Where ``Runtime.decode`` builds the steps it passes (``decode_fn.step_device``): on the host, so that a step
    # reaches the graph's buffers in one copy (graphs/static_inputs.py) instead of an upload plus device copies.
    step_device = torch.device("cpu")

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.policy.sizes

    @property
    def captured_buckets(self) -> tuple[int, ...]:
        """The buckets with a CUDA graph of the runner's own (``capture="runner"``), after warmup()."""
        return tuple(sorted({bucket for bucket, _ in self._graphs}))

    # --------------------------------------------------------------------------------------------------- start-up
    @torch.inference_mode()
    def warmup(self, progress: bool = False) -> float:
        """Compile and capture every bucket (each variant: greedy, and sampling unless turned off), largest first;
        returns the start-up seconds. ``progress``: a progress bar over the buckets' variants (stderr).

        Largest first: CUDA graphs of one runner share a memory pool, and a smaller graph recorded after a larger
        one reuses the larger one's memory instead of growing the pool. Every lane of the dummy batches is a padding
        lane (null slot, null block, context 0), so warm-up never touches a live sequence's state or KV.
        Cudagraph trees run each bucket's function eagerly once (warm-up), record it on the second call and replay
        from the third. The runner's own capture runs it eagerly twice (compile, Triton's JIT and autotuning: none of
        it may happen inside a capture), captures it into a graph in a memory pool that all buckets share, and
        replays it once. Either way the last call checks the replay path before serving does.
        """
        enable_compile_caches()
        register_inductor_fallbacks(OPS)
        prepare_device(self.device)  # the kernels' per-device buffers, outside every graph's memory pool
        raise_recompile_limit(len(self.policy) * len(self.variants))
        self._pool = torch.cuda.graph_pool_handle() if self.capture == "runner" else None
        start = time.perf_counter()
        self.static.clear()
        what = "compiling and capturing" if self.capture else "compiling"
        with tqdm(total=len(self.policy) * len(self.variants), desc=f"{what} decode steps", unit="step",
                  disable=not progress) as bar:
            for bucket in reversed(self.policy.sizes):
                t0 = time.perf_counter()
                for sample in self.variants:
                    self._compile_and_capture(bucket, sample)
                    bar.update()
                self.bucket_seconds[bucket] = time.perf_counter() - t0
                logger.debug("decode bucket %d: compiled and captured in %.1f s", bucket, self.bucket_seconds[bucket])
        self.startup_seconds = time.perf_counter() - start
        self._last_tokens = None  # warm-up's runs wrote the padding lanes' tokens into the input ids
        self.static.forget()
        self._stance = _fail_on_recompile
        self.warmed_up = True
        logger.info(
            "compiled decode (%s): %d buckets %s compiled%s in %.1f s",
            self.mode or "custom backend",
            len(self.policy),
            list(self.policy.sizes),
            f" and captured ({self.capture})" if self.capture else "",
            self.startup_seconds,
        )
        return self.startup_seconds

    def _compile_and_capture(self, bucket: int, sample: bool) -> None:
        runs = {"trees": 3, "runner": 2}.get(self.capture, 1)
        for _ in range(runs):
            self._replay(bucket, sample)
        if self.capture == "runner":
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool), self._stance():
                outputs = self._call_compiled(bucket, sample)
            self._graphs[bucket, sample] = (graph, outputs)
            self._replay(bucket, sample)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------------------------------------------ steps
    @torch.inference_mode()
    def __call__(self, step: StepInputs, sampling: SamplingInputs | None = None) -> DecodeOutput:
        """The decode ``step``'s logits (model dtype) and tokens: views of the live rows of the graph's
        output buffers, valid only until this runner's next call, whose replay overwrites them (cudagraph trees then
        make reading them an error). No copy: at batch 256 and a 248k vocabulary the logits are 127 MB, and the
        engine consumes them (samples) before the next step; ``Runtime.decode_step`` returns an fp32 copy.

        The tokens are the greedy ones, or with ``sampling`` (``[N]`` per-row parameters) those ``ce::sample``
        draws, in the sampling variant of the graph (or eagerly where the runner has no such variant).
        ``step``'s fields may be on the host (``step_device``: one copy into the graph's buffers) or the device.
        Input ids that are the tokens this runner returned last (the engine feeds them back) are already in the
        graph's input buffer: they are not copied. The output's ``host_tokens`` are a row of the graph's token ring in
        host memory: read them (``tolist`` waits for the replay) before ``graphs.static_inputs.TOKEN_RING_SLOTS`` (4)
        more calls, which write the ring's rows in turn."""
        n = step.num_sequences
        sample = sampling is not None
        if not self.policy.covers(n) or sample not in self.variants:
            self.static.check(step)
            self._last_tokens = None
            return eager_decode(self.model, _on_device(step, self.device), sampling)
        last = self._last_tokens
        if last is not None and step.input_ids.shape == last.shape and step.input_ids.data_ptr() == last.data_ptr():
            step = dataclasses.replace(step, input_ids=self.static.input_ids[:n])
        self.static.fill(step)  # validates the step
        if sample:
            self.sampling.fill(sampling, n)
        return self._replay_step(n, sample)

    @torch.inference_mode()
    def replay_last(self, num_sequences: int) -> DecodeOutput:
        """Replay the graph of ``num_sequences`` on the step last copied into the static buffers (no new inputs).

        For benchmarks: back-to-back replays measure the GPU time of a step without the host's per-step work. Each
        replay is the next greedy step of the same sequences (the graph advanced its inputs: one position further,
        the previous replay's greedy tokens as input ids); past the KV blocks the host reserved, keys and values go to
        the null block, so the sequences in it are garbage afterwards. ValueError once a live row's context would pass
        the end of its block table (the engine's max_model_len).
        """
        if not (self.warmed_up and self.policy.covers(num_sequences)):
            raise ValueError(f"no warmed-up graph for {num_sequences} sequences (buckets {list(self.buckets)})")
        left = self.static.replays_left()
        if left is not None and left <= 0:
            raise ValueError("the live sequences reached the end of their block tables (max_model_len): a replay "
                             "would read past them")
        return self._replay_step(num_sequences, False)

    def _replay_step(self, n: int, sample: bool) -> DecodeOutput:
        """Replay the bucket of ``n`` sequences on the static buffers as they are; its output, the tokens in host
        memory included (their token-ring row, ready once the replay is done)."""
        out = self._replay(self.policy.bucket_for(n), sample)
        ring_row = self.static.replayed()
        ready = None
        if self.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()
        self._last_tokens = out.tokens[:n]
        return DecodeOutput(out.logits[:n], self._last_tokens, HostTokens(ring_row[:n], ready))

    def _replay(self, bucket: int, sample: bool) -> DecodeOutput:
        captured = self._graphs.get((bucket, sample))
        if captured is not None:
            graph, outputs = captured
            graph.replay()  # reads the static buffers as they are now; overwrites `outputs`
            return outputs
        if self.capture == "trees":
            # A new step: outputs of the previous replay may now be overwritten (callers were told so).
            torch.compiler.cudagraph_mark_step_begin()
        with self._stance():
            return self._call_compiled(bucket, sample)

    def _call_compiled(self, bucket: int, sample: bool) -> DecodeOutput:
        return self._compiled(self.model, *self.static.tensors(), *self.sampling.tensors(), bucket,
                              self.static.block_size, sample)


def eager_decode(model: nn.Module, step: StepInputs, sampling: SamplingInputs | None = None) -> DecodeOutput:
    """A decode step on the eager model: its logits and tokens (greedy, or drawn by ``ce::sample``)."""
    out = model.decode_output(model(step))
    if sampling is None:
        return out
    device = out.logits.device
    fields = [getattr(sampling, f.name) for f in dataclasses.fields(sampling)]
    if device.type == "cuda":  # pinned and asynchronous: a pageable copy would wait for the GPU to drain
        fields = [t.pin_memory().to(device, non_blocking=True) if t.device.type == "cpu" else t for t in fields]
    return DecodeOutput(out.logits, sample_op(out.logits, *fields))


def _on_device(step: StepInputs, device: torch.device) -> StepInputs:
    """``step`` with its tensors on ``device`` (a host-built step for the eager model, past the largest bucket)."""
    moved = {f.name: getattr(step, f.name).to(device) for f in dataclasses.fields(step)
             if isinstance(getattr(step, f.name), torch.Tensor)}
    return dataclasses.replace(step, **moved)

"""Runtime: the model, its caches and a step API, for systems that embed compiled_engine.

    rt = Runtime.from_pretrained(path, device="cuda", dtype=torch.bfloat16)   # compiled decode on CUDA
    seq = rt.add_sequence(prompt_token_ids)       # takes a state slot (zeroed)
    logits = rt.prefill([seq])                     # [1, vocab] fp32: logits after the last prompt token
    seq.token_ids.append(next_token)
    logits = rt.decode_step([seq])                 # one new token per sequence: [1, vocab] fp32
    out = rt.decode([seq])                         # the same step as the engine runs it: out.tokens [1],
                                                   # out.logits in the model dtype, valid until the next decode
    rt.release(seq)                                # frees its KV blocks and its state slot

A Runtime is three parts, each with one role, built here and handed to each other at construction:
``memory_plan.allocate_caches`` sizes and allocates the caches; ``caches`` (CacheManager) decides which blocks and
slot each sequence holds; ``executor`` (ModelExecutor) runs packed steps on the model, on every tensor-parallel
rank. The Runtime checks a step, reserves its blocks, packs it (compiled_engine.step.pack_step) and executes it.

``prefill`` runs every not-yet-computed token of each sequence (or ``num_tokens[i]`` of them: chunked prefill) as
one varlen batch; ``decode_step`` runs exactly one token per sequence. Both allocate KV blocks as needed and raise
``OutOfBlocksError`` when the cache is full (the scheduler asks the CacheManager first and preempts instead).

Speculative decoding (``speculative_config={"method": "mtp", "num_speculative_tokens": k}``: the checkpoint's MTP
layer drafts k tokens; compiled_engine/speculative.py has the round) adds (with tensor parallelism every rank runs
the same device work: ModelExecutor's speculative methods):

    spec = rt.prefill_for_drafts([seq])            # spec.logits [1, vocab]: sample the next token from them
    seq.token_ids.append(token)
    drafts = rt.draft_after_prefill(spec, torch.tensor([token]))     # [1, k] on the device
    spec = rt.verify([seq], drafts.tolist())       # spec.logits [k+1, vocab]: the target's on last token + drafts
    accepted, tokens = <rejection sampling of spec.logits>  # [1] and [1, k+1] (rejection_sampler.py)
    drafts = rt.accept(spec, accepted, tokens)     # commits the accepted states, drafts again; no host sync
    rt.advance(spec, accepted.tolist(), tokens.tolist())   # appends tokens[:a+1]; lengths move on
    spec, results = rt.fused_round([seq], drafts.tolist())   # verify..accept in one call (sampling=: sampled rows):
                                                   # compiled (CUDA graphs) with compile; valid until the next round
    rows = results.rows()                          # [[a, t_0..t_k, d_1..d_k]], the round's read-back (compiled: no
                                                   # copy, its graph wrote them to host memory); on the device:
                                                   # results.num_accepted, .tokens, .drafts
    rt.advance(spec, [r[0] for r in rows], [r[1 : k + 2] for r in rows])   # the next drafts: r[k + 2 :]

Chained rounds overlap the host's read-back of one round with the next on the device:

    spec, results = rt.fused_round([seq], drafts, chain_rounds=32)   # blocks for 32 more rounds where free (else 8)
    if rt.can_chain(spec):
        results, spec_next, next_results = rt.chain_round(spec, results)   # queued before reading `results`
    rt.advance(spec, ...results.rows()...); rt.advance(spec_next, ...next_results.rows()...)   # in order

Prefill steps, and rounds that suppress stop tokens (min_tokens), run eagerly.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Iterable, Sequence as Seq

import torch

from compiled_engine.cache_manager import CacheManager, OutOfBlocksError, blocks_needed
from compiled_engine.config import ModelConfig, RuntimeConfig
from compiled_engine.distributed import check_divisible
from compiled_engine.executor import ModelExecutor
from compiled_engine.loader import WeightSource, load_model
from compiled_engine.memory_plan import allocate_caches
from compiled_engine.model import HybridModel
from compiled_engine.sampling_params import as_token_id
from compiled_engine.sequence import Sequence
from compiled_engine.speculative import (RoundResults, SpeculativeRound, SpeculativeStep, pack_verify_step,
                                         successor_counters, successor_fields)
from compiled_engine.step import PaddingSequence, decode_lane_count, pack_step, upload
from ops.step import DecodeOutput, SamplingInputs, StepInputs
from compiled_engine.tp_workers import TensorParallelWorkers
from graphs import DecodeGraphRunner, prefill_buckets
from ops.delta_rule import max_chunk_rows
from ops.flash_attention import check_flash_attn_usable

__all__ = ["OutOfBlocksError", "Runtime", "RuntimeConfig", "resolve_device", "resolve_dtype"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """None: CUDA where torch sees a GPU, else the CPU; else ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (or such a
    torch.device). Anything else raises ValueError naming ``device``."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    given = device
    try:
        device = torch.device(device) if isinstance(device, (str, torch.device)) else None
    except RuntimeError:  # an unknown device string
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {given!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    return device


DTYPE_ALIASES = {"auto": None, "half": "float16", "float": "float32"}  # vLLM's spellings


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The model dtype: None or ``"auto"`` = bf16 on GPUs, fp32 on CPU; else one of ``DTYPES``, by name (vLLM's
    ``"half"`` and ``"float"`` too) or as the ``torch.dtype``. Anything else (``torch.int8``, ``"int8"``,
    ``torch.float64``, a number) raises ValueError naming ``dtype``."""
    if isinstance(dtype, str):
        name = DTYPE_ALIASES.get(dtype, dtype)
        if name is not None and name not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)} (or 'auto'), got {dtype!r}")
        dtype = None if name is None else DTYPES[name]
    if dtype is None:  # bf16 on GPUs; fp32 on CPU, where bf16 matmuls are slow and tests compare with HF in fp32
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if not isinstance(dtype, torch.dtype) or dtype not in DTYPES.values():
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} or that torch.dtype, got {dtype!r}")
    return dtype


class Runtime:
    def __init__(
        self,
        model: HybridModel,
        config: RuntimeConfig,
        device: torch.device,
        dtype: torch.dtype,
        workers: TensorParallelWorkers | None = None,
        compile: bool = False,
        progress: bool = False,
    ):
        """``workers``: the other tensor-parallel ranks, when this is rank 0 of a sharded model. ``compile``:
        compile and capture what decodes now (``compile_steps``; a tensor-parallel runtime does it once its
        workers are ready), with progress bars where ``progress``."""
        config.validate()
        config = config.for_model(model.config)
        draft_vocab = config.speculative_config.draft_vocab_size if config.speculative_config else None
        if draft_vocab is not None and draft_vocab > model.config.vocab_size:
            raise ValueError(f"speculative_config draft_vocab_size={draft_vocab} exceeds the model's vocab_size "
                             f"{model.config.vocab_size}")
        self.model = model
        self.model_config: ModelConfig = model.config
        self.config = config
        self.device = device
        self.dtype = dtype
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        mirror = workers.send_snapshot if workers is not None else None
        # Captured prompt steps (ModelExecutor.compile_prefill; with speculative decoding, the drafts after them too):
        # one rank, not flash-attn (its varlen call reads the longest sequence on the host).
        # Steps of several sequences too, up to max_prefill_capture_seqs (with speculative decoding, with their drafts).
        self._prefill_buckets = (
            prefill_buckets(config.max_prefill_capture_tokens, config.max_num_batched_tokens, self.max_model_len)
            if compile and workers is None and model.tp.world_size == 1 and device.type == "cuda"
            and config.attention_backend == "triton" else ())
        self._prefill_sequences = min(config.max_prefill_capture_seqs, config.max_num_seqs)
        # Mixed keys (decode lanes) are not captured with speculative decoding (graphs/prefill_graph.py); their
        # largest step is the largest bucket's tokens after its lanes, its logits a row a lane more.
        self._decode_lanes = config.mixed_decode_lanes if config.speculative_config is None else 0
        lanes = self._decode_lanes if self._prefill_buckets else 0
        self.cache_config, prefix_cache = allocate_caches(
            model, config, self.max_model_len, device, dtype, mirror, max(self._prefill_buckets, default=0) + lanes,
            self._prefill_sequences + lanes)
        self.executor = ModelExecutor(model, config.block_size, config.max_num_seqs, self.max_model_len, device,
                                      workers, config.speculative_config)
        self.caches = CacheManager(self.cache_config, self.executor.reset_state_slots, prefix_cache)
        self._next_seq_id = 0
        self._owner = object()  # stamped on the sequences this runtime makes (Sequence.owner), checked per step
        self.speculative_config = config.speculative_config
        if self.speculative_config is not None and model.mtp is None:
            raise ValueError("speculative_config method 'mtp' needs the model built with its MTP layer "
                             "(load_model(..., mtp=True))")
        if compile:
            self.compile_steps(progress)

    def compile_steps(self, progress: bool = False) -> None:
        """Compile (and capture) what decodes, on every rank: the decode step, or with speculative decoding the
        rounds (decode rows become verify rounds), and the decode step too where plain decode steps still run:
        ``disable_by_batch_size`` sends large batches to it, ``auto_disable`` the steps where drafting does not pay.
        Then the prompt and mixed steps, captured per token bucket and sequence bucket, where ``__init__`` chose
        buckets (and the memory plan left room for them). ``progress``: a progress bar for each (stderr)."""
        config = self.speculative_config
        if config is not None:
            self.executor.compile_rounds(progress)
        if config is None or config.disable_by_batch_size or config.auto_disable:
            self.compile_decode(progress=progress)
        if self._prefill_buckets:  # chosen with the memory plan (__init__)
            self.executor.compile_prefill(self._prefill_buckets, self._prefill_sequences, self._decode_lanes,
                                          progress)

    @property
    def decode_lanes(self) -> int:
        """The most decode rows (one-token sequences leading a prompt step) a prompt step computes through the linear
        layers' decode kernels, as many as a captured mixed step holds; a step of more computes them on the chunked
        path, as 0 does for every step (``RuntimeConfig.mixed_decode_lanes``, off with speculative decoding)."""
        return self._decode_lanes

    @property
    def speculative_round(self) -> SpeculativeRound | None:
        """The compiled rounds (compile_steps), or None: rounds run eagerly."""
        return self.executor.speculative_round

    # ----------------------------------------------------------------------------------------------- construction
    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        tensor_parallel_size: int = 1,
        compile: bool | None = None,
        progress: bool = False,
        weights: WeightSource | None = None,
        **runtime_config,
    ) -> "Runtime":
        """Load a checkpoint folder (config.json + safetensors). ``runtime_config``: fields of RuntimeConfig.

        ``compile``: compile and capture the decode step (torch.compile, one CUDA graph per bucketed batch size);
        default: on CUDA yes, on CPU no. ``tensor_parallel_size`` N > 1 shards the model over N processes (this one
        is rank 0; on CUDA rank r uses GPU r). Call ``close()`` (or use ``with``) to stop them; they also stop when
        this process exits. ``weights``: a ``loader.WeightSource`` that makes the checkpoint's tensors on each rank
        instead of reading them from ``path`` (which then needs only its config.json): the benchmarks' random weights.
        ``progress``: progress bars (stderr) while the weights load and the steps compile and capture.
        """
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        if compile is None:
            compile = device.type == "cuda"
        config = ModelConfig.from_pretrained(path)
        known = {f.name for f in dataclasses.fields(RuntimeConfig)}
        unknown = sorted(set(runtime_config) - known)
        if unknown:
            raise ValueError(f"unknown runtime option(s) {unknown}; known options: {sorted(known)}")
        runtime_config = RuntimeConfig(**runtime_config)
        runtime_config.validate()
        mtp = runtime_config.speculative_config is not None
        backend = runtime_config.attention_backend
        if backend == "flash_attn":
            check_flash_attn_usable(device, dtype, runtime_config.block_size)
        if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tensor_parallel_size!r}")
        if tensor_parallel_size == 1:
            model, report = load_model(path, config, device, dtype, progress=progress, attention_backend=backend,
                                       mtp=mtp, weights=weights)
            runtime = cls(model, runtime_config, device, dtype, compile=compile, progress=progress)
            runtime.load_report = report
            return runtime
        check_divisible(config, tensor_parallel_size)
        if mtp and runtime_config.speculative_config.scripted_drafts:
            raise ValueError("speculative_config scripted_drafts runs on one rank only (tensor_parallel_size=1)")
        if device.type == "cuda" and torch.cuda.device_count() < tensor_parallel_size:
            raise ValueError(f"tensor_parallel_size={tensor_parallel_size} needs that many GPUs; "
                             f"{torch.cuda.device_count()} visible")
        if device.type == "cuda":
            device = torch.device("cuda", 0)
            torch.cuda.set_device(device)
        args = {"path": path, "model_config": config, "dtype": dtype, "runtime_config": runtime_config,
                "weights": weights}
        workers = TensorParallelWorkers(tensor_parallel_size, device, args)
        try:
            model, report = load_model(
                path, config, device, dtype, progress=progress, tp=workers.tp, attention_backend=backend,
                mtp=mtp, weights=weights,
            )
            workers.wait_for("loaded")  # before any collective: a worker that failed to load raises here
            runtime = cls(model, runtime_config, device, dtype, workers=workers)
            workers.wait_for("ready")
            if compile:
                runtime.compile_steps(progress)
        except BaseException:
            workers.shutdown()
            raise
        runtime.load_report = report
        # A dropped runtime stops its workers when collected; at exit, workers.shutdown_at_exit (atexit) does it.
        weakref.finalize(runtime, workers.shutdown).atexit = False
        return runtime

    def compile_decode(self, buckets: Iterable[int] | None = None, progress: bool = False,
                       **runner_kwargs) -> DecodeGraphRunner:
        """Compile and capture the decode step (ModelExecutor.compile_decode); later decode steps replay it."""
        return self.executor.compile_decode(buckets, progress, **runner_kwargs)

    @property
    def decode_fn(self):
        """What runs a decode step: the eager model, or the DecodeGraphRunner after ``compile_decode``."""
        return self.executor.decode_fn

    @property
    def workers(self) -> TensorParallelWorkers | None:
        return self.executor.workers

    def close(self) -> None:
        """Stop tensor-parallel workers (no-op without them)."""
        self.executor.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------- sequence lifecycle
    def validate_prompt(self, token_ids: Seq[int]) -> list[int]:
        """``validate_prompt`` below, with this runtime's max_model_len and vocabulary."""
        return validate_prompt(token_ids, self.max_model_len, self.model_config.vocab_size)

    def new_sequence(self, token_ids: list[int]) -> Sequence:
        """A sequence with a fresh id for prompt tokens already checked by ``validate_prompt``, holding nothing yet
        (LLMEngine's scheduler admits it later)."""
        seq = Sequence(self._next_seq_id, token_ids, len(token_ids), owner=self._owner)
        self._next_seq_id += 1
        return seq

    def add_sequence(self, prompt_token_ids: Seq[int]) -> Sequence:
        """Register a sequence and give it a state slot (zeroed, or restored from a prefix-cache hit).

        KV blocks are taken as its tokens are computed.
        """
        seq = self.new_sequence(self.validate_prompt(prompt_token_ids))
        hit = self.caches.find_cached_prefix(seq)
        if hit is not None and hit.num_evictable > self.caches.num_free_blocks:
            hit = None
        self.caches.assign_slot(seq, hit)
        return seq

    def release(self, seq: Sequence) -> None:
        """Free the sequence's KV blocks and state slot; it can be re-run from scratch (preemption)."""
        self.caches.release(seq)

    # ------------------------------------------------------------------------------------------------- steps
    @torch.inference_mode()
    def prefill(
        self,
        seqs: Seq[Sequence],
        num_tokens: Seq[int] | None = None,
        all_logits: bool = False,
        *,
        device_input_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Compute the next ``num_tokens[i]`` uncomputed tokens of each sequence (default: all of them).

        Returns fp32 logits ``[N, vocab]`` after each sequence's last computed token, or ``[T, vocab]`` for every
        computed token when ``all_logits`` (teacher forcing).

        ``device_input_ids`` = ``(indices, tokens)``, both ``[K]`` int64 on the runtime's device: the step's input
        ids at those token indices (of the packed step: the sequences' chunks one after another) are ``tokens``
        instead of the host's. LLMEngine's overlapped mixed steps pass the previous step's sampled tokens this way,
        before the host has read them back (its sequences hold a placeholder there).
        """
        if device_input_ids is not None:
            indices, tokens = device_input_ids
            if not (indices.dim() == 1 and indices.shape == tokens.shape and indices.dtype == tokens.dtype == torch.long
                    and indices.device.type == tokens.device.type == self.device.type):
                raise ValueError(f"device_input_ids must be two [K] int64 tensors on {self.device}, got "
                                 f"{tuple(indices.shape)} {indices.dtype} on {indices.device} and "
                                 f"{tuple(tokens.shape)} {tokens.dtype} on {tokens.device}")
        counts = [s.num_uncomputed_tokens for s in seqs] if num_tokens is None else list(num_tokens)
        # The leading one-token sequences (a mixed step's decode rows) go through the linear layers' decode kernels
        # (StepInputs.decode_rows) where there are 1..mixed_decode_lanes of them, captured or not.
        decode_rows = 0
        if self._decode_lanes and not all_logits:
            while decode_rows < len(counts) and counts[decode_rows] == 1:
                decode_rows += 1
            if decode_rows > self._decode_lanes:
                decode_rows = 0
        # The step replays a captured prompt step (ModelExecutor.compile_prefill) where one holds it: padded to its
        # key's shape by padding sequences, whose logits rows are dropped. A key without decode lanes computes the
        # decode rows as a prompt's tokens.
        bucket = self._prefill_bucket(seqs, counts, decode_rows) if not all_logits else None
        if bucket is not None and not bucket[2]:
            decode_rows = 0
        step = self.build_step(seqs, counts, is_prefill=True, pad_to=bucket, decode_rows=decode_rows)
        lanes = step.decode_rows  # the decode rows, then padding lanes
        if device_input_ids is not None:
            if lanes > decode_rows:  # the lanes' padding sits before the prompt part
                indices = torch.where(indices < decode_rows, indices, indices + (lanes - decode_rows))
            step.input_ids[indices] = tokens  # the step's own fresh copy of its ids; queued before the step runs
        logits = self.executor.execute(step, all_logits)
        self.caches.record_prefixes(seqs)
        if bucket is None and lanes == decode_rows:
            return logits
        # A row a packed sequence: the decode rows, the lanes' padding, the prompt part's, a key's padding ones
        prompts = logits[lanes : lanes + len(seqs) - decode_rows]
        return torch.cat([logits[:decode_rows], prompts]) if decode_rows else prompts

    def _prefill_bucket(self, seqs: Seq[Sequence], counts: Seq[int], decode_rows: int = 0
                        ) -> tuple[int, int, int] | None:
        """The key (tokens, sequences, decode lanes) of the captured prompt step that a prompt step of ``seqs`` can
        replay, or None (graphs.PrefillGraphs.bucket)."""
        graphs = self.executor.prefill_graphs
        return (graphs.bucket(sum(counts), len(seqs), decode_rows) if graphs is not None and seqs and counts
                else None)

    @torch.inference_mode()
    def decode_step(self, seqs: Seq[Sequence], *, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """One new token per sequence (its last appended one). Returns fp32 logits ``[N, vocab]``, the caller's to
        keep. :meth:`decode` is the same step without the fp32 copy, plus each row's token."""
        return self.decode(seqs, input_ids=input_ids).logits.float()

    @torch.inference_mode()
    def decode(
        self, seqs: Seq[Sequence], *, input_ids: torch.Tensor | None = None, sampling: SamplingInputs | None = None
    ) -> DecodeOutput:
        """One new token per sequence (its last appended one): the step's ``DecodeOutput``, i.e. logits ``[N, vocab]``
        in the model's dtype and ``tokens`` ``[N]`` int64, both on the device: each row's argmax, or with
        ``sampling`` (``[N]`` per-row parameters: ops.step.SamplingInputs) the tokens ``ce::sample`` draws in the
        same step (inside the compiled graph).

        With a compiled decode these are the graph's output buffers, valid only until the next ``decode``/
        ``decode_step`` (whose replay overwrites them): for callers that consume them at once, as LLMEngine does,
        saving a ``[N, vocab]`` copy per step. A compiled decode also returns ``host_tokens``, the tokens in host
        memory (read them within four decodes: graphs/decode_graph.py).

        ``input_ids`` (``[N]`` int64 on the runtime's device): the new tokens, instead of each sequence's last
        token on the host. LLMEngine's overlapped decode passes the previous step's sampled tokens this way, before
        the host has read them back (its sequences hold a placeholder there).
        """
        if input_ids is not None and (
            input_ids.shape != (len(seqs),)
            or input_ids.dtype != torch.long
            or input_ids.device.type != self.device.type
        ):
            raise ValueError(f"input_ids must be [{len(seqs)}] int64 on {self.device}, got "
                             f"{tuple(input_ids.shape)} {input_ids.dtype} on {input_ids.device}")
        step = self.build_step(seqs, [1] * len(seqs), is_prefill=False, device=self.executor.step_device)
        if input_ids is not None:
            step = dataclasses.replace(step, input_ids=input_ids)
        out = self.executor.execute(step, sampling=sampling)
        self.caches.record_prefixes(seqs)
        return out

    def build_step(
        self, seqs: Seq[Sequence], counts: Seq[int], is_prefill: bool, device: torch.device | None = None,
        pad_to: tuple[int, int, int] | None = None, decode_rows: int = 0,
    ) -> StepInputs:
        """Check the step, reserve KV blocks for its new tokens, and pack its metadata into tensors on ``device``
        (the runtime's by default); the sequences' computed-token counts move on by ``counts``. ``decode_rows``: the
        leading sequences of one token each that the linear layers compute as decode rows (StepInputs.decode_rows).
        Padding sequences (``PaddingSequence``: the null slot and block) of one token follow the decode rows up to
        the step's decode lanes (``compiled_engine.step.decode_lane_count``). ``pad_to`` = (tokens, sequences, decode
        lanes), a captured step's shape (graphs/prefill_graph.py): its lanes (0, or at least ``decode_rows``), then
        after the other sequences empty padding ones up to ``sequences``, then one of the tokens that make ``tokens``
        in all (empty, if they already do).

        A decode step computes exactly one token of each sequence; a prefill step 1..all of its uncomputed ones.
        Raises ValueError, before anything changes, for: counts not one per sequence, a sequence twice, a sequence of
        another Runtime, a new token id outside the vocabulary, too many or too few tokens, a released sequence.
        """
        if not seqs:
            raise ValueError("a step needs at least one sequence")
        if len(counts) != len(seqs):
            raise ValueError(f"{len(counts)} token counts for {len(seqs)} sequences")
        if len({id(s) for s in seqs}) != len(seqs):
            # the same sequence twice would reserve its blocks twice and compute its tokens twice, out of order
            raise ValueError("a sequence appears more than once in the step")
        limit = self.max_model_len
        vocab = self.model_config.vocab_size
        owner = self._owner
        # Runs every step for up to max_num_seqs sequences: one pass, O(1) per sequence plus its new tokens.
        for seq, n in zip(seqs, counts):
            if seq.owner is not owner:
                raise ValueError(f"sequence {seq.seq_id} was made by another Runtime (its blocks and slot are not "
                                 "this one's)")
            start = seq.num_computed_tokens
            uncomputed = len(seq.token_ids) - start
            if is_prefill and not 1 <= n <= uncomputed:
                raise ValueError(f"sequence {seq.seq_id}: cannot compute {n} of {uncomputed} tokens")
            if not is_prefill and uncomputed != 1:
                raise ValueError(f"sequence {seq.seq_id} has {uncomputed} uncomputed tokens; a decode step needs 1")
            if seq.state_slot is None:
                raise ValueError(f"sequence {seq.seq_id} has no state slot (released?)")
            if start + n > limit:
                raise ValueError(f"sequence {seq.seq_id} would exceed max_model_len={limit}")
            # The step's new tokens index the embedding: an id outside the vocabulary would read out of bounds in a
            # kernel (an embedder may append anything). Prompts were checked by validate_prompt already.
            if n == 1:
                token = seq.token_ids[start]
                if not 0 <= token < vocab:
                    raise ValueError(f"sequence {seq.seq_id}: token id {token!r} is out of range [0, {vocab})")
            else:
                new = seq.token_ids[start : start + n]
                if min(new) < 0 or max(new) >= vocab:
                    bad = next(t for t in new if not 0 <= t < vocab)
                    raise ValueError(f"sequence {seq.seq_id}: token id {bad!r} is out of range [0, {vocab})")
        if decode_rows and not (is_prefill and all(n == 1 for n in counts[:decode_rows])
                                and decode_rows <= len(seqs)):
            raise ValueError(f"decode_rows={decode_rows} needs a prefill step whose first {decode_rows} sequences "
                             "compute one token each")
        d = decode_rows
        if pad_to is not None and not (
            is_prefill and sum(counts) - d <= pad_to[0] and len(seqs) - d <= pad_to[1] and d <= pad_to[2]
            and (d or not pad_to[2])
        ):
            raise ValueError(f"pad_to={pad_to} needs a prefill step of at most that many tokens and sequences after "
                             f"its decode rows, and at most that many decode rows, got {sum(counts)} tokens in "
                             f"{len(seqs)} sequences, {d} decode rows")
        self.caches.reserve_blocks(seqs, counts)
        block_size = self.config.block_size
        lanes = decode_lane_count(d, pad_to)
        packed, packed_counts, chunk_rows = seqs, counts, None
        if lanes > d:
            packed = [*seqs[:d], *[PaddingSequence(1, block_size)] * (lanes - d), *seqs[d:]]
            packed_counts = [*counts[:d], *[1] * (lanes - d), *counts[d:]]
        if pad_to is not None:
            packed, packed_counts = list(packed), list(packed_counts)
            tokens, sequences, _ = pad_to
            empty = sequences - (len(seqs) - d)
            padding = tokens - (sum(counts) - d)
            packed += [*[PaddingSequence(0, block_size)] * empty, PaddingSequence(padding, block_size)]
            packed_counts += [*[0] * empty, padding]
            chunk_rows = max_chunk_rows(tokens, sequences + 1)  # one table length for every step of this shape
        step = pack_step(packed, packed_counts, is_prefill, block_size, device or self.device, chunk_rows,
                         self.caches.block_tables, decode_rows=lanes)
        for seq, n in zip(seqs, counts):
            seq.num_computed_tokens += n
        return step

    # ------------------------------------------------------------------------------------- speculative decoding
    @property
    def num_speculative_tokens(self) -> int:
        """k, the drafts per verify step (0: speculative decoding is off)."""
        return 0 if self.speculative_config is None else self.speculative_config.num_speculative_tokens

    def _check_speculative(self) -> int:
        k = self.num_speculative_tokens
        if not k:
            raise ValueError("speculative decoding is off (pass speculative_config)")
        return k

    def _reserve_draft_blocks(
        self, seqs: Seq[Sequence], counts: Seq[int], extra: Seq[int], keep_free: int = 0
    ) -> bool:
        """Reserve the blocks of ``counts[i]`` tokens from each sequence's computed ones, with ``extra[i]`` more for
        its draft positions when that leaves ``keep_free`` blocks free (else without: see
        compiled_engine/speculative.py); returns whether the extra ones were reserved. Counts stop at
        max_model_len."""
        limit, size = self.max_model_len, self.config.block_size
        wanted = [min(n + e, limit - s.num_computed_tokens) for s, n, e in zip(seqs, counts, extra)]
        more = sum(blocks_needed(s.num_computed_tokens + w, len(s.block_table), size) for s, w in zip(seqs, wanted))
        fits = more + keep_free <= self.caches.num_free_blocks
        if not fits:
            wanted = [min(n, limit - s.num_computed_tokens) for s, n in zip(seqs, counts)]
        self.caches.reserve_blocks(seqs, wanted)
        return fits

    @torch.inference_mode()
    def prefill_for_drafts(self, seqs: Seq[Sequence], num_tokens: Seq[int] | None = None) -> SpeculativeStep:
        """``prefill`` for speculative decoding: the same step, keeping the target's hidden states for the MTP layer
        (``draft_after_prefill``). ``.logits``: fp32 ``[N, vocab]`` after each sequence's last computed token."""
        k = self._check_speculative()
        counts = [s.num_uncomputed_tokens for s in seqs] if num_tokens is None else list(num_tokens)
        starts = [s.num_computed_tokens for s in seqs]
        # A sequence whose prompt this step completes drafts k - 1 positions past it.
        done = [start + n == len(s.token_ids) for s, start, n in zip(seqs, starts, counts)]
        if all(n >= 1 for n in counts):  # bad counts are build_step's to report
            self._reserve_draft_blocks(seqs, counts, [k - 1 if d else 0 for d in done])
        step = self.build_step(seqs, counts, is_prefill=True, pad_to=self._prefill_bucket(seqs, counts))
        hidden, logits = self.executor.forward_keeping_hidden(step, all_logits=False)
        spec = SpeculativeStep(list(seqs), step, hidden, starts, counts, logits[: len(seqs)], done)
        self.caches.record_prefixes(seqs)
        return spec

    @property
    def scripted_drafts(self) -> bool:
        """Whether drafts can be scripted by position (speculative_config ``scripted_drafts``: ``script_drafts``)."""
        return self.executor.draft_script is not None

    def script_drafts(self, seq: Sequence, drafts: Seq[int]) -> None:
        """From now on ``seq``'s drafts for position p are ``drafts[p]`` where it has one (>= 0), the MTP layer's
        elsewhere (compiled_engine/speculative.py ``DraftScript``); ``[]``: the layer's everywhere. Kept by the
        sequence's state slot: write it after the slot is the sequence's and before its first drafts (its prompt's
        last step drafts after it)."""
        if self.executor.draft_script is None:
            raise ValueError("scripted drafts need a runtime built with speculative_config scripted_drafts=True")
        self.executor.draft_script.write(seq.state_slot, drafts)

    @torch.inference_mode()
    def draft_after_prefill(self, spec: SpeculativeStep, next_tokens: torch.Tensor) -> torch.Tensor:
        """Run the MTP layer over a ``prefill_for_drafts`` step and draft after every sequence whose tokens are all
        computed now. ``next_tokens`` ``[N]`` int64 on the device: each such sequence's sampled token (the other
        rows' values are not read). Returns the drafts ``[D, k]`` of those D sequences, in order, on the device."""
        k = self._check_speculative()
        ids, last_rows, done = [], [], []
        row = 0
        for i, (seq, start, n) in enumerate(zip(spec.seqs, spec.starts, spec.counts)):
            # Row p's next token is token p + 1: the prompt shifted by one, then (a completed prompt) the sampled one.
            if spec.completed[i]:
                ids.extend(seq.token_ids[start + 1 : start + n])
                ids.append(0)  # replaced by the sampled token below, on the device
                done.append(i)
                last_rows.append(row + n - 1)
            else:
                ids.extend(seq.token_ids[start + 1 : start + n + 1])
            row += n
        ids.extend([0] * (spec.step.input_ids.shape[0] - row))  # a captured step's padding rows
        packed = upload(torch.tensor(ids + last_rows + done, dtype=torch.long), self.device)
        t, d = len(ids), len(done)
        next_ids = packed[:t].clone()
        last, seq_rows = packed[t : t + d], packed[t + d :]
        next_ids[last] = next_tokens[seq_rows]
        return self.executor.draft(spec.step, spec.hidden, next_ids, last, seq_rows, k)

    def _check_verify(self, seqs: Seq[Sequence], drafts: Seq[Seq[int]]) -> int:
        """Raise ValueError, before anything changes, for a verify step that cannot run; returns k."""
        most = self._check_speculative()
        if not seqs:
            raise ValueError("a step needs at least one sequence")
        k = len(drafts[0]) if drafts else 0
        if len(drafts) != len(seqs) or not 1 <= k <= most or any(len(d) != k for d in drafts):
            raise ValueError(f"verify needs the same number of drafts (1..{most}) for each of the {len(seqs)} "
                             "sequences")
        if len({id(s) for s in seqs}) != len(seqs):
            raise ValueError("a sequence appears more than once in the step")
        vocab = self.model_config.vocab_size
        for seq, proposal in zip(seqs, drafts):
            if seq.owner is not self._owner:
                raise ValueError(f"sequence {seq.seq_id} was made by another Runtime")
            if seq.state_slot is None:
                raise ValueError(f"sequence {seq.seq_id} has no state slot (released?)")
            if seq.num_uncomputed_tokens != 1:
                raise ValueError(f"sequence {seq.seq_id} has {seq.num_uncomputed_tokens} uncomputed tokens; a verify "
                                 "step needs 1")
            token = seq.token_ids[-1]
            if not all(isinstance(t, int) and 0 <= t < vocab for t in (token, *proposal)):
                raise ValueError(f"sequence {seq.seq_id}: a token id or draft outside [0, {vocab})")
        return k

    @torch.inference_mode()
    def verify(self, seqs: Seq[Sequence], drafts: Seq[Seq[int]], keep_free: int = 0) -> SpeculativeStep:
        """The verify step: each sequence's last (uncomputed) token and its k ``drafts`` (k at most the runtime's
        num_speculative_tokens) scored by the target in one step. ``.logits``: fp32 ``[N * (k+1), vocab]``, sequence
        by sequence. The linear layers' pools stay as they are until ``accept``; the sequences' lengths until
        ``advance``. ``keep_free``: blocks the draft positions' blocks may not take (those a prefill step after this
        one needs)."""
        k = self._check_verify(seqs, drafts)
        self._reserve_draft_blocks(seqs, [k + 1] * len(seqs), [k - 1] * len(seqs), keep_free)
        step = pack_verify_step(seqs, drafts, self.config.block_size, self.device)
        hidden, logits = self.executor.forward_keeping_hidden(step, all_logits=True)
        return SpeculativeStep(list(seqs), step, hidden, None, [k + 1] * len(seqs), logits)

    @torch.inference_mode()
    def accept(self, spec: SpeculativeStep, num_accepted: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """After ``verify``: each sequence accepted ``num_accepted[i]`` (``[N]`` int64, on the device) drafts, and
        ``tokens[i]`` (``[N, k+1]``) holds them then the target's next token at index num_accepted[i] (any valid
        ids after it). Commits each linear layer's state after the last accepted position and drafts anew: returns
        the drafts ``[N, k]`` on the device. Queues device work only (no host sync); ``advance`` follows."""
        self._check_speculative()
        return self.executor.accept(spec.step, spec.hidden, num_accepted, tokens)

    @torch.inference_mode()
    def fused_round(
        self, seqs: Seq[Sequence], drafts: Seq[Seq[int]], keep_free: int = 0, sampling: SamplingInputs | None = None,
        chain_rounds: int = 0,
    ) -> tuple[SpeculativeStep, RoundResults]:
        """``verify``, acceptance and ``accept`` in one call (SpeculativeRound: compiled when the runtime is):
        ``(spec, results)``: ``num_accepted [N]``, ``tokens [N, k+1]``, ``drafts [N, k]`` on the device and
        ``results.rows()`` on the host (a compiled round's: written to host memory by its graph, read with no copy;
        valid until the next round); ``advance(spec, ...)`` follows. Every verified row draws the target's argmax,
        or with ``sampling`` (``[N * (k+1)]`` per-row ``ce::sample`` parameters on the host, sequence by sequence;
        counters: each row's output index) the token ``ce::sample`` draws (compiled_engine/rejection_sampler.py). No
        min_tokens suppression here: such rounds take ``verify`` and the rejection sampler. ``chain_rounds``: blocks
        for that many more rounds' positions are reserved too where free (else for a quarter of them), so that rounds
        may chain after this one (``chain_round``)."""
        k = self._check_verify(seqs, drafts)
        if sampling is not None and sampling.temperature.shape != (len(seqs) * (k + 1),):
            raise ValueError(f"sampling needs {len(seqs) * (k + 1)} rows (k + 1 a sequence), got "
                             f"{tuple(sampling.temperature.shape)}")
        counts = [k + 1] * len(seqs)
        # As many of the chain's rounds as fit (all, a quarter), else this round's own draft positions where free
        for rounds in sorted({chain_rounds, chain_rounds // 4, 0}, reverse=True):
            if self._reserve_draft_blocks(seqs, counts, [k - 1 + rounds * (k + 1)] * len(seqs), keep_free):
                break
        # What a chained round may reach (can_chain); not worked out for rounds that do not chain.
        table_tokens = [len(s.block_table) * self.config.block_size for s in seqs] if chain_rounds else None
        n, compiled = len(seqs), self.executor.speculative_round
        step, bucket, fields = None, None, None
        if compiled is not None and compiled.covers(n, k):
            length, bucket = compiled.pack(seqs, drafts, sampling, self.caches.block_tables)
            results = self.executor.run_round(length, bucket, sampling is not None, n)
        else:  # eagerly: no compiled rounds, past their buckets, or fewer drafts than they were compiled for
            step = pack_verify_step(seqs, drafts, self.config.block_size, self.device)
            fields = None if sampling is None else sampling.on(self.device)
            results = RoundResults(*self.executor.fused_round(step, k, fields))
        spec = SpeculativeStep(list(seqs), step, None, None, [k + 1] * n, None, bucket=bucket,
                               table_tokens=table_tokens, sampled=sampling is not None, sampling=fields)
        return spec, results

    def can_chain(self, spec: SpeculativeStep) -> bool:
        """Whether a round may follow the fused round ``spec`` (or one chained after it) on the same
        sequences before the host reads that round back (``chain_round``): packed with ``chain_rounds``, one rank, no
        prefix caching, and room for the new round's verified positions, at most 2 (k + 1) past each sequence's
        computed tokens (the host has not advanced the round in flight), inside the block table ``spec`` was packed
        with, max_model_len and the sequence's own length limit."""
        if spec.table_tokens is None or self.executor.workers is not None or self.caches.prefix_cache is not None:
            return False  # (a boundary snapshot taken at read-back would copy the state the next round has moved)
        reach = 2 * (spec.counts[0] if spec.counts else 0)
        return all(s.num_computed_tokens + reach <= min(room, self.max_model_len, s.length_limit or self.max_model_len)
                   for s, room in zip(spec.seqs, spec.table_tokens))

    @torch.inference_mode()
    def chain_round(self, spec: SpeculativeStep, results: RoundResults
                    ) -> tuple[RoundResults, SpeculativeStep, RoundResults]:
        """The round after the fused round ``spec`` (``results``: its results, not read back yet), on the same sequences
        and in its variant (argmax or sampled rows, the same parameters, counters moved on), queued before that round
        is read back: its step comes from that round's results on the device (``speculative.successor_fields``,
        ``successor_counters``; a compiled round's graph wrote them already), so the host's reading and
        advancing of one round overlaps the next round on the device. ``can_chain(spec)`` must hold. Returns
        ``(results`` to read the last round from, the new round's spec and results); ``advance`` each in order."""
        if spec.bucket is not None:
            kept, new = self.executor.chain_round(spec.bucket, spec.sampled, len(spec.seqs), results)
            return kept, spec, new
        step, sampling = spec.step, spec.sampling
        ids, positions, slots, context_lens = successor_fields(
            step.input_ids, step.positions, step.block_tables, step.state_slots, results.num_accepted, results.tokens,
            results.drafts, self.config.block_size)
        step = dataclasses.replace(step, input_ids=ids, positions=positions, slot_mapping=slots,
                                   context_lens=context_lens)
        if sampling is not None:
            sampling = (*sampling[:5], successor_counters(sampling[5], step.state_slots, results.num_accepted))
        new = RoundResults(*self.executor.fused_round(step, spec.counts[0] - 1, sampling))
        return results, dataclasses.replace(spec, step=step, sampling=sampling), new

    def advance(self, spec: SpeculativeStep, num_accepted: Seq[int | None], tokens: Seq[Seq[int]]) -> None:
        """The host's side of ``accept``, with its values read back: each sequence gets ``tokens[i][:a + 1]``
        appended and its computed length moves to cover its last token before them (it ran the round from its
        computed length); the prefix cache records. A sequence whose ``num_accepted`` is None is left as it is (one
        that finished before a round chained after it was read)."""
        seqs = []
        for seq, a, new in zip(spec.seqs, num_accepted, tokens):
            if a is not None:
                seq.token_ids.extend(new[: a + 1])
                seq.num_computed_tokens += a + 1
                seqs.append(seq)
        self.caches.record_prefixes(seqs)

def validate_prompt(token_ids: Seq[int], max_model_len: int, vocab_size: int) -> list[int]:
    """The prompt as a list of Python ints; raises ValueError when it is empty, longer than max_model_len, or holds
    something that is not an integer id in ``[0, vocab_size)`` (numpy and 0-d torch ints are ids, bools are not).
    A function of the two numbers, so that a process without the model (a server's front end) checks the same."""
    token_ids = list(token_ids)
    if not token_ids:
        raise ValueError("prompt is empty: at least one token is needed")
    if len(token_ids) > max_model_len:
        raise ValueError(f"prompt has {len(token_ids)} tokens, more than max_model_len={max_model_len}")
    # The common case at C speed (a Python loop over every prompt token costs ~1 ms per 500-token request, which
    # delays the first step of a large batch): only Python ints, all in range.
    if set(map(type, token_ids)) == {int} and min(token_ids) >= 0 and max(token_ids) < vocab_size:
        return token_ids
    # Integer ids of any kind (numpy ints, 0-d integer tensors) become Python ints; bools and floats are no ids.
    ids = [as_token_id(t) for t in token_ids]
    bad = [t for t, i in zip(token_ids, ids) if i is None or not 0 <= i < vocab_size]
    if bad:
        kind = "is out of range" if as_token_id(bad[0]) is not None else "is not an integer"
        raise ValueError(f"prompt token id {bad[0]!r} {kind}: ids are ints in [0, {vocab_size})")
    return ids

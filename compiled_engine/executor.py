"""ModelExecutor: runs a packed step on the model, on every tensor-parallel rank, prefill eagerly and decode through
its decode function: the eager model, or after ``compile_decode`` the captured graphs (graphs.DecodeGraphRunner);
and speculative decoding's device work (compiled_engine/speculative.py: steps that keep the target's hidden states,
MTP drafts, the commit, fused rounds), every rank in lockstep.

It owns the model and what runs it; it knows nothing of sequences, blocks or slots (compiled_engine.cache_manager
decides those, compiled_engine.step packs them into a StepInputs).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Callable, Iterable

import torch

from compiled_engine.cache import reset_state_slots
from compiled_engine.config import SpeculativeConfig
from compiled_engine.model import HybridModel
from compiled_engine.speculative import (DraftScript, RoundResults, SpeculativeRound, commit_and_draft, draft,
                                         fused_round)
from ops.library import NULL_SLOT
from ops.step import DecodeOutput, SamplingInputs, StepInputs
from graphs import DecodeGraphRunner, PrefillGraphs, eager_decode

logger = logging.getLogger(__name__)


class ModelExecutor:
    def __init__(
        self,
        model: HybridModel,
        block_size: int,
        max_num_seqs: int,
        max_model_len: int,
        device: torch.device,
        workers=None,
        speculative_config: SpeculativeConfig | None = None,
    ):
        """``workers``: rank 0's handle on the other tensor-parallel ranks (compiled_engine.tp_workers), or None.
        The model's caches must be allocated (compiled_engine.memory_plan.allocate_caches). ``speculative_config``:
        its k and ``draft_vocab_size`` for the rounds and drafts."""
        self.model = model
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.device = device
        self.workers = workers
        self.speculative_config = speculative_config
        # speculative_config ``scripted_drafts``: drafts by position in place of the MTP layer's (Runtime.script_drafts)
        self.draft_script: DraftScript | None = None
        if speculative_config is not None and speculative_config.scripted_drafts:
            if workers is not None or model.tp.world_size > 1:  # (Runtime.from_pretrained refuses it first)
                raise ValueError("speculative_config scripted_drafts runs on one rank only")
            self.draft_script = DraftScript(max_num_seqs + 1, max_model_len, speculative_config.num_speculative_tokens,
                                            device)
        self.speculative_round: SpeculativeRound | None = None  # compile_rounds' (eager rounds until then)
        self._decode_fn: Callable[..., DecodeOutput] = self._decode_eager
        self.prefill_graphs: PrefillGraphs | None = None  # compile_prefill's captured prompt steps
        # A worker's last step that kept its hidden states (forward_keeping_hidden): what its next draft or accept
        # command runs on. Rank 0 passes its own (the SpeculativeStep's).
        self.kept: tuple[StepInputs, torch.Tensor] | None = None

    @property
    def decode_fn(self) -> Callable[..., DecodeOutput]:
        """What runs a decode step, ``decode_fn(step, sampling=None)``: the eager model, or the DecodeGraphRunner
        once ``compile_decode`` has run."""
        return self._decode_fn

    @property
    def step_device(self) -> torch.device:
        """Where a decode step should be built: on the host for the graph runner (one copy into its buffers), on
        the device otherwise (tensor-parallel ranks get rank 0's step broadcast from the device)."""
        if self.workers is None and isinstance(self._decode_fn, DecodeGraphRunner):
            return self._decode_fn.step_device
        return self.device

    def compile_decode(self, buckets: Iterable[int] | None = None, progress: bool = False,
                       **runner_kwargs) -> DecodeGraphRunner:
        """Compile and capture the decode step for every bucket (every rank in lockstep), then decode through it.

        ``runner_kwargs`` go to DecodeGraphRunner (``mode``, ``fullgraph``, ``backend``, ``capture``). Sequences
        that are live meanwhile keep their state: warm-up runs only padding lanes (null slot, null block).
        ``progress``: a progress bar on this rank (stderr).
        """
        if self.workers is not None:
            self.workers.send_compile()
        if self.model.tp.world_size > 1:
            # Tensor parallel: cudagraph trees, unless asked otherwise: tp_workers.leave_process_group frees the
            # trees' graphs before NCCL destroys its communicator (which waits for every graph that captured its
            # collectives); the runner's own capture has not run under tensor parallelism on a GPU.
            runner_kwargs.setdefault("capture", "trees")
        runner = DecodeGraphRunner(
            self.model,
            max_num_seqs=self.max_num_seqs,
            max_blocks_per_seq=-(-self.max_model_len // self.block_size),
            device=self.device,
            buckets=buckets,
            **runner_kwargs,
        )
        runner.warmup(progress)
        self._decode_fn = runner
        return runner

    def compile_prefill(self, buckets: Iterable[int], max_sequences: int = 1, decode_lanes: int = 0,
                        progress: bool = False) -> PrefillGraphs | None:
        """Capture the prompt step at each token count of ``buckets`` and each sequence bucket up to
        ``max_sequences``, and the mixed steps with ``decode_lanes`` decode rows (none with speculative decoding)
        (graphs/prefill_graph.py); later prompt and mixed steps of those shapes replay them (``execute``,
        ``forward_keeping_hidden``), and with speculative decoding the drafts after them as well (``draft``). One
        rank only. None where ``buckets`` is empty."""
        if self.workers is not None or self.model.tp.world_size > 1:
            raise ValueError("captured prompt steps run on one rank only")
        buckets = tuple(buckets)
        if not buckets:
            return None
        drafter = self.prompt_drafter()
        graphs = PrefillGraphs(self.model, buckets, -(-self.max_model_len // self.block_size), self.block_size,
                               self.device, drafter, max_sequences, decode_lanes if drafter is None else 0)
        start, reserved = time.perf_counter(), torch.cuda.memory_reserved(self.device)
        graphs.capture(progress)
        self.reset_state_slots([NULL_SLOT])  # the captures' warm-up steps ran on the null slot
        logger.info("captured %d prompt steps of %d..%d tokens in 1..%d sequences%s%s in %.2f s; %.2f GiB more "
                    "reserved", len(graphs.keys), min(buckets), max(buckets), graphs.sequence_buckets[-1],
                    " with their drafts" if graphs.drafter is not None else "",
                    f" (and {graphs.decode_lanes} decode lanes)" if graphs.decode_lanes else "",
                    time.perf_counter() - start,
                    (torch.cuda.memory_reserved(self.device) - reserved) / 2**30)
        self.prefill_graphs = graphs
        return graphs

    def execute(
        self, step: StepInputs, all_logits: bool = False, sampling: SamplingInputs | None = None
    ) -> torch.Tensor | DecodeOutput:
        """Run one step on every rank. A prefill step returns fp32 logits of each sequence's last token (of every
        token when ``all_logits``); a decode step its ``DecodeOutput`` (with compiled decode: the graph's buffers,
        valid until the next decode step), whose tokens ``sampling`` draws (rank 0 only: the other ranks' tokens are
        dropped), else the greedy ones."""
        return self._on_every_rank(lambda workers: workers.send_step(step, all_logits),
                                   lambda: self._execute_local(step, all_logits, sampling))

    def _on_every_rank(self, send, run):
        """``send(workers)`` (the command and its tensors) when there are workers, then ``run()`` here."""
        if self.workers is None:
            return run()
        if self.workers.closed:
            raise RuntimeError("the tensor-parallel workers are stopped (closed, or a step failed)")
        try:
            send(self.workers)
            return run()
        except BaseException as error:
            # The ranks are out of lockstep now (some may wait in a collective forever): stop them, then report the
            # worker's own error if one sent it, else ours. BaseException: a KeyboardInterrupt between the send and
            # the local work leaves the workers in the command's collectives just the same.
            try:
                self.workers.raise_worker_error(error)
            finally:
                self.workers.abort()

    def _execute_local(
        self, step: StepInputs, all_logits: bool, sampling: SamplingInputs | None = None
    ) -> torch.Tensor | DecodeOutput:
        if not step.is_prefill:
            return self._decode_fn(step, sampling)
        if not all_logits and self.prefill_graphs is not None and self.prefill_graphs.covers(step):
            return self.prefill_graphs(step)
        hidden = self.model(step)
        if not all_logits:
            hidden = hidden[step.last_token_indices()]
        return self.model.compute_logits(hidden)

    # ------------------------------------------------------------------------------------- speculative decoding
    @property
    def draft_vocab(self) -> int | None:
        """Drafts over the first this many token ids (SpeculativeConfig.draft_vocab_size; None: all)."""
        return self.speculative_config.draft_vocab_size if self.speculative_config is not None else None

    def forward_keeping_hidden(self, step: StepInputs, all_logits: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """A prefill or verify step on every rank that keeps the target's hidden states for the MTP layer: ``(hidden
        [T, H], fp32 logits)`` of each sequence's last token, or of every token with ``all_logits``. Each worker
        keeps its own (``kept``) for the draft or accept command that follows."""
        return self._on_every_rank(lambda workers: workers.send_step(step, all_logits, keep_hidden=True),
                                   lambda: self._forward_keeping_hidden(step, all_logits))

    def _forward_keeping_hidden(self, step: StepInputs, all_logits: bool) -> tuple[torch.Tensor, torch.Tensor]:
        graphs = self.prefill_graphs
        if not all_logits and graphs is not None and graphs.drafter is not None and graphs.covers(step):
            return graphs.forward_keeping_hidden(step)
        hidden = self.model(step)
        if self.model.tp.rank > 0:  # a worker: rank 0's SpeculativeStep holds its own
            self.kept = (step, hidden)
        return hidden, self.model.compute_logits(hidden if all_logits else hidden[step.last_token_indices()])

    def draft(self, step: StepInputs, hidden: torch.Tensor, next_ids: torch.Tensor, rows: torch.Tensor,
              seq_rows: torch.Tensor, num_drafts: int) -> torch.Tensor:
        """``speculative.draft`` on every rank, after ``forward_keeping_hidden`` of ``step`` (whose ``hidden`` this
        rank passes): drafts ``[len(rows), num_drafts]`` on the device."""
        def run() -> torch.Tensor:
            graphs = self.prefill_graphs
            if graphs is not None and graphs.covers_draft(step, rows):
                return graphs.draft(step, hidden, next_ids, rows, seq_rows)
            return self._draft_local(step, hidden, next_ids, rows, seq_rows, num_drafts)

        return self._on_every_rank(lambda workers: workers.send_draft(next_ids, rows, seq_rows, num_drafts), run)

    def prompt_drafter(self) -> Callable[..., torch.Tensor] | None:
        """With speculative decoding, what drafts after a prompt step (``draft`` with this executor's k, draft
        vocabulary and script) for the captured prompt steps (graphs.prefill_graph.Drafter); else None."""
        if self.speculative_config is None:
            return None
        return functools.partial(self._draft_local, num_drafts=self.speculative_config.num_speculative_tokens)

    def _draft_local(self, step: StepInputs, hidden: torch.Tensor, next_ids: torch.Tensor, rows: torch.Tensor,
                     seq_rows: torch.Tensor, num_drafts: int) -> torch.Tensor:
        return draft(self.model, step, hidden, next_ids, rows, seq_rows, num_drafts, self.block_size,
                     self.draft_vocab, self.draft_script)

    def accept(self, step: StepInputs, hidden: torch.Tensor, num_accepted: torch.Tensor,
               tokens: torch.Tensor) -> torch.Tensor:
        """``speculative.commit_and_draft`` on every rank, after ``forward_keeping_hidden`` of the verify ``step``:
        the drafts ``[N, k]`` on the device."""
        return self._on_every_rank(
            lambda workers: workers.send_accept(num_accepted, tokens),
            lambda: commit_and_draft(self.model, step, hidden, num_accepted, tokens, self.block_size,
                                     self.draft_vocab, self.draft_script))

    def compile_rounds(self, progress: bool = False) -> SpeculativeRound:
        """Compile (on a single CUDA rank also capture) the fused rounds of every bucket, on every rank in lockstep;
        later rounds that ``speculative_round.covers`` run through ``run_round``. Under tensor parallelism the rounds
        are compiled but not captured (as the decode runner uses cudagraph trees there: compile_decode)."""
        if self.workers is not None:
            self.workers.send_compile_rounds()
        capture = self.device.type == "cuda" and self.model.tp.world_size == 1
        self.speculative_round = SpeculativeRound(
            self.model, self.speculative_config.num_speculative_tokens, self.block_size, self.max_num_seqs,
            self.max_model_len, self.device, capture, self.draft_vocab, self.draft_script)
        self.speculative_round.warmup(progress)
        return self.speculative_round

    def run_round(self, length: int, bucket: int, sample: bool, num_seqs: int) -> RoundResults:
        """A compiled round of ``num_seqs`` sequences: the staged round (``SpeculativeRound.pack``'s ``length``: its
        step, and its rows' sampling parameters when it samples) into this rank's buffer, that buffer broadcast to the
        workers' own, then the bucket's graph on every rank. Its results (``SpeculativeRound.round_results``: the
        graphs' buffers and this rank's host rows, valid until the next round)."""
        round_ = self.speculative_round
        round_.load(length)
        outputs = self._on_every_rank(lambda workers: workers.send_round_buffers(bucket, sample,
                                                                                 round_.buffers(bucket, sample)),
                                      lambda: round_.run(bucket, sample))
        return round_.round_results(outputs, num_seqs)

    def chain_round(self, bucket: int, sample: bool, num_seqs: int, previous: RoundResults
                    ) -> tuple[RoundResults, RoundResults]:
        """The compiled round after the last one, on its ``num_seqs`` sequences (``SpeculativeRound.run_chained``:
        its step is already on the device), queued before the last one is read back: ``(previous`` kept where the
        new round does not overwrite it, the new round's results). A single rank's: tensor-parallel engines do not
        chain rounds."""
        round_ = self.speculative_round
        kept = round_.keep(previous)
        return kept, round_.round_results(round_.run_chained(bucket, sample), num_seqs)

    def fused_round(self, step: StepInputs, num_drafts: int, sampling: tuple[torch.Tensor, ...] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``speculative.fused_round`` of a verify step (``pack_verify_step``) on every rank, eagerly; ``sampling``:
        ``ce::sample``'s six per-row parameters on the device (None: argmax rows)."""
        return self._on_every_rank(
            lambda workers: workers.send_round(step, num_drafts, sampling),
            lambda: fused_round(self.model, step.input_ids, step.positions, step.slot_mapping, step.block_tables,
                                step.context_lens, step.state_slots, step.cu_seqlens, num_drafts, self.block_size,
                                self.draft_vocab, sampling, self.draft_script))

    def _decode_eager(self, step: StepInputs, sampling: SamplingInputs | None = None) -> DecodeOutput:
        return eager_decode(self.model, step, sampling)

    def reset_state_slots(self, slots: list[int]) -> None:
        """Zero these state slots of every linear layer, on every rank: fresh sequences start from zero state."""
        if self.workers is not None:
            for slot in slots:
                self.workers.send_reset_slot(slot)
        reset_state_slots(self.model, slots)

    def close(self) -> None:
        """Stop the tensor-parallel workers (no-op without them)."""
        if self.workers is not None:
            self.workers.shutdown()

"""LLMEngine: the incremental serving API (vLLM's shape) over the scheduler, the runtime and the sampler.

    engine = LLMEngine(runtime, tokenizer)
    engine.add_request("r1", prompt_token_ids, SamplingParams(max_tokens=32))
    while engine.has_unfinished_requests():
        for out in engine.step():          # RequestOutput per request that advanced this step
            ...out.new_token_ids, out.finished, out.finish_reason
    engine.abort_request("r1")             # frees everything the request holds

One ``step()``: schedule a batch -> run it on the runtime (prefill, decode, or mixed: decode rows in front of prompt
chunks, compiled_engine/scheduler.py) -> sample on the device -> append the tokens on the host (the one device->host
copy of the step) -> finish requests that hit a stop condition.
With ``overlap_decode=True`` a step's tokens are read back only after the next step is launched
(``_step_overlapped``), so the host's work for step N+1 runs while the GPU computes step N.
With speculative decoding (the runtime's ``speculative_config``) decode rows become verify rounds
(``_step_speculative``); with ``overlap_decode`` fused rounds chain (``_read_round``: the next round launches from
the device's results before the host reads a round back), others read their tokens back before the next. Where
drafting is off (the drafting rule, ``disable_by_batch_size``) its plain decode steps overlap as above, with
``overlap_decode``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import time
from dataclasses import dataclass

import torch

from ops.logprobs import logprobs_op
from ops.step import HostTokens
from compiled_engine.config import SpeculativeConfig
from compiled_engine.detokenizer import IncrementalDetokenizer
from compiled_engine.drafting_rule import DraftingRule
from compiled_engine.outputs import RequestOutput, TokenLogprobs
from compiled_engine.rejection_sampler import rejection_sample
from compiled_engine.request import Request
from compiled_engine.runtime import Runtime, validate_prompt
from compiled_engine.sampler import bad_word_ids, sample, sampling_batch, sampling_inputs, warm_up_sampling
from compiled_engine.sampling_params import RequestOutputKind, SamplingParams
from compiled_engine.scheduler import ScheduledBatch, Scheduler
from compiled_engine.sequence import Sequence, SequenceStatus
from compiled_engine.speculative import RoundResults, SpeculativeStep
from compiled_engine.step import upload
from compiled_engine.structured_output import GrammarCache

logger = logging.getLogger(__name__)


@dataclass
class _StepLogprobs:
    """ce::logprobs of a step's rows (every row, when any asked): the chosen tokens' [N] fp32, the top-k values
    [N, k] fp32 and ids [N, k] int64, on the device and on their way to host memory."""

    device: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    host: tuple[HostTokens, HostTokens, HostTokens]

    @classmethod
    def start(cls, device: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> "_StepLogprobs":
        return cls(device, tuple(map(to_host, device)))

    def read(self) -> "_LogprobTable":
        return _LogprobTable(*(h.tolist() for h in self.host))


@dataclass
class _LogprobTable:
    """A step's logprobs in host lists, row by row."""

    chosen: list[float]
    top_values: list[list[float]]
    top_ids: list[list[int]]

    def entry(self, row: int, token: int, n: int) -> TokenLogprobs:
        """Row ``row``'s entry for its chosen ``token``, with the ``n`` most likely tokens."""
        return TokenLogprobs(token, self.chosen[row], list(zip(self.top_ids[row][:n], self.top_values[row][:n])))


# The most tokens of a prefill chunk of a request with prompt_logprobs, and of the prefill steps that compute them:
# their logits are computed at every position, [tokens, vocab] fp32 (2 GB at Qwen3.5's 248,320 ids).
PROMPT_LOGPROBS_CHUNK = 2048
PLACEHOLDER_TOKEN = 0  # an overlapped step's token before it is read back: never read (the device has the real one)


def to_host(tokens: torch.Tensor) -> HostTokens:
    """Start copying ``tokens`` to (pinned) host memory without waiting for them."""
    if not tokens.is_cuda:
        return HostTokens(tokens, None)
    host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
    host.copy_(tokens, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return HostTokens(host, copied)


def validate_request(
    prompt_token_ids: list[int], params: SamplingParams | None, *, max_model_len: int, vocab_size: int,
    has_tokenizer: bool,
) -> tuple[list[int], SamplingParams]:
    """``LLMEngine.validate_request``'s checks as a function of the engine's numbers, so that a process without the
    engine (a server's front end over an engine process) checks the same."""
    params = params or SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
    params = dataclasses.replace(params)
    if params.truncate_prompt_tokens is not None and not isinstance(prompt_token_ids, (str, bytes)):
        prompt_token_ids = list(prompt_token_ids)[-params.truncate_prompt_tokens :]  # its checks are validate_prompt's
    token_ids = validate_prompt(prompt_token_ids, max_model_len, vocab_size)
    bad_stop = [t for t in params.stop_token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad_stop:
        raise ValueError(f"SamplingParams.stop_token_ids has {bad_stop[0]!r}, outside [0, {vocab_size})")
    if params.stop and not has_tokenizer:
        raise ValueError("SamplingParams.stop needs a tokenizer: this model folder has none")
    if params.structured_outputs is not None and not has_tokenizer:
        raise ValueError("SamplingParams.structured_outputs needs a tokenizer: this model folder has none")
    if params.bad_words is not None and not has_tokenizer:
        raise ValueError("SamplingParams.bad_words needs a tokenizer: this model folder has none")
    for name, ids in (("logit_bias", params.logit_bias or ()), ("allowed_token_ids", params.allowed_token_ids or ())):
        bad = [t for t in ids if t >= vocab_size]
        if bad:
            raise ValueError(f"SamplingParams.{name} has token id {bad[0]}, outside [0, {vocab_size})")
    if params.n != 1:
        raise ValueError(f"SamplingParams.n must be 1 in an engine request (one completion each), got {params.n}: "
                         "add one request per completion with params.for_completion(j), as LLM.generate and the "
                         "server do")
    return token_ids, params


def fused_decode_row_limit(model: torch.nn.Module) -> int:
    """With ``mixed_decode_lanes`` 0: the most decode rows a mixed step runs through the prefill path; with more, they
    run as a decode step of their own right before the prefill chunks (``LLMEngine._launch``).

    The prefill path moves a decode row's recurrent state seven times (gathered by slot, read as FLA's initial state,
    written as its chunk state and read back, written as its final state, scattered back: ops/triton/
    delta_rule_kernels.py) where the decode kernels read and write it once each: five state copies more per row. A
    decode step of its own costs one more read of the weights. So the split pays from weight bytes / (5 x recurrent
    state bytes per sequence) rows on: 15 for Qwen3.5-0.8B (1.5 GB of weights, 19 MB of fp32 state).
    """
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(m.recurrent_state[0].numel() * m.recurrent_state.element_size() for m in model.modules()
                if getattr(m, "recurrent_state", None) is not None)
    return weights // (5 * state) if state else 1 << 62


@dataclass
class _InFlight:
    """A step launched but not read back: the requests it gives a token, in row order, where each one's placeholder
    token sits, and the sampled tokens (on the device; their host copy is on its way)."""

    requests: list[Request]
    indices: list[int]
    tokens: torch.Tensor  # [N] int64 on the device: the next step's input ids
    host: HostTokens  # the same tokens in host memory, once their event has passed
    logprobs: _StepLogprobs | None = None

    @classmethod
    def start(cls, requests: list[Request], tokens: torch.Tensor, indices: list[int],
              host: HostTokens | None = None, logprobs: _StepLogprobs | None = None) -> "_InFlight":
        """``host``: the tokens already on their way to host memory (the decode graph writes its greedy tokens there
        itself); otherwise they are copied, asynchronously."""
        return cls(requests, indices, tokens, host if host is not None else to_host(tokens), logprobs)

    def host_tokens(self) -> list[int]:
        return self.host.tolist()


@dataclass
class _RoundInFlight:
    """A verify round launched but not read back (``overlap_decode``, ``LLMEngine._read_round``): its requests in row
    order, which of them verify real drafts (the others placeholders), the round's spec and results, and when it
    started (the drafting rule's clock)."""

    requests: list[Request]
    drafted: list[bool]
    spec: SpeculativeStep
    results: RoundResults
    start: float


# Blocks reserved for this many more rounds past a round that may chain (Runtime.fused_round's chain_rounds; a quarter
# of them where all do not fit): a chain runs until the positions reach them, then one round reads back and packs
# again with new blocks while the device idles. At k = 2 a round advances at most 3 positions: 96 more, six blocks of
# 16 a sequence.
CHAIN_ROUNDS = 32


class LLMEngine:
    def __init__(
        self,
        runtime: Runtime,
        tokenizer=None,
        *,
        max_num_batched_tokens: int = 8192,
        overlap_decode: bool = False,
        mixed_steps: bool = True,
        kv_growth_reserve: float = 1.0,
        speculative_config: SpeculativeConfig | dict | None = None,
        draft_override=None,
        draft_script=None,
        drafting_rule: DraftingRule | None = None,
        progress: bool = False,
    ):
        """``overlap_decode``: read each step's tokens back during the next step (``_step_overlapped``). Off here, so
        that each ``step()`` returns its own tokens to a caller that streams them; ``LLM``, which only returns
        finished outputs, turns it on. ``mixed_steps``, ``kv_growth_reserve``: the scheduler's policy
        (compiled_engine/scheduler.py). ``speculative_config``: the runtime's by default; a config here (vLLM's
        dict) needs a runtime built with one, at most its ``num_speculative_tokens`` and its ``draft_vocab_size``.
        With speculative decoding ``overlap_decode`` applies to the plain decode steps of rows that do not draft,
        and chains fused verify rounds (``_read_round``). ``draft_override(request_id, token_ids, drafts) ->
        drafts``: replaces the MTP layer's k drafts after each round (the MTP layer still runs; the round is read
        back first, so rounds do not chain). ``draft_script(request_id, prompt_token_ids) -> drafts``: a request's
        drafts by position (``drafts[p]`` for position p, -1 or past its end: the MTP layer's), written to the
        device when its prompt runs (``Runtime.script_drafts``: a runtime built with speculative_config
        ``scripted_drafts``), so rounds chain as with the layer's own: the bench's forced-acceptance drafter.
        ``drafting_rule``: decides, step by step, whether drafting pays
        (compiled_engine/drafting_rule.py); by default one when the speculative config has ``auto_disable``.
        ``progress``: a progress bar while the sampler's kernels compile at start-up (on a GPU; stderr)."""
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.grammars = GrammarCache(tokenizer, runtime.model_config.vocab_size)  # structured outputs' grammars
        self.num_speculative_tokens = runtime.num_speculative_tokens
        config = runtime.speculative_config
        if speculative_config is not None:
            parsed = SpeculativeConfig.parse(speculative_config)
            k = parsed.num_speculative_tokens
            if not self.num_speculative_tokens:
                raise ValueError("speculative_config needs a runtime built with one (its MTP layer and verify "
                                 "buffers): Runtime.from_pretrained(path, speculative_config=...)")
            if k > self.num_speculative_tokens:
                raise ValueError(f"num_speculative_tokens={k} exceeds the runtime's {self.num_speculative_tokens}")
            if parsed.draft_vocab_size != runtime.speculative_config.draft_vocab_size:  # the runtime's rounds use it
                raise ValueError(f"draft_vocab_size={parsed.draft_vocab_size} differs from the runtime's "
                                 f"{runtime.speculative_config.draft_vocab_size}")
            self.num_speculative_tokens = k
            config = parsed
        self.disable_by_batch_size = config.disable_by_batch_size if config is not None else None
        if drafting_rule is None and config is not None and config.auto_disable:
            drafting_rule = DraftingRule(num_drafts=self.num_speculative_tokens)
        if drafting_rule is not None and not self.num_speculative_tokens:
            raise ValueError("drafting_rule needs speculative decoding (a speculative_config)")
        self.drafting_rule = drafting_rule
        self.draft_override = draft_override
        if draft_script is not None and not runtime.scripted_drafts:
            raise ValueError("draft_script needs a runtime built with speculative_config scripted_drafts=True")
        self.draft_script = draft_script
        # Speculative decoding counters (cumulative): verify rows, drafts they scored, drafts accepted.
        self.num_verified_rows = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.scheduler = Scheduler(runtime.caches, runtime.config.max_num_seqs, max_num_batched_tokens,
                                   mixed_steps=mixed_steps, kv_growth_reserve=kv_growth_reserve,
                                   decode_tokens=1 + self.num_speculative_tokens, max_model_len=runtime.max_model_len)
        if runtime.device.type == "cuda":  # this rank samples every step's rows
            start = time.perf_counter()
            warm_up_sampling(runtime.model_config.vocab_size, runtime.config.max_num_seqs, runtime.device,
                             model_dtype=runtime.dtype, progress=progress)
            logger.info("compiled the sampler's eager kernels in %.1f s", time.perf_counter() - start)
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self._request_of_seq: dict[int, Request] = {}  # the same, by sequence id (the scheduler's handle)
        # The ids of those that ask for logprobs: while none does, a step does not look for them row by row.
        self._with_logprobs: set[str] = set()
        # The ids of those whose logits are adjusted (penalties, logit_bias): their rows are sampled from the logits
        # (``_sample``; verify rounds unfused), penalised ones in decode steps of their own (``_splits``).
        self._adjusting: set[str] = set()
        self.eos_token_ids = frozenset(runtime.model_config.eos_token_ids)
        self._seed_source = random.Random()
        self._next_id = 0
        self.overlap_decode = overlap_decode
        self._in_flight: _InFlight | None = None
        self._round: _RoundInFlight | None = None  # a verify round not read back yet (``_read_round``)
        self.num_chained_rounds = 0  # rounds launched before the round before them was read back (cumulative)
        # A mixed step's decode rows run in it up to the runtime's decode lanes (the linear layers' decode kernels;
        # a captured mixed step holds that many), or through the prefill path up to where that stops paying.
        self.max_fused_decode_rows = runtime.decode_lanes or fused_decode_row_limit(runtime.model)

    # --------------------------------------------------------------------------------------------- requests
    def validate_request(
        self, prompt_token_ids: list[int], params: SamplingParams | None
    ) -> tuple[list[int], SamplingParams]:
        """The checked prompt and params of a request; raises ValueError naming the bad field. Queues nothing.

        The params returned are a checked copy: ``dataclasses.replace`` builds a new instance, whose __post_init__
        runs ``SamplingParams.validate`` again, so fields set after construction (top_p=0, max_tokens=0,
        temperature=-1) are checked too; the copy also keeps a queued request's params from changing under it when
        the caller mutates theirs."""
        runtime = self.runtime
        token_ids, params = validate_request(prompt_token_ids, params, max_model_len=runtime.max_model_len,
                                             vocab_size=runtime.model_config.vocab_size,
                                             has_tokenizer=self.tokenizer is not None)
        if params.structured_outputs is not None:
            self.grammars.compile(params.structured_outputs)  # a bad spec raises here, before anything is queued
        return token_ids, params

    def add_request(
        self, request_id: str | None, prompt_token_ids: list[int], params: SamplingParams | None = None
    ) -> str:
        """Queue a request. Raises ValueError on bad input; nothing is queued then."""
        token_ids, params = self.validate_request(prompt_token_ids, params)
        if request_id is None:
            request_id = f"req-{self._next_id}"
            self._next_id += 1
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        bad_words = None
        if params.bad_words is not None:
            bad_words = bad_word_ids(self.tokenizer, params.bad_words, self.runtime.model_config.vocab_size)
        seq = self.runtime.new_sequence(token_ids)
        seq.length_limit = self.runtime.max_model_len
        if params.max_tokens is not None:
            seq.length_limit = min(len(token_ids) + params.max_tokens, seq.length_limit)
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
        seed = params.seed if params.seed is not None else self._seed_source.getrandbits(62)
        request = Request(request_id, seq, params, seed, stop_ids, list(token_ids))
        if self.tokenizer is not None and params.detokenize and (
                params.stop or params.output_kind is not RequestOutputKind.FINAL_ONLY):
            request.detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, params.stop,
                                                         skip_special_tokens=params.skip_special_tokens,
                                                         include_stop=params.include_stop_str_in_output)
        if params.logprobs is not None:
            request.logprobs = []
        if params.structured_outputs is not None:
            request.grammar = self.grammars.matcher(params.structured_outputs)
        request.bad_words = bad_words
        if params.prompt_logprobs is not None:
            request.prompt_logprobs = [None]
            seq.reads_prefix_cache, seq.max_chunk_tokens = False, PROMPT_LOGPROBS_CHUNK
        # Registered in the engine and queued in the scheduler in one step: the statements below call no Python
        # function (dict stores, a deque append), so an interrupt (a signal's KeyboardInterrupt runs between
        # bytecodes, a tracer's at a call) cannot leave the request in one and not the other; should one land
        # anyway, the request is taken out of all three again.
        try:
            seq.status = SequenceStatus.WAITING
            self.requests[request_id] = request
            self._request_of_seq[seq.seq_id] = request
            if params.logprobs is not None:
                self._with_logprobs.add(request_id)
            if params.adjusts_logits:
                self._adjusting.add(request_id)
            self.scheduler.waiting.append(seq)
        except BaseException:
            self.requests.pop(request_id, None)
            self._request_of_seq.pop(seq.seq_id, None)
            self._with_logprobs.discard(request_id)
            self._adjusting.discard(request_id)
            if seq in self.scheduler.waiting:
                self.scheduler.waiting.remove(seq)
            raise
        return request_id

    def abort_request(self, request_id: str) -> RequestOutput:
        """Stop a request and free its KV blocks and state slot. Raises ValueError for an unknown id."""
        request = self.requests.get(request_id)
        if request is None:
            raise ValueError(f"unknown request id {request_id!r}")
        self._finish(request, "abort")
        seq = request.seq
        if seq.num_placeholder_tokens:  # drop its placeholder token(s), never read back now (_complete skips it)
            del seq.token_ids[len(seq.token_ids) - seq.num_placeholder_tokens :]
            seq.num_placeholder_tokens = 0
        return self._output(request, [])

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ------------------------------------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """Run one batch. Returns an output for each request that finished in this step, and for each request that
        got a token in it unless its ``output_kind`` is FINAL_ONLY.

        With ``overlap_decode``, a step's tokens are read back during the next step (see ``_step_overlapped``): its
        outputs come one ``step()`` later.

        A step that raises (an error, a KeyboardInterrupt) aborts every request it may have touched: those admitted
        (holding a slot or blocks, running, or half-way through admission or preemption), whose caches, tokens or
        placeholders may be half-updated. Requests still waiting untouched stay queued; the engine keeps serving.
        (vLLM's engine core fails every request on a failed step; this keeps the untouched ones.)
        """
        try:
            if self.num_speculative_tokens:
                return self._step_speculative()
            return self._step_overlapped() if self.overlap_decode else self._step_sync()
        except BaseException:
            self._abort_touched()
            raise

    def _abort_touched(self) -> None:
        """After a failed step: abort every request but those waiting with nothing held (see ``step``)."""
        self._in_flight = None  # its requests are all admitted ones: aborted below, their placeholders dropped
        self._round = None
        waiting = {id(s) for s in self.scheduler.waiting}
        for request in list(self.requests.values()):
            seq = request.seq
            untouched = (id(seq) in waiting and seq.state_slot is None and not seq.block_table
                         and not seq.num_placeholder_tokens and request.finish_reason is None)
            if not untouched:
                self.abort_request(request.request_id)

    def _step_sync(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        requests, tokens, host, logprobs = self._launch(batch)
        return self._accept_placed(requests, host, self._place(requests), logprobs)

    # ---------------------------------------------------------------------------------- speculative decoding
    def _step_speculative(self) -> list[RequestOutput]:
        """One step with speculative decoding (compiled_engine/speculative.py): the decode-ready rows as a verify
        round, then the prompt chunks as a prefill step that drafts for the prompts it completes. Each part reads
        its tokens back once, at its end.

        Where the rows do not draft (``_drafts``) they take a plain decode step, with ``overlap_decode`` left in
        flight as in ``_step_overlapped`` (a step that waits for its tokens leaves the GPU idle during the host's
        work: bench/NOTES.md "Runs 71-73"). The next step launches before reading it back only while it will be a
        plain decode step too; else that step only reads it back."""
        rule = self.drafting_rule
        round_, self._round = self._round, None
        if round_ is not None:  # read it back, with the next round chained on the device first where it can be
            return self._read_round(round_, chain=self._chains(round_))
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            if not self._stays_plain():
                return self._complete(in_flight)  # the host needs the tokens: a round, a prompt, a preemption
            start = rule.clock() if rule is not None else 0.0
            batch = self.scheduler.schedule()  # every running row, decode-ready: a plain decode step
            if batch is None:
                return self._complete(in_flight)
            outputs = self._run_plain_overlapped(batch, in_flight)
            if rule is not None:  # launch to the last step's read-back: in steady state, a plain step's cost
                rule.record_plain(batch.num_decode, rule.clock() - start)
            return outputs
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        d = batch.num_decode
        if d and not self._drafts(d):
            # A plain decode step: their drafts are gone (placeholders stand in for them when drafting resumes,
            # below).
            if self.overlap_decode and not batch.is_prefill:
                return self._run_plain_overlapped(batch, None)
            start = rule.clock() if rule is not None else 0.0
            decode = batch.seqs[:d]
            requests, _, host, logprobs = self._launch(ScheduledBatch(False, decode, [1] * d, d))
            for request in requests:
                request.drafts = None
            outputs = self._accept_placed(requests, host, self._place(requests), logprobs)
            if rule is not None:
                rule.record_plain(d, rule.clock() - start)
            if batch.is_prefill and len(batch.seqs) > d:
                outputs += self._prefill_round(batch.seqs[d:], batch.num_tokens[d:])
            return outputs
        # Every decode-ready row verifies (rows that decoded plainly with placeholder drafts: _verify_round).
        verify, chunks, counts = batch.seqs[:d], batch.seqs[d:], batch.num_tokens[d:]
        # The verify round's draft positions may take only blocks the prefill chunks after it do not need.
        keep_free = sum(self.runtime.caches.blocks_needed(s, n) for s, n in zip(chunks, counts))
        outputs = self._verify_round(verify, keep_free, alone=not chunks) if verify else []
        if chunks:
            outputs += self._prefill_round(chunks, counts)
        return outputs

    def _drafts(self, rows: int) -> bool:
        """Whether ``rows`` decode-ready rows verify drafts this step: not past ``disable_by_batch_size``, nor where
        the drafting rule says drafting does not pay."""
        if self.disable_by_batch_size is not None and rows > self.disable_by_batch_size:
            return False
        return self.drafting_rule is None or self.drafting_rule.should_draft(rows)

    def _stays_plain(self) -> bool:
        """Whether the step after an in-flight plain step is a plain decode step of every running row, so that it may
        launch before the in-flight tokens are read back: no prompt work (waiting or mid-prompt), every row's next
        blocks free (no preemption of a row holding a placeholder), and the rows still not drafting. (A row whose
        logits need its last token on the host sits out the step: ``_without_held_rows``.)"""
        scheduler = self.scheduler
        running = scheduler.running
        return (bool(running) and not scheduler.waiting and all(s.num_uncomputed_tokens == 1 for s in running)
                and scheduler.decode_fits() and not self._drafts(len(running)))

    def _run_plain_overlapped(self, batch: ScheduledBatch, in_flight: "_InFlight | None") -> list[RequestOutput]:
        """A plain decode step of a speculative engine, left in flight (``_run_overlapped``): its rows draft no more
        (placeholders stand in when drafting resumes)."""
        for seq in batch.seqs:
            self._request_of_seq[seq.seq_id].drafts = None
        return self._run_overlapped(batch, in_flight)

    def _prefill_round(self, seqs: list[Sequence], counts: list[int]) -> list[RequestOutput]:
        """Prompt chunks of a speculative engine: one prefill step that drafts for the prompts it completes. Chunks
        of prompts that want their prompt logprobs run as plain prefill steps instead (``_launch``: every position's
        logits); their MTP layer's KV for those positions is not written and their first round verifies
        placeholders: their drafts, not their outputs, suffer."""
        if self.draft_script is not None or self.runtime.scripted_drafts:
            # Each chunk (a preempted sequence may come back in another state slot); no script: the MTP layer's.
            for seq in seqs:
                request = self._request_of_seq[seq.seq_id]
                self.runtime.script_drafts(seq, [] if self.draft_script is None else self.draft_script(
                    request.request_id, seq.token_ids[: seq.num_prompt_tokens]))
        wanted = [i for i, s in enumerate(seqs) if self._request_of_seq[s.seq_id].wants_prompt_logprobs()]
        if wanted:
            plain = ScheduledBatch(True, [seqs[i] for i in wanted], [counts[i] for i in wanted])
            requests, _, host, logprobs = self._launch(plain)
            for request in requests:
                request.drafts = None
            outputs = self._accept_placed(requests, host, self._place(requests), logprobs)
            rest = sorted(set(range(len(seqs))) - set(wanted))
            if rest:
                outputs += self._prefill_round([seqs[i] for i in rest], [counts[i] for i in rest])
            return outputs
        spec = self.runtime.prefill_for_drafts(seqs, counts)
        done = [i for i, completed in enumerate(spec.completed) if completed]
        device = spec.logits.device
        next_tokens = torch.zeros(len(seqs), dtype=torch.long, device=device)
        requests = [self._request_of_seq[seqs[i].seq_id] for i in done]
        logprobs = None
        if done:
            rows = upload(torch.tensor(done, dtype=torch.long), device)
            tokens = self._sample(requests, spec.logits[rows])
            next_tokens[rows] = tokens
            logprobs = self._logprobs(spec.logits[rows], tokens, self._num_logprobs([r.seq for r in requests]))
        drafts = self.runtime.draft_after_prefill(spec, next_tokens)
        if not done:
            return []
        host = torch.cat([tokens[:, None], drafts], dim=1).tolist()  # the step's one read-back
        indices = []
        for request, row in zip(requests, host):
            request.seq.token_ids.append(row[0])
            self._set_drafts(request, row[1:])
            indices.append(len(request.seq.token_ids) - 1)
        return self._accept(requests, indices, logprobs)

    def _set_drafts(self, request: Request, drafts: list[int]) -> None:
        if self.draft_override is not None:
            drafts = list(self.draft_override(request.request_id, list(request.seq.token_ids), drafts))
        request.drafts = drafts

    def _verify_round(self, seqs: list[Sequence], keep_free: int, alone: bool) -> list[RequestOutput]:
        """A verify round of the decode-ready ``seqs``. ``alone``: no prompt chunk follows it in the step. A fused
        round (no logprobs, no min_tokens suppression or logit adjustment, no draft override) with ``overlap_decode``
        stays in flight instead of being read back here: the next step reads it, chaining the round after it first
        where it can (``_chains``), so that the host's reading, the outputs and the next step's scheduling run while
        the device computes a round. The unfused round samples its rows from the verify step's logits, a row p of a
        request with penalties counting the drafts before it, of one with a structured output masked by its grammar
        past them."""
        rule = self.drafting_rule
        start = rule.clock() if rule is not None else 0.0
        requests = [self._request_of_seq[s.seq_id] for s in seqs]
        k = self.num_speculative_tokens
        # A row without drafts (it decoded plainly) verifies placeholders, its last token k times: like any drafts
        # they cannot change the output, and the round's MTP pass drafts for the row's next round. (A 1-token prefill
        # chunk drafts too, but as a prefill step: tens of ms eager on an H200 (bench/NOTES.md "Runs 67-70"), ~3 ms
        # replayed, where a round takes ~1.5 ms.) Placeholders are not counted as drafts.
        drafted = [r.drafts is not None for r in requests]
        proposals = [r.drafts[:k] if r.drafts is not None else [r.seq.token_ids[-1]] * k for r in requests]
        n = len(seqs)
        num_logprobs = self._num_logprobs(seqs)
        if num_logprobs is None and not any(r.suppressing() for r in requests) and not self._adjusts(requests):
            sampling = None if all(r.params.greedy for r in requests) else sampling_inputs(requests, k + 1)
            # Chained rounds take their drafts from the device: no override.
            chainable = alone and self.overlap_decode and self.draft_override is None
            spec, results = self.runtime.fused_round(seqs, proposals, keep_free, sampling,
                                                     chain_rounds=CHAIN_ROUNDS if chainable else 0)
            round_ = _RoundInFlight(requests, drafted, spec, results, start)
            if chainable:
                self._round = round_
                return []
            return self._read_round(round_)
        # The unfused round, whose logits serve min_tokens suppression, logit adjustments and logprobs
        spec = self.runtime.verify(seqs, proposals, keep_free)
        drafts = spec.step.input_ids.view(n, k + 1)[:, 1:]  # uploaded with the step
        batch = sampling_batch(requests, spec.logits.device, positions=k + 1, vocab=spec.logits.shape[-1],
                               drafts=proposals)
        accepted, tokens = rejection_sample(spec.logits, drafts, batch)
        # Row i * (k+1) + p: the target's distribution at the sequence's p-th verified position, where the emitted
        # token p (an accepted draft, or the correction / bonus) was drawn from.
        logprobs = self._logprobs(spec.logits, tokens.reshape(-1), num_logprobs)
        results = RoundResults(accepted, tokens, self.runtime.accept(spec, accepted, tokens))
        return self._read_round(_RoundInFlight(requests, drafted, spec, results, start), logprobs=logprobs)

    def _chains(self, round_: _RoundInFlight) -> bool:
        """Whether the round after ``round_`` (in flight) may launch before ``round_`` is read back: the same rows
        decode again (every running sequence, none waiting or finished, drafting still on for them), and each has
        room for it below its length limit and inside the blocks ``round_`` was packed with (``Runtime.can_chain``)."""
        scheduler, seqs = self.scheduler, round_.spec.seqs
        return (not scheduler.waiting and len(scheduler.running) == len(seqs)
                and {id(s) for s in scheduler.running} == {id(s) for s in seqs}
                and all(r.finish_reason is None for r in round_.requests)
                and self._drafts(len(seqs)) and self.runtime.can_chain(round_.spec))

    def _read_round(self, round_: _RoundInFlight, chain: bool = False,
                    logprobs: "_StepLogprobs | None" = None) -> list[RequestOutput]:
        """Read a verify round back and emit its tokens: each sequence's accepted drafts and the target's next token,
        up to a stop or the length limit; its new drafts kept for the next round. ``chain``: first launch the round
        after it on the device (``Runtime.chain_round``), left in flight. Rows of requests that finished meanwhile (a
        stop in the round before, an abort) are skipped. ``logprobs``: the unfused round's."""
        rule = self.drafting_rule
        requests, results, k = round_.requests, round_.results, self.num_speculative_tokens
        if chain:
            results, spec, chained = self.runtime.chain_round(round_.spec, results)
            # Its clock starts when this round is read (below): in steady state a chained round's launch-to-read
            # would span two rounds, its read-to-read is one.
            self._round = _RoundInFlight(requests, [True] * len(requests), spec, chained, 0.0)
            self.num_chained_rounds += 1
        host = results.rows()  # the step's one read-back: [a, tokens (k+1), new drafts (k)] a sequence
        table = logprobs.read() if logprobs is not None else None
        live = [r.finish_reason is None for r in requests]
        self.runtime.advance(round_.spec, [row[0] if ok else None for row, ok in zip(host, live)],
                             [row[1 : k + 2] for row in host])
        rows = [(request, row, real) for request, row, real, ok in zip(requests, host, round_.drafted, live) if ok]
        self.num_verified_rows += len(rows)
        self.num_draft_tokens += sum(real for _, _, real in rows) * k
        accepted_drafts = sum(row[0] for _, row, real in rows if real)
        self.num_accepted_tokens += accepted_drafts
        now = time.perf_counter()
        outputs = []
        for i, (request, row) in enumerate(zip(requests, host)):
            if not live[i]:
                continue
            seq, a = request.seq, row[0]
            first = len(seq.token_ids) - (a + 1)  # where this step's tokens start
            emitted = []
            if request.first_token_time is None:
                request.first_token_time = now
            for index in range(first, first + a + 1):
                token = seq.token_ids[index]
                emitted.append(token)
                if request.logprobs is not None:
                    request.logprobs.append(table.entry(i * (k + 1) + index - first, token, request.params.logprobs))
                reason = self._take_token(request, token, generated=index + 1 - seq.num_prompt_tokens)
                if reason is not None:
                    del seq.token_ids[index + 1 :]  # nothing past a stop or the length limit
                    self._finish(request, reason)
                    break
            if request.finish_reason is None:
                self._set_drafts(request, row[k + 2 :])
                if request.params.output_kind is RequestOutputKind.FINAL_ONLY:
                    continue
            outputs.append(self._output(request, emitted))
        if rule is not None:
            read = rule.clock()
            if rows:
                rule.record_round(len(requests), read - round_.start, drafted_rows=sum(r for _, _, r in rows),
                                  accepted_drafts=accepted_drafts)
            if chain:
                self._round.start = read
        return outputs

    def _launch(
        self,
        batch: ScheduledBatch,
        input_ids: torch.Tensor | None = None,
        device_input_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
        num_logprobs: int | None = None,
    ) -> tuple[list[Request], torch.Tensor, HostTokens, _StepLogprobs | None]:
        """Run ``batch`` on the runtime and sample: the requests that get a token, their tokens on the device, the
        same tokens on their way to host memory (the decode graph's own when the graph chose them; a copy started
        here otherwise), and, when a request of the batch asks for logprobs, every row's (``_logprobs``).
        ``input_ids`` (a decode step) and ``device_input_ids`` (a prefill step): input tokens still on the device
        (``_next_input_ids``, ``_carried_input_ids``).

        A mixed step with more than ``max_fused_decode_rows`` decode rows runs them as a decode step (``input_ids``
        are theirs) and then its prefill chunks as a prefill step: the same tokens, cheaper on the device.
        """
        if num_logprobs is None:  # the top-n width of this step's logprobs: one for all its rows (and parts)
            num_logprobs = self._num_logprobs(batch.seqs)
        if self._splits(batch):
            d = batch.num_decode
            requests, tokens, host, logprobs = self._launch(
                ScheduledBatch(False, batch.seqs[:d], [1] * d, d), input_ids, num_logprobs=num_logprobs)
            more, more_tokens, _, more_logprobs = self._launch(
                ScheduledBatch(True, batch.seqs[d:], batch.num_tokens[d:]), num_logprobs=num_logprobs)
            if not more:  # only middle chunks of prompts: no token from the prefill step
                return requests, tokens, host, logprobs
            tokens = torch.cat([tokens, more_tokens])  # also a copy of the decode graph's buffers, kept in flight
            if logprobs is not None:
                both = zip(logprobs.device, more_logprobs.device)
                logprobs = _StepLogprobs.start(tuple(torch.cat(pair) for pair in both))
            return requests + more, tokens, to_host(tokens), logprobs
        seqs = batch.seqs
        if batch.is_prefill and any(self._request_of_seq[s.seq_id].wants_prompt_logprobs()
                                    for s in seqs[batch.num_decode:]):
            return self._launch_prompt_logprobs(batch, device_input_ids, num_logprobs)
        if batch.is_prefill:
            logits = self.runtime.prefill(seqs, batch.num_tokens, device_input_ids=device_input_ids)
            # Only sequences whose every token is now computed produce a token (not the middle chunks of a prompt).
            rows = [i for i, s in enumerate(seqs) if s.num_uncomputed_tokens == 0]
            if len(rows) != len(seqs):
                seqs = [seqs[i] for i in rows]
                logits = logits[upload(torch.tensor(rows, dtype=torch.long), logits.device)]
        else:
            # Every sequence gets a token, chosen in the decode step itself (its greedy tokens, or ce::sample's draw
            # inside the graph), unless a request still suppresses its stop tokens (min_tokens) or adjusts its logits
            # (penalties, logit_bias): then from the logits, below. No copy: with a compiled decode the logits and
            # tokens are the graph's output buffers, valid until the next decode step; they are used right here.
            requests = [self._request_of_seq[s.seq_id] for s in seqs]
            in_step = not any(r.suppressing() for r in requests) and not self._adjusts(requests)
            sampling = None
            if in_step and not all(r.params.greedy for r in requests):
                sampling = sampling_inputs(requests)
            # The penalties count each row's last token, its input here: where that is in flight, only the device
            # has it (copied before the step, whose graph may write its tokens over the buffer it came in).
            last_ids = input_ids.clone() if input_ids is not None and not in_step and self._adjusting else None
            out = self.runtime.decode(seqs, input_ids=input_ids, sampling=sampling)
            if in_step:
                host = out.host_tokens if out.host_tokens is not None else to_host(out.tokens)
                return requests, out.tokens, host, self._logprobs(out.logits, out.tokens, num_logprobs)
            tokens = self._sample(requests, out.logits, last_ids)
            return requests, tokens, to_host(tokens), self._logprobs(out.logits, tokens, num_logprobs)
        requests = [self._request_of_seq[s.seq_id] for s in seqs]
        if not requests:
            empty = HostTokens(torch.empty(0, dtype=torch.long), None)
            return requests, logits.new_empty(0, dtype=torch.long), empty, None
        tokens = self._sample(requests, logits)
        return requests, tokens, to_host(tokens), self._logprobs(logits, tokens, num_logprobs)

    def _launch_prompt_logprobs(
        self, batch: ScheduledBatch, device_input_ids: tuple[torch.Tensor, torch.Tensor] | None,
        num_logprobs: int | None,
    ) -> tuple[list[Request], torch.Tensor, HostTokens, _StepLogprobs | None]:
        """A prefill batch with chunks of requests that want prompt logprobs: the other rows as one prefill step (the
        decode rows still first, so that ``device_input_ids`` index the same tokens), then those chunks in steps of
        at most PROMPT_LOGPROBS_CHUNK tokens with every position's logits, from which their prompt tokens' logprobs
        are read (``_take_prompt_logprobs``; a host sync); ``_launch``'s results for all rows, in that order."""
        wanted = [i >= batch.num_decode and self._request_of_seq[s.seq_id].wants_prompt_logprobs()
                  for i, s in enumerate(batch.seqs)]
        rest = [i for i, w in enumerate(wanted) if not w]
        parts = []
        if rest:
            parts.append(self._launch(ScheduledBatch(True, [batch.seqs[i] for i in rest],
                                                     [batch.num_tokens[i] for i in rest], batch.num_decode),
                                      device_input_ids=device_input_ids, num_logprobs=num_logprobs))
        groups, tokens = [[]], 0
        for i in (i for i, w in enumerate(wanted) if w):
            if groups[-1] and tokens + batch.num_tokens[i] > PROMPT_LOGPROBS_CHUNK:
                groups.append([])
                tokens = 0
            groups[-1].append(i)
            tokens += batch.num_tokens[i]
        for group in groups:
            seqs, counts = [batch.seqs[i] for i in group], [batch.num_tokens[i] for i in group]
            starts = [s.num_computed_tokens for s in seqs]
            logits = self.runtime.prefill(seqs, counts, all_logits=True)
            self._take_prompt_logprobs(seqs, starts, counts, logits)
            ends = [offset + n - 1 for offset, n in zip(itertools.accumulate([0] + counts), counts)]
            rows = [row for row, s in zip(ends, seqs) if s.num_uncomputed_tokens == 0]
            if rows:
                last = logits[upload(torch.tensor(rows, dtype=torch.long), logits.device)]
                requests = [self._request_of_seq[s.seq_id] for s in seqs if s.num_uncomputed_tokens == 0]
                sampled = self._sample(requests, last)
                parts.append((requests, sampled, None, self._logprobs(last, sampled, num_logprobs)))
        parts = [part for part in parts if part[0]]
        if not parts:
            return [], torch.empty(0, dtype=torch.long, device=self.runtime.device), HostTokens(
                torch.empty(0, dtype=torch.long), None), None
        requests = [r for part in parts for r in part[0]]
        tokens = torch.cat([part[1] for part in parts])
        logprobs = None
        if num_logprobs is not None:
            logprobs = _StepLogprobs.start(tuple(torch.cat(pair) for pair in zip(*(p[3].device for p in parts))))
        return requests, tokens, to_host(tokens), logprobs

    def _take_prompt_logprobs(self, seqs: list[Sequence], starts: list[int], counts: list[int],
                              logits: torch.Tensor) -> None:
        """Append to each sequence's request the logprobs of the prompt tokens its chunk's logits predict (the logits
        at position p give token p + 1's); positions computed before a preemption are not taken twice."""
        rows, chosen, owners = [], [], []
        offset = 0
        for seq, start, n in zip(seqs, starts, counts):
            request = self._request_of_seq[seq.seq_id]
            prompt = request.prompt_token_ids
            for p in range(max(start, len(request.prompt_logprobs) - 1), min(start + n, len(prompt) - 1)):
                rows.append(offset + p - start)
                chosen.append(prompt[p + 1])
                owners.append(request)
            offset += n
        if not rows:
            return
        device = logits.device
        k = max(r.params.prompt_logprobs for r in owners)
        table = _StepLogprobs.start(logprobs_op(logits[upload(torch.tensor(rows, dtype=torch.long), device)],
                                                upload(torch.tensor(chosen, dtype=torch.long), device), k)).read()
        for i, (request, token) in enumerate(zip(owners, chosen)):
            request.prompt_logprobs.append(table.entry(i, token, request.params.prompt_logprobs))
        for seq in seqs:
            if not self._request_of_seq[seq.seq_id].wants_prompt_logprobs():  # done: a recompute reads the cache
                seq.reads_prefix_cache, seq.max_chunk_tokens = True, None

    def _num_logprobs(self, seqs: list[Sequence]) -> int | None:
        """The most top logprobs a request of the step asks for; None when none asks for logprobs."""
        if not self._with_logprobs:  # the common case, without a pass over the batch
            return None
        asked = [r.params.logprobs for r in map(self._request_of_seq.get, (s.seq_id for s in seqs))
                 if r is not None and r.params.logprobs is not None]
        return max(asked) if asked else None

    @staticmethod
    def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int | None) -> _StepLogprobs | None:
        """``ce::logprobs`` of the step's own logits and tokens, started on their way to the host (the decode
        graph's logits are read here, before the next replay overwrites them)."""
        if k is None:
            return None
        return _StepLogprobs.start(logprobs_op(logits, tokens, k))

    def _adjusts(self, requests: list[Request]) -> bool:
        """Whether a request among these adjusts its logits (without a pass over them while none in the engine does:
        the common case, every step)."""
        return bool(self._adjusting) and any(r.params.adjusts_logits for r in requests)

    def _splits(self, batch: ScheduledBatch) -> bool:
        """Whether ``_launch`` runs a mixed batch's decode rows as a decode step of their own: past the fused rows'
        limit, or where one has penalties (a decode step has each row's in-flight input token on the device for
        ``sampler.penalties``; a mixed step scatters them into its packed ids)."""
        if not batch.is_prefill or not batch.num_decode:
            return False
        if batch.num_decode > self.max_fused_decode_rows:
            return True
        return bool(self._adjusting) and any(
            self._request_of_seq[s.seq_id].params.penalized for s in batch.seqs[: batch.num_decode])

    def _accept(self, requests: list[Request], indices: list[int], logprobs: _StepLogprobs | None = None,
                rows: list[int] | None = None) -> list[RequestOutput]:
        """Finish what the new tokens (at ``indices`` of each request's token_ids) stop; the step's outputs.
        ``logprobs``: the step's, whose row ``rows[i]`` (default i) is ``requests[i]``'s."""
        now = time.perf_counter()
        table = logprobs.read() if logprobs is not None else None
        outputs = []
        for i, (request, index) in enumerate(zip(requests, indices)):
            seq = request.seq
            token = seq.token_ids[index]
            if request.first_token_time is None:
                request.first_token_time = now
            if request.logprobs is not None:
                request.logprobs.append(table.entry(i if rows is None else rows[i], token, request.params.logprobs))
            reason = self._take_token(request, token, generated=index + 1 - seq.num_prompt_tokens)
            if reason is not None:
                self._finish(request, reason)
            elif request.params.output_kind is RequestOutputKind.FINAL_ONLY:
                continue  # an output copies the generated tokens: O(batch x length) a step, for nobody
            outputs.append(self._output(request, [token], upto=index + 1))
        return outputs

    # ------------------------------------------------------------------------------------- overlapped steps
    def _step_overlapped(self) -> list[RequestOutput]:
        """One step in which the host's work overlaps the GPU's.

        Without overlap every step ends by reading its tokens back, so the GPU idles while the host schedules and
        packs the next step (a millisecond or more a step: bench/NOTES.md, "Overlapped steps").
        Here a step (prefill, mixed or decode) is launched and left in flight: each sequence it gives a token gets a
        placeholder token (the lengths, hence positions, KV slots and blocks of the next step, are known), and the
        next step takes those sequences' input ids from the in-flight step's sampled tokens on the device: a decode
        step as its input ids (``_next_input_ids``), a mixed step scattered over its packed ids at its decode rows
        (``_carried_input_ids``), or, when ``_launch`` splits it, as the input ids of its decode part.
        The host reads a step's tokens back after it has launched the next one, then finishes what they stop. What
        this costs: a sequence stopped by EOS or a stop token computes one more token, thrown away. When KV blocks
        run short the in-flight step is read back first (``_may_run_ahead``).
        """
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None and not self._may_run_ahead():
            return self._complete(in_flight)
        return self._run_overlapped(self.scheduler.schedule(), in_flight)

    def _run_overlapped(self, batch: ScheduledBatch | None, in_flight: "_InFlight | None") -> list[RequestOutput]:
        """Launch ``batch``, scheduled while ``in_flight`` (if any) was running, and leave it in flight; then read
        ``in_flight`` back (``_step_overlapped``)."""
        if batch is not None and in_flight is not None:
            batch = self._without_held_rows(batch)
        if batch is None:
            return self._complete(in_flight) if in_flight is not None else []
        input_ids = carried = None
        if in_flight is not None and batch.num_decode:
            if batch.is_prefill and not self._splits(batch):
                carried = self._carried_input_ids(batch, in_flight)
            else:
                input_ids = self._next_input_ids(batch.seqs[: batch.num_decode], in_flight)
        requests, tokens, host, logprobs = self._launch(batch, input_ids, None if carried is None else carried[1:])
        if requests:  # a prefill of middle chunks only gives no token
            self._in_flight = _InFlight.start(requests, tokens, self._place(requests), host, logprobs)
        if in_flight is None:
            return []
        outputs = self._complete(in_flight)
        if self.runtime.caches.prefix_cache is not None and (input_ids is not None or carried is not None):
            # The tokens just read back were inputs of this step: now the cache can hash them, index the blocks they
            # fill and snapshot a boundary this step reached. The copy queues behind this step, before the next.
            # (The other inputs were known, and recorded when the step ran.)
            seqs = batch.seqs[: batch.num_decode] if carried is None else carried[0]
            self.runtime.caches.record_prefixes(
                [s for s in seqs if self._request_of_seq.get(s.seq_id) is not None])
        return outputs

    def _may_run_ahead(self) -> bool:
        """Whether the next step may be scheduled before the in-flight step's tokens are known: not when a decode
        step could run out of KV blocks (each sequence needs at most one more), which would preempt a sequence
        whose last token is a placeholder. (The prefix cache hashes only known tokens: Sequence.num_known_tokens.
        Rows whose logits need their last token on the host sit out a step that runs ahead of it:
        ``_without_held_rows``.)"""
        return self.runtime.caches.num_free_blocks >= len(self.scheduler.running)

    def _without_held_rows(self, batch: ScheduledBatch) -> ScheduledBatch | None:
        """The batch less the decode rows that cannot run ahead of their in-flight token: those it will finish by
        length (known now: computing the next token would waste a row, or pass max_model_len), and those whose
        logits need that token on the host (``Request.reads_last_token``: a grammar's mask, a bad word's prefix;
        they join the step after it is read back). (Only
        decode rows can hold a placeholder; a prefill chunk's sequence has all its tokens known.)"""
        d = batch.num_decode
        keep = []
        adjusting = bool(self._adjusting)  # a row that reads its last token adjusts its logits: none while none does
        for i, s in enumerate(batch.seqs[:d]):
            request = self._request_of_seq[s.seq_id]
            if self._reaches_length(request, s.num_generated_tokens):
                continue
            if adjusting and s.num_placeholder_tokens and request.reads_last_token():
                continue
            keep.append(i)
        if len(keep) == d:
            return batch
        seqs = [batch.seqs[i] for i in keep] + batch.seqs[d:]
        if not seqs:
            return None
        return ScheduledBatch(batch.is_prefill, seqs, [1] * len(keep) + batch.num_tokens[d:], len(keep))

    def _next_input_ids(self, seqs: list[Sequence], in_flight: "_InFlight") -> torch.Tensor:
        """The decode step's input ids on the device: the in-flight step's sampled token for each sequence it gave
        one (a placeholder on the host), the host's last token for the others (after an in-flight prefill, the
        sequences that were already decoding)."""
        if len(seqs) == len(in_flight.requests) and all(  # the steady state: the same rows in the same order
            r.seq is s for r, s in zip(in_flight.requests, seqs)
        ):
            return in_flight.tokens
        row_of = {r.seq.seq_id: i for i, r in enumerate(in_flight.requests)}
        rows = [row_of.get(s.seq_id, -1) for s in seqs]
        device = in_flight.tokens.device
        if all(row >= 0 for row in rows):  # a subsequence of the in-flight rows (length stops left out)
            return in_flight.tokens[upload(torch.tensor(rows, dtype=torch.long), device)]
        # Known tokens from the host, in-flight ones scattered over them on the device: one packed copy.
        taken = [(i, row) for i, row in enumerate(rows) if row >= 0]
        packed = torch.tensor(
            [s.token_ids[-1] if row < 0 else PLACEHOLDER_TOKEN for s, row in zip(seqs, rows)]
            + [i for i, _ in taken] + [row for _, row in taken],
            dtype=torch.long,
        )
        packed = upload(packed, device)
        n, k = len(seqs), len(taken)
        ids = packed[:n].clone()
        ids[packed[n : n + k]] = in_flight.tokens[packed[n + k :]]
        return ids

    def _carried_input_ids(
        self, batch: ScheduledBatch, in_flight: "_InFlight"
    ) -> tuple[list[Sequence], torch.Tensor, torch.Tensor] | None:
        """A mixed step's input ids still on the device: the decode rows the in-flight step gave a token (a
        placeholder on the host), the token indices of those placeholders in the packed step, and their tokens.
        Decode rows lead the step, one token each, so row i's token sits at index i. None when no row has one."""
        row_of = {r.seq.seq_id: i for i, r in enumerate(in_flight.requests)}
        seqs, indices, rows = [], [], []
        for i, seq in enumerate(batch.seqs[: batch.num_decode]):
            row = row_of.get(seq.seq_id)
            if row is not None:
                # the row computes exactly its one uncomputed token, and that token is the in-flight placeholder
                assert in_flight.indices[row] == seq.num_computed_tokens == len(seq.token_ids) - 1
                seqs.append(seq)
                indices.append(i)
                rows.append(row)
        if not seqs:
            return None
        packed = upload(torch.tensor(indices + rows, dtype=torch.long), in_flight.tokens.device)  # one copy
        k = len(seqs)
        return seqs, packed[:k], in_flight.tokens[packed[k:]]

    @staticmethod
    def _place(requests: list[Request]) -> list[int]:
        """Append a placeholder token to each request's sequence; where each one sits."""
        indices = []
        for request in requests:
            seq = request.seq
            seq.token_ids.append(PLACEHOLDER_TOKEN)
            seq.num_placeholder_tokens += 1
            indices.append(len(seq.token_ids) - 1)
        return indices

    @staticmethod
    def _fill(request: Request, index: int, token: int) -> None:
        """A placeholder's value, read back (placeholders are filled in the order they were placed)."""
        request.seq.token_ids[index] = token
        request.seq.num_placeholder_tokens -= 1

    def _accept_placed(self, requests: list[Request], tokens: HostTokens, indices: list[int],
                       logprobs: _StepLogprobs | None = None) -> list[RequestOutput]:
        """Read ``tokens`` back (waiting for them) into the placeholders, then ``_accept``."""
        for request, index, token in zip(requests, indices, tokens.tolist()):
            self._fill(request, index, token)
        return self._accept(requests, indices, logprobs)

    def _complete(self, in_flight: "_InFlight") -> list[RequestOutput]:
        """Read an in-flight step's tokens back into its placeholders, then finish what they stop. Requests that
        stopped meanwhile (the previous step's EOS, an abort) are skipped: their token is the one thrown away."""
        values = in_flight.host_tokens()
        live = [(row, r, i, t) for row, (r, i, t) in enumerate(zip(in_flight.requests, in_flight.indices, values))
                if r.finish_reason is None]
        for _, request, index, token in live:
            self._fill(request, index, token)
        return self._accept([r for _, r, _, _ in live], [i for _, _, i, _ in live], in_flight.logprobs,
                            [row for row, _, _, _ in live])

    # ------------------------------------------------------------------------------------------------ helpers
    def _take_token(self, request: Request, token: int, generated: int) -> str | None:
        """A new token of the request, in order: its finish reason if it ends the request (a stop token, the length
        limit, or a stop string completed in the detokenized text), with ``stop_reason`` set; else None. Stop
        strings are searched from the token after the first ``min_tokens`` on (vLLM's rule), and one found ends the
        request as "stop" with the string as its reason even where the token also reaches the length limit: the text
        is cut where it starts (ends, with ``include_stop_str_in_output``)."""
        reason = self._stop_reason(request, token, generated)
        grammar = request.grammar
        if grammar is not None and (not grammar.accept_token(token) or grammar.is_terminated()):
            # The grammar is complete (its stop token accepted; also under ignore_eos), or refused a token its mask
            # could not keep out (every allowed token suppressed by min_tokens): the output ends here.
            reason = "stop"
        if reason == "stop":
            request.stop_reason = token if token in request.params.stop_token_ids else None  # None: EOS
        detokenizer = request.detokenizer
        if detokenizer is not None:
            stop = None
            if reason != "stop":
                stop = detokenizer.add(token, check_stop=generated > request.params.min_tokens)
            elif request.params.include_stop_str_in_output:
                detokenizer.add(token, check_stop=False)
            # else: a stop token (or EOS) ends the request without its text (Request.shows_last_token_text)
            if stop is not None:
                reason, request.stop_reason = "stop", stop
            if reason is not None:
                detokenizer.flush()
        return reason

    def _stop_reason(self, request: Request, token: int, generated: int) -> str | None:
        """``generated``: the request's generated tokens up to and including ``token``."""
        params = request.params
        if token in request.stop_ids and generated >= params.min_tokens:
            return "stop"
        if self._reaches_length(request, generated):
            return "length"
        return None

    def _reaches_length(self, request: Request, generated: int) -> bool:
        """Whether ``generated`` tokens finish the request by length (max_tokens or max_model_len)."""
        max_tokens = request.params.max_tokens
        return (max_tokens is not None and generated >= max_tokens) or (
            request.seq.num_prompt_tokens + generated >= self.runtime.max_model_len
        )

    def _finish(self, request: Request, reason: str) -> None:
        """Free what the request holds, mark it finished, and forget it, in that order. Idempotent: a call cut short
        (an interrupt inside Scheduler.finish) leaves the request unfinished and in ``requests``, so that
        abort_request can repeat it; once the resources are freed, nothing below calls Python code but the clock.
        The first reason stays."""
        self.scheduler.finish(request.seq)
        if request.finish_reason is None:
            request.finished_time = time.perf_counter()
            request.finish_reason = reason
        self._request_of_seq.pop(request.seq.seq_id, None)
        self.requests.pop(request.request_id, None)
        self._with_logprobs.discard(request.request_id)
        self._adjusting.discard(request.request_id)

    def _sample(self, requests: list[Request], logits: torch.Tensor,
                last_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The requests' next tokens from a step's logits (prefill steps, and decode steps that suppress tokens or
        adjust logits). ``last_ids``: a decode step's input ids on the device, each row's last token."""
        # All greedy and nothing to suppress or adjust: argmax, without building the per-row parameter tensors.
        if all(r.params.greedy and not r.suppressing() and not r.params.adjusts_logits for r in requests):
            return logits.argmax(dim=-1)
        return sample(logits, sampling_batch(requests, logits.device, vocab=logits.shape[-1], last_ids=last_ids))

    def _output(self, request: Request, new_tokens: list[int], upto: int | None = None) -> RequestOutput:
        """``upto``: the request's tokens end there (an overlapped step may have placed one more after them)."""
        seq = request.seq
        finished = request.finish_reason is not None
        generated = seq.token_ids[seq.num_prompt_tokens : upto]  # a new list (a slice)
        text = None
        if request.detokenizer is not None:
            text = request.detokenizer.output_text(finished)
        elif finished and self.tokenizer is not None and request.params.detokenize:
            shown = generated if request.shows_last_token_text() else generated[:-1]
            text = self.tokenizer.decode(shown, skip_special_tokens=request.params.skip_special_tokens)
        return RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=generated,
            new_token_ids=new_tokens,
            finished=finished,
            finish_reason=request.finish_reason,
            text=text,
            stop_reason=request.stop_reason,
            logprobs=None if request.logprobs is None else list(request.logprobs),
            prompt_logprobs=request.prompt_logprobs if not request.wants_prompt_logprobs() else None,
            num_cached_tokens=seq.num_cached_tokens,
            arrival_time=request.arrival_time,
            first_token_time=request.first_token_time,
            finished_time=request.finished_time,
        )

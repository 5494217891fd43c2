"""LLMEngine: the incremental serving API (vLLM's shape) over the scheduler, the runtime and the sampler.

    engine = LLMEngine(runtime, tokenizer)
    engine.add_request("r1", prompt_token_ids, SamplingParams(max_tokens=32))
    while engine.has_unfinished_requests():
        for out in engine.step():          # RequestOutput per request that advanced this step
            ...out.new_token_ids, out.finished, out.finish_reason
    engine.abort_request("r1")             # frees everything the request holds

One ``step()``: schedule a batch -> run it on the runtime (prefill or decode) -> sample on the device -> append
the tokens on the host (the one device->host copy of the step) -> finish requests that hit a stop condition.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch

from compiled_engine.runtime import Runtime
from compiled_engine.sampler import SamplingBatch, sample
from compiled_engine.sampling_params import RequestOutputKind, SamplingParams
from compiled_engine.scheduler import Scheduler
from compiled_engine.sequence import Sequence


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens so far
    new_token_ids: list[int]  # generated in the step that returned this output
    finished: bool
    finish_reason: str | None  # "stop" (EOS or a stop token), "length" (max_tokens / max_model_len), "abort"
    text: str | None = None
    num_cached_tokens: int = 0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass(eq=False)
class Request:
    request_id: str
    seq: Sequence
    params: SamplingParams
    seed: int
    stop_ids: frozenset[int]  # EOS (unless ignore_eos) and stop_token_ids
    prompt_token_ids: list[int]  # a copy made once; every output of the request shares it (treat it as read-only)
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finished_time: float | None = None
    finish_reason: str | None = None


class LLMEngine:
    def __init__(
        self,
        runtime: Runtime,
        tokenizer=None,
        *,
        max_num_batched_tokens: int = 8192,
    ):
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(runtime, runtime.config.max_num_seqs, max_num_batched_tokens)
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self._request_of_seq: dict[int, Request] = {}  # the same, by sequence id (the scheduler's handle)
        self.eos_token_ids = frozenset(runtime.model_config.eos_token_ids)
        self._seed_source = random.Random()
        self._next_id = 0

    # --------------------------------------------------------------------------------------------- requests
    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams | None) -> tuple[list[int], SamplingParams]:
        """The checked prompt and params of a request; raises ValueError naming the bad field. Queues nothing."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        token_ids = self.runtime.validate_prompt(prompt_token_ids)
        vocab = self.runtime.model_config.vocab_size
        bad_stop = [t for t in params.stop_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad_stop:
            raise ValueError(f"SamplingParams.stop_token_ids has {bad_stop[0]!r}, outside [0, {vocab})")
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
        seq = Sequence(self.runtime.new_seq_id(), token_ids, len(token_ids))
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
        seed = params.seed if params.seed is not None else self._seed_source.getrandbits(62)
        request = Request(request_id, seq, params, seed, stop_ids, list(token_ids))
        self.requests[request_id] = request
        self._request_of_seq[seq.seq_id] = request
        self.scheduler.add(seq)
        return request_id

    def abort_request(self, request_id: str) -> RequestOutput:
        """Stop a request and free its KV blocks and state slot. Raises ValueError for an unknown id."""
        request = self.requests.get(request_id)
        if request is None:
            raise ValueError(f"unknown request id {request_id!r}")
        self._finish(request, "abort")
        del self.requests[request_id]
        return self._output(request, [])

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ------------------------------------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """Run one batch. Returns an output for each request that finished in this step, and for each request that
        got a token in it unless its ``output_kind`` is FINAL_ONLY."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        seqs = batch.seqs
        if batch.is_prefill:
            logits = self.runtime.prefill(seqs, batch.num_tokens)
            # Only sequences whose every token is now computed produce a token (not the middle chunks of a prompt).
            rows = [i for i, s in enumerate(seqs) if s.num_uncomputed_tokens == 0]
            if not rows:
                return []
            if len(rows) != len(seqs):
                seqs = [seqs[i] for i in rows]
                logits = logits[torch.tensor(rows, device=logits.device)]
        else:
            # Every sequence gets a token. No copy: with a compiled decode these logits are the graph's output
            # buffer, valid until the next decode step; they are sampled right here, before it.
            logits = self.runtime.decode_step(seqs, copy=False)
        requests = [self._request_of_seq[s.seq_id] for s in seqs]
        tokens = self._sample(requests, logits).tolist()  # the step's one device -> host copy
        now = time.perf_counter()
        outputs = []
        for request, token in zip(requests, tokens):
            request.seq.token_ids.append(token)
            if request.first_token_time is None:
                request.first_token_time = now
            reason = self._stop_reason(request, token)
            if reason is not None:
                self._finish(request, reason)
                del self.requests[request.request_id]
            elif request.params.output_kind is RequestOutputKind.FINAL_ONLY:
                continue  # an output copies the generated tokens: O(batch x length) a step, for nobody
            outputs.append(self._output(request, [token]))
        return outputs

    # ------------------------------------------------------------------------------------------------ helpers
    def _stop_reason(self, request: Request, token: int) -> str | None:
        seq, params = request.seq, request.params
        generated = seq.num_generated_tokens
        if token in request.stop_ids and generated >= params.min_tokens:
            return "stop"
        if generated >= params.max_tokens or len(seq) >= self.runtime.max_model_len:
            return "length"
        return None

    def _finish(self, request: Request, reason: str) -> None:
        del self._request_of_seq[request.seq.seq_id]
        request.finish_reason = reason
        request.finished_time = time.perf_counter()
        self.scheduler.finish(request.seq)

    def _sample(self, requests: list[Request], logits: torch.Tensor) -> torch.Tensor:
        # All greedy and nothing to suppress (the common serving and benchmark case): argmax, without building the
        # nine per-row parameter tensors (nine host -> device copies per step).
        if all(r.params.greedy and r.seq.num_generated_tokens >= r.params.min_tokens for r in requests):
            return logits.argmax(dim=-1)
        return sample(logits, self._sampling_batch(requests, logits.device))

    def _sampling_batch(self, requests: list[Request], device: torch.device) -> SamplingBatch:
        params = [r.params for r in requests]
        suppress_rows, suppress_tokens = [], []
        for row, request in enumerate(requests):
            if request.seq.num_generated_tokens < request.params.min_tokens:
                for token in sorted(request.stop_ids):
                    suppress_rows.append(row)
                    suppress_tokens.append(token)

        def tensor(values, dtype):
            return torch.tensor(values, dtype=dtype, device=device)

        return SamplingBatch(
            temperature=tensor([p.temperature for p in params], torch.float32),
            top_k=tensor([p.top_k for p in params], torch.int64),
            top_p=tensor([p.top_p for p in params], torch.float32),
            min_p=tensor([p.min_p for p in params], torch.float32),
            seeds=tensor([r.seed for r in requests], torch.int64),
            counters=tensor([r.seq.num_generated_tokens for r in requests], torch.int64),
            suppress_rows=tensor(suppress_rows, torch.int64),
            suppress_tokens=tensor(suppress_tokens, torch.int64),
            all_greedy=all(p.greedy for p in params),
            use_top_k=any(p.top_k > 0 for p in params),
            use_top_p=any(p.top_p < 1 for p in params),
            use_min_p=any(p.min_p > 0 for p in params),
        )

    def _output(self, request: Request, new_tokens: list[int]) -> RequestOutput:
        seq = request.seq
        finished = request.finish_reason is not None
        text = None
        if finished and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.generated_token_ids, skip_special_tokens=True)
        return RequestOutput(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=seq.generated_token_ids,  # a new list (a slice)
            new_token_ids=new_tokens,
            finished=finished,
            finish_reason=request.finish_reason,
            text=text,
            num_cached_tokens=seq.num_cached_tokens,
            arrival_time=request.arrival_time,
            first_token_time=request.first_token_time,
            finished_time=request.finished_time,
        )

"""An OpenAI-compatible HTTP server over ``AsyncLLM`` (FastAPI + uvicorn, Server-Sent Events for streaming).

    python -m compiled_engine serve [MODEL] --host 127.0.0.1 --port 8000 [engine knobs]

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (messages rendered with the tokenizer's chat
template), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text). Request fields follow OpenAI's
API (with ``presence_penalty``, ``frequency_penalty``, ``logit_bias`` and ``response_format``: text, json_object,
json_schema) and vLLM's extensions (``top_k``, ``min_p``, ``repetition_penalty``, ``stop_token_ids``, ``ignore_eos``,
``min_tokens``, ``return_token_ids``, ``include_stop_str_in_output``, ``skip_special_tokens``,
``allowed_token_ids``, ``bad_words``, ``structured_outputs``, ``truncate_prompt_tokens``; chat:
``chat_template_kwargs``, ``add_generation_prompt``); response bodies, ``usage`` and ``finish_reason`` are OpenAI's.

Errors are OpenAI-shaped, ``{"error": {"message", "type", "param", "code"}}``:
  * 400: malformed JSON, a field of the wrong type or value (``param`` names it), ``n`` past 64, an unsupported
    option set (``suffix``, ``best_of``), a prompt that with
    ``max_tokens`` exceeds ``max_model_len`` (vLLM's rule);
  * 404: a model name the server does not serve;
  * 500: the engine step computing the request raised (a stream that started gets an error event, then ``[DONE]``);
  * 503: more than ``--max-waiting`` requests waiting, or the server is shutting down.
A client that disconnects has its requests aborted (their KV blocks, state slot and snapshot references freed).
SIGTERM: uvicorn stops accepting connections and waits for the open ones (streams included) to finish; then the
engine thread stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Literal, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from prometheus_client import (
    CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest,
)
from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr

from compiled_engine.async_llm import AsyncLLM, EngineProcess, QueueFullError, RequestFailedError
from compiled_engine.chat import render_chat
from compiled_engine.llm import LLM, load_tokenizer
from compiled_engine.outputs import RequestOutput, TokenLogprobs
from compiled_engine.runtime import resolve_device
from compiled_engine.tiny_model import ensure_tiny_model
from compiled_engine.sampling_params import SamplingParams, StructuredOutputsParams
from ops.logprobs import MAX_LOGPROBS

TINY_MODEL_NAME = "compiled-engine-tiny"  # the served name of the embedded default model
MAX_N = 64  # choices per prompt: each one is a request of its own

# --------------------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------------------


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 500: "server_error", 503: "server_error"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message, error.param, error.code), status_code=error.status)


def bad_params(error: ValueError) -> APIError:
    """A SamplingParams / prompt ValueError as a 400 naming the field (SamplingParams' messages start with it)."""
    match = re.search(r"SamplingParams\.(\w+)", str(error))
    return APIError(400, str(error), match.group(1) if match else None)


# --------------------------------------------------------------------------------------------------------------
# Request bodies (strict types: "5" is not an int, 1 is not a bool; unknown fields are ignored)
# --------------------------------------------------------------------------------------------------------------

Number = Union[StrictInt, StrictFloat]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None
    min_p: Number | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = 0
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    logit_bias: dict[str, Number] | None = None
    return_token_ids: StrictBool = False  # vLLM's extension: token ids in every choice
    include_stop_str_in_output: StrictBool = False  # vLLM's extensions, as SamplingParams
    skip_special_tokens: StrictBool = True
    allowed_token_ids: list[StrictInt] | None = None
    bad_words: list[StrictStr] | None = None
    truncate_prompt_tokens: StrictInt | None = None  # vLLM's: the prompt's last this many tokens
    response_format: dict[str, Any] | None = None  # OpenAI's: text, json_object, json_schema
    structured_outputs: dict[str, Any] | None = None  # vLLM's: json, regex, choice, grammar, json_object

    def check_unsupported(self) -> None:
        if not 1 <= self.n <= MAX_N:
            raise APIError(400, f"n must be in [1, {MAX_N}], got {self.n}", "n")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream=true", "stream_options")

    def structured(self) -> StructuredOutputsParams | None:
        """OpenAI's ``response_format`` or vLLM's ``structured_outputs`` as SamplingParams takes them (400s name the
        field)."""
        if self.response_format is not None and self.structured_outputs is not None:
            raise APIError(400, "give response_format or structured_outputs, not both", "response_format")
        if self.structured_outputs is not None:
            try:
                return StructuredOutputsParams(**self.structured_outputs)
            except (TypeError, ValueError) as error:
                raise APIError(400, f"structured_outputs: {error}", "structured_outputs") from None
        kind = (self.response_format or {}).get("type", "text")
        if kind == "text":
            return None
        if kind == "json_object":
            return StructuredOutputsParams(json_object=True)
        schema = (self.response_format.get("json_schema") or {}).get("schema") if kind == "json_schema" else None
        if not isinstance(schema, dict):
            raise APIError(400, "response_format must be {'type': 'text'}, {'type': 'json_object'} or "
                                "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}",
                           "response_format")
        return StructuredOutputsParams(json=schema)

    def token_biases(self) -> dict[int, float] | None:
        """OpenAI's ``logit_bias``, token ids as JSON object keys (strings), as SamplingParams takes it."""
        if not self.logit_bias:
            return None
        if not all(key.isdigit() for key in self.logit_bias):
            raise APIError(400, "logit_bias keys must be token ids (decimal strings)", "logit_bias")
        return {int(key): bias for key, bias in self.logit_bias.items()}

    def sampling_params(self, max_tokens: int, logprobs: int | None, max_tokens_field: str = "max_tokens",
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """The body's SamplingParams; a bad value is a 400 naming the body's field (``max_tokens_field``: the one
        that set max_tokens)."""
        fields = dict(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                      presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                      repetition_penalty=self.repetition_penalty)
        try:
            return SamplingParams(
                **{k: v for k, v in fields.items() if v is not None}, seed=self.seed, stop=self.stop,
                stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
                max_tokens=max_tokens, logprobs=logprobs, logit_bias=self.token_biases(),
                prompt_logprobs=prompt_logprobs, include_stop_str_in_output=self.include_stop_str_in_output,
                skip_special_tokens=self.skip_special_tokens, allowed_token_ids=self.allowed_token_ids,
                bad_words=self.bad_words, structured_outputs=self.structured(),
                truncate_prompt_tokens=self.truncate_prompt_tokens,
            )
        except ValueError as error:
            bad = bad_params(error)
            if bad.param == "max_tokens":
                bad.param = max_tokens_field
            raise bad from None


class CompletionRequest(SamplingFields):
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: StrictStr
    content: StrictStr | list[ContentPart] | None = None


class ChatRequest(SamplingFields):
    messages: list[ChatMessage]
    # vLLM's extensions: passed to the chat template (Qwen3's {"enable_thinking": false}); the assistant turn opened
    add_generation_prompt: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None


# --------------------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------------------

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0)


class Metrics:
    """Prometheus metrics (vLLM's names, ``ce:`` prefix), in a registry of their own (one per app). Engine gauges
    read ``AsyncLLM.stats`` at scrape time; latencies are measured at the server, from a request's arrival to its
    first / last token's delivery."""

    def __init__(self, llm: AsyncLLM):
        disable_created_metrics()  # no `_created` series beside every counter (process-wide, as in vLLM)
        self.registry = registry = CollectorRegistry()
        stats = lambda: llm.stats  # noqa: E731
        gauges = {
            "num_requests_running": ("requests in the running batch", lambda: stats().num_running),
            "num_requests_waiting": ("requests waiting for admission", lambda: llm.num_waiting),
            "kv_cache_usage_perc": ("share of KV blocks held by requests (1 = full)",
                                    lambda: 1 - stats().num_free_kv_blocks / max(1, stats().num_kv_blocks)),
            "kv_blocks_used": ("KV blocks held by requests",
                               lambda: stats().num_kv_blocks - stats().num_free_kv_blocks),
            "state_slot_usage_perc": ("share of state slots held by requests",
                                      lambda: 1 - stats().num_free_state_slots / max(1, stats().num_state_slots)),
            "state_slots_used": ("state slots held by requests",
                                 lambda: stats().num_state_slots - stats().num_free_state_slots),
            "prefix_cache_snapshots": ("prefix-cache state snapshots held", lambda: stats().num_snapshots),
            "engine_step_failures": ("engine steps that raised", lambda: stats().num_failed_steps),
        }
        for name, (doc, read) in gauges.items():
            Gauge(f"ce:{name}", doc, registry=registry).set_function(read)
        self.prompt_tokens = Counter("ce:prompt_tokens", "prompt tokens of finished requests", registry=registry)
        self.generation_tokens = Counter("ce:generation_tokens", "generated tokens", registry=registry)
        self.prefix_queries = Counter("ce:prefix_cache_queries", "prompt tokens looked up in the prefix cache",
                                      registry=registry)
        self.prefix_hits = Counter("ce:prefix_cache_hits", "prompt tokens served by the prefix cache",
                                   registry=registry)
        self.requests = Counter("ce:request_success", "finished requests by finish reason", ["finished_reason"],
                                registry=registry)
        self.aborted = Counter("ce:request_aborted", "requests aborted before they finished (a client went away)",
                               registry=registry)
        self.ttft = Histogram("ce:time_to_first_token_seconds", "arrival to first token", buckets=LATENCY_BUCKETS,
                              registry=registry)
        self.tpot = Histogram("ce:time_per_output_token_seconds", "(e2e - ttft) / (output tokens - 1)",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.e2e = Histogram("ce:e2e_request_latency_seconds", "arrival to last token", buckets=LATENCY_BUCKETS,
                             registry=registry)


@dataclass
class Timing:
    """One request's latencies, measured at the server."""

    arrival: float
    first: float | None = None

    def token(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def finish(self, metrics: Metrics, out: RequestOutput) -> None:
        now = time.perf_counter()
        n = len(out.token_ids)
        metrics.prompt_tokens.inc(len(out.prompt_token_ids))
        metrics.prefix_queries.inc(len(out.prompt_token_ids))
        metrics.prefix_hits.inc(out.num_cached_tokens)
        metrics.requests.labels(out.finish_reason).inc()
        metrics.e2e.observe(now - self.arrival)
        if self.first is not None:
            metrics.ttft.observe(self.first - self.arrival)
            if n > 1:
                metrics.tpot.observe((now - self.first) / (n - 1))


# --------------------------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    """A validated request: its prompts, their params, and how to render the results. Each prompt has ``body.n``
    choices, prompt by prompt: choice ``i`` is prompt ``i // n``'s ``i % n``-th (OpenAI's order)."""

    prompts: list[list[int]]
    params: SamplingParams
    body: SamplingFields
    echo_texts: list[str] | None = None

    def choice_params(self, index: int) -> SamplingParams:
        """Choice ``index``'s params: with a seed, the j-th choice of a prompt draws with seed + j (vLLM's rule), so
        that its n choices differ and each is reproducible."""
        return self.params.for_completion(index % self.body.n)


class OpenAIServer:
    """The app's handlers over one ``AsyncLLM`` (``app`` is the FastAPI application)."""

    def __init__(self, llm: AsyncLLM, tokenizer, model_name: str):
        self.llm = llm
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.metrics = Metrics(llm)
        self.created = int(time.time())
        self.app = self._build_app()

    def _build_app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(app):
            await self.llm.start()
            yield
            await self.llm.shutdown()

        app = FastAPI(title="compiled_engine", lifespan=lifespan)

        @app.exception_handler(RequestValidationError)
        async def invalid(request: Request, error: RequestValidationError):
            first = error.errors()[0]
            if first.get("type") == "json_invalid":
                return JSONResponse(error_body(400, f"malformed JSON: {first.get('msg')}"), status_code=400)
            loc = [str(part) for part in first.get("loc", ()) if part != "body"]
            # A union's error names the member type last (e.g. "prompt.str"): keep the field path only.
            loc = [p for p in loc if not re.fullmatch(r"[a-z]+\[.*\]|str|int|float|bool|list|dict", p)]
            param = ".".join(loc) or None
            return JSONResponse(error_body(400, f"{param}: {first.get('msg')}", param), status_code=400)

        @app.exception_handler(APIError)
        async def api_error(request: Request, error: APIError):
            return error_response(error)

        @app.exception_handler(HTTPException)
        async def http_error(request: Request, error: HTTPException):  # unknown path (404), wrong method (405)
            return JSONResponse(error_body(error.status_code, str(error.detail)), status_code=error.status_code)

        app.get("/health")(self.health)
        app.get("/v1/models")(self.models)
        app.get("/metrics")(self.metrics_endpoint)
        app.post("/v1/completions")(self.completions)
        app.post("/v1/chat/completions")(self.chat_completions)
        return app

    # ------------------------------------------------------------------------------------------------ plain
    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len

    async def health(self) -> Response:
        return Response(status_code=200 if self.llm.alive else 503)

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "compiled_engine", "max_model_len": self.max_model_len}]}

    async def metrics_endpoint(self) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------------------------------- validation
    def _check_model(self, body: SamplingFields) -> None:
        if body.model is not None and body.model != self.model_name:
            raise APIError(404, f"the model {body.model!r} does not exist (this server serves {self.model_name!r})",
                           "model", "model_not_found")

    def _check_length(self, prompt: list[int], max_tokens: int, prompt_field: str, max_tokens_field: str) -> None:
        if len(prompt) + max_tokens > self.max_model_len:
            raise APIError(
                400, f"this model's maximum context length is {self.max_model_len} tokens; the request asks for "
                f"{len(prompt) + max_tokens} ({len(prompt)} in the {prompt_field}, {max_tokens} to generate)",
                prompt_field if len(prompt) >= self.max_model_len else max_tokens_field)

    def _encode(self, text: str, field: str) -> list[int]:
        if self.tokenizer is None:
            raise APIError(400, "this model has no tokenizer: pass the prompt as token ids", field)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _prepare_completion(self, body: CompletionRequest) -> Prepared:
        self._check_model(body)
        body.check_unsupported()
        if body.best_of not in (None, 1):
            raise APIError(400, "best_of is not supported", "best_of")
        if body.suffix:
            raise APIError(400, "suffix is not supported", "suffix")
        prompt = body.prompt
        if isinstance(prompt, str):
            prompts = [self._encode(prompt, "prompt")]
        elif not prompt:
            raise APIError(400, "prompt is empty", "prompt")
        elif isinstance(prompt[0], int):
            prompts = [list(prompt)]
        elif isinstance(prompt[0], str):
            prompts = [self._encode(p, "prompt") for p in prompt]
        else:
            prompts = [list(p) for p in prompt]
        max_tokens = 16 if body.max_tokens is None else body.max_tokens
        # echo with logprobs: the prompt's tokens come with theirs too (vLLM's: its first token's are null)
        params = body.sampling_params(max_tokens, body.logprobs,
                                      prompt_logprobs=body.logprobs if body.echo else None)
        prompts = [truncated(p, params.truncate_prompt_tokens) for p in prompts]
        for p in prompts:
            self._check_request(p, params, "prompt")
            self._check_length(p, max_tokens, "prompt", "max_tokens")
        echo = None
        if body.echo:  # the prompts' text: as given, or decoded from their (truncated) ids
            texts = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt[0], str) else None
            echo = texts if texts and params.truncate_prompt_tokens is None else [self._decode(ids) for ids in prompts]
        return Prepared(prompts, params, body, echo)

    def _check_request(self, prompt: list[int], params: SamplingParams | None, field: str) -> None:
        """The engine's own checks (prompt ids in the vocabulary and within max_model_len, stop ids), as 400s."""
        try:
            self.llm.validate_request(prompt, params)
        except ValueError as error:
            raise (bad_params(error) if "SamplingParams." in str(error) else APIError(400, str(error), field)) from None

    def _prepare_chat(self, body: ChatRequest) -> Prepared:
        self._check_model(body)
        body.check_unsupported()
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template", "messages")
        if not body.messages:
            raise APIError(400, "messages is empty", "messages")
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
        top = body.top_logprobs or 0
        if not 0 <= top <= MAX_LOGPROBS:
            raise APIError(400, f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {top}", "top_logprobs")
        try:
            prompt = render_chat(self.tokenizer, [m.model_dump() for m in body.messages],
                                 add_generation_prompt=body.add_generation_prompt,
                                 chat_template_kwargs=body.chat_template_kwargs)
        except ValueError as error:
            raise APIError(400, str(error), "messages") from None
        prompt = truncated(prompt, body.truncate_prompt_tokens)  # a bad value is refused with the other fields
        self._check_request(prompt, None, "messages")
        field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        if max_tokens is None:
            max_tokens = self.max_model_len - len(prompt)
            if max_tokens < 1:
                raise APIError(400, f"the messages fill the model's context ({self.max_model_len} tokens)",
                               "messages")
        params = body.sampling_params(max_tokens, top if body.logprobs else None, field)
        self._check_request(prompt, params, "messages")
        self._check_length(prompt, max_tokens, "messages", field)
        return Prepared([prompt], params, body)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    # -------------------------------------------------------------------------------------------- endpoints
    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        return await self._serve(self._prepare_completion(body), request, chat=False)

    async def chat_completions(self, body: ChatRequest, request: Request) -> Response:
        return await self._serve(self._prepare_chat(body), request, chat=True)

    async def _serve(self, prepared: Prepared, request: Request, chat: bool) -> Response:
        try:
            self.llm.check_capacity(len(prepared.prompts) * prepared.body.n)
        except QueueFullError as error:
            raise APIError(503, str(error), code="overloaded") from None
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        n = prepared.body.n
        streams = [self._stream(f"{request_id}-{i}", prepared.prompts[i // n], prepared.choice_params(i))
                   for i in range(len(prepared.prompts) * n)]
        if prepared.body.stream:
            return StreamingResponse(self._chunks(request_id, prepared, streams, chat), media_type="text/event-stream")
        collect = self._chat_response if chat else self._completion_response
        return await until_disconnect(request, collect(request_id, prepared, streams))

    async def _stream(self, request_id: str, prompt: list[int], params: SamplingParams
                      ) -> AsyncIterator[RequestOutput]:
        """The request's outputs, with its latencies recorded."""
        timing = Timing(time.perf_counter())
        finished = False
        try:
            async for out in self.llm.generate(prompt, params, request_id):
                if out.new_token_ids:
                    timing.token()
                    self.metrics.generation_tokens.inc(len(out.new_token_ids))
                if out.finished:
                    finished = True
                    timing.finish(self.metrics, out)
                yield out
        except (GeneratorExit, asyncio.CancelledError):  # closed early: the client went away
            if not finished:
                self.metrics.aborted.inc()
            raise

    # ------------------------------------------------------------------------------------------ rendering
    @staticmethod
    def _usage(prepared: Prepared, outs: list[RequestOutput]) -> dict:
        """OpenAI's usage: each prompt's tokens once, whatever its n; every choice's generated tokens."""
        prompt = sum(map(len, prepared.prompts))
        completion = sum(len(o.token_ids) for o in outs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    @staticmethod
    def _finish_reason(out: RequestOutput) -> str | None:
        return out.finish_reason if out.finished else None

    def _token_text(self, token: int) -> str:
        return self._decode([token]) if self.tokenizer is not None else str(token)

    def _completion_logprobs(self, entries: list[TokenLogprobs], offset: int, out: RequestOutput | None = None) -> dict:
        """OpenAI's legacy completions logprobs: tokens, their logprobs, each one's top (with the chosen token),
        and each token's character offset in the text (from ``offset``). With ``out`` (echo), its prompt's tokens
        first: the first with null logprob and top, as vLLM."""
        head = []
        if out is not None:
            head = [(out.prompt_token_ids[0], None, None)]
            head += [(e.token_id, e.logprob, e.top) for e in out.prompt_logprobs[1:]]
        rows = head + [(e.token_id, e.logprob, e.top) for e in entries]
        tokens, offsets, tops = [], [], []
        for token, logprob, top in rows:
            tokens.append(self._token_text(token))
            offsets.append(offset)
            offset += len(tokens[-1])
            if top is None:
                tops.append(None)
                continue
            tops.append({self._token_text(t): v for t, v in top})
            tops[-1].setdefault(tokens[-1], logprob)
        return {"tokens": tokens, "token_logprobs": [logprob for _, logprob, _ in rows], "top_logprobs": tops,
                "text_offset": offsets}

    def _chat_logprobs(self, entries: list[TokenLogprobs]) -> dict:
        def item(token: int, logprob: float) -> dict:
            text = self._token_text(token)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return {"content": [dict(item(e.token_id, e.logprob), top_logprobs=[item(t, v) for t, v in e.top])
                            for e in entries]}

    async def _completion_response(self, request_id: str, prepared: Prepared, streams) -> JSONResponse:
        outs = await asyncio.gather(*(last(s) for s in streams))
        choices = []
        for i, out in enumerate(outs):
            text = out.text or ""
            prefix = prepared.echo_texts[i // prepared.body.n] if prepared.echo_texts else ""
            echoed = out if out.prompt_logprobs is not None else None
            choice = {"index": i, "text": prefix + text, "finish_reason": out.finish_reason,
                      "stop_reason": out.stop_reason,
                      "logprobs": None if out.logprobs is None else self._completion_logprobs(out.logprobs, 0, echoed)}
            if prepared.body.return_token_ids:
                choice.update(prompt_token_ids=out.prompt_token_ids, token_ids=out.token_ids)
            choices.append(choice)
        return JSONResponse({"id": request_id, "object": "text_completion", "created": int(time.time()),
                             "model": self.model_name, "choices": choices, "usage": self._usage(prepared, outs)})

    async def _chat_response(self, request_id: str, prepared: Prepared, streams) -> JSONResponse:
        outs = await asyncio.gather(*(last(s) for s in streams))
        choices = []
        for i, out in enumerate(outs):
            choice = {"index": i, "message": {"role": "assistant", "content": out.text or ""},
                      "finish_reason": out.finish_reason, "stop_reason": out.stop_reason,
                      "logprobs": None if out.logprobs is None else self._chat_logprobs(out.logprobs)}
            if prepared.body.return_token_ids:
                choice.update(prompt_token_ids=out.prompt_token_ids, token_ids=out.token_ids)
            choices.append(choice)
        return JSONResponse({"id": request_id, "object": "chat.completion", "created": int(time.time()),
                             "model": self.model_name, "choices": choices, "usage": self._usage(prepared, outs)})

    async def _chunks(self, request_id: str, prepared: Prepared, streams, chat: bool) -> AsyncIterator[str]:
        """The server-sent events of a streamed request: first each choice's opening (chat: the assistant role;
        completions with echo: the prompt's text), then per output its new text (chat: as a delta), logprobs, token
        ids and finish, and the usage last when asked for."""
        created = int(time.time())
        body = prepared.body
        kind = "chat.completion.chunk" if chat else "text_completion"
        sent_text = [0] * len(streams)
        sent_logprobs = [0] * len(streams)
        offsets = [0] * len(streams)  # completions: each choice's text so far, where its next logprobs start
        finals: list[RequestOutput] = []

        def chunk(choices: list[dict], usage: dict | None = None) -> str:
            return sse({"id": request_id, "object": kind, "created": created, "model": self.model_name,
                        "choices": choices, "usage": usage})

        async def events():
            for i in range(len(streams)):
                if chat:
                    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}])
                elif prepared.echo_texts and body.logprobs is None:
                    text = prepared.echo_texts[i // body.n]
                    offsets[i] = len(text)
                    yield chunk([{"index": i, "text": text, "logprobs": None, "finish_reason": None}])
            echoing = [bool(prepared.echo_texts) and body.logprobs is not None and not chat] * len(streams)
            async for i, out in merged(streams):
                if echoing[i]:  # echo with logprobs: the prompt's text with its tokens' logprobs, once they exist
                    echoing[i] = False
                    text = prepared.echo_texts[i // body.n]
                    logprobs = self._completion_logprobs([], 0, out)
                    offsets[i] = len(text)
                    yield chunk([{"index": i, "text": text, "logprobs": logprobs, "finish_reason": None}])
                text = out.text or ""
                delta, sent_text[i] = text[sent_text[i] :], len(text)
                content = {"delta": {"content": delta} if delta else {}} if chat else {"text": delta}
                choice = {"index": i, **content, "logprobs": None, "finish_reason": self._finish_reason(out)}
                if out.logprobs is not None:
                    new = out.logprobs[sent_logprobs[i] :]
                    sent_logprobs[i] = len(out.logprobs)
                    choice["logprobs"] = self._chat_logprobs(new) if chat else self._completion_logprobs(new,
                                                                                                          offsets[i])
                offsets[i] += len(delta)
                if body.return_token_ids:
                    choice["token_ids"] = out.new_token_ids
                if out.finished:
                    choice["stop_reason"] = out.stop_reason
                    finals.append(out)
                if delta or out.finished or out.logprobs is not None or body.return_token_ids:
                    yield chunk([choice])
            if body.stream_options is not None and body.stream_options.include_usage:
                yield chunk([], self._usage(prepared, finals))

        async for event in guarded(events()):
            yield event


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------


def truncated(prompt: list[int], k: int | None) -> list[int]:
    """The prompt the engine runs: its last ``k`` tokens (``truncate_prompt_tokens``) when set; the length checks and
    the usage count those."""
    return prompt if not k or k < 1 else prompt[-k:]


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """The stream's events, then ``[DONE]``; a failure after the stream began becomes an error event (the status,
    200, is sent already)."""
    try:
        async for event in events:
            yield event
    except RequestFailedError as error:
        yield sse(error_body(500, str(error)))
    except QueueFullError as error:
        yield sse(error_body(503, str(error), code="overloaded"))
    yield "data: [DONE]\n\n"


async def last(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    out = None
    async for out in stream:
        pass
    return out


async def merged(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(index, output) of several streams as they come; one stream is iterated directly. Closing this closes all."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    items: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream):
        try:
            async for out in stream:
                await items.put((i, out))
        except BaseException as error:  # noqa: B036 (handed to the consumer, which re-raises it)
            await items.put((i, error))
        else:
            await items.put((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(streams)
        while open_streams:
            i, item = await items.get()
            if item is None:
                open_streams -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until_disconnect(request: Request, work) -> Response:
    """Run a non-streaming handler's ``work``; if the client disconnects first, cancel it (which aborts its
    requests) (vLLM's ``with_cancellation``)."""
    task = asyncio.ensure_future(work)

    async def disconnected():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait([task, watcher], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return Response(status_code=499)
    try:
        return task.result()
    except RequestFailedError as error:
        return JSONResponse(error_body(500, str(error)), status_code=500)
    except QueueFullError as error:
        return JSONResponse(error_body(503, str(error), code="overloaded"), status_code=503)


# --------------------------------------------------------------------------------------------------------------
# Building and running
# --------------------------------------------------------------------------------------------------------------


def build_server(model: str | None = None, *, served_model_name: str | None = None, max_waiting: int | None = None,
                 stream_interval: int = 1, engine_process: bool | None = None, **llm_kwargs) -> OpenAIServer:
    """An ``OpenAIServer`` over ``LLM(model, **llm_kwargs)``'s engine (None: the embedded tiny default model), run
    by a thread of this process, or with ``engine_process`` built and run by a process of its own
    (compiled_engine/async_llm.py). The engine loop starts with the app (its lifespan).

    ``engine_process`` None: a process of its own when the engine runs on CUDA. There the engine's steps are short
    and its host work is on the critical path; sharing the GIL with the event loop's per-token work slowed them by a
    third at 64 streams (bench/NOTES.md, "Serving overhead"). On the CPU a thread: steps are long, and a second
    process would build a second copy of the model for nothing."""
    name = served_model_name or (model if model is not None else TINY_MODEL_NAME)
    if engine_process is None:
        engine_process = resolve_device(llm_kwargs.get("device")).type == "cuda"
    if engine_process:
        path = model if model is not None else ensure_tiny_model()
        host = EngineProcess(path, llm_kwargs, stream_interval)
        return OpenAIServer(AsyncLLM(host, max_waiting=max_waiting), load_tokenizer(path), name)
    llm = LLM(model, **llm_kwargs)
    # The handlers tokenize on the event loop while the engine thread detokenizes: each thread gets its own Rust
    # tokenizer (one shared by two threads can fail with "Already borrowed" when a call reconfigures it).
    tokenizer = copy.deepcopy(llm.tokenizer)
    return OpenAIServer(AsyncLLM(llm.engine, max_waiting=max_waiting, stream_interval=stream_interval), tokenizer,
                        name)


def serve(server: OpenAIServer, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve until SIGINT / SIGTERM; uvicorn then waits for the open requests (streams included) to finish."""
    import uvicorn

    uvicorn.run(server.app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=None)

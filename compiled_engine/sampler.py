"""Token sampling on the device, with no host synchronisation inside: the ``ce::sample`` op (ops/sample.py).

Randomness is counter-based: the uniform noise for (request seed, output index, vocab id) is a hash of those
three integers computed on the device (splitmix64). A seeded request therefore draws the same tokens whatever
else is in the batch, after a preemption, and across processes, and no torch.Generator state is shared.
Sampling is a Gumbel-max draw (the exponential race) among the tokens that top-k, top-p and min-p keep.
Allowed tokens, a structured output's grammar, a logit bias and then penalties (presence, frequency, repetition;
from the row's tokens) change a row's logits first (``apply_token_masks_`` for the first two, ``apply_logit_bias_``,
``apply_penalties_``, in place on one fp32 copy); then the stop tokens before ``min_tokens`` and each bad word's
last token where the output ends with the word's other tokens (``bad_word_ids``) are set to -inf.

The second half builds a step's per-row tensors from its requests (``sampling_inputs`` for the decode graph and the
fused rounds, ``sampling_batch`` for sampling from logits), each kind of field in one host-to-device copy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from ops.penalties import apply_penalties_op
from ops.sample import sample_op, uniform_noise
from ops.triton.compile_threads import DEFAULT_THREADS, run_in_threads
from ops.step import SamplingInputs
from compiled_engine.request import Request
from compiled_engine.step import upload, upload_fields
from compiled_engine.structured_output import token_masks

__all__ = ["LogitBias", "Penalties", "SamplingBatch", "TokenMasks", "allowed_tokens", "apply_logit_bias_",
           "apply_penalties_", "apply_token_masks_", "bad_word_ends", "bad_word_ids", "grammar_masks", "logit_bias",
           "penalties", "sample", "sampling_batch", "sampling_inputs", "uniform_noise", "warm_up_sampling"]


@dataclass
class TokenMasks:
    """Rows of a step that may draw only some tokens (``allowed_token_ids``, a structured output's grammar), on the
    device."""

    rows: torch.Tensor  # [R] int64
    allowed: torch.Tensor  # [R, V] bool


def apply_token_masks_(logits: torch.Tensor, masks: TokenMasks) -> torch.Tensor:
    """The tokens the masks do not allow at -inf in their rows of ``logits`` ``[B, V]`` (in place)."""
    limited = logits.index_select(0, masks.rows).masked_fill(~masks.allowed[:, : logits.shape[-1]], float("-inf"))
    return logits.index_copy_(0, masks.rows, limited)


@dataclass
class LogitBias:
    """Biases added to single logits of a step, on the device: ``bias[i]`` to (``rows[i]``, ``tokens[i]``)."""

    rows: torch.Tensor  # [n] int64
    tokens: torch.Tensor  # [n] int64
    bias: torch.Tensor  # [n] fp32


def apply_logit_bias_(logits: torch.Tensor, logit_bias: LogitBias) -> torch.Tensor:
    """The biases added to ``logits`` ``[B, V]`` fp32 (in place)."""
    return logits.index_put_((logit_bias.rows, logit_bias.tokens), logit_bias.bias, accumulate=True)


@dataclass
class Penalties:
    """The penalised rows of a step and their tokens, on the device. Token lists are padded with the vocabulary size
    (a column dropped after counting)."""

    rows: torch.Tensor  # [P] int64: rows of the step's logits
    prompt_tokens: torch.Tensor  # [P, Lp] int64
    output_tokens: torch.Tensor  # [P, Lo] int64: the tokens generated so far (less ``last_tokens``, if given)
    last_tokens: torch.Tensor | None  # [P] int64: each row's last output token, on the device only (V: none)
    presence: torch.Tensor  # [P] fp32
    frequency: torch.Tensor  # [P] fp32
    repetition: torch.Tensor  # [P] fp32


def apply_penalties_(logits: torch.Tensor, penalties: Penalties) -> torch.Tensor:
    """The penalties applied to their rows of ``logits`` ``[B, V]`` fp32 (in place), as vLLM and OpenAI define them: a
    token in the prompt or the output has a positive logit divided by the repetition penalty and a negative one
    multiplied by it; then a token generated c > 0 times loses frequency x c + presence (``ce::apply_penalties_``,
    ops/penalties.py)."""
    output_tokens = penalties.output_tokens
    if penalties.last_tokens is not None:
        output_tokens = torch.cat([output_tokens, penalties.last_tokens[:, None]], dim=1)
    apply_penalties_op(logits, penalties.rows, penalties.prompt_tokens, output_tokens, penalties.presence,
                       penalties.frequency, penalties.repetition)
    return logits


@dataclass
class SamplingBatch:
    """Per-row sampling parameters of one step, as device tensors (built once per step on the host)."""

    temperature: torch.Tensor  # [B] fp32, 0 = greedy
    top_k: torch.Tensor  # [B] int64, 0 = off
    top_p: torch.Tensor  # [B] fp32
    min_p: torch.Tensor  # [B] fp32
    seeds: torch.Tensor  # [B] int64
    counters: torch.Tensor  # [B] int64: index of the token being drawn in the request's output
    suppress_rows: torch.Tensor  # [n] int64 } (row, token) pairs whose logits are set to -inf
    suppress_tokens: torch.Tensor  # [n] int64 } (EOS/stop tokens before min_tokens)
    all_greedy: bool
    use_top_k: bool
    use_top_p: bool
    allowed_tokens: TokenMasks | None = None
    token_masks: TokenMasks | None = None
    logit_bias: LogitBias | None = None
    penalties: Penalties | None = None


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Next token per row ``[B]`` int64 from logits ``[B, vocab]`` (model dtype or fp32; rows may be strided):
    ``ce::sample`` after the allowed tokens, the grammars' masks, the logit bias, the penalties (vLLM's order) and
    setting the suppressed (row, token) pairs to -inf (min_tokens)."""
    adjustments = [(apply, value) for apply, value in (
        (apply_token_masks_, batch.allowed_tokens), (apply_token_masks_, batch.token_masks),
        (apply_logit_bias_, batch.logit_bias), (apply_penalties_, batch.penalties)) if value is not None]
    if adjustments:
        logits = logits.to(torch.float32, copy=True)  # one fp32 copy of the step's logits, adjusted in place
        for apply, value in adjustments:
            apply(logits, value)
    if batch.suppress_rows.numel():
        minus_inf = torch.tensor(float("-inf"), dtype=logits.dtype)
        logits = logits.index_put((batch.suppress_rows, batch.suppress_tokens), minus_inf)
    if batch.all_greedy:
        return logits.argmax(dim=-1)
    return sample_op(logits, batch.temperature, batch.top_k, batch.top_p, batch.min_p, batch.seeds, batch.counters,
                     batch.use_top_k, batch.use_top_p)


def warm_up_sampling(vocab: int, max_rows: int, device: torch.device, model_dtype: torch.dtype = torch.float32,
                     threads: int = DEFAULT_THREADS, progress: bool = False) -> None:
    """Compile ``ce::sample``'s kernels for the calls ``sample`` makes outside the decode graphs, before serving.

    The decode graphs sample from model-dtype logits with top-k and top-p on. The other calls sample fp32 logits (a
    prompt step's first tokens; rows whose logits are adjusted: penalties, logit bias, masks) or model-dtype ones (the
    decode rows of an engine without decode graphs, ``enforce_eager``; decode rows that suppress their stop tokens,
    ``min_tokens``), top-k and top-p each on only where a row uses it: Triton compiles a kernel variant for each
    dtype, each of those four cases and each chunk size (ops/triton/sample_kernels.py takes the larger one for many
    rows), ~10 kernels each. Met first by a request, each costs its step seconds on an empty Triton cache, stalling
    every running request. Rows 1 and ``max_rows`` give both chunk sizes where ``max_rows`` reaches the larger one.
    The penalties' kernel too (one variant).

    The cases run on ``threads`` threads (ops/triton/compile_threads.py); each call has its own workspace.
    ``progress``: a progress bar over the cases (stderr)."""

    def penalties() -> None:
        table = torch.zeros(1, 3, dtype=torch.int64, device=device)  # a row of the token table: row, prompt, output
        one = torch.ones(1, device=device)
        apply_penalties_op(torch.zeros(1, vocab, device=device), table[:, 0], table[:, 1:2], table[:, 2:], one, one,
                           one)

    def draw(rows: int, use_top_k: bool, use_top_p: bool, dtype: torch.dtype) -> None:
        logits = torch.zeros(rows, vocab, dtype=dtype, device=device)
        ones, zeros = torch.ones(rows, device=device), torch.zeros(rows, device=device)
        ints = torch.zeros(rows, dtype=torch.int64, device=device)
        sample_op(logits, ones, ints + 50, ones - 0.1, zeros, ints, ints, use_top_k, use_top_p)

    dtypes, row_counts = dict.fromkeys((torch.float32, model_dtype)), sorted({1, max_rows})
    draws = [functools.partial(draw, rows, use_top_k, use_top_p, dtype) for dtype in dtypes for rows in row_counts
             for use_top_k in (False, True) for use_top_p in (False, True)]
    calls = [penalties, *draws]
    with tqdm(total=len(calls), desc="compiling the sampler's kernels", unit="case", disable=not progress) as bar:
        run_in_threads(calls, device, threads, done=bar.update)


# --------------------------------------------------------------------------------------------------------------
# A step's rows from its requests (host lists, uploaded once per kind)
# --------------------------------------------------------------------------------------------------------------


def sampling_inputs(requests: list[Request], positions: int = 1) -> SamplingInputs:
    """The rows' ce::sample parameters, on the host (the decode graph and the speculative rounds stage them into
    their own buffers): ``positions`` rows a request (a verify step's), drawing its next ``positions`` output
    tokens (counters from its generated count on)."""
    rows = [r for r in requests for _ in range(positions)]
    params = [r.params for r in rows]
    return SamplingInputs(
        temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32),
        top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64),
        top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32),
        min_p=torch.tensor([p.min_p for p in params], dtype=torch.float32),
        seeds=torch.tensor([r.seed for r in rows], dtype=torch.int64),
        counters=torch.tensor([r.seq.num_generated_tokens + i % positions for i, r in enumerate(rows)],
                              dtype=torch.int64),
    )


def sampling_batch(requests: list[Request], device: torch.device, positions: int = 1, vocab: int | None = None,
                   last_ids: torch.Tensor | None = None, drafts: list[list[int]] | None = None) -> SamplingBatch:
    """The rows' sampling parameters: ``positions`` rows per request (a verify step's), drawing its next
    ``positions`` output tokens (counters from its generated count on; min_tokens suppression row by row). With
    ``vocab``, the rows' logit adjustments too (``last_ids``: see ``penalties``); a verify step's row p of a request
    counts its ``drafts[:p]`` among its output tokens and follows its grammar past them (it draws as if they were
    accepted)."""
    extra = None
    if positions > 1:
        requests = [r for r in requests for _ in range(positions)]
        if drafts is not None:
            extra = [d[:p] for d in drafts for p in range(positions)]
    params = [r.params for r in requests]
    counters = [r.seq.num_generated_tokens + row % positions for row, r in enumerate(requests)]
    suppress_rows, suppress_tokens = [], []
    for row, (request, counter) in enumerate(zip(requests, counters)):
        if counter < request.params.min_tokens:
            for token in sorted(request.stop_ids):
                suppress_rows.append(row)
                suppress_tokens.append(token)
        if request.bad_words:
            for token in bad_word_ends(request, extra[row] if extra is not None else ()):
                suppress_rows.append(row)
                suppress_tokens.append(token)

    # Two host buffers, one copy each (pinned and asynchronous on CUDA): nine pageable copies would each wait
    # for the GPU to drain, which also undoes overlap_decode. Each field 16-byte aligned (ce::sample's kernels).
    top_k, seeds, counters, suppress_rows, suppress_tokens = upload_fields(
        [[p.top_k for p in params], [r.seed for r in requests], counters, suppress_rows, suppress_tokens],
        torch.int64, device)
    temperature, top_p, min_p = upload_fields(
        [[p.temperature for p in params], [p.top_p for p in params], [p.min_p for p in params]], torch.float32, device)
    adjust = vocab is not None and any(r.params.adjusts_logits for r in requests)
    return SamplingBatch(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seeds=seeds,
        counters=counters,
        suppress_rows=suppress_rows,
        suppress_tokens=suppress_tokens,
        all_greedy=all(p.greedy for p in params),
        use_top_k=any(p.top_k > 0 for p in params),
        use_top_p=any(p.top_p < 1 for p in params),
        allowed_tokens=allowed_tokens(requests, device, vocab) if adjust else None,
        token_masks=grammar_masks(requests, device, vocab, extra) if adjust else None,
        logit_bias=logit_bias(requests, device) if adjust else None,
        penalties=penalties(requests, device, vocab, last_ids, extra) if adjust else None,
    )


def bad_word_ids(tokenizer, words: list[str], vocab_size: int | None = None) -> list[tuple[int, ...]]:
    """The token sequences of ``SamplingParams.bad_words`` (vLLM's rule): each word stripped on the left, encoded
    alone and after a space, the second kept where it starts with another token than the first and has as many.
    ValueError for a word of no token or, given ``vocab_size`` (the model's), of a token the model does not have (a
    tokenizer's added tokens may lie past it)."""
    sequences = []
    for word in words:
        alone = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if not alone:
            raise ValueError(f"SamplingParams.bad_words: the tokenizer encodes {word!r} as no token")
        sequences.append(alone)
        if spaced[0] != alone[0] and len(spaced) == len(alone):
            sequences.append(spaced)
    outside = [t for word in sequences for t in word if vocab_size is not None and not 0 <= t < vocab_size]
    if outside:
        raise ValueError(f"SamplingParams.bad_words: token {outside[0]} of a word lies outside the model's vocabulary "
                         f"[0, {vocab_size})")
    return sequences


def bad_word_ends(request: Request, extra=()) -> set[int]:
    """The tokens a request must not draw next: each bad word's last token where its output, then ``extra`` (a
    verify row's drafts before it), ends with the word's other tokens (every output token is on the host: a request
    with a word of several tokens never runs ahead of its in-flight one, ``Request.reads_last_token``)."""
    seq = request.seq
    end = len(seq.token_ids) - seq.num_placeholder_tokens
    extra = list(extra)
    generated = end - seq.num_prompt_tokens + len(extra)
    ends = set()
    for word in request.bad_words:
        m = len(word) - 1  # the output's last m tokens (only those: not a copy of the whole output a step)
        if m > generated:
            continue
        tail = extra[max(0, len(extra) - m) :] if m else []  # (len(extra) - m < 0 would count from the end)
        if len(tail) < m:
            tail = seq.token_ids[end - (m - len(tail)) : end] + tail
        if tuple(tail) == word[:-1]:
            ends.add(word[-1])
    return ends


def allowed_tokens(requests: list[Request], device: torch.device, vocab: int) -> TokenMasks | None:
    """The rows limited to their ``allowed_token_ids``, as masks made on the device from one upload of (row, token)
    pairs; None when no row is limited."""
    rows = [row for row, r in enumerate(requests) if r.params.allowed_token_ids is not None]
    if not rows:
        return None
    index = [i for i, row in enumerate(rows) for _ in requests[row].params.allowed_token_ids]
    tokens = [t for row in rows for t in requests[row].params.allowed_token_ids]
    row_ids, index, tokens = upload_fields([rows, index, tokens], torch.int64, device)
    allowed = torch.zeros((len(rows), vocab), dtype=torch.bool, device=device)
    allowed[index, tokens] = True
    return TokenMasks(row_ids, allowed)


def grammar_masks(requests: list[Request], device: torch.device, vocab: int,
                  extra: list[list[int]] | None = None) -> TokenMasks | None:
    """The tokens each structured-output row's grammar allows next (past ``extra[row]``, a verify row's drafts before
    it); None when no row has a grammar."""
    rows = [row for row, r in enumerate(requests) if r.grammar is not None]
    if not rows:
        return None
    ahead = [extra[row] for row in rows] if extra is not None else None
    allowed = token_masks([requests[row].grammar for row in rows], vocab, device, ahead)
    return TokenMasks(upload(torch.tensor(rows, dtype=torch.int64), device), allowed)


def logit_bias(requests: list[Request], device: torch.device) -> LogitBias | None:
    """The (row, token, bias) triples of the rows with a logit bias, in two uploads; None when none has one."""
    triples = [(row, token, bias) for row, r in enumerate(requests) if r.params.logit_bias
               for token, bias in r.params.logit_bias.items()]
    if not triples:
        return None
    rows, tokens, biases = zip(*triples)
    rows, tokens = upload_fields([rows, tokens], torch.int64, device)
    return LogitBias(rows, tokens, upload(torch.tensor(biases, dtype=torch.float32), device))


def penalties(requests: list[Request], device: torch.device, vocab: int, last_ids: torch.Tensor | None,
              extra: list[list[int]] | None = None) -> Penalties | None:
    """The penalised rows' tokens and penalties, in two uploads; None when no row has penalties. With
    ``last_ids`` (a decode step's input ids) each row's last token comes from the device (it may still be in
    flight), the others from the host; a row that has generated nothing yet (its prompt's last token run as a decode
    row) counts no output token. ``extra[row]``: tokens counted after the row's outputs (a verify row's drafts before
    it). The token table is filled row by row in numpy from each request's arrays (its prompt converted once, its
    outputs as they are read back: ``Request.prompt_array``, ``Request.output_array``): its size is the rows' tokens
    so far, rebuilt every step, as vLLM's."""
    rows = [i for i, r in enumerate(requests) if r.params.penalized]
    if not rows:
        return None
    generated = [requests[i].seq.num_generated_tokens for i in rows]
    from_device = [last_ids is not None and g > 0 for g in generated]  # the last output token is last_ids'
    prompts = [requests[i].prompt_array() for i in rows]
    outputs = [requests[i].output_array(g - d) for i, g, d in zip(rows, generated, from_device)]
    extras = [extra[i] if extra is not None else [] for i in rows]
    n, lp = len(rows), max(map(len, prompts))
    lo = max(1, max(len(o) + len(e) for o, e in zip(outputs, extras)))
    table = np.full((n, 2 + lp + lo), vocab, dtype=np.int64)
    table[:, 0] = rows
    table[:, 1] = from_device
    for j, (prompt, output, more) in enumerate(zip(prompts, outputs, extras)):
        table[j, 2 : 2 + len(prompt)] = prompt
        table[j, 2 + lp : 2 + lp + len(output)] = output
        if more:
            table[j, 2 + lp + len(output) : 2 + lp + len(output) + len(more)] = more
    int64 = upload(torch.from_numpy(table), device)
    params = [requests[i].params for i in rows]
    presence, frequency, repetition = upload_fields(
        [[p.presence_penalty for p in params], [p.frequency_penalty for p in params],
         [p.repetition_penalty for p in params]], torch.float32, device)
    row_ids = int64[:, 0]
    last_tokens = None
    if last_ids is not None:  # the padding id (not counted) for the rows without an output token
        last_tokens = last_ids[row_ids] if all(from_device) else torch.where(int64[:, 1] > 0, last_ids[row_ids], vocab)
    return Penalties(
        rows=row_ids,
        prompt_tokens=int64[:, 2 : 2 + lp],
        output_tokens=int64[:, 2 + lp :],
        last_tokens=last_tokens,
        presence=presence, frequency=frequency, repetition=repetition,
    )

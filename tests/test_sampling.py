"""Sampling on the device (compiled_engine/sampler.py) and the stop conditions of the engine.

Sampler against independent oracles (no model):
* for fixed logits rows and many draws (different counters of one seed, or different seeds), the empirical
  frequencies match softmax(logits / T) restricted by top-k, then top-p, then min-p — a chi-square bound and a
  per-token 5-sigma bound. The draws come from the counter-based hash, so the same numbers come out on every run:
  the bounds cannot flake. Tokens outside the allowed set never appear;
* greedy (temperature 0) equals argmax, also in a batch with sampled rows; suppressed (row, token) pairs are never
  drawn; a row's token depends only on its own logits, parameters, seed and counter, never on the rest of the batch.

Engine on the tiny HF model (oracle: HF transformers, greedy or teacher-forced):
* greedy equals HF greedy; seeded sampling reproduces whatever else is in the batch and whenever it arrives;
  sampled tokens lie in the allowed top-k / top-p / min-p set of HF's logits at their position;
* max_tokens -> "length" (also the max_model_len cap); stop_token_ids -> "stop" with the stop token kept in token_ids;
  EOS from the checkpoint's config.json -> "stop", ignore_eos continues; min_tokens suppresses EOS and stop tokens
  until reached (checked against HF greedy with those tokens masked).
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from compiled_engine import SamplingParams
from compiled_engine.request import Request
from compiled_engine.sampler import SamplingBatch, sample, sampling_batch, uniform_noise
from compiled_engine.sequence import Sequence
from tests import hf_models
from tests.test_engine import GREEDY, MODEL, assert_clean, drain, heavy_settings, hf_greedy, make_llm, prompt

# --------------------------------------------------------------------------------------------------------------
# Sampler helpers and the oracle
# --------------------------------------------------------------------------------------------------------------


def make_batch(params: list[SamplingParams], seeds, counters, suppress=()) -> SamplingBatch:
    """The SamplingBatch the engine would build for rows with these parameters (suppress: (row, token) pairs)."""
    rows = [r for r, _ in suppress]
    tokens = [t for _, t in suppress]
    return SamplingBatch(
        temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32),
        top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64),
        top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32),
        min_p=torch.tensor([p.min_p for p in params], dtype=torch.float32),
        seeds=torch.as_tensor(seeds, dtype=torch.int64),
        counters=torch.as_tensor(counters, dtype=torch.int64),
        suppress_rows=torch.tensor(rows, dtype=torch.int64),
        suppress_tokens=torch.tensor(tokens, dtype=torch.int64),
        all_greedy=all(p.temperature == 0 for p in params),
        use_top_k=any(p.top_k > 0 for p in params),
        use_top_p=any(p.top_p < 1 for p in params),
    )


def oracle_distribution(logits: torch.Tensor, p: SamplingParams) -> tuple[torch.Tensor, float]:
    """The distribution ``p`` describes over one logits row, in float64, computed independently of the sampler:
    softmax(logits / T); keep the top_k most likely; keep the smallest most-likely-first prefix whose mass reaches
    top_p; keep tokens at least min_p times as likely as the most likely. Returns (probabilities, margin): the
    margin is how far the case is from a top-p / min-p decision boundary (a test case must not sit on one)."""
    probs = torch.softmax(logits.double() / p.temperature, dim=-1)
    order = sorted(range(len(probs)), key=lambda i: -probs[i].item())
    keep = torch.ones(len(probs), dtype=torch.bool)
    if p.top_k > 0:
        keep[order[p.top_k :]] = False
    margin = math.inf
    if p.top_p < 1:
        kept = probs * keep / (probs * keep).sum()
        before = 0.0
        for i in order:
            if not keep[i]:
                continue
            margin = min(margin, abs(before - p.top_p))
            if before >= p.top_p:
                keep[i] = False
            before += kept[i].item()
    if p.min_p > 0:
        kept = probs * keep / (probs * keep).sum()
        threshold = p.min_p * kept.max()
        margin = min(margin, *(abs(kept[i] - threshold).item() for i in range(len(probs)) if keep[i]))
        keep &= kept >= threshold
    dist = probs * keep
    return dist / dist.sum(), margin


def draw(logits_row: torch.Tensor, p: SamplingParams, seeds, counters) -> torch.Tensor:
    n = len(seeds)
    return sample(logits_row.expand(n, -1).clone(), make_batch([p] * n, seeds, counters))


def assert_matches(tokens: torch.Tensor, want: torch.Tensor) -> None:
    """Empirical frequencies of ``tokens`` against the oracle ``want``: support, chi-square and per-token bounds."""
    n = tokens.numel()
    counts = torch.bincount(tokens, minlength=len(want)).double()
    outside = ((counts > 0) & (want == 0)).nonzero().flatten().tolist()
    assert not outside, f"tokens {outside} are outside the allowed set but were drawn"
    freq = counts / n
    sigma = (want * (1 - want) / n).sqrt()
    worst = ((freq - want).abs() - 5 * sigma).max().item()
    assert worst <= 1e-4, f"a token frequency is off by more than 5 sigma:\n{freq}\n{want}"
    # Chi-square over the allowed tokens, bins with an expected count below 5 pooled.
    expected = want * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big & (want > 0)].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big & (want > 0)].sum().reshape(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    chi2 = ((obs - exp) ** 2 / exp).sum().item()
    df = max(len(exp) - 1, 1)
    bound = df + 6 * math.sqrt(2 * df) + 6  # far in the tail (p < 1e-6 for every df used here)
    assert chi2 <= bound, f"chi-square {chi2:.1f} > {bound:.1f} (df={df})"


# Probabilities with clear gaps, so no top-p / min-p decision sits on a boundary. Shuffled vocabulary positions:
# the allowed tokens are not simply the first ids.
BASE_PROBS = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.08, 0.06, 0.04, 0.03, 0.02, 0.01, 0.007, 0.003])
PERMUTATION = torch.tensor([7, 2, 10, 0, 5, 11, 3, 8, 1, 6, 9, 4])
LOGITS = torch.empty(12).scatter_(0, PERMUTATION, BASE_PROBS.log() * 1.7 + 0.4)

DISTRIBUTION_CASES = {
    "plain": SamplingParams(temperature=1.0),
    "cold": SamplingParams(temperature=0.5),
    "hot": SamplingParams(temperature=2.0),
    "top_k": SamplingParams(temperature=1.0, top_k=5),
    "top_p": SamplingParams(temperature=1.0, top_p=0.7),
    "top_p_hot": SamplingParams(temperature=1.6, top_p=0.85),
    "min_p": SamplingParams(temperature=1.0, min_p=0.2),
    "combined": SamplingParams(temperature=0.8, top_k=8, top_p=0.9, min_p=0.05),
    "top_k_one": SamplingParams(temperature=1.0, top_k=1),
}
NUM_DRAWS = 40_000


@pytest.mark.parametrize("case", sorted(DISTRIBUTION_CASES))
@pytest.mark.parametrize("vary", ["counter", "seed"])
def test_sampled_frequencies_match_oracle(case, vary):
    p = DISTRIBUTION_CASES[case]
    want, margin = oracle_distribution(LOGITS, p)
    assert margin > 5e-3, "test case sits on a top-p / min-p boundary"
    if vary == "counter":  # one request: the successive output positions
        seeds, counters = torch.full((NUM_DRAWS,), 1234), torch.arange(NUM_DRAWS)
    else:  # many requests, each at its first output position
        seeds, counters = torch.arange(NUM_DRAWS) * 7919 + 5, torch.zeros(NUM_DRAWS, dtype=torch.int64)
    assert_matches(draw(LOGITS, p, seeds, counters), want)


def test_frequencies_match_oracle_over_a_model_sized_vocabulary():
    logits = torch.randn(320, generator=torch.Generator().manual_seed(3)) * 2.5
    for p in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.01)):
        want, margin = oracle_distribution(logits, p)
        assert margin > 1e-4
        n = 20_000
        assert_matches(draw(logits, p, torch.full((n,), 99), torch.arange(n)), want)


def test_uniform_noise_is_uniform_and_keyed():
    seeds = torch.arange(64) * 31
    counters = torch.arange(64) % 5
    u = uniform_noise(seeds, counters, 4096)
    assert u.shape == (64, 4096) and u.dtype == torch.float32
    assert (u > 0).all() and (u < 1).all()
    assert abs(u.mean().item() - 0.5) < 0.005
    hist = torch.histc(u, bins=16, min=0, max=1) / u.numel()
    assert (hist - 1 / 16).abs().max() < 0.004
    assert torch.equal(u, uniform_noise(seeds, counters, 4096))  # a pure function of (seed, counter, id)
    assert not torch.equal(u[1], uniform_noise(seeds[1:2], counters[1:2] + 1, 4096)[0])
    assert not torch.equal(u[1], uniform_noise(seeds[1:2] + 1, counters[1:2], 4096)[0])


def test_largest_noise_value_cannot_override_the_distribution():
    """Regression: the noise used to round to exactly 1.0 for the largest hash value (here: seed 1234, counter
    9412, token 5), so E = -log(U) = 0 and that token won with p / E = inf or NaN even when filtered out."""
    u = uniform_noise(torch.tensor([1234]), torch.tensor([9412]), 12)
    assert u[0, 5] < 1 and u[0, 5] == u.max() and u[0, 5] > 1 - 2**-23
    logits = torch.zeros(1, 12)
    logits[0, 2] = 5.0
    for p in (SamplingParams(top_k=1), SamplingParams(top_p=0.5), SamplingParams(min_p=0.9)):
        assert sample(logits, make_batch([p], [1234], [9412])).item() == 2
    assert sample(logits, make_batch([SamplingParams()], [1234], [9412], [(0, 5)])).item() != 5


def test_top_p_one_filters_nothing_even_beside_a_top_p_row():
    """Regression: a top_p=1 row used to lose tail tokens (fp32 cumsum rounding up to 1) when another row of the
    batch had top_p < 1, so its allowed set depended on its neighbours. top_p = 1 is now off row by row: beside a
    top-p row, such rows draw what they draw in a batch where top-p is off altogether (ce::sample's use_top_p)."""
    logits = torch.randn(8, 320, generator=torch.Generator().manual_seed(0)) * 8
    params = [SamplingParams(top_p=1.0)] * 7 + [SamplingParams(top_p=0.5)]
    for counter in range(20):
        seeds, counters = torch.arange(8) * 3 + 1, torch.full((8,), counter)
        mixed = sample(logits, make_batch(params, seeds, counters))
        alone = sample(logits[:7], make_batch(params[:7], seeds[:7], counters[:7]))
        assert not make_batch(params[:7], seeds[:7], counters[:7]).use_top_p
        assert torch.equal(mixed[:7], alone)


# --------------------------------------------------------------------------------------------------------------
# Sampler properties (hypothesis)
# --------------------------------------------------------------------------------------------------------------

row_params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.0, 0.3, 1.0, 1.7]),
    top_k=st.sampled_from([0, 0, 1, 2, 5, 50]),
    top_p=st.sampled_from([1.0, 1.0, 0.9, 0.5, 0.05]),
    min_p=st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.0]),
)


@st.composite
def batches(draw_):
    vocab = draw_(st.integers(2, 80))
    rows = draw_(st.lists(row_params, min_size=1, max_size=6))
    gen = torch.Generator().manual_seed(draw_(st.integers(0, 2**31)))
    logits = torch.randn(len(rows), vocab, generator=gen) * draw_(st.sampled_from([0.5, 3.0, 10.0]))
    seeds = draw_(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=len(rows), max_size=len(rows)))
    counters = draw_(st.lists(st.integers(0, 10**6), min_size=len(rows), max_size=len(rows)))
    suppress = draw_(st.lists(st.tuples(st.integers(0, len(rows) - 1), st.integers(0, vocab - 1)), max_size=6))
    # Never suppress every token of a row.
    suppress = [(r, t) for r, t in set(suppress) if sum(1 for r2, _ in suppress if r2 == r) < vocab]
    return logits, rows, seeds, counters, sorted(suppress)


@heavy_settings(60)
@given(batches())
def test_sampler_properties(batch):
    logits, rows, seeds, counters, suppress = batch
    tokens = sample(logits, make_batch(rows, seeds, counters, suppress))
    assert tokens.shape == (len(rows),) and tokens.dtype == torch.int64
    masked = logits.clone()
    for r, t in suppress:
        masked[r, t] = -math.inf
    for i, p in enumerate(rows):
        token = tokens[i].item()
        assert (i, token) not in suppress, "a suppressed token was drawn"
        if p.temperature == 0:
            assert token == masked[i].argmax().item(), "greedy is not argmax"
        else:
            want, _ = oracle_distribution(masked[i], p)
            # The boundary token of top-p / min-p may go either way by rounding; anything clearly outside may not.
            relaxed = SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=min(1.0, p.top_p + 1e-4),
                                     min_p=max(0.0, p.min_p - 1e-4))
            allowed, _ = oracle_distribution(masked[i], relaxed)
            assert allowed[token] > 0, f"token {token} is outside the allowed set of {p}"
        # The same row alone (its own flags, no neighbours) draws the same token.
        alone_suppress = [(0, t) for r, t in suppress if r == i]
        alone = sample(logits[i : i + 1], make_batch([p], seeds[i : i + 1], counters[i : i + 1], alone_suppress))
        assert alone.item() == token, "a row's token depends on the rest of the batch"


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.sampled_from([0.0, 0.7]), st.integers(0, 50)),
                min_size=1, max_size=9), st.integers(1, 3))
def test_sampling_batch_rows_and_alignment(rows, positions):
    """``sampling_batch``'s per-row fields hold each row's parameters (``positions`` rows a request, counters from its
    generated count on; stop tokens suppressed, row by row, while fewer than min_tokens are generated), and every
    field starts on a 16-byte boundary whatever the row count: ce::sample's Triton kernels compile a variant per
    pointer alignment, so fields at offsets that followed the batch size cost a compile for each new remainder."""
    requests = []
    for i, (generated, min_tokens, temperature, top_k) in enumerate(rows):
        params = SamplingParams(temperature=temperature, top_k=top_k, min_tokens=min_tokens, max_tokens=8)
        seq = Sequence(i, [1, 2, 3] + [4] * generated, 3)
        requests.append(Request(f"r{i}", seq, params, seed=100 + i, stop_ids=frozenset({7, 2}),
                                prompt_token_ids=[1, 2, 3]))
    batch = sampling_batch(requests, torch.device("cpu"), positions=positions)
    per_row = [(r, p) for r in requests for p in range(positions)]
    drawn = [row for row in rows for _ in range(positions)]  # (generated, min_tokens, temperature, top_k) a row
    assert batch.temperature.tolist() == [pytest.approx(t) for _, _, t, _ in drawn]
    assert batch.top_k.tolist() == [k for _, _, _, k in drawn]
    assert batch.seeds.tolist() == [r.seed for r, _ in per_row]
    assert batch.counters.tolist() == [g + p for (g, *_), (_, p) in zip(drawn, per_row)]
    suppressed = [(row, t) for row, ((g, m, *_), (_, p)) in enumerate(zip(drawn, per_row)) if g + p < m
                  for t in (2, 7)]
    assert list(zip(batch.suppress_rows.tolist(), batch.suppress_tokens.tolist())) == suppressed
    for name in ("temperature", "top_k", "top_p", "min_p", "seeds", "counters", "suppress_rows", "suppress_tokens"):
        field = getattr(batch, name)
        assert field.storage_offset() * field.element_size() % 16 == 0, name


def test_dominant_suppressed_token_is_never_drawn():
    logits = torch.zeros(2000, 16)
    logits[:, 3] = 30.0  # all the mass
    params = [SamplingParams(temperature=1.0)] * 1000 + [SamplingParams(temperature=0.0)] * 1000
    suppress = [(r, 3) for r in range(2000)]
    tokens = sample(logits, make_batch(params, torch.arange(2000), torch.zeros(2000), suppress))
    assert not (tokens == 3).any()
    assert ((tokens >= 0) & (tokens < 16)).all()


# --------------------------------------------------------------------------------------------------------------
# Engine: fixtures
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path(build_hf_model):
    return build_hf_model(MODEL)


@pytest.fixture(scope="module")
def llm(model_path):
    return make_llm(model_path, max_num_seqs=8, max_model_len=128, max_num_batched_tokens=64)


@pytest.fixture
def engine(llm):
    assert_clean(llm.engine)
    yield llm.engine
    assert_clean(llm.engine)


def with_eos(tmp_path_factory, src, eos) -> str:
    """A copy of a fixture folder whose config.json names ``eos`` as eos_token_id (the fixtures have none)."""
    folder = tmp_path_factory.mktemp("eos")
    shutil.copytree(src, folder, dirs_exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    config["eos_token_id"] = eos
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@torch.no_grad()
def hf_masked_greedy(model, tokens, max_new_tokens, stop_ids, min_tokens) -> list[int]:
    """HF greedy where ``stop_ids`` are masked for the first ``min_tokens`` tokens and end generation afterwards."""
    ids, out = list(tokens), []
    for i in range(max_new_tokens):
        logits = hf_models.hf_logits(model, ids)[-1]
        if i < min_tokens:
            logits[sorted(stop_ids)] = -math.inf
        token = int(logits.argmax())
        ids.append(token)
        out.append(token)
        if token in stop_ids and i >= min_tokens:
            break
    return out


# --------------------------------------------------------------------------------------------------------------
# Engine: greedy, seeds, allowed sets
# --------------------------------------------------------------------------------------------------------------


def test_greedy_equals_hf_beside_sampled_rows(engine, load_hf_model):
    prompts = [prompt(n, 20) for n in (1, 9, 30, 64)]
    for i, tokens in enumerate(prompts):
        engine.add_request(f"g{i}", tokens, SamplingParams(max_tokens=10, **GREEDY))
        engine.add_request(f"s{i}", tokens, SamplingParams(temperature=1.0, top_k=7, seed=i, max_tokens=10))
    finals = drain(engine)
    for i, tokens in enumerate(prompts):
        assert finals[f"g{i}"].token_ids == hf_greedy(load_hf_model, tokens, 10)


SEEDED = SamplingParams(temperature=1.2, top_p=0.95, seed=42, max_tokens=12)


def test_seed_reproduces_whatever_else_is_in_the_batch(engine):
    target = prompt(21, 21)

    def run(others, arrive_at, order_first):
        others = list(others)
        if order_first:
            engine.add_request("x", target, SEEDED)
        pending = others if arrive_at == 0 else []
        for rid, tokens, params in pending:
            engine.add_request(rid, tokens, params)
        if not order_first:
            engine.add_request("x", target, SEEDED)
        step = 0
        finals = {}
        while engine.has_unfinished_requests():
            step += 1
            if step == arrive_at:
                for rid, tokens, params in others:
                    engine.add_request(rid, tokens, params)
            for out in engine.step():
                if out.finished:
                    finals[out.request_id] = out
        return finals

    alone = run([], 0, True)["x"].token_ids
    crowd = [
        ("a", prompt(40, 22), SamplingParams(max_tokens=20, **GREEDY)),
        ("b", prompt(5, 23), SamplingParams(temperature=0.7, top_k=3, seed=1, max_tokens=20)),
        ("c", target, SamplingParams(temperature=1.2, top_p=0.95, seed=43, max_tokens=20)),
        ("d", prompt(12, 24), SamplingParams(temperature=1.0, min_p=0.2, max_tokens=8)),  # unseeded
    ]
    finals = run(crowd, 0, True)
    assert finals["x"].token_ids == alone
    assert run(crowd, 0, False)["x"].token_ids == alone
    assert run(crowd, 3, True)["x"].token_ids == alone  # the others join while x decodes
    assert run(crowd[::-1], 2, False)["x"].token_ids == alone
    # The seed matters: the same prompt and parameters with another seed give another output.
    assert finals["c"].token_ids[:12] != alone


def test_sampled_tokens_lie_in_the_allowed_set(engine, load_hf_model):
    model = load_hf_model(MODEL)
    cases = [
        SamplingParams(temperature=1.5, top_k=3, max_tokens=16),
        SamplingParams(temperature=1.0, top_p=0.6, max_tokens=16),
        SamplingParams(temperature=1.0, min_p=0.3, max_tokens=16),
        SamplingParams(temperature=2.0, top_k=10, top_p=0.8, min_p=0.1, max_tokens=16),
    ]
    prompts = [prompt(n, 25) for n in (7, 19)]
    requests = {}
    for c, p in enumerate(cases):
        for j, tokens in enumerate(prompts):
            rid = engine.add_request(None, tokens, SamplingParams(**{**vars(p), "seed": 100 * c + j}))
            requests[rid] = (tokens, p)
    finals = drain(engine)
    non_argmax = 0
    for rid, (tokens, p) in requests.items():
        out = finals[rid].token_ids
        logits = hf_models.hf_logits(model, tokens + out)[len(tokens) - 1 : -1]
        relaxed = SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=min(1.0, p.top_p + 2e-3),
                                 min_p=max(0.0, p.min_p - 2e-3))
        for pos, token in enumerate(out):
            allowed, _ = oracle_distribution(logits[pos], relaxed)
            assert allowed[token] > 0, f"{p}: token {token} at output position {pos} is not allowed"
            non_argmax += token != logits[pos].argmax().item()
    assert non_argmax > 10  # the requests really sampled


def test_filters_that_leave_one_token_equal_greedy(engine, load_hf_model):
    tokens = prompt(15, 26)
    want = hf_greedy(load_hf_model, tokens, 10)
    for p in (dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)):
        rid = engine.add_request(None, tokens, SamplingParams(temperature=1.5, seed=3, max_tokens=10, **p))
        assert drain(engine)[rid].token_ids == want, p


# --------------------------------------------------------------------------------------------------------------
# Engine: stop conditions
# --------------------------------------------------------------------------------------------------------------


def test_max_tokens_finishes_with_length(engine, load_hf_model):
    tokens = prompt(11, 27)
    for n in (1, 7):
        rid = engine.add_request(None, tokens, SamplingParams(max_tokens=n, **GREEDY))
        out = drain(engine)[rid]
        assert (out.finish_reason, out.token_ids) == ("length", hf_greedy(load_hf_model, tokens, n))
    rid = engine.add_request(None, tokens, SamplingParams(temperature=1.0, seed=5, max_tokens=9))
    out = drain(engine)[rid]
    assert out.finish_reason == "length" and len(out.token_ids) == 9


def test_max_model_len_caps_the_output(engine, load_hf_model):
    tokens = prompt(120, 28)  # max_model_len is 128: 8 tokens fit
    rid = engine.add_request(None, tokens, SamplingParams(max_tokens=50, **GREEDY))
    out = drain(engine)[rid]
    assert out.finish_reason == "length" and out.token_ids == hf_greedy(load_hf_model, tokens, 8)


def first_new_token_at(sequence: list[int], min_index: int) -> int:
    """First index >= min_index whose token does not occur earlier in the sequence."""
    return next(i for i in range(min_index, len(sequence)) if sequence[i] not in sequence[:i])


def test_stop_token_ids_finish_with_stop(engine, load_hf_model):
    tokens = prompt(13, 29)
    greedy = hf_greedy(load_hf_model, tokens, 16)
    i = first_new_token_at(greedy, 3)
    j = first_new_token_at(greedy, i + 1)
    rid = engine.add_request(None, tokens, SamplingParams(max_tokens=16, stop_token_ids=[greedy[i]], **GREEDY))
    out = drain(engine)[rid]
    assert (out.finish_reason, out.token_ids) == ("stop", greedy[: i + 1])  # the stop token is kept
    rid = engine.add_request(None, tokens, SamplingParams(max_tokens=16, stop_token_ids=[greedy[j], greedy[i]],
                                                          **GREEDY))
    assert drain(engine)[rid].token_ids == greedy[: i + 1]  # the first of several stop tokens ends it
    # min_tokens past the first stop token: it is suppressed until then (HF with the token masked is the oracle).
    stop = {greedy[i], greedy[j]}
    rid = engine.add_request(None, tokens, SamplingParams(max_tokens=16, min_tokens=i + 2, stop_token_ids=sorted(stop),
                                                          **GREEDY))
    out = drain(engine)[rid]
    want = hf_masked_greedy(load_hf_model(MODEL), tokens, 16, stop, i + 2)
    assert out.token_ids == want
    assert not stop & set(out.token_ids[: i + 2])
    assert out.finish_reason == ("stop" if want[-1] in stop else "length")


@pytest.fixture(scope="module")
def eos_case(model_path, load_hf_model):
    """A prompt, its HF greedy continuation, and a token to call EOS that first appears at index >= 3 in it."""
    tokens = prompt(9, 30)
    greedy = hf_greedy(load_hf_model, tokens, 16)
    i = first_new_token_at(greedy, 3)
    return tokens, greedy, i, greedy[i]


@pytest.mark.parametrize("as_list", [False, True])
def test_eos_from_the_checkpoint(eos_case, model_path, load_hf_model, tmp_path_factory, as_list):
    tokens, greedy, i, eos = eos_case
    other = next(t for t in range(320) if t not in greedy)
    folder = with_eos(tmp_path_factory, model_path, [other, eos] if as_list else eos)
    llm = make_llm(folder)
    assert llm.engine.eos_token_ids == ({other, eos} if as_list else {eos})
    default = llm.generate(tokens, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
    assert (default.finish_reason, default.token_ids) == ("stop", greedy[: i + 1])
    ignored = llm.generate(tokens, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)[0]
    assert (ignored.finish_reason, ignored.token_ids) == ("length", greedy)
    # min_tokens suppresses EOS until that many tokens exist.
    for min_tokens in (i, i + 1, i + 3):
        out = llm.generate(tokens, SamplingParams(temperature=0, max_tokens=16, min_tokens=min_tokens),
                           use_tqdm=False)[0]
        stop = {other, eos} if as_list else {eos}
        want = hf_masked_greedy(load_hf_model(MODEL), tokens, 16, stop, min_tokens)
        assert out.token_ids == want, min_tokens
        assert not stop & set(out.token_ids[:min_tokens])
        assert out.finish_reason == ("stop" if want[-1] in stop else "length")
    # Sampled requests stop at EOS too, and with min_tokens never emit it early.
    outs = llm.generate([tokens] * 6, [SamplingParams(temperature=1.0, seed=s, max_tokens=16, min_tokens=4)
                                       for s in range(6)], use_tqdm=False)
    for out in outs:
        assert eos not in out.token_ids[:4]
        assert (out.finish_reason == "stop") == (eos in out.token_ids) and eos not in out.token_ids[:-1]
    assert_clean(llm.engine)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_no_sampling_kernel_compiles_while_serving(model_path, monkeypatch, dtype):
    """Start-up compiles ce::sample's kernels for every eager call and the penalties' kernel (LLMEngine:
    ``warm_up_sampling``), so that a sampled request of any top-k / top-p setting, with or without a penalty, alone
    or beside others, compiles none in the middle of serving: on an empty Triton cache each compile stalls its step
    for seconds. The engine decodes eagerly, so its decode rows are sampled outside a graph too, from model-dtype
    logits (bf16: variants of their own), as a compiled engine samples its decode rows that suppress their stop
    tokens (``min_tokens``, here too). Oracle: Triton's ``jit_cache_hook``, called where a kernel meets a variant its
    process has not compiled. The kernels' in-process caches are emptied first, so that the engine's start-up, not an
    earlier test, must have compiled them."""
    import triton

    from compiled_engine import LLM
    from ops.triton import penalty_kernels, sample_kernels

    kernels = [k for module in (sample_kernels, penalty_kernels) for k in vars(module).values()
               if isinstance(k, triton.runtime.JITFunction) and k.__name__.startswith(("_sample_", "_apply_penalties"))]
    assert kernels
    for kernel in kernels:
        kernel.device_caches.clear()
    llm = LLM(str(model_path), device="cuda", dtype=dtype, enforce_eager=True, max_model_len=128, max_num_seqs=4,
              block_size=16)
    compiled = []
    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", lambda **kw: compiled.append(kw["repr"]))
    for top_k in (0, 20):
        for top_p in (1.0, 0.9):
            for penalty, min_tokens in ((0.0, 0), (0.5, 0), (0.0, 2)):
                for requests in (1, 4):
                    params = SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, presence_penalty=penalty,
                                            min_tokens=min_tokens, max_tokens=3, seed=1)
                    outs = llm.generate([prompt(8 + i) for i in range(requests)], params, use_tqdm=False)
                    assert all(len(out.outputs[0].token_ids) == 3 for out in outs)
    assert not [name for name in compiled if name.startswith(("_sample_", "_apply_penalties"))], compiled


def test_run_in_threads_runs_every_call_once_and_raises_a_failure_after_all():
    """ops/triton/compile_threads.py, a warm-up's first launches on a thread pool (the sampler's): every call runs
    exactly once, on the pool's threads, under inference mode; a call's error is raised in the caller once every call
    has finished."""
    import threading

    from ops.triton.compile_threads import run_in_threads

    seen, lock, gate = [], threading.Lock(), threading.Barrier(3, timeout=10)

    def call(i: int, wait: bool = False):
        if wait:
            gate.wait()  # three calls at once: they run side by side, not one after another
        with lock:
            seen.append((i, threading.current_thread() is not threading.main_thread(),
                         torch.is_inference_mode_enabled()))

    finished = []  # `done`'s calls: one a finished call, on the caller's thread

    def done():
        finished.append(threading.current_thread() is threading.main_thread())

    run_in_threads([lambda i=i: call(i, wait=i < 3) for i in range(10)], torch.device("cpu"), threads=4, done=done)
    assert sorted(i for i, _, _ in seen) == list(range(10))
    assert all(on_pool and inference for _, on_pool, inference in seen)
    assert finished == [True] * 10

    seen.clear()
    finished.clear()

    def fail():
        raise RuntimeError("compile failed")

    with pytest.raises(RuntimeError, match="compile failed"):
        run_in_threads([fail] + [lambda i=i: call(i) for i in range(5)], torch.device("cpu"), threads=2, done=done)
    assert sorted(i for i, _, _ in seen) == list(range(5))
    assert finished == [True] * 6


def test_the_sampler_warm_up_counts_its_cases_on_a_progress_bar():
    """``warm_up_sampling(progress=True)`` (LLMEngine's start-up on a GPU) draws a bar over every case it launches: the
    penalties' kernel, then ce::sample at each dtype x row count x top-k / top-p switch (here 1 + 2 x 2 x 4)."""
    import contextlib
    import io

    from compiled_engine.sampler import warm_up_sampling

    bar = io.StringIO()
    with contextlib.redirect_stderr(bar):
        warm_up_sampling(64, 3, torch.device("cpu"), model_dtype=torch.bfloat16, threads=2, progress=True)
    assert "compiling the sampler's kernels" in bar.getvalue()
    assert "17/17" in bar.getvalue().split("\r")[-1], bar.getvalue()

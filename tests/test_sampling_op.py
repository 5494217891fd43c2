"""``ce::sample`` (ops/sample.py) on the CPU: its reference against independent oracles.

* token for token against a float64 oracle written here (explicit sort-based filtering in float64, exact softmax,
  the same uniform noise, Gumbel scores in float64), on hypothesis cases with ties, -inf / NaN / +inf logits,
  bf16 / fp16 / fp32, greedy and sampled rows; rows within rounding distance of a decision (a top-p or min-p
  boundary, two Gumbel scores within 1e-5) are left out, and must be few;
* the distribution: many draws (successive counters of one seed) against the exact filtered softmax in float64,
  chi-square at a significance level of 1e-8 per case (and no token outside the allowed set), each case also
  proving that its draws reject a wrong temperature and an off-by-one top-k;
* pinned semantics: tie-inclusive top-k, top-p's strict "<" at an exactly representable boundary, min-p's ">=",
  the greedy rule, rows without a finite maximum, the use_top_k / use_top_p switches;
* batch invariance, and tracing by torch.compile with fullgraph=True (the fake).
The Triton kernel equals this reference token for token: tests/test_sampling_interpreter.py (CPU interpreter) and
tests/test_kernels_cuda.py (GPU).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import ops  # noqa: F401  (registers torch.ops.ce)
from ops.sample import exp_ce, log_ce, sample_reference, uniform_noise

ce = torch.ops.ce

# --------------------------------------------------------------------------------------------------------------
# The float64 oracle
# --------------------------------------------------------------------------------------------------------------

SCORE_GAP = 1e-5  # the fp32 reference's Gumbel scores are within ~1e-6 (plus 2e-7 * |y|) of the float64 ones
BOUNDARY = 1e-5  # top-p masses (relative) and min-p's y are within ~1e-6 of the float64 ones


def oracle_keep(raw: torch.Tensor, t: float, k: int, top_p: float, min_p: float, use_top_k=True, use_top_p=True):
    """(kept mask, scaled logits y, margin) of one row, in float64: softmax(x / T) filtered by top-k (every logit >=
    the k-th largest), then top-p on the top-k-renormalised distribution (kept iff the mass of strictly larger logits
    is < top_p), then min-p (p >= min_p * p_max); NaN logits count as -inf. ``margin``: the distance of the closest
    top-p / min-p decision to its boundary."""
    x = raw.double().clone()
    x[torch.isnan(x)] = -math.inf
    vocab = x.numel()
    m = x.max().item()
    y = (x - m) / t
    keep = torch.ones(vocab, dtype=torch.bool)
    if use_top_k and 0 < k < vocab:
        kth = sorted(x.tolist(), reverse=True)[k - 1]
        keep = x >= kth
    margin = math.inf
    if use_top_p and top_p < 1:
        p = torch.exp(y) * keep
        p = p / p.sum()
        order = sorted(range(vocab), key=lambda i: -x[i].item())
        new_keep = keep.clone()
        for i in order:
            if not keep[i]:
                continue
            larger = p[(x > x[i]) & keep].sum().item()  # ties decided together
            margin = min(margin, abs(larger - top_p))
            new_keep[i] = larger < top_p
        keep = new_keep
    if min_p > 0:
        threshold = math.log(min_p)
        live = keep & torch.isfinite(y) & (x < m)  # (the maximum is kept whatever min_p)
        if live.any():
            margin = min(margin, (y[live] - threshold).abs().min().item())
        keep &= y >= threshold
    keep |= x == m
    return keep, y, margin


def oracle_token(raw, t, k, top_p, min_p, seed, counter, use_top_k=True, use_top_p=True):
    """(token, decided): the float64 oracle's draw, and whether no decision was within rounding of its boundary."""
    if not t > 0:
        return int(torch.argmax(raw)), True
    x = raw.double()
    if not math.isfinite(torch.where(torch.isnan(x), -math.inf, x).max().item()):
        return int(torch.argmax(raw)), True
    keep, y, margin = oracle_keep(raw, t, k, top_p, min_p, use_top_k, use_top_p)
    u = uniform_noise(torch.tensor([seed]), torch.tensor([counter]), raw.numel())[0].double()
    score = (y - torch.log(-torch.log(u))).masked_fill(~keep, -math.inf)
    ranked = score.sort(descending=True).values
    gap = (ranked[0] - ranked[1]).item() if int(keep.sum()) > 1 else math.inf
    token = int(score.argmax())
    return token, margin > BOUNDARY and gap > SCORE_GAP * (1 + abs(y[token].item()))


# --------------------------------------------------------------------------------------------------------------
# Case generation
# --------------------------------------------------------------------------------------------------------------

TEMPERATURES = [0.0, 0.0, 0.05, 0.5, 1.0, 1.7]
TOP_P = [1.0, 1.0, 0.95, 0.7, 0.3, 0.01]
MIN_P = [0.0, 0.0, 0.05, 0.3, 1.0]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@st.composite
def sampling_cases(draw, max_vocab=64, max_rows=5, vocab_sizes=None):
    """(logits [B, V], temperature, top_k, top_p, min_p, seeds, counters, use_top_k, use_top_p): random logits
    with ties (copied values, or values on a coarse grid), -inf and NaN entries, whole rows of -inf, +inf.
    ``vocab_sizes``: a strategy for V (default: 1..max_vocab)."""
    vocab = draw(vocab_sizes if vocab_sizes is not None else st.integers(1, max_vocab))
    rows = draw(st.integers(1, max_rows))
    dtype = draw(st.sampled_from(DTYPES))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    logits = torch.randn(rows, vocab, generator=gen) * draw(st.sampled_from([0.2, 1.0, 4.0, 20.0]))
    if draw(st.booleans()):
        logits = (logits * 2).round() / 2  # many ties
    for _ in range(draw(st.integers(0, 6))):  # tied copies
        r, i, j = (int(torch.randint(n, (1,), generator=gen)) for n in (rows, vocab, vocab))
        logits[r, j] = logits[r, i]
    for _ in range(draw(st.integers(0, 4))):
        r, i = (int(torch.randint(n, (1,), generator=gen)) for n in (rows, vocab))
        logits[r, i] = draw(st.sampled_from([-math.inf, -math.inf, math.nan, math.inf]))
    if draw(st.integers(0, 9)) == 0:
        logits[0] = -math.inf
    logits = logits.to(dtype)
    k_choices = [0, 0, 1, 2, 5, 40, max(vocab - 1, 1), vocab, vocab + 3]
    temperature = torch.tensor(draw(st.lists(st.sampled_from(TEMPERATURES), min_size=rows, max_size=rows)))
    top_k = torch.tensor(draw(st.lists(st.sampled_from(k_choices), min_size=rows, max_size=rows)))
    top_p = torch.tensor(draw(st.lists(st.sampled_from(TOP_P), min_size=rows, max_size=rows)))
    min_p = torch.tensor(draw(st.lists(st.sampled_from(MIN_P), min_size=rows, max_size=rows)))
    seeds = torch.tensor(draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=rows, max_size=rows)))
    counters = torch.tensor(draw(st.lists(st.integers(0, 10**6), min_size=rows, max_size=rows)))
    flags = draw(st.sampled_from([(True, True), (True, True), (False, True), (True, False), (False, False)]))
    return (logits, temperature.float(), top_k.long(), top_p.float(), min_p.float(), seeds.long(), counters.long(),
            *flags)


# --------------------------------------------------------------------------------------------------------------
# Reference against the oracle
# --------------------------------------------------------------------------------------------------------------

DECIDED = {"rows": 0, "undecided": 0}


@given(sampling_cases())
def test_reference_matches_float64_oracle(case):
    logits, temperature, top_k, top_p, min_p, seeds, counters, use_top_k, use_top_p = case
    tokens = ce.sample(*case)
    assert tokens.dtype == torch.int64 and tokens.shape == (logits.shape[0],)
    for i in range(logits.shape[0]):
        want, decided = oracle_token(logits[i], temperature[i].item(), int(top_k[i]), top_p[i].item(),
                                     min_p[i].item(), int(seeds[i]), int(counters[i]), use_top_k, use_top_p)
        DECIDED["rows"] += 1
        if not decided:
            DECIDED["undecided"] += 1
            continue
        assert tokens[i].item() == want, (i, tokens.tolist(), want)
    assert DECIDED["undecided"] <= 0.1 * DECIDED["rows"] + 3, DECIDED


# --------------------------------------------------------------------------------------------------------------
# Distribution: chi-square against the exact filtered softmax
# --------------------------------------------------------------------------------------------------------------


def chi_square_p_value(statistic: float, df: int) -> float:
    """P(chi2_df >= statistic): the regularized upper incomplete gamma Q(df / 2, statistic / 2) (series below
    a + 1, Lentz's continued fraction above: Numerical Recipes' gammq)."""
    a, x = df / 2, statistic / 2
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """(statistic, degrees of freedom) of ``counts`` against ``probs`` over the allowed tokens; bins expecting fewer
    than 5 draws pooled into one."""
    n = counts.sum().item()
    expected = probs * n
    big = expected >= 5
    small = ~big & (probs > 0)
    obs = torch.cat([counts[big], counts[small].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[small].sum().reshape(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    return ((obs - exp) ** 2 / exp).sum().item(), max(len(exp) - 1, 1)


def filtered_softmax(logits: torch.Tensor, t: float, k: int, top_p: float, min_p: float) -> torch.Tensor:
    keep, y, margin = oracle_keep(logits, t, k, top_p, min_p)
    assert margin > 1e-3, "a distribution case must not sit on a top-p / min-p boundary"
    p = torch.exp(y) * keep
    return p / p.sum()


# Logits with distinct, well-separated probabilities at shuffled vocabulary positions, plus a tie and a -inf.
DIST_LOGITS = torch.tensor([0.3, -1.2, 1.9, -0.4, 0.9, -2.5, 1.1, 0.0, -0.9, 2.4, -1.7, 0.6, -3.0, 1.5, -0.2, 0.6,
                            -math.inf, -0.6, 0.2, -1.4])
DIST_CASES = {  # (temperature, top_k, top_p, min_p)
    "plain": (1.0, 0, 1.0, 0.0),
    "cold": (0.6, 0, 1.0, 0.0),
    "hot": (1.8, 0, 1.0, 0.0),
    "top_k": (1.0, 6, 1.0, 0.0),
    "top_k_tie": (1.0, 9, 1.0, 0.0),  # the 9th and 10th largest (0.6, 0.6) tie: both kept
    "top_p": (1.0, 0, 0.75, 0.0),  # keeps the tie (0.6, 0.6): the mass above it is 0.72, 0.77 with one of them
    "min_p": (0.9, 0, 1.0, 0.1),
    "combined": (0.8, 12, 0.9, 0.02),
}
NUM_DRAWS = 200_000
ALPHA = 1e-8  # per case: with 8 cases, a false failure has probability < 1e-7 (the draws are deterministic anyway)


@pytest.mark.parametrize("case", sorted(DIST_CASES))
def test_distribution_matches_filtered_softmax(case):
    t, k, top_p, min_p = DIST_CASES[case]
    vocab = DIST_LOGITS.numel()
    n = NUM_DRAWS
    logits = DIST_LOGITS.expand(n, vocab)  # stride 0 rows
    full = lambda value, dtype: torch.full((n,), value, dtype=dtype)  # noqa: E731
    tokens = ce.sample(logits, full(t, torch.float32), full(k, torch.int64), full(top_p, torch.float32),
                       full(min_p, torch.float32), full(20260, torch.int64), torch.arange(n))
    counts = torch.bincount(tokens, minlength=vocab).double()
    want = filtered_softmax(DIST_LOGITS, t, k, top_p, min_p)
    outside = ((counts > 0) & (want == 0)).nonzero().flatten().tolist()
    assert not outside, f"tokens {outside} lie outside the allowed set"
    statistic, df = chi_square(counts, want)
    assert chi_square_p_value(statistic, df) > ALPHA, (statistic, df, counts, want * n)
    # Power: the same draws reject a 5% error in the temperature and a top-k off by one (either way, where that
    # changes the distribution): a drawn token the wrong distribution does not allow, or a p-value below ALPHA.
    wrong = {"temperature": (t * 1.05, k)} | ({"k - 1": (t, k - 1), "k + 1": (t, k + 1)} if k else {})
    for name, (t2, k2) in wrong.items():
        other = filtered_softmax(DIST_LOGITS, t2, k2, top_p, min_p)
        if torch.equal(other, want):
            assert name != "temperature"
        elif not ((counts > 0) & (other == 0)).any():
            statistic, df = chi_square(counts, other)
            assert chi_square_p_value(statistic, df) < ALPHA, f"{case}: the draws cannot tell a wrong {name}"


def test_chi_square_p_value_matches_known_quantiles():
    # Tabulated quantiles (df 1 at p 0.05, df 10 at p 0.01), and for even df the closed form
    # Q(df / 2, x / 2) = exp(-x / 2) * sum_{i < df / 2} (x / 2)**i / i!, in the series and the fraction regimes.
    assert abs(chi_square_p_value(3.841459, 1) - 0.05) < 1e-6
    assert abs(chi_square_p_value(23.209251, 10) - 0.01) < 1e-6
    for df, x in ((2, 12.0), (4, 0.5), (20, 60.0), (30, 10.0), (16, 90.0)):
        exact = math.exp(-x / 2) * sum((x / 2) ** i / math.factorial(i) for i in range(df // 2))
        assert abs(chi_square_p_value(x, df) - exact) <= 1e-10 * exact, (df, x)


# --------------------------------------------------------------------------------------------------------------
# Pinned semantics
# --------------------------------------------------------------------------------------------------------------


def draws(logits_row, n=4000, t=1.0, k=0, top_p=1.0, min_p=0.0, use_top_k=True, use_top_p=True, seed=7):
    """The set of tokens drawn from one row over ``n`` counters."""
    v = logits_row.numel()
    full = lambda value, dtype: torch.full((n,), value, dtype=dtype)  # noqa: E731
    tokens = ce.sample(logits_row.expand(n, v), full(t, torch.float32), full(k, torch.int64),
                       full(top_p, torch.float32), full(min_p, torch.float32), full(seed, torch.int64),
                       torch.arange(n), use_top_k, use_top_p)
    return set(tokens.tolist())


def exact_quarter_logit() -> float:
    """An fp32 y near -log(4) with exp_ce(y) == 0.25 exactly (so top-p masses are exact binary fractions)."""
    y = torch.tensor(-math.log(4.0), dtype=torch.float32)
    for _ in range(64):
        e = exp_ce(y).item()
        if e == 0.25:
            return y.item()
        y = torch.nextafter(y, torch.tensor(-math.inf if e > 0.25 else math.inf))
    raise AssertionError("no fp32 y with exp_ce(y) == 0.25 near -log 4")


def test_top_k_keeps_every_tie_of_the_kth_largest():
    row = torch.tensor([5.0, 3.0, 1.0, 3.0, 3.0, -2.0])
    assert draws(row, t=3.0, k=2) == {0, 1, 3, 4}
    assert draws(row, t=3.0, k=4) == {0, 1, 3, 4}
    assert draws(row, t=3.0, k=5) == {0, 1, 2, 3, 4}
    assert draws(row, t=3.0, k=6) == draws(row, t=3.0, k=60) == draws(row, t=3.0, k=0) == set(range(6))
    assert draws(row, t=3.0, k=2, use_top_k=False) == set(range(6))  # the switch overrides top_k


def test_top_p_boundary_is_strict():
    """Masses 1 (token 0) and 4 x 1/4 (tokens 1-4): S = 2, and tokens 1-4 have mass 1 = 0.5 S above them exactly,
    which is not < top_p * S at top_p = 0.5 (dropped), and is at any larger top_p (kept). (Token 5, e**-30: its
    fixed-point weight is 0, and it is too unlikely to be drawn.)"""
    q = exact_quarter_logit()
    row = torch.tensor([0.0, q, q, q, q, -30.0])
    assert draws(row, top_p=0.5) == {0}
    assert draws(row, top_p=0.5000001) == {0, 1, 2, 3, 4}
    assert draws(row, top_p=0.5, use_top_p=False) == {0, 1, 2, 3, 4}
    assert draws(row, top_p=0.6, k=3) == {0, 1, 2, 3, 4}  # top-k first (ties: 5 tokens), S = 2 still
    assert draws(row, top_p=0.5, k=3) == {0}
    assert draws(row, top_p=0.2, k=1) == {0}


def test_min_p_boundary_is_inclusive():
    """A token whose y equals log(min_p) exactly is kept; one ulp below, dropped."""
    min_p = torch.tensor([0.3], dtype=torch.float32)
    y = log_ce(min_p).item()
    below = torch.nextafter(torch.tensor(y), torch.tensor(-math.inf)).item()
    row = torch.tensor([0.0, y, below, -0.1])
    assert draws(row, min_p=min_p.item()) == {0, 1, 3}
    assert draws(row, min_p=1.0) == {0}
    assert draws(torch.tensor([2.0, 2.0, 1.0]), min_p=1.0) == {0, 1}  # ties of the maximum always kept


# (seed, counter) whose noise over 48 tokens has its maximum twice, at tokens 13 and 24: with equal logits their
# Gumbel scores tie exactly.
NOISE_TIE = (5, 1381849, 48, (13, 24))


def test_tied_gumbel_scores_go_to_the_first_index():
    seed, counter, vocab, (first, second) = NOISE_TIE
    u = uniform_noise(torch.tensor([seed]), torch.tensor([counter]), vocab)[0]
    assert u[first] == u[second] == u.max() and (u == u.max()).sum() == 2
    args = (torch.tensor([1.0]), torch.tensor([0]), torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([seed]),
            torch.tensor([counter]))
    assert ce.sample(torch.full((1, vocab), 0.25), *args).item() == first
    logits = torch.full((1, vocab), -1.0)
    logits[0, [first, second]] = 0.5  # ... also as the only two kept tokens (top-k 2)
    assert ce.sample(logits, args[0], torch.tensor([2]), *args[2:]).item() == first


def test_greedy_rows_follow_torch_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [1.0, math.nan, math.inf, math.nan], [-math.inf] * 4,
                           [0.0, -0.0, 0.0, -1.0]])
    n = logits.shape[0]
    zeros = torch.zeros(n)
    tokens = ce.sample(logits, zeros, torch.zeros(n, dtype=torch.long), torch.ones(n), zeros,
                       torch.arange(n), torch.arange(n))
    assert tokens.tolist() == torch.argmax(logits, dim=-1).tolist() == [1, 1, 0, 0]


def test_rows_without_a_finite_maximum_take_their_greedy_token():
    logits = torch.tensor([[-math.inf, -math.inf, -math.inf], [0.0, math.inf, math.inf], [math.nan, -math.inf, 0.5]])
    n = logits.shape[0]
    ones = torch.ones(n)
    tokens = ce.sample(logits, ones, torch.zeros(n, dtype=torch.long), ones, torch.zeros(n), torch.arange(n),
                       torch.arange(n))
    assert tokens.tolist()[:2] == [0, 1]
    assert tokens[2].item() == 2  # the NaN is never drawn in a sampled row (it counts as -inf), 0.5 is the only other
    assert draws(torch.tensor([math.nan, 0.0, 1.0, math.nan]), t=5.0) == {1, 2}


def test_tiny_temperature_and_fp16_bf16_rows():
    row = torch.tensor([1.0, 1.5, 1.5, -3.0])
    assert draws(row, t=1e-30, n=300) == {1, 2}  # (x - m) / T = -inf for the others: ties of the max only
    for dtype in (torch.bfloat16, torch.float16):
        assert draws(row.to(dtype), t=0.5, k=3) == {0, 1, 2}


# --------------------------------------------------------------------------------------------------------------
# Batch invariance and tracing
# --------------------------------------------------------------------------------------------------------------


@given(sampling_cases(max_vocab=40, max_rows=6), st.randoms(use_true_random=False))
def test_a_rows_token_does_not_depend_on_the_batch(case, rng):
    logits, temperature, top_k, top_p, min_p, seeds, counters, use_top_k, use_top_p = case
    tokens = ce.sample(*case)
    rows = logits.shape[0]
    perm = list(range(rows))
    rng.shuffle(perm)
    perm = torch.tensor(perm)
    shuffled = ce.sample(logits[perm], temperature[perm], top_k[perm], top_p[perm], min_p[perm], seeds[perm],
                         counters[perm], use_top_k, use_top_p)
    assert torch.equal(shuffled, tokens[perm])
    for i in range(rows):
        alone = ce.sample(logits[i : i + 1], temperature[i : i + 1], top_k[i : i + 1], top_p[i : i + 1],
                          min_p[i : i + 1], seeds[i : i + 1], counters[i : i + 1], use_top_k, use_top_p)
        assert alone.item() == tokens[i].item()


def test_sample_traces_with_fullgraph_compile():
    """torch.compile(fullgraph=True) traces ce::sample through its fake (no graph break, no host sync) and the
    compiled call returns the eager tokens."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 50, generator=g).to(torch.bfloat16)
    params = (torch.tensor([0.0, 1.0, 0.7, 1.2]), torch.tensor([0, 5, 0, 60]), torch.tensor([1.0, 0.9, 0.5, 1.0]),
              torch.tensor([0.0, 0.0, 0.1, 0.0]), torch.tensor([1, 2, 3, 4]), torch.tensor([9, 8, 7, 6]))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(logits, *params):
        return ce.sample(logits * 2, *params, True, True) + 1

    compiled = torch.compile(step, backend=backend, fullgraph=True)(logits, *params)
    assert torch.equal(compiled, step(logits, *params))
    assert len(graphs) == 1 and "ce.sample" in graphs[0].code
    torch._dynamo.reset()


def test_reference_handles_empty_batches_and_rejects_empty_rows():
    empty = torch.empty(0)
    out = ce.sample(torch.empty(0, 7), empty, empty.long(), empty, empty, empty.long(), empty.long())
    assert out.shape == (0,) and out.dtype == torch.int64
    with pytest.raises(ValueError, match="an empty row has no token"):
        sample_reference(torch.empty(2, 0), torch.ones(2), torch.zeros(2).long(), torch.ones(2), torch.zeros(2),
                         torch.zeros(2).long(), torch.zeros(2).long())

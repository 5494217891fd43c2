"""``ce::sample``: each row's next token, greedy or sampled with temperature, top-k, top-p and min-p, in one op.

Why an op: the torch sampler sorted every row of the vocabulary (248,320 for Qwen3.5) for top-k / top-p, then ran a
softmax, a cumsum, a scatter and ~20 int64 elementwise kernels for the noise, over ``[B, V]`` fp32 tensors. The CUDA
kernels (ops/triton/sample_kernels.py) find every filter's threshold by radix select over the logits and draw with
in-register noise, reading the model-dtype logits a few times and writing nothing of size ``V``.

``ce::sample(logits [B, V], temperature [B] fp32, top_k [B] int64, top_p [B] fp32, min_p [B] fp32, seeds [B] int64,
counters [B] int64, use_top_k=True, use_top_p=True) -> tokens [B] int64``. Logits are bf16, fp16 or fp32; rows may
be strided, columns must be contiguous. ``counters`` is the index of the token being drawn in the request's output.
``use_top_k`` / ``use_top_p`` False means top-k / top-p is off for every row, whatever ``top_k`` / ``top_p`` hold (the
engine knows on the host; the CUDA op then skips those passes).

Semantics, exactly what :func:`sample_reference` computes:

* Greedy rows (``temperature > 0`` is false, e.g. 0): torch.argmax's rule on the raw row: the first index of the
  maximum, a NaN counting as larger than everything.
* Sampled rows work on ``x``: the logits in fp32 with NaN replaced by -inf and -0 by +0. Logits are ordered by
  ``key(x)``: the monotone integer key of the fp32 bits (negative: bitwise not; else: top bit set), shifted right by
  16 for bf16 and 13 for fp16 (those bits are constant for such values: 16, 19 or 32 key bits). Equal keys are equal
  logits: ties.
  - ``m = max x``. A row whose ``m`` is not finite (every logit -inf or NaN, or a +inf) takes its greedy token.
  - ``y = (x - m) * r`` with ``r = 1 / max(temperature, 2**-100)`` (fp32): the scaled logits minus their maximum.
  - top-k (on when ``0 < top_k < V``): keep tokens whose key is >= the k-th largest key (ties at the k-th all kept).
  - top-p (on when ``top_p < 1``), on the top-k-renormalised distribution: with ``W_i = trunc(exp_ce(y_i) * 2**32)``
    (int64) for the top-k tokens and 0 for the others, ``S = sum W``, a token is kept iff the W-mass of the tokens
    with a larger key is ``< top_p * S``, compared in float64 (ties decided together; the largest always kept).
  - min-p (on when ``min_p > 0``): keep tokens with ``y >= log_ce(min_p)``, i.e. ``p_i >= min_p * p_max``.
  - the tokens with the row's largest key are always kept (they pass every filter for valid parameters).
  - the draw: the first index of the maximum, over the kept tokens, of the Gumbel score ``y_i - log_ce(E_i)`` with
    ``E_i = -log_ce(U_i)`` and ``U_i`` :func:`uniform_noise` of (seed, counter, i): argmax of ``y_i + g_i`` with
    Gumbel noise ``g_i = -log(-log U_i)`` is a draw from softmax(y) over the kept tokens (the exponential race).
    The noise is a pure function of (seed, counter, vocab id): a row's token never depends on the rest of the batch.
  Every filter keeps "key >= a threshold" (``y`` is monotone in ``x``), which is what lets the kernels select
  thresholds instead of sorting.

``exp_ce`` / ``log_ce`` are Cephes' expf / logf (polynomials after an exact range reduction on the fp32 bits),
written out in IEEE fp32 adds and multiplies: the CPU reference and the GPU kernel (built without FMA contraction)
compute them bit for bit alike, so the kernel draws exactly the reference's token, ties and boundaries included, where
the libraries' exp/log differ by an ulp between devices. ``exp_ce(y)`` is 0 below ``y = -80`` (a probability under
e**-80 of the maximum's), so such a token is never drawn. Masses are integers, so their sums do not depend on the
summation order. Bit-exact agreement assumes no fp32 subnormal intermediates (logits of magnitude >= 2**-100 or 0).
"""

from __future__ import annotations

import torch

from ops.layouts import EXP_CUTOFF, KEY_SHIFT, MASS_SCALE, MIN_TEMPERATURE
from ops.library import define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the reference serves CUDA too (ops/triton/__init__.py)
    from ops.triton import sample_kernels

# --------------------------------------------------------------------------------------------------------------
# Counter-based noise: splitmix64 of (seed, counter, vocab id)
# --------------------------------------------------------------------------------------------------------------

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # signed int64 views of the splitmix64 constants
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _logical_shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (64 - bits)) - 1)  # torch's >> on int64 is arithmetic


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    x = x + _GOLDEN
    x = (x ^ _logical_shift_right(x, 30)) * _MIX1
    x = (x ^ _logical_shift_right(x, 27)) * _MIX2
    return x ^ _logical_shift_right(x, 31)


def uniform_noise(seeds: torch.Tensor, counters: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """U(0, 1) noise ``[B, vocab]`` that depends only on (seed, counter, vocab id)."""
    vocab = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    row = _splitmix64(_splitmix64(seeds.long()) ^ counters.long())
    # Top 23 bits: (bits + 0.5) / 2**23 is exact in fp32 and at most 1 - 2**-24 < 1. With 24 bits the largest value
    # rounded to 1.0, so E = -log(U) was 0 and p / E inf or NaN: that token won whatever its probability (even a
    # filtered or suppressed one), in ~1.5% of the draws at a 248k vocabulary.
    bits = _logical_shift_right(_splitmix64(row[:, None] ^ vocab[None, :] * _GOLDEN), 41)
    return (bits.float() + 0.5) * (1.0 / (1 << 23))


# --------------------------------------------------------------------------------------------------------------
# Keys and the fp32 exp / log both implementations share (the kernels spell out the same operations)
# --------------------------------------------------------------------------------------------------------------

NEG_INF_BITS = -8388608  # 0xFF800000 as int32: -inf
SIGN_BIT = -(2**31)  # 0x80000000 as int32: -0.0

# Cephes expf: exp(y) = 2**n * exp(r), n = floor(y log2(e) + 1/2), r = y - n ln2 (ln2 in two parts: n * _LN2_HI is
# exact); exp(r) = 1 + r + r**2 * P(r) on |r| <= ln2 / 2.
_LOG2E = 1.44269504088896341
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# Cephes logf: log(x) = e ln2 + log(1 + f), 1 + f = the mantissa in [sqrt(1/2), sqrt(2)] (f exact);
# log(1 + f) = f - f**2 / 2 + f**3 Q(f).
_SQRT2_BITS = 0x3FB504F3  # fp32 bits of sqrt(2): mantissas above it are halved
_LOG_Q = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
          2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)


def exp_ce(y: torch.Tensor) -> torch.Tensor:
    """fp32 ``exp(y)`` for ``y <= 0`` (or -inf), 0 below :data:`EXP_CUTOFF`; the kernels' ``_exp_ce`` op for op."""
    yc = torch.clamp(y, min=EXP_CUTOFF)
    n = torch.floor(yc * _LOG2E + 0.5)
    r = yc - n * _LN2_HI
    r = r - n * _LN2_LO
    z = r * r
    p = torch.full_like(r, _EXP_P[0])
    for c in _EXP_P[1:]:
        p = p * r + c
    e = p * z + r + 1.0
    scale = ((n.to(torch.int32) + 127) << 23).view(torch.float32)
    return torch.where(y < EXP_CUTOFF, 0.0, e * scale)


def log_ce(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``log(x)`` for positive finite ``x``; the kernels' ``_log_ce`` op for op."""
    bits = x.view(torch.int32)
    e = (bits >> 23) - 127
    mbits = (bits & 0x7FFFFF) | 0x3F800000
    big = mbits > _SQRT2_BITS
    mbits = torch.where(big, mbits - 0x800000, mbits)
    e = e + big.to(torch.int32)
    f = mbits.view(torch.float32) - 1.0
    z = f * f
    q = torch.full_like(f, _LOG_Q[0])
    for c in _LOG_Q[1:]:
        q = q * f + c
    y = q * f * z
    ef = e.to(torch.float32)
    y = y + ef * _LN2_LO
    y = y - 0.5 * z
    return f + y + ef * _LN2_HI


def sanitized_keys(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``x``: fp32 logits with NaN -> -inf and -0 -> +0, ``key(x)`` int64 shifted for the logits' dtype)."""
    bits = logits.float().view(torch.int32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    bits = torch.where(nan, NEG_INF_BITS, bits)
    bits = torch.where(bits == SIGN_BIT, 0, bits)
    wide = bits.long()
    key = torch.where(wide >= 0, wide + 2**31, -1 - wide)  # the unsigned monotone key of the 32 bits
    return bits.view(torch.float32), key >> KEY_SHIFT[logits.dtype]


# --------------------------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------------------------


def sample_reference(
    logits: torch.Tensor,  # [B, V] bf16 / fp16 / fp32
    temperature: torch.Tensor,  # [B] fp32; > 0 samples
    top_k: torch.Tensor,  # [B] int64; on when 0 < top_k < V
    top_p: torch.Tensor,  # [B] fp32; on when < 1
    min_p: torch.Tensor,  # [B] fp32; on when > 0
    seeds: torch.Tensor,  # [B] int64
    counters: torch.Tensor,  # [B] int64
    use_top_k: bool = True,
    use_top_p: bool = True,
) -> torch.Tensor:
    if logits.dim() != 2 or logits.dtype not in KEY_SHIFT:
        raise ValueError(f"sample: logits must be [B, V] bf16/fp16/fp32, got {tuple(logits.shape)} {logits.dtype}")
    rows, vocab = logits.shape
    if rows == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    if vocab == 0:
        raise ValueError("sample: an empty row has no token")
    greedy = torch.argmax(logits, dim=-1)
    kept, sampled = filtered_scaled_logits(logits, temperature, top_k, top_p, min_p, use_top_k, use_top_p)
    exponential = -log_ce(uniform_noise(seeds, counters, vocab))
    drawn = (kept - log_ce(exponential)).argmax(dim=-1)
    return torch.where(sampled, drawn, greedy)


def filtered_scaled_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    use_top_k: bool = True,
    use_top_p: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The distribution a sampled row of ``ce::sample`` draws from, as logits: ``(kept [B, V] fp32, sampled [B]
    bool)``, ``kept`` being ``y`` (the scaled logits minus their maximum) where the filters keep the token and -inf
    elsewhere, ``sampled`` the rows that sample (temperature > 0 and a finite maximum; the others take their greedy
    token). ``softmax(kept)`` is the row's distribution (speculative decoding's rejection sampler reads it)."""
    vocab = logits.shape[1]
    x, key = sanitized_keys(logits)
    m = x.max(dim=-1, keepdim=True).values
    key_max = key.max(dim=-1, keepdim=True).values
    r = torch.ones_like(temperature) / torch.clamp(temperature, min=MIN_TEMPERATURE)
    y = (x - m) * r[:, None]

    # top-k: the k-th largest key.
    k_on = (top_k > 0) & (top_k < vocab) & use_top_k
    k = torch.where(k_on, top_k, vocab)
    descending = key.sort(dim=-1, descending=True).values
    keep = key >= descending.gather(1, (k - 1)[:, None])

    # top-p: the W-mass of the kept tokens with a larger key, against top_p * S, in float64.
    weight = torch.where(keep, (exp_ce(y) * MASS_SCALE).long(), 0)
    total = weight.sum(dim=-1, keepdim=True)
    ascending, order = key.sort(dim=-1)
    below = torch.cat([torch.zeros_like(total), weight.gather(1, order).cumsum(dim=-1)], dim=-1)
    at_most = below.gather(1, torch.searchsorted(ascending, key + 1))  # W-mass of keys <= key_i
    larger = total - at_most
    p_on = (top_p < 1) & use_top_p
    keep_p = larger.double() < top_p.double()[:, None] * total.double()
    keep &= keep_p | ~p_on[:, None]

    # min-p: y >= log(min_p).
    m_on = min_p > 0
    log_min_p = log_ce(torch.where(m_on, min_p, 1.0))
    keep &= (y >= log_min_p[:, None]) | ~m_on[:, None]
    keep |= key == key_max
    sampled = (temperature > 0) & torch.isfinite(m[:, 0])
    return y.masked_fill(~keep, float("-inf")), sampled


def _sample_fake(logits, temperature, top_k, top_p, min_p, seeds, counters, use_top_k=True, use_top_p=True):
    return logits.new_empty((logits.shape[0],), dtype=torch.long)


sample_op = define_op(
    "sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, Tensor seeds, "
    "Tensor counters, bool use_top_k=True, bool use_top_p=True) -> Tensor",
    reference=sample_reference,
    cuda=sample_kernels.sample if HAVE_TRITON else None,
    fake=_sample_fake,
)

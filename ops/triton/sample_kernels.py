"""Triton kernels for ``ce::sample`` (semantics: ops/sample.py): radix select of each filter's threshold, then one
Gumbel-max draw, with no sort and nothing of size ``V`` written.

Every filter keeps the tokens whose key (the monotone integer key of the logit) is >= a threshold. The top-k and
top-p thresholds are found by radix select, 4 key bits per pass: a pass counts, for the 16 candidate thresholds
``prefix + d << shift`` (d = 0..15), the tokens (top-k) or the fixed-point softmax mass (top-p) with a key >= the
candidate; the largest candidate still reaching k (or ``top_p * S``) becomes the next prefix. A pass only looks at
the keys inside the current interval ``[prefix, prefix + 16 << shift)`` (what lies above it is carried as a sum), so
it skips the candidate arithmetic on blocks with no key inside. Keys have 16 bits (bf16), 19 (fp16) or 32 (fp32):
4, 5 or 8 passes per filter. Min-p is a per-token test (``y >= log(min_p)``) in the last pass.

Each row is cut into CHUNK-wide pieces (4,096 or 16,384 logits, by ``sample``'s rule), one program each, and every
pass is one launch over ``(B, chunks)``:
  1. ``_scan``: each chunk's greedy winner (torch.argmax's rule, as ``ce::argmax``), its largest key, and the largest
     key of each BLOCK of the row (the block maxima);
  2. ``_radix`` (launched once per top-k pass, then once per top-p pass): every program first sums its row's
     partials of the previous pass and takes the radix decision (all programs of a row take the same one; chunk 0
     stores it for the next launch), then writes its chunk's partials of this pass;
  3. ``_final``: the last decision, then each chunk's winner of the Gumbel score among its kept tokens (the noise
     is computed in registers: splitmix64 in uint64, Cephes log in fp32);
  4. ``_reduce`` (grid ``(B,)``): the row's winner among the chunk winners, or its greedy token.

The row path: after the scan, ``_row`` (grid ``(B,)``, one program a row) decides every sampled top-k row whose
candidates fit ROW_CANDIDATES: the tokens at or above top-k's bound (below), ~k on rows of independent logits. It
gathers them, finds both thresholds bit by bit over them in registers and draws, and marks the row handled; the radix
passes, ``_final`` and ``_reduce`` skip handled rows and decide the others (greedy rows, large k, wide ties). For the
serving defaults (top-k 20-50) a step's sampling is then the scan and one program a row, instead of 8-9 passes of
``(B, chunks)`` programs that each pay a row decision and a launch. A top-p row without top-k takes the row path with
an implicit k (TOP_P_CANDIDATES_K) when those candidates hold ``top_p * S`` of its mass, S coming from ``_mass`` (one
pass over the row: an exp and an integer add a logit): a language model's nucleus is usually a few tokens, where the
radix passes would compute 16 candidate masses for every logit of the row four times.

Block skipping: a pass loads a block's logits only if the block's maximum key says it can matter, so with top-k on
the passes after the scan touch about k blocks a row instead of all of them:
  - top-k's first pass finds the bound ``L``, the k-th largest block maximum (or 0 with fewer than k blocks): the k
    largest block maxima are k distinct tokens with keys >= ``L``, so top-k's threshold is >= ``L``. A skipped block
    holds only keys < ``L``: for a candidate <= ``L`` the count stays >= k either way, and a candidate above ``L``
    is counted exactly, so every decision equals the unskipped one;
  - top-p passes skip blocks below top-k's threshold or whose largest mass is 0 (``y < -80``): they add nothing;
  - every pass skips blocks below its interval; the draw skips blocks with no kept token (y is monotone in the key).
Each program first lists its chunk's live blocks (``_compact``), then loops over exactly those.
Cost per row, V logits of s bytes: the scan reads ``V * s`` bytes (4.5 MB at V = 248,320 in bf16); with top-k on, the
4 (bf16) to 8 (fp32) passes per filter and the draw read the block maxima and the few live blocks; without top-k, the
top-p passes read every block with mass (the candidate arithmetic, 16 compares and adds and an exp per logit,
dominates) and the draw computes the noise of every logit not filtered by min-p. Launches: 1 + (1 mass) + (1 row) +
(4 top-k) + (4 top-p) + 1 + 1 in bf16; ``use_top_k`` / ``use_top_p`` False drop their passes (the mass pass goes
with top-p; the row kernel runs with either).

Exactness: the kernels perform the reference's fp32 operations in the same order, are compiled without FMA
contraction (``enable_fp_fusion=False``), divide with ``div_rn``, and sum integer masses, so they return the
reference's token, bit for bit. All kernels are PDL launches (ops/triton/pdl.py) that wait before any load.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.layouts import EXP_CUTOFF, KEY_SHIFT, MASS_SCALE, MIN_TEMPERATURE
from ops.triton.argmax_kernels import _row_winner, _winner
from ops.triton.pdl import pdl_flags

SMALL_CHUNK, LARGE_CHUNK = 4096, 16384  # logits per program (61 or 16 programs a row at V = 248,320)
MANY_PROGRAMS = 2048  # a pass with more programs than this at SMALL_CHUNK uses LARGE_CHUNK
BLOCK = 256  # logits per step inside a program ([BLOCK, 16] candidate tiles)
MAX_VOCAB = 1 << 21  # masses: V * 2**32 < 2**53, exact in float64
MAX_CHUNKS = 512
STATE = 8  # a radix search's per-row state: prefix, mass (or count) above the interval, top-p's S, top-k's threshold,
# top-k's bound (fields 5-7 unused: a power of two for tl.arange)
MAX_BLOCKS = 8192  # block maxima a row (one program's tile when it finds the bound)
# The row path (``_sample_row_kernel``): a sampled top-k row with at most ROW_CANDIDATES tokens at or above its bound
# is decided by one program over those tokens (~k on rows of independent logits); GATHER logits a step when it
# collects them.
ROW_CANDIDATES = 1024
GATHER = 4096
# A top-p row without top-k takes the row path with this implicit k when its candidates (the tokens at or above that
# k's bound) hold top_p of the row's mass: the usual case for a language model's peaked distribution.
TOP_P_CANDIDATES_K = 256

# Globals the kernels read must be constexpr.
_STATE = tl.constexpr(STATE)
_BIG = tl.constexpr(2147483647)  # "no index"
_EXP_CUTOFF = tl.constexpr(EXP_CUTOFF)
_MASS_SCALE = tl.constexpr(MASS_SCALE)
_MIN_TEMPERATURE = tl.constexpr(MIN_TEMPERATURE)


# --------------------------------------------------------------------------------------------------------------
# Helpers: keys, exp / log (ops/sample.py's exp_ce / log_ce, operation for operation), noise
# --------------------------------------------------------------------------------------------------------------


@triton.jit
def _sanitized(raw):
    """(x, key32): fp32 logits with NaN -> -inf and -0 -> +0, and the unsigned monotone key of their bits."""
    bits = raw.to(tl.float32).to(tl.int32, bitcast=True)
    bits = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, -8388608, bits)
    bits = tl.where(bits == -2147483648, 0, bits)
    wide = bits.to(tl.int64)
    key = tl.where(wide >= 0, wide + 2147483647 + 1, -1 - wide)
    return bits.to(tl.float32, bitcast=True), key


@triton.jit
def _float_of_key(key):
    """The fp32 value whose 32-bit key is ``key`` (int64)."""
    bits = tl.where(key > 2147483647, key - 2147483647 - 1, -1 - key)
    return bits.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _exp_ce(y):
    yc = tl.maximum(y, _EXP_CUTOFF)
    n = tl.floor(yc * 1.44269504088896341 + 0.5)
    r = yc - n * 0.693359375
    r = r - n * -2.12194440e-4
    z = r * r
    p = r * 0.0 + 1.9875691500e-4
    p = p * r + 1.3981999507e-3
    p = p * r + 8.3334519073e-3
    p = p * r + 4.1665795894e-2
    p = p * r + 1.6666665459e-1
    p = p * r + 5.0000001201e-1
    e = p * z + r + 1.0
    scale = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(y < _EXP_CUTOFF, 0.0, e * scale)


@triton.jit
def _log_ce(x):
    bits = x.to(tl.int32, bitcast=True)
    e = (bits >> 23) - 127
    mbits = (bits & 0x7FFFFF) | 0x3F800000
    big = mbits > 0x3FB504F3
    mbits = tl.where(big, mbits - 0x800000, mbits)
    e = e + big.to(tl.int32)
    f = mbits.to(tl.float32, bitcast=True) - 1.0
    z = f * f
    q = f * 0.0 + 7.0376836292e-2
    q = q * f + -1.1514610310e-1
    q = q * f + 1.1676998740e-1
    q = q * f + -1.2420140846e-1
    q = q * f + 1.4249322787e-1
    q = q * f + -1.6668057665e-1
    q = q * f + 2.0000714765e-1
    q = q * f + -2.4999993993e-1
    q = q * f + 3.3333331174e-1
    y = q * f * z
    ef = e.to(tl.float32)
    y = y + ef * -2.12194440e-4
    y = y - 0.5 * z
    return f + y + ef * 0.693359375


@triton.jit
def _splitmix64(x):
    """splitmix64 of uint64 ``x`` (ops/sample.py's ``_splitmix64``; uint64: wrapping products, logical shifts)."""
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


# --------------------------------------------------------------------------------------------------------------
# Row-level pieces: the row's maximum, the radix decision
# --------------------------------------------------------------------------------------------------------------


@triton.jit
def _row_max_key(chunk_max, row, num_chunks, CHUNKS_P: tl.constexpr):
    offs = tl.arange(0, CHUNKS_P)
    return tl.max(tl.load(chunk_max + row * num_chunks + offs, mask=offs < num_chunks, other=0), 0)


@triton.jit
def _row_params(temperature, top_k, top_p, chunk_max, row, num_chunks, CHUNKS_P: tl.constexpr):
    """(t, k, p, the row's largest 32-bit key, its value m (NaN counted as -inf), whether m is finite): what every
    kernel after the scan first reads of its row."""
    t = tl.load(temperature + row)
    k = tl.load(top_k + row)
    p = tl.load(top_p + row)
    key_max32 = _row_max_key(chunk_max, row, num_chunks, CHUNKS_P)
    m = _float_of_key(key_max32)
    return t, k, p, key_max32, m, (m > float("-inf")) & (m < float("inf"))


@triton.jit
def _decide(part, state, row, num_chunks, shift, k, top_p,
            MASS: tl.constexpr, FROM_START: tl.constexpr, CHUNKS_P: tl.constexpr):
    """The radix decision after a pass whose digit sat at ``shift``: (prefix, above, total), from that pass's
    partials ``[chunks, 16]`` and the state it ran with. The target: ``k`` tokens, or (MASS) ``top_p * S`` of mass.
    ``FROM_START``: that pass was top-p's first, whose candidate 0 summed S (the whole top-k mass)."""
    c = tl.arange(0, CHUNKS_P)
    j = tl.arange(0, 16)
    p = tl.load(part + (row * num_chunks + c[:, None]) * 16 + j[None, :], mask=(c < num_chunks)[:, None], other=0)
    tot = tl.sum(p, 0)  # [16]: the sum inside the interval over keys >= candidate j
    prefix = tl.load(state + row * _STATE)
    above = tl.load(state + row * _STATE + 1)
    if FROM_START:
        total = tl.sum(tl.where(j == 0, tot, 0), 0)
    else:
        total = tl.load(state + row * _STATE + 2)
    ge = above + tot
    if MASS:
        ok = ge.to(tl.float64) >= top_p.to(tl.float64) * total.to(tl.float64)
    else:
        ok = ge >= k
    d = tl.max(tl.where(ok, j, 0), 0)  # candidate 0 always qualifies
    above = above + tl.sum(tl.where(j == d + 1, tot, 0), 0)
    prefix = prefix + (d.to(tl.int64) << shift)
    return prefix, above, total


@triton.jit
def _candidate_sums(values, key, inside, prefix, shift):
    """[16]: the sum of ``values`` over the ``inside`` lanes whose key is >= candidate ``prefix + j << shift``."""
    j = tl.arange(0, 16)
    d = ((key - prefix) >> shift).to(tl.int32)
    hit = inside[:, None] & (d[:, None] >= j[None, :])
    return tl.sum(tl.where(hit, values[:, None], 0), 0)


@triton.jit
def _chunk_blocks(block_max, row, chunk, num_blocks, NBC: tl.constexpr):
    """(the chunk's block indices [NBC], their maximum keys, in range) for its NBC = CHUNK / BLOCK blocks."""
    blocks = chunk * NBC + tl.arange(0, NBC)
    valid = blocks < num_blocks
    return blocks, tl.load(block_max + row * num_blocks + blocks, mask=valid, other=0), valid


@triton.jit
def _compact(live, blocks, live_list, base, NBC: tl.constexpr):
    """Write the ``live`` blocks' indices to ``live_list[base:]`` in order and return how many there are: the pass
    then loops over exactly those, with no per-block test (a scalar load and branch per block, 16-64 of them in a
    row, was a chain of dependent memory latencies in every program)."""
    flags = live.to(tl.int32)
    tl.store(live_list + base + tl.cumsum(flags, 0) - 1, blocks, mask=live)
    tl.debug_barrier()  # the stores above are visible to every thread of the program
    return tl.sum(flags, 0)


@triton.jit
def _kth_largest_block_key(block_max, row, num_blocks, k, SHIFT: tl.constexpr, KEY_BITS: tl.constexpr,
                           BLOCKS_P: tl.constexpr):
    """The k-th largest of the row's block maxima (keys shifted by SHIFT), 0 when the row has fewer than k blocks:
    top-k's bound. The k largest block maxima are k distinct tokens with a key >= it, so top-k's threshold is >= it.
    The largest key T with at least k block maxima >= T."""
    offs = tl.arange(0, BLOCKS_P)
    keys = tl.load(block_max + row * num_blocks + offs, mask=offs < num_blocks, other=0) >> SHIFT
    return _largest_key_reaching(keys, tl.full([BLOCKS_P], 1, tl.int32), k.to(tl.float64), KEY_BITS)


@triton.jit
def _largest_key_reaching(keys, weights, target, KEY_BITS: tl.constexpr):
    """The largest T whose weight of ``keys >= T`` (summed exactly, compared in float64) reaches ``target``, bit by
    bit from the top (0 if none above does): the k-th largest key for unit weights and target k, top-p's threshold
    for masses and target ``top_p * S``. Keys below 0 never count."""
    found = tl.full([], 0, tl.int64)
    for b in tl.static_range(KEY_BITS - 1, -1, -1):
        candidate = found | (1 << b)
        reached = tl.sum(tl.where(keys >= candidate, weights, 0), 0).to(tl.float64) >= target
        found = tl.where(reached, candidate, found)
    return found


# --------------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------------


@triton.jit
def _sample_scan_kernel(logits, stride_row, V, num_chunks, num_blocks, greedy_value, greedy_index, chunk_max, block_max,
                        CHUNK: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the logits are the previous kernel's output
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    best_value = tl.full([], float("-inf"), tl.float32)
    best_index = tl.full([], _BIG, tl.int32)
    key_max = tl.full([], 0, tl.int64)
    for start in tl.range(chunk * CHUNK, chunk * CHUNK + CHUNK, BLOCK):
        if start < V:
            offs = start + tl.arange(0, BLOCK)
            mask = offs < V
            raw = tl.load(logits + row * stride_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
            value, index = _winner(raw, offs, mask)
            # Blocks come in index order: a later block wins only with a larger value, or the first NaN.
            value_nan = value != value
            best_nan = best_value != best_value
            take = (best_index == _BIG) | (value_nan & ~best_nan) | (~best_nan & (value > best_value))
            best_value = tl.where(take, value, best_value)
            best_index = tl.where(take, index, best_index)
            _, key32 = _sanitized(raw)
            block_key = tl.max(tl.where(mask, key32, 0), 0)
            tl.store(block_max + row * num_blocks + start // BLOCK, block_key)
            key_max = tl.maximum(key_max, block_key)
    slot = row * num_chunks + chunk
    tl.store(greedy_value + slot, best_value)
    tl.store(greedy_index + slot, best_index)
    tl.store(chunk_max + slot, key_max)


@triton.jit
def _sample_mass_kernel(logits, stride_row, V, temperature, top_k, top_p, num_chunks, chunk_max, mass_part,
                        USE_TOP_K: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, CHUNKS_P: tl.constexpr,
                        USE_PDL: tl.constexpr):
    """Each chunk's part of S, the whole row's W-mass (``sum trunc(exp_ce(y) * 2**32)``), for the sampled rows with
    top-p on and top-k off: the row path takes such a row when its candidates hold ``top_p * S`` (0 elsewhere)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    t, k, p, key_max32, m, finite = _row_params(temperature, top_k, top_p, chunk_max, row, num_chunks, CHUNKS_P)
    topk_on = (k > 0) & (k < V) & USE_TOP_K
    total = tl.zeros([BLOCK], tl.int64)
    if (t > 0) & finite & (p < 1) & ~topk_on:
        r = tl.div_rn(1.0, tl.maximum(t, _MIN_TEMPERATURE))
        for start in tl.range(chunk * CHUNK, chunk * CHUNK + CHUNK, BLOCK):
            if start < V:
                offs = start + tl.arange(0, BLOCK)
                raw = tl.load(logits + row * stride_row + offs, mask=offs < V, other=float("-inf"))
                x, _ = _sanitized(raw)
                total += (_exp_ce((x - m) * r) * _MASS_SCALE).to(tl.int64)
    tl.store(mass_part + row * num_chunks + chunk, tl.sum(total, 0))


@triton.jit
def _sample_row_kernel(logits, stride_row, V, temperature, top_k, top_p, min_p, seeds, counters, num_chunks, chunk_max,
                       num_blocks, block_max, live_list, live_stride, cand_x, cand_i, mass_part, handled, out,
                       SHIFT: tl.constexpr, KEY_BITS: tl.constexpr, USE_TOP_K: tl.constexpr, USE_TOP_P: tl.constexpr,
                       IMPLICIT_K: tl.constexpr, BLOCK: tl.constexpr, GATHER: tl.constexpr, CAND: tl.constexpr,
                       CHUNKS_P: tl.constexpr, BLOCKS_P: tl.constexpr, USE_PDL: tl.constexpr):
    """A sampled top-k row's whole decision in one program, when few tokens can be in its top k (the row path).

    Every token of the top k has a key >= the bound ``L`` (the k-th largest block maximum), and a block whose
    maximum is below ``L`` holds none, so the row's candidates are the tokens >= ``L`` of the blocks whose maximum
    reaches it: ~k of them on a row of independent logits. The program gathers them (their logits and vocabulary ids)
    into ``cand_x`` / ``cand_i``, then finds top-k's threshold (the k-th largest key), top-p's (the largest key whose
    mass of keys >= it still reaches ``top_p * S``) bit by bit over the candidates held in registers, and draws among
    the kept ones: the operations and the decisions of the radix passes and ``_final``, on the tokens that can matter.
    A top-p row without top-k is taken the same way with k = IMPLICIT_K when its candidates hold ``top_p * S`` of
    the row's mass (S from ``_mass``): then top-p's threshold is at or above the bound, and every token it keeps is a
    candidate. It writes the token and ``handled[row] = 1``; rows it does not take (greedy, neither filter, more than
    CAND candidates, a top-p set past the candidates) get ``handled[row] = 0`` and go through the radix passes, which
    skip the handled rows."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    t, k, p, key_max32, m, finite = _row_params(temperature, top_k, top_p, chunk_max, row, num_chunks, CHUNKS_P)
    done = 0
    topk_on = (k > 0) & (k < V) & USE_TOP_K
    implicit = (p < 1) & ~topk_on & USE_TOP_P  # top-p alone: candidates of an implicit k
    if (t > 0) & finite & (topk_on | implicit):
        kk = tl.where(topk_on, k, IMPLICIT_K)
        bound = _kth_largest_block_key(block_max, row, num_blocks, kk, SHIFT, KEY_BITS, BLOCKS_P)
        blocks = tl.arange(0, BLOCKS_P)
        block_keys = tl.load(block_max + row * num_blocks + blocks, mask=blocks < num_blocks, other=0) >> SHIFT
        live = (blocks < num_blocks) & (block_keys >= bound)
        base = row * live_stride
        num_live = _compact(live, blocks, live_list, base, BLOCKS_P)
        if num_live <= CAND:  # each live block holds a candidate (its maximum): more cannot fit
            # Gather, GATHER logits (GATHER // BLOCK live blocks) at a time, in vocabulary order.
            lane = tl.arange(0, GATHER)
            count = tl.full([], 0, tl.int32)
            for first in range(0, num_live, GATHER // BLOCK):
                slot = first + lane // BLOCK
                in_list = slot < num_live
                block = tl.load(live_list + base + slot, mask=in_list, other=0).to(tl.int32)
                offs = block * BLOCK + lane % BLOCK
                mask = in_list & (offs < V)
                raw = tl.load(logits + row * stride_row + offs, mask=mask, other=float("-inf"))
                x, key32 = _sanitized(raw)
                take = mask & ((key32 >> SHIFT) >= bound)
                flags = take.to(tl.int32)
                at = count + tl.cumsum(flags, 0) - 1
                fits = take & (at < CAND)
                tl.store(cand_x + row * CAND + at, x, mask=fits)
                tl.store(cand_i + row * CAND + at, offs, mask=fits)
                count += tl.sum(flags, 0)
            if count <= CAND:
                tl.debug_barrier()  # the stores above are visible to every thread of the program
                c = tl.arange(0, CAND)
                valid = c < count
                x = tl.load(cand_x + row * CAND + c, mask=valid, other=float("-inf"))
                index = tl.load(cand_i + row * CAND + c, mask=valid, other=_BIG)
                _, key32 = _sanitized(x)
                key = tl.where(valid, key32 >> SHIFT, -1)
                # top-k's threshold: the largest T with at least k keys >= T (0: top-k off, every token).
                threshold = tl.full([], 0, tl.int64)
                if topk_on:
                    threshold = _largest_key_reaching(key, tl.full([CAND], 1, tl.int32), k.to(tl.float64), KEY_BITS)
                r = tl.div_rn(1.0, tl.maximum(t, _MIN_TEMPERATURE))
                y = (x - m) * r
                ok = tl.full([], 1, tl.int32)
                if USE_TOP_P:
                    if p < 1:  # the largest T whose mass of keys >= T reaches top_p * S, over the top-k tokens
                        w = tl.where(key >= threshold, (_exp_ce(y) * _MASS_SCALE).to(tl.int64), 0)
                        held = tl.sum(w, 0)
                        if implicit:  # S is the whole row's; the candidates must hold top_p of it
                            offs = tl.arange(0, CHUNKS_P)
                            total = tl.sum(tl.load(mass_part + row * num_chunks + offs, mask=offs < num_chunks,
                                                   other=0), 0)
                        else:
                            total = held
                        target = p.to(tl.float64) * total.to(tl.float64)
                        threshold = tl.maximum(threshold, _largest_key_reaching(key, w, target, KEY_BITS))
                        if implicit:
                            ok = tl.where(held.to(tl.float64) >= target, 1, 0)  # else top-p's set is wider
                key_max = key_max32 >> SHIFT
                threshold = tl.minimum(threshold, key_max)
                mp = tl.load(min_p + row)
                min_p_on = mp > 0  # off: every y passes (y >= -inf)
                log_min_p = tl.where(min_p_on, _log_ce(tl.where(min_p_on, mp, 1.0)), float("-inf"))
                kept = valid & (key >= threshold) & ((y >= log_min_p) | (key == key_max))
                seed = tl.load(seeds + row).to(tl.uint64, bitcast=True)
                counter = tl.load(counters + row).to(tl.uint64, bitcast=True)
                row_hash = _splitmix64(_splitmix64(seed) ^ counter)
                h = _splitmix64(row_hash ^ (index.to(tl.uint64) * 0x9E3779B97F4A7C15))
                u = ((h >> 41).to(tl.int32).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
                score = tl.where(kept, y - _log_ce(-_log_ce(u)), float("-inf"))
                best = tl.max(score, 0)
                drawn = tl.min(tl.where(kept & (score == best), index, _BIG), 0)
                tl.store(out + row, drawn.to(tl.int64), mask=ok == 1)
                done = ok
    tl.store(handled + row, done)


# ``shift`` (the pass's digit: 28, 24, ..., 0) is not specialised: Triton would compile a variant for the multiples
# of 16 among them and another for the rest, where one serves every pass.
@triton.jit(do_not_specialize=["shift"])
def _sample_radix_kernel(logits, stride_row, V, temperature, top_k, top_p, num_chunks, chunk_max, num_blocks,
                         block_max, live_list, part_in, state_in, part_out, state_out, shift, handled,
                         SHIFT: tl.constexpr, KEY_BITS: tl.constexpr, MASS: tl.constexpr, TOPK_START: tl.constexpr,
                         START: tl.constexpr, AFTER_START: tl.constexpr, USE_TOP_K: tl.constexpr,
                         ROW_PATH: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, CHUNKS_P: tl.constexpr,
                         BLOCKS_P: tl.constexpr, USE_PDL: tl.constexpr):
    """One radix pass at digit ``shift``, after the decision of the previous pass (``part_in``, ``state_in``).
    Top-k (MASS False): token counts; TOPK_START: its first pass, from prefix 0, which also finds the row's bound.
    Top-p (MASS True): masses of the top-k tokens. START: top-p's first pass, from prefix 0, whose decision is
    top-k's last (its threshold, when top-k is on); AFTER_START: the previous pass was top-p's first (its candidate 0
    summed S). Blocks that cannot change the decision are skipped on their maximum key alone (see the module doc).
    ROW_PATH: rows the row kernel took (``handled``) are skipped."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    t, k, p, key_max32, m, finite = _row_params(temperature, top_k, top_p, chunk_max, row, num_chunks, CHUNKS_P)
    topk_on = (t > 0) & (k > 0) & (k < V) & USE_TOP_K
    if MASS:
        on = (t > 0) & (p < 1) & finite
    else:
        on = topk_on
    if ROW_PATH:
        on = on & (tl.load(handled + row) == 0)
    if on:
        prefix = tl.full([], 0, tl.int64)
        above = tl.full([], 0, tl.int64)
        total = tl.full([], 0, tl.int64)
        top_k_key = tl.full([], 0, tl.int64)
        bound = tl.full([], 0, tl.int64)
        if TOPK_START:
            bound = _kth_largest_block_key(block_max, row, num_blocks, k, SHIFT, KEY_BITS, BLOCKS_P)
        elif START:
            if topk_on:
                top_k_key, _, _ = _decide(part_in, state_in, row, num_chunks, 0, k, p, False, False, CHUNKS_P)
        else:
            prefix, above, total = _decide(part_in, state_in, row, num_chunks, shift + 4, k, p, MASS, AFTER_START,
                                           CHUNKS_P)
            if MASS:
                top_k_key = tl.load(state_in + row * _STATE + 3)
            else:
                bound = tl.load(state_in + row * _STATE + 4)
        if chunk == 0:
            fields = tl.arange(0, _STATE)
            new_state = tl.where(fields == 0, prefix, tl.where(fields == 1, above, tl.where(
                fields == 2, total, tl.where(fields == 3, top_k_key, tl.where(fields == 4, bound, 0)))))
            tl.store(state_out + row * _STATE + fields, new_state)
        r = tl.div_rn(1.0, tl.maximum(t, _MIN_TEMPERATURE))
        width = tl.full([], 16, tl.int64) << shift
        # A block counts only if its largest key reaches the interval, top-k's bound and top-p's top-k threshold
        # (the fields not in use are 0), and, for masses, only if that key's mass is not 0.
        low = tl.maximum(tl.maximum(prefix, bound), top_k_key)
        sums = tl.zeros([16], tl.int64)
        blocks, block_keys, live = _chunk_blocks(block_max, row, chunk, num_blocks, CHUNK // BLOCK)
        live = live & ((block_keys >> SHIFT) >= low)
        if MASS:
            live = live & ((_float_of_key(block_keys) - m) * r >= _EXP_CUTOFF)
        base = (row * num_chunks + chunk) * (CHUNK // BLOCK)
        for i in range(_compact(live, blocks, live_list, base, CHUNK // BLOCK)):
            start = tl.load(live_list + base + i).to(tl.int32) * BLOCK
            offs = start + tl.arange(0, BLOCK)
            mask = offs < V
            raw = tl.load(logits + row * stride_row + offs, mask=mask, other=float("-inf"))
            x, key32 = _sanitized(raw)
            key = key32 >> SHIFT
            rel = key - prefix
            inside = mask & (rel >= 0) & (rel < width)
            if MASS:
                inside = inside & (key >= top_k_key)
            if tl.max(inside.to(tl.int32), 0) > 0:
                if MASS:
                    w = _exp_ce((x - m) * r)
                    sums += _candidate_sums((w * _MASS_SCALE).to(tl.int64), key, inside, prefix, shift)
                else:
                    ones = tl.full([BLOCK], 1, tl.int32)  # (counts: int32 tiles, half the work of int64)
                    sums += _candidate_sums(ones, key, inside, prefix, shift).to(tl.int64)
        tl.store(part_out + (row * num_chunks + chunk) * 16 + tl.arange(0, 16), sums)


@triton.jit
def _sample_final_kernel(logits, stride_row, V, temperature, top_k, top_p, min_p, seeds, counters, num_chunks,
                         chunk_max, num_blocks, block_max, live_list, topk_part, topk_state, topp_part, topp_state,
                         best_score, best_index, handled,
                         SHIFT: tl.constexpr, USE_TOP_K: tl.constexpr, USE_TOP_P: tl.constexpr, ROW_PATH: tl.constexpr,
                         CHUNK: tl.constexpr, BLOCK: tl.constexpr, CHUNKS_P: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    t, k, p, key_max32, m, finite = _row_params(temperature, top_k, top_p, chunk_max, row, num_chunks, CHUNKS_P)
    score_best = tl.full([], float("-inf"), tl.float32)
    index_best = tl.full([], _BIG, tl.int32)
    sampled = (t > 0) & finite
    if ROW_PATH:
        sampled = sampled & (tl.load(handled + row) == 0)
    if sampled:
        threshold = tl.full([], 0, tl.int64)
        if (p < 1) & USE_TOP_P:  # the previous launch was top-p's last pass; its state carries top-k's threshold
            threshold, _, _ = _decide(topp_part, topp_state, row, num_chunks, 0, k, p, True, False, CHUNKS_P)
            threshold = tl.maximum(threshold, tl.load(topp_state + row * _STATE + 3))
        elif (k > 0) & (k < V) & USE_TOP_K:  # the previous top-k launch was its last pass
            threshold, _, _ = _decide(topk_part, topk_state, row, num_chunks, 0, k, p, False, False, CHUNKS_P)
        key_max = key_max32 >> SHIFT
        threshold = tl.minimum(threshold, key_max)
        mp = tl.load(min_p + row)
        min_p_on = mp > 0  # off: every y passes (y >= -inf)
        log_min_p = tl.where(min_p_on, _log_ce(tl.where(min_p_on, mp, 1.0)), float("-inf"))
        r = tl.div_rn(1.0, tl.maximum(t, _MIN_TEMPERATURE))
        seed = tl.load(seeds + row).to(tl.uint64, bitcast=True)
        counter = tl.load(counters + row).to(tl.uint64, bitcast=True)
        row_hash = _splitmix64(_splitmix64(seed) ^ counter)
        # A block keeps a token only if its largest key passes: y is monotone in the key.
        blocks, block_keys, live = _chunk_blocks(block_max, row, chunk, num_blocks, CHUNK // BLOCK)
        block_y = (_float_of_key(block_keys) - m) * r
        live = live & ((block_keys >> SHIFT) >= threshold) & (
            (block_y >= log_min_p) | ((block_keys >> SHIFT) == key_max))
        base = (row * num_chunks + chunk) * (CHUNK // BLOCK)
        for i in range(_compact(live, blocks, live_list, base, CHUNK // BLOCK)):
            start = tl.load(live_list + base + i).to(tl.int32) * BLOCK
            offs = start + tl.arange(0, BLOCK)
            mask = offs < V
            raw = tl.load(logits + row * stride_row + offs, mask=mask, other=float("-inf"))
            x, key32 = _sanitized(raw)
            key = key32 >> SHIFT
            y = (x - m) * r
            kept = mask & (key >= threshold) & ((y >= log_min_p) | (key == key_max))
            if tl.max(kept.to(tl.int32), 0) > 0:
                h = _splitmix64(row_hash ^ (offs.to(tl.uint64) * 0x9E3779B97F4A7C15))
                u = ((h >> 41).to(tl.int32).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
                score = y - _log_ce(-_log_ce(u))
                score = tl.where(kept, score, float("-inf"))
                block_best = tl.max(score, 0)
                block_index = tl.min(tl.where(kept & (score == block_best), offs, _BIG), 0)
                take = (index_best == _BIG) | (block_best > score_best)
                score_best = tl.where(take, block_best, score_best)
                index_best = tl.where(take, block_index, index_best)
    slot = row * num_chunks + chunk
    tl.store(best_score + slot, score_best)
    tl.store(best_index + slot, index_best)


@triton.jit
def _sample_reduce_kernel(temperature, chunk_max, greedy_value, greedy_index, best_score, best_index, handled, out,
                          num_chunks, ROW_PATH: tl.constexpr, CHUNKS_P: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    greedy = _row_winner(greedy_value, greedy_index, row, num_chunks, CHUNKS_P)
    offs = tl.arange(0, CHUNKS_P)
    mask = offs < num_chunks
    key_max32 = _row_max_key(chunk_max, row, num_chunks, CHUNKS_P)
    m = _float_of_key(key_max32)  # the row's maximum (NaN counted as -inf)
    finite = (m > float("-inf")) & (m < float("inf"))
    scores = tl.load(best_score + row * num_chunks + offs, mask=mask, other=float("-inf"))
    winners = tl.load(best_index + row * num_chunks + offs, mask=mask, other=_BIG)
    valid = mask & (winners < _BIG)
    top = tl.max(tl.where(valid, scores, float("-inf")), 0)
    drawn = tl.min(tl.where(valid & (scores == top), winners, _BIG), 0)
    sampled = (tl.load(temperature + row) > 0) & finite
    if ROW_PATH:  # the row kernel wrote the handled rows' tokens
        tl.store(out + row, tl.where(sampled, drawn, greedy).to(tl.int64), mask=tl.load(handled + row) == 0)
    else:
        tl.store(out + row, tl.where(sampled, drawn, greedy).to(tl.int64))


# --------------------------------------------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------------------------------------------


def _passes(dtype: torch.dtype) -> tuple[int, int]:
    """(key shift, radix passes per filter) for logits of ``dtype``."""
    shift = KEY_SHIFT[dtype]
    return shift, (32 - shift + 3) // 4


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           min_p: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor, use_top_k: bool = True,
           use_top_p: bool = True, chunk: int | None = None, block: int = BLOCK,
           row_candidates: int = ROW_CANDIDATES, radix: bool = True) -> torch.Tensor:
    """``ce::sample``'s CUDA kernel (also on CPU tensors under ``TRITON_INTERPRET=1``); ``chunk`` and ``block``
    (powers of two, ``block <= chunk``) override the tiling (the tests use small ones to get several chunks and blocks
    from short rows); ``row_candidates`` (a power of two, or 0: every row through the radix passes) is the row
    path's capacity; ``radix`` False launches the scan and the row kernel only, leaving -1 for the rows the row path
    does not take (the tests check which rows it takes)."""
    if logits.dim() != 2 or logits.stride(1) != 1 or logits.dtype not in KEY_SHIFT:
        raise ValueError(f"sample: logits must be [B, V] bf16/fp16/fp32 with contiguous columns, got "
                         f"{tuple(logits.shape)} {logits.dtype} strides {logits.stride()}")
    rows, vocab = logits.shape
    params = (temperature, top_k, top_p, min_p, seeds, counters)
    dtypes = (torch.float32, torch.int64, torch.float32, torch.float32, torch.int64, torch.int64)
    for name, tensor, dtype in zip(("temperature", "top_k", "top_p", "min_p", "seeds", "counters"), params, dtypes):
        if tensor.shape != (rows,) or tensor.dtype != dtype or not tensor.is_contiguous():
            raise ValueError(f"sample: {name} must be [{rows}] contiguous {dtype}, got {tuple(tensor.shape)} "
                             f"{tensor.dtype}")
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    if rows == 0:
        return out
    if vocab == 0:
        raise ValueError("sample: an empty row has no token")
    if row_candidates < 0 or row_candidates & (row_candidates - 1):
        raise ValueError(f"sample: row_candidates must be 0 or a power of two, got {row_candidates}")
    if vocab > MAX_VOCAB:
        raise ValueError(f"sample: at most {MAX_VOCAB} logits a row, got {vocab}")
    if chunk is None:
        # Every pass pays a fixed cost per program (the row's decision from the partials, the block maxima): many
        # rows take fewer, wider programs; few rows keep more programs for parallelism. See bench/NOTES.md.
        chunk = SMALL_CHUNK if rows * triton.cdiv(vocab, SMALL_CHUNK) <= MANY_PROGRAMS else LARGE_CHUNK
    num_chunks = triton.cdiv(vocab, chunk)
    if num_chunks > MAX_CHUNKS:
        raise ValueError(f"sample: {vocab} logits need {num_chunks} chunks of {chunk}, more than {MAX_CHUNKS}")
    num_blocks = triton.cdiv(vocab, block)
    if num_blocks > MAX_BLOCKS:
        raise ValueError(f"sample: {vocab} logits need {num_blocks} blocks of {block}, more than {MAX_BLOCKS}")
    shift, passes = _passes(logits.dtype)
    top_shift = 4 * passes - 4
    chunks_p = max(16, triton.next_power_of_2(num_chunks))
    device = logits.device
    # One int64 workspace: partials and states of the two searches (ping-pong slots: a pass reads the previous
    # pass's slot and writes the other), chunk and block maxima, and the fp32 / int32 chunk winners (greedy and drawn).
    # Every view starts on a 16-byte boundary (each size rounded up to two int64, the winners' int32 rows to four):
    # Triton compiles a kernel variant per pointer alignment, and offsets that followed the row count gave eager
    # calls (prompt steps, adjusted rows) a new variant for each remainder, ~7 s each on a cold cache.
    n = rows * num_chunks
    n4 = -(-n // 4) * 4
    row_path = (use_top_k or use_top_p) and row_candidates > 0
    sizes = {"topk_part": 2 * n * 16, "topp_part": 2 * n * 16, "topk_state": 2 * rows * STATE,
             "topp_state": 2 * rows * STATE, "chunk_max": n, "block_max": rows * num_blocks,
             "live_list": n * (chunk // block), "winners": 2 * n4,
             "candidates": rows * row_candidates if row_path else 0, "handled": rows,
             "mass_part": n if row_path and use_top_p else 0}
    workspace = torch.empty(sum(size + size % 2 for size in sizes.values()), dtype=torch.int64, device=device)
    views, offset = {}, 0
    for name, size in sizes.items():
        views[name] = workspace[offset : offset + size]
        offset += size + size % 2
    topk_part = views["topk_part"].view(2, n * 16)
    topp_part = views["topp_part"].view(2, n * 16)
    topk_state = views["topk_state"].view(2, rows * STATE)
    topp_state = views["topp_state"].view(2, rows * STATE)
    winners = views["winners"].view(torch.int32).view(4, n4)[:, :n]
    greedy_value, greedy_index = winners[0].view(torch.float32), winners[1]
    best_score, best_index = winners[2].view(torch.float32), winners[3]
    chunk_max, block_max, live_list = views["chunk_max"], views["block_max"], views["live_list"]
    candidates = views["candidates"].view(torch.int32).view(2, -1)
    handled = views["handled"].view(torch.int32)[:rows]

    flags = pdl_flags(logits)
    launch = dict(num_warps=4, enable_fp_fusion=False, **flags)
    grid = (rows, num_chunks)
    stride = logits.stride(0)
    _sample_scan_kernel[grid](logits, stride, vocab, num_chunks, num_blocks, greedy_value, greedy_index, chunk_max,
                              block_max, CHUNK=chunk, BLOCK=block, **launch)
    blocks_p = max(16, triton.next_power_of_2(num_blocks))
    if row_path:
        mass_part = views["mass_part"]
        if use_top_p:
            _sample_mass_kernel[grid](logits, stride, vocab, temperature, top_k, top_p, num_chunks, chunk_max, mass_part,
                                      USE_TOP_K=use_top_k, CHUNK=chunk, BLOCK=block, CHUNKS_P=chunks_p, **launch)
        _sample_row_kernel[(rows,)](logits, stride, vocab, temperature, top_k, top_p, min_p, seeds, counters,
                                    num_chunks, chunk_max, num_blocks, block_max, live_list, num_chunks * (chunk // block),
                                    candidates[0].view(torch.float32), candidates[1], mass_part, handled, out,
                                    SHIFT=shift, KEY_BITS=32 - shift, USE_TOP_K=use_top_k, USE_TOP_P=use_top_p,
                                    IMPLICIT_K=TOP_P_CANDIDATES_K, BLOCK=block, GATHER=max(GATHER, block),
                                    CAND=row_candidates, CHUNKS_P=chunks_p, BLOCKS_P=blocks_p,
                                    **dict(launch, num_warps=8))
    if not radix:
        return out.masked_fill_(handled == 0, -1) if row_path else out.fill_(-1)
    common = dict(SHIFT=shift, KEY_BITS=32 - shift, USE_TOP_K=use_top_k, ROW_PATH=row_path, CHUNK=chunk, BLOCK=block,
                  CHUNKS_P=chunks_p, BLOCKS_P=blocks_p, **launch)
    if use_top_k:
        for i in range(passes):  # pass 0 reads nothing: its part_in / state_in are placeholders
            _sample_radix_kernel[grid](logits, stride, vocab, temperature, top_k, top_p, num_chunks, chunk_max,
                                       num_blocks, block_max, live_list, topk_part[(i - 1) % 2],
                                       topk_state[(i - 1) % 2], topk_part[i % 2], topk_state[i % 2], top_shift - 4 * i,
                                       handled, MASS=False, TOPK_START=i == 0, START=False, AFTER_START=False, **common)
    topk_last = (passes - 1) % 2
    if use_top_p:
        for i in range(passes):
            part_in, state_in = (topk_part[topk_last], topk_state[topk_last]) if i == 0 else (
                topp_part[(i - 1) % 2], topp_state[(i - 1) % 2])
            _sample_radix_kernel[grid](logits, stride, vocab, temperature, top_k, top_p, num_chunks, chunk_max,
                                       num_blocks, block_max, live_list, part_in, state_in, topp_part[i % 2],
                                       topp_state[i % 2], top_shift - 4 * i, handled, MASS=True, TOPK_START=False, START=i == 0,
                                       AFTER_START=i == 1, **common)
    topp_last = (passes - 1) % 2
    _sample_final_kernel[grid](logits, stride, vocab, temperature, top_k, top_p, min_p, seeds, counters, num_chunks,
                               chunk_max, num_blocks, block_max, live_list, topk_part[topk_last], topk_state[topk_last],
                               topp_part[topp_last], topp_state[topp_last], best_score, best_index, handled,
                               SHIFT=shift, USE_TOP_K=use_top_k, USE_TOP_P=use_top_p, ROW_PATH=row_path, CHUNK=chunk, BLOCK=block, CHUNKS_P=chunks_p,
                               **launch)
    _sample_reduce_kernel[(rows,)](temperature, chunk_max, greedy_value, greedy_index, best_score, best_index, handled,
                                   out, num_chunks, ROW_PATH=row_path, CHUNKS_P=chunks_p, num_warps=4, **flags)
    return out

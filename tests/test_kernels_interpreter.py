"""Our Triton kernels, run on the CPU by Triton's interpreter, against the CPU references (tiny fp32 shapes).

This catches indexing, masking and in-place-ordering bugs in CI, where there is no GPU. ``TRITON_INTERPRET=1``
must be set before triton decorates the kernels, so the checks run in one child process (the parent never
imports triton), started in the background on the second core (tests/background.py); each pytest test then asserts
on its own check's result. The interpreter has no bfloat16, so everything is fp32. FLA's chunked prefill
(``gated_delta_rule_prefill`` past ``RECURRENT_PREFILL_MAX_TOKENS``) cannot run in the interpreter; the GPU tests
cover it. Its recurrent form (FLA's one-kernel walk, for short steps) runs here. The skinny GEMM of ``ce::linear`` is checked against a float64 matmul, at fixed configs (every one
its rule may choose among them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from tests import background

REPO = Path(__file__).resolve().parents[1]
ATOL = RTOL = 1e-4


# ----------------------------------------------------------------------------------------------------------------
# Child process: run every check, print one JSON line {check name: error message or null}.
# ----------------------------------------------------------------------------------------------------------------


def _child_checks() -> dict:
    import torch

    from ops import (
        activation, attention_decode, attention_prologue, conv1d, decode_inputs, delta_rule, gated_deltanet_decode, kv_cache, layouts,
        norm, paged_attention, penalties,
    )
    from ops.triton import (
        activation_kernels,
        argmax_kernels,
        attention_decode_kernels,
        attention_prologue_kernels,
        decode_inputs_kernels,
        conv1d_kernels,
        delta_rule_kernels,
        gated_deltanet_kernels,
        gemv_kernels,
        kv_cache_kernels,
        norm_kernels,
        paged_attention_kernels,
        penalty_kernels,
    )

    torch.manual_seed(0)

    def compare(name, got, want):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL, msg=lambda m: f"{name}: {m}")

    def column(t, poison):
        """``t`` [n] as the first column of an [n, 2] table whose second column holds ``poison``: a kernel that reads
        it with unit stride gets poison (an index far out of bounds crashes the interpreter; a NaN shows)."""
        table = torch.empty(t.shape[0], 2, dtype=t.dtype)
        table[:, 0], table[:, 1] = t, poison
        return table[:, 0]

    def paged_layout(num_seqs, context_lens, block_size, num_blocks):
        """Block tables over a random permutation of blocks 1.. (block 0 is the null block)."""
        max_blocks = max(1, max((c + block_size - 1) // block_size for c in context_lens))
        perm = torch.randperm(num_blocks - 1) + 1
        tables = torch.zeros(num_seqs, max_blocks + 1, dtype=torch.int32)  # one spare column, as in a real table
        used = 0
        for i, c in enumerate(context_lens):
            n = (c + block_size - 1) // block_size
            tables[i, :n] = perm[used : used + n].to(torch.int32)
            used += n
        assert used <= num_blocks - 1
        return tables

    def check_store_kv():
        num_blocks, block_size, heads, dim = 6, 4, 2, 16
        k_cache = torch.randn(num_blocks, block_size, heads, dim)
        v_cache = torch.randn(num_blocks, block_size, heads, dim)
        rows = torch.randperm(num_blocks * block_size - block_size)[:7] + block_size  # live rows, distinct
        rows[3] = 2  # a padding lane writes into the null block 0
        rows = column(rows, 10**9)  # a strided view: the launcher must read it by its stride or copy it
        key, value = torch.randn(7, heads, dim), torch.randn(7, heads, dim)
        want_k, want_v = k_cache.clone(), v_cache.clone()
        kv_cache.store_kv_reference(key, value, want_k, want_v, rows)
        kv_cache_kernels.store_kv(key, value, k_cache, v_cache, rows)
        compare("k_cache", k_cache, want_k)
        compare("v_cache", v_cache, want_v)

    def check_decode(q_heads, kv_heads, dim, block_size, num_splits):
        """The paged decode kernel (and, split, the reduce kernel) against the reference; context 0: a padding lane."""
        context_lens = [0, 1, 5, 17, 40]
        num_blocks = 1 + sum((c + block_size - 1) // block_size for c in context_lens) + 2
        k_cache = torch.randn(num_blocks, block_size, kv_heads, dim)
        v_cache = torch.randn(num_blocks, block_size, kv_heads, dim)
        tables = paged_layout(len(context_lens), context_lens, block_size, num_blocks)
        q = torch.randn(len(context_lens), q_heads, dim)
        lens = column(torch.tensor(context_lens, dtype=torch.int32), 10**6)
        scale = dim**-0.5
        want = paged_attention.paged_attention_decode_reference(q, k_cache, v_cache, tables, lens, scale)
        got = paged_attention_kernels.paged_attention_decode(
            q, k_cache, v_cache, tables, lens, scale, num_splits=num_splits
        )
        compare("decode out", got, want)
        assert torch.all(got[0] == 0), "padding lane (context 0) must be zeros"

    def check_attention_decode(q_heads, kv_heads, dim, rotary_dim, block_size, num_splits, strided=True,
                               block_n=None, early_loads=None, query_rows=None, reduce_parts=None,
                               context_lens=(0, 1, 5, 17, 40)):
        """The fused decode op: output and caches (but the null block) against the reference. By default contexts 0
        (a padding lane on the null row; ``context_lens`` given starts with one too), 1 (the new token alone), 5, 17
        and 40; projected rows a slice of wider rows.
        ``early_loads``: the kernel's order of loads (None: the default for 5 sequences, the late ones); ``query_rows``:
        the query tile's rows (None: the GQA group's power of two); ``reduce_parts``: the reduce kernel's programs a
        query head (None: the rule's, one on this CPU)."""
        context_lens = list(context_lens)
        batch = len(context_lens)
        num_blocks = 1 + sum((c + block_size - 1) // block_size for c in context_lens) + 2
        k_cache = torch.randn(num_blocks, block_size, kv_heads, dim)
        v_cache = torch.randn(num_blocks, block_size, kv_heads, dim)
        tables = paged_layout(batch, context_lens, block_size, num_blocks)
        slots = torch.tensor([int(tables[i, (c - 1) // block_size]) * block_size + (c - 1) % block_size if c else 0
                              for i, c in enumerate(context_lens)])
        lens = torch.tensor(context_lens, dtype=torch.int32)
        positions = (lens - 1).clamp_min(0).long()
        width = sum(layouts.attention_decode_split_sizes(q_heads, kv_heads, dim))
        q_weight, k_weight = torch.randn(dim) * 0.5, torch.randn(dim) * 0.5
        inv_freq = 1.0 / 100.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
        args = (q_weight, k_weight, 1e-6, inv_freq, positions)
        heads = (q_heads, kv_heads, dim, dim**-0.5)
        projected = torch.randn(batch, width + 9)[:, 4:-5] if strided else torch.randn(batch, width)
        want_k, want_v = k_cache.clone(), v_cache.clone()
        want = attention_decode.attention_decode_reference(projected, *args, want_k, want_v, slots, tables, lens,
                                                           *heads)
        got = attention_decode_kernels.attention_decode(projected, *args, k_cache, v_cache, slots, tables, lens,
                                                        *heads, num_splits=num_splits, block_n=block_n,
                                                        early_loads=early_loads, query_rows=query_rows,
                                                        reduce_parts=reduce_parts)
        assert got.shape == (batch, q_heads * dim) and got.is_contiguous()
        compare("attention decode out", got, want)
        assert torch.all(got[0] == 0), "padding lane (context 0) must be zeros"
        compare("attention decode k_cache", k_cache[1:], want_k[1:])
        compare("attention decode v_cache", v_cache[1:], want_v[1:])

    def check_prefill(q_heads, kv_heads, dim, block_size, q_lens=(3, 0, 40, 1), prefixes=(5, 2, 9, 0), tile=None):
        # q_len 0: a sequence with no new tokens; 40 > one query tile. ``tile``: the op's own (fp32's) by default
        context_lens = [p + n for p, n in zip(prefixes, q_lens)]
        num_blocks = 1 + sum((c + block_size - 1) // block_size for c in context_lens) + 1
        k_cache = torch.randn(num_blocks, block_size, kv_heads, dim)
        v_cache = torch.randn(num_blocks, block_size, kv_heads, dim)
        tables = paged_layout(len(q_lens), context_lens, block_size, num_blocks)
        cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
        q = torch.randn(sum(q_lens), q_heads, dim)
        lens = torch.tensor(context_lens, dtype=torch.int32)
        scale = dim**-0.5
        want = paged_attention.paged_attention_prefill_reference(q, k_cache, v_cache, cu, lens, tables, scale)
        got = paged_attention_kernels.paged_attention_prefill(q, k_cache, v_cache, cu, lens, tables, scale, tile)
        compare("prefill out", got, want)

    def check_verify(q_heads, kv_heads, dim, block_size, rows, by_rows, prefixes=(5, 0, 30), num_splits=None):
        """A verify step (``rows`` rows a sequence after its prefix) down either path: each row a decode query over
        its own prefix (``num_splits`` of the context, None: the rule's), or the prefill kernel; plain, and with the
        output gate read through a strided view (applied by the split kernel, the reduce kernel or the prefill
        kernel)."""
        context_lens = [p + rows for p in prefixes]
        num_blocks = 1 + sum((c + block_size - 1) // block_size for c in context_lens) + 1
        k_cache = torch.randn(num_blocks, block_size, kv_heads, dim)
        v_cache = torch.randn(num_blocks, block_size, kv_heads, dim)
        tables = paged_layout(len(prefixes), context_lens, block_size, num_blocks)
        q = torch.randn(rows * len(prefixes), q_heads, dim)
        gate = torch.randn(rows * len(prefixes), q_heads, 2 * dim)[..., dim:]
        lens = torch.tensor(context_lens, dtype=torch.int32)
        scale = dim**-0.5
        for g in (None, gate):
            want = paged_attention.paged_attention_verify_reference(q, k_cache, v_cache, lens, tables, rows, scale, g)
            if num_splits is None:
                got = paged_attention_kernels.paged_attention_verify(q, k_cache, v_cache, lens, tables, rows, scale,
                                                                     g, by_rows=by_rows)
            else:  # the by-rows path (verify's when by_rows) at a given split count
                got = paged_attention_kernels.paged_attention_decode(q, k_cache, v_cache, tables, lens, scale,
                                                                     num_splits=num_splits, rows_per_seq=rows, gate=g)
            compare("verify out" if g is None else "gated verify out", got, want)

    def check_conv_prefill(seq_lens, sections=(8, 4, 8)):
        channels, width = sum(sections), 4
        num_slots = len(seq_lens) + 2
        slots = (torch.randperm(num_slots - 1)[: len(seq_lens)] + 1).to(torch.int32)
        cu = torch.tensor([0] + torch.tensor(seq_lens).cumsum(0).tolist(), dtype=torch.int32)
        x = torch.randn(sum(seq_lens), channels)
        weight = torch.randn(channels, width)
        state = torch.randn(num_slots, channels, width - 1)
        want_state = state.clone()
        # The reference cannot take an empty sequence (its unfold needs >= 1 new token), so it runs on the
        # non-empty ones; the empty sequence's slot must come out unchanged.
        keep = torch.tensor(seq_lens) > 0
        cu_nonempty = torch.tensor([0] + torch.tensor(seq_lens)[keep].cumsum(0).tolist(), dtype=torch.int32)
        want = conv1d.causal_conv1d_prefill_reference(x, weight, want_state, cu_nonempty, slots[keep], sections)
        # block sizes smaller than the problem: several token tiles with a ragged edge; channel blocks of 4 (the
        # widths' largest common power of two), the sections 2, 1 and 2 of them
        got = conv1d_kernels.causal_conv1d_prefill(x, weight, state, cu, slots, sections, block_t=4, block_c=8)
        compare("conv prefill out", got, want)
        compare("conv prefill state", state, want_state)

    def check_conv_decode():
        channels, width, num_slots = 20, 4, 6
        slots = column(torch.tensor([3, 0, 5, 1], dtype=torch.int32), 10**6)  # one padding lane on the null slot
        x = torch.randn(4, channels)
        weight = torch.randn(channels, width)
        state = torch.randn(num_slots, channels, width - 1)
        want_state = state.clone()
        want = conv1d.causal_conv1d_decode_reference(x, weight, want_state, slots)
        got = conv1d_kernels.causal_conv1d_decode(x, weight, state, slots, block_c=8)
        compare("conv decode out", got, want)
        compare("conv decode state", state, want_state)

    def check_attention_prologue(q_heads, kv_heads, dim, rotary_dim, tokens=9, block_size=4):
        """q out and the caches (all but the null block) against the reference, projected rows a slice of wider
        rows, partial or full rotary, positions far apart."""
        width = sum(layouts.attention_decode_split_sizes(q_heads, kv_heads, dim))
        projected = torch.randn(tokens, width + 7)[:, 3 : 3 + width]
        num_blocks = tokens // block_size + 3
        k_cache, v_cache = torch.randn(num_blocks, block_size, kv_heads, dim), torch.randn(num_blocks, block_size,
                                                                                         kv_heads, dim)
        slots = torch.randperm((num_blocks - 1) * block_size)[:tokens] + block_size
        positions = torch.randint(0, 1000, (tokens,))
        inv_freq = 1.0 / 100.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
        args = (projected, torch.randn(dim) * 0.5, torch.randn(dim) * 0.5, 1e-6, inv_freq, positions)
        want_k, want_v = k_cache.clone(), v_cache.clone()
        want = attention_prologue.attention_prologue_reference(*args, want_k, want_v, slots, q_heads, kv_heads, dim)
        got = attention_prologue_kernels.attention_prologue(*args, k_cache, v_cache, slots, q_heads, kv_heads, dim)
        compare("attention prologue q", got, want)
        compare("attention prologue k_cache", k_cache, want_k)
        compare("attention prologue v_cache", v_cache, want_v)

    def check_prefill_gates():
        """The prefill's g and beta from a and b read as column slices of wider rows (as the layer's projection
        hands them over), against the reference's formulas; a + dt_bias on both sides of softplus's threshold."""
        heads, tokens = 6, 13
        rows = torch.randn(tokens, 2 * heads + 5) * 12
        a, b = rows[:, 1 : 1 + heads], rows[:, 3 + heads : 3 + 2 * heads]
        A_log, dt_bias = torch.randn(heads), torch.randn(heads) * 5
        g, beta = delta_rule_kernels.prefill_gates(a, b, A_log, dt_bias, block_t=4)
        qk = torch.ones(tokens, heads, 2)
        _, _, want_g, want_beta = delta_rule.prepare_inputs(qk, qk, a, b, A_log, dt_bias, heads)
        assert g.is_contiguous() and beta.is_contiguous()
        compare("prefill gates g", g, want_g)
        compare("prefill gates beta", beta, want_beta)

    def check_gdr_prefill_recurrent(k_heads, v_heads, dk, dv, seq_lens, padding=()):
        """The prefill op's short-step form (FLA's recurrent kernel, ``RECURRENT_PREFILL_MAX_TOKENS``) against the
        float reference: sequences with and without tokens (a zero-length one keeps its state), grouped value heads,
        q and k read as strided slices of wider rows (as the layer's projection hands them over). ``padding``: the
        lengths of sequences on the null slot after them (a zero state, none written back: the whole pool compared,
        the null slot's random row included)."""
        seq_lens = list(seq_lens) + list(padding)
        assert sum(seq_lens) <= delta_rule_kernels.RECURRENT_PREFILL_MAX_TOKENS  # the recurrent form runs
        tokens, num_slots = sum(seq_lens), len(seq_lens) + 2
        live = len(seq_lens) - len(padding)
        slots = torch.randperm(num_slots - 1)[:live].to(torch.int32) + 1  # slot 0 is the null slot
        slots = torch.cat([slots, torch.zeros(len(padding), dtype=torch.int32)])
        cu = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()], dtype=torch.int32)
        rows = torch.randn(tokens, 2 * k_heads * dk + 3)
        q = rows[:, : k_heads * dk].view(tokens, k_heads, dk)
        k = rows[:, 3 + k_heads * dk :].view(tokens, k_heads, dk)
        v = torch.randn(tokens, v_heads, dv)
        a, b = torch.randn(tokens, v_heads) * 3, torch.randn(tokens, v_heads) * 2
        A_log, dt_bias = torch.randn(v_heads) * 0.5, torch.randn(v_heads)
        state = torch.randn(num_slots, v_heads, dk, dv) * 0.3
        want_state = state.clone()
        want = delta_rule.gated_delta_rule_prefill_reference(q, k, v, a, b, A_log, dt_bias, want_state, cu, slots)
        got = delta_rule_kernels.gated_delta_rule_prefill(q, k, v, a, b, A_log, dt_bias, state, cu, slots)
        compare("recurrent prefill out", got, want)
        compare("recurrent prefill state", state, want_state)

    def check_gdr_decode(k_heads, v_heads, dk, dv, block_v):
        batch, num_slots = 4, 7
        slots = column(torch.tensor([5, 0, 2, 6], dtype=torch.int32), 10**6)  # one padding lane on the null slot
        q, k = torch.randn(batch, k_heads, dk), torch.randn(batch, k_heads, dk)
        v = torch.randn(batch, v_heads, dv)
        a, b = torch.randn(batch, v_heads) * 3, torch.randn(batch, v_heads) * 2
        a[0, 0] = 30.0  # softplus's linear branch
        A_log, dt_bias = column(torch.randn(v_heads) * 0.5, float("nan")), column(torch.randn(v_heads), float("nan"))
        state = torch.randn(num_slots, v_heads, dk, dv)
        want_state = state.clone()
        want = delta_rule.gated_delta_rule_decode_reference(q, k, v, a, b, A_log, dt_bias, want_state, slots)
        got = delta_rule_kernels.gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, state, slots,
                                                         block_v=block_v)
        compare("delta decode out", got, want)
        compare("delta decode state", state, want_state)

    def check_gated_deltanet_decode(k_heads, v_heads, dk, dv, fused=True, block_v=None, batch=5, prefetch=None,
                                    split_v=None, repeats=1):
        """The fused decode op: output and both pools (but the null slot) against the reference. Two padding lanes
        on the null slot; projected rows are a slice of wider rows (row stride > width). ``fused=False``: the
        launcher's large-batch path through the unfused kernels, on the same strided views. ``block_v``: the fused
        kernel walking each value head's state in tiles of that width (the norm over the parked outputs).
        ``fused=None``: the launch the launcher picks for ``batch`` (decode_config). ``prefetch``: each tile's loads
        before the previous tile's math and stores, or in walk order (None: the launch's). ``split_v``: the tiles over
        programs, the last of each key head writing q and k's history and the norms; ``repeats`` steps in a row
        (the per-key-head counts must be left at zero for the next)."""
        width = 4
        num_slots = batch + 3
        slots = (torch.randperm(num_slots - 1)[:batch] + 1).to(torch.int32)
        slots[1] = slots[3] = 0
        slots = column(slots, 10**6)
        sizes = layouts.gated_deltanet_split_sizes(k_heads, dk, v_heads, dv)
        channels = sum(sizes[:3])
        projected = torch.randn(batch, sum(sizes) + 9)[:, 4:-5]
        projected[:, -2 * v_heads :] *= 3  # b and a
        projected[0, -v_heads] = 30.0  # a of lane 0's value head 0: softplus's linear branch
        conv_weight = torch.randn(channels, width) * 0.5
        conv_state = torch.randn(num_slots, channels, width - 1)
        A_log, dt_bias = column(torch.randn(v_heads) * 0.5, float("nan")), column(torch.randn(v_heads), float("nan"))
        norm_weight = column(torch.randn(dv), float("nan"))
        rec_state = torch.randn(num_slots, v_heads, dk, dv)
        want_conv, want_rec, original_rec = conv_state.clone(), rec_state.clone(), rec_state.clone()
        args = (k_heads, dk, v_heads, dv, 1e-6)
        for _ in range(repeats):  # steps on the same rows; the last step's output is compared
            want = gated_deltanet_decode.gated_deltanet_decode_reference(
                projected, conv_weight, want_conv, A_log, dt_bias, norm_weight, want_rec, slots, *args)
            got = gated_deltanet_kernels.gated_deltanet_decode(
                projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, rec_state, slots, *args, fused=fused,
                block_v=block_v, prefetch=prefetch, split_v=split_v)
        assert got.shape == (batch, v_heads * dv) and got.is_contiguous()
        if split_v:  # the launch made its counts (else this check would make them) and left them at zero
            counters = gated_deltanet_kernels._counters[projected.device]
            assert int(counters.abs().sum()) == 0, "the split launch must leave its counts at zero"
        live = slots != 0
        compare("gated deltanet decode out", got[live], want[live])
        compare("gated deltanet decode conv state", conv_state[1:], want_conv[1:])
        compare("gated deltanet decode recurrent state", rec_state[1:], want_rec[1:])
        # Padding lanes neither read nor write the null slot's recurrent state (its conv history they may race on)
        assert torch.equal(rec_state[0], original_rec[0]), "a padding lane wrote the null slot's recurrent state"

    def gemm_config(c, block_m=None):
        """A (block_n, block_k) tuple as a config with ``block_m`` (None: the launch takes BLOCK_M from the row
        count, 1 at one row and the rows rounded up to a power of two above); a triton.Config as it is."""
        if isinstance(c, gemv_kernels.triton.Config):
            return c
        return gemv_kernels._config(c[0], c[1], 4, 1, block_m=block_m)

    def config_name(config):
        kw = config.kwargs
        return f"BLOCK_M {kw.get('BLOCK_M', '-')} {kw['BLOCK_N']}x{kw['BLOCK_K']}"

    def check_skinny_gemm(rows, n, k, configs, block_m=None, strided=False, gated=False, full=False,
                          gated_out=False):
        """Each config (see gemm_config) against a float64 matmul. ``gated``: x is [gate | up] (2K wide) and the
        matmul's input silu(gate) * up (ce::silu_mul_linear). ``gated_out``: the weight's N rows are [gate | up] and
        the output silu(gate) * up of the product, N / 2 wide (ce::add_rms_norm_linear_silu_mul). ``full``: the
        one-row launches must take the loop without masks (every tile inside the tensors: ``full_tiles``), else
        they must mask (a ragged N or K, or more rows: the few-rows loop always masks)."""
        width = 2 * k if gated else k
        x = torch.randn(rows, width) * (3.0 if gated else 1.0)
        weight = torch.randn(n, k) * k**-0.5
        if strided:  # x with a K stride of 2, weight rows with a row stride > K
            x = torch.randn(rows, 2 * width)[:, ::2]
            weight = (torch.randn(n, k + 5) * k**-0.5)[:, :k]
        if full and not strided:  # NaN right past x and the weight: a load past a row's end shows in the result
            x = torch.cat([x, torch.full_like(x[:1], float("nan"))])[:rows]
            weight = torch.cat([weight, torch.full_like(weight[:1], float("nan"))])[:n]
        x_in = x.double()
        if gated:
            gate, up = x_in[:, :k], x_in[:, k:]
            x_in = gate * torch.sigmoid(gate) * up
        want = x_in @ weight.double().T
        if gated_out:
            gate, up = want.chunk(2, dim=1)
            want = gate * torch.sigmoid(gate) * up
        for c in configs:
            config = gemm_config(c, block_m)
            tiles = gemv_kernels.row_tiles(rows, config)
            assert gemv_kernels.full_tiles(rows, n, k, config, tiles) == (full and rows == 1), config_name(config)
            got = gemv_kernels.skinny_gemm(x, weight, config, gated, gated_out)
            assert got.shape == (rows, n // 2 if gated_out else n) and got.dtype == x.dtype
            compare(f"skinny gemm {config_name(config)}", got.double(), want)

    # K = 75 in 3, 5 and 2 chunks, the last one ragged; BLOCK_N 16 and 32 over N = 37 (a ragged last block)
    gemm_configs = [(16, 32), (16, 16), (32, 64)]
    # the few-rows GEMV: BLOCK_N below and above BLOCK_M, one K chunk (128 >= 75) and several
    gemv_rows_configs = [(4, 16), (2, 128), (16, 32)]

    dot_configs = [gemv_kernels._config(16, 32, 1, 2, dot=True), gemv_kernels._config(32, 64, 2, 2, dot=True)]

    def rule_configs(rows):
        """Every config the rule (skinny_config) gives ``rows`` rows on the model's kinds of weight: narrow N with
        short and long K, wide N, the vocabulary."""
        shapes = [(1024, 2048), (1024, 3584), (8224, 1024), (248320, 1024)]
        configs = {str(c): c for c in (gemv_kernels.skinny_config(rows, n, k) for n, k in shapes)}
        return list(configs.values())

    def check_apply_penalties(batch, vocab):
        """ce::apply_penalties_'s kernel against its reference, bit for bit: penalised rows out of order with the others
        left alone, repeated tokens, padded tables, a row with no tokens, logits of both signs, zeros and -inf (masked
        tokens), a repetition penalty of 1; V past one block, its last block ragged; the rows and the tokens as views of
        one table and the penalties strided, as the sampler passes them."""
        logits = torch.randn(batch, vocab + 3)[:, :vocab] * 4  # strided rows
        logits[logits.abs() < 0.3] = 0.0
        logits[0, ::7] = float("-inf")
        table = torch.cat([torch.tensor([[2], [0], [3]]), torch.randint(0, vocab, (3, 40)),
                           torch.randint(0, 50, (3, 60))], dim=1)  # rows | prompt | output (few distinct: counts > 1)
        rows, prompt, output = table[:, 0], table[:, 1:41], table[:, 41:]
        prompt[2], output[2] = vocab, vocab  # padding only: its row stays as it was
        prompt[0, :10] = vocab
        presence, frequency, repetition = torch.tensor([[0.5, 0.3, 1.3], [-1.25, 1.5, 1.0], [2.0, -0.7, 0.6]]).T
        got, want = logits.clone(), logits.clone()
        penalty_kernels.apply_penalties_(got, rows, prompt, output, presence, frequency, repetition)
        penalties.apply_penalties_reference(want, rows, prompt, output, presence, frequency, repetition)
        assert torch.equal(got, want), (got - want).abs().nan_to_num().max()
        assert torch.equal(got[1], logits[1]) and torch.equal(got[3], logits[3]) and not torch.equal(got[0], logits[0])

    def check_rms_norm(tokens, heads, dim, gated, strided):
        """x (and gate) as the model passes them: strided views of a wider projection output when ``strided``."""
        if strided:  # a head's first half of a [T, H, 2D] row block (q of q_gate); the gate one slice of a wide row
            x = torch.randn(tokens, heads, 2 * dim)[..., :dim]
            gate = torch.randn(tokens, 3 + heads * dim)[:, 3:].view(tokens, heads, dim)
        else:
            x, gate = torch.randn(tokens, heads, dim), torch.randn(tokens, heads, dim)
        x = x * 3.0 + 0.5  # rows of different scale than 1, so rstd matters
        weight = torch.randn(dim)
        gate = gate if gated else None
        want = norm.rms_norm_reference(x, weight, gate, 1e-6, not gated)
        got = norm_kernels.rms_norm(x, weight, gate, 1e-6, not gated)
        assert got.is_contiguous() and got.shape == x.shape
        compare("rms_norm", got, want)

    def check_add_rms_norm_gemm(rows, n, k, configs, gated_out=False):
        """ce::add_rms_norm_linear's skinny GEMM: the sum exactly, the projection of the norm against float64 (x a
        strided view, as the model's branch outputs can be); ``gated_out``: with the SiLU gate after it, as
        check_skinny_gemm's (ce::add_rms_norm_linear_silu_mul)."""
        x = torch.randn(rows, k + 6)[:, 3:-3] * 3.0
        residual = torch.randn(rows, k) * 3.0
        norm_weight = torch.randn(k) * 0.5
        weight = torch.randn(n, k) * k**-0.5
        want_sum, normed = norm.add_rms_norm_reference(x, residual, norm_weight, 1e-6)
        want = normed.double() @ weight.double().T
        if gated_out:
            gate, up = want.chunk(2, dim=1)
            want = gate * torch.sigmoid(gate) * up
        for c in configs:
            config = gemm_config(c)
            out, summed = gemv_kernels.add_rms_norm_skinny_gemm(x, residual, norm_weight, 1e-6, weight, config,
                                                                gated_out)
            assert torch.equal(summed, want_sum), f"add_rms_norm gemm sum {config_name(config)}"
            compare(f"add_rms_norm gemm {config_name(config)}", out.double(), want)

    def check_add_rms_norm_gemm_multipass():
        """The row's statistics in several passes: K (75) past the statistics block (NORM_BLOCK_MAX set to 32 for
        the check, as a row wider than 8,192 would take), its last block ragged."""
        saved = gemv_kernels.NORM_BLOCK_MAX
        gemv_kernels.NORM_BLOCK_MAX = 32
        try:
            check_add_rms_norm_gemm(1, 37, 75, gemm_configs)
        finally:
            gemv_kernels.NORM_BLOCK_MAX = saved

    def check_add_rms_norm_gemm_refuses_rows():
        """The norm prologue runs in the one-row GEMV only (from two rows ce::add_rms_norm_linear runs the norm
        apart): two rows, or one row on the few-rows loop, raise ValueError instead of running it."""
        residual, norm_weight, weight = torch.randn(2, 75), torch.randn(75), torch.randn(37, 75)
        for rows, config in ((2, None), (2, gemm_config((4, 16), 2)), (1, gemm_config((4, 16), 2))):
            try:
                gemv_kernels.add_rms_norm_skinny_gemm(torch.randn(rows, 75), residual[:rows], norm_weight, 1e-6,
                                                      weight, config)
            except ValueError as exc:
                assert "one-row GEMV" in str(exc), exc
            else:
                raise AssertionError(f"add_rms_norm_skinny_gemm ran at {rows} rows with {config}")

    def check_add_rms_norm(tokens, dim, strided):
        x, residual = torch.randn(tokens, dim) * 3.0, torch.randn(tokens, dim) * 3.0
        if strided:  # rows of a wider tensor
            x = torch.randn(tokens, dim + 7)[:, 7:] * 3.0
        weight = torch.randn(dim)
        want_sum, want_norm = norm.add_rms_norm_reference(x, residual, weight, 1e-6)
        got_sum, got_norm = norm_kernels.add_rms_norm(x, residual, weight, 1e-6)
        compare("add_rms_norm sum", got_sum, want_sum)
        compare("add_rms_norm norm", got_norm, want_norm)

    def check_silu_mul(rows, half, strided):
        gate_up = torch.randn(rows, 2 * half + 6)[:, 3:-3] if strided else torch.randn(rows, 2 * half)
        got = activation_kernels.silu_mul(gate_up)
        assert got.is_contiguous() and got.shape == (rows, half)
        compare("silu_mul", got, activation.silu_mul_reference(gate_up))

    def check_argmax(rows, vocab, chunk, dtype=torch.float32, strided=False):
        """ce::argmax's two passes against torch.argmax (the op's definition), with the cases its rule is about:
        ties (the first index wins, within a chunk and across chunks), a NaN (the first NaN wins, even over +inf),
        rows of -inf only, +inf; rows a strided view when ``strided``."""
        logits = torch.randn(rows, vocab + 7)[:, :vocab] if strided else torch.randn(rows, vocab)
        if rows > 0:
            logits[0, [3, vocab - 2]] = 50.0  # a tie across chunks (chunk < vocab)
        if rows > 1:
            logits[1, [vocab // 2, vocab // 2 + 1]] = 50.0  # a tie inside a chunk
        if rows > 2:
            logits[2, [1, vocab - 1]] = float("nan")
            logits[2, 0] = float("inf")
        if rows > 3:
            logits[3] = float("-inf")
        if rows > 4:
            logits[4, vocab - 1] = float("inf")
        logits = logits.to(dtype)
        got = argmax_kernels.argmax(logits, chunk)
        want = torch.argmax(logits, dim=-1)
        assert got.dtype == torch.long and torch.equal(got, want), f"argmax: got {got.tolist()}, want {want.tolist()}"

    def check_advance_decode_inputs(rows, width, block_size, ring_slots, ring_slot, vocab=300, chunk=64,
                                    given=False):
        """ce::advance_decode_inputs against its reference: each row's greedy token (ties, a NaN), live rows one
        position further (a block boundary, a position past the table's end), padding lanes (context 0) left alone,
        the tokens in the ring's next row; several chunks per row and more rows than one ROW_BLOCK. ``given``: the
        step's tokens come in (a sampled step), not the logits' argmax."""
        logits = torch.randn(rows, vocab)
        logits[0, [3, vocab - 2]] = 50.0  # a tie across chunks
        logits[rows - 1, [1, vocab - 1]] = float("nan")
        positions = torch.randint(0, width * block_size + 2, (rows,))
        positions[0] = block_size - 1  # the next position opens a block
        context = (positions + 1).to(torch.int32)
        context[rows // 2 :: 3] = 0  # padding lanes
        fields = {
            "logits": logits, "input_ids": torch.randint(0, 1000, (rows,)), "positions": positions,
            "slot_mapping": torch.randint(0, 99, (rows,)), "context_lens": context,
            "block_tables": torch.randint(1, 50, (rows, width), dtype=torch.int32),
            "token_ring": torch.full((ring_slots, rows + 3), -1, dtype=torch.long),
            "ring_slot": torch.tensor([ring_slot]),
        }
        if given:
            fields["tokens"] = torch.randint(0, vocab, (rows,))
        want = {k: v.clone() for k, v in fields.items()}
        want_tokens = decode_inputs.advance_decode_inputs_reference(**want, block_size=block_size)
        got = {k: v.clone() for k, v in fields.items()}
        got_tokens = decode_inputs_kernels.advance_decode_inputs(**got, block_size=block_size, chunk=chunk)
        assert torch.equal(got_tokens, want_tokens), f"advance_decode_inputs tokens: {got_tokens} vs {want_tokens}"
        if given:
            assert torch.equal(got_tokens, fields["tokens"]) and torch.equal(got["input_ids"], fields["tokens"])
        for name in fields.keys() - {"logits"}:  # the rest: what it writes
            assert torch.equal(got[name], want[name]), f"advance_decode_inputs {name}: {got[name]} vs {want[name]}"

    checks = {
        "advance_decode_inputs": lambda: check_advance_decode_inputs(21, 3, 4, ring_slots=4, ring_slot=6),
        "advance_decode_inputs_one_row": lambda: check_advance_decode_inputs(1, 5, 16, ring_slots=2, ring_slot=0),
        "advance_decode_inputs_given_tokens": lambda: check_advance_decode_inputs(21, 3, 4, ring_slots=4, ring_slot=3,
                                                                                  given=True),
        "argmax_chunks": lambda: check_argmax(6, 300, chunk=64),
        "argmax_one_chunk_strided": lambda: check_argmax(5, 50, chunk=64, strided=True),
        "argmax_no_rows": lambda: check_argmax(0, 10, chunk=16),
        "argmax_half": lambda: check_argmax(6, 300, chunk=64, dtype=torch.float16),  # model-dtype logits (no bf16 here)
        # a column block past the row's end (1,100 > BLOCK), strided rows (a slice of wider rows), no rows
        "silu_mul": lambda: check_silu_mul(3, 1100, strided=False),
        "add_rms_norm": lambda: check_add_rms_norm(5, 48, strided=False),  # D not a power of two
        "add_rms_norm_strided": lambda: check_add_rms_norm(3, 64, strided=True),
        "add_rms_norm_no_rows": lambda: check_add_rms_norm(0, 16, strided=False),
        "silu_mul_strided_rows": lambda: check_silu_mul(4, 40, strided=True),
        "silu_mul_no_rows": lambda: check_silu_mul(0, 8, strided=False),
        # rows not a multiple of BLOCK_R, D not a power of two, H = 1 (layer norms) and H > 1 (per-head norms)
        "rms_norm_zero_centred": lambda: check_rms_norm(7, 1, 48, gated=False, strided=False),
        "rms_norm_strided_heads": lambda: check_rms_norm(5, 3, 32, gated=False, strided=True),
        "rms_norm_gated_strided": lambda: check_rms_norm(9, 4, 16, gated=True, strided=True),
        "rms_norm_no_rows": lambda: check_rms_norm(0, 2, 16, gated=True, strided=False),
        "store_kv": check_store_kv,
        "decode_gqa2_d16_bs4_split1": lambda: check_decode(4, 2, 16, 4, 1),
        "decode_gqa2_d16_bs4_split4": lambda: check_decode(4, 2, 16, 4, 4),
        "decode_gqa3_d32_bs16_split2": lambda: check_decode(6, 2, 32, 16, 2),
        "decode_auto_splits": lambda: check_decode(2, 1, 16, 8, None),
        # (Hq, Hkv, D, rotary_dim, block_size, splits): the model's partial rotary (1/4) and full rotary; blocks smaller
        # and larger than the key tile; one split (gated in the kernel), and splits (merged and gated by the reduce
        # kernel, the last split owning the new token), 3 of them: not a power of two
        "attention_decode_gqa2_d16_bs4_split1": lambda: check_attention_decode(4, 2, 16, 4, 4, 1),
        "attention_decode_gqa2_d16_bs4_split4": lambda: check_attention_decode(4, 2, 16, 4, 4, 4),
        "attention_decode_gqa4_d32_bs16_split2": lambda: check_attention_decode(8, 2, 32, 8, 16, 2),
        "attention_decode_gqa4_query_rows16": lambda: check_attention_decode(8, 2, 32, 8, 16, 2, query_rows=16),
        "attention_decode_mha_full_rotary_split3": lambda: check_attention_decode(2, 2, 16, 16, 16, 3),
        "attention_decode_d24_contiguous_split1": lambda: check_attention_decode(3, 1, 24, 6, 4, 1, strided=False),
        "attention_decode_auto_splits": lambda: check_attention_decode(2, 1, 16, 8, 8, None),
        "attention_decode_bs32_tile16_split2": lambda: check_attention_decode(4, 2, 16, 4, 32, 2, block_n=16),
        # the step inputs and each split's first tile loaded before the PDL wait (small batches' default): empty
        # splits, one tile a split, and two (the first folded in apart from the loop)
        "attention_decode_early_loads_split4": lambda: check_attention_decode(4, 2, 16, 4, 4, 4, early_loads=True),
        "attention_decode_early_loads_tile16_split2": lambda: check_attention_decode(4, 2, 16, 4, 32, 2, block_n=16,
                                                                                     early_loads=True),
        # the reduce kernel with each query head's channels over several programs (the rule's form at small batches
        # on a GPU), both orders of the split kernel's loads
        "attention_decode_reduce_parts4": lambda: check_attention_decode(8, 2, 32, 8, 16, 4, reduce_parts=4),
        "attention_decode_early_loads_reduce_parts2": lambda: check_attention_decode(4, 2, 16, 4, 4, 4,
                                                                                     early_loads=True, reduce_parts=2),
        # the split ceiling (MAX_SPLITS, the rule's count at batch 1 on an H100 or H200), 16-token tiles: one tile a
        # split at 2,049 tokens; two at 2,100 (the first before the wait), 62 of the splits empty
        "attention_decode_split_ceiling": lambda: check_attention_decode(
            2, 1, 16, 4, 16, paged_attention_kernels.MAX_SPLITS, block_n=16, early_loads=True,
            context_lens=(0, 2049, 2100)),
        "prefill_gqa2_d16_bs4": lambda: check_prefill(4, 2, 16, 4),
        "prefill_gqa3_d32_bs16": lambda: check_prefill(3, 1, 32, 16),
        "prefill_empty_runs": lambda: check_prefill(2, 2, 16, 8, (0, 2, 0, 0, 17, 1, 0), (4, 0, 3, 0, 20, 1, 9)),
        # The 16-bit inputs' tile shape (128 rows): 64 tokens a tile at GQA 2, so the 70-token prompt has a second
        # tile whose first 64 keys need no causal mask, and 16-key steps leave whole unmasked steps before the
        # diagonal for the prefixed sequences too
        "prefill_128_rows": lambda: check_prefill(4, 2, 16, 4, (70, 0, 3, 33), (0, 2, 37, 5),
                                                  paged_attention_kernels.PrefillTile(128, 16, 8, 3)),
        "verify_by_rows_gqa2_bs4": lambda: check_verify(4, 2, 16, 4, 3, by_rows=True),
        "verify_by_rows_one_split": lambda: check_verify(4, 2, 16, 4, 3, by_rows=True, num_splits=1),
        "verify_by_rows_three_splits": lambda: check_verify(4, 2, 16, 4, 3, by_rows=True, num_splits=3),
        "verify_by_rows_one_row": lambda: check_verify(3, 1, 32, 16, 1, by_rows=True),
        "verify_prefill_kernel_gqa2_bs4": lambda: check_verify(4, 2, 16, 4, 3, by_rows=False),
        "conv_prefill": lambda: check_conv_prefill([1, 0, 7, 2]),  # shorter and longer than W - 1, and empty
        "conv_prefill_empty_runs": lambda: check_conv_prefill([0, 0, 5, 1, 0, 3, 0, 0, 2]),
        "conv_prefill_empty_section": lambda: check_conv_prefill([3, 6], sections=(12, 0, 8)),
        "conv_decode": check_conv_decode,
        "prefill_gates": check_prefill_gates,
        "delta_prefill_recurrent_hv_eq_hk": lambda: check_gdr_prefill_recurrent(2, 2, 16, 32, [5, 0, 23, 1]),
        "delta_prefill_recurrent_hv_2x_hk": lambda: check_gdr_prefill_recurrent(2, 4, 32, 16, [9, 40, 0]),
        # a captured step's padding: empty sequences, then one with the bucket's remaining tokens
        "delta_prefill_recurrent_padding": lambda: check_gdr_prefill_recurrent(2, 4, 32, 16, [9, 3], (0, 0, 7)),
        "attention_prologue_gqa4_partial_rotary": lambda: check_attention_prologue(8, 2, 16, 8),
        "attention_prologue_gqa3_d24_full_rotary": lambda: check_attention_prologue(3, 1, 24, 24),
        "delta_decode_hv_eq_hk": lambda: check_gdr_decode(2, 2, 16, 32, 16),
        "delta_decode_hv_3x_hk": lambda: check_gdr_decode(2, 6, 32, 16, 8),
        "gated_deltanet_decode_hv_eq_hk": lambda: check_gated_deltanet_decode(2, 2, 16, 32),
        # Hv = 3 Hk, and K, V not powers of two (masked tiles; the norm's mean over V, not BLOCK_V)
        "gated_deltanet_decode_hv_3x_hk_ragged": lambda: check_gated_deltanet_decode(2, 6, 12, 20),
        "gated_deltanet_decode_unfused_path": lambda: check_gated_deltanet_decode(2, 6, 12, 20, fused=False),
        # the state walked in V tiles: 4 whole tiles; 3 tiles of 8 over V = 20 (the last one masked), 3 value heads
        "gated_deltanet_decode_v_tiles": lambda: check_gated_deltanet_decode(2, 2, 16, 32, block_v=8),
        "gated_deltanet_decode_v_tiles_ragged": lambda: check_gated_deltanet_decode(2, 6, 12, 20, block_v=8),
        # G = 2 in tiles: a program walks 2 heads x 4 tiles, each tile's loads issued before the previous tile's
        # stores; and the same walk with the loads in walk order
        "gated_deltanet_decode_v_tiles_group_2": lambda: check_gated_deltanet_decode(2, 4, 16, 32, block_v=8),
        # the tiles over programs (SPLIT_V): three steps in a row, so that stale counts or a q/k history written
        # early would show; G = 1 and 3 (ragged), the walk's prefetch on (G > 1) and off
        "gated_deltanet_decode_split_v": lambda: check_gated_deltanet_decode(2, 2, 16, 32, block_v=8, split_v=True,
                                                                             repeats=3),
        "gated_deltanet_decode_split_v_group_3_ragged": lambda: check_gated_deltanet_decode(
            2, 6, 12, 20, block_v=8, split_v=True, repeats=3, prefetch=True),
        "gated_deltanet_decode_split_v_group_2_in_order": lambda: check_gated_deltanet_decode(
            2, 4, 16, 32, block_v=16, split_v=True, repeats=2, prefetch=False),
        "gated_deltanet_decode_v_tiles_group_2_in_order": lambda: check_gated_deltanet_decode(
            2, 4, 16, 32, block_v=8, prefetch=False),
        # the launcher's own pick at 20 sequences: tiles of 32 over V = 64 (decode_config)
        "gated_deltanet_decode_default_launch_batch_20": lambda: check_gated_deltanet_decode(1, 1, 16, 64, fused=None,
                                                                                               batch=20),
        # one row: the one-row GEMV (BLOCK_M 1), plain, strided, with either prologue; and on the few-rows loop
        # (BLOCK_M 2, the second row masked) plain; the norm prologue refused past the one-row GEMV
        "gemm_m1_gemv": lambda: check_skinny_gemm(1, 37, 75, gemm_configs + [(4, 32)]),
        "gemm_m1_strided": lambda: check_skinny_gemm(1, 37, 75, gemm_configs, strided=True),
        "gemm_m1_on_rows_path": lambda: check_skinny_gemm(1, 37, 75, gemv_rows_configs, block_m=2),
        "gemm_norm_m1": lambda: check_add_rms_norm_gemm(1, 37, 75, gemm_configs + [(2, 64)]),
        "gemm_norm_m1_multipass": check_add_rms_norm_gemm_multipass,
        "gemm_norm_refuses_rows": check_add_rms_norm_gemm_refuses_rows,
        "gemm_gated_m1": lambda: check_skinny_gemm(1, 37, 75, gemm_configs + [(2, 64)], gated=True),
        # the one-row configs themselves, on a small ragged shape
        "gemm_gemv_configs": lambda: check_skinny_gemm(1, 40, 600, gemv_kernels.GEMV_CONFIGS),
        # 2..8 rows: the few-rows GEMV (BLOCK_M 2, 4, 8: x's rows padded, masked), plain (and strided at 2 rows) and
        # with the SiLU gate
        "gemm_m2_strided": lambda: check_skinny_gemm(2, 37, 75, gemv_rows_configs, strided=True),
        **{f"gemm_rows_gemv_m{m}": (lambda m=m: check_skinny_gemm(m, 37, 75, gemv_rows_configs))
           for m in (2, 3, 5, 8)},
        **{f"gemm_rows_gated_gemv_m{m}": (lambda m=m: check_skinny_gemm(m, 37, 75, gemv_rows_configs, strided=True,
                                                                         gated=True))
           for m in (2, 3, 5, 8)},
        # the tensor-core loop (BLOCK_M 8 or 16: x's rows padded, masked), plain, strided, with the SiLU gate, at
        # 1-16 rows; BLOCK_N 16 and 32 over N = 37 and K = 75 in 3 and 2 chunks
        **{f"gemm_dot_m{m}": (lambda m=m: check_skinny_gemm(m, 37, 75, dot_configs, strided=m == 3))
           for m in (1, 3, 8, 13, 16)},
        **{f"gemm_dot_gated_m{m}": (lambda m=m: check_skinny_gemm(m, 37, 75, dot_configs, gated=True))
           for m in (3, 16)},
        # the rule's configs themselves, on a small ragged shape
        **{f"gemm_rule_configs_m{m}": (lambda m=m: check_skinny_gemm(m, 40, 600, rule_configs(m)))
           for m in (2, 3, 5, 8)},
        **{f"gemm_rule_configs_gated_m{m}": (lambda m=m: check_skinny_gemm(m, 40, 600, rule_configs(m), gated=True))
           for m in (1, 2, 3, 5)},
        "gemm_rule_configs_norm_m1": lambda: check_add_rms_norm_gemm(1, 40, 600, rule_configs(1)),
        # full tiles (N = 32, K = 128): the one-row loop without masks, a chunk short, the last chunk's product after
        # it; K in 4 chunks and in one (the loop runs no iteration); plain, gated, strided; at 3 rows (2 + 1) the
        # few-rows loop, masked, with NaN right past x and the weight
        **{f"gemm_full_tiles_m{m}": (lambda m=m: check_skinny_gemm(m, 32, 128, [(4, 32), (8, 128)], full=True))
           for m in (1, 3)},
        "gemm_full_tiles_gated_strided_m1": lambda: check_skinny_gemm(1, 32, 128, [(4, 32), (8, 128)], strided=True,
                                                                      gated=True, full=True),
        "gemm_full_tiles_norm_m1": lambda: check_add_rms_norm_gemm(1, 32, 128, [(4, 32), (8, 128)]),
        # the SiLU gate in the epilogue (the weight's rows [gate | up]: 19 gate columns over BLOCK_N / 2 of 8 and
        # 16, a ragged last block; K = 75 ragged) at 1-5 rows (3 and 5 as 4 + 1), with the norm prologue at one
        # row; full tiles with NaN past x and the weight; the rule's configs on the model's gate_up shape kind
        **{f"gemm_gated_out_m{m}": (lambda m=m: check_skinny_gemm(m, 38, 75, gemm_configs[:1] + [(32, 64)],
                                                                  gated_out=True)) for m in (1, 2, 3, 4, 5)},
        "gemm_gated_out_norm_m1": lambda: check_add_rms_norm_gemm(1, 38, 75, gemm_configs + [(2, 64)],
                                                                  gated_out=True),
        **{f"gemm_full_tiles_gated_out_m{m}": (lambda m=m: check_skinny_gemm(m, 32, 128, [(4, 32), (8, 128)],
                                                                             full=True, gated_out=True))
           for m in (1, 3)},
        "gemm_full_tiles_gated_out_norm_m1": lambda: check_add_rms_norm_gemm(1, 32, 128, [(4, 32), (8, 128)],
                                                                             gated_out=True),
        **{f"gemm_rule_configs_gated_out_m{m}": (lambda m=m: check_skinny_gemm(
            m, 40, 600, [gemv_kernels.skinny_config(m, 7168, 1024)], gated_out=True)) for m in (1, 2, 3, 5)},
        "apply_penalties": lambda: check_apply_penalties(5, penalty_kernels.BLOCK + 300),
    }
    results = {}
    for name, fn in checks.items():
        try:
            fn()
            results[name] = None
        except Exception as exc:  # reported to the parent, which fails that test with this message
            results[name] = f"{type(exc).__name__}: {exc}"
    return results


# ----------------------------------------------------------------------------------------------------------------
# Parent: pytest tests.
# ----------------------------------------------------------------------------------------------------------------

CHECK_NAMES = [
    "advance_decode_inputs",
    "advance_decode_inputs_one_row",
    "advance_decode_inputs_given_tokens",
    "argmax_chunks",
    "argmax_one_chunk_strided",
    "argmax_no_rows",
    "argmax_half",
    "silu_mul",
    "add_rms_norm",
    "add_rms_norm_strided",
    "add_rms_norm_no_rows",
    "silu_mul_strided_rows",
    "silu_mul_no_rows",
    "rms_norm_zero_centred",
    "rms_norm_strided_heads",
    "rms_norm_gated_strided",
    "rms_norm_no_rows",
    "store_kv",
    "decode_gqa2_d16_bs4_split1",
    "decode_gqa2_d16_bs4_split4",
    "decode_gqa3_d32_bs16_split2",
    "decode_auto_splits",
    "attention_decode_gqa2_d16_bs4_split1",
    "attention_decode_gqa2_d16_bs4_split4",
    "attention_decode_gqa4_d32_bs16_split2",
    "attention_decode_gqa4_query_rows16",
    "attention_decode_mha_full_rotary_split3",
    "attention_decode_d24_contiguous_split1",
    "attention_decode_auto_splits",
    "attention_decode_bs32_tile16_split2",
    "attention_decode_early_loads_split4",
    "attention_decode_early_loads_tile16_split2",
    "attention_decode_reduce_parts4",
    "attention_decode_early_loads_reduce_parts2",
    "attention_decode_split_ceiling",
    "prefill_gqa2_d16_bs4",
    "prefill_gqa3_d32_bs16",
    "prefill_empty_runs",
    "prefill_128_rows",
    "verify_by_rows_gqa2_bs4",
    "verify_by_rows_one_split",
    "verify_by_rows_three_splits",
    "verify_by_rows_one_row",
    "verify_prefill_kernel_gqa2_bs4",
    "conv_prefill",
    "conv_prefill_empty_runs",
    "conv_prefill_empty_section",
    "conv_decode",
    "prefill_gates",
    "delta_prefill_recurrent_hv_eq_hk",
    "delta_prefill_recurrent_hv_2x_hk",
    "delta_prefill_recurrent_padding",
    "attention_prologue_gqa4_partial_rotary",
    "attention_prologue_gqa3_d24_full_rotary",
    "delta_decode_hv_eq_hk",
    "delta_decode_hv_3x_hk",
    "gated_deltanet_decode_hv_eq_hk",
    "gated_deltanet_decode_hv_3x_hk_ragged",
    "gated_deltanet_decode_unfused_path",
    "gated_deltanet_decode_v_tiles",
    "gated_deltanet_decode_v_tiles_ragged",
    "gated_deltanet_decode_v_tiles_group_2",
    "gated_deltanet_decode_split_v",
    "gated_deltanet_decode_split_v_group_3_ragged",
    "gated_deltanet_decode_split_v_group_2_in_order",
    "gated_deltanet_decode_v_tiles_group_2_in_order",
    "gated_deltanet_decode_default_launch_batch_20",
    "gemm_m1_gemv",
    "gemm_m1_strided",
    "gemm_m1_on_rows_path",
    "gemm_norm_m1",
    "gemm_norm_m1_multipass",
    "gemm_norm_refuses_rows",
    "gemm_gated_m1",
    "gemm_gemv_configs",
    "gemm_m2_strided",
    *[f"gemm_rows_{kind}gemv_m{m}" for kind in ("", "gated_") for m in (2, 3, 5, 8)],
    *[f"gemm_dot_m{m}" for m in (1, 3, 8, 13, 16)],
    *[f"gemm_dot_gated_m{m}" for m in (3, 16)],
    *[f"gemm_rule_configs_m{m}" for m in (2, 3, 5, 8)],
    *[f"gemm_rule_configs_gated_m{m}" for m in (1, 2, 3, 5)],
    "gemm_rule_configs_norm_m1",
    *[f"gemm_full_tiles_m{m}" for m in (1, 3)],
    "gemm_full_tiles_gated_strided_m1",
    "gemm_full_tiles_norm_m1",
    *[f"gemm_gated_out_m{m}" for m in (1, 2, 3, 4, 5)],
    "gemm_gated_out_norm_m1",
    *[f"gemm_full_tiles_gated_out_m{m}" for m in (1, 3)],
    "gemm_full_tiles_gated_out_norm_m1",
    *[f"gemm_rule_configs_gated_out_m{m}" for m in (1, 2, 3, 5)],
    "apply_penalties",
]


CHILD_ARGV = [sys.executable, __file__, "--child"]


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    return background.child_json(CHILD_ARGV)


@pytest.mark.background_child(CHILD_ARGV)  # started in the background: tests/background.py
def test_every_check_is_listed(interpreter_results):
    assert sorted(interpreter_results) == sorted(CHECK_NAMES)


@pytest.mark.background_child(CHILD_ARGV)
@pytest.mark.parametrize("name", CHECK_NAMES)
def test_kernel_matches_reference_in_interpreter(interpreter_results, name):
    assert name in interpreter_results, f"check {name} did not run"
    error = interpreter_results[name]
    assert error is None, error


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1")
    sys.path.insert(0, str(REPO))
    from tests import interpreter

    interpreter.install()  # Triton's interpreter without its repeated patching
    print(json.dumps(_child_checks()))

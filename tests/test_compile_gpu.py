"""Compiled decode on CUDA: the graphs are really captured and replayed, and replays equal eager decode.

The same properties as tests/test_compile.py, with CUDA graphs in play (docs/ARCHITECTURE.md, "Compile and capture"):
* capture is real: with the runner's own capture (the default) every bucket has its ``torch.cuda.CUDAGraph``; with
  cudagraph trees (``CE_CUDA_GRAPHS=trees``) ``torch._inductor.config.triton.cudagraph_or_error`` (where this torch
  has it) turns a skipped graph into an error, and ``counters["inductor"]["cudagraph_skips"]`` must stay 0;
* one CUDA graph per bucket (at most three compiles: graphs.expected_compiles), no graph break, no recompile after warm-up; warm-up leaves live sequences alone;
* replayed logits equal eager logits (fp32 model; the same ``ce`` CUDA kernels run in both, so only Inductor's
  fusions differ); rows outside the batch are bit-identical after a replay; padding writes only null rows;
* a stream where sequences join, finish (slots and blocks reused) and reorder between replays: each sequence's
  logits equal its solo eager run — a replay reads the static buffers as they are now, not as recorded.

Quick (helpers shared with the CPU tests live in tests/compile_helpers.py): four buckets, a tiny model. Measured on an
H200 (torch 2.11, fresh machine, cold caches): 142 s in all, of which 38 s compile + capture (3 compiles, 4 CUDA
graphs) and most of the rest the first-use JIT of the Triton/FLA kernels; replayed steps ~0.8 ms vs 7.3 ms eager.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compiled_engine.runtime import Runtime
from graphs import expected_compiles
from tests.compile_helpers import (
    draw_sampling_inputs,
    reference_draw,
    assert_rows_close,
    assert_logits_close,
    assert_same_greedy,
    assert_stream_step_close,
    cache_buffers,
    eager_decode_step,
    graph_stats,
    null_rows,
    restore,
    rows,
    snapshot,
    written_rows,
)

# One worker runs this module under pytest-xdist's --dist loadgroup (bench/gpu_tests.sh): its tests share one
# compiled runtime (the module fixture), built once.
pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("compile_gpu")]

BUCKETS = (1, 2, 4, 8)
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 256
BLOCK_SIZE = 16
NUM_KV_BLOCKS = 128


# --------------------------------------------------------------------------------------------------------------
# helpers (the shared ones are in tests/compile_helpers.py)
# --------------------------------------------------------------------------------------------------------------


def changed_rows(name: str, after: torch.Tensor, before: torch.Tensor, allowed: set[int]) -> list[int]:
    a, b = rows(name, after), rows(name, before)
    differs = (a != b).flatten(1).any(1).nonzero().flatten().tolist()
    return [r for r in differs if r not in allowed]


def skips() -> int:
    return torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]


def replayed(runner, step, sampling=None):
    """``runner(step, sampling)``, which must have replayed a captured graph: the runner falls back to eager decode
    for a batch no bucket covers or a variant it lacks, and a replay compared with eager would then be eager's."""
    calls = []
    replay = runner._replay_step
    runner._replay_step = lambda *args: calls.append(args) or replay(*args)
    try:
        out = runner(step, sampling)
    finally:
        del runner._replay_step
    assert len(calls) == 1, f"runner({step.num_sequences} rows, sampling={sampling is not None}) ran eagerly"
    return out


# --------------------------------------------------------------------------------------------------------------
# fixture
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_compiled(qwen3_5_text_tied_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import torch._inductor.config as inductor_config

    with contextlib.ExitStack() as stack:
        if hasattr(inductor_config.triton, "cudagraph_or_error"):  # a skipped CUDA graph raises instead
            stack.enter_context(inductor_config.patch({"triton.cudagraph_or_error": True}))
        rt = Runtime.from_pretrained(
            str(qwen3_5_text_tied_path),
            device="cuda",
            dtype="float32",
            compile=False,  # compiled below, with live sequences present
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=MAX_NUM_SEQS,
            num_kv_blocks=NUM_KV_BLOCKS,
            block_size=BLOCK_SIZE,
        )
        live = [rt.add_sequence(list(range(1, n + 1))) for n in (5, 17, 40)]
        rt.prefill(live)
        before = snapshot(rt.model)
        graphs0, breaks0 = graph_stats()
        skips0 = skips()
        runner = rt.compile_decode(buckets=BUCKETS)
        torch.cuda.synchronize()
        graphs1, breaks1 = graph_stats()
        facts = {
            "graphs_compiled": graphs1 - graphs0,
            "graph_breaks": breaks1 - breaks0,
            "cudagraph_skips": skips() - skips0,
            "warmup_changed": {
                name: changed_rows(name, buf, before[name], null_rows(name, BLOCK_SIZE))
                for name, buf in cache_buffers(rt.model).items()
                if changed_rows(name, buf, before[name], null_rows(name, BLOCK_SIZE))
            },
            "startup_seconds": runner.startup_seconds,
        }
        for seq in live:
            rt.release(seq)
        yield rt, runner, facts


# --------------------------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------------------------


def test_graphs_captured_one_per_bucket(gpu_compiled):
    rt, runner, facts = gpu_compiled
    print(f"\ncompile + capture of {len(BUCKETS)} buckets: {facts['startup_seconds']:.1f} s")
    assert runner.variants == (False, True)  # greedy and sampling graphs
    # per variant: bucket 8 static, one recompile with the batch symbolic (buckets 2 and 4), batch 1 specialised
    assert facts["graphs_compiled"] == 2 * 3 == expected_compiles(BUCKETS)
    assert facts["graph_breaks"] == 0
    assert facts["cudagraph_skips"] == 0, "reduce-overhead skipped CUDA graphs (see TORCH_LOGS=perf_hints)"
    if os.environ.get("CE_CUDA_GRAPHS", "runner") == "runner":  # the runner's own graphs (the default)
        assert runner.capture == "runner" and runner.captured_buckets == (1, 2, 4, 8)
    else:
        assert runner.capture == "trees" and runner.captured_buckets == ()
    assert facts["warmup_changed"] == {}, "warm-up changed non-null rows of live sequences"


# Fewer examples than the CPU twin (tests/test_compile.py), which checks the same properties without CUDA graphs:
# each example here is a prefill and up to four eager + replayed steps on the GPU.
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_replays_match_eager(gpu_compiled, data):
    rt, runner, _ = gpu_compiled
    vocab = rt.model_config.vocab_size
    token = st.integers(0, vocab - 1)
    num_live = data.draw(st.integers(1, MAX_NUM_SEQS), label="live sequences")
    prompts = [data.draw(st.lists(token, min_size=1, max_size=70), label=f"prompt {i}") for i in range(num_live)]
    seqs = [rt.add_sequence(p) for p in prompts]
    skips0 = skips()
    try:
        rt.prefill(seqs)
        for _ in range(data.draw(st.integers(1, 4), label="steps")):
            size = data.draw(st.integers(1, num_live), label="batch size")
            batch = data.draw(st.permutations(seqs), label="order")[:size]
            for seq in batch:
                seq.token_ids.append(data.draw(token))
            with torch.inference_mode():
                step = rt.build_step(batch, [1] * size, is_prefill=False)
                before = snapshot(rt.model)
                eager = rt.model.compute_logits(rt.model(step))
                eager_after = snapshot(rt.model)
                restore(rt.model, before)
                compiled = replayed(runner, step)
            assert_logits_close(compiled.logits.float(), eager)
            assert_same_greedy(compiled.tokens, eager)
            padded = runner.policy.bucket_for(size) > size
            for name, buf in cache_buffers(rt.model).items():
                allowed = written_rows(name, step) | (null_rows(name, BLOCK_SIZE) if padded else set())
                assert changed_rows(name, buf, before[name], allowed) == [], f"{name}: rows outside the batch changed"
                written = torch.tensor(sorted(written_rows(name, step)), device=buf.device)
                assert_rows_close(rows(name, buf)[written], rows(name, eager_after[name])[written])
    finally:
        for seq in seqs:
            rt.release(seq)
    assert skips() == skips0


@settings(max_examples=4, deadline=None)  # see test_replays_match_eager
@given(data=st.data())
def test_sampled_replays_draw_what_the_sampler_draws(gpu_compiled, data):
    """The sampling graph (ce::sample inside the replay): its tokens are ce::sample's CPU reference draw from the
    graph's own logits, its logits the eager step's, and its tokens the next step's input ids."""
    rt, runner, _ = gpu_compiled
    vocab = rt.model_config.vocab_size
    token = st.integers(0, vocab - 1)
    num_live = data.draw(st.integers(1, MAX_NUM_SEQS), label="live sequences")
    # Every draw that can end the example comes before the first sequence is added: an example that hypothesis ends
    # mid-draw (an overrun) must leave no sequence behind, or later examples find the state slots taken.
    prompts = [data.draw(st.lists(token, min_size=1, max_size=40), label=f"prompt {i}") for i in range(num_live)]
    seqs = [rt.add_sequence(p) for p in prompts]
    try:
        rt.prefill(seqs)
        for _ in range(data.draw(st.integers(1, 3), label="steps")):
            size = data.draw(st.integers(1, num_live), label="batch size")
            batch = data.draw(st.permutations(seqs), label="order")[:size]
            for seq in batch:
                seq.token_ids.append(data.draw(token))
            sampling = draw_sampling_inputs(data, len(batch), vocab)
            with torch.inference_mode():
                step = rt.build_step(batch, [1] * size, is_prefill=False)
                before = snapshot(rt.model)
                eager = rt.model.compute_logits(rt.model(step))
                restore(rt.model, before)
                compiled = replayed(runner, step, sampling)
                assert_logits_close(compiled.logits.float(), eager)
                want = reference_draw(compiled.logits, sampling)
                assert torch.equal(compiled.tokens.cpu(), want)
                assert torch.equal(runner.static.input_ids[:size].cpu(), want)
    finally:
        for seq in seqs:
            rt.release(seq)


@settings(max_examples=5, deadline=None)  # see test_replays_match_eager
@given(data=st.data())
def test_stream_matches_solo_eager_runs(gpu_compiled, data):
    """Sequences join, finish and reorder between replays; each one's logits equal its solo eager run."""
    rt, runner, _ = gpu_compiled
    vocab = rt.model_config.vocab_size
    token = st.integers(0, vocab - 1)
    n = data.draw(st.integers(2, 10), label="sequences")
    prompts = [data.draw(st.lists(token, min_size=1, max_size=70), label=f"prompt {i}") for i in range(n)]
    feeds = [data.draw(st.lists(token, min_size=1, max_size=6), label=f"tokens {i}") for i in range(n)]
    joins = [data.draw(st.integers(0, 4), label=f"joins at step {i}") for i in range(n)]

    solo = []
    for prompt, feed in zip(prompts, feeds):
        seq = rt.add_sequence(prompt)
        try:
            rt.prefill([seq])
            logits = []
            for t in feed:
                seq.token_ids.append(t)
                logits.append(eager_decode_step(rt, [seq])[0])
            solo.append(logits)
        finally:
            rt.release(seq)

    active: dict[int, object] = {}
    done = [0] * n
    step = 0
    try:
        while any(done[i] < len(feeds[i]) for i in range(n)):
            waiting = [i for i in range(n) if joins[i] <= step and i not in active and done[i] == 0]
            for i in waiting[: MAX_NUM_SEQS - len(active)]:  # prefilled one by one, as in the solo runs
                active[i] = rt.add_sequence(prompts[i])
                rt.prefill([active[i]])
            order = data.draw(st.permutations(sorted(active)), label=f"order at step {step}")
            if order:
                for i in order:
                    active[i].token_ids.append(feeds[i][done[i]])
                logits = rt.decode_step([active[i] for i in order])  # replays (rt.decode_fn is the runner)
                for row, i in enumerate(order):
                    assert_stream_step_close(logits[row], solo[i][done[i]])
                    done[i] += 1
                    if done[i] == len(feeds[i]):
                        rt.release(active.pop(i))
            step += 1
    finally:
        for seq in active.values():
            rt.release(seq)


def test_replays_across_buckets_never_recompile(gpu_compiled):
    """Decode steps of every bucket, in and out of order, replay the captured graphs: no compile and no skipped
    capture (their speed is the bench's: bench latency)."""
    rt, runner, _ = gpu_compiled
    stats0, skips0 = graph_stats(), skips()
    seqs = [rt.add_sequence([i + 1] * (i + 3)) for i in range(MAX_NUM_SEQS)]
    try:
        rt.prefill(seqs)
        for size in (1, 3, 8, 2, 5, 8, 1):
            for seq in seqs[:size]:
                seq.token_ids.append(7)
            rt.decode_step(seqs[:size])
    finally:
        for seq in seqs:
            rt.release(seq)
    assert graph_stats() == stats0 and skips() == skips0


def test_runner_outputs_are_eager_decode_and_its_argmax(gpu_compiled):
    """``runner(step)`` (what the engine samples from: the graph's own output buffers) equals eager decode, and its
    greedy tokens (``ce::argmax`` inside the graph) are exactly torch's argmax of the logits it returns."""
    rt, runner, _ = gpu_compiled
    seqs = [rt.add_sequence([3, 1, 4, 1, 5][: i + 2]) for i in range(3)]
    try:
        rt.prefill(seqs)
        for token in (9, 2, 6):
            for seq in seqs:
                seq.token_ids.append(token)
            with torch.inference_mode():
                step = rt.build_step(seqs, [1] * len(seqs), is_prefill=False)
                before = snapshot(rt.model)
                eager = rt.model.compute_logits(rt.model(step))
                restore(rt.model, before)
                compiled = replayed(runner, step)
                assert_logits_close(compiled.logits.float(), eager)
                assert torch.equal(compiled.tokens, compiled.logits.float().argmax(dim=-1))
    finally:
        for seq in seqs:
            rt.release(seq)


def test_greedy_feedback_in_place_equals_host_fed_tokens(gpu_compiled, monkeypatch):
    """The engine's greedy steady state: each step's input ids are the runner's last greedy tokens, which the graph
    left in its input buffer, and the rest of the step is what the graph's epilogue (``ce::advance_decode_inputs``)
    left there, so nothing is copied. The same greedy generation with the tokens fed
    from the host (the step copied in) gives the same tokens and logits, bit for bit; the in-place path was really
    taken; and the graph's own copy of the tokens in host memory (the token ring) holds them."""
    rt, runner, _ = gpu_compiled
    in_place, fill = [], runner.static.fill

    def watched_fill(step):
        in_place.append(step.input_ids.data_ptr() == runner.static.input_ids.data_ptr())
        return fill(step)

    monkeypatch.setattr(runner.static, "fill", watched_fill)
    runs = {}
    for feed_back in (True, False):
        seqs = [rt.add_sequence([2, 7, 1, 8][: i + 1]) for i in range(3)]
        try:
            with torch.inference_mode():
                ids = rt.prefill(seqs).argmax(dim=-1)
                tokens, logits = [ids.tolist()], []
                for _ in range(6):
                    for seq, token in zip(seqs, tokens[-1]):
                        seq.token_ids.append(token)
                    out = rt.decode(seqs, input_ids=ids if feed_back else None)
                    logits.append(out.logits.float().clone())
                    tokens.append(out.tokens.tolist())
                    assert out.host_tokens.tolist() == tokens[-1]  # the graph's own write to host memory
                    ids = out.tokens
            runs[feed_back] = tokens, logits
        finally:
            for seq in seqs:
                rt.release(seq)
    assert runs[True][0] == runs[False][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[True][1], runs[False][1]))
    assert in_place[:6] == [False] + [True] * 5 and not any(in_place[6:]), in_place

"""Tensor parallelism on CPU with gloo: TP=2 equals TP=1 equals HF; errors surface in the caller."""

from __future__ import annotations

import random

import pytest

from compiled_engine import LLM, Runtime, SamplingParams
from compiled_engine.tp_workers import FAULT_ENV, WorkerError
from tests import hf_models

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def prompts_for(vocab: int) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(vocab) for _ in range(n)] for n in (1, 17, 70)]


@pytest.mark.parametrize("variant", ["qwen3_5_text_tied", "qwen3_next_dense"])
def test_tp2_greedy_equals_tp1_and_hf(variant, build_hf_model, load_hf_model):
    path = str(build_hf_model(variant))
    model = load_hf_model(variant)
    prompts = prompts_for(model.config.vocab_size)
    expected = [hf_models.hf_greedy(model, p, GREEDY.max_tokens) for p in prompts]
    single = LLM(path, device="cpu", dtype="float32", enforce_eager=True, max_model_len=256)
    assert [o.token_ids for o in single.generate(prompts, GREEDY, use_tqdm=False)] == expected
    with LLM(path, device="cpu", dtype="float32", enforce_eager=True, max_model_len=256, tensor_parallel_size=2) as llm:
        assert llm.runtime.model.tp.world_size == 2
        # this rank really holds half of the heads and of the vocabulary: its weights against HF's
        ours, hf = dict(llm.runtime.model.named_parameters()), dict(model.named_parameters())

        def hf_rows(suffix: str, dim: int = 0) -> int:
            return next(v for name, v in hf.items() if name.endswith(suffix)).shape[dim]

        config = llm.runtime.model_config
        a, g = config.full_attention_layers[0], config.linear_attention_layers[0]
        qkv = sum(hf_rows(f".layers.{a}.self_attn.{p}_proj.weight") for p in "qkv")
        assert ours[f"layers.{a}.self_attn.qkv_proj"].shape[0] == qkv // 2
        assert ours[f"layers.{a}.self_attn.o_proj"].shape[1] == hf_rows(f".layers.{a}.self_attn.o_proj.weight", 1) // 2
        assert ours[f"layers.{g}.linear_attn.A_log"].shape[0] == hf_rows(f".layers.{g}.linear_attn.A_log") // 2
        assert ours[f"layers.{g}.linear_attn.out_proj"].shape[1] == hf_rows(
            f".layers.{g}.linear_attn.out_proj.weight", 1) // 2
        assert llm.runtime.model.embed_tokens.shape[0] == model.config.vocab_size // 2
        assert [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)] == expected


def test_tp2_with_a_vocabulary_that_does_not_divide(tmp_path):
    """The embedded tiny model has 257 tokens: the vocab shards are padded, the padding never sampled, nor counted
    by penalties, biased or ranked among prompt logprobs (every position's logits gathered over the shards)."""
    from compiled_engine.tiny_model import ensure_tiny_model

    path = ensure_tiny_model(str(tmp_path / "tiny"))
    prompts = prompts_for(257)
    adjusted = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, repetition_penalty=1.3),
                SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logit_bias={5: 4.0}, prompt_logprobs=3),
                SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, frequency_penalty=1.0, prompt_logprobs=0)]
    single_llm = LLM(path, device="cpu", enforce_eager=True, max_model_len=256)
    single, single_adjusted = (single_llm.generate(prompts, p, use_tqdm=False) for p in (GREEDY, adjusted))
    with LLM(path, device="cpu", enforce_eager=True, max_model_len=256, tensor_parallel_size=2) as llm:
        sharded, sharded_adjusted = (llm.generate(prompts, p, use_tqdm=False) for p in (GREEDY, adjusted))
    assert [o.token_ids for o in sharded] == [o.token_ids for o in single]
    assert [o.token_ids for o in sharded_adjusted] == [o.token_ids for o in single_adjusted]
    for one, two in zip(single_adjusted[1:], sharded_adjusted[1:]):
        assert [e.token_id for e in two.prompt_logprobs[1:]] == [e.token_id for e in one.prompt_logprobs[1:]]
        expected = [e.logprob for e in one.prompt_logprobs[1:]]
        assert [e.logprob for e in two.prompt_logprobs[1:]] == pytest.approx(expected, abs=1e-4)
        assert all(t < 257 for e in two.prompt_logprobs[1:] for t, _ in e.top)


def test_heads_that_do_not_divide_are_rejected(qwen3_5_text_untied_path):
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not divide"):
        Runtime.from_pretrained(str(qwen3_5_text_untied_path), device="cpu", tensor_parallel_size=3)


def test_worker_failure_at_load_raises_in_the_caller(qwen3_5_text_untied_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1:load")
    with pytest.raises(WorkerError, match="injected fault in worker 1 at 'load'"):
        Runtime.from_pretrained(str(qwen3_5_text_untied_path), device="cpu", tensor_parallel_size=2)


def test_worker_failure_during_a_step_raises_in_the_caller(qwen3_5_text_untied_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1:step")
    with LLM(str(qwen3_5_text_untied_path), device="cpu", enforce_eager=True, max_model_len=256,
             tensor_parallel_size=2) as llm:
        with pytest.raises(WorkerError, match="injected fault in worker 1 at 'step'"):
            llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)


def test_tp2_compiled_decode_keeps_the_all_reduces_in_the_graph(build_hf_model):
    """fullgraph=True compile of the sharded decode step (functional collectives traced, not graph breaks)."""
    from graphs import DecodeGraphRunner

    path = str(build_hf_model("qwen3_5_text_untied"))
    prompts = prompts_for(320)
    knobs = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=2)
    eager = LLM(path, enforce_eager=True, **knobs).generate(prompts, GREEDY, use_tqdm=False)
    with LLM(path, enforce_eager=False, tensor_parallel_size=2, **knobs) as llm:
        assert isinstance(llm.runtime.decode_fn, DecodeGraphRunner) and llm.runtime.decode_fn.fullgraph
        compiled = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in compiled] == [o.token_ids for o in eager]


def test_tp2_with_prefix_caching_equals_tp1_and_hits(build_hf_model):
    """Snapshots are saved and restored on every rank: a sharded prefix hit gives the unsharded output."""
    path = str(build_hf_model("qwen3_5_text_untied"))
    rng = random.Random(9)
    shared = [rng.randrange(320) for _ in range(140)]
    prompts = [shared + [rng.randrange(320) for _ in range(n)] for n in (3, 11, 20)]
    knobs = dict(device="cpu", dtype="float32", enforce_eager=True, max_model_len=256)
    expected = [o.token_ids for o in LLM(path, **knobs).generate(prompts, GREEDY, use_tqdm=False)]
    with LLM(path, tensor_parallel_size=2, enable_prefix_caching=True, prefix_snapshot_interval=64, **knobs) as llm:
        cold = llm.generate(prompts, GREEDY, use_tqdm=False)
        warm = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in cold] == expected
    assert [o.token_ids for o in warm] == expected
    # Cold: the later two wait for the first one's snapshot, then both restore it (rank 0 in one batched copy).
    assert [o.num_cached_tokens for o in cold] == [0, 128, 128]
    assert all(o.num_cached_tokens == 128 for o in warm)


def test_startup_reports_arriving_out_of_order_are_not_errors():
    """With 3+ ranks a fast worker may report "ready" before a slow one reports "loaded" (a real race)."""
    import queue

    from compiled_engine.tp_workers import TensorParallelWorkers

    workers = object.__new__(TensorParallelWorkers)  # only the queue protocol, no processes
    workers.world_size, workers.processes, workers.reports = 3, [], queue.Queue()
    workers.stages_seen = {1: set(), 2: set()}
    for report in [(2, "loaded"), (2, "ready"), (1, "loaded"), (1, "ready")]:
        workers.reports.put(report)
    workers.wait_for("loaded")
    workers.wait_for("ready")
    workers.reports.put((1, "Traceback (most recent call last): ..."))
    workers.stages_seen = {1: set(), 2: {"loaded"}}
    with pytest.raises(WorkerError, match="worker 1 failed"):
        workers.wait_for("loaded")



def run_tp_engine_without_close(model_path: str, device: str) -> None:
    """A TP=2 engine that is never closed, in a subprocess: its exit must stop the workers, not hang on them.

    Workers wait in a broadcast until told to stop. With NCCL, an exit that skipped close() hung until killed (the
    TP=2 bench, 2026-11-29); gloo's teardown is more forgiving, so the CUDA run is the sharp one
    (tests/test_tensor_parallel_gpu.py).
    """
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "from compiled_engine import LLM, SamplingParams\n"
        f"llm = LLM({model_path!r}, device={device!r}, enforce_eager=True, max_model_len=64, tensor_parallel_size=2)\n"
        "out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)\n"
        "print('generated', len(out[0].token_ids))\n"
    )
    repo = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "generated 2" in done.stdout


def test_a_tp_engine_never_closed_still_lets_the_interpreter_exit(tmp_path):
    from compiled_engine.tiny_model import ensure_tiny_model

    run_tp_engine_without_close(ensure_tiny_model(str(tmp_path / "tiny")), "cpu")


def test_tp2_overlapped_decode_equals_tp1(tmp_path):
    """The next step's input ids come from rank 0's device tensor of sampled tokens: the workers get them in the
    step broadcast like any other field."""
    from compiled_engine.tiny_model import ensure_tiny_model

    path = ensure_tiny_model(str(tmp_path / "tiny"))
    prompts = prompts_for(257)
    single = LLM(path, device="cpu", enforce_eager=True, max_model_len=256).generate(prompts, GREEDY, use_tqdm=False)
    with LLM(path, device="cpu", enforce_eager=True, max_model_len=256, tensor_parallel_size=2,
             overlap_decode=True) as llm:
        sharded = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in sharded] == [o.token_ids for o in single]


@pytest.mark.parametrize("variant", ["qwen3_5_text_untied", "qwen3_next_moe"])
def test_tp2_with_random_weights_made_on_each_rank_equals_tp1(variant, build_hf_model, tmp_path):
    """The bench's random weights of shapes without a checkpoint (bench.models.RandomWeights, a loader
    WeightSource handed to every rank): each rank makes the whole tensors and keeps its part, so TP=2 runs the TP=1
    model: the same greedy tokens and teacher-forced logits, on a dense model and a sparse-MoE one."""
    import shutil

    import torch

    from bench.models import RandomWeights

    folder = tmp_path / "config-only"
    folder.mkdir()
    shutil.copy(build_hf_model(variant) / "config.json", folder)
    vocab = 320  # of both variants' vocabularies (320 and 448)
    prompts = prompts_for(vocab)
    knobs = dict(device="cpu", dtype="float32", enforce_eager=True, max_model_len=128, weights=RandomWeights(seed=5))

    def run(llm: LLM) -> tuple[list[list[int]], torch.Tensor]:
        tokens = [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
        seq = llm.runtime.add_sequence(prompts[2] + tokens[2])
        logits = llm.runtime.prefill([seq], all_logits=True)
        llm.runtime.release(seq)
        return tokens, logits

    tokens, logits = run(LLM(str(folder), **knobs))
    with LLM(str(folder), tensor_parallel_size=2, **knobs) as llm:
        assert llm.runtime.model.embed_tokens.shape[0] == llm.runtime.model_config.vocab_size // 2  # half of it
        sharded_tokens, sharded_logits = run(llm)
    assert sharded_tokens == tokens
    assert logits.std() > 0.1  # the made weights reach the logits
    torch.testing.assert_close(sharded_logits, logits, rtol=1e-4, atol=1e-3)  # fp32 sums in another order

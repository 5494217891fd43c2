"""The bench harness never rots: every scenario, with --vs-hf, runs on the CPU on the tiny model with tiny sizes.

One ``python -m bench all`` invocation (in-process, startup's subprocesses included) writes every scenario's JSON;
the tests check that the files exist and hold sane numbers. The sizes are far too small to mean anything: this is
a smoke test of the harness, not a benchmark. Plus the performance model's numbers for the Qwen3.5-0.8B shape
(docs/ARCHITECTURE.md "Performance model") and the random-checkpoint builder.
"""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from bench import SCENARIOS
from bench.__main__ import main, scenario_kwargs
from bench.bounds import decode_bound, model_bytes_from_config, workload_decode_bound
from bench.models import QWEN3_5_0_8B_CONFIG, build_random_checkpoint
from compiled_engine.config import ModelConfig, RuntimeConfig

SMOKE_ARGS = [
    "all", "--device", "cpu", "--vs-hf", "--hf-limit", "2", "--hf-batch-size", "2",
    "--max-num-seqs", "4", "--max-model-len", "64", "--bandwidth-mib", "8",
    "-p", "latency.prompt_len=8", "-p", "latency.new_tokens=8", "-p", "latency.repeats=1",
    "-p", "latency.warmup_tokens=2", "-p", "hf_new_tokens=4",
    "-p", "sweep.batches=1,2", "-p", "sweep.prompt_len=8,16", "-p", "sweep.steps=3", "-p", "sweep.warmup_steps=1",
    "-p", "hf_steps=2",
    "-p", "throughput.num_requests=4", "-p", "min_len=4", "-p", "max_len=8", "-p", "throughput.warmup_requests=1",
    "-p", "sampling.num_requests=4", "-p", "sampling.min_prompt_len=8", "-p", "sampling.max_prompt_len=16",
    "-p", "sampling.min_output_len=4", "-p", "sampling.max_output_len=8", "-p", "sampling.warmup_requests=1",
    "-p", "sampling.repetition_penalty=1.1",
    "-p", "cookbook.concurrency=1,2", "-p", "cookbook.input_len=12", "-p", "cookbook.output_len=5",
    "-p", "cookbook.min_requests=3", "-p", "cookbook.warmup_requests=2", "-p", "cookbook.warmup_output_len=2",
    "-p", "prefix.num_requests=3", "-p", "prefix_len=16", "-p", "suffix_len=4", "-p", "prefix.new_tokens=4",
    "-p", "prefix.warmup_requests=1",
    "-p", "startup.prompt_len=4", "-p", "startup.new_tokens=2",
    "-p", "step_profile.batches=1,2", "-p", "step_profile.context=8", "-p", "step_profile.steps=2",
    "-p", "step_profile.prefill_seqs=2", "-p", "step_profile.prefill_len=8",
    "-p", "spec.batches=1,2", "-p", "spec.ks=1,2", "-p", "spec.rates=0,1", "-p", "spec.prompt_len=8",
    "-p", "spec.new_tokens=6", "-p", "spec.step_iters=2", "-p", "spec.repeats=2",
    "-p", "serve.concurrency=1,2", "-p", "serve.input_len=8", "-p", "serve.output_len=4", "-p", "serve.num_requests=3",
    "-p", "serve.warmup_requests=1", "-p", "serve.client_processes=2",
]


def positive(x) -> bool:
    return isinstance(x, (int, float)) and 0 < x < math.inf


def recording(step, streamed: dict):
    """``LLMEngine.step`` that also tallies, per cookbook request (and per request of the serve scenario's server),
    what its outputs delivered: an account of the tokens kept apart from the scenario's own."""

    def recorded_step(self):
        outputs = step(self)
        for out in outputs:
            if out.request_id.startswith(("cookbook-", "cmpl-")):  # cookbook's, and the serve scenario's server's
                seen = streamed.setdefault(out.request_id, {"tokens": 0, "finished": 0,
                                                            "prompt_tokens": len(out.prompt_token_ids)})
                seen["tokens"] += len(out.new_token_ids)
                seen["finished"] += out.finished
                seen["reason"] = out.finish_reason
        return outputs

    return recorded_step


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    from compiled_engine.engine import LLMEngine

    out = tmp_path_factory.mktemp("bench-out")
    streamed: dict[str, dict] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMPILED_ENGINE_CACHE", str(tmp_path_factory.mktemp("ce-cache")))  # an isolated tiny-model build
        mp.setattr(LLMEngine, "step", recording(LLMEngine.step, streamed))
        rc = main([*SMOKE_ARGS, "--out", str(out)])
    results = {s: json.loads((out / f"{s}.json").read_text()) for s in SCENARIOS if (out / f"{s}.json").exists()}
    return rc, out, results, streamed


def test_every_scenario_wrote_json_without_error(smoke):
    rc, _, results, _ = smoke
    errors = {s: r["error"] for s, r in results.items() if "error" in r}
    assert not errors, errors
    assert sorted(results) == sorted(SCENARIOS)
    assert rc == 0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_metadata(smoke, scenario):
    r = smoke[2][scenario]
    assert r["scenario"] == scenario
    assert r["device"]["type"] == "cpu" and r["device"]["name"]
    assert r["versions"]["torch"] == torch.__version__ and r["versions"]["transformers"]
    assert r["model"]["name"] == "tiny" and r["model"]["shape"]["num_hidden_layers"] == 8
    assert positive(r["model"]["weight_bytes"]) and positive(r["copy_bandwidth"]["GBps"])
    assert r["dtype"] == "float32"
    assert r["command"].split()[1:3] == ["-m", "bench"]
    assert "commit" in r["git"]
    assert r["kernel_options"]["cuda_graphs"] in ("runner", "trees")
    assert "bound" in r and "fraction_of_bound" in r


def test_latency(smoke):
    r = smoke[2]["latency"]
    assert r["ours"]["decode_steps"] == 7
    for key in ("decode_tok_s", "ttft_ms", "achieved_bandwidth_GBps", "fraction_of_copy_bandwidth"):
        assert positive(r["ours"][key]), key
    assert positive(r["runtime_only"]["decode_tok_s"])
    assert positive(r["bound"]["tok_s"]) and positive(r["fraction_of_bound"])
    # The bound from the report's own inputs: at batch 1 a dense model reads every weight once a token.
    assert r["bound"]["tok_s"] == pytest.approx(r["copy_bandwidth"]["GBps"] * 1e9 / r["model"]["weight_bytes"])
    assert r["fraction_of_bound"] == pytest.approx(r["ours"]["decode_tok_s"] / r["bound"]["tok_s"])
    assert positive(r["hf"]["decode_tok_s"]) and positive(r["ratio_vs_hf"]["decode_tok_s"])
    assert r["hf"]["kernels"]["fla"] is False  # hidden on the CPU


def test_sweep(smoke):
    r = smoke[2]["sweep"]
    assert [(row["prompt_len"], row["batch"]) for row in r["rows"]] == [(8, 1), (8, 2), (16, 1), (16, 2)]
    assert r["skipped"] == []
    m, bandwidth = r["model"], r["copy_bandwidth"]["GBps"] * 1e9
    for row in r["rows"]:
        assert row["missing_tokens"] == 0 and row["aborted_requests"] == 0
        for key in ("decode_tok_s", "bound_tok_s", "fraction_of_bound", "hf_decode_tok_s", "ratio_vs_hf"):
            assert positive(row[key]), (row["batch"], key)
        # The one formula: weights + B x (state read and written + KV read at the cell's context).
        assert row["context"] == row["prompt_len"] + 1 + 1 + 3 / 2  # + first token, warm-up step, half the timed
        b = row["batch"]
        step_bytes = m["weight_bytes"] + b * (2 * m["state_bytes"] + m["kv_bytes_per_token"] * row["context"])
        assert row["bound_tok_s"] == pytest.approx(b * bandwidth / step_bytes)
        assert row["fraction_of_bound"] == pytest.approx(row["decode_tok_s"] / row["bound_tok_s"])
    bound = {(row["prompt_len"], row["batch"]): row["bound_tok_s"] for row in r["rows"]}
    assert bound[8, 2] > bound[8, 1]  # more sequences share one weight read
    assert bound[16, 2] < bound[8, 2]  # a longer context reads more KV
    assert r["bound"]["contexts"] == [11.5, 19.5]


def test_sweep_skips_what_the_engine_cannot_hold():
    from bench.sweep import _cannot_run

    engine = {"max_num_seqs": 4, "max_model_len": 64, "block_size": 16, "num_kv_blocks": 9}
    assert _cannot_run(engine, 4, 32) is None  # 4 x 2 blocks of the 8 usable
    assert "max_num_seqs" in _cannot_run(engine, 8, 8)
    assert "max_model_len" in _cannot_run(engine, 1, 65)
    assert "KV blocks" in _cannot_run(engine, 3, 48)  # 3 x 3 blocks > 8


def test_cookbook(smoke):
    """Every request completes with exactly the asked tokens, counted from the engine's outputs apart from the
    scenario; tok/s = those tokens / the cell's wall time; percentiles ordered; SGLang's cells shown."""
    _, _, results, streamed = smoke
    r = results["cookbook"]
    assert r["workload"]["concurrency"] == [1, 2] and r["workload"]["requests"] == [3, 3]
    assert r["workload"]["output_kind"] == "CUMULATIVE" and r["engine"]["overlap_decode"]
    assert r["engine"]["mixed_steps"] and r["engine"]["kv_growth_reserve"] == 1.0  # LLM's defaults
    plan = r["memory_plan"]
    assert plan["max_num_seqs"] == 4 and plan["request_len"] == 17
    assert plan["kv_tokens"] == (plan["num_kv_blocks"] - 1) * plan["block_size"]
    assert plan["requests_fit_in_kv"] == (plan["num_kv_blocks"] - 1) // math.ceil(17 / plan["block_size"])
    for cell in r["cells"]:
        c = cell["concurrency"]
        assert "error" not in cell and "skipped" not in cell, cell
        assert cell["fits"]
        ours = {rid: v for rid, v in streamed.items() if rid.startswith(f"cookbook-c{c}-r")}
        warm = {rid: v for rid, v in streamed.items() if rid.startswith(f"cookbook-c{c}-warmup-r")}
        assert len(ours) == 3 and all(v["tokens"] == 5 and v["finished"] == 1 and v["reason"] == "length"
                                      for v in ours.values()), ours
        assert len(warm) == 2 and all(v["tokens"] == 2 and v["finished"] == 1 for v in warm.values()), warm
        generated = sum(v["tokens"] for v in ours.values())
        prompt_tokens = sum(v["prompt_tokens"] for v in ours.values())
        assert (generated, prompt_tokens) == (cell["output_tokens"], cell["prompt_tokens"]) == (15, 36)
        assert cell["output_tok_s"] == pytest.approx(generated / cell["wall_s"])
        assert cell["total_tok_s"] == pytest.approx((generated + prompt_tokens) / cell["wall_s"])
        assert cell["in_flight_max"] == c and cell["preemptions"] == 0
        kinds = cell["step_kinds"]
        assert set(kinds) == {"decode", "mixed", "prefill_only"} and kinds["decode"] > 0 and min(kinds.values()) >= 0
        for key, n in (("ttft_ms", 3), ("tpot_ms", 3), ("e2e_ms", 3), ("itl_ms", 3 * 4)):
            d = cell[key]
            assert d["n"] == n and 0 < d["p50"] <= d["p90"] <= d["p99"] <= d["max"], (c, key, d)
        assert cell["ttft_ms"]["max"] <= cell["e2e_ms"]["max"]
        assert positive(cell["bound"]["tpot_ms"]) and positive(cell["fraction_of_bound"])
        assert cell["bound"]["batch"] == c
    assert r["cells"][0]["sglang"] == {"recipe": "low-latency", "ttft_ms": 53, "tpot_ms": 1.07, "total_tok_s": 8003,
                                       "same_shape": False, "same_gpu": False}  # a CPU run: no ratios
    assert r["cells"][1]["sglang"] is None  # SGLang published no c=2 cell
    assert r["sglang"]["cells"]["16"]["total_tok_s"] == 74681 and r["sglang"]["cells"]["1024"]["tpot_ms"] == 39.01
    from bench.report import summary_lines

    text = "\n".join(summary_lines({"cookbook": r}))
    assert "SGLang 0.5.16" in text and "NOT this shape" in text and "NOT this GPU" in text
    assert "[53]" in text and "[1.07]" in text and "[8,003]" in text  # beside our c=1 numbers


def test_serve(smoke):
    """The server (a thread of the bench process) under the load generator: every request completes with exactly the
    asked tokens, as the engine's own outputs tally them; vllm bench serve's metrics are consistent; the offline half
    ran the same requests. The second cell's load comes from two client processes."""
    _, _, results, streamed = smoke
    r = results["serve"]
    assert r["server"] == "thread" and r["workload"]["concurrency"] == [1, 2]
    # c=2 runs the load generator as two processes (its multi-process path), c=1 as one
    assert {int(c): n for c, n in r["client_processes"].items()} == {1: 1, 2: 2}
    served = [v for rid, v in streamed.items() if rid.startswith("cmpl-")]
    assert len(served) == 2 * 3 + 1  # two cells of three, one warm-up
    assert all(v["tokens"] == 4 and v["finished"] == 1 and v["reason"] == "length" for v in served), served
    for cell in r["cells"]:
        assert "error" not in cell, cell
        h, offline = cell["http"], cell["offline"]
        assert (h["completed"], h["failed"], h["short_outputs"]) == (3, 0, 0)
        assert (h["total_output_tokens"], h["total_input_tokens"]) == (12, 24) == (offline["output_tokens"],
                                                                                 offline["prompt_tokens"])
        assert h["output_throughput"] == pytest.approx(12 / h["duration_s"])
        assert h["total_token_throughput"] == pytest.approx(36 / h["duration_s"])
        assert h["request_throughput"] == pytest.approx(3 / h["duration_s"])
        for name in ("ttft", "tpot", "itl", "e2el"):
            assert 0 < h[f"median_{name}_ms"] <= h[f"p99_{name}_ms"], name
        assert h["p99_ttft_ms"] <= h["p99_e2el_ms"]
        # The server's TTFT of each request lies inside the client's (it starts later and ends earlier), so its mean
        # does too; over the cell's requests only (the warm-up is not counted).
        assert 0 < cell["server_side"]["mean_ttft_ms"] <= h["mean_ttft_ms"]
        assert cell["overhead"] == pytest.approx(1 - h["output_throughput"] / offline["output_tok_s"])
        assert positive(cell["fraction_of_bound"])
    from bench.report import summary_lines

    assert "overhead" in "\n".join(summary_lines({"serve": r}))


def test_cookbook_compares_with_sglang_only_on_its_shape_and_gpu():
    """Ours over SGLang's published c=16 cell (8192 in / 1024 out on an H200) where the shape and the GPU are theirs;
    on another shape or another GPU their numbers are shown without a ratio."""
    from bench.cookbook import SGLANG, _sglang_cell

    cell = {"ttft_ms": {"p50": 227.0}, "tpot_ms": {"p50": 2.94}, "total_tok_s": 37340.5}
    got = _sglang_cell(SGLANG, 16, 8192, 1024, cell, gpu=True)["ours_over_sglang"]
    assert got == pytest.approx({"ttft_ms_p50": 227.0 / 454, "tpot_ms_p50": 2.94 / 1.47, "total_tok_s": 0.5},
                                rel=1e-4)
    for shape, gpu in (((8192, 1024), False), ((4096, 1024), True)):
        theirs = _sglang_cell(SGLANG, 16, *shape, cell, gpu=gpu)
        assert "ours_over_sglang" not in theirs and theirs["tpot_ms"] == 1.47
    assert _sglang_cell(SGLANG, 2, 8192, 1024, cell, gpu=True) is None  # no published c=2 cell


def test_cookbook_request_counts_and_memory_plan():
    from bench.cookbook import _request_counts, memory_plan

    assert _request_counts([1, 16, 64, 256, 1024], None, 16) == [16, 16, 64, 256, 1024]  # c=1024: one wave
    assert _request_counts([1, 2], 5, 16) == [5, 5] and _request_counts([1, 2], [3, 4], 16) == [3, 4]
    with pytest.raises(ValueError):
        _request_counts([1, 2], [3], 16)
    # The H200 0.8B shape: 9,216-token requests take 576 blocks of 16; 1,024 state slots.
    plan = memory_plan({"max_num_seqs": 1024, "max_model_len": 9216, "block_size": 16, "num_kv_blocks": 500_001},
                       9216)
    assert plan["kv_tokens"] == 8_000_000 and plan["requests_fit_in_kv"] == 868 and plan["requests_at_once"] == 868


class FakeEngine:
    """add_request / step / has_unfinished_requests / abort_request: every step gives every running request one
    token (at most ``slots`` run, the rest queue); ``fail_at``: that step raises; ``short``: requests stop one token
    early (as an EOS would)."""

    def __init__(self, slots: int, fail_at: int | None = None, short: bool = False):
        self.slots, self.fail_at, self.short = slots, fail_at, short
        self.queue, self.running, self.aborted, self.in_flight_per_step = [], [], [], []

    def add_request(self, request_id, prompt, params):
        self.queue.append({"id": request_id, "prompt": list(prompt), "max": params.max_tokens, "tokens": [],
                           "arrival": time.perf_counter(), "first": None})
        return request_id

    def has_unfinished_requests(self):
        return bool(self.queue or self.running)

    def abort_request(self, request_id):
        self.aborted.append(request_id)
        self.queue = [r for r in self.queue if r["id"] != request_id]
        self.running = [r for r in self.running if r["id"] != request_id]

    def step(self):
        from compiled_engine.outputs import RequestOutput

        if self.fail_at is not None and len(self.in_flight_per_step) == self.fail_at:
            raise RuntimeError("step failed")
        while self.queue and len(self.running) < self.slots:
            self.running.append(self.queue.pop(0))
        self.in_flight_per_step.append(len(self.running) + len(self.queue))
        outputs, now = [], time.perf_counter()
        for r in self.running:
            r["tokens"].append(7)
            r["first"] = r["first"] or now
            done = len(r["tokens"]) == r["max"] - self.short
            outputs.append(RequestOutput(r["id"], r["prompt"], list(r["tokens"]), [7], done,
                                         "length" if done else None, arrival_time=r["arrival"],
                                         first_token_time=r["first"], finished_time=now if done else None))
        self.running = [r for r in self.running if len(r["tokens"]) < r["max"] - self.short]
        return outputs


def test_cookbook_closed_loop_keeps_c_in_flight():
    """c requests at t=0, a new one as each finishes (before the next step): c in flight until the tail; an
    engine that runs fewer (slots < c) still sees c submitted; a failing step leaves nothing of the cell behind."""
    from types import SimpleNamespace

    from bench.cookbook import serve

    ctx = SimpleNamespace(sync=lambda: None)
    prompts = [[1, 2, 3]] * 5
    engine = FakeEngine(slots=8)
    cell = serve(ctx, engine, prompts, output_len=3, concurrency=2, tag="t")
    assert engine.in_flight_per_step == [2, 2, 2, 2, 2, 2, 1, 1, 1]  # 2 + 2 + 1 requests of 3 steps each
    assert cell["in_flight_max"] == 2 and cell["output_tokens"] == 15 and cell["prompt_tokens"] == 15
    assert cell["itl_ms"]["n"] == 5 * 2 and cell["tpot_ms"]["n"] == 5
    assert cell["total_tok_s"] == pytest.approx(30 / cell["wall_s"])
    queued = FakeEngine(slots=1)
    assert serve(ctx, queued, prompts[:3], 3, concurrency=3, tag="q")["in_flight_max"] == 3
    with pytest.raises(RuntimeError, match=r"exactly the tokens they asked for .*\(4, 3, 3, 'length'\)"):
        serve(ctx, FakeEngine(slots=8, short=True), prompts[:1], 4, concurrency=1, tag="short")  # stops short
    # Each request its own output length: 2 + 5 + 3 tokens, their TPOTs over their own lengths
    lengths = serve(ctx, FakeEngine(slots=8), prompts[:3], [2, 5, 3], concurrency=3, tag="l")
    assert lengths["output_tokens"] == 10 and lengths["itl_ms"]["n"] == 1 + 4 + 2 and lengths["tpot_ms"]["n"] == 3
    broken = FakeEngine(slots=8, fail_at=2)
    with pytest.raises(RuntimeError, match="step failed"):
        serve(ctx, broken, prompts, 3, concurrency=2, tag="b")
    assert sorted(broken.aborted) == ["b-r0", "b-r1"] and not broken.has_unfinished_requests()


def test_sampling(smoke):
    r = smoke[2]["sampling"]
    greedy, sampled = r["greedy"], r["sampled"]
    for run in (greedy, sampled):
        assert run["requests"] == 4 and run["output_tokens"] == r["workload"]["output_tokens"]
        assert run["output_tok_s"] == pytest.approx(run["output_tokens"] / run["wall_s"])
        assert run["ttft_ms"]["p50"] <= run["ttft_ms"]["p99"]
    assert r["sampled_over_greedy"] == pytest.approx(sampled["output_tok_s"] / greedy["output_tok_s"])
    assert len(r["rounds"]["greedy"]) == len(r["rounds"]["sampled"]) == 2
    assert r["sampled_requests_differing_from_greedy"] >= 1  # temperature 0.8 sampled something else
    assert r["sampled_tokens_repeat_across_rounds"]  # per-request seeds
    sampling = r["workload"]["sampling"]
    assert sampling["repetition_penalty"] == 1.1 and "presence_penalty" not in sampling  # the knobs set, only
    assert positive(r["fraction_of_bound"]["greedy"]) and positive(r["fraction_of_bound"]["sampled"])
    from bench.report import summary_lines

    first = r["rounds"]["greedy"][0], r["rounds"]["sampled"][0]  # a fresh process's figures stay in the summary
    assert f"first round: greedy {first[0]:,.0f}, sampled {first[1]:,.0f} tok/s" in "\n".join(
        summary_lines({"sampling": r}))


def test_throughput(smoke):
    r = smoke[2]["throughput"]
    ours = r["ours"]
    profile = ours["steps"]["first_step_profile"]  # the first step under cProfile: the engine's step is in it
    assert any(f["function"].startswith("step (compiled_engine/engine.py") for f in profile["by_cumulative_time"])
    assert ours["requests"] == 4 and r["workload"]["output_tokens"] == ours["output_tokens"]
    assert positive(ours["output_tok_s"]) and positive(ours["wall_s"])
    assert ours["ttft_ms"]["n"] == 4 and positive(ours["ttft_ms"]["p50"]) and positive(ours["tpot_ms"]["p99"])
    assert positive(r["bound"]["output_tok_s"]) and positive(r["fraction_of_bound"])
    hf = r["hf"]
    assert hf["requests_run"] == 2 and not hf["truncated"] and positive(hf["useful_output_tok_s"])
    assert hf["useful_output_tokens"] <= hf["computed_output_tokens"]
    assert "requests 0..1" in hf["ran"]
    assert r["ours_on_hf_subset"]["requests"] == 2
    # HF ran the whole subset, so ours on it is the run timed before HF, while ours was built (no second build)
    assert r["ours_on_first_requests"]["requests"] == 2
    assert r["ours_on_hf_subset"]["output_tok_s"] == r["ours_on_first_requests"]["output_tok_s"]
    assert positive(r["ratio_vs_hf"]["same_requests"]) and positive(r["ratio_vs_hf"]["full_workload_vs_hf_subset"])


def test_throughput_with_a_bf16_state_pool(smoke, tmp_path, monkeypatch):
    """``--state-dtype bfloat16`` reaches the engine (its state pool's dtype, in the report) and the bound (the
    recurrent state's bytes half the float32 run's), and the workload still completes."""
    monkeypatch.setenv("COMPILED_ENGINE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "bf16-state"
    rc = main(["throughput", "--device", "cpu", "--state-dtype", "bfloat16", "--max-num-seqs", "4",
               "--max-model-len", "64", "--bandwidth-mib", "8", "-p", "throughput.num_requests=4", "-p", "min_len=4",
               "-p", "max_len=8", "--out", str(out)])
    assert rc == 0
    r = json.loads((out / "throughput.json").read_text())
    fp32 = smoke[2]["throughput"]
    assert fp32["engine"]["state_dtype"] == "float32" and r["engine"]["state_dtype"] == "bfloat16"
    assert 2 * r["model"]["recurrent_state_bytes"] == fp32["model"]["recurrent_state_bytes"] > 0
    assert r["ours"]["requests"] == 4 and r["ours"]["output_tokens"] == r["workload"]["output_tokens"]


def test_hf_alone_beside_an_earlier_run_of_ours(smoke, tmp_path, monkeypatch):
    """``--ours-from``: HF runs the throughput workload's subset beside our side read from the smoke run's JSON; our
    engine is never built (Context.llm raises here), and the ratios divide the earlier run's numbers."""
    from bench.common import Context

    def no_engine(*_, **__):
        raise AssertionError("--ours-from built our engine")

    monkeypatch.setattr(Context, "llm", no_engine)
    monkeypatch.setenv("COMPILED_ENGINE_CACHE", str(tmp_path / "cache"))
    earlier = smoke[2]["throughput"]
    out = tmp_path / "hf-alone"
    rc = main(["throughput", "--device", "cpu", "--vs-hf", "--ours-from", str(smoke[1]), "--hf-limit", "2",
               "--hf-batch-size", "2", "--max-num-seqs", "4", "--max-model-len", "64", "--bandwidth-mib", "8",
               "-p", "throughput.num_requests=4", "-p", "min_len=4", "-p", "max_len=8", "--out", str(out)])
    assert rc == 0
    r = json.loads((out / "throughput.json").read_text())
    assert r["ours"] == earlier["ours"] and r["ours_from"] == str(smoke[1] / "throughput.json")
    assert r["hf"]["requests_run"] == 2 and positive(r["hf"]["useful_output_tok_s"])
    first = earlier["ours_on_first_requests"]["output_tok_s"]
    assert r["ratio_vs_hf"]["same_requests"] == pytest.approx(first / r["hf"]["useful_output_tok_s"])
    # HF cut short (--hf-max-time): the subset it ran is not one ours timed, and no engine is built to time it
    rc = main(["throughput", "--device", "cpu", "--vs-hf", "--ours-from", str(smoke[1]), "--hf-limit", "4",
               "--hf-batch-size", "1", "--hf-max-time", "1e-9", "--max-num-seqs", "4", "--max-model-len", "64",
               "--bandwidth-mib", "8", "-p", "throughput.num_requests=4", "-p", "min_len=4", "-p", "max_len=8",
               "--out", str(tmp_path / "cut")])
    cut = json.loads((tmp_path / "cut" / "throughput.json").read_text())
    assert rc == 0 and cut["hf"]["requests_run"] < 4
    assert cut["ours_on_hf_subset"] is None and cut["ratio_vs_hf"]["same_requests"] is None
    with pytest.raises(SystemExit, match="without --vs-hf"):
        main(["throughput", "--device", "cpu", "--ours-from", str(smoke[1]), "--out", str(tmp_path / "x")])


def test_spec_cut_short_keeps_its_finished_cells(tmp_path, monkeypatch):
    """A spec run that fails after its first (k, batch) cell: spec.json holds the error and that cell, as the partial
    file written after it had it (the cell's runs and speed-ups), not the error alone."""
    import bench.spec

    measured = bench.spec._spec_step_ms
    calls = []

    def second_cell_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("cut after the first cell")
        return measured(*args, **kwargs)

    monkeypatch.setattr(bench.spec, "_spec_step_ms", second_cell_fails)
    monkeypatch.setenv("COMPILED_ENGINE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "spec-cut"
    rc = main(["spec", "--device", "cpu", "--bandwidth-mib", "8", "-p", "spec.batches=1,2", "-p", "spec.ks=1",
               "-p", "spec.rates=1", "-p", "spec.prompt_len=8", "-p", "spec.new_tokens=6", "-p", "spec.step_iters=2",
               "-p", "spec.repeats=1", "--out", str(out)])
    r = json.loads((out / "spec.json").read_text())
    assert rc != 0 and "cut after the first cell" in r["error"] and r["partial"]
    assert list(r["speculative"]["1"]) == ["1"]
    cell = r["speculative"]["1"]["1"]
    assert positive(cell["forced_1"]["output_tok_s"]) and positive(cell["steps"]["round_ms"])
    assert set(r["baseline"]) == {"1", "2"}


def test_prefix(smoke):
    r = smoke[2]["prefix"]
    assert positive(r["off"]["output_tok_s"])
    steps = r["off"]["steps"]  # where the time went: steps by kind, prefill tokens, the slowest steps
    assert steps["prefill"]["steps"] > 0 and steps["decode"]["steps"] > 0 and steps["slowest"]
    assert steps["prefill"]["tokens"] == 3 * (16 + 4)  # 3 prompts of prefix_len + suffix_len, no cache
    if r["prefix_caching_available"]:
        assert positive(r["on"]["output_tok_s"]) and positive(r["speedup_on_vs_off"])
    else:
        assert "prefix caching not available" in r["on"]["note"]
    assert positive(r["fraction_of_bound"]["off"])


def test_startup(smoke):
    r = smoke[2]["startup"]
    for phase in ("cold", "warm"):
        p = r[phase]
        assert "error" not in p, p
        for key in ("import_s", "load_s", "first_generate_s", "to_first_token_s", "process_wall_s"):
            assert positive(p[key]), (phase, key)
        assert p["compiled"] is False  # the CPU runs eager
        assert p["capture_prefill_s"] == 0 and p["prefill_keys"] == 0  # and captures no prompt step
        assert 0 < p["memory_plan_s"] < p["load_s"]  # the memory plan's steps are timed inside the load
    assert positive(r["bound"]["checkpoint_bytes"])


def test_report_merges_everything(smoke, tmp_path):
    _, out, _, _ = smoke
    assert main(["report", str(out), "--out", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "results.json").read_text())
    assert sorted(merged["results"]) == sorted(SCENARIOS)
    assert len(merged["summary"]) >= len(SCENARIOS)
    assert (tmp_path / "summary.txt").read_text().strip()


def test_model_bytes_from_config_match_the_loaded_model(smoke):
    r = smoke[2]["latency"]  # its model bytes were counted from the loaded parameters
    config = ModelConfig.from_pretrained(r["model"]["path"])
    expected = model_bytes_from_config(config, torch.float32)
    assert r["model"]["weight_bytes"] == expected.weight_bytes
    assert r["model"]["params"] == expected.params
    assert r["model"]["state_bytes"] == expected.state_bytes


def test_bounds_of_the_qwen3_5_0_8b_shape():
    """docs/ARCHITECTURE.md: state 18.9 MB per sequence (fp32 recurrent), KV 12 KB per token, ~2,840 tok/s at 4,270 GB/s."""
    mb = model_bytes_from_config(ModelConfig.from_dict(QWEN3_5_0_8B_CONFIG), torch.bfloat16)
    assert mb.recurrent_state_bytes == 18 * 16 * 128 * 128 * 4  # 18.9 MB
    assert mb.kv_bytes_per_token == 6 * 2 * 2 * 256 * 2  # 12 KB
    assert 1.49e9 < mb.weight_bytes < 1.52e9  # ~752M params in bf16, the tied embedding once
    assert 4270e9 / mb.weight_bytes == pytest.approx(2840, rel=0.01)  # the batch-1 bound: weights only
    assert decode_bound(mb, 4270e9)["tok_s"] < 4270e9 / mb.weight_bytes  # + one sequence's state traffic
    b256 = decode_bound(mb, 4270e9, batch=256, context=576)
    assert b256["bytes_per_step"] == pytest.approx(mb.weight_bytes + 256 * (2 * mb.state_bytes + 12288 * 576))
    whole = workload_decode_bound(mb, 4270e9, [100, 200], [3, 1], max_num_seqs=1)
    assert whole["decode_steps"] == 4


def test_random_checkpoint_loads(tmp_path):
    """The qwen3.5-0.8b builder's names and shapes load into the runtime (checked on a scaled-down copy)."""
    from compiled_engine.runtime import Runtime

    small = {**QWEN3_5_0_8B_CONFIG, "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 16, "linear_num_key_heads": 2,
             "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
             "max_position_embeddings": 128}
    folder = build_random_checkpoint(small, str(tmp_path / "ckpt"), dtype=torch.bfloat16, device="cpu")
    runtime = Runtime.from_pretrained(folder, device="cpu", dtype=torch.float32, max_num_seqs=1, max_model_len=32,
                                      num_kv_blocks=4)
    assert runtime.load_report.tied_lm_head
    seq = runtime.add_sequence([1, 2, 3])
    assert torch.isfinite(runtime.prefill([seq])).all()


def test_confident_random_checkpoint_has_wide_top1_margins(tmp_path):
    """``EMBEDDING_STD``'s checkpoints (qwen3.5-0.8b-confident, for the spec scenario's forced drafter): the tied
    embedding at std 1 instead of lm_head's scale, so the top logit leads the second by far more than the default
    model's (checked on a scaled-down copy, the runtime's prefill logits in fp32)."""
    from bench.models import EMBEDDING_STD
    from compiled_engine.runtime import Runtime

    small = {**QWEN3_5_0_8B_CONFIG, "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 16, "linear_num_key_heads": 2,
             "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
             "max_position_embeddings": 128}
    margins = {}
    for name, std in (("default", None), ("confident", EMBEDDING_STD["qwen3.5-0.8b-confident"])):
        folder = build_random_checkpoint(small, str(tmp_path / name), dtype=torch.bfloat16, device="cpu",
                                         embedding_std=std)
        runtime = Runtime.from_pretrained(folder, device="cpu", dtype=torch.float32, max_num_seqs=8,
                                          max_model_len=32, num_kv_blocks=16)
        seqs = [runtime.add_sequence([3 + 7 * i, 11 + i, 40 + 13 * i]) for i in range(8)]
        logits = runtime.prefill(seqs).float()
        top2 = logits.topk(2, dim=-1).values
        margins[name] = ((top2[:, 0] - top2[:, 1]) / logits.std(dim=-1)).median().item()
    assert margins["confident"] > 3 * margins["default"], margins  # 1.29 against 0.31 when written


def test_unknown_params_are_rejected():
    import bench.latency
    import bench.sweep

    modules = {"latency": bench.latency, "sweep": bench.sweep}
    assert scenario_kwargs(["latency", "sweep"], modules, ["prompt_len=4"]) == {
        "latency": {"prompt_len": 4}, "sweep": {"prompt_len": 4}}
    assert scenario_kwargs(["sweep"], modules, ["batches=1,2"]) == {"sweep": {"batches": [1, 2]}}
    with pytest.raises(SystemExit):
        scenario_kwargs(["latency"], modules, ["latency.nonsense=1"])


def test_step_profile(smoke):
    r = smoke[2]["step_profile"]
    assert [row["batch"] for row in r["rows"]] == [1, 2]
    for row in r["rows"]:
        assert positive(row["wall_ms"]) and positive(row["bound_ms"])
        assert row["fraction_of_bound"] == pytest.approx(row["bound_ms"] / row["wall_ms"])
        assert "gpu_ms" not in row  # no device kernels on a CPU
    assert [row["batch"] for row in r["engine_rows"]] == [1, 2]
    for row in r["engine_rows"]:  # the engine's own decode steps, overlapped (LLM's default), with a host profile
        assert row["overlap_decode"] and positive(row["wall_ms"]) and positive(row["bound_ms"])
        assert row["fraction_of_bound"] == pytest.approx(row["bound_ms"] / row["wall_ms"])
        cumulative = row["host_functions_per_step"]["by_cumulative_time"]
        assert any(f["function"].startswith("step (compiled_engine/engine.py") for f in cumulative)
    assert r["prefill"]["tokens"] == 16 and positive(r["prefill"]["tok_s"])


def test_step_profile_categories():
    from bench.step_profile import category

    assert category("_skinny_gemm_kernel") == "linear: Triton skinny GEMM"
    assert category("sm90_xmma_gemm_bf16bf16_bf16f32") == "linear: cuBLAS"
    assert category("_gdr_decode_kernel") == "delta rule"
    assert category("triton_poi_fused_add_mul_0") .startswith("Inductor-fused")
    assert category("Memcpy HtoD (Pinned -> Device)") == "copies and fills"
    assert category("_next_decode_inputs_kernel").startswith("decode epilogue")
    assert category("something_new") == "other"


def test_critical_path_charges_each_kernel_from_the_previous_end():
    """Two replays of a 3-kernel step, hand-computed: a kernel that started early (PDL) and ended 1 µs after the one
    before is charged 1 µs; one that ended before the previous one ended is charged 0; the first replay is dropped;
    the charges add up to the span."""
    from bench.latency import critical_path
    from bench.report import summary_lines

    def step(t0):  # (name, grid, start, duration)
        return [("gemv", "[4, 1, 1]", t0, 5.0), ("gdn", "[1, 16, 1]", t0 + 2.0, 4.0), ("tiny", "[1, 1, 1]", t0 + 3.0, 1.0)]

    path = critical_path(step(0.0) + step(100.0) + step(110.0), replays=3)
    rows = path["by_kernel"]
    # replay 2: previous end 6 (replay 1's gdn); gemv ends 105 (charged 99), gdn 106 (1), tiny 104 (0); span 100.
    # replay 3: previous end 106; gemv 115 (9), gdn 116 (1), tiny 114 (0); span 10.
    assert path["kernels_per_step"] == 3 and path["span_us"] == pytest.approx(55.0)
    assert rows["gemv grid=[4, 1, 1]"]["charged_us_per_step"] == pytest.approx(54.0)
    assert rows["gdn grid=[1, 16, 1]"]["charged_us_per_step"] == pytest.approx(1.0)
    assert rows["tiny grid=[1, 1, 1]"]["charged_us_per_step"] == 0.0
    assert rows["gdn grid=[1, 16, 1]"]["duration_us_per_step"] == pytest.approx(4.0)
    assert sum(r["charged_us_per_step"] for r in rows.values()) == pytest.approx(path["span_us"])
    assert "error" in critical_path(step(0.0) + step(10.0)[:2], replays=2)
    latency = {"scenario": "latency", "ours": {"decode_tok_s": 1.0, "ms_per_step": {"p50": 1.0}, "ttft_ms": 1.0,
                                               "achieved_bandwidth_GBps": 1.0},
               "bound": {"tok_s": 2.0}, "fraction_of_bound": 0.5, "runtime_only": {"decode_tok_s": 1.0},
               "graph_replay": {"ms_per_step": 1.0, "host_ms_per_replay": 0.01, "critical_path": path}}
    text = "\n".join(summary_lines({"latency": latency}))
    assert "critical path of the batch-1 graph: 55.0 µs" in text and "gemv grid=[4, 1, 1]" in text


def test_snapshot_methods_skips_on_cpu(smoke):
    """GPU only (FLA's Triton kernels): on the CPU it records why, with the 0.8B layer shape it would time."""
    r = smoke[2]["snapshot_methods"]
    assert "CUDA device" in r["skipped"] and "methods" not in r
    w = r["workload"]
    assert (w["seqs"], w["seq_len"], w["interval"], w["snapshots_per_seq"]) == (4, 2048, 512, 4)
    assert w["layer_shape"]["v_heads"] == 16 and w["layer_shape"]["key_dim"] == 128
    assert w["layer_shape"]["linear_layers"] == 18


def test_snapshot_methods_boundary_indexing():
    """The per-chunk state before chunk 8 j of sequence n is the state after 512 j of its tokens."""
    from bench.snapshot_methods import boundary_chunks, split_at_boundaries

    assert boundary_chunks(2, 2048, 512, "cpu").tolist() == [8, 16, 24, 40, 48, 56]
    assert boundary_chunks(3, 512, 512, "cpu").numel() == 0  # one boundary per sequence: the final state
    t = torch.arange(2 * 256).view(1, -1, 1).float()  # token ids of 2 packed sequences of 256
    x = {"q": t, "k": t, "v": t, "g": t[..., 0], "beta": t[..., 0], "cu": torch.tensor([0, 256, 512])}
    parts = split_at_boundaries(x, 2, 256, 128)
    assert [p["q"].flatten()[[0, 127, 128, 255]].tolist() for p in parts] == [[0, 127, 256, 383],
                                                                              [128, 255, 384, 511]]
    assert all(p["cu"].tolist() == [0, 128, 256] for p in parts)


def test_stack_dumps_show_the_caller_of_a_deep_recursion(tmp_path):
    """bench/stack_dumps: the whole stack, outermost frame first, a recursion collapsed (faulthandler cuts at 100)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "deep.py"
    script.write_text(
        "import time\n"
        "def recurse(n):\n"
        "    return recurse(n - 1) if n else time.sleep(1.5)\n"
        "def outermost_caller():\n"
        "    recurse(300)\n"
        "outermost_caller()\n"
    )
    folder = Path(__file__).resolve().parents[1] / "bench" / "stack_dumps"
    env = dict(os.environ, PYTHONPATH=str(folder), CE_STACK_DUMP_S="0.5")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    dumps = done.stderr
    assert done.returncode == 0 and "[stack dump" in dumps
    first = dumps.split("[stack dump")[1]
    assert "outermost_caller" in first and "recurse  x" in first
    count = int(first.split("recurse  x")[1].split()[0])
    assert count == 301  # recurse(300) .. recurse(0): the whole depth, in one line


def test_bounds_of_the_qwen3_5_35b_a3b_shape():
    """~35B parameters, ~3B of them active: a batch-1 step reads ~6 GB (everything but the routed experts, plus 8
    experts of every layer); batch 256 touches nearly all 256 experts."""
    from bench.models import QWEN3_5_35B_A3B_CONFIG

    config = ModelConfig.from_dict(QWEN3_5_35B_A3B_CONFIG)
    assert config.moe_layers == tuple(range(40)) and len(config.full_attention_layers) == 10
    mb = model_bytes_from_config(config, torch.bfloat16)
    assert 34e9 < mb.params < 36e9
    assert mb.expert_bytes == 40 * 3 * 2048 * 512 * 2
    assert mb.expected_experts(1) == pytest.approx(8)
    # what latency's bound divides by: a batch-1 step reads everything but the routed experts, and 8 of those a layer
    assert mb.weight_bytes_at(1) == pytest.approx(mb.weight_bytes + 8 * 40 * 3 * 2048 * 512 * 2)
    assert 255 < mb.expected_experts(256) < 256
    active = decode_bound(mb, 4800e9)["bytes_per_step"]
    assert 5.5e9 < active < 6.3e9
    assert decode_bound(mb, 4800e9, batch=256)["bytes_per_step"] > mb.weight_bytes + 255 * mb.expert_bytes


def test_random_weights_load_as_the_same_tensors_from_a_file(build_hf_model, tmp_path):
    """The bench's device-drawn weights (bench.models.RandomWeights, a loader WeightSource: the path of
    qwen3.5-27b, qwen3.5-35b-a3b and qwen3-next-80b-a3b) give the model that the file loader builds from the same
    tensors saved as a safetensors checkpoint (checked on the tiny Qwen3-Next MoE); its counted bytes equal
    model_bytes_from_config, and it runs."""
    import shutil

    from safetensors.torch import save_file

    from bench.bounds import model_bytes
    from bench.models import RandomWeights
    from compiled_engine.loader import load_model
    from compiled_engine.runtime import Runtime

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    shutil.copy(build_hf_model("qwen3_next_moe") / "config.json", folder)
    config = ModelConfig.from_pretrained(folder)
    cpu, source = torch.device("cpu"), RandomWeights(seed=3)
    drawn, _ = load_model(str(folder), config, cpu, torch.bfloat16, weights=source)  # config.json only
    save_file({name: source.get_tensor(name, config, cpu) for name in source.names(config)},
              str(folder / "model.safetensors"))
    loaded, _ = load_model(str(folder), config, cpu, torch.bfloat16)
    params = dict(loaded.named_parameters())
    assert {n: (p.shape, p.dtype) for n, p in drawn.named_parameters()} == {n: (p.shape, p.dtype) for n, p in
                                                                            params.items()}
    for name, p in drawn.named_parameters():
        assert torch.equal(p, params[name]), name
    assert model_bytes(drawn, torch.bfloat16) == model_bytes_from_config(config, torch.bfloat16)
    runtime = Runtime(drawn, RuntimeConfig(max_num_seqs=1, max_model_len=32, num_kv_blocks=4), cpu, torch.bfloat16)
    assert torch.isfinite(runtime.prefill([runtime.add_sequence([1, 2, 3])])).all()


def test_the_large_random_shapes():
    """qwen3.5-27b: ~27B dense parameters (the published 27.78B less the vision encoder and MTP layer), a step
    reads ~51 GB; qwen3-next-80b-a3b: ~80B parameters, a batch-1 step ~7 GB (10 of 512 experts a layer), and its
    8-layer cut 1/6 of its layers; all split evenly over 2 ranks."""
    from bench.models import DEVICE_RANDOM_MODELS
    from compiled_engine.distributed import check_divisible

    dense = ModelConfig.from_dict(DEVICE_RANDOM_MODELS["qwen3.5-27b"])
    assert (dense.hidden_size, dense.num_hidden_layers, len(dense.full_attention_layers)) == (5120, 64, 16)
    mb = model_bytes_from_config(dense, torch.bfloat16)
    assert 26.5e9 < mb.params < 27.5e9 and 50e9 < mb.weight_bytes < 53e9
    sparse = ModelConfig.from_dict(DEVICE_RANDOM_MODELS["qwen3-next-80b-a3b"])
    assert sparse.moe_layers == tuple(range(48)) and (sparse.num_experts, sparse.num_experts_per_tok) == (512, 10)
    mb = model_bytes_from_config(sparse, torch.bfloat16)
    assert 79e9 < mb.params < 81e9
    assert 6.5e9 < decode_bound(mb, 4800e9)["bytes_per_step"] < 8e9
    cut = ModelConfig.from_dict(DEVICE_RANDOM_MODELS["qwen3-next-80b-a3b-8l"])
    assert cut.num_hidden_layers == 8 and len(cut.full_attention_layers) == 2
    for config in (dense, sparse, cut):
        check_divisible(config, 2)


def test_spec(smoke):
    """Every speculative run's greedy output is the baseline's, the drafting rule's runs too; at forced acceptance 1
    every draft is accepted (None: the rule drafted no round), and the forced rounds chain. The complete result
    replaced the partial ones written after each cell."""
    r = smoke[2]["spec"]
    assert r["baseline"] and r["speculative"] and r["rule"] and "partial" not in r
    assert all(len(entry["walls_s"]) == 2 for entry in r["baseline"].values())
    for k, cells in r["speculative"].items():
        for b, cell in cells.items():
            for name, entry in cell.items():
                if name == "steps":
                    assert positive(entry["verify_ms"]) and positive(entry["round_ms"])
                    tpot = r["baseline"][b]["tpot_ms"]["p50"]
                    assert entry["round_vs_baseline_tpot"] == pytest.approx(entry["round_ms"] / tpot)
                    assert positive(entry["chained_round_ms"])  # rounds chained (one rank, no prefix caching)
                    continue
                assert entry["outputs_differing_from_baseline"] == 0  # over both timed runs
                assert entry.get("outputs_differing_from_continuation", 0) == 0
                assert positive(entry["output_tok_s"])
                assert len(entry["walls_s"]) == 2 and entry["wall_s"] == max(entry["walls_s"])  # the slower middle
            assert cell["forced_1"]["acceptance"] == 1.0
            assert cell["forced_0"]["acceptance"] == 0.0
            # The forced drafter's rounds chain as the MTP head's do (a script on the device, not a host override).
            assert cell["forced_1"]["chained_rounds"] > 0 and cell["mtp"]["chained_rounds"] > 0
            assert cell["auto_0"]["acceptance"] in (0.0, None) and cell["auto_1"]["acceptance"] in (1.0, None)
            assert "rule" in cell["auto_mtp"]  # the MTP head's chained rounds with the rule (its log reported)


def test_tensor_parallel_bench_on_cpu(tmp_path, monkeypatch):
    """bench/run_tp2.sh's bench stage, tiny and on the CPU at TP=2 (gloo): latency, sweep (batches 1, 2) and
    throughput run over the sharded engine, their bounds from rank 0's shard (about half the weight bytes); and its
    allreduce stage: the step's collectives of the same shape, timed on 2 spawned ranks."""
    from bench import allreduce_microbench
    from compiled_engine.tiny_model import ensure_tiny_model

    monkeypatch.setenv("COMPILED_ENGINE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "tp2"
    rc = main(["latency,sweep,throughput", "--device", "cpu", "--tensor-parallel-size", "2", "--max-num-seqs", "2",
               "--max-model-len", "48", "--bandwidth-mib", "8", "-p", "latency.prompt_len=8",
               "-p", "latency.new_tokens=4", "-p", "latency.repeats=1", "-p", "latency.warmup_tokens=2",
               "-p", "sweep.batches=1,2", "-p", "sweep.prompt_len=8", "-p", "sweep.steps=2",
               "-p", "sweep.warmup_steps=1", "-p", "throughput.num_requests=3", "-p", "min_len=4", "-p", "max_len=8",
               "-p", "throughput.warmup_requests=1", "--out", str(out)])
    assert rc == 0
    full = model_bytes_from_config(ModelConfig.from_pretrained(ensure_tiny_model()), torch.float32)
    for scenario in ("latency", "sweep", "throughput"):
        result = json.loads((out / f"{scenario}.json").read_text())
        assert "error" not in result and result["engine"]["tensor_parallel_size"] == 2
        assert 0.4 * full.weight_bytes < result["model"]["weight_bytes"] < 0.6 * full.weight_bytes  # rank 0's shard
        assert result["model"]["state_bytes"] == full.state_bytes // 2  # its heads' states
        assert result["model"]["kv_bytes_per_token"] == full.kv_bytes_per_token // 2
    sweep = json.loads((out / "sweep.json").read_text())
    assert {row["batch"] for row in sweep["rows"]} == {1, 2}
    assert all(positive(row["decode_tok_s"]) and positive(row["fraction_of_bound"]) for row in sweep["rows"])

    result = allreduce_microbench.run("tiny", [1, 2], device="cpu", iters=2)
    config = ModelConfig.from_pretrained(ensure_tiny_model())
    assert [row["batch"] for row in result["rows"]] == [1, 2]
    for row in result["rows"]:
        assert row["all_reduces_per_step"] == 2 * config.num_hidden_layers + 1  # and the embedding's
        assert row["all_reduce_bytes"] == row["batch"] * config.hidden_size * 4
        assert positive(row["all_reduce_us"]) and positive(row["all_gather_us"]) and not row["captured"]


def test_round_host_runs_stubbed_rounds():
    """bench/round_host.py drives the engine's real round path with the device's work stubbed: it must keep running
    against the engine's internals it replaces (Runtime.fused_round, SpeculativeRound.pack / load)."""
    from bench.round_host import host_round_us

    p50, low = host_round_us(batch=2, max_model_len=512, k=2, rounds=20)
    assert 0 < low <= p50
    with pytest.raises(ValueError, match="need max_model_len"):
        host_round_us(batch=1, max_model_len=256, k=2, rounds=200)


def test_penalties_host_times_the_table():
    """bench/penalties_host.py builds its requests and times ``sampler.penalties``: it must keep running against the
    engine's Request, Sequence and penalties signatures."""
    from bench.penalties_host import host_ms

    low, median = host_ms(rows=3, steps=2)
    assert 0 < low <= median


def test_sweep_times_every_row_of_the_cell():
    """A cell whose prompts take more steps than its requests' tokens (8 prompts, one a step; 1 + 1 + 3 tokens each):
    every timed step still decodes all 8 rows. With mixed steps during the prompts, the first requests would decode
    while the later prompts are computed and finish before the timed steps, which would then run fewer rows."""
    from types import SimpleNamespace

    from bench.sweep import _measure
    from compiled_engine.llm import LLM
    from compiled_engine.tiny_model import ensure_tiny_model

    llm = LLM(ensure_tiny_model(), device="cpu", max_num_seqs=8, max_model_len=64, max_num_batched_tokens=32)
    engine, runtime = llm.engine, llm.runtime
    decode_rows = []
    build_step = runtime.build_step

    def recording(seqs, counts, is_prefill, *args, **kwargs):
        if not is_prefill or any(n == 1 for n in counts):  # a decode step, or decode rows in a prompt step
            decode_rows.append(sum(n == 1 for n in counts) if is_prefill else len(seqs))
        return build_step(seqs, counts, is_prefill, *args, **kwargs)

    runtime.build_step = recording
    row = _measure(SimpleNamespace(sync=lambda: None), engine, [[i + 1] * 32 for i in range(8)], steps=3,
                   warmup_steps=1)
    assert row["missing_tokens"] == 0 and row["aborted_requests"] == 0
    assert decode_rows == [8] * 4  # the warm-up step and the 3 timed ones, all 8 rows; no decode row before them
    assert engine.scheduler.mixed_steps  # the engine's policy as it was

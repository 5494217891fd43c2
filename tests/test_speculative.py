"""MTP speculative decoding (compiled_engine/mtp.py, speculative.py, rejection_sampler.py) on the CPU in fp32.

Oracles: a float64 formula of the MTP layer written from the checkpoint's tensors; non-speculative greedy decoding
(the output must match it token for token, whatever the drafts); the target distribution itself (a chi-square test
of the rejection sampler); a seeded request's solo run (batch invariance).
"""

from __future__ import annotations

import functools
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from safetensors.torch import load_file

from compiled_engine import LLM, SamplingParams
from compiled_engine.block_tables import BlockTables
from compiled_engine.config import SpeculativeConfig
from compiled_engine.drafting_rule import DraftingRule
from compiled_engine.engine import LLMEngine
from compiled_engine.loader import CheckpointError
from compiled_engine.rejection_sampler import rejection_sample
from compiled_engine.runtime import Runtime
from compiled_engine.sampler import SamplingBatch
from compiled_engine.tiny_model import TINY_CONFIG, ensure_tiny_model
from tests.test_sampling_op import filtered_softmax

MAX_LEN = 192


def spec(k: int) -> dict:
    return {"method": "mtp", "num_speculative_tokens": k}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return ensure_tiny_model(str(tmp_path_factory.mktemp("tiny") / "model"))


def runtime(path: str, k: int = 0, disable_by_batch_size: int | None = None, **knobs) -> Runtime:
    knobs.setdefault("max_model_len", MAX_LEN)
    knobs.setdefault("max_num_seqs", 6)
    config = dict(spec(k), disable_by_batch_size=disable_by_batch_size) if k else None
    return Runtime.from_pretrained(path, device="cpu", dtype="float32", speculative_config=config, **knobs)


# ------------------------------------------------------------------------------------------------ the MTP layer
def finish_all(engine: LLMEngine) -> tuple[dict, int]:
    """Step ``engine`` until it holds no request: each request's finished output by id, and the number of steps."""
    finished, steps = {}, 0
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    return finished, steps


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = TINY_CONFIG["rms_norm_eps"]) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def _rope(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    """NeoX rotate-half on the first ``rotary_dim`` channels of ``x`` [T, heads, D]."""
    inv = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = positions.double()[:, None] * inv[None]
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    a, b = rot.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], dim=-1)


def mtp_float64(weights: dict, embed: torch.Tensor, hidden: torch.Tensor, next_ids: list[int],
                config: dict = TINY_CONFIG) -> torch.Tensor:
    """The MTP layer of one sequence's rows 0..T-1 (causal), in float64, from the checkpoint's own tensors and its
    config.json (HF's formulas: a dense MLP, or the sparse block of HF's Qwen3-Next / Qwen3.5-MoE modeling files)."""
    w = {k: v.double() for k, v in weights.items() if k.startswith("mtp.")}
    c = config
    rms = lambda x, weight: _rms(x, weight, c["rms_norm_eps"])  # noqa: E731
    heads, kv_heads, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    t = len(next_ids)
    e = embed.double()[torch.tensor(next_ids)]
    x = torch.cat([rms(e, w["mtp.pre_fc_norm_embedding.weight"]),
                   rms(hidden.double(), w["mtp.pre_fc_norm_hidden.weight"])], dim=-1) @ w["mtp.fc.weight"].T
    p = "mtp.layers.0."
    a = rms(x, w[p + "input_layernorm.weight"])
    q_gate = (a @ w[p + "self_attn.q_proj.weight"].T).view(t, heads, 2 * d)
    q, gate = q_gate[..., :d], q_gate[..., d:]
    k = (a @ w[p + "self_attn.k_proj.weight"].T).view(t, kv_heads, d)
    v = (a @ w[p + "self_attn.v_proj.weight"].T).view(t, kv_heads, d)
    q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
    rope = c["rope_parameters"]
    positions = torch.arange(t)
    rotary = int(d * rope["partial_rotary_factor"])
    q, k = _rope(q, positions, rotary, rope["rope_theta"]), _rope(k, positions, rotary, rope["rope_theta"])
    k, v = k.repeat_interleave(heads // kv_heads, dim=1), v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("hts,shd->thd", scores.softmax(-1), v) * torch.sigmoid(gate)
    x = x + attn.reshape(t, -1) @ w[p + "self_attn.o_proj.weight"].T
    m = rms(x, w[p + "post_attention_layernorm.weight"])

    def mlp(prefix: str, rows: torch.Tensor) -> torch.Tensor:
        g, u = rows @ w[prefix + "gate_proj.weight"].T, rows @ w[prefix + "up_proj.weight"].T
        return (torch.nn.functional.silu(g) * u) @ w[prefix + "down_proj.weight"].T

    if p + "mlp.gate.weight" not in w:
        return rms(x + mlp(p + "mlp.", m), w["mtp.norm.weight"])
    # Sparse: softmax over the experts, top-k, renormalised (always in Qwen3.5-MoE, per norm_topk_prob in
    # Qwen3-Next), the experts' weighted sum, plus the shared expert scaled by sigmoid(shared_expert_gate).
    probs = (m @ w[p + "mlp.gate.weight"].T).softmax(-1)
    top, ids = probs.topk(c["num_experts_per_tok"], dim=-1)
    if c["model_type"].startswith("qwen3_5") or c.get("norm_topk_prob", True):
        top = top / top.sum(-1, keepdim=True)
    routed = torch.zeros_like(m)
    for row in range(t):
        for weight, expert in zip(top[row], ids[row].tolist()):
            routed[row] += weight * mlp(f"{p}mlp.experts.{expert}.", m[row : row + 1])[0]
    shared = torch.sigmoid(m @ w[p + "mlp.shared_expert_gate.weight"].T) * mlp(p + "mlp.shared_expert.", m)
    return rms(x + routed + shared, w["mtp.norm.weight"])


def test_mtp_layer_matches_a_float64_formula(tiny_path):
    rt = runtime(tiny_path, k=2)
    prompt = [5, 17, 99, 3, 42, 7, 8, 200, 31, 64, 128, 2]
    seq = rt.add_sequence(prompt)
    step = rt.prefill_for_drafts([seq])
    next_ids = prompt[1:] + [77]
    with torch.inference_mode():
        ours = rt.model.mtp_forward(torch.tensor(next_ids), step.hidden, step.step)
    weights = load_file(f"{tiny_path}/model.safetensors")
    expected = mtp_float64(weights, weights["model.embed_tokens.weight"], step.hidden, next_ids)
    torch.testing.assert_close(ours.double(), expected, atol=2e-4, rtol=2e-4)
    # The drafts are the argmax of the shared lm_head on the MTP output of the last row.
    with torch.inference_mode():
        drafts = rt.draft_after_prefill(step, torch.tensor([77]))
    assert drafts[0, 0].item() == int((expected[-1] @ weights["lm_head.weight"].double().T).argmax())


def moe_checkpoint_with_mtp(build_hf_model, variant: str, folder) -> str:
    """A tiny MoE checkpoint (tests/hf_models.py, HF's own save) given mtp.* tensors, as the released MoE checkpoints
    carry them: its full-attention layer 3 (sparse) as mtp.layers.0, a random fc and random norms."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(build_hf_model(variant), folder)
    weights = load_file(f"{folder}/model.safetensors")
    hidden = weights["model.norm.weight"].shape[0]
    g = torch.Generator().manual_seed(1)
    mtp = {name.replace("model.layers.3.", "mtp.layers.0."): tensor.clone() for name, tensor in weights.items()
           if name.startswith("model.layers.3.")}
    mtp["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=g) * (2 * hidden) ** -0.5
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{norm}.weight"] = torch.randn(hidden, generator=g) * 0.1
    save_file({**weights, **mtp}, f"{folder}/model.safetensors")
    return str(folder)


@pytest.mark.parametrize("variant", ["qwen3_5_moe_text", "qwen3_next_moe"])
def test_moe_checkpoints_mtp_layer_is_sparse_and_lossless(build_hf_model, tmp_path, variant):
    """The MTP layer of MoE checkpoints has the sparse block (layer 0's kind): it loads, matches the float64 formula
    of HF's sparse block, and speculative greedy output equals plain greedy output, on one rank and on two (gloo:
    the MTP layer's experts cut by their intermediate dimension as the target's are)."""
    import json

    path = moe_checkpoint_with_mtp(build_hf_model, variant, tmp_path / "ckpt")
    config = json.load(open(f"{path}/config.json"))
    rt = Runtime.from_pretrained(path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=4,
                                 speculative_config=spec(2))
    prompt = [5, 17, 99, 3, 42, 7, 8, 200, 31, 64]
    step = rt.prefill_for_drafts([rt.add_sequence(prompt)])
    next_ids = prompt[1:] + [77]
    with torch.inference_mode():
        ours = rt.model.mtp_forward(torch.tensor(next_ids), step.hidden, step.step)
    weights = load_file(f"{path}/model.safetensors")
    expected = mtp_float64(weights, weights["model.embed_tokens.weight"], step.hidden, next_ids, config)
    torch.testing.assert_close(ours.double(), expected, atol=2e-4, rtol=2e-4)
    prompts = [[5, 17, 99, 3], [250, 251, 1, 2, 3, 4, 5], [9] * 12]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = LLM(path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=4)
    speculative = LLM(path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=4,
                      speculative_config=spec(2))
    reference = [o.token_ids for o in plain.generate(prompts, greedy, use_tqdm=False)]
    assert [o.token_ids for o in speculative.generate(prompts, greedy, use_tqdm=False)] == reference
    with LLM(path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=4, tensor_parallel_size=2,
             speculative_config=spec(2)) as sharded:
        assert sharded.runtime.model.mtp.layers[0].mlp.expert_intermediate == config["moe_intermediate_size"] // 2
        assert [o.token_ids for o in sharded.generate(prompts, greedy, use_tqdm=False)] == reference


# -------------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize("bad", [{"method": "mtp", "num_speculative_tokens": 0},
                                 {"method": "mtp", "num_speculative_tokens": 5},
                                 {"method": "mtp", "num_speculative_tokens": True},
                                 {"method": "mtp", "num_speculative_tokens": "2"},
                                 {"method": "eagle", "num_speculative_tokens": 1},
                                 {"method": "mtp", "k": 1}, "mtp",
                                 {"method": "mtp", "num_speculative_tokens": 1, "disable_by_batch_size": 0},
                                 {"method": "mtp", "num_speculative_tokens": 1, "draft_vocab_size": 0},
                                 {"method": "mtp", "num_speculative_tokens": 1, "draft_vocab_size": 64.5},
                                 {"method": "mtp", "num_speculative_tokens": 1, "draft_vocab_size": 258},  # vocab 257
                                 {"method": "mtp", "num_speculative_tokens": 1, "auto_disable": "yes"},
                                 {"method": "mtp", "num_speculative_tokens": 1, "scripted_drafts": 1}])
def test_bad_speculative_config_raises(tiny_path, bad):
    with pytest.raises(ValueError, match="speculative_config"):
        Runtime.from_pretrained(tiny_path, device="cpu", speculative_config=bad)
    with pytest.raises(ValueError, match="speculative_config"):
        LLM(tiny_path, device="cpu", speculative_config=bad)


def test_checkpoint_without_mtp_names_what_is_missing(qwen3_5_text_untied_path, qwen3_5_conditional_path):
    with pytest.raises(CheckpointError, match=r"no mtp\.\* tensors"):
        Runtime.from_pretrained(str(qwen3_5_text_untied_path), device="cpu", speculative_config=spec(1))
    # The conditional test checkpoint carries only some mtp.* tensors: the first missing one is named.
    with pytest.raises(CheckpointError, match=r"lacks tensors: mtp\.layers\.0\.self_attn\.k_proj\.weight"):
        Runtime.from_pretrained(str(qwen3_5_conditional_path), device="cpu", speculative_config=spec(1),
                                max_model_len=64)


@pytest.mark.parametrize("overlap", [False, True])
def test_plain_steps_of_a_speculative_engine_overlap(tiny_path, overlap):
    """Rows that do not draft (here a drafting rule that never drafts) take plain decode steps, which with
    overlap_decode are read back one step later, as in a plain engine: the first plain step returns no token.
    The tokens are the non-speculative engine's either way."""
    prompt, params = PROMPTS[0], SamplingParams(temperature=0, max_tokens=8)

    class Never(DraftingRule):
        def should_draft(self, rows: int) -> bool:
            return False

    def stream(runtime_: Runtime) -> list[list[int]]:
        engine = LLMEngine(runtime_, overlap_decode=overlap,
                           drafting_rule=Never() if runtime_.num_speculative_tokens else None)
        engine.add_request("r", prompt, params)
        per_step = []
        while engine.has_unfinished_requests():
            per_step.append([t for out in engine.step() for t in out.new_token_ids])
        return per_step

    reference = stream(runtime(tiny_path))
    got = stream(runtime(tiny_path, k=1))
    assert sum(got, []) == sum(reference, []) and len(sum(got, [])) == 8
    # step 1 is the prompt's (its first token); step 2 is the first plain decode step, in flight with overlap
    assert got[1] == ([] if overlap else [sum(reference, [])[1]])


@pytest.mark.parametrize("draft_vocab,compile", [(None, False), (64, False),
                                                 pytest.param(None, True, marks=pytest.mark.in_background)])
def test_tp2_speculative_equals_tp1_non_speculative(tiny_path, draft_vocab, compile):
    """Tensor parallelism (2 ranks, gloo) with MTP drafts: every rank runs the same verify, draws, commit and
    drafts (its MTP layer sharded as the target's layers), so greedy and seeded sampled requests emit the tokens of a
    single-rank non-speculative run: fused rounds (eager; compiled, rank 0's loaded buffers broadcast to the worker's),
    and the unfused path (min_tokens suppression, logprobs) too; drafting over the whole vocabulary and over its first
    64 ids (the gathered logits cut)."""
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[4]]
    params = [SamplingParams(temperature=0, max_tokens=16),
              SamplingParams(temperature=0.9, top_k=30, seed=21, max_tokens=16),
              SamplingParams(temperature=0.8, top_p=0.9, seed=22, min_tokens=3, max_tokens=16),
              SamplingParams(temperature=0, logprobs=2, max_tokens=5)]  # unfused rounds until these two are done
    # 2 slots: the first two requests' rounds fused, the last two's unfused; compiled, two graphs a rank, not three
    knobs = dict(device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=2)
    reference = LLM(tiny_path, **knobs).generate(prompts, params, use_tqdm=False)
    ids = [f"r{i}" for i in range(len(prompts))]
    # Oracle drafts (the reference continuation, right 3 times in 4): long accepted runs on both ranks.
    drafts = oracle({i: o.token_ids for i, o in zip(ids, reference)}, {i: len(p) for i, p in zip(ids, prompts)},
                    0.75, 257)
    rt = Runtime.from_pretrained(tiny_path, tensor_parallel_size=2, compile=compile,
                                 speculative_config={**spec(2), "draft_vocab_size": draft_vocab}, **knobs)
    assert (rt.speculative_round is not None) == compile
    try:
        engine = LLMEngine(rt, draft_override=drafts)
        for request_id, prompt, p in zip(ids, prompts, params):
            engine.add_request(request_id, prompt, p)
        got, _ = finish_all(engine)
    finally:
        rt.close()
    got = [got[i] for i in ids]
    assert [o.token_ids for o in got] == [o.token_ids for o in reference]
    assert engine.num_accepted_tokens > 0  # rounds of several tokens ran on both ranks
    assert len(got[3].logprobs) == len(reference[3].logprobs) == 5
    for ours, theirs in zip(got[3].logprobs, reference[3].logprobs):  # from the verify step's gathered logits
        assert ours.token_id == theirs.token_id and [t for t, _ in ours.top] == [t for t, _ in theirs.top]
        assert math.isclose(ours.logprob, theirs.logprob, abs_tol=1e-4)


def test_engine_speculative_config_needs_a_runtime_with_one(tiny_path):
    with pytest.raises(ValueError, match="runtime built with one"):
        LLMEngine(runtime(tiny_path), speculative_config=spec(1))
    with pytest.raises(ValueError, match="exceeds"):
        LLMEngine(runtime(tiny_path, k=1), speculative_config=spec(2))
    with pytest.raises(ValueError, match="draft_vocab_size=64 differs"):
        LLMEngine(runtime(tiny_path, k=1), speculative_config={**spec(1), "draft_vocab_size": 64})
    assert SpeculativeConfig.parse(None) is None


def test_engine_with_fewer_drafts_than_its_runtime(tiny_path, greedy_reference):
    engine = LLMEngine(runtime(tiny_path, k=3), speculative_config=spec(1))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=20))
    done, _ = finish_all(engine)
    assert [done[f"r{i}"].token_ids for i in range(len(PROMPTS))] == greedy_reference
    assert engine.num_draft_tokens == engine.num_verified_rows  # one draft a round


def test_draft_vocab_size_drafts_the_argmax_of_the_first_ids(tiny_path):
    """With draft_vocab_size N each first draft is the argmax over token ids < N of the float64 logits of the MTP
    layer's output (an independent product with the lm_head's first N rows), while the whole vocabulary drafts
    ids >= N for the same prompts (so the restriction is seen)."""
    n = 64
    prompts = [[5, 17, 99, 3, 42], [250, 251, 1, 2], list(range(100, 140)), [9] * 7, [200, 100, 150]]
    drafts = {}
    for vocab in (None, n):
        rt = Runtime.from_pretrained(tiny_path, device="cpu", dtype="float32", max_model_len=MAX_LEN,
                                     max_num_seqs=len(prompts), speculative_config={**spec(3), "draft_vocab_size": vocab})
        seqs = [rt.add_sequence(p) for p in prompts]
        with torch.inference_mode():
            step = rt.prefill_for_drafts(seqs)
            sampled = step.logits.argmax(dim=-1)
            drafts[vocab] = rt.draft_after_prefill(step, sampled)
            # The oracle: the MTP layer's output at each prompt's last row (its next token: the sampled one).
            next_ids = torch.cat([torch.tensor(p[1:] + [t]) for p, t in zip(prompts, sampled.tolist())])
            out = rt.model.mtp_forward(next_ids, step.hidden, step.step)
        last = torch.tensor([sum(map(len, prompts[: i + 1])) - 1 for i in range(len(prompts))])
        logits = out[last].double() @ rt.model.lm_head.double().T
        if vocab is not None:
            assert torch.equal(drafts[vocab][:, 0], logits[:, :n].argmax(dim=-1))
    assert (drafts[n] < n).all()
    assert (drafts[None] >= n).any(), "every full-vocabulary draft is below N: the test would not see the cut"


# ------------------------------------------------------------------------------------------ greedy exactness
PROMPTS = [[5, 17, 99, 3, 42, 7, 8, 200], [1, 2, 3], list(range(40, 90)), [250, 251], [9] * 20]


@pytest.fixture(scope="module")
def greedy_reference(tiny_path) -> list[list[int]]:
    llm = LLM(tiny_path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=6)
    return [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)]


@pytest.mark.parametrize("k,draft_vocab", [(1, None), (2, None), (3, None), (2, 64)])
def test_greedy_output_equals_non_speculative(tiny_path, greedy_reference, k, draft_vocab):
    llm = LLM(tiny_path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=6,
              speculative_config={**spec(k), "draft_vocab_size": draft_vocab})
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    assert [o.token_ids for o in outputs] == greedy_reference


def oracle(reference: dict[str, list[int]], prompt_len: dict[str, int], rate: float, vocab: int, seed: int = 0):
    """A drafter that proposes the known greedy continuation, each token right with probability ``rate``."""
    rng = random.Random(seed)

    def override(request_id: str, token_ids: list[int], drafts: list[int]) -> list[int]:
        at = len(token_ids) - prompt_len[request_id]
        ref = reference[request_id]
        return [ref[at + j] if at + j < len(ref) and rng.random() < rate else rng.randrange(vocab)
                for j in range(len(drafts))]

    return override


@pytest.mark.parametrize("k,rate", [(1, 1.0), (3, 1.0), (2, 0.6), (4, 0.8)])
def test_greedy_output_with_accepted_drafts_equals_non_speculative(tiny_path, greedy_reference, k, rate):
    """Oracle drafts make long accepted runs: every accepted-prefix length, the bonus token and the state commit
    after each are exercised; the output is still the non-speculative greedy output."""
    rt = runtime(tiny_path, k=k)
    ids = [f"r{i}" for i in range(len(PROMPTS))]
    engine = LLMEngine(rt, draft_override=oracle(dict(zip(ids, greedy_reference)),
                                                 {i: len(p) for i, p in zip(ids, PROMPTS)}, rate, 257))
    for request_id, prompt in zip(ids, PROMPTS):
        engine.add_request(request_id, prompt, SamplingParams(temperature=0, max_tokens=20))
    finished, steps = finish_all(engine)
    assert [finished[i].token_ids for i in ids] == greedy_reference
    if rate == 1.0:  # every verify step accepts all k drafts: 1 prefill step, then 19 tokens in ceil(19/(k+1))
        assert steps == 1 + math.ceil(19 / (k + 1))


def scripts(prompts: list[list[int]], continuations: list[list[int]], shift: int = 0):
    """``draft_script``: each request's greedy continuation (found by its prompt) by position (``continuation[i]``
    at position ``len(prompt) + i``), each token moved by ``shift`` (1: every draft wrong), -1 (the MTP layer's)
    before it."""
    by_prompt = {tuple(p): c for p, c in zip(prompts, continuations)}

    def script(request_id: str, prompt: list[int]) -> list[int]:
        return [-1] * len(prompt) + [(t + shift) % 257 for t in by_prompt[tuple(prompt)]]
    return script


def scripted_runtime(path: str, k: int, **knobs) -> Runtime:
    return Runtime.from_pretrained(path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=6,
                                   speculative_config={**spec(k), "scripted_drafts": True}, **knobs)


@pytest.mark.parametrize("overlap", [False, True])
def test_scripted_drafts_are_the_rounds_drafts_and_their_rounds_chain(tiny_path, greedy_reference, overlap):
    """A runtime built with ``scripted_drafts``: a request scripted with its greedy continuation (the plain run's)
    accepts every scripted draft, one scripted wrong accepts none, an unscripted one drafts with the MTP layer; every output
    is the non-speculative greedy run's. Without overlap each round is one step (a prompt step, then 19 tokens in
    ceil(19 / 3) rounds of k = 2 when all is accepted); with it the scripted rounds chain, as the MTP layer's do and
    a host ``draft_override``'s cannot."""
    ids = [f"r{i}" for i in range(len(PROMPTS))]
    params = SamplingParams(temperature=0, max_tokens=20)
    rt = scripted_runtime(tiny_path, k=2)
    # Right: 7 rounds of 2 drafts; the 7th's second is for a position past the script (the layer's), the rest right.
    for shift, accepted in ((0, (13, 14)), (1, (0, 0))):
        engine = LLMEngine(rt, draft_script=scripts(PROMPTS, greedy_reference, shift), overlap_decode=overlap)
        engine.add_request("r0", PROMPTS[0], params)
        finished, steps = finish_all(engine)
        assert finished["r0"].token_ids == greedy_reference[0]
        assert accepted[0] <= engine.num_accepted_tokens <= accepted[1]
        if not overlap:
            assert steps == (1 + math.ceil(19 / 3) if shift == 0 else 20)
        elif shift == 0:
            assert engine.num_chained_rounds > 0
    engine = LLMEngine(rt, overlap_decode=overlap)  # no script: the rows the runs above scripted are the layer's
    for request_id, prompt in zip(ids, PROMPTS):
        engine.add_request(request_id, prompt, params)
    finished, _ = finish_all(engine)
    assert [finished[i].token_ids for i in ids] == greedy_reference
    layer = LLMEngine(runtime(tiny_path, k=2))
    for request_id, prompt in zip(ids, PROMPTS):
        layer.add_request(request_id, prompt, params)
    finish_all(layer)
    assert (engine.num_draft_tokens, engine.num_accepted_tokens) == (layer.num_draft_tokens, layer.num_accepted_tokens)


def test_a_draft_script_needs_a_scripted_runtime(tiny_path):
    with pytest.raises(ValueError, match="scripted_drafts"):
        LLMEngine(runtime(tiny_path, k=2), draft_script=lambda request_id, prompt: [])
    rt = scripted_runtime(tiny_path, k=1)
    with pytest.raises(ValueError, match="state slot 0"):
        rt.executor.draft_script.write(0, [1, 2])  # the null slot: padding rows read it
    with pytest.raises(ValueError, match="one rank"):  # refused before any worker process starts
        scripted_runtime(tiny_path, k=1, tensor_parallel_size=2)


def test_stop_strings_inside_accepted_runs_equal_non_speculative(tiny_path, greedy_reference):
    """A stop string (two bytes of the byte-level tokenizer: two tokens) that completes in the middle of an accepted
    run: the text, tokens and stop_reason equal the non-speculative run's with the same stop; and logprobs, which a
    verify step does not compute, are refused by name."""
    printable = lambda t: 32 <= t < 127  # noqa: E731
    stops = []
    for out in greedy_reference:
        at = next((i for i in range(5, len(out) - 1) if printable(out[i]) and printable(out[i + 1])), None)
        if at is not None:
            stops.append(bytes(out[at : at + 2]).decode())
    assert stops, "no two printable tokens in a row in the greedy outputs"
    params = SamplingParams(temperature=0, max_tokens=20, stop=stops)
    plain = LLM(tiny_path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=6)
    expected = plain.generate(PROMPTS, params, use_tqdm=False)
    assert any(o.stop_reason in stops for o in expected)
    ids = [f"r{i}" for i in range(len(PROMPTS))]
    engine = LLMEngine(runtime(tiny_path, k=3), plain.tokenizer, draft_override=oracle(
        dict(zip(ids, greedy_reference)), {i: len(p) for i, p in zip(ids, PROMPTS)}, 1.0, 257))
    for request_id, prompt in zip(ids, PROMPTS):
        engine.add_request(request_id, prompt, params)
    finished, _ = finish_all(engine)
    for request_id, want in zip(ids, expected):
        got = finished[request_id]
        assert (got.token_ids, got.text, got.finish_reason, got.stop_reason) == (
            want.token_ids, want.text, want.finish_reason, want.stop_reason)


def test_logprobs_in_speculative_rounds_are_the_models_log_softmax(tiny_path, greedy_reference):
    """Logprobs of tokens emitted by verify rounds (accepted drafts and the correction or bonus, oracle drafts at
    rate 0.6) and by the prefill round: against HF transformers' float64 log-softmax over prompt + output, for a
    greedy and a seeded sampled request; the greedy one's tokens are the plain greedy run's."""
    from tests import hf_models

    model = hf_models.load_hf(tiny_path).double()
    ids = [f"r{i}" for i in range(len(PROMPTS))]
    engine = LLMEngine(runtime(tiny_path, k=2), draft_override=oracle(
        dict(zip(ids, greedy_reference)), {i: len(p) for i, p in zip(ids, PROMPTS)}, 0.6, 257))
    params = [SamplingParams(temperature=0, max_tokens=20, logprobs=3),
              SamplingParams(temperature=0.8, top_k=40, seed=5, max_tokens=20, logprobs=2, ignore_eos=True)]
    for i, (request_id, prompt) in enumerate(zip(ids[:2], PROMPTS[:2])):
        engine.add_request(request_id, prompt, params[i])
    finished, _ = finish_all(engine)
    assert finished["r0"].token_ids == greedy_reference[0]
    assert engine.num_verified_rows > 0 and engine.num_accepted_tokens > 0
    for request_id, prompt, p in zip(ids, PROMPTS, params):
        out = finished[request_id]
        assert [e.token_id for e in out.logprobs] == out.token_ids
        oracle_rows = torch.log_softmax(hf_models.hf_logits(model, prompt + out.token_ids).double(), -1)
        for row, entry in zip(oracle_rows[len(prompt) - 1 : -1], out.logprobs):
            assert math.isclose(entry.logprob, row[entry.token_id].item(), abs_tol=1e-4)
            assert len(entry.top) == p.logprobs
            for token, value in entry.top:
                assert math.isclose(value, row[token].item(), abs_tol=1e-4)
            assert [t for t, _ in entry.top] == row.topk(p.logprobs).indices.tolist()


# ------------------------------------------------------------------------------------------ rejection sampling
def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P-value of Pearson's chi-square test of ``counts`` against ``probs`` (cells of expected count >= 5)."""
    n = counts.sum()
    expected = probs * n
    cells = expected >= 5
    stat = ((counts[cells] - expected[cells]) ** 2 / expected[cells]).sum()
    df = int(cells.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat.double() / 2))


def _batch(rows: int, temperature: float, top_k: int, top_p: float, seeds: torch.Tensor, k: int) -> SamplingBatch:
    return SamplingBatch(
        temperature=torch.full((rows,), temperature), top_k=torch.full((rows,), top_k, dtype=torch.long),
        top_p=torch.full((rows,), top_p), min_p=torch.zeros(rows), seeds=seeds,
        counters=torch.arange(k + 1).repeat(rows // (k + 1)), suppress_rows=torch.zeros(0, dtype=torch.long),
        suppress_tokens=torch.zeros(0, dtype=torch.long), all_greedy=False, use_top_k=top_k > 0,
        use_top_p=top_p < 1,
    )


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8)])
def test_rejection_sampling_keeps_the_target_distribution(temperature, top_k, top_p):
    """Two draft positions, many independent seeds: the first output token follows the target row 0's
    distribution, and the second (given the first accepted draft) row 1's, whatever the drafts propose."""
    torch.manual_seed(0)
    vocab, k, n = 8, 2, 40000
    logits = torch.randn(k + 1, vocab) * 1.5
    drafts = torch.tensor([[2, 5]]).repeat(n, 1)  # a likely and an unlikely proposal, the same for every sequence
    seeds = torch.arange(n).repeat_interleave(k + 1) * 7919 + 13
    batch = _batch(n * (k + 1), temperature, top_k, top_p, seeds, k)
    accepted, tokens = rejection_sample(logits.repeat(n, 1), drafts, batch)
    # The float64 oracle of tests/test_sampling_op.py (its own top-k / top-p), not the sampler's filters.
    target = torch.stack([filtered_softmax(row, temperature, top_k, top_p, 0.0) for row in logits])
    first = torch.bincount(tokens[:, 0], minlength=vocab).double()
    assert _chi_square_p(first, target[0]) > 1e-3
    assert first[target[0] == 0].sum() == 0  # never a token the filters drop
    second = tokens[accepted >= 1, 1]
    assert _chi_square_p(torch.bincount(second, minlength=vocab).double(), target[1]) > 1e-3
    # The acceptance rate of draft 1 is its target probability.
    rate = (accepted >= 1).double().mean()
    assert abs(rate - target[0, 2]) < 4 * math.sqrt(target[0, 2] * (1 - target[0, 2]) / n) + 1e-9


def test_rejection_sampling_greedy_accepts_the_argmax_prefix():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]] * 2)
    drafts = torch.tensor([[1, 0], [1, 2]])
    rows = 6
    batch = SamplingBatch(torch.zeros(rows), torch.zeros(rows, dtype=torch.long), torch.ones(rows), torch.zeros(rows),
                          torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long),
                          torch.tensor([4]), torch.tensor([0]), True, False, False)  # row 4 may not pick token 0
    accepted, tokens = rejection_sample(logits, drafts, batch)
    assert accepted.tolist() == [2, 2]  # row 4's argmax is 0, suppressed (min_tokens): then 2, the draft
    assert tokens.tolist() == [[1, 0, 2], [1, 2, 2]]
    drafts[1, 1] = 1
    accepted, tokens = rejection_sample(logits, drafts, batch)
    assert accepted.tolist() == [2, 1] and tokens[1, :2].tolist() == [1, 2]  # the correction: row 4's argmax


# ------------------------------------------------------------------------------------------------ sampling
def test_seeded_sampling_is_batch_invariant(tiny_path):
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=16)
    llm = LLM(tiny_path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=6,
              speculative_config=spec(2))
    solo = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=12)
    batch = llm.generate(PROMPTS, [params] + [others] * (len(PROMPTS) - 1), use_tqdm=False)
    assert batch[0].token_ids == solo and len(solo) == 16


SAMPLED = [SamplingParams(temperature=0.8, seed=11, max_tokens=20),
           SamplingParams(temperature=1.0, top_k=20, seed=12, max_tokens=20),
           SamplingParams(temperature=0.7, top_p=0.9, min_p=0.02, seed=13, max_tokens=20),
           SamplingParams(temperature=0, max_tokens=20),
           SamplingParams(temperature=1.2, top_k=50, top_p=0.95, seed=14, max_tokens=20)]


@pytest.fixture(scope="module")
def sampled_reference(tiny_path) -> list[list[int]]:
    llm = LLM(tiny_path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=6)
    return [o.token_ids for o in llm.generate(PROMPTS, SAMPLED, use_tqdm=False)]


@pytest.mark.parametrize("k,rate", [(1, None), (3, None), (2, 0.8), (4, 1.0)])
def test_seeded_sampled_output_equals_non_speculative(tiny_path, sampled_reference, k, rate):
    """Seeded sampled requests (temperature, top-k, top-p, min-p, one greedy among them) emit their non-speculative
    tokens: every verified row draws what a decode step draws at that output index, and a draft is kept iff it is
    that draw. With the MTP head's drafts, and with oracle drafts (the reference continuation, right with
    probability ``rate``): long accepted runs of sampled tokens."""
    ids = [f"r{i}" for i in range(len(PROMPTS))]
    override = None
    if rate is not None:
        override = oracle(dict(zip(ids, sampled_reference)), {i: len(p) for i, p in zip(ids, PROMPTS)}, rate, 257)
    engine = LLMEngine(runtime(tiny_path, k=k), draft_override=override)
    for request_id, prompt, params in zip(ids, PROMPTS, SAMPLED):
        engine.add_request(request_id, prompt, params)
    done, steps = finish_all(engine)
    assert [done[i].token_ids for i in ids] == sampled_reference
    if rate == 1.0:  # every round accepts all k drafts: 1 prefill step, then 19 tokens in ceil(19/(k+1)) rounds
        assert steps == 1 + math.ceil(19 / (k + 1))


# ---------------------------------------------------------------------------------------------- the engine
def ticks():
    """A clock that advances one second a reading: every step the engine times takes exactly 1 s."""
    now = iter(range(1 << 30))
    return lambda: float(next(now))


def test_drafting_rule_drafts_while_rounds_deliver_more_tokens_a_second(tiny_path):
    """The rule's decisions against the break-even computed here: drafting at d rows pays iff a round's tokens a
    second, (1 + accepted) / round(d), beat a plain step's, 1 / plain(d). (The latest measurement of each alone:
    ``smoothing=1.0``, ``memory_rows=1``.)"""
    rule = DraftingRule(probe_interval=4, smoothing=1.0, memory_rows=1)
    assert rule.should_draft(2)  # nothing measured: draft first
    rule.record_round(2, 9.0, drafted_rows=2, accepted_drafts=2)  # dropped (may carry a graph capture)
    assert rule.should_draft(2)
    rule.record_round(2, 3.0, drafted_rows=2, accepted_drafts=1)  # 0.5 drafts accepted a row, a round 3 s
    assert not rule.should_draft(2)  # plain steps not measured yet
    rule.record_plain(2, 50.0)  # dropped (but a plain step since the round all the same)
    rule.record_plain(2, 1.0)
    assert (1 + 0.5) * 1.0 < 3.0 and not rule.should_draft(2)
    rule.record_plain(2, 1.0)
    assert not rule.should_draft(2)  # 3 plain steps since the round
    rule.record_plain(2, 1.0)
    assert rule.should_draft(2) and rule.should_draft(2)  # the 4th: a probe, held until a round with drafts
    rule.record_round(2, 3.0, drafted_rows=0, accepted_drafts=0)  # its first round verifies placeholders
    assert rule.should_draft(2) and rule.accepted == 0.5
    rule.record_round(2, 3.0, drafted_rows=2, accepted_drafts=6)  # 3 drafts a row: 4 tokens in 3 s against 1 in 1
    assert (1 + 3) / 3.0 > 1 / 1.0 and rule.should_draft(2)
    assert rule.should_draft(5)  # other row counts are measured on their own
    rule.record_plain(2, 5.0)  # plain steps got slower: 4 tokens in 3 s still beat 1 in 5
    assert rule.should_draft(2)
    with pytest.raises(ValueError, match="probe_interval"):
        DraftingRule(probe_interval=0)
    with pytest.raises(ValueError, match="memory_rows"):
        DraftingRule(memory_rows=0)
    with pytest.raises(ValueError, match="drafting_rule needs speculative decoding"):
        LLMEngine(Runtime.from_pretrained(tiny_path, device="cpu", max_model_len=64, max_num_seqs=1),
                  drafting_rule=DraftingRule())


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_drafting_rule_stops_drafting_that_does_not_pay(tiny_path, greedy_reference, rate):
    """On a clock where every step costs the same, a round pays iff it accepts drafts. Against the same engine
    without the rule: at acceptance 0 it verifies a third of the rows or fewer (the first 16 drafted rows, the
    measuring rounds and a probe every 8 plain steps; 49 of 167 here), at acceptance 1 it takes at most 2 steps more
    for each row count it meets (the 2 plain steps that measure plain decoding; the round after them verifies
    placeholder drafts); the output is the non-speculative greedy output."""
    k, new = 2, 40
    ids = [f"r{i}" for i in range(len(PROMPTS))]
    runtime_ = runtime(tiny_path, k=k)
    reference = [o.token_ids for o in LLM(tiny_path, device="cpu", dtype="float32", max_model_len=MAX_LEN,
                                          max_num_seqs=6).generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=new), use_tqdm=False)]
    assert [r[:20] for r in reference] == greedy_reference

    def run(rule):
        drafter = oracle(dict(zip(ids, reference)), {i: len(p) for i, p in zip(ids, PROMPTS)}, rate, 257)
        engine = LLMEngine(runtime_, draft_override=drafter, drafting_rule=rule)
        for request_id, prompt in zip(ids, PROMPTS):
            engine.add_request(request_id, prompt, SamplingParams(temperature=0, max_tokens=new))
        finished, steps = finish_all(engine)
        assert [finished[i].token_ids for i in ids] == reference
        return engine, steps

    rule = DraftingRule(probe_interval=8, clock=ticks())
    plain_engine, plain_steps = run(None)
    engine, steps = run(rule)
    row_counts = len({len(r) for r in reference})  # requests that end earlier leave fewer rows
    last_rows = sum(len(r) == new for r in reference)
    if rate == 0.0:
        assert rule.accepted == 0.0
        assert 0 < engine.num_verified_rows <= plain_engine.num_verified_rows / 3
    else:
        assert rule.accepted == k and rule.should_draft(last_rows)
        assert steps <= plain_steps + 2 * row_counts


def rule_on_a_synthetic_stream(rule: DraftingRule, phases: list[tuple[float, int]], rows: int = 1, k: int = 2,
                               round_s: float = 1.5, plain_s: float = 0.72, seed: int = 0) -> list[list[bool]]:
    """Steps of ``rows`` rows as the engine feeds the rule, on a fixed clock: a step drafts iff
    ``rule.should_draft(rows)``. A round takes ``round_s``; after a plain step it verifies placeholders (no drafted
    rows, as in the engine), otherwise each row accepts the leading successes of k draws at the phase's per-draft
    acceptance (a seeded RNG). A plain step takes ``plain_s``. ``phases``: (acceptance, steps); per phase, whether each
    step drafted."""
    rng = random.Random(seed)
    after_plain, drafted = False, []
    for acceptance, steps in phases:
        drafted.append([])
        for _ in range(steps):
            draft = rule.should_draft(rows)
            drafted[-1].append(draft)
            if not draft:
                rule.record_plain(rows, plain_s)
            elif after_plain:
                rule.record_round(rows, round_s, drafted_rows=0, accepted_drafts=0)
            else:
                accepted = 0
                for _ in range(rows):
                    run = 0
                    while run < k and rng.random() < acceptance:
                        run += 1
                    accepted += run
                rule.record_round(rows, round_s, drafted_rows=rows, accepted_drafts=accepted)
            after_plain = not draft
    return drafted


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("acceptance", [0.8, 0.2])
def test_drafting_rule_follows_the_break_even_through_acceptance_noise(acceptance, rows):
    """A plain step 0.72 s, a round 1.5 s, k = 2: a row accepts 0, 1 or 2 drafts, E[a] = p + p^2, so drafting pays iff
    (1 + p + p^2) * 0.72 > 1.5: at p = 0.8 (1.76 > 1.5), not at p = 0.2 (0.89 < 1.5). A row's count is noisy (at
    p = 0.8 its standard deviation, 0.8, is over twice the margin, 1.44 - 1.08), most of all at one row a round.
    Over 2,000 steps, with each of a few seeds, the rule drafts in at least 90 % of the steps where drafting pays, in
    at most 10 % (the first rows, the probes) where it does not."""
    k, round_s, plain_s = 2, 1.5, 0.72
    pays = (1 + sum(acceptance ** j for j in range(1, k + 1))) * plain_s > round_s
    assert pays == (acceptance == 0.8)
    for seed in range(5):
        for rule in (DraftingRule(), DraftingRule(num_drafts=k)):
            [steps] = rule_on_a_synthetic_stream(rule, [(acceptance, 2000)], rows, k, round_s, plain_s, seed)
            share = sum(steps) / len(steps)
            assert share >= 0.9 if pays else share <= 0.1, (seed, rule.num_drafts, share)


def test_drafting_rule_knowing_k_stops_at_once_where_drafting_cannot_pay():
    """At acceptance 0, one row a round, a rule that knows k stops once even an optimistic per-draft acceptance,
    p = 4 / (4 + r) after r rows that accepted nothing (4 accepted drafts of prior), would not pay:
    (1 + p + ... + p^k) * plain <= round. It does not draft the floor's memory_rows / 4 = 16 rows first. With a
    round costing more at each larger k, as a verify of more rows does, a larger k stops no later. Without k the rule
    drafts 17 of the first 64 steps."""
    plain_s = 0.80
    round_s = {1: 0.98, 2: 1.16, 3: 1.33, 4: 1.50}
    drafted = {}
    for k, cost in round_s.items():
        rows_to_stop = next(r for r in range(1, 64)
                            if (1 + sum((4 / (4 + r)) ** i for i in range(1, k + 1))) * plain_s <= cost)
        [steps] = rule_on_a_synthetic_stream(DraftingRule(num_drafts=k), [(0.0, 64)], 1, k, cost, plain_s)
        drafted[k] = sum(steps)
        # two rounds measure a round's cost before the first decision (the first measurement is dropped); rows
        # aging between decisions (1/64 of their weight a row decoded) add about one row in eight
        assert rows_to_stop <= drafted[k] <= rows_to_stop + 2 + rows_to_stop // 8, (k, rows_to_stop, drafted[k])
        # rounds, plain steps that measure a plain step's cost, rounds until the stop, then plain steps to the probe
        assert steps == [True] * 2 + [False] * 2 + [True] * (drafted[k] - 2) + [False] * (62 - drafted[k]), k
    assert drafted[1] >= drafted[2] >= drafted[3] >= drafted[4] and drafted[4] < 16, drafted
    [steps] = rule_on_a_synthetic_stream(DraftingRule(), [(0.0, 64)], 1, 2, 1.5, 0.72)
    assert sum(steps) == 17


def test_drafting_rule_follows_acceptance_that_changes():
    """One row a round, the costs above: acceptance 0.8 (drafting pays), then 0.2 (it does not), then 0.8 again, 1,000
    steps each. Drafting stops within 100 steps of the drop (rows age the estimate) and, after the rise, is back on
    within 500 steps (the probes' rows weigh against aged evidence); in between only probes draft."""
    for seed in range(5):
        high, low, again = rule_on_a_synthetic_stream(DraftingRule(), [(0.8, 1000), (0.2, 1000), (0.8, 1000)],
                                                      seed=seed)
        shares = [sum(high) / len(high), sum(low[100:]) / len(low[100:]), sum(again[500:]) / len(again[500:])]
        assert shares[0] >= 0.9 and shares[1] <= 0.1 and shares[2] >= 0.9, (seed, shares)


def test_drafting_rule_acceptance_weighs_rows_by_age():
    """``accepted`` against the mean computed from the whole history: each step's accepted drafts and drafted rows
    weighted by (1 - 1 / memory_rows) ** (rows decoded in the steps after it), plain steps' rows counting as decoded,
    placeholder rows (rows that did not draft) too."""
    rng = random.Random(3)
    memory = 8
    rule = DraftingRule(memory_rows=memory)
    history = []  # per step: rows, drafted rows, accepted drafts
    for _ in range(300):
        rows = rng.randint(1, 6)
        if rng.random() < 0.3:
            rule.record_plain(rows, 1.0)
            history.append((rows, 0, 0))
            continue
        drafted = rng.randint(0, rows)
        accepted = sum(rng.randint(0, 3) for _ in range(drafted))
        rule.record_round(rows, 1.0, drafted, accepted)
        history.append((rows, drafted, accepted))
        later, accepted_sum, drafted_sum = 0, 0.0, 0.0
        for rows_i, drafted_i, accepted_i in reversed(history):
            weight = (1 - 1 / memory) ** later
            accepted_sum += weight * accepted_i
            drafted_sum += weight * drafted_i
            later += rows_i
        if drafted_sum:
            assert rule.accepted == pytest.approx(accepted_sum / drafted_sum, rel=1e-9)
        else:
            assert rule.accepted is None


def test_auto_disable_key_builds_the_rule_and_keeps_outputs(tiny_path, greedy_reference):
    """``"auto_disable": True`` on LLM: the engine gets a DraftingRule (timed with the wall clock), and the output is
    the non-speculative greedy output whatever it decides."""
    llm = LLM(tiny_path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=6,
              speculative_config={**spec(2), "auto_disable": True})
    assert isinstance(llm.engine.drafting_rule, DraftingRule)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    assert [o.token_ids for o in outputs] == greedy_reference
    assert llm.engine.drafting_rule.accepted is not None  # it measured rounds
    assert LLM(tiny_path, device="cpu", max_model_len=64, max_num_seqs=1,
               speculative_config=spec(1)).engine.drafting_rule is None  # off by default


@pytest.fixture(scope="module")
def runtimes(tiny_path) -> dict:
    """Reused across examples: non-speculative, and k = 1..3 (one with prefix caching, one that decodes plainly
    beyond 2 decoding sequences), all with a small KV cache so that preemption happens."""
    small = dict(num_kv_blocks=14, block_size=16, max_num_seqs=4)
    return {
        0: runtime(tiny_path, **small),
        1: runtime(tiny_path, k=1, **small),
        2: runtime(tiny_path, k=2, enable_prefix_caching=True, prefix_snapshot_interval=64, **small),
        3: runtime(tiny_path, k=3, disable_by_batch_size=2, **small),
    }


request_strategy = st.fixed_dictionaries({
    "prompt": st.one_of(st.lists(st.integers(0, 256), min_size=1, max_size=70),
                        st.sampled_from([list(range(100, 164)) + [1, 2], list(range(100, 164)) + [7]])),
    "max_tokens": st.integers(1, 48),
    "min_tokens": st.integers(0, 6),
    "stop": st.lists(st.integers(0, 256), max_size=8),
    "arrival": st.integers(0, 6),
    "abort_at": st.one_of(st.none(), st.integers(1, 12)),
    "temperature": st.sampled_from([0.0, 0.0, 0.0, 0.8]),
})


def _run(runtime_: Runtime, requests: list[dict], draft_override=None, reasons: dict | None = None,
         drafting_rule: DraftingRule | None = None, overlap_decode: bool = False) -> dict:
    engine = LLMEngine(runtime_, max_num_batched_tokens=48, kv_growth_reserve=0.0, draft_override=draft_override,
                       drafting_rule=drafting_rule, overlap_decode=overlap_decode)
    tokens: dict[str, list[int]] = {}
    step = 0
    pending = list(enumerate(requests))
    while pending or engine.has_unfinished_requests():
        for i, r in [p for p in pending if p[1]["arrival"] <= step]:
            params = SamplingParams(temperature=r.get("temperature", 0.0), seed=i, max_tokens=r["max_tokens"],
                                    min_tokens=min(r["min_tokens"], r["max_tokens"]), stop_token_ids=r["stop"])
            engine.add_request(f"r{i}", r["prompt"], params)
            pending.remove((i, r))
        for i, r in enumerate(requests):
            if r["abort_at"] == step and f"r{i}" in engine.requests:
                engine.abort_request(f"r{i}")
        for out in engine.step():
            tokens[out.request_id] = out.token_ids
            if reasons is not None and out.finished:
                reasons[out.request_id] = out.finish_reason
        step += 1
    assert runtime_.caches.num_free_slots == runtime_.config.max_num_seqs  # nothing leaked
    return tokens


@settings(max_examples=12)
@given(requests=st.lists(request_strategy, min_size=1, max_size=5), k=st.sampled_from([1, 2, 3]),
       rate=st.sampled_from([0.0, 0.5, 0.9, None]), overlap=st.booleans())
def test_engine_stream_equals_non_speculative(runtimes, requests, k, rate, overlap):
    """Arrivals, aborts, preemption (a small KV cache), stop tokens, min_tokens and max_tokens falling inside
    accepted runs, prefix caching (k = 2), drafting turned off and on again by the batch size (k = 3) and by the
    drafting rule (k = 1: a clock on which every step costs the same, so drafting stops at acceptance 0 and probes
    again every 3 plain steps), those plain steps overlapped or not (overlap_decode), with oracle drafts at a few
    acceptance rates or the MTP head's own (rate None: with overlap_decode its rounds chain, k = 2's excepted: prefix
    caching): every request's tokens are the non-speculative run's (a prefix of them for aborted requests), the sampled ones' too (seeded: each verified row
    draws what a decode step draws there)."""
    full = [dict(r, abort_at=None) for r in requests]
    reference_reasons: dict[str, str] = {}
    reference = _run(runtimes[0], full, reasons=reference_reasons)
    ids = {f"r{i}": r for i, r in enumerate(requests)}
    override = None if rate is None else oracle(reference, {i: len(r["prompt"]) for i, r in ids.items()}, rate, 257)
    reasons: dict[str, str] = {}
    rule = DraftingRule(probe_interval=3, clock=ticks()) if k == 1 else None
    got = _run(runtimes[k], requests, override, reasons, rule, overlap)
    for request_id, r in ids.items():
        ref = reference[request_id]
        out = got.get(request_id, [])
        if r["abort_at"] is None:
            assert out == ref, request_id
            assert reasons[request_id] == reference_reasons[request_id], request_id  # stop or length alike
        else:
            assert out == ref[: len(out)], request_id


@pytest.mark.parametrize("k", [2, 4])
def test_drafts_across_max_model_len(tiny_path, k):
    """Sequences that end at max_model_len: verify rows and draft positions past it map to the null block; the
    output still ends exactly where the non-speculative one does (finish_reason "length")."""
    prompts = [list(range(10, 40)), list(range(50, 86)), [3] * 38]
    params = SamplingParams(temperature=0, max_tokens=30)

    def run(k_: int, override=None) -> list:
        engine = LLMEngine(runtime(tiny_path, k=k_, max_model_len=40, num_kv_blocks=12, block_size=8),
                           draft_override=override)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        done, _ = finish_all(engine)
        return [(done[f"r{i}"].token_ids, done[f"r{i}"].finish_reason) for i in range(len(prompts))]

    reference = run(0)
    assert all(reason == "length" and len(p) + len(t) == 40 for (t, reason), p in zip(reference, prompts))
    tokens = {f"r{i}": t for i, (t, _) in enumerate(reference)}
    assert run(k, oracle(tokens, {f"r{i}": len(p) for i, p in enumerate(prompts)}, 1.0, 257)) == reference
    assert run(k) == reference


# ---------------------------------------------------------------------------------------------- compiled rounds
@pytest.mark.parametrize("draft_vocab", [None, 64])
def test_compiled_rounds_equal_non_speculative(tiny_path, draft_vocab):
    """Rounds compiled (Inductor's C++ code on the CPU; CUDA graphs on a GPU), buckets 1 and 2 in both variants
    compiled at start-up on padding rows: a greedy and a seeded sampled request together (the sampling variant),
    then a greedy one alone (the argmax variant) give the non-speculative output, with nothing recompiled later (the
    rounds run under fail_on_recompile); with the whole vocabulary drafting and with its first 64 ids."""
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[1]]
    params = [SamplingParams(temperature=0, max_tokens=12),
              SamplingParams(temperature=0.9, top_k=30, top_p=0.9, seed=5, max_tokens=12),
              SamplingParams(temperature=0, max_tokens=12)]
    eager = LLM(tiny_path, device="cpu", dtype="float32", max_model_len=96, max_num_seqs=2)
    reference = [o.token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    llm = LLM(tiny_path, device="cpu", dtype="float32", max_model_len=96, max_num_seqs=2, enforce_eager=False,
              speculative_config={**spec(2), "draft_vocab_size": draft_vocab})
    assert llm.runtime.speculative_round is not None  # compiled rounds
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == reference


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_compiled_rounds_read_the_draft_script_in_place(tiny_path, greedy_reference, device):
    """Compiled rounds (on a GPU also captured) read the draft script where the engine writes it, after they were
    compiled: through ``LLM`` (rounds chained), a request scripted with its greedy continuation accepts all but at
    most its last round's second draft (past the script), one scripted wrong accepts none, and both outputs are the
    plain greedy run's."""
    llm = LLM(tiny_path, device=device, dtype="float32", max_model_len=MAX_LEN, max_num_seqs=2, enforce_eager=False,
              speculative_config={**spec(2), "scripted_drafts": True})
    assert llm.runtime.speculative_round is not None  # compiled rounds
    for shift, accepted in ((0, (13, 14)), (1, (0, 0))):
        llm.engine.draft_script = scripts(PROMPTS, greedy_reference, shift)
        before, chained = llm.engine.num_accepted_tokens, llm.engine.num_chained_rounds
        out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
        assert out[0].token_ids == greedy_reference[0]
        assert accepted[0] <= llm.engine.num_accepted_tokens - before <= accepted[1]
        assert llm.engine.num_chained_rounds > chained


@pytest.mark.in_background  # ~80 s of compiling on the CPU: tests/background.py balances the two threads with it
def test_compiled_round_results_are_the_host_rows_its_graph_wrote(tiny_path):
    """A compiled round's graph writes its results (num_accepted | tokens | drafts, a row a sequence of its bucket)
    into the round's host buffer, and ``RoundResults.rows()`` reads them there: for 3 sequences in bucket 4 (a
    padding row, left out) in the argmax and the sampling variant, then 2 in bucket 2, the rows are the eager
    round's of the same step (the cat of its device outputs) and the cat of the compiled round's own device
    outputs. The buffer is filled with -1 before each round: the graph wrote the bucket's rows, and no row past it."""
    from compiled_engine.speculative import RoundResults
    from ops.step import SamplingInputs

    k = 2
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[1]]
    eager, compiled = (runtime(tiny_path, k=k, max_num_seqs=4, compile=c) for c in (False, True))
    rounds = compiled.speculative_round
    seqs = {}
    for rt in (eager, compiled):
        seqs[rt] = [rt.add_sequence(p) for p in prompts]
        for seq, token in zip(seqs[rt], rt.prefill(seqs[rt]).argmax(dim=-1).tolist()):
            seq.token_ids.append(token)
    drafts = [[0] * k for _ in prompts]

    def sampled(n: int) -> SamplingInputs:  # seeded sampled rows, k + 1 a sequence
        rows = n * (k + 1)
        return SamplingInputs(torch.full((rows,), 0.9), torch.full((rows,), 30), torch.ones(rows), torch.zeros(rows),
                              torch.arange(rows) + 11, torch.arange(rows))

    for n, sampling in ((3, None), (3, sampled(3)), (2, None)):
        bucket = rounds.policy.bucket_for(n)
        rounds.results.fill_(-1)
        results = {rt: rt.fused_round(seqs[rt][:n], drafts[:n], sampling=sampling) for rt in (eager, compiled)}
        (_, want), (_, got) = results[eager], results[compiled]
        assert isinstance(got, RoundResults) and got.host is not None and want.host is None  # host rows / the cat
        rows = got.rows()
        assert len(rows) == n and rows == want.rows()
        assert rows == torch.cat([got.num_accepted[:, None], got.tokens, got.drafts], dim=1).tolist()
        assert rounds.results[:bucket].ne(-1).all() and rounds.results[bucket:].eq(-1).all()
        for rt, (spec, _) in results.items():
            rt.advance(spec, [r[0] for r in rows], [r[1 : k + 2] for r in rows])
        drafts = [r[k + 2 :] for r in rows]
    assert [s.token_ids for s in seqs[compiled]] == [s.token_ids for s in seqs[eager]]


@given(data=st.data(), k=st.integers(1, 4), block_size=st.sampled_from([1, 4, 16]), max_model_len=st.integers(8, 80),
       bucket_extra=st.integers(0, 3))
@settings(max_examples=60, deadline=None)
def test_compiled_rounds_pack_what_pack_verify_step_packs(data, k, block_size, max_model_len, bucket_extra):
    """A compiled round's host packing (``pack_verify_into``, straight into its staged layout) equals the eager
    path's ``pack_verify_step`` padded to the bucket with the rounds' table width, field by field: input ids,
    positions, KV slots (the null block past a sequence's blocks), context lengths, state slots, block tables."""
    from compiled_engine.sequence import Sequence
    from compiled_engine.speculative import (_packed_layout, pack_sampling_into, pack_verify_into, pack_verify_step,
                                             unpack_sampling_fields, unpack_verify_fields)
    from ops.step import SamplingInputs

    table_width = -(-(max_model_len + k) // block_size)
    seqs, drafts = [], []
    for i in range(data.draw(st.integers(0, 4))):
        computed = data.draw(st.integers(0, max_model_len - 1))
        tokens = data.draw(st.lists(st.integers(0, 999), min_size=computed + 1, max_size=computed + 1))
        # blocks for the computed tokens and the last one, maybe some of the draft positions too (as reserved)
        blocks = -(-(computed + 1 + data.draw(st.integers(0, k))) // block_size)
        table = data.draw(st.lists(st.integers(1, 500), min_size=blocks, max_size=min(blocks, table_width)))
        seqs.append(Sequence(i, tokens, 1, computed, table, state_slot=i + 1))
        drafts.append(data.draw(st.lists(st.integers(0, 999), min_size=k, max_size=k)))
    bucket = len(seqs) + bucket_extra
    if bucket == 0:
        return
    want = pack_verify_step(seqs, drafts, block_size, torch.device("cpu"), bucket, k, table_width)
    layout = _packed_layout(bucket, k, table_width)
    out = np.full(layout.sampled_end, -7, dtype=np.int64)
    assert pack_verify_into(out, seqs, drafts, block_size, bucket, k, table_width) == layout.end
    # The same from the tables kept by slot (CacheManager.block_tables), whose rows a former holder of each slot left
    tables = BlockTables(6, width=1)
    tables.rows([SimpleNamespace(block_table=[9] * 40, state_slot=slot) for slot in range(1, 6)], 40)
    kept = np.full(layout.end, -7, dtype=np.int64)
    assert pack_verify_into(kept, seqs, drafts, block_size, bucket, k, table_width, tables) == layout.end
    assert kept.tolist() == out[: layout.end].tolist()
    # A sampled round's parameters after the step (random values: each field must land where it is read)
    rows, n = bucket * (k + 1), len(seqs) * (k + 1)
    floats = [torch.tensor(data.draw(st.lists(st.floats(0, 2, width=32), min_size=n, max_size=n)), dtype=torch.float32)
              for _ in range(3)]
    ints = [torch.tensor(data.draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n)), dtype=torch.int64)
            for _ in range(3)]
    sampling = SamplingInputs(floats[0], ints[0], floats[1], floats[2], ints[1], ints[2])
    assert pack_sampling_into(out, sampling, n, bucket, k, table_width) == layout.sampled_end == len(out)
    packed = torch.from_numpy(out)
    got = unpack_verify_fields(packed, bucket, k, table_width)  # what the compiled round reads
    fields = (want.input_ids, want.positions, want.slot_mapping, want.block_tables, want.context_lens,
              want.state_slots)
    for field, value in zip(fields, got):
        assert value.dtype == field.dtype and value.tolist() == field.tolist()
    assert want.input_ids.shape[0] == rows and want.block_tables.shape == (bucket, table_width)
    # in ce::sample's order; padding rows greedy (temperature 0, top_k 0, top_p 1, min_p 0, seed and counter 0)
    wanted = (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.seeds, sampling.counters)
    for value, field, pad in zip(unpack_sampling_fields(packed, bucket, k, table_width), wanted, (0, 0, 1, 0, 0, 0)):
        assert value.dtype == field.dtype and value.tolist() == field.tolist() + [pad] * (rows - n)


@given(data=st.data(), k=st.integers(1, 4), block_size=st.sampled_from([1, 4, 16]), bucket_extra=st.integers(0, 3))
@settings(max_examples=60, deadline=None)
def test_successor_fields_are_the_step_the_host_packs_after_advancing(data, k, block_size, bucket_extra):
    """A chained round's step, computed on the device from the round before (``successor_fields``), equals what the
    host packs (``pack_verify_step``, padded to the bucket) once it has read that round back and advanced its
    sequences: each appends its accepted drafts and the target's next token, its computed length moves on, its next
    drafts are the round's; padding rows stay padding. Input ids, positions, KV slots and context lengths, with block
    tables that hold the next round's verified positions (as ``Runtime.can_chain`` requires)."""
    from compiled_engine.sequence import Sequence
    from compiled_engine.speculative import pack_verify_step, successor_fields

    seqs, drafts = [], []
    for i in range(data.draw(st.integers(1, 4))):
        computed = data.draw(st.integers(0, 40))
        tokens = data.draw(st.lists(st.integers(0, 999), min_size=computed + 1, max_size=computed + 1))
        blocks = -(-(computed + 2 * (k + 1) + data.draw(st.integers(0, 2 * k))) // block_size)
        seqs.append(Sequence(i, tokens, 1, computed, list(range(7 * i + 1, 7 * i + 1 + blocks)), state_slot=i + 1))
        drafts.append(data.draw(st.lists(st.integers(0, 999), min_size=k, max_size=k)))
    bucket = len(seqs) + bucket_extra
    width = max(len(s.block_table) for s in seqs)
    step = pack_verify_step(seqs, drafts, block_size, torch.device("cpu"), bucket, k, width)
    accepted = torch.tensor([data.draw(st.integers(0, k)) for _ in range(bucket)])
    tokens = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, 999), min_size=k + 1, max_size=k + 1),
                                             min_size=bucket, max_size=bucket)))
    new_drafts = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, 999), min_size=k, max_size=k),
                                                 min_size=bucket, max_size=bucket)))
    got = successor_fields(step.input_ids, step.positions, step.block_tables, step.state_slots, accepted, tokens,
                           new_drafts, block_size)
    for i, seq in enumerate(seqs):  # the host's side of the round (Runtime.advance)
        a = int(accepted[i])
        seq.token_ids.extend(tokens[i, : a + 1].tolist())
        seq.num_computed_tokens += a + 1
    want = pack_verify_step(seqs, new_drafts[: len(seqs)].tolist(), block_size, torch.device("cpu"), bucket, k, width)
    for value, field in zip(got, (want.input_ids, want.positions, want.slot_mapping, want.context_lens)):
        assert value.dtype == field.dtype and value.tolist() == field.tolist()


def test_chained_rounds_equal_non_speculative_through_stops_and_aborts(tiny_path):
    """Greedy and seeded sampled requests with ``overlap_decode``: rounds chain (launched from the device's results of
    the round before, ahead of its read-back) while the same rows decode, through a stop token inside a round,
    max_tokens ending others at different steps, an abort mid-chain and a request arriving mid-chain; each request's
    tokens are the non-speculative run's (a prefix for the aborted one), and rounds did chain."""
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[4], PROMPTS[1]]
    temperatures = (0.0, 0.0, 0.9, 0.0)  # request 2 samples (seeded: what a decode step draws there)
    reference = LLM(tiny_path, device="cpu", dtype="float32", max_model_len=MAX_LEN, max_num_seqs=4).generate(
        prompts, [SamplingParams(temperature=t, seed=5, top_k=40, max_tokens=40, ignore_eos=True)
                  for t in temperatures], use_tqdm=False)
    stop = reference[1].token_ids[17]  # request 1 stops there (or at its first occurrence)
    params = [SamplingParams(temperature=t, seed=5, top_k=40, max_tokens=m, stop_token_ids=s, ignore_eos=True)
              for t, (m, s) in zip(temperatures, ((40, []), (40, [stop]), (23, []), (31, [])))]
    want = [r.token_ids[: p.max_tokens] for r, p in zip(reference, params)]
    want[1] = want[1][: want[1].index(stop) + 1]
    engine = LLMEngine(runtime(tiny_path, k=2, max_num_seqs=4), overlap_decode=True)
    got, step = {}, 0
    for i in range(3):
        engine.add_request(f"r{i}", prompts[i], params[i])
    while engine.has_unfinished_requests() or step < 12:
        if step == 12:
            engine.add_request("r3", prompts[3], params[3])
        if step == 30:
            engine.abort_request("r0")
        for out in engine.step():
            got[out.request_id] = out.token_ids
        step += 1
    assert engine.num_chained_rounds > 0
    for i in (1, 2, 3):
        assert got[f"r{i}"] == want[i], i
    assert got["r0"] == want[0][: len(got["r0"])]
    assert engine.runtime.caches.num_free_slots == 4  # nothing leaked


def test_a_round_reserves_as_many_chain_rounds_as_fit(tiny_path):
    """``Runtime.fused_round(chain_rounds=n)`` reserves blocks for n more rounds of k + 1 positions where they leave
    ``keep_free`` blocks free, else for n // 4, else for its own draft positions where those fit: the sequence's
    table then covers exactly that many positions (block arithmetic), and rounds may chain only with the room."""
    k, rounds = 2, 32

    def round_with(more: int | None) -> tuple[int, int, int, bool, int]:
        """A round of a fresh sequence with ``more`` blocks to spare past keep_free (None: every free block):
        (computed tokens, table blocks before the round, after it, can_chain, block size)."""
        rt = Runtime.from_pretrained(tiny_path, device="cpu", dtype="float32", max_model_len=MAX_LEN,
                                     max_num_seqs=1, speculative_config=spec(k))
        seq = rt.add_sequence(list(range(1, 21)))
        seq.token_ids.append(int(rt.prefill([seq]).argmax(dim=-1)[0]))
        held, free = len(seq.block_table), rt.caches.num_free_blocks
        spec_, _ = rt.fused_round([seq], [[3, 4]], keep_free=0 if more is None else free - more, chain_rounds=rounds)
        return seq.num_computed_tokens, held, len(seq.block_table), rt.can_chain(spec_), rt.config.block_size

    computed, held, _, _, size = round_with(None)

    def blocks(positions: int) -> int:  # the blocks that hold the first `positions` positions
        return -(-positions // size)

    own = computed + k + 1 + k - 1  # the round's k + 1 verified positions and the k - 1 its drafts reach past them
    full, quarter = own + rounds * (k + 1), own + rounds // 4 * (k + 1)
    assert blocks(full) > blocks(quarter) > blocks(own) >= blocks(computed + k + 1) >= held  # the cases differ
    assert round_with(None)[2:4] == (blocks(full), True)
    assert round_with(blocks(quarter) - held)[2:4] == (blocks(quarter), True)
    assert round_with(blocks(full) - held - 1)[2:4] == (blocks(quarter), True)  # one block short of all 32
    assert round_with(blocks(own) - held)[2] == blocks(own)
    assert round_with(0)[2] == blocks(computed + k + 1)  # the verified positions only (they are not optional)


def test_drafting_rule_times_a_chained_round_from_one_read_to_the_next(tiny_path, monkeypatch):
    """With rounds chained, a round launches while the round before it still runs and is read one step later: the
    rule charges it from the read before to its own read (one round's time in steady state), not from its launch (two).
    The clock here moves only while the host waits for a round's results, one unit a round: every round it records
    after the first costs 1."""
    from compiled_engine.speculative import RoundResults

    clock = [0.0]
    rows = RoundResults.rows

    def waiting_rows(self):  # the host waits one unit for each round's results
        clock[0] += 1.0
        return rows(self)

    class Drafting(DraftingRule):  # drafts whatever it measures, so that every step is a round; keeps every charge
        charges: list[float] = []

        def should_draft(self, rows_: int) -> bool:
            return True

        def record_round(self, rows_: int, seconds: float, drafted_rows: int, accepted_drafts: int) -> None:
            self.charges.append(seconds)
            super().record_round(rows_, seconds, drafted_rows, accepted_drafts)

    monkeypatch.setattr(RoundResults, "rows", waiting_rows)
    rule = Drafting(clock=lambda: clock[0])
    engine = LLMEngine(runtime(tiny_path, k=2), overlap_decode=True, drafting_rule=rule)
    engine.add_request("r0", PROMPTS[0], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    finish_all(engine)
    assert engine.num_chained_rounds >= 10
    assert len(rule.charges) >= engine.num_chained_rounds and set(rule.charges) == {1.0}


@pytest.mark.gpu
def test_chaining_a_round_does_not_wait_for_the_round_before(tiny_path):
    """``Runtime.chain_round`` queues device work only: with the round in flight held back on the device (a sleep
    kernel before it), the host keeps that round's rows and launches the next round and returns while the round is
    still to run. Its kept rows, read after, are the round an eager runtime computes from the same sequence and
    drafts, and the chained round's the eager round after it."""
    def started(rt):
        seq = rt.add_sequence(PROMPTS[0])
        seq.token_ids.append(int(rt.prefill([seq]).argmax(dim=-1)[0]))
        return seq

    def advance(rt, spec_, rows):
        rt.advance(spec_, [r[0] for r in rows], [r[1:4] for r in rows])
        return [r[4:] for r in rows]

    build = functools.partial(Runtime.from_pretrained, tiny_path, device="cuda", dtype="float32",
                              max_model_len=MAX_LEN, max_num_seqs=1, speculative_config=spec(2))
    eager = build(compile=False)
    seq = started(eager)
    want = []
    drafts = [[7, 9]]
    for _ in range(2):
        spec_, results = eager.fused_round([seq], drafts)
        want.append(results.rows())
        drafts = advance(eager, spec_, want[-1])

    compiled = build(compile=True)
    assert compiled.executor.speculative_round.captured
    seq = started(compiled)
    torch.cuda._sleep(2_000_000_000)  # ~1 s of the device's clock ahead of the round
    spec_, results = compiled.fused_round([seq], [[7, 9]], chain_rounds=2)
    round_done = torch.cuda.Event()
    round_done.record()
    assert compiled.can_chain(spec_)
    kept, spec_, chained = compiled.chain_round(spec_, results)
    assert not round_done.query(), "chain_round waited for the round before it"
    assert kept.rows() == want[0]
    advance(compiled, spec_, want[0])
    assert chained.rows() == want[1]


@pytest.mark.gpu
def test_cuda_graph_rounds_equal_eager_on_gpu(tiny_path):
    """On a GPU, in fp32: rounds compiled and captured (the round's own CUDA graphs per bucket and variant) give the
    non-speculative eager output, greedy with the MTP head's drafts and with oracle drafts (long accepted runs),
    seeded sampled, and greedy with rounds chained (``overlap_decode``: each launched from the device's results of
    the round before, ahead of its read-back); every bucket has its graphs. One compile serves every run."""
    prompts = PROMPTS
    ids = [f"r{i}" for i in range(len(prompts))]

    stats = {}

    def run(rt, override=None, params=SamplingParams(temperature=0, max_tokens=24), overlap=False
            ) -> list[list[int]]:
        engine = LLMEngine(rt, draft_override=override, overlap_decode=overlap)
        for request_id, prompt in zip(ids, prompts):
            engine.add_request(request_id, prompt, params)
        replays = []  # the compiled rounds' replays (a round past their buckets would run eagerly)
        run_round = rt.executor.run_round
        rt.executor.run_round = lambda *args: replays.append(args) or run_round(*args)
        try:
            done, _ = finish_all(engine)
        finally:
            del rt.executor.run_round
        if overlap:
            assert engine.num_chained_rounds > 0
        stats.update(replays=len(replays), drafted=engine.num_draft_tokens, accepted=engine.num_accepted_tokens)
        return [done[i].token_ids for i in ids]

    def build(**knobs):  # 2 buckets: compile time
        return Runtime.from_pretrained(tiny_path, device="cuda", dtype="float32", max_model_len=MAX_LEN,
                                       max_num_seqs=2, **knobs)

    eager = build(compile=False)
    reference = run(eager)
    sampled = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=3, max_tokens=24)
    sampled_reference = run(eager, params=sampled)
    compiled = build(compile=True, speculative_config=spec(3))
    assert run(compiled) == reference
    assert stats["replays"] > 0
    drafts = oracle(dict(zip(ids, reference)), {i: len(p) for i, p in zip(ids, prompts)}, 0.7, 257)
    assert run(compiled, drafts) == reference
    # each draft right with probability 0.7, a round's drafts accepted up to the first wrong one: ~half of them
    assert stats["replays"] > 0 and stats["accepted"] >= 0.3 * stats["drafted"] > 0, stats
    assert run(compiled, params=sampled) == sampled_reference  # the sampling variant's graphs
    assert stats["replays"] > 0
    assert run(compiled, overlap=True) == reference  # chained rounds: the graphs that take their step on the device
    assert run(compiled, params=sampled, overlap=True) == sampled_reference
    rounds = compiled.speculative_round
    assert rounds.captured_buckets == rounds.policy.sizes  # every bucket's round is a CUDA graph

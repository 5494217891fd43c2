"""Sparse-MoE models (Qwen3-Next with experts, Qwen3.5-MoE text and VL layouts) against HF transformers, fp32 on CPU.

The tiny models (tests/hf_models.py ``MOE_BUILDERS``) have 8 experts and a shared expert: Qwen3-Next top-2 without
renormalisation and a dense layer among the sparse ones (``mlp_only_layers``), saved per expert; Qwen3.5-MoE top-3
text-only, saved per expert; Qwen3.5-MoE in the released VL layout with the fused 3-D expert tensors. HF runs its
reference loop over the experts (``experts_implementation="eager"``).

* which layers are sparse: read from HF's own modules;
* greedy tokens solo and batched, and first-step logits, equal HF's;
* both expert layouts load into the same parameters; a missing expert tensor is named;
* an engine stream that preempts keeps HF's greedy output;
* the compiled decode step (Inductor on CPU) equals eager;
* tensor parallel (gloo, 2 ranks: experts cut by their intermediate dimension) equals HF.
"""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_engine import LLM, SamplingParams
from compiled_engine.config import ModelConfig
from compiled_engine.loader import CheckpointError, load_model
from tests import hf_models
from tests.conftest import MOE_VARIANTS
from tests.test_engine import PREEMPTING, PreemptionProbe, assert_clean, check_invariants, drain, make_llm
from tests.test_loader import copy_checkpoint, edit_config
from tests.test_parity import assert_logits_accurate

PROMPT_LENGTHS = (1, 5, 64, 100)
NEW_TOKENS = 10
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)


def prompts_for(vocab: int, lengths=PROMPT_LENGTHS, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def expectations(build_hf_model, load_hf_model):
    """Per variant: (path, prompts, HF greedy tokens, HF fp32 and fp64 last-position logits)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            model = load_hf_model(name)
            prompts = prompts_for(model.config.get_text_config().vocab_size)
            greedy = [hf_models.hf_greedy(model, p, NEW_TOKENS) for p in prompts]
            logits32 = torch.stack([hf_models.hf_logits(model, p)[-1] for p in prompts])
            model64 = hf_models.load_hf(build_hf_model(name)).double()
            logits64 = torch.stack([hf_models.hf_logits(model64, p)[-1] for p in prompts]).double()
            cache[name] = (build_hf_model(name), prompts, greedy, logits32, logits64)
        return cache[name]

    return get


@pytest.mark.parametrize("variant", MOE_VARIANTS)
def test_sparse_layers_are_hfs(variant, build_hf_model, load_hf_model):
    """Our config's sparse layers are the layers whose HF module is a SparseMoeBlock; the other fields as HF's."""
    model = load_hf_model(variant)
    text = model.config.get_text_config()
    layers = model.model.language_model.layers if hasattr(model.model, "language_model") else model.model.layers
    hf_sparse = tuple(i for i, layer in enumerate(layers) if type(layer.mlp).__name__.endswith("SparseMoeBlock"))
    ours = ModelConfig.from_pretrained(build_hf_model(variant))
    assert ours.moe_layers == hf_sparse and hf_sparse
    assert (ours.num_experts, ours.num_experts_per_tok) == (text.num_experts, text.num_experts_per_tok)
    assert ours.moe_intermediate_size == text.moe_intermediate_size
    assert ours.shared_expert_intermediate_size == text.shared_expert_intermediate_size
    assert ours.norm_topk_prob == getattr(text, "norm_topk_prob", True)
    if variant == "qwen3_next_moe":
        assert len(hf_sparse) < len(layers) and not ours.norm_topk_prob  # a dense layer; no renormalisation


@pytest.mark.parametrize("variant", MOE_VARIANTS)
def test_greedy_and_logits_match_hf(variant, expectations):
    path, prompts, expected, hf32, hf64 = expectations(variant)
    llm = LLM(str(path), device="cpu", dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=8)
    batched = llm.generate(prompts, GREEDY, use_tqdm=False)
    for prompt, out, want in zip(prompts, batched, expected):
        assert out.token_ids == want, f"batched, prompt length {len(prompt)}"
    for prompt, want in zip(prompts[:2], expected[:2]):
        assert llm.generate([prompt], GREEDY, use_tqdm=False)[0].token_ids == want, f"solo, length {len(prompt)}"
    rt = llm.runtime
    logits = rt.prefill([rt.add_sequence(p) for p in prompts])
    assert_logits_accurate(logits, hf32, hf64, "batched prefill")


def _parameters(folder):
    config = ModelConfig.from_pretrained(folder)
    model, _ = load_model(str(folder), config, torch.device("cpu"), torch.float32)
    return {name: p for name, p in model.named_parameters()}


def test_per_expert_and_fused_layouts_load_the_same_parameters(build_hf_model, tmp_path):
    per_expert = build_hf_model("qwen3_5_moe_text")
    fused = copy_checkpoint(per_expert, tmp_path / "fused")
    tensors = load_file(fused / "model.safetensors")
    for layer in range(hf_models.QWEN3_5_MOE_LAYERS):
        prefix = f"model.layers.{layer}.mlp.experts"
        experts = range(hf_models.NUM_EXPERTS)
        tensors[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([tensors.pop(f"{prefix}.{e}.gate_proj.weight"), tensors.pop(f"{prefix}.{e}.up_proj.weight")])
             for e in experts])
        tensors[f"{prefix}.down_proj"] = torch.stack([tensors.pop(f"{prefix}.{e}.down_proj.weight") for e in experts])
    save_file(tensors, fused / "model.safetensors", metadata={"format": "pt"})
    a, b = _parameters(per_expert), _parameters(fused)
    assert a.keys() == b.keys() and any("experts_gate_up" in k for k in a)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # and the parameter holds HF's expert weights: expert 5's up rows of layer 2
    gate_up = a["layers.2.mlp.experts_gate_up"].view(hf_models.NUM_EXPERTS, 2 * hf_models.MOE_INTERMEDIATE, -1)
    assert torch.equal(gate_up[5, hf_models.MOE_INTERMEDIATE:], tensors["model.layers.2.mlp.experts.gate_up_proj"][
        5, hf_models.MOE_INTERMEDIATE:])


@pytest.mark.parametrize("drop, named", [
    ("model.layers.0.mlp.experts.6.up_proj.weight", r"layers\.0\.mlp\.experts\.6\.up_proj\.weight"),
    ("model.layers.2.mlp.shared_expert_gate.weight", r"layers\.2\.mlp\.shared_expert_gate\.weight"),
    ("model.layers.3.mlp.experts.1.down_proj.weight", r"layers\.3\.mlp\.experts\.1\.down_proj\.weight"),
])
def test_missing_expert_tensor_is_named(build_hf_model, tmp_path, drop, named):
    folder = copy_checkpoint(build_hf_model("qwen3_next_moe"), tmp_path / "ckpt")
    tensors = load_file(folder / "model.safetensors")
    del tensors[drop]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=named):
        _parameters(folder)


def test_a_sparse_config_over_a_dense_checkpoint_is_refused(build_hf_model, tmp_path):
    """A config that makes layers sparse while the checkpoint holds dense MLPs: the dense tensor is named."""
    folder = copy_checkpoint(build_hf_model("qwen3_next_dense"), tmp_path / "ckpt")
    edit_config(folder, lambda c: c.update(num_experts=8, num_experts_per_tok=2, mlp_only_layers=[],
                                           moe_intermediate_size=16, shared_expert_intermediate_size=16))
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model\.layers\.\d+\.mlp\.(gate|up|down)_proj"):
        _parameters(folder)


def test_engine_stream_with_preemption_keeps_hf_greedy(build_hf_model, load_hf_model):
    path = build_hf_model("qwen3_next_moe")
    llm = make_llm(path, **PREEMPTING)
    engine = llm.engine
    probe = PreemptionProbe(engine)
    vocab = hf_models.QWEN3_NEXT_MOE_VOCAB
    prompts = {f"r{i}": p for i, p in enumerate(prompts_for(vocab, (30, 26, 22, 35, 9), seed=4))}
    for rid, tokens in prompts.items():
        engine.add_request(rid, tokens, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    finals = drain(engine, on_step=lambda: check_invariants(engine))
    assert_clean(engine)
    assert engine.scheduler.num_preemptions == len(probe.victims) >= 2
    model = load_hf_model("qwen3_next_moe")
    for rid, tokens in prompts.items():
        assert finals[rid].token_ids == hf_models.hf_greedy(model, tokens, 20), rid


def test_compiled_decode_equals_hf(expectations):
    """The decode step with the MoE ops compiles with fullgraph=True (no graph break, no data-dependent shape) and
    gives HF's greedy tokens, batched."""
    from graphs import DecodeGraphRunner

    path, prompts, expected, _, _ = expectations("qwen3_5_moe_text")
    compiled_llm = LLM(str(path), device="cpu", dtype="float32", enforce_eager=False, max_model_len=256,
                       max_num_seqs=2)
    assert isinstance(compiled_llm.runtime.decode_fn, DecodeGraphRunner) and compiled_llm.runtime.decode_fn.fullgraph
    assert [o.token_ids for o in compiled_llm.generate(prompts, GREEDY, use_tqdm=False)] == expected


@pytest.mark.parametrize("variant", ["qwen3_5_moe_conditional", "qwen3_next_moe"])  # fused and per-expert tensors
def test_tp2_greedy_equals_hf(variant, expectations):
    path, prompts, expected, _, _ = expectations(variant)
    with LLM(str(path), device="cpu", dtype="float32", enforce_eager=True, max_model_len=256,
             tensor_parallel_size=2) as llm:
        moe = llm.runtime.model.layers[0].mlp
        assert moe.expert_intermediate == hf_models.MOE_INTERMEDIATE // 2  # this rank holds half of every expert
        assert [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)] == expected


@pytest.mark.gpu
def test_cuda_graph_decode_matches_hf(expectations):
    """On a GPU, compiled and captured (the Triton route and the experts' GEMV, ``MOE_GEMV_MAX_TOKENS``, inside the
    decode graph: at 2 sequences the align and grouped-GEMM kernels run in the prompt steps only), fp32: HF's greedy
    tokens, batched."""
    from graphs import DecodeGraphRunner

    path, prompts, expected, _, _ = expectations("qwen3_5_moe_text")
    llm = LLM(str(path), device="cuda", dtype="float32", max_model_len=256, max_num_seqs=2)  # 2 buckets: compile time
    runner = llm.runtime.decode_fn
    assert isinstance(runner, DecodeGraphRunner) and runner.fullgraph
    assert [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)] == expected

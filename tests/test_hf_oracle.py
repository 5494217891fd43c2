"""The oracle itself: the tiny HF models are well formed, non-degenerate, and HF's two code paths agree.

HF ``generate`` runs with a cache: chunked gated-delta-rule prefill, then ``causal_conv1d_update`` and the recurrent
delta rule one token at a time. ``hf_greedy_no_cache`` re-runs the whole sequence each step without any cache
(chunked path only). Their agreement (tokens and logits) is what makes HF trustworthy as the oracle here.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from tests import hf_models
from tests.conftest import HF_VARIANTS


def _checkpoint_tensors(folder) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            for key in fh.keys():
                tensors[key] = fh.get_tensor(key)
    return tensors


def _text_config(model):
    return model.config.get_text_config()


@pytest.mark.parametrize("name", HF_VARIANTS)
def test_checkpoint_loads_exactly(name, build_hf_model, load_hf_model):
    """HF loads every saved tensor unchanged and initialises nothing at random (else the oracle would drift)."""
    folder = build_hf_model(name)
    model = load_hf_model(name)
    saved = _checkpoint_tensors(folder)
    state = model.state_dict()
    for key, tensor in saved.items():
        if key.startswith("mtp."):
            continue
        assert key in state, f"{key} in the checkpoint but not in the model"
        assert state[key].dtype == torch.float32
        assert torch.equal(state[key], tensor), key
    tied = _text_config(model).tie_word_embeddings
    missing = set(state) - set(saved)
    assert missing == ({"lm_head.weight"} if tied else set()), missing
    if tied:
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_conditional_checkpoint_layout(qwen3_5_conditional_path):
    """The VL layout: nested text_config, language_model/visual/mtp prefixes, sharded with an index."""
    config = json.loads((qwen3_5_conditional_path / "config.json").read_text())
    assert config["model_type"] == "qwen3_5" and config["text_config"]["model_type"] == "qwen3_5_text"
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    index = json.loads((qwen3_5_conditional_path / "model.safetensors.index.json").read_text())
    keys = set(index["weight_map"])
    assert keys == set(_checkpoint_tensors(qwen3_5_conditional_path))
    assert any(k.startswith("model.language_model.layers.") for k in keys)
    assert "model.language_model.embed_tokens.weight" in keys
    assert any(k.startswith("model.visual.") for k in keys)
    assert set(hf_models.MTP_TENSORS) <= keys
    assert not any(k.startswith("model.layers.") or k == "lm_head.weight" for k in keys)
    assert len(set(index["weight_map"].values())) > 2  # really sharded


@pytest.mark.parametrize("name", HF_VARIANTS)
def test_weights_are_redrawn(name, load_hf_model):
    """Every block matters: zero-centred norms are not 0, gated norms not 1, A_log/dt_bias non-trivial, shapes."""
    model = load_hf_model(name)
    cfg = _text_config(model)
    assert cfg.linear_num_value_heads == 2 * cfg.linear_num_key_heads
    assert cfg.linear_key_head_dim != cfg.linear_value_head_dim
    assert cfg.num_attention_heads > cfg.num_key_value_heads  # GQA
    assert {"linear_attention", "full_attention"} == set(cfg.layer_types)
    params = {k: v for k, v in model.named_parameters() if ".visual." not in k}
    zero_centred = [k for k in params if k.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight"))]
    zero_centred += [k for k in params if k.endswith("model.norm.weight") or k.endswith("language_model.norm.weight")]
    gated = [k for k in params if k.endswith("linear_attn.norm.weight")]
    assert len(zero_centred) >= 2 * cfg.num_hidden_layers + 1
    assert len(gated) == cfg.layer_types.count("linear_attention")
    for k in zero_centred:
        assert params[k].abs().mean() > 0.03 and params[k].mean().abs() < 0.1, k
    for k in gated:
        assert (params[k] - 1).abs().mean() > 0.03 and (params[k].mean() - 1).abs() < 0.1, k
    for k in [k for k in params if k.endswith(("A_log", "dt_bias"))]:
        assert params[k].std() > 0.05, k
    emb = model.get_input_embeddings().weight
    assert 0.9 < emb.std() < 1.1


def _distinct_prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [
        [5],
        torch.randint(1, vocab, (9,), generator=g).tolist(),
        torch.randint(1, vocab, (70,), generator=g).tolist(),  # crosses HF's 64-token chunk
    ]


@pytest.mark.parametrize("name", HF_VARIANTS)
def test_generate_equals_no_cache_argmax(name, load_hf_model):
    """generate() (cache: chunked prefill, recurrent decode) ≡ argmax over full no-cache forwards: tokens, logits."""
    model = load_hf_model(name)
    new = 6
    for prompt in _distinct_prompts(_text_config(model).vocab_size):
        batch = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(
                input_ids=batch, attention_mask=torch.ones_like(batch), do_sample=False, max_new_tokens=new,
                min_new_tokens=new, eos_token_id=None, pad_token_id=0, use_cache=True,
                return_dict_in_generate=True, output_logits=True,
            )
        tokens = out.sequences[0, len(prompt):].tolist()
        assert tokens == hf_models.hf_greedy_no_cache(model, prompt, new)
        full = hf_models.hf_logits(model, prompt + tokens)  # teacher-forced, no cache
        cached = torch.stack([step[0] for step in out.logits])  # [new, vocab]
        # HF's two fp32 paths differ by up to ~2e-5 x the largest |logit| (6.7e-4 on the tied 8-layer model, whose
        # logits reach ~30): engine-vs-HF logit tolerances must scale with the logits too.
        expected = full[len(prompt) - 1 : -1]
        torch.testing.assert_close(cached, expected, atol=5e-5 * expected.abs().max().item() + 1e-5, rtol=0)


@pytest.mark.parametrize(
    "name, module",
    [("qwen3_5_text_untied", "qwen3_5.modeling_qwen3_5"), ("qwen3_next_dense", "qwen3_next.modeling_qwen3_next")],
)
def test_generate_uses_cache_and_recurrent_decode(name, module, load_hf_model, monkeypatch):
    """Which HF paths the oracle runs: generate() = chunked prefill once, then per-token conv update + recurrent
    delta rule (cache); hf_logits = chunked path only (no cache). FLA is hidden: the torch fallbacks run."""
    import importlib

    mod = importlib.import_module(f"transformers.models.{module}")
    calls: list[str] = []
    for fn in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
               "causal_conv1d_update"):
        original = getattr(mod, fn)
        monkeypatch.setattr(mod, fn, lambda *a, _f=original, _n=fn, **k: calls.append(_n) or _f(*a, **k))
    model = load_hf_model(name)
    cfg = _text_config(model)
    linear = cfg.layer_types.count("linear_attention")
    hf_models.hf_greedy(model, [1, 2, 3], 3)  # 1 prefill + 2 decode steps
    assert calls.count("torch_chunk_gated_delta_rule") == linear and calls.count("causal_conv1d_fn") == linear
    assert calls.count("torch_recurrent_gated_delta_rule") == 2 * linear
    assert calls.count("causal_conv1d_update") == 2 * linear
    calls.clear()
    hf_models.hf_logits(model, [1, 2, 3])
    assert sorted(calls) == sorted(["torch_chunk_gated_delta_rule", "causal_conv1d_fn"] * linear)


@pytest.mark.parametrize("name", HF_VARIANTS)
def test_oracle_is_not_degenerate(name, load_hf_model):
    """Different prompts give different continuations; logits have spread; the model does not echo its input."""
    model = load_hf_model(name)
    vocab = _text_config(model).vocab_size
    prompts = _distinct_prompts(vocab)
    continuations = [tuple(hf_models.hf_greedy(model, p, 8)) for p in prompts]
    assert len(set(continuations)) == len(continuations)
    assert all(len(set(c)) >= 4 for c in continuations), continuations
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, vocab, (4, 40), generator=g)
    logits = hf_models.hf_logits(model, ids)
    assert logits.std(-1).min() > 0.5
    echo = (logits.argmax(-1) == ids).float().mean()
    assert echo < 0.2, f"predicts its own input token at {echo:.0%} of positions"
    assert logits.argmax(-1).unique().numel() > ids.numel() // 2


@pytest.mark.parametrize("name", ["qwen3_5_text_tied", "qwen3_next_dense"])
def test_every_block_matters(name, build_hf_model):
    """Silencing any one mixer or MLP (zeroing the projection that writes the residual) moves the logits."""
    model = hf_models.load_hf(build_hf_model(name))  # private copy: modified below
    cfg = _text_config(model)
    ids = torch.randint(1, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(5))
    reference = hf_models.hf_logits(model, ids)
    layers = model.model.layers
    for i, layer in enumerate(layers):
        mixer = layer.linear_attn.out_proj if cfg.layer_types[i] == "linear_attention" else layer.self_attn.o_proj
        for proj in (mixer, layer.mlp.down_proj):
            saved = proj.weight.detach().clone()
            with torch.no_grad():
                proj.weight.zero_()
            moved = (hf_models.hf_logits(model, ids) - reference).abs().max()
            with torch.no_grad():
                proj.weight.copy_(saved)
            assert moved > 0.1, f"layer {i} {cfg.layer_types[i]}: silencing it moves logits only {moved:.3g}"


def test_long_range_dependence(load_hf_model):
    """Changing the first token changes the last position's logits (state carries over ~100 tokens)."""
    model = load_hf_model("qwen3_5_text_untied")
    ids = torch.randint(1, 300, (100,), generator=torch.Generator().manual_seed(11))
    other = ids.clone()
    other[0] = (other[0] + 1) % 300
    moved = (hf_models.hf_logits(model, ids)[-1] - hf_models.hf_logits(model, other)[-1]).abs().max()
    assert moved > 1e-3


@pytest.mark.parametrize("module", hf_models._MODELING_MODULES)
def test_hf_binds_its_torch_kernels_not_fla(module):
    """transformers must not bind FLA's (or causal_conv1d's) GPU kernels: the oracle runs on the CPU."""
    bound = hf_models.bound_kernels(module)
    assert set(bound) == set(hf_models._KERNEL_FUNCTIONS)
    assert all(mod == module for mod in bound.values()), bound


def test_hide_fla_puts_fla_back(monkeypatch):
    """FLA is hidden only while transformers imports its models: afterwards ``sys.modules`` holds what it held
    before, so our own CUDA ops can still import FLA. (Checked with a stand-in module: other code in the session,
    e.g. bench/common.py, may hide FLA for good.)"""
    import sys
    import types

    stand_in = types.ModuleType("fla")
    monkeypatch.setitem(sys.modules, "fla", stand_in)
    monkeypatch.delitem(sys.modules, "causal_conv1d", raising=False)
    hf_models.hide_fla()  # models already imported with torch kernels: only hides and restores
    assert sys.modules["fla"] is stand_in
    assert "causal_conv1d" not in sys.modules

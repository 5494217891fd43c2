"""LLM end to end on CPU along the paths users take: compiled decode, and the recurrent-state pool's dtype."""

from __future__ import annotations

import json
import random

import pytest
import torch

from compiled_engine import LLM, Runtime, SamplingParams
from graphs import DecodeGraphRunner
from tests import hf_models

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def test_compiled_decode_through_llm_generate_matches_hf(build_hf_model, load_hf_model, monkeypatch):
    """enforce_eager=False on CPU: LLM -> engine -> scheduler -> DecodeGraphRunner (Inductor C++) == HF greedy; the
    steps where the same sequences decode on take their input ids from where the graph left its greedy tokens."""
    name = "qwen3_next_dense"
    model = load_hf_model(name)
    rng = random.Random(5)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(n)] for n in (1, 9, 66, 30, 5)]
    llm = LLM(str(build_hf_model(name)), device="cpu", dtype="float32", enforce_eager=False,
              max_model_len=128, max_num_seqs=4)  # 5 prompts over 4 lanes: a later join, buckets 1, 2, 4
    runner = llm.runtime.decode_fn
    assert isinstance(runner, DecodeGraphRunner)
    in_place, fill = [], runner.static.fill

    def watched_fill(step):
        in_place.append(step.input_ids.data_ptr() == runner.static.input_ids.data_ptr())
        return fill(step)

    monkeypatch.setattr(runner.static, "fill", watched_fill)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == [hf_models.hf_greedy(model, p, GREEDY.max_tokens) for p in prompts]
    assert any(in_place) and not all(in_place), in_place  # in place in the steady state, copied after a join


def test_bf16_recurrent_state_pool_stays_close_to_fp32(qwen3_5_text_untied_path):
    """state_dtype=bfloat16 halves the pool; teacher-forced logits stay within bf16 rounding of the fp32 pool."""
    rng = random.Random(6)
    tokens = [rng.randrange(320) for _ in range(120)]
    logits = {}
    for state_dtype in (torch.float32, torch.bfloat16):
        rt = Runtime.from_pretrained(str(qwen3_5_text_untied_path), device="cpu", dtype="float32",
                                     max_model_len=256, state_dtype=state_dtype)
        layer = next(l.mixer for l in rt.model.layers if l.layer_type == "linear_attention")
        assert layer.recurrent_state.dtype == state_dtype
        seq = rt.add_sequence(tokens[:70])
        rows = [rt.prefill([seq], all_logits=True)]
        for token in tokens[70:]:
            seq.token_ids.append(token)
            rows.append(rt.decode_step([seq]))
        logits[state_dtype] = torch.cat(rows)
    reference, low = logits[torch.float32], logits[torch.bfloat16]
    relative = ((low - reference).norm() / reference.norm()).item()
    assert 0 < relative < 2e-2  # not identical (the pool really is bf16), but within bf16 rounding


def _with_config_field(src, dst, **fields):
    """A copy of the checkpoint folder ``src`` (its other files linked) whose config.json has ``fields`` set."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f)
    (dst / "config.json").write_text(json.dumps({**json.loads((src / "config.json").read_text()), **fields}))
    return dst


@pytest.mark.parametrize("asked, pool", [("bfloat16", torch.bfloat16), ("float32", torch.float32),
                                         ("float16", torch.float32)])
def test_the_state_pool_defaults_to_the_checkpoints_mamba_ssm_dtype(qwen3_5_text_untied_path, tmp_path, asked, pool):
    """config.json's mamba_ssm_dtype sets the recurrent state pool by default (float16, which the kernels do not take,
    as float32); state_dtype= overrides it."""
    path = _with_config_field(qwen3_5_text_untied_path, tmp_path / "checkpoint", mamba_ssm_dtype=asked)
    for knob, expected in (({}, pool), ({"state_dtype": torch.float32}, torch.float32),
                           ({"state_dtype": torch.bfloat16}, torch.bfloat16)):
        rt = Runtime.from_pretrained(str(path), device="cpu", dtype="float32", max_model_len=64, max_num_seqs=2,
                                     **knob)
        pools = {layer.mixer.recurrent_state.dtype for layer in rt.model.layers
                 if layer.layer_type == "linear_attention"}
        assert pools == {expected} and rt.config.state_dtype == expected, (asked, knob, pools)


def test_a_mamba_ssm_dtype_the_runtime_does_not_know_is_named(qwen3_5_text_untied_path, tmp_path):
    path = _with_config_field(qwen3_5_text_untied_path, tmp_path / "checkpoint", mamba_ssm_dtype="int8")
    with pytest.raises(ValueError, match="mamba_ssm_dtype.*int8"):
        Runtime.from_pretrained(str(path), device="cpu", dtype="float32", max_model_len=64)


def test_a_model_without_attention_layers(tmp_path):
    """Only linear layers, no KV cache at all: still HF's greedy tokens."""
    import transformers

    config = hf_models.qwen3_5_text_config(tied=False)
    config.num_hidden_layers = 3
    config.layer_types = ["linear_attention"] * 3
    path = hf_models._build(transformers.Qwen3_5ForCausalLM, config, tmp_path / "linear_only", hf_models.SEED)
    model = hf_models.load_hf(path)
    prompts = [[3, 1, 4, 1, 5], list(range(40))]
    llm = LLM(str(path), device="cpu", dtype="float32", max_model_len=256)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    # HF's cached generate() cannot run a cache without attention layers; its no-cache argmax loop is the oracle
    expected = [hf_models.hf_greedy_no_cache(model, p, GREEDY.max_tokens) for p in prompts]
    assert [o.token_ids for o in outputs] == expected

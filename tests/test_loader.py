"""Config parsing and checkpoint loading: layouts, skipped tensors, tying, and clear errors naming the tensor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_engine.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from compiled_engine.loader import CheckpointError, load_model
from compiled_engine.runtime import Runtime


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rewrite_weights(folder: Path, edit) -> None:
    file = folder / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def edit_config(folder: Path, edit) -> None:
    raw = json.loads((folder / "config.json").read_text())
    edit(raw)
    (folder / "config.json").write_text(json.dumps(raw))


def load(folder: Path, dtype=torch.float32):
    config = ModelConfig.from_pretrained(folder)
    return load_model(str(folder), config, torch.device("cpu"), dtype)


def test_conditional_layout_skips_visual_and_keeps_mtp_reachable(qwen3_5_conditional_path):
    config = ModelConfig.from_pretrained(qwen3_5_conditional_path)
    assert config.model_type == "qwen3_5"
    model, report = load(qwen3_5_conditional_path)
    assert report.skipped_visual and all(n.startswith("model.visual.") for n in report.skipped_visual)
    assert report.mtp_tensors and all(n.startswith("mtp.") for n in report.mtp_tensors)
    assert all(Path(f).is_file() for f in report.mtp_tensors.values())
    assert report.tied_lm_head
    assert model.lm_head.data_ptr() == model.embed_tokens.data_ptr()  # one tensor in memory, not a copy


def test_untied_checkpoint_has_its_own_lm_head(qwen3_5_text_untied_path):
    model, report = load(qwen3_5_text_untied_path)
    assert not report.tied_lm_head
    saved = load_file(qwen3_5_text_untied_path / "model.safetensors")
    assert torch.equal(model.lm_head, saved["lm_head.weight"])
    assert model.lm_head.data_ptr() != model.embed_tokens.data_ptr()


def test_fused_projections_hold_the_checkpoint_rows(qwen3_5_text_untied_path):
    model, _ = load(qwen3_5_text_untied_path)
    saved = load_file(qwen3_5_text_untied_path / "model.safetensors")
    c = model.config
    layer = model.layers[c.linear_attention_layers[0]].linear_attn
    prefix = f"model.layers.{c.linear_attention_layers[0]}.linear_attn."
    expected = torch.cat([saved[prefix + f"in_proj_{p}.weight"] for p in ("qkv", "z", "b", "a")])
    assert torch.equal(layer.in_proj, expected)
    attn = model.layers[c.full_attention_layers[0]].self_attn
    prefix = f"model.layers.{c.full_attention_layers[0]}.self_attn."
    expected = torch.cat([saved[prefix + f"{p}_proj.weight"] for p in ("q", "k", "v")])
    assert torch.equal(attn.qkv_proj, expected)


def test_loads_straight_to_the_target_dtype(qwen3_5_text_untied_path):
    model, _ = load(qwen3_5_text_untied_path, dtype=torch.bfloat16)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert all(d == torch.float32 for n, d in dtypes.items() if n.endswith(("A_log", "dt_bias")))
    assert all(d == torch.bfloat16 for n, d in dtypes.items() if not n.endswith(("A_log", "dt_bias")))


def test_missing_tensor_is_named(qwen3_5_text_untied_path, tmp_path):
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "ckpt")
    rewrite_weights(folder, lambda t: t.pop("model.layers.0.linear_attn.in_proj_z.weight"))
    with pytest.raises(CheckpointError, match=r"layers\.0\.linear_attn\.in_proj"):
        load(folder)


def test_unexpected_tensor_is_named(qwen3_5_text_untied_path, tmp_path):
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "ckpt")
    rewrite_weights(folder, lambda t: t.__setitem__("model.layers.0.mlp.gate_proj_extra.weight", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.gate_proj_extra\.weight"):
        load(folder)


def test_substring_lookalike_is_not_mapped(qwen3_5_text_untied_path, tmp_path):
    """Names are matched by whole dotted segments: 'my_model.norm.weight' is not 'model.norm.weight'."""
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "ckpt")
    rewrite_weights(folder, lambda t: t.__setitem__("my_model.norm.weight", torch.zeros(4)))
    with pytest.raises(CheckpointError, match=r"my_model\.norm\.weight"):
        load(folder)


def test_misshaped_tensor_is_named(qwen3_5_text_untied_path, tmp_path):
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "ckpt")
    name = "model.layers.3.self_attn.k_proj.weight"

    def shrink(t):
        t[name] = t[name][:-1].clone()

    rewrite_weights(folder, shrink)
    with pytest.raises(CheckpointError, match=r"model\.layers\.3\.self_attn\.k_proj\.weight.*shape"):
        load(folder)


def test_unknown_model_type_is_rejected(qwen3_5_text_untied_path, tmp_path):
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "ckpt")
    edit_config(folder, lambda c: c.__setitem__("model_type", "llama"))
    with pytest.raises(ValueError, match="unsupported model_type 'llama'"):
        Runtime.from_pretrained(str(folder), device="cpu")


def test_sparse_moe_qwen3_next_is_not_implemented(qwen3_next_dense_path, tmp_path):
    folder = copy_checkpoint(qwen3_next_dense_path, tmp_path / "ckpt")
    edit_config(folder, lambda c: c.update(num_experts=8, mlp_only_layers=[], decoder_sparse_step=1))
    with pytest.raises(NotImplementedError, match="sparse-MoE"):
        Runtime.from_pretrained(str(folder), device="cpu")


def test_missing_checkpoint_files_are_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        Runtime.from_pretrained(str(tmp_path), device="cpu")


def test_layer_types_and_rope_from_either_place():
    base = dict(
        model_type="qwen3_5_text", vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=8,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=4, linear_value_head_dim=4,
    )
    by_interval = ModelConfig.from_dict({**base, "full_attention_interval": 4, "rope_theta": 5.0})
    assert by_interval.full_attention_layers == [3, 7]
    assert by_interval.rope_theta == 5.0 and by_interval.partial_rotary_factor == 0.25
    types = [LINEAR_ATTENTION, FULL_ATTENTION] * 4
    explicit = ModelConfig.from_dict(
        {**base, "layer_types": types, "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.5}}
    )
    assert explicit.full_attention_layers == [1, 3, 5, 7]
    assert explicit.rope_theta == 1e7 and explicit.rotary_dim == 4
    nested = ModelConfig.from_dict({"model_type": "qwen3_5", "text_config": {**base, "model_type": "qwen3_5_text"}})
    assert nested.model_type == "qwen3_5" and nested.num_hidden_layers == 8
    with pytest.raises(ValueError, match="lacks 'hidden_size'"):
        ModelConfig.from_dict({k: v for k, v in base.items() if k != "hidden_size"})


def test_a_tensor_parallel_rank_reads_exactly_its_slices(tmp_path):
    """Slice-by-slice reads (no full tensor) equal cutting the full tensor into head-major sections."""
    from safetensors import safe_open

    from compiled_engine.distributed import TensorParallel, shard_sections
    from compiled_engine.loader import Placement, _read

    full = torch.randn(12, 6)
    save_file({"w": full}, tmp_path / "s.safetensors")
    with safe_open(tmp_path / "s.safetensors", framework="pt") as f:
        for rank in range(2):
            tp = TensorParallel(rank, 2)
            for placement in (Placement("x", shard=(0, [4, 4, 4])), Placement("x", shard=(1, [2, 4]))):
                dim, sections = placement.shard
                assert torch.equal(_read(f, "w", placement, tp), shard_sections(full, sections, dim, tp))
        with pytest.raises(CheckpointError, match="expected 10 along dim 0"):
            _read(f, "w", Placement("x", shard=(0, [5, 5])), TensorParallel(0, 2))

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
    # the values: the checkpoint's fp32 tensors rounded once to bf16 (fp32 kept for the gates' parameters)
    saved = load_file(qwen3_5_text_untied_path / "model.safetensors")
    layer = model.config.linear_attention_layers[0]
    prefix = f"model.layers.{layer}.linear_attn."
    attn = model.layers[layer].linear_attn
    assert torch.equal(attn.out_proj, saved[prefix + "out_proj.weight"].to(torch.bfloat16))
    assert torch.equal(attn.A_log, saved[prefix + "A_log"])


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
    """A rank's rows / columns of each head-major section, written out by hand, read slice by slice: the file's
    ``get_tensor`` (a whole tensor) is never called."""
    from safetensors import safe_open

    from compiled_engine.distributed import TensorParallel
    from compiled_engine.loader import Placement, _read

    class SlicesOnly:
        def __init__(self, f):
            self.f = f

        def get_slice(self, name):
            return self.f.get_slice(name)

        def get_tensor(self, name):
            raise AssertionError(f"read {name!r} whole")

    full = torch.arange(72.0).view(12, 6)
    save_file({"w": full}, tmp_path / "s.safetensors")
    # sections [4, 4, 4] along dim 0: each rank takes half of every section; [2, 4] along dim 1 likewise
    rows = {0: [0, 1, 4, 5, 8, 9], 1: [2, 3, 6, 7, 10, 11]}
    columns = {0: [0, 2, 3], 1: [1, 4, 5]}
    with safe_open(tmp_path / "s.safetensors", framework="pt") as f:
        for rank in range(2):
            tp = TensorParallel(rank, 2)
            assert torch.equal(_read(SlicesOnly(f), "w", Placement("x", shard=(0, [4, 4, 4])), tp), full[rows[rank]])
            assert torch.equal(_read(SlicesOnly(f), "w", Placement("x", shard=(1, [2, 4])), tp),
                               full[:, columns[rank]])
        with pytest.raises(CheckpointError, match="expected 10 along dim 0"):
            _read(f, "w", Placement("x", shard=(0, [5, 5])), TensorParallel(0, 2))


# --------------------------------------------------------------------------------------------------------------
# Ties come from the config; unreadable files and bad config fields are named
# --------------------------------------------------------------------------------------------------------------


def test_untied_checkpoint_without_lm_head_names_the_missing_tensor(qwen3_5_text_untied_path, tmp_path):
    """tie_word_embeddings: false and no lm_head.weight is damage: an error naming it, not a silent tie."""
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "ckpt")
    rewrite_weights(folder, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match=r"'lm_head\.weight'.*tie_word_embeddings"):
        load(folder)


def test_tied_config_ignores_a_stored_lm_head(qwen3_5_text_tied_path, tmp_path):
    """tie_word_embeddings: true ties lm_head to the embedding even where the checkpoint also stores one (vLLM)."""
    folder = copy_checkpoint(qwen3_5_text_tied_path, tmp_path / "ckpt")
    rewrite_weights(folder, lambda t: t.__setitem__("lm_head.weight", torch.zeros_like(t["model.embed_tokens.weight"])))
    model, report = load(folder)
    assert report.tied_lm_head and model.lm_head.data_ptr() == model.embed_tokens.data_ptr()
    assert torch.equal(model.lm_head, load_file(folder / "model.safetensors")["model.embed_tokens.weight"])


@pytest.mark.parametrize("keep", [0, 7, 100, -1])
def test_truncated_safetensors_file_is_named(qwen3_5_text_untied_path, tmp_path, keep):
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "ckpt")
    file = folder / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[:keep])
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        load(folder)


def test_corrupt_safetensors_header_is_named(qwen3_5_text_untied_path, tmp_path):
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "ckpt")
    file = folder / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[8:16] = b"\xff" * 8  # the JSON header's first bytes: not JSON any more
    file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        load(folder)


def test_corrupt_shard_of_a_sharded_checkpoint_is_named(qwen3_5_conditional_path, tmp_path):
    """A shard holding a text tensor (one of only skipped visual tensors is never opened)."""
    folder = copy_checkpoint(qwen3_5_conditional_path, tmp_path / "ckpt")
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    shard = folder / index["model.language_model.embed_tokens.weight"]
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(ValueError, match=shard.name):
        load(folder)
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        load(folder)
    (folder / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json"):
        load(folder)


def test_integer_tensor_is_named_and_float64_is_cast(qwen3_5_text_untied_path, tmp_path):
    """An int8 tensor (quantised or damaged data, no quantisation config) would be cast silently: rejected, named.
    A float64 tensor is a more precise checkpoint: cast to the target dtype, values exact in fp32."""
    name = "model.layers.0.mlp.down_proj.weight"
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "int8")
    rewrite_weights(folder, lambda t: t.__setitem__(name, t[name].to(torch.int8)))
    with pytest.raises(CheckpointError, match=rf"{name}.*dtype"):
        load(folder)
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "f64")
    rewrite_weights(folder, lambda t: t.__setitem__(name, t[name].double()))
    model, _ = load(folder)
    saved = load_file(qwen3_5_text_untied_path / "model.safetensors")[name]
    assert torch.equal(model.layers[0].mlp.down_proj, saved)


BAD_CONFIG_FIELDS = [
    ("hidden_size", "64"), ("hidden_size", 64.0), ("hidden_size", -64), ("hidden_size", None), ("hidden_size", True),
    ("vocab_size", 0), ("num_hidden_layers", [4]), ("linear_num_key_heads", "2"), ("head_dim", 32.5),
    ("rms_norm_eps", "1e-6"), ("rms_norm_eps", -1.0), ("tie_word_embeddings", "false"), ("tie_word_embeddings", 0),
    ("layer_types", "linear_attention"), ("eos_token_id", "2"), ("eos_token_id", [1, -3]),
    ("max_position_embeddings", 1e9), ("full_attention_interval", 0), ("rope_parameters", 5),
]


@pytest.mark.parametrize("field,value", BAD_CONFIG_FIELDS, ids=[f"{f}={v!r}" for f, v in BAD_CONFIG_FIELDS])
def test_bad_config_field_names_file_and_field(qwen3_5_text_untied_path, tmp_path, field, value):
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "ckpt")
    edit_config(folder, lambda c: (c.pop("layer_types") if field == "full_attention_interval" else None,
                                   c.__setitem__(field, value)))
    with pytest.raises(ValueError, match=rf"config\.json.*{field}"):
        ModelConfig.from_pretrained(folder)


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "linear_value_head_dim", "num_hidden_layers"])
def test_missing_config_field_names_file_and_field(qwen3_5_text_untied_path, tmp_path, field):
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "ckpt")
    edit_config(folder, lambda c: c.pop(field))
    with pytest.raises(ValueError, match=rf"config\.json.*{field}"):
        ModelConfig.from_pretrained(folder)


@pytest.mark.parametrize("text", ["{\"model_type\": ", "", "not json", "[1, 2]", "\"qwen3_5_text\""])
def test_config_that_is_not_a_json_object_names_the_file(qwen3_5_text_untied_path, tmp_path, text):
    folder = copy_checkpoint(qwen3_5_text_untied_path, tmp_path / "ckpt")
    (folder / "config.json").write_text(text)
    with pytest.raises(ValueError, match=r"config\.json"):
        Runtime.from_pretrained(str(folder), device="cpu")


def test_the_tiny_model_built_by_several_workers_at_once_is_whole(tmp_path):
    """Parallel test workers each build the embedded tiny model into one cache folder; every build returns, and
    the folder holds the deterministic weights (oracle: `tiny_weights` called here) and a config that loads."""
    import threading

    from compiled_engine.tiny_model import TINY_CONFIG, ensure_tiny_model, tiny_weights

    path, errors = str(tmp_path / "tiny"), []

    def build():
        try:
            ensure_tiny_model(path)
        except Exception as e:  # noqa: BLE001 -- collected and asserted below
            errors.append(e)

    workers = [threading.Thread(target=build) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]  # no builder's partial folder is left behind
    stored, expected = load_file(str(tmp_path / "tiny" / "model.safetensors")), tiny_weights(TINY_CONFIG)
    assert stored.keys() == expected.keys()
    assert all(torch.equal(stored[k], expected[k]) for k in expected)
    assert Runtime.from_pretrained(path, device="cpu").model_config.vocab_size == TINY_CONFIG["vocab_size"]

"""Checkpoint fuzzing: damaged copies of the tiny HF-built checkpoints (tests/hf_models.py) must fail to load with
an error that names the damaged file, tensor or config field, and return nothing (no half-loaded Runtime).

Damage, drawn by hypothesis: a safetensors file truncated at a random byte; a random tensor dropped; a tensor's
shape changed (a row more or less, or an extra trailing dimension); a tensor stored as an integer or bool dtype; a
config.json field given the wrong type, removed, or made negative. The oracle is the damage itself: the name we
broke must appear in the message of a ValueError (CheckpointError is one) or FileNotFoundError. A float64 tensor
is not damage (it is cast, as HF and vLLM cast): it loads, equal to the original fp32 values.

Kept fast (about forty examples, each a copy of a checkpoint of a few hundred KB and a load that fails early).
"""

from __future__ import annotations

import gc
import json
import shutil
import tempfile
import weakref
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from compiled_engine.model import HybridModel
from compiled_engine.runtime import Runtime

VARIANTS = ("qwen3_5_text_tied", "qwen3_5_text_untied", "qwen3_next_dense")  # single-file checkpoints
EXAMPLES = settings(max_examples=8, deadline=None)

# config.json integer fields: required ones may also be removed (the others have defaults, so removing them is not
# damage); head_dim null means "hidden_size // heads" (HF's rule), so null is not damage for it either.
REQUIRED_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                       "linear_value_head_dim")
OPTIONAL_INT_FIELDS = ("num_key_value_heads", "head_dim", "max_position_embeddings", "linear_conv_kernel_dim")


@pytest.fixture(scope="module")
def checkpoints(build_hf_model) -> dict[str, Path]:
    return {name: build_hf_model(name) for name in VARIANTS}


def assert_load_fails_naming(folder: Path, name: str, errors=(ValueError, FileNotFoundError)) -> None:
    """Runtime.from_pretrained raises one of ``errors`` whose message names ``name``, and nothing half-loaded
    survives it: any model or Runtime constructed on the way (weakly tracked) is garbage once the exception is
    dropped."""
    created = []

    def tracking(cls):
        init = cls.__init__

        def tracked_init(self, *args, **kwargs):
            created.append(weakref.ref(self))
            init(self, *args, **kwargs)

        return mock.patch.object(cls, "__init__", tracked_init)

    with tracking(HybridModel), tracking(Runtime), pytest.raises(errors) as info:
        Runtime.from_pretrained(str(folder), device="cpu", dtype="float32", max_model_len=64, num_kv_blocks=8)
    message = str(info.value)
    assert name in message, f"{name!r} not named in: {message}"
    if created:  # the traceback holds the frames: drop it before looking for survivors
        del info
        gc.collect()
        assert all(ref() is None for ref in created)


def copy(src: Path, parent: str) -> Path:
    return Path(shutil.copytree(src, Path(parent) / "ckpt"))


def without_prefix(name: str) -> str:
    """The name as our errors may give it: the checkpoint name less its ``model.`` prefix."""
    return name.removeprefix("model.language_model.").removeprefix("model.")


@EXAMPLES
@given(variant=st.sampled_from(VARIANTS), cut=st.floats(0.0, 1.0, exclude_max=True))
def test_truncated_safetensors_file_is_named(checkpoints, variant, cut):
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy(checkpoints[variant], tmp)
        file = folder / "model.safetensors"
        data = file.read_bytes()
        file.write_bytes(data[: int(cut * len(data))])  # every cut short of the whole file
        assert_load_fails_naming(folder, str(file))


@EXAMPLES
@given(variant=st.sampled_from(VARIANTS), data=st.data())
def test_dropped_tensor_is_named(checkpoints, variant, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy(checkpoints[variant], tmp)
        tensors = load_file(folder / "model.safetensors")
        name = data.draw(st.sampled_from(sorted(tensors)), label="dropped")
        del tensors[name]
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        assert_load_fails_naming(folder, without_prefix(name))


@EXAMPLES
@given(variant=st.sampled_from(VARIANTS), change=st.sampled_from(["row more", "row less", "trailing dim"]),
       data=st.data())
def test_misshaped_tensor_is_named(checkpoints, variant, change, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy(checkpoints[variant], tmp)
        tensors = load_file(folder / "model.safetensors")
        names = sorted(n for n in tensors if change != "row less" or tensors[n].shape[0] > 1)
        name = data.draw(st.sampled_from(names), label="reshaped")
        t = tensors[name]
        if change == "row more":
            t = torch.cat([t, t[:1]])
        elif change == "row less":
            t = t[:-1]
        else:
            t = torch.stack([t, t], dim=-1)
        tensors[name] = t.contiguous()
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        assert_load_fails_naming(folder, name)


@EXAMPLES
@given(variant=st.sampled_from(VARIANTS), dtype=st.sampled_from([torch.int8, torch.int32, torch.uint8, torch.bool,
                                                                 torch.float64]), data=st.data())
def test_tensor_dtype_change_is_named_or_cast(checkpoints, variant, dtype, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy(checkpoints[variant], tmp)
        tensors = load_file(folder / "model.safetensors")
        name = data.draw(st.sampled_from(sorted(tensors)), label="retyped")
        original = tensors[name]
        tensors[name] = original.to(dtype)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        if dtype != torch.float64:  # integer or bool data would be cast silently: named instead
            assert_load_fails_naming(folder, name)
            return
        runtime = Runtime.from_pretrained(str(folder), device="cpu", dtype="float32", max_model_len=64,
                                          num_kv_blocks=8)
        # float64 of fp32 values casts back exactly: the model equals the undamaged checkpoint's.
        reference = Runtime.from_pretrained(str(checkpoints[variant]), device="cpu", dtype="float32",
                                            max_model_len=64, num_kv_blocks=8)
        loaded, expected = runtime.model.state_dict(), reference.model.state_dict()
        assert loaded.keys() == expected.keys()
        assert all(torch.equal(loaded[k], expected[k]) for k in expected)


@EXAMPLES
@given(variant=st.sampled_from(VARIANTS), field=st.sampled_from(REQUIRED_INT_FIELDS + OPTIONAL_INT_FIELDS),
       damage=st.sampled_from(["string", "float", "bool", "null", "list", "negative", "zero", "missing"]))
def test_damaged_config_field_is_named(checkpoints, variant, field, damage):
    if field not in REQUIRED_INT_FIELDS and damage == "missing" or field == "head_dim" and damage == "null":
        damage = "negative"  # a default applies: not damage (see OPTIONAL_INT_FIELDS)
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy(checkpoints[variant], tmp)
        config = json.loads((folder / "config.json").read_text())
        value = config.get(field, 4)
        damaged = {"string": str(value), "float": value + 0.5, "bool": True, "null": None, "list": [value],
                   "negative": -abs(value) - 1, "zero": 0}
        if damage == "missing":
            config.pop(field, None)
        else:
            config[field] = damaged[damage]
        (folder / "config.json").write_text(json.dumps(config))
        assert_load_fails_naming(folder, field)
        assert_load_fails_naming(folder, "config.json")

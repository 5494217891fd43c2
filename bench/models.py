"""Model resolution for the benchmarks: ``tiny``, ``qwen3.5-0.8b`` and ``qwen3.5-35b-a3b`` (the real shapes, random
weights) or a folder.

``qwen3.5-0.8b`` is the Qwen3.5-0.8B text architecture with RANDOM bf16 weights: no download exists here, and the
speed of a forward pass does not depend on the weight values. The checkpoint (config.json + model.safetensors in
the HF ``Qwen3_5ForCausalLM`` layout, ~1.5 GB) is drawn on the benchmark device (a GPU draws it in well under a
second) and written once to the cache folder; HF transformers loads the same folder for ``--vs-hf``.

``qwen3.5-35b-a3b`` is the Qwen3.5-35B-A3B text shape (a sparse MoE in every layer: 256 experts, top-8) with random
bf16 weights drawn straight into the model's parameters on the GPU (``random_device_model``): its 67 GB checkpoint
would not fit the device's disk. Its folder holds config.json only; ``device_llm`` builds the LLM over it with the
loader replaced by that draw. A bench-only path: the loader itself is tested on small checkpoints.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator

import torch

RANDOM_VERSION = "v1"  # bump when the recipe below changes, so stale caches are rebuilt

# The Qwen3.5-0.8B text shape (the reference workload).
QWEN3_5_0_8B_CONFIG = {
    "model_type": "qwen3_5_text",
    "architectures": ["Qwen3_5ForCausalLM"],
    "vocab_size": 248320,
    "hidden_size": 1024,
    "intermediate_size": 3584,
    "num_hidden_layers": 24,
    "full_attention_interval": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": True,
    "eos_token_id": 248319,  # a stand-in (the weights are random); every benchmark runs with ignore_eos
    "hidden_act": "silu",
    "dtype": "bfloat16",
}

# The Qwen3.5-35B-A3B text shape (Qwen3_5MoeForCausalLM): 40 layers, 3 Gated-DeltaNet to 1 attention.
QWEN3_5_35B_A3B_CONFIG = {
    "model_type": "qwen3_5_moe_text",
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "vocab_size": 248320,
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "full_attention_interval": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": False,
    "eos_token_id": 248044,  # a stand-in (the weights are random); every benchmark runs with ignore_eos
    "hidden_act": "silu",
    "dtype": "bfloat16",
}

NAMED_MODELS = {"qwen3.5-0.8b": QWEN3_5_0_8B_CONFIG}
DEVICE_RANDOM_MODELS = {"qwen3.5-35b-a3b": QWEN3_5_35B_A3B_CONFIG}  # weights drawn on the device, no checkpoint


@dataclass(frozen=True)
class ModelSpec:
    name: str  # "tiny", "qwen3.5-0.8b", or the folder's path as given
    path: str  # checkpoint folder
    random_weights: bool  # True for the built-in models
    on_device: bool = False  # no weights file: device_llm draws them on the device


def resolve_model(spec: str | None, device: torch.device | str | None = None) -> ModelSpec:
    """``tiny`` | ``qwen3.5-0.8b`` | a checkpoint folder -> a ModelSpec (building the built-in ones if needed)."""
    spec = spec or "tiny"
    if spec == "tiny":
        from compiled_engine.tiny_model import ensure_tiny_model

        return ModelSpec("tiny", ensure_tiny_model(), True)
    if spec in DEVICE_RANDOM_MODELS:
        folder = os.path.join(cache_root(), f"{spec}-config-{RANDOM_VERSION}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(DEVICE_RANDOM_MODELS[spec], f, indent=2)
        return ModelSpec(spec, folder, True, on_device=True)
    if spec in NAMED_MODELS:
        folder = os.path.join(cache_root(), f"{spec}-random-{RANDOM_VERSION}")
        build_random_checkpoint(NAMED_MODELS[spec], folder, dtype=torch.bfloat16, device=device)
        return ModelSpec(spec, folder, True)
    if os.path.isdir(spec):
        if not os.path.isfile(os.path.join(spec, "config.json")):
            raise FileNotFoundError(f"{spec!r} has no config.json: not a checkpoint folder")
        return ModelSpec(spec, os.path.abspath(spec), False)
    named = sorted(NAMED_MODELS) + sorted(DEVICE_RANDOM_MODELS)
    raise ValueError(f"unknown model {spec!r}: pass 'tiny', one of {named}, or a checkpoint folder")


def cache_root() -> str:
    return os.environ.get("COMPILED_ENGINE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "compiled_engine")


def build_random_checkpoint(
    config: dict, folder: str, *, dtype: torch.dtype = torch.bfloat16, device=None, seed: int = 0
) -> str:
    """Write config.json + model.safetensors with random weights for ``config`` unless ``folder`` has them."""
    from safetensors.torch import save_file

    weights_file = os.path.join(folder, "model.safetensors")
    if os.path.isfile(weights_file):
        return folder
    os.makedirs(folder, exist_ok=True)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    tensors = {}
    for name, tensor in random_weights(config, torch.device(device), seed):
        keep_fp32 = name.rsplit(".", 1)[-1] in ("A_log", "dt_bias")  # as the loader keeps them
        tensors[name] = tensor.to("cpu", torch.float32 if keep_fp32 else dtype).contiguous()
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({**config, "dtype": str(dtype).removeprefix("torch.")}, f, indent=2)
    tmp = weights_file + ".partial"
    save_file(tensors, tmp)
    os.replace(tmp, weights_file)  # the weights file appears last: its presence marks a complete folder
    return folder


def random_weights(config: dict, device: torch.device, seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Random fp32 weights with HF ``Qwen3_5ForCausalLM`` names, drawn like compiled_engine.tiny_model.tiny_weights
    (every block perturbs the output; no NaN/inf through many bf16 layers), but on ``device`` and one tensor at a
    time. ``lm_head.weight`` only for untied configs."""
    g = torch.Generator(device=device).manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    kd, vd = config["linear_key_head_dim"], config["linear_value_head_dim"]
    heads, kv_heads, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    kernel = config.get("linear_conv_kernel_dim", 4)
    conv_dim = 2 * hk * kd + hv * vd

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    def linear(rows, cols):
        return randn(rows, cols) * cols**-0.5

    def norm(dim):  # zero-centred norms: a non-zero weight matters
        return randn(dim) * 0.1

    yield "model.embed_tokens.weight", randn(config["vocab_size"], hidden)
    interval = config.get("full_attention_interval", 4)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", norm(hidden)
        yield p + "post_attention_layernorm.weight", norm(hidden)
        yield p + "mlp.gate_proj.weight", linear(inter, hidden)
        yield p + "mlp.up_proj.weight", linear(inter, hidden)
        yield p + "mlp.down_proj.weight", linear(hidden, inter)
        if (i + 1) % interval == 0:
            yield p + "self_attn.q_proj.weight", linear(2 * heads * hd, hidden)
            yield p + "self_attn.k_proj.weight", linear(kv_heads * hd, hidden)
            yield p + "self_attn.v_proj.weight", linear(kv_heads * hd, hidden)
            yield p + "self_attn.o_proj.weight", linear(hidden, heads * hd)
            yield p + "self_attn.q_norm.weight", norm(hd)
            yield p + "self_attn.k_norm.weight", norm(hd)
        else:
            yield p + "linear_attn.in_proj_qkv.weight", linear(conv_dim, hidden)
            yield p + "linear_attn.in_proj_z.weight", linear(hv * vd, hidden)
            yield p + "linear_attn.in_proj_b.weight", linear(hv, hidden)
            yield p + "linear_attn.in_proj_a.weight", linear(hv, hidden)
            yield p + "linear_attn.conv1d.weight", randn(conv_dim, 1, kernel) * 0.5
            yield p + "linear_attn.A_log", torch.empty(hv, device=device).uniform_(0.01, 16, generator=g).log()
            yield p + "linear_attn.dt_bias", randn(hv) * 0.5
            yield p + "linear_attn.norm.weight", 1 + randn(vd) * 0.1
            yield p + "linear_attn.out_proj.weight", linear(hidden, hv * vd)
    yield "model.norm.weight", norm(hidden)
    if not config.get("tie_word_embeddings", False):
        yield "lm_head.weight", linear(config["vocab_size"], hidden) * 4


def random_device_model(path, config, device, dtype, progress=False, tp=None, attention_backend="triton"):
    """``load_model``'s signature and result, with random weights drawn on ``device`` instead of read from ``path``
    (which holds config.json only), into our layout directly, one parameter at a time in ``dtype`` (A_log and
    dt_bias in fp32, as the loader keeps them). Draws as ``random_weights``: every block perturbs the output."""
    from compiled_engine.distributed import SINGLE
    from compiled_engine.loader import FP32_PARAMETERS, LoadReport
    from compiled_engine.model import HybridModel

    tp = tp or SINGLE
    with torch.device("meta"):
        model = HybridModel(config, tp, attention_backend)
    g = torch.Generator(device=device).manual_seed(0)
    for name, meta in list(model.named_parameters()):
        leaf = name.rsplit(".", 1)[-1]
        fp32 = leaf in FP32_PARAMETERS
        value = torch.randn(meta.shape, generator=g, device=device, dtype=torch.float32 if fp32 else dtype)
        if leaf == "A_log":
            value = torch.empty(meta.shape, device=device).uniform_(0.01, 16, generator=g).log_()
        elif name.endswith("linear_attn.norm.weight"):
            value.mul_(0.1).add_(1)
        elif leaf == "dt_bias" or leaf == "conv_weight":
            value.mul_(0.5)
        elif meta.dim() == 1:  # zero-centred norms
            value.mul_(0.1)
        elif name != "embed_tokens":
            value.mul_(meta.shape[-1] ** -0.5)
        owner_path, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner_path) if owner_path else model, attr, torch.nn.Parameter(value, False))
    if config.tie_word_embeddings:
        model.lm_head = model.embed_tokens
    for module in model.modules():  # derived buffers (rotary inv_freq)
        for buffer_name, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, buffer_name, buffer.to(device))
    return model, LoadReport(tied_lm_head=config.tie_word_embeddings)


def device_llm(path: str, **llm_kwargs):
    """``LLM(path, **llm_kwargs)`` for a ``DEVICE_RANDOM_MODELS`` folder: the runtime's loader is swapped for
    ``random_device_model`` while the LLM is built (one process: tensor parallelism is not supported here)."""
    from unittest import mock

    from compiled_engine import runtime
    from compiled_engine.llm import LLM

    if llm_kwargs.get("tensor_parallel_size", 1) != 1:
        raise ValueError("a device-drawn random model runs with tensor_parallel_size 1 only")
    with mock.patch.object(runtime, "load_model", random_device_model):
        return LLM(path, **llm_kwargs)


def shape_summary(config) -> dict:
    """The numbers that identify a model's shape (``config``: a compiled_engine ModelConfig)."""
    return {
        "model_type": config.model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "experts": f"{config.num_experts} x {config.moe_intermediate_size}, top-{config.num_experts_per_tok}, shared "
        f"{config.shared_expert_intermediate_size}, {len(config.moe_layers)} sparse layers" if config.moe_layers
        else None,
        "num_hidden_layers": config.num_hidden_layers,
        "full_attention_layers": len(config.full_attention_layers),
        "linear_attention_layers": len(config.linear_attention_layers),
        "attention_heads": f"{config.num_attention_heads}q/{config.num_key_value_heads}kv x {config.head_dim}",
        "linear_heads": f"{config.linear_num_key_heads}k/{config.linear_num_value_heads}v x "
        f"{config.linear_key_head_dim}/{config.linear_value_head_dim}",
        "tie_word_embeddings": config.tie_word_embeddings,
    }

"""Model resolution for the benchmarks: ``tiny``, the real shapes with random weights (``qwen3.5-0.8b``, and the
``DEVICE_RANDOM_MODELS``: ``qwen3.5-27b``, ``qwen3.5-35b-a3b``, ``qwen3-next-80b-a3b`` and its 8-layer cut
``qwen3-next-80b-a3b-8l``) or a folder.

``qwen3.5-0.8b`` is the Qwen3.5-0.8B text architecture with RANDOM bf16 weights: no download exists here, and the
speed of a forward pass does not depend on the weight values. The checkpoint (config.json + model.safetensors in
the HF ``Qwen3_5ForCausalLM`` layout, ~1.5 GB) is drawn on the benchmark device (a GPU draws it in well under a
second) and written once to the cache folder; HF transformers loads the same folder for ``--vs-hf``.

The ``DEVICE_RANDOM_MODELS`` have random bf16 weights drawn on the GPUs while the model loads: their checkpoints
(54 to 159 GB) would not fit the device's disk. Their folders hold config.json only; ``device_llm`` builds the LLM
over one with ``RandomWeights`` as the loader's weight source (compiled_engine.loader.WeightSource), which makes each
checkpoint tensor whole on the loading rank's device, from a seed and its name; the loader then routes and cuts it as
it would a file's. So every tensor-parallel rank draws only on its own GPU and holds its part of the same model:
TP=2 equals TP=1 (tests/test_tensor_parallel.py).
"""

from __future__ import annotations

import functools
import json
import os
import zlib
from dataclasses import dataclass
from typing import Iterator

import torch

RANDOM_VERSION = "v3-tied-scale"  # bump when the recipe below changes, so stale caches are rebuilt

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
    **{key: value for key, value in QWEN3_5_0_8B_CONFIG.items() if key != "intermediate_size"},  # no dense MLP
    "model_type": "qwen3_5_moe_text",
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "num_attention_heads": 16,
    "linear_num_value_heads": 32,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False,
    "eos_token_id": 248044,  # a stand-in (the weights are random); every benchmark runs with ignore_eos
}

# A Qwen3.5-27B-like dense text shape: hidden 5,120, 64 layers in the 3:1 Gated-DeltaNet : attention pattern, 24 query
# and 4 KV heads of 256, linear attention 16 key and 48 value heads of 128, MLP 17,408, untied lm_head. The hidden
# size, layers, attention heads, MLP width and vocabulary are the published model card's; the linear-attention heads
# are not stated there and are chosen so that the count, with the model's vision encoder (~0.45B) and MTP layer
# (~0.4B), comes to its published 27.78B parameters (26.9B for this text shape, 53.8 GB in bf16).
QWEN3_5_27B_CONFIG = {
    **QWEN3_5_0_8B_CONFIG,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 64,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "tie_word_embeddings": False,
}

# The Qwen3-Next-80B-A3B shape (Qwen3NextForCausalLM; HF Qwen3NextConfig's defaults describe it): 48 layers, every
# one a sparse MoE (512 experts of 512, top-10, a shared expert of 512), 3 Gated-DeltaNet layers to 1 attention
# layer (16 query and 2 KV heads of 256; linear attention 16 key and 32 value heads of 128), vocabulary 151,936.
QWEN3_NEXT_80B_A3B_CONFIG = {
    "model_type": "qwen3_next",
    "architectures": ["Qwen3NextForCausalLM"],
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 5120,  # no dense MLP layer uses it (every layer is sparse)
    "num_hidden_layers": 48,
    "full_attention_interval": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "rope_theta": 1e7,
    "partial_rotary_factor": 0.25,
    "tie_word_embeddings": False,
    "eos_token_id": 151645,  # a stand-in (the weights are random); every benchmark runs with ignore_eos
    "hidden_act": "silu",
    "dtype": "bfloat16",
}

NAMED_MODELS = {"qwen3.5-0.8b": QWEN3_5_0_8B_CONFIG, "qwen3.5-0.8b-confident": QWEN3_5_0_8B_CONFIG}
# Named models whose tied embedding (the output projection) is drawn at this std instead of lm_head's scale: logits
# of std ~32 whose top token leads by tens (the recipe before v3). Greedy tokens then survive bf16 rounding
# differences, such as a speculative verify step's against a decode step's, which the spec scenario's forced drafter
# needs (its continuation must hold in every run); sampled tokens are nearly always the argmax (not for sampling).
EMBEDDING_STD = {"qwen3.5-0.8b-confident": 1.0}
DEVICE_RANDOM_MODELS = {  # weights drawn on the device, no checkpoint
    "qwen3.5-27b": QWEN3_5_27B_CONFIG,
    "qwen3.5-35b-a3b": QWEN3_5_35B_A3B_CONFIG,
    "qwen3-next-80b-a3b": QWEN3_NEXT_80B_A3B_CONFIG,
    # Its first 8 layers (two 4-layer blocks): fits one GPU, for TP=2 == TP=1 on the 80B's layer shapes.
    "qwen3-next-80b-a3b-8l": {**QWEN3_NEXT_80B_A3B_CONFIG, "num_hidden_layers": 8},
}


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
        build_random_checkpoint(NAMED_MODELS[spec], folder, dtype=torch.bfloat16, device=device,
                                embedding_std=EMBEDDING_STD.get(spec))
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
    config: dict, folder: str, *, dtype: torch.dtype = torch.bfloat16, device=None, seed: int = 0,
    embedding_std: float | None = None,
) -> str:
    """Write config.json + model.safetensors with random weights for ``config`` unless ``folder`` has them;
    ``embedding_std``: the embedding rescaled to that std (``EMBEDDING_STD``)."""
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
        if embedding_std is not None and name == "model.embed_tokens.weight":
            tensor = tensor * (embedding_std / tensor.std())
        tensors[name] = tensor.to("cpu", torch.float32 if keep_fp32 else dtype).contiguous()
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({**config, "dtype": str(dtype).removeprefix("torch.")}, f, indent=2)
    tmp = weights_file + ".partial"
    save_file(tensors, tmp)
    os.replace(tmp, weights_file)  # the weights file appears last: its presence marks a complete folder
    return folder


@functools.lru_cache(maxsize=8)  # RandomWeights looks every tensor up in it
def checkpoint_layout(config, mtp: bool = False) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor of a Qwen3.5-layout checkpoint of ``config`` (a compiled_engine ModelConfig), in file order:
    HF name -> (whole shape, how it is drawn: a key of ``draw``). Linear attention as Qwen3.5 names it
    (``in_proj_qkv|z|b|a``; the loader takes it for Qwen3-Next too), a sparse layer's experts fused as Qwen3.5-MoE
    stores them (``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj [E, H, I]``). ``lm_head.weight`` only for
    untied configs; ``mtp``: the multi-token-prediction layer (dense MLP) too."""
    c = config
    hidden, inter = c.hidden_size, c.intermediate_size
    heads, kv_heads, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    hv, vd = c.linear_num_value_heads, c.linear_value_head_dim
    # Tied, the embedding is the output projection too: drawn at lm_head's scale, so that the logits spread as a
    # language model's do (std ~4; at std sqrt(hidden) = 32, every sampled token was the argmax).
    layout = {"model.embed_tokens.weight": ((c.vocab_size, hidden), "lm_head" if c.tie_word_embeddings else "embed")}

    def dense_mlp(p):
        layout[p + "mlp.gate_proj.weight"] = ((inter, hidden), "linear")
        layout[p + "mlp.up_proj.weight"] = ((inter, hidden), "linear")
        layout[p + "mlp.down_proj.weight"] = ((hidden, inter), "linear")

    def attention(p):
        layout[p + "self_attn.q_proj.weight"] = ((2 * heads * hd, hidden), "linear")
        layout[p + "self_attn.k_proj.weight"] = ((kv_heads * hd, hidden), "linear")
        layout[p + "self_attn.v_proj.weight"] = ((kv_heads * hd, hidden), "linear")
        layout[p + "self_attn.o_proj.weight"] = ((hidden, heads * hd), "linear")
        layout[p + "self_attn.q_norm.weight"] = ((hd,), "norm")
        layout[p + "self_attn.k_norm.weight"] = ((hd,), "norm")

    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        layout[p + "input_layernorm.weight"] = ((hidden,), "norm")
        layout[p + "post_attention_layernorm.weight"] = ((hidden,), "norm")
        if i in c.moe_layers:
            e, moe, shared = c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
            layout[p + "mlp.gate.weight"] = ((e, hidden), "linear")
            layout[p + "mlp.experts.gate_up_proj"] = ((e, 2 * moe, hidden), "linear")
            layout[p + "mlp.experts.down_proj"] = ((e, hidden, moe), "linear")
            layout[p + "mlp.shared_expert.gate_proj.weight"] = ((shared, hidden), "linear")
            layout[p + "mlp.shared_expert.up_proj.weight"] = ((shared, hidden), "linear")
            layout[p + "mlp.shared_expert.down_proj.weight"] = ((hidden, shared), "linear")
            layout[p + "mlp.shared_expert_gate.weight"] = ((1, hidden), "linear")
        else:
            dense_mlp(p)
        if i in c.full_attention_layers:
            attention(p)
        else:
            layout[p + "linear_attn.in_proj_qkv.weight"] = ((c.conv_dim, hidden), "linear")
            layout[p + "linear_attn.in_proj_z.weight"] = ((c.linear_value_dim, hidden), "linear")
            layout[p + "linear_attn.in_proj_b.weight"] = ((hv, hidden), "linear")
            layout[p + "linear_attn.in_proj_a.weight"] = ((hv, hidden), "linear")
            layout[p + "linear_attn.conv1d.weight"] = ((c.conv_dim, 1, c.linear_conv_kernel_dim), "conv")
            layout[p + "linear_attn.A_log"] = ((hv,), "A_log")
            layout[p + "linear_attn.dt_bias"] = ((hv,), "dt_bias")
            layout[p + "linear_attn.norm.weight"] = ((vd,), "gated_norm")
            layout[p + "linear_attn.out_proj.weight"] = ((hidden, c.linear_value_dim), "linear")
    layout["model.norm.weight"] = ((hidden,), "norm")
    if not c.tie_word_embeddings:
        layout["lm_head.weight"] = ((c.vocab_size, hidden), "lm_head")
    if mtp:  # as real Qwen3.5 checkpoints carry it (speculative decoding: bench/spec.py)
        layout["mtp.fc.weight"] = ((hidden, 2 * hidden), "linear")
        layout["mtp.pre_fc_norm_embedding.weight"] = ((hidden,), "norm")
        layout["mtp.pre_fc_norm_hidden.weight"] = ((hidden,), "norm")
        p = "mtp.layers.0."
        layout[p + "input_layernorm.weight"] = ((hidden,), "norm")
        layout[p + "post_attention_layernorm.weight"] = ((hidden,), "norm")
        dense_mlp(p)
        attention(p)
        layout["mtp.norm.weight"] = ((hidden,), "norm")
    return layout


def draw(kind: str, shape: tuple[int, ...], g: torch.Generator, device) -> torch.Tensor:
    """One random fp32 tensor of ``checkpoint_layout``'s ``kind``, scaled so that every block perturbs the output
    and nothing overflows through many bf16 layers (as compiled_engine.tiny_model.tiny_weights draws them)."""
    if kind == "A_log":
        return torch.empty(shape, device=device).uniform_(0.01, 16, generator=g).log()
    value = torch.randn(shape, generator=g, device=device)
    if kind in ("linear", "lm_head"):
        value *= shape[-1] ** -0.5 * (4 if kind == "lm_head" else 1)
    elif kind in ("conv", "dt_bias"):
        value *= 0.5
    elif kind == "norm":  # zero-centred norms: a non-zero weight matters
        value *= 0.1
    elif kind == "gated_norm":
        value = 1 + value * 0.1
    return value


def random_weights(config: dict, device: torch.device, seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Random fp32 weights with HF ``Qwen3_5ForCausalLM`` names (``checkpoint_layout`` with the MTP layer), drawn
    on ``device`` one tensor at a time from one generator seeded with ``seed``."""
    from compiled_engine.config import ModelConfig

    g = torch.Generator(device=device).manual_seed(seed)
    for name, (shape, kind) in checkpoint_layout(ModelConfig.from_dict(config), mtp=True).items():
        yield name, draw(kind, shape, g, device)


@dataclass(frozen=True)
class RandomWeights:
    """A ``compiled_engine.loader.WeightSource`` of random weights: ``checkpoint_layout``'s tensors, each drawn on
    the loading rank's device from a generator seeded by ``seed`` and its name. The loader cuts every rank's part
    from the whole tensor, so a tensor-parallel rank holds exactly the values of its part of the unsharded model
    (TP=2 computes what TP=1 computes), whatever order the tensors are made in. ``LLM(folder,
    weights=RandomWeights())`` for a folder that holds only config.json."""

    seed: int = 0

    def names(self, config) -> list[str]:
        return list(checkpoint_layout(config))

    def get_tensor(self, name: str, config, device: torch.device) -> torch.Tensor:
        shape, kind = checkpoint_layout(config)[name]
        g = torch.Generator(device=device).manual_seed(self.seed * 2**32 + zlib.crc32(name.encode()))
        return draw(kind, shape, g, device)


def device_llm(path: str, **llm_kwargs):
    """``LLM(path, **llm_kwargs)`` for a ``DEVICE_RANDOM_MODELS`` folder (config.json only): random weights drawn
    on every rank's device (``RandomWeights``)."""
    from compiled_engine.llm import LLM

    return LLM(path, weights=RandomWeights(), **llm_kwargs)


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

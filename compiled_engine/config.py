"""Configuration: the model's (ModelConfig, one flat dataclass read from a checkpoint's ``config.json``) and the
runtime's knobs (RuntimeConfig, README "Knobs").

Accepted ``model_type``s:
  * ``qwen3_5_text``  (``Qwen3_5ForCausalLM``): text parameters at the top level;
  * ``qwen3_5``       (``Qwen3_5ForConditionalGeneration``): text parameters nested under ``text_config``;
  * ``qwen3_next``    (``Qwen3NextForCausalLM``): dense MLP only; a sparse-MoE config raises NotImplementedError.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch

SUPPORTED_MODEL_TYPES = ("qwen3_5_text", "qwen3_5", "qwen3_next")
LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # the top-level model_type of the checkpoint
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    rms_norm_eps: float
    tie_word_embeddings: bool
    # full attention (GQA)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    # linear attention (Gated DeltaNet)
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    max_position_embeddings: int = 32768
    eos_token_ids: tuple[int, ...] = ()
    hidden_act: str = "silu"
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    # Derived sizes used by the layers and the pools.
    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def full_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION]

    @property
    def linear_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION]

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "ModelConfig":
        config_file = os.path.join(path, "config.json")
        if not os.path.isfile(config_file):
            raise FileNotFoundError(f"no config.json in {path!r}")
        with open(config_file) as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}: compiled_engine runs {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        text = raw.get("text_config") or {} if model_type == "qwen3_5" else raw
        if model_type == "qwen3_5" and not text:
            raise ValueError("a qwen3_5 config must nest its text parameters under 'text_config'")
        if model_type == "qwen3_next":
            _reject_sparse_moe(text)

        def need(key: str):
            if key not in text:
                raise ValueError(f"config.json of a {model_type} model lacks {key!r}")
            return text[key]

        num_layers = need("num_hidden_layers")
        layer_types = _layer_types(text, num_layers)
        rope = text.get("rope_parameters") or raw.get("rope_parameters") or {}
        rope_theta = rope.get("rope_theta", text.get("rope_theta", 10000.0))
        partial_rotary = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        eos = text.get("eos_token_id", raw.get("eos_token_id"))
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        config = cls(
            model_type=model_type,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=num_layers,
            layer_types=layer_types,
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(tie),
            num_attention_heads=heads,
            num_key_value_heads=text.get("num_key_value_heads", heads),
            head_dim=text.get("head_dim") or hidden // heads,
            rope_theta=float(rope_theta),
            partial_rotary_factor=float(partial_rotary),
            linear_num_key_heads=need("linear_num_key_heads"),
            linear_num_value_heads=need("linear_num_value_heads"),
            linear_key_head_dim=need("linear_key_head_dim"),
            linear_value_head_dim=need("linear_value_head_dim"),
            linear_conv_kernel_dim=text.get("linear_conv_kernel_dim", 4),
            max_position_embeddings=text.get("max_position_embeddings", 32768),
            eos_token_ids=eos_ids,
            hidden_act=text.get("hidden_act", "silu"),
            raw=raw,
        )
        config.validate()
        return config

    def validate(self) -> None:
        if self.hidden_act != "silu":
            raise NotImplementedError(f"hidden_act {self.hidden_act!r} (only silu is implemented)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.rotary_dim % 2:
            raise ValueError(f"rotary dim {self.rotary_dim} (head_dim * partial_rotary_factor) must be even")
        unknown = set(self.layer_types) - {LINEAR_ATTENTION, FULL_ATTENTION}
        if unknown:
            raise ValueError(f"unknown layer types {sorted(unknown)}")


def _layer_types(text: dict, num_layers: int) -> tuple[str, ...]:
    layer_types = text.get("layer_types")
    if layer_types is None:
        interval = text.get("full_attention_interval", 4)
        layer_types = [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers)]
    if len(layer_types) != num_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
    return tuple(layer_types)


def _reject_sparse_moe(text: dict) -> None:
    num_experts = text.get("num_experts", 0) or 0
    if num_experts <= 0:
        return
    mlp_only = set(text.get("mlp_only_layers") or [])
    step = text.get("decoder_sparse_step", 1) or 1
    sparse = [i for i in range(text.get("num_hidden_layers", 0)) if i not in mlp_only and (i + 1) % step == 0]
    if sparse:
        raise NotImplementedError(
            f"Qwen3-Next sparse-MoE layers ({len(sparse)} of them, num_experts={num_experts}) are not supported yet; "
            "only dense-MLP Qwen3-Next checkpoints run"
        )


@dataclass(frozen=True)
class RuntimeConfig:
    """Knobs of the runtime (README "Knobs"); ``validate`` names the bad field."""

    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_num_seqs: int = 256  # concurrent sequences (state slots)
    block_size: int = 16
    num_kv_blocks: int | None = None  # overrides the memory plan
    gpu_memory_utilization: float = 0.9
    state_dtype: torch.dtype = torch.float32
    max_num_batched_tokens: int = 8192  # the largest prefill step: sizes the activation peak of the memory plan
    enable_prefix_caching: bool = False
    prefix_snapshot_interval: int = 512  # tokens between linear-state snapshots (multiple of block_size and 64)
    num_prefix_snapshots: int = 64  # snapshot pool size (each holds one sequence's state of every linear layer)
    attention_backend: str = "triton"  # or "flash_attn" where installed (block_size a multiple of 256)

    def validate(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if not isinstance(self.block_size, int) or self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2 (block 0 is reserved), got {self.num_kv_blocks}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.attention_backend not in ("triton", "flash_attn"):
            raise ValueError(f"attention_backend must be 'triton' or 'flash_attn', got {self.attention_backend!r}")
        if self.state_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"state_dtype must be float32 or bfloat16, got {self.state_dtype}")

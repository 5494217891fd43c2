"""Configuration: the model's (ModelConfig, one flat dataclass read from a checkpoint's ``config.json``) and the
runtime's knobs (RuntimeConfig, README "Knobs").

Accepted ``model_type``s:
  * ``qwen3_5_text``  (``Qwen3_5ForCausalLM``): text parameters at the top level;
  * ``qwen3_5``       (``Qwen3_5ForConditionalGeneration``): text parameters nested under ``text_config``;
  * ``qwen3_5_moe_text`` (``Qwen3_5MoeForCausalLM``): as qwen3_5_text, a sparse MoE in every layer;
  * ``qwen3_5_moe``   (``Qwen3_5MoeForConditionalGeneration``, the released Qwen3.5-MoE repositories): text
    parameters nested under ``text_config``, a sparse MoE in every layer;
  * ``qwen3_next``    (``Qwen3NextForCausalLM``): a sparse MoE in layer i when ``num_experts > 0``, i is not in
    ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``; a dense MLP elsewhere.

MoE fields follow HF transformers' modeling files: ``num_experts``, ``num_experts_per_tok`` (top-k),
``moe_intermediate_size`` (each expert), ``shared_expert_intermediate_size``, ``norm_topk_prob`` (renormalise the
top-k softmax weights; Qwen3.5-MoE always does, whatever its config says). Absent Qwen3-Next MoE fields take HF's
defaults (512 experts, top-10, 512 wide, decoder_sparse_step 1, norm_topk_prob true); a Qwen3.5-MoE config without
``intermediate_size`` (it has no dense MLP) gets 0 there.

A ``config.json`` that is not JSON, is not an object, lacks a required field or gives one the wrong type or an
out-of-range value raises ``ValueError`` naming the file and the field (sizes are ints >= 1, bools are not ints,
``rms_norm_eps`` and ``rope_theta`` are finite numbers > 0, ``partial_rotary_factor`` is in (0, 1]).
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass, field, replace

import torch

SUPPORTED_MODEL_TYPES = ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next")
NESTED_TEXT_CONFIG = ("qwen3_5", "qwen3_5_moe")  # the vision-language layouts: text parameters under text_config
QWEN3_5_MOE = ("qwen3_5_moe_text", "qwen3_5_moe")  # every layer sparse; top-k weights always renormalised
# HF Qwen3NextConfig's defaults for MoE fields a config.json leaves out.
QWEN3_NEXT_MOE_DEFAULTS = dict(num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
                               shared_expert_intermediate_size=512, decoder_sparse_step=1, norm_topk_prob=True)
LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
SSM_DTYPES = ("float32", "bfloat16", "float16")  # config.json's mamba_ssm_dtype


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
    # sparse mixture of experts (0 experts: every layer dense)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: tuple[int, ...] = ()  # the layers whose MLP is the sparse MoE block
    mamba_ssm_dtype: str = "float32"  # the recurrent state's dtype the checkpoint asks for (Qwen3.5: float32)
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
    def state_dtype(self) -> torch.dtype:
        """The recurrent state pool's dtype by default (``RuntimeConfig.state_dtype`` None): ``mamba_ssm_dtype``.
        float16, which the state kernels do not take, runs as float32 (more precise than asked, never less)."""
        return torch.bfloat16 if self.mamba_ssm_dtype == "bfloat16" else torch.float32

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
        try:
            with open(config_file) as f:
                raw = json.load(f)
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"{config_file!r} is not valid JSON: {error}") from error
        try:
            return cls.from_dict(raw)
        except ValueError as error:  # name the file as well as the field
            raise ValueError(f"{config_file!r}: {error}") from error

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        if not isinstance(raw, dict):
            raise ValueError(f"config.json must hold a JSON object, got {type(raw).__name__}")
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}: compiled_engine runs {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        text = raw.get("text_config") or {} if model_type in NESTED_TEXT_CONFIG else raw
        if model_type in NESTED_TEXT_CONFIG and (not isinstance(text, dict) or not text):
            raise ValueError(f"a {model_type} config must nest its text parameters under 'text_config' (an object)")

        def size(key: str, default=None, required: bool = True) -> int:
            """An int >= 1 (JSON has no other integer): a bool, float, string or null is a wrong type."""
            if key not in text and (required or default is None):
                raise ValueError(f"config.json of a {model_type} model lacks {key!r}")
            value = text.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config field {key!r} must be an int >= 1, got {value!r}")
            return value

        def positive(key: str, value, upper: float = math.inf) -> float:
            bad_type = isinstance(value, bool) or not isinstance(value, numbers.Real)
            if bad_type or not (0 < value <= upper and math.isfinite(value)):
                bound = "> 0" if upper == math.inf else f"in (0, {upper}]"
                raise ValueError(f"config field {key!r} must be a finite number {bound}, got {value!r}")
            return float(value)

        num_layers = size("num_hidden_layers")
        layer_types = _layer_types(text, num_layers)
        rope = text.get("rope_parameters") or raw.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise ValueError(f"config field 'rope_parameters' must be an object, got {rope!r}")
        rope_theta = positive("rope_theta", rope.get("rope_theta", text.get("rope_theta", 10000.0)))
        partial_rotary = positive(
            "partial_rotary_factor", rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)), 1.0
        )
        hidden = size("hidden_size")
        heads = size("num_attention_heads")
        eos = text.get("eos_token_id", raw.get("eos_token_id"))
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in eos_ids):
            raise ValueError(f"config field 'eos_token_id' must be an int >= 0 or a list of them, got {eos!r}")
        tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        if not isinstance(tie, bool):
            raise ValueError(f"config field 'tie_word_embeddings' must be true or false, got {tie!r}")
        eps = positive("rms_norm_eps", text.get("rms_norm_eps", 1e-6), 1.0)
        hidden_act = text.get("hidden_act", "silu")
        if not isinstance(hidden_act, str):
            raise ValueError(f"config field 'hidden_act' must be a string, got {hidden_act!r}")
        ssm_dtype = text.get("mamba_ssm_dtype", "float32")
        if ssm_dtype not in SSM_DTYPES:
            raise ValueError(f"config field 'mamba_ssm_dtype' must be one of {SSM_DTYPES}, got {ssm_dtype!r}")
        moe = _moe_fields(model_type, text, num_layers, size)
        dense_needed = len(moe.get("moe_layers", ())) < num_layers
        intermediate = size("intermediate_size") if dense_needed or "intermediate_size" in text else 0
        config = cls(
            model_type=model_type,
            vocab_size=size("vocab_size"),
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=num_layers,
            layer_types=layer_types,
            rms_norm_eps=eps,
            tie_word_embeddings=tie,
            num_attention_heads=heads,
            num_key_value_heads=size("num_key_value_heads", heads, required=False),
            head_dim=size("head_dim") if text.get("head_dim") is not None else hidden // heads,
            rope_theta=rope_theta,
            partial_rotary_factor=partial_rotary,
            linear_num_key_heads=size("linear_num_key_heads"),
            linear_num_value_heads=size("linear_num_value_heads"),
            linear_key_head_dim=size("linear_key_head_dim"),
            linear_value_head_dim=size("linear_value_head_dim"),
            linear_conv_kernel_dim=size("linear_conv_kernel_dim", 4, required=False),
            max_position_embeddings=size("max_position_embeddings", 32768, required=False),
            eos_token_ids=eos_ids,
            hidden_act=hidden_act,
            mamba_ssm_dtype=ssm_dtype,
            **moe,
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
        if self.moe_layers and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, num_experts={self.num_experts}], "
                             f"got {self.num_experts_per_tok}")


def _layer_types(text: dict, num_layers: int) -> tuple[str, ...]:
    layer_types = text.get("layer_types")
    if layer_types is None:
        interval = text.get("full_attention_interval", 4)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"config field 'full_attention_interval' must be an int >= 1, got {interval!r}")
        layer_types = [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers)]
    if not isinstance(layer_types, (list, tuple)) or not all(isinstance(t, str) for t in layer_types):
        raise ValueError(f"config field 'layer_types' must be a list of strings, got {layer_types!r}")
    if len(layer_types) != num_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
    return tuple(layer_types)


def _moe_fields(model_type: str, text: dict, num_layers: int, size) -> dict:
    """The MoE fields of ModelConfig, and which layers are sparse (HF's decoder-layer rule for each family)."""
    defaults = QWEN3_NEXT_MOE_DEFAULTS if model_type == "qwen3_next" else {}
    if model_type not in QWEN3_5_MOE and model_type != "qwen3_next":
        return {}
    num_experts = text.get("num_experts", defaults.get("num_experts"))
    if num_experts == 0 and model_type == "qwen3_next":
        return {}  # a dense Qwen3-Next
    if model_type in QWEN3_5_MOE:
        sparse = tuple(range(num_layers))
        renormalise = True  # Qwen3_5MoeTopKRouter renormalises unconditionally
    else:
        step = text.get("decoder_sparse_step", defaults["decoder_sparse_step"])
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"config field 'decoder_sparse_step' must be an int >= 1, got {step!r}")
        mlp_only = text.get("mlp_only_layers") or []
        if not isinstance(mlp_only, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int)
                                                           for i in mlp_only):
            raise ValueError(f"config field 'mlp_only_layers' must be a list of layer indices, got {mlp_only!r}")
        sparse = tuple(i for i in range(num_layers) if i not in set(mlp_only) and (i + 1) % step == 0)
        renormalise = text.get("norm_topk_prob", defaults["norm_topk_prob"])
        if not isinstance(renormalise, bool):
            raise ValueError(f"config field 'norm_topk_prob' must be true or false, got {renormalise!r}")
    if not sparse:
        return {}
    keys = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
    return dict(
        {key: size(key, defaults.get(key), required=key not in defaults) for key in keys},
        norm_topk_prob=renormalise,
        moe_layers=sparse,
    )


SPECULATIVE_METHODS = ("mtp",)
MAX_SPECULATIVE_TOKENS = 4


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM's ``speculative_config``): ``method`` "mtp" drafts with the checkpoint's own
    multi-token-prediction layer (compiled_engine/mtp.py), ``num_speculative_tokens`` k in 1..4 tokens a step;
    ``disable_by_batch_size`` (vLLM's name): a step with more decoding sequences than that decodes them plainly (no
    drafts), where verifying k+1 tokens a sequence stops paying (bench/spec.py measures where).
    ``draft_vocab_size`` N: drafts are the argmax over the first N token ids only (a byte-level BPE vocabulary numbers
    its tokens in merge order, frequent ones first), so a draft reads N rows of the lm_head instead of all of them
    (SGLang's hot-token map, FR-Spec, as an id prefix). Lossless: the target still verifies over the whole vocabulary;
    only drafts of rarer tokens are lost. None: the whole vocabulary.
    ``auto_disable``: drafting turns itself off while it does not pay, judged from the engine's own measurements
    (the wall time of its verify rounds and plain steps, and the drafts accepted), and probes again now and then
    (compiled_engine/drafting_rule.py). Outputs do not change with it; which steps draft then follows timing.
    ``scripted_drafts``: a table on the device where a caller fixes a request's drafts by position
    (``LLMEngine.draft_script``), in place of the MTP layer's (which still runs): the forced-acceptance drafter of
    tests and bench/spec.py, whose rounds chain as the layer's do. One rank only."""

    method: str = "mtp"
    num_speculative_tokens: int = 1
    disable_by_batch_size: int | None = None
    draft_vocab_size: int | None = None
    auto_disable: bool = False
    scripted_drafts: bool = False

    @classmethod
    def parse(cls, value) -> "SpeculativeConfig | None":
        """None (off), a SpeculativeConfig, or vLLM's dict ``{"method": "mtp", "num_speculative_tokens": k}``;
        anything else, an unknown key, a method other than "mtp" or k outside 1..4 raise ValueError."""
        if value is None or isinstance(value, cls):
            config = value
        elif isinstance(value, dict):
            known = ("method", "num_speculative_tokens", "disable_by_batch_size", "draft_vocab_size", "auto_disable",
                     "scripted_drafts")
            unknown = sorted(set(value) - set(known))
            if unknown:
                raise ValueError(f"speculative_config has unknown key(s) {unknown}; known: {', '.join(known)}")
            config = cls(value.get("method", "mtp"), value.get("num_speculative_tokens", 1),
                         value.get("disable_by_batch_size"), value.get("draft_vocab_size"),
                         value.get("auto_disable", False), value.get("scripted_drafts", False))
        else:
            raise ValueError(f"speculative_config must be a dict or None, got {value!r}")
        if config is None:
            return None
        if config.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config method must be one of {SPECULATIVE_METHODS}, got {config.method!r}")
        k = config.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError("speculative_config num_speculative_tokens must be an int in "
                             f"1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")
        limit = config.disable_by_batch_size
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1):
            raise ValueError(f"speculative_config disable_by_batch_size must be an int >= 1 or None, got {limit!r}")
        vocab = config.draft_vocab_size
        if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, numbers.Integral) or vocab < 1):
            raise ValueError(f"speculative_config draft_vocab_size must be an int >= 1 or None, got {vocab!r}")
        for knob in ("auto_disable", "scripted_drafts"):
            if not isinstance(getattr(config, knob), bool):
                raise ValueError(f"speculative_config {knob} must be a bool, got {getattr(config, knob)!r}")
        return cls(config.method, int(k), None if limit is None else int(limit), None if vocab is None else int(vocab),
                   config.auto_disable, config.scripted_drafts)


@dataclass(frozen=True)
class RuntimeConfig:
    """Knobs of the runtime (README "Knobs"); ``validate`` names the bad field."""

    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_num_seqs: int = 256  # concurrent sequences (state slots)
    block_size: int = 16
    num_kv_blocks: int | None = None  # overrides the memory plan
    gpu_memory_utilization: float = 0.9
    state_dtype: torch.dtype | None = None  # recurrent state pool; default: the checkpoint's (ModelConfig.state_dtype)
    max_num_batched_tokens: int = 8192  # the largest prefill step: sizes the activation peak of the memory plan
    enable_prefix_caching: bool = False
    prefix_snapshot_interval: int = 512  # tokens between linear-state snapshots (multiple of block_size and 64)
    num_prefix_snapshots: int = 64  # snapshot pool size (each holds one sequence's state of every linear layer)
    attention_backend: str = "triton"  # or "flash_attn" where installed (block_size a multiple of 256)
    # The largest prompt step (in tokens, and in sequences: prompts together, a mixed step's decode rows) replayed
    # from a captured CUDA graph (graphs/prefill_graph.py) when the runtime compiles; 0 tokens: every prompt step
    # runs eagerly. Sequences past max_num_seqs are never captured.
    max_prefill_capture_tokens: int = 8192
    max_prefill_capture_seqs: int = 256
    # A mixed step's decode rows (its leading one-token sequences), up to this many, run through the linear layers'
    # decode kernels, the prompt chunks beside them through the chunked path (StepInputs.decode_rows). The captured
    # mixed steps hold this many decode rows (one key per token bucket and prompt-sequence bucket of up to 4), and
    # LLMEngine runs more decode rows as a decode step of their own. 0: decode rows take the chunked path as a
    # prompt's tokens do, in the keys of their step's sequences (and past ~15 of them, a decode step of their own).
    mixed_decode_lanes: int = 16
    # Speculative decoding with the checkpoint's MTP layer: None (off), {"method": "mtp", "num_speculative_tokens": k}
    # or a SpeculativeConfig; validate() makes it a SpeculativeConfig (or None).
    speculative_config: SpeculativeConfig | dict | None = None

    def validate(self) -> None:
        """Raise ValueError naming the first bad option.

        Types first (vLLM's rule for ints): an int option takes any ``numbers.Integral`` (Python or numpy ints,
        normalised here to ``int``) but not a bool, float or string; ``gpu_memory_utilization`` any finite real;
        ``enable_prefix_caching`` a bool only (not ``"true"``/``1``); ``attention_backend`` a string;
        ``state_dtype`` a ``torch.dtype`` or None. Then ranges.
        """
        for name in ("max_num_seqs", "block_size", "max_num_batched_tokens", "prefix_snapshot_interval",
                     "num_prefix_snapshots", "max_model_len", "num_kv_blocks", "max_prefill_capture_tokens",
                     "max_prefill_capture_seqs", "mixed_decode_lanes"):
            value = getattr(self, name)
            if value is None and name in ("max_model_len", "num_kv_blocks"):
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
            object.__setattr__(self, name, int(value))  # a numpy int becomes a Python int (frozen dataclass)
        gpu = self.gpu_memory_utilization
        if isinstance(gpu, bool) or not isinstance(gpu, numbers.Real) or not math.isfinite(gpu):
            raise ValueError(f"gpu_memory_utilization must be a finite number, got {gpu!r} ({type(gpu).__name__})")
        object.__setattr__(self, "gpu_memory_utilization", float(gpu))
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        if not isinstance(self.attention_backend, str):
            raise ValueError(f"attention_backend must be a string, got {self.attention_backend!r}")
        if self.state_dtype is not None and not isinstance(self.state_dtype, torch.dtype):
            raise ValueError(f"state_dtype must be a torch.dtype (float32 or bfloat16), got {self.state_dtype!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2 (block 0 is reserved), got {self.num_kv_blocks}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_prefill_capture_tokens < 0:
            raise ValueError(f"max_prefill_capture_tokens must be >= 0, got {self.max_prefill_capture_tokens}")
        if self.max_prefill_capture_seqs < 1:
            raise ValueError(f"max_prefill_capture_seqs must be >= 1, got {self.max_prefill_capture_seqs}")
        if self.mixed_decode_lanes < 0:
            raise ValueError(f"mixed_decode_lanes must be >= 0, got {self.mixed_decode_lanes}")
        if self.attention_backend not in ("triton", "flash_attn"):
            raise ValueError(f"attention_backend must be 'triton' or 'flash_attn', got {self.attention_backend!r}")
        if self.state_dtype not in (None, torch.float32, torch.bfloat16):
            raise ValueError(f"state_dtype must be float32 or bfloat16, got {self.state_dtype}")
        object.__setattr__(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))

    def for_model(self, model: ModelConfig) -> RuntimeConfig:
        """These knobs with the defaults that come from the checkpoint filled in: ``state_dtype``."""
        return self if self.state_dtype is not None else replace(self, state_dtype=model.state_dtype)

"""Tiny random HF transformers models: the correctness oracle of the engine tests.

Each builder creates a model with transformers itself, re-draws its weights so that every block matters, saves it
with ``save_pretrained`` (float32) and returns the folder. ``load_hf`` loads such a folder back as the oracle.

Why re-draw: HF initialises the zero-centred RMSNorm weights to 0 (so ``1 + w`` is the identity), the gated norm
to 1 and linears with std 0.02, which makes whole blocks nearly invisible — a runtime that dropped them would
still match the oracle. Here (docs/ARCHITECTURE.md, "Testing"):

* zero-centred norms (input/post-attention/final, q_norm/k_norm): ``w ~ N(0, 0.1)``
* gated norm of the linear layer (``linear_attn.norm``, not zero-centred): ``w ~ 1 + N(0, 0.1)``
* linears: ``N(0, 1/fan_in)``, except the residual writers (o_proj, out_proj, down_proj): ``N(0, 9/fan_in)``
  (see RESIDUAL_GAIN: otherwise tied-embedding models just echo their input token);
  biases (vision tower only): ``N(0, 0.01)``
* embeddings: ``N(0, 1)``; the depthwise conv1d: ``N(0, 1/kernel)``
* sparse MoE (tests of compiled_engine/moe.py): the experts' fused ``gate_up_proj`` ``N(0, 1/H)``, ``down_proj``
  ``N(0, 9/I)`` as the other residual writers; the router ``N(0, 4/H)``, so that routing differs from token to
  token and the top-k is rarely near a tie;
* ``A_log = log(U(0.1, 2))``, ``dt_bias ~ N(0, 0.5)``: decays between ~0.3 and ~1 per token, so the recurrent
  state carries over many tokens and the decay still matters.

FLA is hidden from transformers (``sys.modules["fla"] = None``) while it imports its Qwen3.5 / Qwen3-Next modules
(``hide_fla``): otherwise transformers binds FLA's Triton kernels, which cannot run on the CPU.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import torch

SEED = 1234

# Shapes shared by every variant (the small cousins of the Qwen3.5-0.8B shape).
HIDDEN = 64
INTERMEDIATE = 128
NUM_HEADS = 4  # full attention: query heads
NUM_KV_HEADS = 2  # GQA
HEAD_DIM = 32
LINEAR_KEY_HEADS = 2
LINEAR_VALUE_HEADS = 4  # 2 x key heads
LINEAR_KEY_DIM = 16  # != value head dim
LINEAR_VALUE_DIM = 32
CONV_KERNEL = 4
FULL_ATTENTION_INTERVAL = 4
RMS_EPS = 1e-6


# --------------------------------------------------------------------------------------------------------------
# Hiding FLA
# --------------------------------------------------------------------------------------------------------------

_MODELING_MODULES = (
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_next.modeling_qwen3_next",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
)
_HIDDEN_PACKAGES = ("fla", "causal_conv1d")  # GPU-only kernel packages transformers would bind if importable
_KERNEL_FUNCTIONS = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)


def _is_hidden_package(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in _HIDDEN_PACKAGES)


def bound_kernels(module_name: str) -> dict[str, str]:
    """``{function: module of the implementation transformers bound}`` for one imported modeling module."""
    module = sys.modules[module_name]
    bound = {}
    for fn in _KERNEL_FUNCTIONS:
        wrapper = getattr(module, fn)
        if not hasattr(wrapper, "__code__"):  # transformers >= 5.25 (the `kernels` package): a module calling it
            wrapper = _closure(type(wrapper).forward)["func"]
        implementation = _closure(wrapper).get("implementation", wrapper)
        bound[fn] = implementation.__module__
    return bound


def _closure(fn) -> dict:
    """The values a function's closure captured, by name."""
    return {name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ())}


def hide_fla() -> None:
    """Import transformers' Qwen3.5 / Qwen3-Next modeling modules with FLA (and causal_conv1d) hidden.

    transformers picks its gated-delta-rule and conv kernels once, when these modules are imported: with
    ``sys.modules["fla"] = None`` it binds its own torch fallbacks, which run on the CPU (FLA's Triton kernels do
    not, and would crash on the CPU oracle even on a GPU host). FLA is hidden only during that import and put back
    afterwards, so that our own ops can still import FLA for their CUDA kernels.
    """
    already = [m for m in _MODELING_MODULES if m in sys.modules]
    for name in already:
        wrong = {fn: mod for fn, mod in bound_kernels(name).items() if _is_hidden_package(mod)}
        if wrong:
            raise RuntimeError(
                f"{name} was imported before tests.hf_models and bound GPU kernels {wrong}; import tests.hf_models "
                "(tests/conftest.py does) before anything imports transformers' Qwen3.5 / Qwen3-Next models"
            )
    saved = {name: mod for name, mod in sys.modules.items() if _is_hidden_package(name)}
    for name in saved:
        del sys.modules[name]
    for package in _HIDDEN_PACKAGES:
        sys.modules[package] = None  # type: ignore[assignment]  # "import fla" now raises ImportError
    try:
        for name in _MODELING_MODULES:
            importlib.import_module(name)
    finally:
        for name in [n for n in sys.modules if _is_hidden_package(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


hide_fla()

import transformers  # noqa: E402  (after hide_fla)
from safetensors.torch import load_file, save_file  # noqa: E402
from torch import nn  # noqa: E402

transformers.logging.set_verbosity_error()  # the "falling back to torch" warnings are expected here
transformers.logging.disable_progress_bar()


# --------------------------------------------------------------------------------------------------------------
# Weight re-draw
# --------------------------------------------------------------------------------------------------------------


# The projections that write into the residual stream get std GAIN/sqrt(fan_in) instead of 1/sqrt(fan_in). With
# N(0, 1) embeddings and a TIED lm_head, blocks at gain 1 add too little to the residual and the model mostly
# predicts its own input token (60-90% of positions); at gain 3 that drops to ~5% and every block matters.
RESIDUAL_GAIN = 3.0
_RESIDUAL_WRITERS = ("self_attn.o_proj", "linear_attn.out_proj", "mlp.down_proj", "mlp.shared_expert.down_proj")


def _is_zero_centred_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return name.endswith("RMSNorm") and "Gated" not in name and "Vision" not in name


def _is_gated_norm(module: nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNormGated")


def _is_experts(module: nn.Module) -> bool:
    return type(module).__name__.endswith("Experts")


def _is_router(module: nn.Module) -> bool:
    return type(module).__name__.endswith("TopKRouter")


@torch.no_grad()
def redraw_weights(model: nn.Module, seed: int = SEED) -> None:
    """Re-draw every parameter deterministically so that no block is (close to) the identity or zero.

    A parameter shared by two modules (tied embedding / lm_head) is drawn once, by the first module that owns it
    (the embedding: N(0, 1)).
    """
    gen = torch.Generator().manual_seed(seed)
    done: set[int] = set()

    def draw(p: torch.Tensor, std: float, mean: float = 0.0) -> None:
        if id(p) not in done:
            p.copy_(torch.randn(p.shape, generator=gen) * std + mean)
            done.add(id(p))

    for module_name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            draw(module.weight, 1.0)
        elif isinstance(module, nn.Linear):
            gain = RESIDUAL_GAIN if module_name.endswith(_RESIDUAL_WRITERS) and "visual" not in module_name else 1.0
            draw(module.weight, gain * module.in_features**-0.5)
        elif isinstance(module, (nn.Conv1d, nn.Conv3d)):  # depthwise conv [C, 1, W]; vision patch embedding
            draw(module.weight, module.weight[0].numel() ** -0.5)
        elif _is_gated_norm(module) or isinstance(module, nn.LayerNorm):
            draw(module.weight, 0.1, mean=1.0)
        elif _is_zero_centred_norm(module):
            draw(module.weight, 0.1)
        elif _is_experts(module):  # [E, 2I, H] and [E, H, I]
            draw(module.gate_up_proj, module.gate_up_proj.shape[-1] ** -0.5)
            draw(module.down_proj, RESIDUAL_GAIN * module.down_proj.shape[-1] ** -0.5)
        elif _is_router(module):
            draw(module.weight, 2 * module.weight.shape[-1] ** -0.5)
        for name, p in module.named_parameters(recurse=False):
            if id(p) in done:
                continue
            if name == "A_log":
                p.copy_(torch.empty(p.shape).uniform_(0.1, 2.0, generator=gen).log())
                done.add(id(p))
            elif name == "dt_bias":
                draw(p, 0.5)
            elif name == "bias":
                draw(p, 0.01)
            else:  # anything else: small noise
                draw(p, 0.1)


# --------------------------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------------------------


def _rope(theta: float, partial: float) -> dict:
    half = int(HEAD_DIM * partial) // 2  # rotary frequencies
    section = [half - 2 * (half // 3), half // 3, half // 3]  # interleaved M-RoPE sections, sum == half
    return {
        "rope_type": "default",
        "rope_theta": theta,
        "partial_rotary_factor": partial,
        "mrope_interleaved": True,
        "mrope_section": section,
    }


def _common_text_kwargs(*, vocab_size: int, num_layers: int) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=num_layers,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        linear_conv_kernel_dim=CONV_KERNEL,
        linear_key_head_dim=LINEAR_KEY_DIM,
        linear_value_head_dim=LINEAR_VALUE_DIM,
        linear_num_key_heads=LINEAR_KEY_HEADS,
        linear_num_value_heads=LINEAR_VALUE_HEADS,
        full_attention_interval=FULL_ATTENTION_INTERVAL,
        rms_norm_eps=RMS_EPS,
        max_position_embeddings=4096,
        hidden_act="silu",
        attention_bias=False,
        bos_token_id=None,
        eos_token_id=None,  # never stop early: generate() always produces max_new_tokens
        pad_token_id=0,
    )


QWEN3_5_TEXT_VOCAB = 320
QWEN3_5_TEXT_LAYERS = 8  # full attention at layers 3 and 7
QWEN3_5_TEXT_ROPE = _rope(theta=1e7, partial=0.25)  # rotary dim 8 of 32

QWEN3_5_VL_VOCAB = 384
QWEN3_5_VL_LAYERS = 4  # full attention at layer 3
QWEN3_5_VL_ROPE = _rope(theta=1e6, partial=0.25)
# The VL config keeps transformers' default image/video/vision-start/end token ids (248053..248057): they lie
# outside this tiny vocabulary, so no prompt or generated token is ever taken for an image placeholder.

QWEN3_NEXT_VOCAB = 512
QWEN3_NEXT_LAYERS = 8  # full attention at layers 3 and 7
QWEN3_NEXT_ROPE = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}  # rotary dim 16 of 32

# Extra tensors a real Qwen3.5 checkpoint carries (the multi-token-prediction head); the loader must skip them.
MTP_TENSORS = {
    "mtp.fc.weight": (HIDDEN, 2 * HIDDEN),
    "mtp.pre_fc_norm_embedding.weight": (HIDDEN,),
    "mtp.pre_fc_norm_hidden.weight": (HIDDEN,),
    "mtp.layers.0.input_layernorm.weight": (HIDDEN,),
    "mtp.layers.0.self_attn.q_proj.weight": (2 * NUM_HEADS * HEAD_DIM, HIDDEN),
    "mtp.layers.0.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
    "mtp.norm.weight": (HIDDEN,),
}


def qwen3_5_text_config(tied: bool) -> transformers.Qwen3_5TextConfig:
    return transformers.Qwen3_5TextConfig(
        **_common_text_kwargs(vocab_size=QWEN3_5_TEXT_VOCAB, num_layers=QWEN3_5_TEXT_LAYERS),
        rope_parameters=dict(QWEN3_5_TEXT_ROPE),
        tie_word_embeddings=tied,
        dtype="float32",
    )


def qwen3_5_conditional_config() -> transformers.Qwen3_5Config:
    text = _common_text_kwargs(vocab_size=QWEN3_5_VL_VOCAB, num_layers=QWEN3_5_VL_LAYERS)
    text["rope_parameters"] = dict(QWEN3_5_VL_ROPE)
    text["tie_word_embeddings"] = True
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        in_channels=3,
        patch_size=4,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=HIDDEN,
        num_position_embeddings=16,
    )
    return transformers.Qwen3_5Config(
        text_config=text,
        vision_config=vision,
        tie_word_embeddings=True,  # as Qwen3.5-0.8B: no lm_head.weight in the checkpoint
        dtype="float32",
    )


def qwen3_next_dense_config() -> transformers.Qwen3NextConfig:
    return transformers.Qwen3NextConfig(
        **_common_text_kwargs(vocab_size=QWEN3_NEXT_VOCAB, num_layers=QWEN3_NEXT_LAYERS),
        rope_parameters=dict(QWEN3_NEXT_ROPE),
        num_experts=0,  # dense MLP in every layer
        mlp_only_layers=list(range(QWEN3_NEXT_LAYERS)),
        tie_word_embeddings=False,
        dtype="float32",
    )


# Sparse MoE variants: 8 experts, a shared expert, expert widths != the dense MLP's.
NUM_EXPERTS = 8
MOE_INTERMEDIATE = 48
SHARED_EXPERT_INTERMEDIATE = 80

QWEN3_NEXT_MOE_VOCAB = 448
QWEN3_NEXT_MOE_LAYERS = 4  # full attention at layer 3; layer 1 dense (mlp_only_layers)
QWEN3_5_MOE_VOCAB = 416
QWEN3_5_MOE_LAYERS = 4  # full attention at layer 3; every layer sparse


def _moe_kwargs(top_k: int) -> dict:
    return dict(num_experts=NUM_EXPERTS, num_experts_per_tok=top_k, moe_intermediate_size=MOE_INTERMEDIATE,
                shared_expert_intermediate_size=SHARED_EXPERT_INTERMEDIATE)


def qwen3_next_moe_config() -> transformers.Qwen3NextConfig:
    """Qwen3-Next with a sparse MoE in layers 0, 2, 3 (top-2, NOT renormalised) and a dense MLP in layer 1."""
    return transformers.Qwen3NextConfig(
        **_common_text_kwargs(vocab_size=QWEN3_NEXT_MOE_VOCAB, num_layers=QWEN3_NEXT_MOE_LAYERS),
        rope_parameters=dict(QWEN3_NEXT_ROPE),
        **_moe_kwargs(top_k=2),
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=False,
        tie_word_embeddings=False,
        dtype="float32",
    )


def qwen3_5_moe_text_config() -> transformers.Qwen3_5MoeTextConfig:
    """Qwen3.5-MoE text-only: a sparse MoE (top-3, renormalised) in every layer; no dense MLP."""
    text = _common_text_kwargs(vocab_size=QWEN3_5_MOE_VOCAB, num_layers=QWEN3_5_MOE_LAYERS)
    del text["intermediate_size"]
    return transformers.Qwen3_5MoeTextConfig(
        **text, rope_parameters=dict(QWEN3_5_TEXT_ROPE), **_moe_kwargs(top_k=3), tie_word_embeddings=False,
        dtype="float32",
    )


def qwen3_5_moe_conditional_config() -> transformers.Qwen3_5MoeConfig:
    """The released Qwen3.5-MoE layout: ``Qwen3_5MoeForConditionalGeneration``, text_config nested, untied."""
    text = qwen3_5_moe_text_config().to_dict()
    vision = qwen3_5_conditional_config().vision_config.to_dict()
    return transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False,
                                         dtype="float32")


# --------------------------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------------------------


def _build(model_cls, config, folder: Path, seed: int, max_shard_size: str | None = None) -> Path:
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    redraw_weights(model, seed)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.generation_config.do_sample = False
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **kwargs)
    return folder


def _folder(folder: str | os.PathLike | None, name: str) -> Path:
    return Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix=f"{name}-"))


def qwen3_5_text(tied: bool, folder: str | os.PathLike | None = None) -> Path:
    """``Qwen3_5ForCausalLM`` (text-only layout, keys ``model.layers.N...``), tied or own ``lm_head.weight``."""
    return _build(
        transformers.Qwen3_5ForCausalLM, qwen3_5_text_config(tied), _folder(folder, "qwen3_5_text"), SEED + int(tied)
    )


def qwen3_5_conditional(folder: str | os.PathLike | None = None) -> Path:
    """``Qwen3_5ForConditionalGeneration`` as the real Qwen3.5 repositories ship it.

    Config ``qwen3_5`` with ``text_config`` nested; keys ``model.language_model.*`` and ``model.visual.*``
    (a one-block vision tower), tied embeddings, saved SHARDED (``model.safetensors.index.json`` + several
    ``model-0000i-of-0000n.safetensors``), plus an extra shard ``model-mtp.safetensors`` holding fake ``mtp.*``
    tensors, listed in the index's weight_map as real checkpoints do.
    """
    folder = _build(
        transformers.Qwen3_5ForConditionalGeneration, qwen3_5_conditional_config(), _folder(folder, "qwen3_5_vl"),
        SEED + 2,
        max_shard_size="100KB",
    )
    gen = torch.Generator().manual_seed(SEED + 3)
    mtp = {name: torch.randn(shape, generator=gen) * 0.1 for name, shape in MTP_TENSORS.items()}
    mtp_file = "model-mtp.safetensors"
    save_file(mtp, str(folder / mtp_file), metadata={"format": "pt"})
    index_path = folder / "model.safetensors.index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
    else:  # a single file: turn it into an index so the mtp shard is part of the checkpoint
        keys = load_file(folder / "model.safetensors")
        index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in keys}}
    index["weight_map"].update({name: mtp_file for name in mtp})
    index.setdefault("metadata", {})["total_size"] = int(index.get("metadata", {}).get("total_size", 0)) + sum(
        t.numel() * t.element_size() for t in mtp.values()
    )
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True))
    return folder


def qwen3_next_dense(folder: str | os.PathLike | None = None) -> Path:
    """``Qwen3NextForCausalLM`` with a dense MLP in every layer (``in_proj_qkvz`` / ``in_proj_ba`` layout)."""
    return _build(
        transformers.Qwen3NextForCausalLM, qwen3_next_dense_config(), _folder(folder, "qwen3_next"), SEED + 4
    )


def qwen3_next_moe(folder: str | os.PathLike | None = None) -> Path:
    """``Qwen3NextForCausalLM`` with sparse MoE layers, saved as HF writes it: one tensor per expert and projection
    (``mlp.experts.N.gate_proj.weight``...)."""
    return _build(transformers.Qwen3NextForCausalLM, qwen3_next_moe_config(), _folder(folder, "qwen3_next_moe"),
                  SEED + 5)


def qwen3_5_moe_text(folder: str | os.PathLike | None = None) -> Path:
    """``Qwen3_5MoeForCausalLM``, saved with the fused 3-D expert tensors (``mlp.experts.gate_up_proj``)."""
    return _build(transformers.Qwen3_5MoeForCausalLM, qwen3_5_moe_text_config(), _folder(folder, "qwen3_5_moe_text"),
                  SEED + 6)


def qwen3_5_moe_conditional(folder: str | os.PathLike | None = None) -> Path:
    """``Qwen3_5MoeForConditionalGeneration`` (keys ``model.language_model.*``, ``model.visual.*``), sharded, its
    experts rewritten to the fused 3-D tensors the released Qwen3.5-MoE repositories hold (``fuse_experts``)."""
    folder = _build(transformers.Qwen3_5MoeForConditionalGeneration, qwen3_5_moe_conditional_config(),
                    _folder(folder, "qwen3_5_moe_vl"), SEED + 7, max_shard_size="200KB")
    fuse_experts(folder)
    return folder


def fuse_experts(folder: Path) -> None:
    """Rewrite a sharded checkpoint's per-expert tensors (``...mlp.experts.N.gate_proj|up_proj|down_proj.weight``)
    as ``...mlp.experts.gate_up_proj [E, 2I, H]`` (each expert's gate rows, then its up rows) and
    ``...mlp.experts.down_proj [E, H, I]``, in a shard of their own listed in the index."""
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    weight_map = index["weight_map"]
    per_expert: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
    for shard in sorted(set(weight_map.values())):
        tensors = load_file(folder / shard)
        kept = {}
        for name, tensor in tensors.items():
            head, sep, tail = name.partition(".mlp.experts.")
            if sep and tail.split(".")[0].isdigit():
                expert, proj, _ = tail.split(".")
                per_expert.setdefault(head + ".mlp.experts", {})[(int(expert), proj)] = tensor
                del weight_map[name]
            else:
                kept[name] = tensor
        save_file(kept, str(folder / shard), metadata={"format": "pt"})
    fused = {}
    for prefix, parts in per_expert.items():
        experts = range(1 + max(e for e, _ in parts))
        fused[prefix + ".gate_up_proj"] = torch.stack(
            [torch.cat([parts[(e, "gate_proj")], parts[(e, "up_proj")]]) for e in experts])
        fused[prefix + ".down_proj"] = torch.stack([parts[(e, "down_proj")] for e in experts])
    save_file(fused, str(folder / "model-experts.safetensors"), metadata={"format": "pt"})
    weight_map.update({name: "model-experts.safetensors" for name in fused})
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True))


# name -> builder(folder) -> folder. The conftest fixtures build each once per session.
BUILDERS = {
    "qwen3_5_text_tied": lambda folder=None: qwen3_5_text(True, folder),
    "qwen3_5_text_untied": lambda folder=None: qwen3_5_text(False, folder),
    "qwen3_5_conditional": qwen3_5_conditional,
    "qwen3_next_dense": qwen3_next_dense,
}
# The sparse-MoE variants (tests/test_moe_model.py), kept apart from BUILDERS: the dense suites run on those.
MOE_BUILDERS = {
    "qwen3_next_moe": qwen3_next_moe,
    "qwen3_5_moe_text": qwen3_5_moe_text,
    "qwen3_5_moe_conditional": qwen3_5_moe_conditional,
}


# --------------------------------------------------------------------------------------------------------------
# Oracle
# --------------------------------------------------------------------------------------------------------------


def load_hf(path: str | os.PathLike) -> transformers.PreTrainedModel:
    """The saved model, float32, eval mode, on the CPU (eager attention)."""
    config = transformers.AutoConfig.from_pretrained(path)
    conditional = {"qwen3_5": transformers.Qwen3_5ForConditionalGeneration,
                   "qwen3_5_moe": transformers.Qwen3_5MoeForConditionalGeneration}
    cls = conditional.get(config.model_type, transformers.AutoModelForCausalLM)
    # MoE models: HF's reference loop over the experts ("eager"), not its grouped-GEMM path.
    moe = getattr(config.get_text_config(), "num_experts", 0)
    extra = {"experts_implementation": "eager"} if moe else {}
    model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager", **extra)
    return model.eval()


def _as_batch(ids) -> torch.Tensor:
    ids = torch.as_tensor(ids, dtype=torch.long)
    return ids[None] if ids.dim() == 1 else ids


@torch.no_grad()
def hf_logits(model: transformers.PreTrainedModel, ids) -> torch.Tensor:
    """Teacher-forced logits of the full sequence, no cache: ``[L, vocab]`` for 1-D ids, ``[B, L, vocab]`` for 2-D.

    float32, or float64 for a model cast with ``.double()`` (an fp64 oracle keeps its precision).
    """
    batch = _as_batch(ids)
    logits = model(input_ids=batch, attention_mask=torch.ones_like(batch), use_cache=False).logits
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return logits[0] if torch.as_tensor(ids).dim() == 1 else logits


@torch.no_grad()
def hf_greedy(model: transformers.PreTrainedModel, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation via ``generate(do_sample=False)`` (with HF's cache: chunked prefill, recurrent decode).

    Returns only the ``max_new_tokens`` new tokens (EOS is disabled in these models, so there are exactly that many).
    """
    batch = _as_batch(list(prompt_ids))
    out = model.generate(
        input_ids=batch,
        attention_mask=torch.ones_like(batch),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        eos_token_id=None,
        pad_token_id=0,
        use_cache=True,
    )
    return out[0, batch.shape[1] :].tolist()


@torch.no_grad()
def hf_greedy_no_cache(
    model: transformers.PreTrainedModel, prompt_ids: Sequence[int], max_new_tokens: int
) -> list[int]:
    """Greedy continuation by argmax over full-sequence forward passes without any cache (slow; the oracle's check)."""
    ids = list(prompt_ids)
    new: list[int] = []
    for _ in range(max_new_tokens):
        token = int(hf_logits(model, ids)[-1].argmax())
        ids.append(token)
        new.append(token)
    return new

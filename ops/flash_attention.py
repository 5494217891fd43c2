"""Optional flash-attn backend for the paged attention ops (same contract as ops/paged_attention.py).

``ce::flash_paged_attention_decode`` / ``ce::flash_paged_attention_prefill`` have the schemas, fake kernels and CPU
references of the Triton-backed ops; only their CUDA kernels differ: flash-attn's ``flash_attn_with_kvcache`` and
``flash_attn_varlen_func`` over the same paged cache layout ``[num_blocks, block_size, kv_heads, head_dim]``.
The model picks them with ``attention_backend="flash_attn"`` (compiled_engine/attention.py). flash-attn has no wheel
in our registry, so this backend is used only where it is installed; flash-attn 2's paged KV needs a block size
that is a multiple of 256 and fp16/bf16 activations (checked by ``check_flash_attn_usable``).
"""

from __future__ import annotations

import importlib.util

import torch

from ops.library import define_op
from ops.paged_attention import (
    _paged_attention_decode_fake,
    _paged_attention_prefill_fake,
    paged_attention_decode_reference,
    paged_attention_prefill_reference,
)

FLASH_ATTN_BLOCK_MULTIPLE = 256  # flash-attn 2: paged KV blocks must be a multiple of 256 tokens


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def check_flash_attn_usable(device: torch.device, dtype: torch.dtype, block_size: int) -> None:
    """Raise a clear ValueError when the flash-attn backend cannot serve this configuration."""
    if not flash_attn_available():
        raise ValueError("attention_backend='flash_attn' needs the flash-attn package, which is not installed")
    if device.type != "cuda":
        raise ValueError("attention_backend='flash_attn' runs on CUDA devices only")
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"attention_backend='flash_attn' needs float16 or bfloat16, got {dtype}")
    if block_size % FLASH_ATTN_BLOCK_MULTIPLE:
        raise ValueError(
            f"attention_backend='flash_attn' needs block_size to be a multiple of {FLASH_ATTN_BLOCK_MULTIPLE}, "
            f"got {block_size}"
        )


def _flash_decode_cuda(q, k_cache, v_cache, block_tables, context_lens, scale):
    from flash_attn import flash_attn_with_kvcache

    out = flash_attn_with_kvcache(
        q.unsqueeze(1),  # [B, 1, Hq, D]
        k_cache,
        v_cache,
        cache_seqlens=context_lens,
        block_table=block_tables,
        softmax_scale=scale,
        causal=True,
    ).squeeze(1)
    # Padding lanes (context 0) return zeros by our contract, whatever flash-attn leaves there.
    return torch.where((context_lens > 0)[:, None, None], out, torch.zeros_like(out))


def _flash_prefill_cuda(q, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables, scale):
    from flash_attn import flash_attn_varlen_func

    cu_seqlens_k = torch.nn.functional.pad(context_lens.cumsum(0, dtype=torch.int32), (1, 0))
    q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    return flash_attn_varlen_func(
        q,
        k_cache,
        v_cache,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=int(q_lens.max()),  # host sync: prefill is not CUDA-graphed
        max_seqlen_k=int(context_lens.max()),
        softmax_scale=scale,
        causal=True,  # bottom-right aligned: new token i sees the prefix and new tokens up to i
        block_table=block_tables,
    )


flash_paged_attention_decode = define_op(
    "flash_paged_attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
    "Tensor context_lens, float scale) -> Tensor",
    reference=paged_attention_decode_reference,
    fake=_paged_attention_decode_fake,
    cuda=_flash_decode_cuda,
)

flash_paged_attention_prefill = define_op(
    "flash_paged_attention_prefill(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens_q, "
    "Tensor context_lens, Tensor block_tables, float scale) -> Tensor",
    reference=paged_attention_prefill_reference,
    fake=_paged_attention_prefill_fake,
    cuda=_flash_prefill_cuda,
)

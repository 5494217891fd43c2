"""The optional flash-attn attention backend: wiring and validation on CPU; kernels where flash-attn is installed."""

from __future__ import annotations

import pytest
import torch

from compiled_engine.config import ModelConfig
from compiled_engine.loader import load_model
from compiled_engine.runtime import Runtime, RuntimeConfig
from ops.flash_attention import FLASH_ATTN_BLOCK_MULTIPLE, flash_attn_available
from tests import hf_models


def test_unusable_flash_attn_is_a_clear_error(qwen3_5_text_untied_path):
    with pytest.raises(ValueError, match="flash"):
        Runtime.from_pretrained(str(qwen3_5_text_untied_path), device="cpu", attention_backend="flash_attn")
    with pytest.raises(ValueError, match="attention_backend"):
        Runtime.from_pretrained(str(qwen3_5_text_untied_path), device="cpu", attention_backend="sdpa")


def test_flash_backend_model_runs_the_flash_ops_and_matches_triton_backend(qwen3_5_text_untied_path):
    """The flash backend's model calls the flash ops (its attention's prefill op, unfused decode), and its prefill
    and decode logits equal HF's teacher-forced ones, as the triton backend's do (on CPU the two backends' ops run
    references, so the two are also equal to each other)."""
    path = str(qwen3_5_text_untied_path)
    config = ModelConfig.from_pretrained(path)
    ids = list(range(1, 40)) + [5, 6, 7]
    oracle = hf_models.hf_logits(hf_models.load_hf(path), ids)[38:]  # after the prompt, then after each new token
    logits = {}
    for backend in ("triton", "flash_attn"):
        model, _ = load_model(path, config, torch.device("cpu"), torch.float32, attention_backend=backend)
        attn = model.layers[config.full_attention_layers[0]].self_attn
        assert ("flash" in attn.prefill_op._qualified_op_name) == (backend == "flash_attn")
        assert attn.fused_decode == (backend == "triton")  # flash-attn decodes with its kernel, unfused
        rt = Runtime(model, RuntimeConfig(max_model_len=128, max_num_seqs=2), torch.device("cpu"), torch.float32)
        seq = rt.add_sequence(list(range(1, 40)))
        rows = [rt.prefill([seq])]
        for token in (5, 6, 7):
            seq.token_ids.append(token)
            rows.append(rt.decode_step([seq]))
        logits[backend] = torch.cat(rows)
        torch.testing.assert_close(logits[backend], oracle.float(), atol=2e-4, rtol=0)
    assert torch.equal(logits["triton"], logits["flash_attn"])


@pytest.mark.gpu
@pytest.mark.quick  # the only check of the flash ops' CUDA kernels (prebuilt: nothing to compile)
@pytest.mark.skipif(not flash_attn_available(), reason="flash-attn is not installed")
@pytest.mark.parametrize("head_dim", [128, 256])
def test_flash_ops_match_the_reference_on_cuda(head_dim):
    from ops.paged_attention import paged_attention_decode_reference, paged_attention_prefill_reference

    g = torch.Generator(device="cuda").manual_seed(0)
    block, blocks, hq, hkv = FLASH_ATTN_BLOCK_MULTIPLE, 12, 8, 2
    k_cache = torch.randn(blocks, block, hkv, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    v_cache = torch.randn(blocks, block, hkv, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    tables = torch.tensor([[3, 7, 1, 0], [5, 2, 9, 11], [0, 0, 0, 0]], dtype=torch.int32, device="cuda")
    lens = torch.tensor([600, 1000, 0], dtype=torch.int32, device="cuda")
    scale = head_dim**-0.5
    q = torch.randn(3, hq, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    got = torch.ops.ce.flash_paged_attention_decode(q, k_cache, v_cache, tables, lens, scale)
    want = paged_attention_decode_reference(q, k_cache, v_cache, tables, lens, scale)
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)  # and each element (one row or head off shows)
    assert torch.equal(got[2], torch.zeros_like(got[2]))  # padding lane
    cu = torch.tensor([0, 40, 100], dtype=torch.int32, device="cuda")
    q = torch.randn(100, hq, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    got = torch.ops.ce.flash_paged_attention_prefill(q, k_cache, v_cache, cu, lens[:2], tables[:2], scale)
    want = paged_attention_prefill_reference(q, k_cache, v_cache, cu, lens[:2], tables[:2], scale)
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)

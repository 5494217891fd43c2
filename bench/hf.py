"""The same requests through HF transformers ``generate``: the baseline every ``--vs-hf`` ratio divides by.

The model is ``AutoModelForCausalLM`` from the same folder, dtype and device. On a GPU transformers binds FLA's
kernels when FLA is importable; on the CPU FLA is hidden first (bench.common.hide_fla) and HF runs its torch paths.
Generation is greedy with EOS disabled, so every row runs exactly ``max_new_tokens`` steps (ignore_eos). Batches
are padded on the left; only each request's own output length counts as useful tokens.
"""

from __future__ import annotations

import importlib.util
import sys
import time

import torch

PAD_TOKEN_ID = 0


def load_hf(path: str, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    model.generation_config.eos_token_id = None  # ignore_eos
    model.generation_config.pad_token_id = PAD_TOKEN_ID
    return model


def random_hf(path: str, device: torch.device, dtype: torch.dtype):
    """HF's model of a config-only folder (bench.models ``DEVICE_RANDOM_MODELS``), built on ``device`` with HF's own
    random initialisation: the weights' values do not change its speed. HF's default experts implementation."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id = None  # ignore_eos
    model.generation_config.pad_token_id = PAD_TOKEN_ID
    return model


def hf_kernels() -> dict:
    """Which optional kernel packages transformers could bind (a None in sys.modules means hidden)."""

    def visible(name: str) -> bool:
        if name in sys.modules:
            return sys.modules[name] is not None
        return importlib.util.find_spec(name) is not None

    return {"fla": visible("fla"), "causal_conv1d": visible("causal_conv1d")}


def pad_left(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD_TOKEN_ID, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


@torch.inference_mode()
def hf_generate(
    model, prompts: list[list[int]], max_new_tokens: int, max_time: float | None = None
) -> tuple[float, int]:
    """One padded batch through ``generate``: (seconds, new tokens generated per row). Synchronised timing."""
    device = model.device
    ids, mask = pad_left(prompts, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=PAD_TOKEN_ID,
        max_time=max_time,
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out.shape[1] - ids.shape[1]


def hf_decode_rate(model, prompts: list[list[int]], new_tokens: int) -> dict:
    """TTFT and decode tok/s of one unpadded batch, from ONE ``generate`` call with per-step timestamps.

    A logits processor synchronises and stamps the time at every generation step: stamp 0 comes right after the
    prefill forward, stamp i after the i-th decode forward. TTFT = stamp 0 - start; decode tok/s =
    batch x (new_tokens - 1) / (last stamp - stamp 0). HF already synchronises every step (its stopping check), so
    the stamps add no stall of their own.
    """
    from transformers import LogitsProcessor, LogitsProcessorList

    if len({len(p) for p in prompts}) != 1:
        raise ValueError("hf_decode_rate needs prompts of one length (no padding)")
    if new_tokens < 2:
        raise ValueError("hf_decode_rate needs new_tokens >= 2")
    device = model.device

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    class StepClock(LogitsProcessor):
        def __init__(self):
            self.stamps: list[float] = []

        def __call__(self, input_ids, scores):
            sync()
            self.stamps.append(time.perf_counter())
            return scores

    clock = StepClock()
    ids = torch.tensor(prompts, dtype=torch.long, device=device)
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=PAD_TOKEN_ID,
            logits_processor=LogitsProcessorList([clock]),
        )
    sync()
    if out.shape[1] - ids.shape[1] != new_tokens or len(clock.stamps) != new_tokens:
        raise RuntimeError(f"HF generated {out.shape[1] - ids.shape[1]} tokens ({len(clock.stamps)} steps stamped), "
                           f"expected {new_tokens}")
    steps = new_tokens - 1
    decode_s = clock.stamps[-1] - clock.stamps[0]
    step_s = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
    return {
        "batch": len(prompts),
        "prompt_len": len(prompts[0]),
        "decode_steps": steps,
        "ttft_ms": (clock.stamps[0] - start) * 1e3,
        "ms_per_step": decode_s / steps * 1e3,
        "ms_per_step_p50": sorted(step_s)[len(step_s) // 2] * 1e3,
        "decode_tok_s": len(prompts) * steps / decode_s,
        "method": "one generate call; synchronised timestamps at every step from a logits processor",
    }


def hf_useful_throughput(
    model,
    prompts: list[list[int]],
    output_lens: list[int],
    batch_size: int,
    max_time: float | None = None,
    sort_by_output: bool = True,
) -> dict:
    """Requests through HF in pad-left batches; tok/s counts only each request's own output length.

    Each batch runs ``max(output_lens in the batch)`` steps (HF has no per-row stop in this mode). With
    ``sort_by_output`` the requests are grouped by output length first (less wasted work: favours HF). A batch is not
    started once ``max_time`` seconds have been spent, and a running batch is cut there by HF's ``max_time``; a
    cut batch counts ``min(own length, steps run)`` useful tokens per request and is flagged ``truncated``.
    """
    order = list(range(len(prompts)))
    if sort_by_output:
        order.sort(key=lambda i: -output_lens[i])
    batches, spent = [], 0.0
    for start in range(0, len(order), batch_size):
        if max_time is not None and spent >= max_time:
            break
        idx = order[start : start + batch_size]
        steps = max(output_lens[i] for i in idx)
        seconds, ran = hf_generate(
            model, [prompts[i] for i in idx], steps, None if max_time is None else max(max_time - spent, 1.0)
        )
        spent += seconds
        useful = sum(min(output_lens[i], ran) for i in idx)
        batches.append(
            {
                "requests": idx,
                "size": len(idx),
                "padded_prompt_len": max(len(prompts[i]) for i in idx),
                "max_new_tokens": steps,
                "steps_run": ran,
                "useful_tokens": useful,
                "computed_tokens": ran * len(idx),
                "seconds": seconds,
                "truncated": ran < steps,
            }
        )
    useful = sum(b["useful_tokens"] for b in batches)
    return {
        "requests_run": sum(b["size"] for b in batches),
        "useful_output_tokens": useful,
        "computed_output_tokens": sum(b["computed_tokens"] for b in batches),
        "seconds": spent,
        "useful_output_tok_s": useful / spent if spent else None,
        "truncated": any(b["truncated"] for b in batches),
        "batch_size": batch_size,
        "sorted_by_output_len": sort_by_output,
        "batches": batches,
    }

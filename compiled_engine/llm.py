"""LLM: vLLM-style offline generation.

    llm = LLM("path/to/checkpoint")                  # or LLM() for the embedded tiny default model
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(temperature=0, max_tokens=32))
    outs[0].text, outs[0].token_ids
    llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=32))   # the checkpoint's chat template

Request flow (docs/ARCHITECTURE.md, "A step's data flow"): LLM.generate -> LLMEngine.add_request / step ->
Scheduler.schedule -> Runtime.prefill or Runtime.decode -> ModelExecutor.execute -> HybridModel.forward, or the
compiled graphs.DecodeGraphRunner -> torch.ops.ce.* kernels -> sampler.sample.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable
from typing import Sequence as Seq

import numpy as np
import torch
from tqdm.auto import tqdm

from compiled_engine.chat import render_chat_text
from compiled_engine.engine import LLMEngine
from compiled_engine.memory_plan import default_max_num_batched_tokens
from compiled_engine.outputs import RequestOutput
from compiled_engine.runtime import Runtime, resolve_device
from compiled_engine.tiny_model import ensure_tiny_model
from compiled_engine.sampling_params import RequestOutputKind, SamplingParams, as_token_id

logger = logging.getLogger(__name__)

# vLLM's prompt forms: text, token ids, or a TextPrompt / TokensPrompt dict.
Prompt = str | Seq[int] | dict
PROMPT_FORMS = "a string, a list of token ids, {'prompt': str} or {'prompt_token_ids': [ids]}"


def is_single_prompt(prompts) -> bool:
    """Whether ``generate``'s argument is one prompt rather than a list of them."""
    if isinstance(prompts, (str, dict)):
        return True
    if isinstance(prompts, (np.ndarray, torch.Tensor)):
        return prompts.ndim == 1
    return isinstance(prompts, (list, tuple)) and bool(prompts) and all(as_token_id(t) is not None for t in prompts)


def prompt_text(prompt: Prompt) -> str | None:
    """A prompt's text where it was given as text (a string or ``{'prompt': str}``), else None: vLLM's
    ``RequestOutput.prompt``."""
    if isinstance(prompt, dict):
        prompt = prompt.get("prompt")
    return prompt if isinstance(prompt, str) else None


def load_tokenizer(path: str):
    """The checkpoint's HF tokenizer, or None when the folder has none (prompts must then be token ids)."""
    if not any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class LLM:
    def __init__(
        self,
        model: str | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        enforce_eager: bool | None = None,
        tensor_parallel_size: int = 1,
        max_num_batched_tokens: int | None = None,
        overlap_decode: bool = True,
        mixed_steps: bool = True,
        kv_growth_reserve: float = 1.0,
        **runtime_config,
    ):
        """``model``: a checkpoint folder; None builds (or reuses) the embedded tiny Qwen3.5-architecture model.

        ``enforce_eager``: skip torch.compile and CUDA graphs. Default: compiled on CUDA, eager on CPU.
        ``tensor_parallel_size``: shard the model over that many processes / GPUs (``close()`` stops them).
        ``max_num_batched_tokens``: the token budget of a prefill step; default 16,384 on a GPU of 70 GiB or more,
        8,192 elsewhere (vLLM's LLM-class rule: memory_plan.default_max_num_batched_tokens).
        ``overlap_decode``: the host schedules and packs the next step while the GPU runs this one
        (LLMEngine._step_overlapped); outputs are unchanged. On by default (bench/NOTES.md, "Overlapped steps").
        ``mixed_steps``: decode rows ride in prefill steps, decode first (compiled_engine/scheduler.py); off: prefill
        steps go first and decoding sequences wait for them.
        ``kv_growth_reserve``: the share of the running sequences' growth (to prompt + max_tokens) that admission
        keeps free in the KV cache: 1 admits nothing that would later be preempted for blocks, 0 counts only the
        admission's own step.
        ``runtime_config``: max_model_len, max_num_seqs, block_size, num_kv_blocks, gpu_memory_utilization,
        state_dtype (see README "Knobs"); ``weights``, a ``loader.WeightSource`` that makes the checkpoint's tensors
        instead of reading them (Runtime.from_pretrained).
        """
        if model is None:
            model = ensure_tiny_model()
        if not os.path.isdir(model):
            raise FileNotFoundError(f"model folder {model!r} does not exist (no downloads: pass a local checkpoint)")
        if max_num_batched_tokens is None:
            max_num_batched_tokens = default_max_num_batched_tokens(resolve_device(device))
        if enforce_eager is None:
            enforce_eager = resolve_device(device).type != "cuda"
        self.runtime = Runtime.from_pretrained(
            model,
            device=device,
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            compile=not enforce_eager,
            progress=True,
            max_num_batched_tokens=max_num_batched_tokens,
            **runtime_config,
        )
        self.tokenizer = load_tokenizer(model)
        self.engine = LLMEngine(
            self.runtime, self.tokenizer, max_num_batched_tokens=max_num_batched_tokens, overlap_decode=overlap_decode,
            mixed_steps=mixed_steps, kv_growth_reserve=kv_growth_reserve, progress=True,
        )

    def get_tokenizer(self):
        """The checkpoint's tokenizer (HF transformers'), as vLLM's ``LLM.get_tokenizer``; None for a model folder
        without one (prompts are then token ids)."""
        return self.tokenizer

    def close(self) -> None:
        """Stop tensor-parallel workers, if any."""
        self.runtime.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One finished RequestOutput per prompt, in prompt order.

        ``SamplingParams.n`` > 1: the prompt's n completions run as n requests (``params.for_completion(j)``: with a
        seed, completion j draws with seed + j, vLLM's rule) and come back as one RequestOutput, whose ``outputs``
        lists them in index order and whose own fields are completion 0's.

        Ownership: generate drives the engine alone. It raises RuntimeError, queuing nothing, when the engine holds
        requests it did not add (``llm.engine.add_request`` by the caller): its loop would step them too and consume
        their outputs, which would never reach the engine's caller. Finish or abort those first (or drive
        ``llm.engine`` yourself). vLLM's LLM class has the same rule in effect: its ``_run_engine`` steps every
        request and returns only its own.

        An interrupted call (KeyboardInterrupt, a failed step) leaves nothing queued: as the engine held only this
        call's requests, every request still in it is aborted, and the next call starts from a clean engine.
        """
        pending = list(self.engine.requests)
        if pending:
            shown = ", ".join(repr(r) for r in pending[:8]) + (", ..." if len(pending) > 8 else "")
            raise RuntimeError(f"LLM.generate needs an idle engine, but it has {len(pending)} request(s) added "
                               f"through llm.engine.add_request: {shown}; finish or abort them first")
        prompts = self._normalise_prompts(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, Iterable) and not isinstance(sampling_params, (str, bytes, dict)):
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        else:
            params = [sampling_params]
        bad = [p for p in params if not isinstance(p, SamplingParams)]
        if bad:
            raise ValueError(f"sampling_params must be a SamplingParams or a list of them, got {type(bad[0]).__name__}")
        # Checked copies (dataclasses.replace runs SamplingParams.validate): fields set after construction (n = 0, a
        # string seed) fail here, naming the field, before any is used; the caller's objects are left as they are.
        copies = {id(p): dataclasses.replace(p) for p in params}
        params = [copies[id(p)] for p in params]
        # A prompt's completions are consecutive requests: completion j of prompt i is request starts[i] + j.
        token_lists = [self._encode(p, i) for i, p in enumerate(prompts)]
        starts, requests = [], []
        for tokens, p in zip(token_lists, params):
            starts.append(len(requests))
            requests += [(tokens, p.for_completion(j)) for j in range(p.n)]
        checked = [self.engine.validate_request(tokens, p) for tokens, p in requests]
        # Only finished outputs are collected here, so the engine need not build per-step outputs for these requests.
        ids: list[str] = []
        results: dict[str, RequestOutput] = {}
        try:
            for tokens, p in checked:
                ids.append(self.engine.add_request(
                    None, tokens, dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY)))
            with tqdm(total=len(ids), desc="generating", unit="req", disable=not use_tqdm) as bar:
                while len(results) < len(ids):
                    for out in self.engine.step():
                        if out.finished:  # every request in the engine is this call's
                            results[out.request_id] = out
                            bar.update(1)
        except BaseException:
            # Every request in the engine is this call's (checked above), including one whose add_request was cut
            # short after it registered: abort them all, or the next call would refuse to run.
            self._abort_all()
            raise
        outputs = []
        for prompt, start, p in zip(prompts, starts, params):
            out = results[ids[start]]
            out.more_outputs = [results[ids[start + j]].completion(j) for j in range(1, p.n)]
            out.prompt = prompt_text(prompt)
            outputs.append(out)
        return outputs

    def chat(
        self,
        messages: list[dict] | Seq[list[dict]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """vLLM's ``LLM.chat``: one conversation (a list of ``{"role", "content"}`` messages; content a string or
        OpenAI's text parts) or a list of them, each rendered by the checkpoint's chat template
        (compiled_engine/chat.py; ``chat_template_kwargs`` go to the template, e.g. ``{"enable_thinking": False}``)
        and generated as ``generate`` does: one finished RequestOutput per conversation, in order."""
        if not isinstance(messages, (list, tuple)):
            raise ValueError(f"messages must be a conversation (a list of {{'role', 'content'}} dicts) or a list of "
                             f"conversations, got {type(messages).__name__}")
        if messages and isinstance(messages[0], dict):
            conversations = [messages]
        else:
            conversations = list(messages)
        if not conversations:
            raise ValueError("no conversations given")
        # The rendered text is the prompt (generate encodes it as render_chat would), so outputs carry it (vLLM's).
        prompts = [render_chat_text(self.tokenizer, conversation, add_generation_prompt=add_generation_prompt,
                                    chat_template_kwargs=chat_template_kwargs) for conversation in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _abort_all(self) -> None:
        """Abort every request in the engine (abort_request is idempotent; a request may finish meanwhile)."""
        for request_id in list(self.engine.requests):
            if request_id in self.engine.requests:
                self.engine.abort_request(request_id)

    def _normalise_prompts(self, prompts) -> list[Prompt]:
        if is_single_prompt(prompts):
            return [prompts]
        if not isinstance(prompts, Iterable) or isinstance(prompts, (bytes, bytearray)):
            raise ValueError(f"prompts must be {PROMPT_FORMS}, or a list of these; got {type(prompts).__name__}")
        prompts = list(prompts)
        if not prompts:
            raise ValueError("no prompts given")
        return prompts

    def _encode(self, prompt: Prompt, index: int = 0) -> list[int]:
        """Prompt ``index``'s token ids (their types and range are the engine's to check)."""
        if isinstance(prompt, dict):
            keys = set(prompt)
            if keys not in ({"prompt"}, {"prompt_token_ids"}):
                raise ValueError(f"prompt {index}: a prompt dict takes one key, 'prompt' or 'prompt_token_ids', got "
                                 f"{sorted(keys)}")
            prompt = prompt.get("prompt", prompt.get("prompt_token_ids"))
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model folder has no tokenizer: pass prompts as lists of token ids")
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        if isinstance(prompt, (list, tuple)) or (isinstance(prompt, (np.ndarray, torch.Tensor)) and prompt.ndim == 1):
            return list(prompt)
        hint = " (one prompt's token ids must all be ints)" if as_token_id(prompt) is not None else ""
        raise ValueError(f"prompt {index} must be {PROMPT_FORMS}, got {type(prompt).__name__}{hint}")

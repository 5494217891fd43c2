"""The OpenAI-compatible server, live on 127.0.0.1 (CPU, the embedded tiny default model), driven by the official
``openai`` client and raw HTTP.

Oracles: solo ``LLM.generate`` runs of each prompt on a separate engine (greedy tokens, their text through the
tokenizer, their logprobs), the tokenizer's chat template for chat prompts, Python's ``str.find`` for stop strings,
and the engine's own cache allocators for leaks. The server runs in a background thread of this process (so the
tests can read its engine and inject a failing step); the SIGTERM test starts ``python -m compiled_engine serve``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from hypothesis import given
from hypothesis import strategies as st

from compiled_engine import LLM, SamplingParams, StructuredOutputsParams
from compiled_engine.server import TINY_MODEL_NAME, build_server
from compiled_engine.tiny_model import ensure_tiny_model
from tests.test_engine import heavy_settings

ROOT = Path(__file__).resolve().parents[1]
MODEL = TINY_MODEL_NAME
MAX_MODEL_LEN = 256
# Prefix caching on, with snapshots every 64 tokens: shared-prefix prompts hit it. Fewer slots than clients, so
# requests wait for admission.
KNOBS = dict(device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=8, num_kv_blocks=160,
             enable_prefix_caching=True, prefix_snapshot_interval=64, num_prefix_snapshots=4)
GREEDY = dict(temperature=0.0, ignore_eos=True)
NO_EOS = {"ignore_eos": True, "return_token_ids": True}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """``build_server`` under uvicorn in a background thread."""

    def __init__(self, **knobs):
        self.server = build_server(None, **knobs)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.uvicorn = uvicorn.Server(uvicorn.Config(self.server.app, host="127.0.0.1", port=self.port,
                                                     log_level="warning"))
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.uvicorn.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=60)

    @property
    def engine(self):
        return self.server.llm.engine

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.base + "/metrics").text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_idle(self, timeout: float = 30) -> dict[str, float]:
        """The metrics once no request is running or waiting and nothing holds a block or slot (or fail)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            busy = [k for k in ("ce:num_requests_running", "ce:num_requests_waiting", "ce:kv_blocks_used",
                                "ce:state_slots_used") if m[k]]
            if not busy:
                return m
            assert time.monotonic() < deadline, f"still busy after {timeout} s: {[(k, m[k]) for k in busy]}"
            time.sleep(0.05)

    def assert_nothing_leaked(self) -> None:
        """Every block, slot and snapshot row is free or (the prefix cache's) reusable; the engine and the server
        hold no request."""
        self.wait_idle()
        engine = self.engine
        caches = engine.runtime.caches
        assert not engine.requests and not self.server.llm._streams
        assert caches.num_free_slots == caches.slots.num_slots - 1
        assert caches.num_free_blocks == caches.blocks.num_blocks - 1
        assert all(count == 0 for count in caches.blocks.refcount)
        prefix = caches.prefix_cache
        rows = sorted(prefix.free_rows + list(prefix.row_of_hash.values()))
        assert rows == list(range(KNOBS["num_prefix_snapshots"]))

    def close(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def live() -> LiveServer:
    server = LiveServer(**KNOBS)
    yield server
    server.close()


@pytest.fixture(scope="module")
def solo_llm() -> LLM:
    """The oracle: a separate engine without prefix caching, one prompt per generate call."""
    return LLM(ensure_tiny_model(), device="cpu", enforce_eager=True, max_model_len=MAX_MODEL_LEN, max_num_seqs=2,
               overlap_decode=False)


def solo(llm: LLM, prompt, max_tokens: int, **params):
    return llm.generate(prompt, SamplingParams(max_tokens=max_tokens, **dict(GREEDY, **params)), use_tqdm=False)[0]


def text_of(tokenizer, token_ids: list[int]) -> str:
    """The oracle text: one decode of all the ids (EOS, a special token, renders as nothing)."""
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def prompts_for_clients(n: int, seed: int = 0) -> list[str]:
    """ASCII prompts, some sharing a 70-character prefix (past the 64-token snapshot boundary)."""
    rng = random.Random(seed)
    shared = "".join(rng.choice("abcdefghij klmnop") for _ in range(70))
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    out = []
    for i in range(n):
        tail = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 6)))
        out.append(shared + tail if i % 3 == 0 else tail)
    return out


# --------------------------------------------------------------------------------------------------------------
# The openai client: outputs equal solo runs
# --------------------------------------------------------------------------------------------------------------


def test_models_and_health(live):
    assert httpx.get(live.base + "/health").status_code == 200
    assert [m.id for m in live.client.models.list().data] == [MODEL]


def test_completions_equal_solo_greedy_runs(live, solo_llm):
    tokenizer = live.server.tokenizer
    prompts = ["Hello world", "The quick brown fox"]
    expected = [solo(solo_llm, p, 12) for p in prompts]
    # not streamed, two prompts in one request: one choice each
    r = live.client.completions.create(model=MODEL, prompt=prompts, max_tokens=12, temperature=0, extra_body=NO_EOS)
    assert [c.index for c in r.choices] == [0, 1]
    for choice, exp in zip(r.choices, expected):
        assert choice.token_ids == exp.token_ids
        assert choice.text == text_of(tokenizer, exp.token_ids) and choice.finish_reason == "length"
    prompt_tokens = sum(len(tokenizer.encode(p)) for p in prompts)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (prompt_tokens, 24)
    # streamed, token ids as the prompt
    ids = tokenizer.encode(prompts[1])
    stream = live.client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body=NO_EOS)
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    tokens = [t for c in chunks if c.choices for t in c.choices[0].token_ids]
    assert tokens == expected[1].token_ids and text == text_of(tokenizer, expected[1].token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == len(ids)
    # echo: the prompt's text before the output, streamed (as the first chunk) or not; token-id prompts in a list
    ids_a, ids_b = tokenizer.encode(prompts[0]), ids
    r = live.client.completions.create(model=MODEL, prompt=[ids_a, ids_b], max_tokens=12, temperature=0, echo=True,
                                       extra_body=NO_EOS)
    assert [c.text for c in r.choices] == [p + text_of(tokenizer, e.token_ids) for p, e in zip(prompts, expected)]
    stream = live.client.completions.create(model=MODEL, prompt=prompts, max_tokens=12, temperature=0, echo=True,
                                            stream=True, extra_body=NO_EOS)
    texts = ["", ""]
    for c in stream:
        texts[c.choices[0].index] += c.choices[0].text
    assert texts == [p + text_of(tokenizer, e.token_ids) for p, e in zip(prompts, expected)]


def test_chat_equals_solo_greedy_runs(live, solo_llm):
    tokenizer = live.server.tokenizer
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    expected = solo(solo_llm, prompt, 10)
    r = live.client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=10, temperature=0,
                                            extra_body=NO_EOS)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == text_of(tokenizer, expected.token_ids)
    assert r.choices[0].token_ids == expected.token_ids and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), 10)
    stream = live.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text_of(tokenizer, expected.token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.total_tokens == len(prompt) + 10


def test_penalties_and_logit_bias_reach_the_engine(live, solo_llm):
    """OpenAI's presence and frequency penalties, vLLM's repetition penalty and OpenAI's logit_bias: the choice equals
    the solo run with them (the engine's are checked against HF's logits in tests/test_penalties.py), which differs
    from the run without them."""
    prompt, penalties = [166, 32, 97, 113, 122, 72], dict(presence_penalty=1.5, frequency_penalty=1.0)
    expected = solo(solo_llm, prompt, 16, repetition_penalty=1.3, **penalties)
    assert expected.token_ids != solo(solo_llm, prompt, 16).token_ids
    r = live.client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, **penalties,
                                       extra_body=dict(NO_EOS, repetition_penalty=1.3))
    assert r.choices[0].token_ids == expected.token_ids

    # OpenAI's logit_bias (token ids as strings): +100 makes token 42 the argmax at every step
    r = live.client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0,
                                       logit_bias={"42": 100, "7": -5}, extra_body=NO_EOS)
    assert r.choices[0].token_ids == [42] * 5 == solo(solo_llm, prompt, 5, logit_bias={42: 100, 7: -5}).token_ids


def echo_oracle(tokenizer, solo_llm, text: str, max_tokens: int, k: int) -> tuple[list[str], list[float | None]]:
    """The tokens and token_logprobs of an echoed completion with logprobs k: the prompt's tokens (the first with a
    null logprob) then the generated ones, from a solo run's prompt and output logprobs (the engine's are checked
    against HF's log-softmax in tests/test_llm_api.py and tests/test_stop_logprobs.py)."""
    ids = tokenizer.encode(text)
    out = solo(solo_llm, ids, max_tokens, logprobs=k, prompt_logprobs=k)
    tokens = [text_of(tokenizer, [t]) for t in ids + out.token_ids]
    return tokens, [None] + [e.logprob for e in out.prompt_logprobs[1:]] + [e.logprob for e in out.logprobs]


def test_echo_with_logprobs_gives_the_prompts_logprobs(live, solo_llm):
    """vLLM's ``echo`` with ``logprobs``: the prompt's tokens and their logprobs before the output's, streamed (the
    prompt's in the first chunk of the choice) or not."""
    tokenizer = live.server.tokenizer
    text = "Hello world, once more"
    tokens, logprobs = echo_oracle(tokenizer, solo_llm, text, 5, 2)
    r = live.client.completions.create(model=MODEL, prompt=text, max_tokens=5, temperature=0, echo=True, logprobs=2,
                                       extra_body=NO_EOS)
    got = r.choices[0].logprobs
    assert got.tokens == tokens and got.token_logprobs[0] is None and got.top_logprobs[0] is None
    assert got.token_logprobs[1:] == pytest.approx(logprobs[1:], abs=1e-4)
    assert all(tokens[i] in got.top_logprobs[i] for i in range(1, len(tokens)))  # each top has its chosen token
    assert r.choices[0].text.startswith(text)
    stream = live.client.completions.create(model=MODEL, prompt=text, max_tokens=5, temperature=0, echo=True,
                                            logprobs=2, stream=True, extra_body=NO_EOS)
    chunks = [c for c in stream if c.choices]
    assert chunks[0].choices[0].text == text and chunks[0].choices[0].logprobs.tokens == tokens[: -5]
    streamed = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(logprobs[1:], abs=1e-4)


def test_vllm_text_options_reach_the_engine(live, solo_llm):
    """vLLM's ``include_stop_str_in_output`` (the text ends after the stop string found in a solo run's text),
    ``skip_special_tokens`` off (EOS forced by a logit bias shows as the tokenizer's text), ``allowed_token_ids`` and
    ``bad_words`` (the engine's checked against HF's logits in tests/test_penalties.py and tests/test_bad_words.py)."""
    tokenizer = live.server.tokenizer
    text = solo(solo_llm, "Hello world", 20).text
    stop = next(text[i : i + 2] for i in range(2, len(text) - 1) if text[i : i + 2].strip() and text[i] != text[i + 1])
    r = live.client.completions.create(model=MODEL, prompt="Hello world", max_tokens=20, temperature=0, stop=[stop],
                                       extra_body=dict(NO_EOS, include_stop_str_in_output=True))
    assert r.choices[0].text == text[: text.find(stop) + len(stop)] and r.choices[0].stop_reason == stop
    eos = tokenizer.eos_token_id
    r = live.client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0,
                                       logit_bias={str(eos): 100},
                                       extra_body=dict(NO_EOS, skip_special_tokens=False))
    assert r.choices[0].token_ids == [eos, eos] and r.choices[0].text == tokenizer.eos_token * 2
    ids = tokenizer.encode("Hello world, this is a longer prompt")  # vLLM's truncate_prompt_tokens: its last 5 tokens
    r = live.client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0,
                                       extra_body=dict(NO_EOS, truncate_prompt_tokens=5))
    assert r.usage.prompt_tokens == 5 and r.choices[0].token_ids == solo(solo_llm, ids[-5:], 4).token_ids
    r = live.client.completions.create(model=MODEL, prompt="Hello world, this is a longer prompt", max_tokens=4,
                                       temperature=0, echo=True, extra_body=dict(NO_EOS, truncate_prompt_tokens=5))
    assert r.choices[0].text == text_of(tokenizer, ids[-5:] + r.choices[0].token_ids)  # the prompt it ran echoed
    allowed = [10, 20, 30]  # vLLM's allowed_token_ids: the solo run limited the same way
    r = live.client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0,
                                       extra_body=dict(NO_EOS, allowed_token_ids=allowed))
    assert set(r.choices[0].token_ids) <= set(allowed)
    assert r.choices[0].token_ids == solo(solo_llm, "Hello", 6, allowed_token_ids=allowed).token_ids
    # vLLM's bad_words: the solo run's first token (an ASCII byte after "()": a word alone) banned as a word
    plain = solo(solo_llm, [40, 41], 6).token_ids
    word = tokenizer.decode(plain[:1])
    assert tokenizer.encode(word, add_special_tokens=False) == plain[:1]
    r = live.client.completions.create(model=MODEL, prompt=[40, 41], max_tokens=6, temperature=0,
                                       extra_body=dict(NO_EOS, bad_words=[word]))
    assert r.choices[0].token_ids[0] != plain[0]
    assert r.choices[0].token_ids == solo(solo_llm, [40, 41], 6, bad_words=[word]).token_ids


def test_structured_outputs(live, solo_llm):
    """OpenAI's ``response_format`` (json_schema on chat, json_object) and vLLM's ``structured_outputs`` (a regex on
    completions): the text is an instance of the spec (``json.loads`` and the schema's keys; ``re.fullmatch``) and
    the solo run's with the same StructuredOutputsParams (the engine's checked against HF's logits in
    tests/test_structured_outputs.py)."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
              "required": ["ok", "n"], "additionalProperties": False}
    messages = [{"role": "user", "content": "json please"}]
    r = live.client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=60, temperature=0, extra_body={"return_token_ids": True},
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    value = json.loads(r.choices[0].message.content, strict=False)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and isinstance(value["n"], int)
    tokenizer = live.server.tokenizer
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    expected = solo(solo_llm, prompt, 60, ignore_eos=False, structured_outputs=StructuredOutputsParams(json=schema))
    assert r.choices[0].token_ids == expected.token_ids and r.choices[0].finish_reason == "stop"
    r = live.client.completions.create(model=MODEL, prompt="id:", max_tokens=20, temperature=0,
                                       extra_body={"structured_outputs": {"regex": "[A-Z]{3}-[0-9]{3}"},
                                                   "return_token_ids": True})
    assert re.fullmatch("[A-Z]{3}-[0-9]{3}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    expected = solo(solo_llm, tokenizer.encode("id:"), 20, ignore_eos=False,
                    structured_outputs=StructuredOutputsParams(regex="[A-Z]{3}-[0-9]{3}"))
    assert r.choices[0].token_ids == expected.token_ids
    r = live.client.completions.create(model=MODEL, prompt="obj:", max_tokens=16, temperature=0,
                                       extra_body={"response_format": {"type": "json_object"},
                                                   "return_token_ids": True})
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].text, strict=False), dict)
    expected = solo(solo_llm, tokenizer.encode("obj:"), 16, ignore_eos=False,
                    structured_outputs=StructuredOutputsParams(json_object=True))
    assert r.choices[0].token_ids == expected.token_ids


def test_chat_template_extensions_reach_the_template(live, solo_llm, monkeypatch):
    """vLLM's ``chat_template_kwargs`` and ``add_generation_prompt`` render the prompt as HF's template does with
    them (a template that prints a keyword, as Qwen3's reads ``enable_thinking``)."""
    tokenizer = live.server.tokenizer
    monkeypatch.setattr(tokenizer, "chat_template", "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                        "{% endfor %}{% if add_generation_prompt %}[{{ mood }}] assistant:{% endif %}")
    messages = [{"role": "user", "content": "hi there"}]
    for opened, mood in [(True, "terse"), (False, None)]:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=opened, tokenize=False, mood=mood)
        prompt = tokenizer.encode(text)
        r = live.client.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=4, temperature=0,
            extra_body=dict(NO_EOS, add_generation_prompt=opened, chat_template_kwargs={"mood": mood}))
        assert r.usage.prompt_tokens == len(prompt) and r.choices[0].token_ids == solo(solo_llm, prompt, 4).token_ids


def test_n_choices_equal_solo_runs_with_their_seeds(live, solo_llm):
    """n > 1: each prompt's n choices, prompt by prompt (OpenAI's order); with a seed, choice j of a prompt draws with
    seed + j (vLLM's rule), so each equals the solo run with that seed; greedy choices are all the greedy run. Usage
    counts each prompt once. Chat streams its n choices by index."""
    tokenizer = live.server.tokenizer
    prompts = ["Hello world", "The quick brown fox"]
    sampled = dict(temperature=0.9, top_k=50, seed=11)
    expected = [solo(solo_llm, p, 10, **dict(sampled, seed=11 + j)) for p in prompts for j in range(3)]
    assert len({tuple(e.token_ids) for e in expected[:3]}) > 1  # the seeds do draw different choices
    r = live.client.completions.create(model=MODEL, prompt=prompts, max_tokens=10, n=3, temperature=0.9, seed=11,
                                       extra_body=dict(NO_EOS, top_k=50))
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.token_ids for c in r.choices] == [e.token_ids for e in expected]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (sum(len(tokenizer.encode(p)) for p in prompts), 60)
    messages = [{"role": "user", "content": "hi there"}]
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    greedy = solo(solo_llm, prompt, 8)
    stream = live.client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=8, n=2,
                                                 temperature=0, stream=True, stream_options={"include_usage": True},
                                                 extra_body=NO_EOS)
    texts, roles = ["", ""], set()
    for c in stream:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.delta.role:
                roles.add((choice.index, choice.delta.role))
        if not c.choices:
            assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (len(prompt), 16)
    assert roles == {(0, "assistant"), (1, "assistant")}
    assert texts == [text_of(tokenizer, greedy.token_ids)] * 2
    live.assert_nothing_leaked()


def test_stop_strings_over_http(live, solo_llm):
    """A two-character stop string (two tokens of the byte-level tokenizer) ends the output where it starts, streamed
    or not; a stop token id ends it with that token."""
    tokenizer = live.server.tokenizer
    expected = solo(solo_llm, "Hello world", 40)
    text = text_of(tokenizer, expected.token_ids)
    at = next(i for i in range(1, len(text) - 1) if (text[i : i + 2]).isascii() and text[i : i + 2].isprintable())
    stop = text[at : at + 2]
    r = live.client.completions.create(model=MODEL, prompt="Hello world", max_tokens=40, temperature=0,
                                       stop=[stop, "\x01\x02"], extra_body=NO_EOS)
    choice = r.choices[0]
    assert (choice.text, choice.finish_reason, choice.stop_reason) == (text[: text.find(stop)], "stop", stop)
    assert choice.token_ids == expected.token_ids[: len(choice.token_ids)]
    stream = live.client.completions.create(model=MODEL, prompt="Hello world", max_tokens=40, temperature=0,
                                            stop=stop, stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == text[: text.find(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    # a stop token id: the token ids end with it, the text without its text (vLLM's default)
    token = expected.token_ids[5]
    r = live.client.completions.create(model=MODEL, prompt="Hello world", max_tokens=40, temperature=0,
                                       extra_body=dict(NO_EOS, stop_token_ids=[token]))
    first = expected.token_ids.index(token)
    assert r.choices[0].token_ids == expected.token_ids[: first + 1] and r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text_of(tokenizer, expected.token_ids[:first]) and r.choices[0].stop_reason == token


def test_logprobs_over_http(live, solo_llm):
    expected = solo(solo_llm, "Hello world", 6, logprobs=3)
    r = live.client.completions.create(model=MODEL, prompt="Hello world", max_tokens=6, temperature=0, logprobs=3,
                                       extra_body=NO_EOS)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == 6
    for got, exp in zip(lp.token_logprobs, expected.logprobs):
        assert got == pytest.approx(exp.logprob, abs=1e-4)
    tokenizer = live.server.tokenizer
    assert lp.tokens == [tokenizer.decode([t]) for t in expected.token_ids]
    for got, exp in zip(lp.top_logprobs, expected.logprobs):  # {token text: logprob}, the solo run's top 3
        texts = [tokenizer.decode([t]) for t, _ in exp.top]
        for text, (_, value) in zip(texts, exp.top):
            if texts.count(text) == 1:  # two ids with one text share a key
                assert got[text] == pytest.approx(value, abs=1e-4), text
    # each token's character offset: where its text starts in the concatenated token texts (no echo: from 0)
    texts = [tokenizer.decode([t]) for t in expected.token_ids]
    assert lp.text_offset == list(itertools.accumulate((len(t) for t in texts[:-1]), initial=0))
    messages = [{"role": "user", "content": "x"}]
    r = live.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0,
                                            logprobs=True, top_logprobs=2, extra_body=NO_EOS)
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    expected = solo(solo_llm, prompt, 4, logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == len(expected.logprobs) == 4
    for got, exp in zip(content, expected.logprobs):
        assert got.logprob == pytest.approx(exp.logprob, abs=1e-4)
        assert [t.logprob for t in got.top_logprobs] == pytest.approx([v for _, v in exp.top], abs=1e-4)
        assert [t.token for t in got.top_logprobs] == [tokenizer.decode([t]) for t, _ in exp.top]


def _stop_string(text: str, pick: int) -> str | None:
    """A printable ASCII 1-2 character string of ``text`` (where ``pick`` says), or None where it has none."""
    spots = [(i, n) for n in (1, 2) for i in range(len(text) - n + 1)
             if text[i : i + n].isascii() and text[i : i + n].isprintable()]
    if not spots:
        return None
    i, n = spots[pick % len(spots)]
    return text[i : i + n]


request_mixes = st.lists(st.fixed_dictionaries({
    "prompt": st.integers(0, 11),
    "max_tokens": st.integers(1, 14),
    "n": st.integers(1, 2),
    "seed": st.none() | st.integers(0, 1000),  # None: greedy; else sampled, choice j with seed + j
    # A stop string (where in choice 0's solo text it is taken) or a stop token id (which of its tokens), or neither
    "stop": st.none() | st.tuples(st.sampled_from(["string", "token"]), st.integers(0, 10**6)),
    "stream": st.booleans(),
    "logprobs": st.none() | st.integers(0, 3),
    "chat": st.booleans(),  # the prompt as a user message of a chat completion
}), min_size=2, max_size=6)


@heavy_settings(max_examples=5)
@given(mix=request_mixes)
def test_concurrent_mixed_requests_equal_solo_runs(live, solo_llm, mix):
    """Requests of every kind at once (completions or chat, streamed or not, greedy or seeded sampling, n = 1 or 2, a
    stop string or stop token taken from the output itself, lengths from one token, logprobs or not): every choice
    is its solo run (seed + j for choice j, vLLM's rule) cut where ``str.find`` first finds the stop string in the
    solo run's text (its token ids a prefix of the solo run's), or after the stop token's first occurrence (the token
    ids through it, the text without it), with finish reason ``stop`` there and ``length`` otherwise, and a logprob
    for each of its tokens, the solo run's; usage counts the prompt and the choices' tokens. Afterwards nothing is
    held."""
    tokenizer = live.server.tokenizer
    prompts = prompts_for_clients(12, seed=3)
    sampled = dict(temperature=0.8, top_k=40)

    def prompt_ids(r: dict) -> list[int]:
        text = prompts[r["prompt"]]
        if r["chat"]:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)
        return tokenizer.encode(text)

    solos, solo_logprobs = [], []
    for r in mix:
        params = [dict(sampled, seed=r["seed"] + j) if r["seed"] is not None else {} for j in range(r["n"])]
        outs = [solo(solo_llm, prompt_ids(r), r["max_tokens"], logprobs=r["logprobs"], **ps) for ps in params]
        solos.append([o.token_ids for o in outs])
        solo_logprobs.append([[lp.logprob for lp in o.logprobs] if r["logprobs"] is not None else None for o in outs])
    stops = [_stop_string(text_of(tokenizer, s[0]), r["stop"][1]) if r["stop"] and r["stop"][0] == "string" else None
             for r, s in zip(mix, solos)]
    stop_tokens = [s[0][r["stop"][1] % len(s[0])] if r["stop"] and r["stop"][0] == "token" else None
                   for r, s in zip(mix, solos)]

    async def client(c: openai.AsyncOpenAI, r: dict, stop: str | None, stop_token: int | None):
        extra = dict(NO_EOS, top_k=40) if r["seed"] is not None else dict(NO_EOS)
        if stop_token is not None:
            extra["stop_token_ids"] = [stop_token]
        kwargs = dict(model=MODEL, n=r["n"], temperature=0.8 if r["seed"] is not None else 0, seed=r["seed"],
                      stop=stop, extra_body=extra)
        if r["chat"]:
            create = c.chat.completions.create
            kwargs.update(messages=[{"role": "user", "content": prompts[r["prompt"]]}],
                          max_completion_tokens=r["max_tokens"], logprobs=r["logprobs"] is not None,
                          top_logprobs=r["logprobs"])
        else:
            create = c.completions.create
            kwargs.update(prompt=prompts[r["prompt"]], max_tokens=r["max_tokens"], logprobs=r["logprobs"])

        def logprobs_of(ch) -> list[float]:
            if ch.logprobs is None:
                return []
            return [e.logprob for e in ch.logprobs.content] if r["chat"] else ch.logprobs.token_logprobs

        choices = [{"text": "", "tokens": [], "reason": None, "logprobs": []} for _ in range(r["n"])]
        if r["stream"]:
            async with await create(stream=True, **kwargs) as stream:
                async for chunk in stream:
                    for ch in chunk.choices:
                        choices[ch.index]["text"] += (ch.delta.content or "") if r["chat"] else ch.text
                        choices[ch.index]["tokens"] += getattr(ch, "token_ids", None) or []  # (not in a role delta)
                        choices[ch.index]["reason"] = ch.finish_reason or choices[ch.index]["reason"]
                        choices[ch.index]["logprobs"] += logprobs_of(ch)
        else:
            response = await create(**kwargs)
            for ch in response.choices:
                choices[ch.index] = {"text": ch.message.content if r["chat"] else ch.text, "tokens": ch.token_ids,
                                     "reason": ch.finish_reason, "logprobs": logprobs_of(ch)}
            assert response.usage.completion_tokens == sum(len(ch["tokens"]) for ch in choices)
            assert response.usage.prompt_tokens == len(prompt_ids(r))
        return choices

    async def run():
        async with openai.AsyncOpenAI(base_url=live.base + "/v1", api_key="none", max_retries=0, timeout=120) as c:
            return await asyncio.gather(*(client(c, r, stop, token) for r, stop, token in zip(mix, stops, stop_tokens)))

    for i, (r, stop, token, expected, got) in enumerate(zip(mix, stops, stop_tokens, solos, asyncio.run(run()))):
        for j, (want, choice) in enumerate(zip(expected, got)):
            where = f"request {i} {r} choice {j} stop {stop!r} stop token {token}"
            if r["logprobs"] is None:
                assert choice["logprobs"] == [], where
            else:
                want_logprobs = solo_logprobs[i][j][: len(choice["tokens"])]
                assert choice["logprobs"] == pytest.approx(want_logprobs, abs=1e-4), where
            if token is not None and token in want:
                first = want.index(token)
                assert choice["tokens"] == want[: first + 1], where
                assert (choice["text"], choice["reason"]) == (text_of(tokenizer, want[:first]), "stop"), where
                continue
            full = text_of(tokenizer, want)
            at = full.find(stop) if stop is not None else -1
            assert choice["text"] == (full if at < 0 else full[:at]), where
            assert choice["reason"] == ("length" if at < 0 else "stop"), where
            assert choice["tokens"] == want[: len(choice["tokens"])], where
            if at < 0:
                assert choice["tokens"] == want, where
    live.assert_nothing_leaked()


# --------------------------------------------------------------------------------------------------------------
# Many clients, disconnects, a failing step
# --------------------------------------------------------------------------------------------------------------


def test_64_streaming_clients_with_random_disconnects(live, solo_llm):
    """64 concurrent streaming clients over 8 slots (shared prefixes hit the prefix cache); a third disconnect at a
    random point (some before their first token). Every client that read to the end got its solo run's tokens and
    text; afterwards nothing is held: no block, slot or snapshot row (the metrics and the engine's allocators)."""
    tokenizer = live.server.tokenizer
    prompts = prompts_for_clients(64)
    max_tokens = [4 + i % 7 for i in range(64)]
    rng = random.Random(1)
    quit_after = [rng.randrange(0, 4) if rng.random() < 0.33 else None for _ in range(64)]
    oracle = {}
    for p, n in zip(prompts, max_tokens):
        if (p, n) not in oracle:
            oracle[p, n] = solo(solo_llm, p, n).token_ids
    before = live.metrics()

    async def client(c: openai.AsyncOpenAI, i: int):
        stream = await c.completions.create(model=MODEL, prompt=prompts[i], max_tokens=max_tokens[i], temperature=0,
                                            stream=True, extra_body=NO_EOS)
        tokens, text, reason = [], "", None
        async with stream:
            chunks = 0
            async for chunk in stream:
                if quit_after[i] is not None and chunks >= quit_after[i]:
                    return None  # leaving the block closes the connection mid-stream
                chunks += 1
                tokens += chunk.choices[0].token_ids
                text += chunk.choices[0].text
                reason = chunk.choices[0].finish_reason or reason
        return tokens, text, reason

    async def run():
        async with openai.AsyncOpenAI(base_url=live.base + "/v1", api_key="none", max_retries=0, timeout=120) as c:
            return await asyncio.gather(*(client(c, i) for i in range(64)))

    results = asyncio.run(run())
    completed = 0
    for i, result in enumerate(results):
        if result is None:
            continue
        completed += 1
        tokens, text, reason = result
        expected = oracle[prompts[i], max_tokens[i]]
        assert tokens == expected, f"client {i}"
        assert text == text_of(tokenizer, expected) and reason == "length"
    assert 20 < completed < 64
    live.assert_nothing_leaked()
    after = live.metrics()
    assert after["ce:prefix_cache_hits_total"] > before["ce:prefix_cache_hits_total"]  # the shared prefixes hit
    aborted = after["ce:request_aborted_total"] - before["ce:request_aborted_total"]
    # a client leaving after its last token was sent has nothing left to abort
    assert 0 < aborted <= 64 - completed


def test_a_failing_step_fails_its_requests_and_the_server_serves_on(live, solo_llm, monkeypatch):
    """The decode step raises once while three streams and one plain request decode: each gets an error (an error
    event, a 500), nothing leaks, and the next request is served with its solo tokens."""
    runtime = live.engine.runtime
    decode = runtime.decode
    fired = threading.Event()

    def failing_decode(*args, **kwargs):
        if not fired.is_set():
            fired.set()
            raise RuntimeError("injected step failure")
        return decode(*args, **kwargs)

    async def run():
        async with openai.AsyncOpenAI(base_url=live.base + "/v1", api_key="none", max_retries=0, timeout=60) as c:
            streams = [await c.completions.create(model=MODEL, prompt=f"stream {i}", max_tokens=200, temperature=0,
                                                  stream=True, extra_body=NO_EOS) for i in range(3)]
            plain = asyncio.ensure_future(c.completions.create(model=MODEL, prompt="plain", max_tokens=200,
                                                               temperature=0, extra_body=NO_EOS))
            for s in streams:  # every stream is decoding
                await s.__anext__()
            deadline = time.monotonic() + 30
            while live.server.llm.stats.num_running < 4:  # the plain request too
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            monkeypatch.setattr(runtime, "decode", failing_decode)
            errors = []
            for s in streams:
                with pytest.raises(openai.APIError) as caught:
                    async for _ in s:
                        pass
                errors.append(str(caught.value))
            with pytest.raises(openai.InternalServerError) as caught:
                await plain
            return errors, caught.value

    errors, plain_error = asyncio.run(run())
    assert fired.is_set()
    assert all("injected step failure" in e for e in errors), errors
    assert plain_error.status_code == 500 and "injected step failure" in plain_error.body["message"]
    live.assert_nothing_leaked()
    assert live.metrics()["ce:engine_step_failures"] == 1
    r = live.client.completions.create(model=MODEL, prompt="after", max_tokens=5, temperature=0, extra_body=NO_EOS)
    assert r.choices[0].token_ids == solo(solo_llm, "after", 5).token_ids


def test_async_llm_merges_outputs_for_a_slow_consumer_and_drains_on_shutdown(solo_llm):
    """AsyncLLM without the server: a consumer slower than the engine gets merged outputs whose new tokens add up to
    its solo run; shutdown refuses new requests, lets the open streams finish, then stops the engine thread; with a
    stream interval, outputs come at the first token, every interval tokens, and the last."""
    from compiled_engine.async_llm import AsyncLLM, QueueFullError

    llm = LLM(ensure_tiny_model(), device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=4)
    prompts = [[1, 2, 3], [40, 50, 60, 70]]
    expected = [solo(solo_llm, p, 24).token_ids for p in prompts]

    async def consume(engine: AsyncLLM, prompt, delay: float):
        outputs = []
        async for out in engine.generate(prompt, SamplingParams(max_tokens=24, **GREEDY)):
            outputs.append(out)
            await asyncio.sleep(delay)
        return outputs

    async def run():
        engine = AsyncLLM(llm.engine)
        await engine.start()
        slow = await consume(engine, prompts[0], 0.05)
        streams = [asyncio.ensure_future(consume(engine, p, 0.01)) for p in prompts]
        await asyncio.sleep(0.05)
        stopping = asyncio.ensure_future(engine.shutdown())
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError):
            await anext(engine.generate([5], SamplingParams(max_tokens=2)))
        drained = await asyncio.gather(*streams)
        await stopping
        # stream_interval 4: the first token at once, then every 4 tokens, and the last
        spaced = AsyncLLM(llm.engine, stream_interval=4)
        await spaced.start()
        interval = await consume(spaced, prompts[1], 0)
        await spaced.shutdown()
        return slow, drained, engine, interval

    slow, drained, engine, interval = asyncio.run(run())
    assert {len(o.token_ids) for o in interval} <= {1, 5, 9, 13, 17, 21, 24} and interval[-1].finished
    assert [t for o in interval for t in o.new_token_ids] == interval[-1].token_ids == expected[1]
    assert [t for o in slow for t in o.new_token_ids] == slow[-1].token_ids == expected[0]
    assert len(slow) < 24  # merged: fewer outputs than tokens
    for outputs, exp in zip(drained, expected):
        assert outputs[-1].finished and outputs[-1].token_ids == exp
    assert not engine.alive and not llm.engine.requests


def test_a_speculative_server_serves_the_non_speculative_tokens(solo_llm, monkeypatch):
    """`serve --speculative-config` (MTP drafts, k = 2): greedy and seeded sampled completions, streamed or not,
    with logprobs (the verify step's logits) and a stop string that may land inside an accepted run, equal the
    non-speculative solo runs; concurrent clients share rounds; nothing is held afterwards."""
    live = LiveServer(speculative_config={"method": "mtp", "num_speculative_tokens": 2}, **KNOBS)
    try:
        assert live.engine.num_speculative_tokens == 2
        round_sizes = []  # the requests of each verify round the engine reads back
        read_round = live.engine._read_round

        def counted_read_round(round_, *args, **kwargs):
            round_sizes.append(len(round_.requests))
            return read_round(round_, *args, **kwargs)

        monkeypatch.setattr(live.engine, "_read_round", counted_read_round)
        tokenizer = live.server.tokenizer
        cases = [("Hello world", dict(temperature=0)), ("The quick brown fox", dict(temperature=0.9, seed=7)),
                 ("abc abc abc", dict(temperature=0.7, top_p=0.9, seed=8))]

        async def client(c, prompt, params):
            stream = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=16, stream=True,
                                                extra_body=NO_EOS, **params)
            tokens = []
            async with stream:
                async for chunk in stream:
                    tokens += chunk.choices[0].token_ids
            return tokens

        async def run():
            async with openai.AsyncOpenAI(base_url=live.base + "/v1", api_key="none", max_retries=0, timeout=60) as c:
                return await asyncio.gather(*(client(c, p, params) for p, params in cases))

        for got, (prompt, params) in zip(asyncio.run(run()), cases):
            assert got == solo(solo_llm, prompt, 16, **params).token_ids, prompt
        assert max(round_sizes) >= 2, round_sizes  # the concurrent clients shared rounds
        expected = solo(solo_llm, "Hello world", 12, logprobs=2)
        r = live.client.completions.create(model=MODEL, prompt="Hello world", max_tokens=12, temperature=0,
                                           logprobs=2, extra_body=NO_EOS)
        assert r.choices[0].token_ids == expected.token_ids
        assert r.choices[0].logprobs.token_logprobs == pytest.approx([e.logprob for e in expected.logprobs],
                                                                     abs=1e-4)
        text = text_of(tokenizer, expected.token_ids)
        stop = text[5:7]  # two characters from the middle of the output (maybe two tokens: an accepted run)
        r = live.client.completions.create(model=MODEL, prompt="Hello world", max_tokens=12, temperature=0,
                                           stop=[stop], extra_body={"ignore_eos": True})
        assert r.choices[0].text == text[: text.index(stop)] and r.choices[0].finish_reason == "stop"
        assert live.engine.num_verified_rows > 0
        live.assert_nothing_leaked()
    finally:
        live.close()


# --------------------------------------------------------------------------------------------------------------
# The engine loop in a process of its own
# --------------------------------------------------------------------------------------------------------------


def test_an_engine_process_serves_the_same_tokens_and_leaks_nothing(solo_llm):
    """--engine-process: outputs rebuilt from the process's deltas equal the solo runs (tokens, text, logprobs),
    streamed or not, with 16 concurrent clients some of which disconnect; afterwards /metrics shows nothing held."""
    live = LiveServer(engine_process=True, **KNOBS)
    try:
        assert live.engine is None and live.server.llm.host.alive
        tokenizer = live.server.tokenizer
        expected = solo(solo_llm, "Hello world", 8, logprobs=2)
        r = live.client.completions.create(model=MODEL, prompt="Hello world", max_tokens=8, temperature=0, logprobs=2,
                                           extra_body=NO_EOS)
        assert r.choices[0].token_ids == expected.token_ids and r.choices[0].text == expected.text
        assert r.choices[0].logprobs.token_logprobs == pytest.approx([e.logprob for e in expected.logprobs],
                                                                     abs=1e-4)
        tokens, logprobs = echo_oracle(tokenizer, solo_llm, "Hello world", 4, 1)  # the prompt's logprobs too
        r = live.client.completions.create(model=MODEL, prompt="Hello world", max_tokens=4, temperature=0, logprobs=1,
                                           echo=True, extra_body=NO_EOS)
        assert r.choices[0].logprobs.tokens == tokens and r.choices[0].logprobs.token_logprobs[0] is None
        assert r.choices[0].logprobs.token_logprobs[1:] == pytest.approx(logprobs[1:], abs=1e-4)
        # structured outputs: a spec xgrammar refuses is a 400 from the front end; a regex is followed
        bad = httpx.post(live.base + "/v1/completions", json=dict(OK, structured_outputs={"regex": "[a-"}))
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "structured_outputs"
        spec = {"regex": "[A-Z]{3}-[0-9]{3}"}
        r = live.client.completions.create(model=MODEL, prompt="id:", max_tokens=20, temperature=0,
                                           extra_body={"structured_outputs": spec, "return_token_ids": True})
        assert re.fullmatch(spec["regex"], r.choices[0].text)
        expected = solo(solo_llm, "id:", 20, ignore_eos=False, structured_outputs=StructuredOutputsParams(**spec))
        assert r.choices[0].token_ids == expected.token_ids
        prompts = prompts_for_clients(16, seed=2)
        oracle = {p: solo(solo_llm, p, 6).token_ids for p in set(prompts)}

        async def client(c, i):
            stream = await c.completions.create(model=MODEL, prompt=prompts[i], max_tokens=6, temperature=0,
                                                stream=True, extra_body=NO_EOS)
            tokens, text = [], ""
            async with stream:
                async for chunk in stream:
                    if i % 4 == 3 and tokens:
                        return None  # disconnects after its first token
                    tokens += chunk.choices[0].token_ids
                    text += chunk.choices[0].text
            return tokens, text

        async def run():
            async with openai.AsyncOpenAI(base_url=live.base + "/v1", api_key="none", max_retries=0, timeout=60) as c:
                return await asyncio.gather(*(client(c, i) for i in range(16)))

        results = asyncio.run(run())
        for i, result in enumerate(results):
            if result is not None:
                assert result == (oracle[prompts[i]], text_of(tokenizer, oracle[prompts[i]])), i
        assert sum(r is not None for r in results) >= 12
        live.wait_idle()
    finally:
        live.close()


def test_a_dead_engine_process_fails_its_requests():
    """The engine process killed mid-stream: the stream gets an error event, /health answers 503, and a new request
    a 500 (the server itself stays up)."""
    live = LiveServer(engine_process=True, **KNOBS)
    try:
        stream = live.client.completions.create(model=MODEL, prompt="long", max_tokens=200, temperature=0,
                                                stream=True, extra_body=NO_EOS)
        next(iter(stream))
        live.server.llm.host._process.kill()
        with pytest.raises(openai.APIError) as caught:
            for _ in stream:
                pass
        assert "engine process exited" in str(caught.value)
        assert httpx.get(live.base + "/health").status_code == 503
        with pytest.raises(openai.InternalServerError):
            live.client.completions.create(model=MODEL, prompt="after", max_tokens=2)
    finally:
        live.close()


# --------------------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------------------

C, CHAT = "/v1/completions", "/v1/chat/completions"
OK = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
MSG = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
LONG = "x" * (MAX_MODEL_LEN + 1)

# (path, body: a dict or raw text, status, the field the error names)
BAD_INPUT = [
    (C, '{"model": "compiled-engine-tiny", "prompt": ', 400, None),  # malformed JSON
    (C, "[1, 2]", 400, None),  # not an object
    (C, {"model": MODEL}, 400, "prompt"),  # missing
    (C, dict(OK, max_tokens="5"), 400, "max_tokens"),  # a string for an int
    (C, dict(OK, max_tokens=0), 400, "max_tokens"),
    (C, dict(OK, temperature=-1), 400, "temperature"),
    (C, dict(OK, temperature="hot"), 400, "temperature"),
    (C, '{"model": "compiled-engine-tiny", "prompt": "hi", "temperature": NaN}', 400, "temperature"),
    (C, dict(OK, top_p=0), 400, "top_p"),
    (C, dict(OK, top_p=1.5), 400, "top_p"),
    (C, dict(OK, top_k=-2), 400, "top_k"),
    (C, dict(OK, min_p=2), 400, "min_p"),
    (C, dict(OK, seed=2**70), 400, "seed"),
    (C, dict(OK, stream="yes"), 400, "stream"),
    (C, dict(OK, ignore_eos=1), 400, "ignore_eos"),
    (C, dict(OK, stop=5), 400, "stop"),
    (C, dict(OK, stop=[""]), 400, "stop"),
    (C, dict(OK, stop_token_ids=[-1]), 400, "stop_token_ids"),
    (C, dict(OK, stop_token_ids=[10**6]), 400, "stop_token_ids"),  # outside the vocabulary
    (C, dict(OK, logprobs=21), 400, "logprobs"),
    (C, dict(OK, prompt=[300]), 400, "prompt"),  # a token id outside the vocabulary
    (C, dict(OK, prompt=""), 400, "prompt"),  # empty
    (C, dict(OK, prompt=[]), 400, "prompt"),
    (C, dict(OK, prompt=LONG), 400, "prompt"),  # over max_model_len
    (C, dict(OK, prompt="x" * (MAX_MODEL_LEN - 4), max_tokens=8), 400, "max_tokens"),  # with max_tokens, over it
    (C, dict(OK, n=0), 400, "n"),
    (C, dict(OK, n=65), 400, "n"),
    (C, dict(OK, presence_penalty=2.5), 400, "presence_penalty"),  # outside [-2, 2]
    (C, dict(OK, repetition_penalty=0), 400, "repetition_penalty"),  # must be > 0
    (C, dict(OK, logit_bias={"x": 1}), 400, "logit_bias"),  # keys are token ids
    (C, dict(OK, logit_bias={"5": 101}), 400, "logit_bias"),  # OpenAI's range: [-100, 100]
    (C, dict(OK, logit_bias={"300": 1}), 400, "logit_bias"),  # outside the vocabulary
    (C, dict(OK, allowed_token_ids=[]), 400, "allowed_token_ids"),
    (C, dict(OK, bad_words=[" "]), 400, "bad_words"),  # no word
    (C, dict(OK, response_format={"type": "json_schema"}), 400, "response_format"),  # no schema
    (C, dict(OK, response_format={"type": "xml"}), 400, "response_format"),
    (C, dict(OK, structured_outputs={"regex": "[a-"}), 400, "structured_outputs"),  # xgrammar refuses it
    (C, dict(OK, structured_outputs={"regex": "a", "choice": ["a"]}), 400, "structured_outputs"),  # two kinds
    (C, dict(OK, allowed_token_ids=[300]), 400, "allowed_token_ids"),
    (C, dict(OK, stream_options={"include_usage": True}), 400, "stream_options"),  # without stream
    (C, dict(OK, model="gpt-4"), 404, "model"),
    (CHAT, {"model": MODEL}, 400, "messages"),
    (CHAT, dict(MSG, messages=[]), 400, "messages"),
    (CHAT, dict(MSG, messages=[{"role": "user", "content": 5}]), 400, "messages.0.content"),
    (CHAT, dict(MSG, messages=[{"role": "user", "content": LONG}]), 400, "messages"),
    (CHAT, dict(MSG, max_completion_tokens=0), 400, "max_completion_tokens"),
    (CHAT, dict(MSG, max_completion_tokens=MAX_MODEL_LEN), 400, "max_completion_tokens"),
    (CHAT, dict(MSG, top_logprobs=3), 400, "top_logprobs"),  # without logprobs
    (CHAT, dict(MSG, logprobs=True, top_logprobs=30), 400, "top_logprobs"),
    (CHAT, dict(MSG, n=-1), 400, "n"),
    ("/v1/nothing", OK, 404, None),
]


def test_bad_input_table(live):
    """Each case gets its status, an OpenAI-shaped error body naming the field, and the server still serves."""
    got = []
    for path, body, status, param in BAD_INPUT:
        content = body if isinstance(body, str) else json.dumps(body)
        r = httpx.post(live.base + path, content=content, headers={"content-type": "application/json"})
        error = r.json().get("error") if r.headers.get("content-type", "").startswith("application/json") else None
        got.append((path, content[:60], r.status_code, error and error["param"]))
        assert error is not None and set(error) == {"message", "type", "param", "code"} and error["message"], r.text
    assert got == [(p, (b if isinstance(b, str) else json.dumps(b))[:60], s, f) for p, b, s, f in BAD_INPUT]
    r = live.client.completions.create(model=MODEL, prompt="still here", max_tokens=3, temperature=0)
    assert len(r.choices[0].text) > 0 or r.usage.completion_tokens > 0
    live.assert_nothing_leaked()


def test_more_waiting_than_max_waiting_is_503(live, monkeypatch):
    monkeypatch.setattr(live.server.llm, "max_waiting", 0)
    with pytest.raises(openai.APIStatusError) as caught:
        live.client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert caught.value.status_code == 503 and caught.value.body["code"] == "overloaded"
    monkeypatch.setattr(live.server.llm, "max_waiting", 1)
    with pytest.raises(openai.APIStatusError) as caught:  # two prompts, one place
        live.client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=2)
    assert caught.value.status_code == 503
    monkeypatch.undo()
    assert live.client.completions.create(model=MODEL, prompt="hi", max_tokens=2).usage.completion_tokens >= 1


# --------------------------------------------------------------------------------------------------------------
# The command line, SIGTERM
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device, engine_process, expected", [
    ("cpu", None, "ThreadEngine"), ("cpu", False, "ThreadEngine"), ("cpu", True, "EngineProcess"),
    ("cuda", None, "EngineProcess"), ("cuda", False, "ThreadEngine")])
def test_where_the_engine_loop_runs(device, engine_process, expected, monkeypatch):
    """By default the engine loop runs in a process of its own when the engine is on CUDA, in a thread of the server
    on the CPU; either way when asked. The process is only built here, not started; "cuda" is where the server
    resolves the engine's device to CUDA (the engine itself is built on the CPU)."""
    import torch

    import compiled_engine.server as server_module

    if device == "cuda":
        monkeypatch.setattr(server_module, "resolve_device", lambda _: torch.device("cuda"))
    server = build_server(engine_process=engine_process, **KNOBS)
    assert type(server.llm.host).__name__ == expected


@pytest.mark.parametrize("flags", [[], ["--engine-process"]], ids=["thread", "engine-process"])
def test_serve_command_drains_on_sigterm(flags):
    """``python -m compiled_engine serve`` with the embedded default model: SIGTERM while a stream is open lets it
    finish (every token, then [DONE]), then the process exits, cleanly or by that signal (uvicorn re-raises it
    after its shutdown in some versions), without a traceback."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "compiled_engine", "serve", "--port", str(port), "--device", "cpu",
         "--max-model-len", "256", "--max-num-seqs", "4", "--num-kv-blocks", "64", "--log-level", "warning", *flags],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        body = {"model": MODEL, "prompt": "drain me", "max_tokens": 60, "temperature": 0, "stream": True,
                "ignore_eos": True, "return_token_ids": True}
        tokens, done = [], False
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                tokens += json.loads(line[6:])["choices"][0]["token_ids"]
                if len(tokens) == 1:
                    proc.send_signal(signal.SIGTERM)
        assert done and len(tokens) == 60
        # uvicorn re-raises the signal once it has shut down (the lifespan, hence AsyncLLM.shutdown, included)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        log = proc.stdout.read().decode()
        assert "Traceback" not in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

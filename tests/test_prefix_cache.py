"""Prefix caching: outputs with caching on == off == HF, real hits, eviction, and no leaked resources."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiled_engine import LLM, SamplingParams
from tests import hf_models

VARIANT = "qwen3_5_text_untied"
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
INTERVAL = 64  # the smallest legal snapshot interval: FLA's chunk


def make_llm(path, **knobs) -> LLM:
    knobs.setdefault("max_model_len", 512)
    return LLM(str(path), device="cpu", dtype="float32", enforce_eager=True, block_size=16, **knobs)


@pytest.fixture(scope="module")
def path(build_hf_model):
    return build_hf_model(VARIANT)


@pytest.fixture(scope="module")
def cached_llm(path):
    return make_llm(path, enable_prefix_caching=True, prefix_snapshot_interval=INTERVAL, num_prefix_snapshots=16)


@pytest.fixture(scope="module")
def plain_llm(path):
    return make_llm(path)


def assert_clean(llm: LLM) -> None:
    """Every block and slot is free (cached blocks count as free), and every snapshot sits on an indexed block."""
    rt = llm.runtime
    assert rt.blocks.num_free == rt.blocks.num_blocks - 1
    assert all(count == 0 for count in rt.blocks.refcount)
    assert rt.slots.num_free == rt.config.max_num_seqs
    pc = rt.prefix_cache
    if pc is not None:
        assert all(key in rt.blocks.block_of_hash for key in pc.row_of_hash)
        assert len(pc.row_of_hash) + len(pc.free_rows) == pc.recurrent[0].shape[0]


def random_tokens(rng: random.Random, n: int, vocab: int = 320) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def run_twice_and_compare(cached_llm, plain_llm, prompts):
    """Caching on (cold, then warm) must equal caching off; returns the warm outputs."""
    expected = [o.token_ids for o in plain_llm.generate(prompts, GREEDY, use_tqdm=False)]
    cold = cached_llm.generate(prompts, GREEDY, use_tqdm=False)
    warm = cached_llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in cold] == expected
    assert [o.token_ids for o in warm] == expected
    assert_clean(cached_llm)
    return warm


def test_shared_system_prompt_matches_hf_and_hits(cached_llm, plain_llm, load_hf_model):
    rng = random.Random(1)
    system = random_tokens(rng, 150)
    prompts = [system + random_tokens(rng, rng.randrange(1, 30)) for _ in range(4)]
    warm = run_twice_and_compare(cached_llm, plain_llm, prompts)
    model = load_hf_model(VARIANT)
    for prompt, out in zip(prompts, warm):
        assert out.token_ids == hf_models.hf_greedy(model, prompt, GREEDY.max_tokens)
        assert out.num_cached_tokens == 128  # the last 64-token boundary inside the 150-token system prompt


def test_identical_prompts(cached_llm, plain_llm):
    prompt = random_tokens(random.Random(2), 200)
    warm = run_twice_and_compare(cached_llm, plain_llm, [prompt, prompt, prompt])
    assert all(o.num_cached_tokens == 192 for o in warm)  # never the whole prompt: its last token is recomputed


def test_prompt_of_exactly_one_interval_recomputes_its_last_token(cached_llm, plain_llm):
    prompt = random_tokens(random.Random(3), INTERVAL * 2)
    warm = run_twice_and_compare(cached_llm, plain_llm, [prompt])
    assert warm[0].num_cached_tokens == INTERVAL


def test_multi_turn_continuation(cached_llm, plain_llm):
    rng = random.Random(4)
    turn1 = random_tokens(rng, 100)
    reply = cached_llm.generate([turn1], GREEDY, use_tqdm=False)[0].token_ids
    turn2 = turn1 + reply + random_tokens(rng, 40)  # 148 tokens: the 128-token boundary spans the first reply
    expected = plain_llm.generate([turn2], GREEDY, use_tqdm=False)[0].token_ids
    first = cached_llm.generate([turn2], GREEDY, use_tqdm=False)[0]
    assert first.token_ids == expected
    assert first.num_cached_tokens == 64  # turn 1 left a snapshot at 64 only
    again = cached_llm.generate([turn2], GREEDY, use_tqdm=False)[0]
    assert again.token_ids == expected and again.num_cached_tokens == 128
    assert_clean(cached_llm)


def test_prompts_diverging_mid_block(cached_llm, plain_llm):
    rng = random.Random(5)
    base = random_tokens(rng, 140)
    variants = [base[:70] + random_tokens(rng, 70), base[:137] + random_tokens(rng, 9)]
    expected = [o.token_ids for o in plain_llm.generate(variants, GREEDY, use_tqdm=False)]
    cached_llm.generate([base], GREEDY, use_tqdm=False)  # leaves snapshots at 64 and 128
    got = cached_llm.generate(variants, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in got] == expected
    # diverging at token 70 (inside block 4, after the 64 boundary): only the first boundary is shared
    assert got[0].num_cached_tokens == 64
    assert got[1].num_cached_tokens == 128  # diverging at 137: both boundaries are shared
    assert_clean(cached_llm)


def test_eviction_under_a_small_budget(path, plain_llm):
    """One snapshot and few KV blocks: snapshots and blocks are evicted, outputs never change."""
    llm = make_llm(path, enable_prefix_caching=True, prefix_snapshot_interval=INTERVAL, num_prefix_snapshots=1,
                   num_kv_blocks=40, max_model_len=256)
    rng = random.Random(6)
    prompts = [random_tokens(rng, rng.randrange(60, 200)) for _ in range(6)]
    prompts += [prompts[0], prompts[3][:130], prompts[5]]
    expected = [o.token_ids for o in plain_llm.generate(prompts, GREEDY, use_tqdm=False)]
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)] == expected
    assert llm.runtime.prefix_cache.num_snapshots == 1
    assert_clean(llm)


@settings(max_examples=12)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 150), st.integers(1, 6)),  # (shared prefix id, suffix, max_tokens)
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 2**16),
)
def test_random_streams_leave_nothing_behind(cached_llm, plain_llm, requests, seed):
    rng = random.Random(seed)
    prefixes = [random_tokens(random.Random(100 + i), 64 * (i + 1)) for i in range(4)]
    prompts = [prefixes[p][: rng.randrange(1, len(prefixes[p]) + 1)] + random_tokens(rng, s) for p, s, _ in requests]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, _, m in requests]
    expected = [o.token_ids for o in plain_llm.generate(prompts, params, use_tqdm=False)]
    got = [o.token_ids for o in cached_llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    assert_clean(cached_llm)

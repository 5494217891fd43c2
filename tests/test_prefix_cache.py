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
    assert rt.caches.blocks.num_free == rt.caches.blocks.num_blocks - 1
    assert all(count == 0 for count in rt.caches.blocks.refcount)
    assert rt.caches.slots.num_free == rt.config.max_num_seqs
    pc = rt.caches.prefix_cache
    if pc is not None:
        assert all(key in rt.caches.blocks.block_of_hash for key in pc.row_of_hash)
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


def test_shared_prefix_arriving_together_is_computed_once(cached_llm, plain_llm, load_hf_model):
    """Requests that share a never-seen prefix and arrive together: the first computes it, the others wait for its
    snapshot instead of computing the same tokens in the same steps, and then skip it (on the cold run)."""
    rng = random.Random(7)
    prefix = random_tokens(rng, 3 * INTERVAL)
    prompts = [prefix + random_tokens(rng, rng.randrange(2, 20)) for _ in range(5)]  # >= 2: prefill, not decode
    expected = [o.token_ids for o in plain_llm.generate(prompts, GREEDY, use_tqdm=False)]
    scheduler = cached_llm.engine.scheduler
    before = scheduler.num_prefill_tokens
    got = cached_llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in got] == expected
    assert [o.num_cached_tokens for o in got] == [0] + [3 * INTERVAL] * 4
    # The prefix once, then each prompt's own tokens (and nothing for the generated tokens: those are decode steps).
    assert scheduler.num_prefill_tokens - before == len(prompts[0]) + sum(len(p) - 3 * INTERVAL for p in prompts[1:])
    model = load_hf_model(VARIANT)
    assert got[1].token_ids == hf_models.hf_greedy(model, prompts[1], GREEDY.max_tokens)
    assert_clean(cached_llm)


def test_held_back_requests_keep_their_place_and_let_others_pass(cached_llm, plain_llm):
    """A request waiting for a prefix being computed keeps its place in the queue; an unrelated request behind it
    is admitted at once, and the sharing ones are admitted, in order, once the prefix's snapshot exists."""
    rng = random.Random(8)
    prefix = random_tokens(rng, 2 * INTERVAL)
    shared = [prefix + random_tokens(rng, 5 + i) for i in range(3)]
    other = random_tokens(rng, 40)
    prompts = shared + [other]
    expected = [o.token_ids for o in plain_llm.generate(prompts, GREEDY, use_tqdm=False)]
    engine = cached_llm.engine
    ids = [engine.add_request(None, p, GREEDY) for p in prompts]
    engine.step()  # admits shared[0] (its first interval: chunks end at snapshot boundaries) and the unrelated one
    scheduler = engine.scheduler
    waiting = [s.token_ids for s in scheduler.waiting]
    assert waiting == shared[1:]
    assert sorted(s.token_ids[: s.num_prompt_tokens] for s in scheduler.running) == sorted([shared[0], other])
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
    got = [outputs[i] for i in ids]
    assert [o.token_ids for o in got] == expected
    assert [o.num_cached_tokens for o in got] == [0, 2 * INTERVAL, 2 * INTERVAL, 0]
    assert_clean(cached_llm)


def test_eviction_under_a_small_budget(path, plain_llm):
    """One snapshot and few KV blocks: snapshots and blocks are evicted, outputs never change."""
    llm = make_llm(path, enable_prefix_caching=True, prefix_snapshot_interval=INTERVAL, num_prefix_snapshots=1,
                   num_kv_blocks=40, max_model_len=256)
    rng = random.Random(6)
    prompts = [random_tokens(rng, rng.randrange(60, 200)) for _ in range(6)]
    prompts += [prompts[0], prompts[3][:130], prompts[5]]
    expected = [o.token_ids for o in plain_llm.generate(prompts, GREEDY, use_tqdm=False)]
    caches = llm.runtime.caches
    blocks, prefix_cache = caches.blocks, caches.prefix_cache
    evicted, snapshot_keys = [], set()
    drop_snapshot, take_snapshot = blocks.on_evict, prefix_cache._take_snapshot

    def count_eviction(block, content_hash):
        evicted.append(block)
        drop_snapshot(block, content_hash)

    def count_snapshot(key, slot):
        snapshot_keys.add(key)
        take_snapshot(key, slot)

    blocks.on_evict, prefix_cache._take_snapshot = count_eviction, count_snapshot
    cached_tokens = []
    for _ in range(2):
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert [o.token_ids for o in outputs] == expected
        cached_tokens += [o.num_cached_tokens for o in outputs]
    # The budget forced both kinds of eviction: indexed blocks were reused, and snapshots of more boundaries were
    # taken than the one row holds; the cache still served prompts (a cache that never hits passes the rest).
    assert evicted and len(snapshot_keys) > prefix_cache.num_snapshots == 1
    assert sum(cached_tokens) > 0 and all(n % INTERVAL == 0 for n in cached_tokens)
    assert_clean(llm)


def test_held_back_requests_with_preemption(path, plain_llm):
    """Few KV blocks, shared prefixes arriving together, long outputs: sequences are held back for a prefix being
    computed while others are preempted (and recomputed, with hits); outputs never change and nothing leaks.
    Admission without the growth reserve, which would rule the preemptions out."""
    llm = make_llm(path, enable_prefix_caching=True, prefix_snapshot_interval=INTERVAL, num_prefix_snapshots=4,
                   num_kv_blocks=20, max_model_len=256, max_num_batched_tokens=64, kv_growth_reserve=0.0)
    rng = random.Random(9)
    prefixes = [random_tokens(rng, 2 * INTERVAL + 7), random_tokens(rng, INTERVAL + 3)]
    prompts = [prefixes[i % 2] + random_tokens(rng, rng.randrange(1, 12)) for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randrange(20, 60), ignore_eos=True) for _ in prompts]
    expected = [o.token_ids for o in plain_llm.generate(prompts, params, use_tqdm=False)]
    scheduler = llm.engine.scheduler
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in got] == expected
    assert scheduler.num_preemptions > 0 and scheduler.num_held_back > 0
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

"""Captured prompt steps (graphs/prefill_graph.py): a prompt step of one sequence or several (prompts together, a
mixed step's decode rows), padded to its key by padding sequences on the null slot and block and replayed, computes
what the unpadded eager step computes.

The oracle is a second runtime on the same checkpoint that runs every step unpadded and eagerly (a solo run). On the
CPU the padding is checked through ``Runtime.prefill`` with a stand-in for the graphs that runs the padded step
eagerly on the graphs' own input buffers (everything but the capture: the padding, the buffer copies, the dropped
row); on the GPU the real capture and replay, marked ``gpu``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compiled_engine.runtime import Runtime
from compiled_engine.tiny_model import ensure_tiny_model
from graphs import PrefillGraphs, prefill_buckets

BUCKETS = (16, 32, 64)


class EagerPrefillGraphs(PrefillGraphs):
    """PrefillGraphs whose "replay" runs the bucket's step eagerly on the input buffers (no CUDA graph)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replays: list[tuple] = []  # each replay's key, ("drafts", key) for a drafts graph

    def capture(self) -> None:
        self._graphs = dict.fromkeys(self.keys)

    def _replay(self, key: tuple[int, int, int]) -> torch.Tensor:
        self.replays.append(key)
        return self._forward(self._step(key))

    def _replay_draft(self, key: tuple[int, int, int]) -> torch.Tensor:
        self.replays.append(("drafts", key))
        return self._draft(self._step(key))


def _runtime(path, device: str, max_model_len: int = 128, **knobs) -> Runtime:
    return Runtime.from_pretrained(str(path), device=device, dtype="float32", compile=False,
                                   max_model_len=max_model_len, max_num_seqs=4,
                                   num_kv_blocks=max(64, 2 * max_model_len // 8), block_size=8, **knobs)


def _states(rt: Runtime, slot: int) -> list[torch.Tensor]:
    return [t[slot].clone() for layer in rt.model.layers if hasattr(layer.mixer, "recurrent_state")
            for t in (layer.mixer.conv_state, layer.mixer.recurrent_state)]


def _run(rt: Runtime, prompt: list[int], chunks: list[int], decode_steps: int):
    """Prefill ``prompt`` in ``chunks``, then greedy decode: (each chunk's logits, the states after the prompt, the
    decoded tokens)."""
    seq = rt.add_sequence(prompt)
    logits = [rt.prefill([seq], [n]) for n in chunks]
    states = _states(rt, seq.state_slot)
    tokens = []
    seq.token_ids.append(int(logits[-1][0].argmax()))
    for _ in range(decode_steps):
        out = rt.decode_step([seq])
        tokens.append(int(out[0].argmax()))
        seq.token_ids.append(tokens[-1])
    rt.release(seq)
    return logits, states, tokens


def _padded_pair(path, max_sequences: int = 1, **knobs) -> tuple[Runtime, Runtime, EagerPrefillGraphs]:
    """Two CPU runtimes on ``path``: the first's prompt steps of up to ``max_sequences`` sequences run padded on
    EagerPrefillGraphs (with the executor's drafter under speculative decoding), the second's unpadded."""
    padded, plain = _runtime(path, "cpu", **knobs), _runtime(path, "cpu", **knobs)
    graphs = EagerPrefillGraphs(padded.model, BUCKETS, max_blocks_per_seq=16, block_size=8, device="cpu",
                                drafter=padded.executor.prompt_drafter(), max_sequences=max_sequences)
    graphs.capture()
    padded.executor.prefill_graphs = graphs
    return padded, plain, graphs


def _draw_chunks(data) -> tuple[int, list[int]]:
    """A prompt length of 1-90 tokens and its chunks: one, or two (the second continuing the first)."""
    length = data.draw(st.integers(1, 90), label="length")
    first = data.draw(st.integers(1, length), label="first chunk")
    return length, [first] + ([length - first] if first < length else [])


@pytest.fixture(scope="module")
def cpu_pair(qwen3_5_text_tied_path):
    return _padded_pair(qwen3_5_text_tied_path)


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_padded_prompt_steps_equal_unpadded_ones(cpu_pair, data):
    """Prompts of 1-90 tokens, in one chunk or two (the second continues the first's KV and state, as chunked
    prefill and prefix hits do): every chunk of at most 64 tokens runs padded (a bucket of 16, 32 or 64, the exact
    size included), the rest unpadded; the logits, the linear layers' states after the prompt and 6 greedy decode
    tokens equal the unpadded runtime's."""
    padded, plain, graphs = cpu_pair
    length, chunks = _draw_chunks(data)
    prompt = [(7 * i + 3) % 50 + 1 for i in range(length)]
    graphs.replays.clear()
    got_logits, got_states, got_tokens = _run(padded, prompt, chunks, 6)
    want_logits, want_states, want_tokens = _run(plain, prompt, chunks, 6)
    assert graphs.replays == [graphs.bucket(n) for n in chunks if n <= BUCKETS[-1]]
    # fp32 matmuls of other row counts round apart, and the chunked delta rule's triangular solve carries that on
    # (a few 1e-4 on some CPUs)
    for got, want in zip(got_logits, want_logits):
        assert got.shape == want.shape == (1, plain.model_config.vocab_size)
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    for got, want in zip(got_states, want_states):
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    assert got_tokens == want_tokens


# ------------------------------------------------------------------------------------ steps of several sequences
def _several_run(rt: Runtime, prompts: list[list[int]], decode_rows: list[bool], decode_steps: int = 4):
    """One prefill step of every prompt's sequence, after the ones marked in ``decode_rows`` computed their prompt
    alone and became decode rows (one new token each), as LLMEngine's overlapped mixed steps run them: the host holds
    a placeholder (0) for that token and the step takes it from ``device_input_ids``. Then greedy decode steps of all.
    Returns (the step's logits, each sequence's linear states after it, the decoded tokens)."""
    seqs = [rt.add_sequence(p) for p in prompts]
    indices, tokens = [], []
    for seq, row in zip(seqs, decode_rows):
        if row:
            rt.prefill([seq])
            seq.token_ids.append(0)  # the placeholder
    offset = 0
    for seq, row in zip(seqs, decode_rows):
        if row:
            indices.append(offset)
            tokens.append(len(seq.token_ids) * 3 % 50 + 1)
        offset += seq.num_uncomputed_tokens
    device_ids = (torch.tensor(indices, dtype=torch.long, device=rt.device),
                  torch.tensor(tokens, dtype=torch.long, device=rt.device)) if indices else None
    logits = rt.prefill(seqs, device_input_ids=device_ids)
    for seq, token in zip([s for s, row in zip(seqs, decode_rows) if row], tokens):
        seq.token_ids[-1] = token  # read back, as the engine does
    states = [_states(rt, seq.state_slot) for seq in seqs]
    decoded = []
    for seq, row in zip(seqs, logits):
        seq.token_ids.append(int(row.argmax()))
    for _ in range(decode_steps):
        step_tokens = rt.decode_step(seqs).argmax(dim=-1).tolist()
        decoded.append(step_tokens)
        for seq, token in zip(seqs, step_tokens):
            seq.token_ids.append(token)
    for seq in seqs:
        rt.release(seq)
    return logits, states, decoded


def _assert_several_runs_equal(got, want, tol: float) -> None:
    """Logits and states within ``tol`` of each tensor's largest value (see ``_assert_drafting_runs_equal`` for why
    the GPU's differ by more than the CPU's), the decoded tokens equal."""
    assert got[0].shape == want[0].shape
    for g, w in [(got[0], want[0])] + [pair for states in zip(got[1], want[1]) for pair in zip(*states)]:
        torch.testing.assert_close(g, w, atol=tol * float(w.abs().max()), rtol=1e-3)
    assert got[2] == want[2]


LANES = 2  # the decode lanes of the CPU stand-in's mixed keys: steps of 3-4 decode rows take a key without


@pytest.fixture(scope="module")
def cpu_several(qwen3_5_text_tied_path):
    """A runtime on padded steps of up to 4 sequences, with mixed keys of LANES decode lanes (under its own 16, so
    that the engine runs mixed steps of 3-4 decode rows on keys without lanes), and the oracle: a runtime on
    unpadded eager steps that computes decode rows as a prompt's tokens (the chunked path), as a runtime with
    mixed_decode_lanes 0 does."""
    padded = _runtime(qwen3_5_text_tied_path, "cpu")
    plain = _runtime(qwen3_5_text_tied_path, "cpu", mixed_decode_lanes=0)
    graphs = EagerPrefillGraphs(padded.model, BUCKETS, max_blocks_per_seq=16, block_size=8, device="cpu",
                                max_sequences=4, decode_lanes=LANES)
    graphs.capture()
    padded.executor.prefill_graphs = graphs
    return padded, plain, graphs


def _expected_key(counts: list[int], lanes: int) -> tuple[int, int, int]:
    """The key of a step of these token counts on BUCKETS and sequence buckets 1, 2, 4: its leading one-token
    sequences in a mixed key's decode lanes where there are 1..``lanes`` of them, the rest in its prompt part (at
    least one sequence bucket); otherwise every sequence in a key without lanes."""
    d = next((i for i, n in enumerate(counts) if n != 1), len(counts))
    if not 0 < d <= lanes:
        d, lanes = 0, 0
    seqs = next(b for b in (1, 2, 4) if b >= max(len(counts) - d, 1))
    return next(b for b in BUCKETS if b >= max(sum(counts) - d, seqs)), seqs, lanes


@settings(max_examples=16, deadline=None)
@given(data=st.data())
def test_padded_steps_of_several_sequences_equal_unpadded_ones(cpu_several, data):
    """Steps of 1-4 sequences, each a new prompt of 1-16 tokens or a decode row (its prompt computed, one token
    new, taken from the device as overlapped mixed steps pass it): the step replays the key of its tokens and
    sequences (16 | 32 | 64 tokens, 1 | 2 | 4 sequences; up to LANES leading one-token sequences in decode lanes),
    padded with one-token lanes, empty sequences and a padding one; its logits, every sequence's linear states after
    it and 4 greedy decode steps after it equal those of the unpadded runtime that computes decode rows on the
    chunked path."""
    padded, plain, graphs = cpu_several
    n = data.draw(st.integers(1, 4), label="sequences")
    lengths = data.draw(st.lists(st.integers(1, 16), min_size=n, max_size=n), label="prompt lengths")
    decode_rows = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="decode rows")
    prompts = [[(7 * i + 3 * j) % 50 + 1 for i in range(length)] for j, length in enumerate(lengths)]
    graphs.replays.clear()
    got = _several_run(padded, prompts, decode_rows)
    counts = [1 if row else length for length, row in zip(lengths, decode_rows)]
    assert graphs.replays[-1] == _expected_key(counts, LANES)
    want = _several_run(plain, prompts, decode_rows)
    _assert_several_runs_equal(got, want, 1e-4)


def test_eager_decode_rows_equal_the_chunked_path(qwen3_5_text_tied_path):
    """Eager steps whose leading sequences are decode rows (1-4 of them, padded to 4 lanes, with a prompt part of
    0-2 prompts after them) through the linear layers' decode op equal the same steps with every row on the chunked
    path (mixed_decode_lanes 0): logits, linear states and 4 greedy decode steps."""
    fast = _runtime(qwen3_5_text_tied_path, "cpu")
    chunked = _runtime(qwen3_5_text_tied_path, "cpu", mixed_decode_lanes=0)
    for lengths, rows in [([9, 5, 12], [True, True, False]), ([4] * 4, [True] * 4), ([7, 30], [True, False]),
                          ([3, 11, 6, 2], [True, True, False, False]), ([1, 8], [False, False])]:
        prompts = [[(5 * i + 3 * j) % 50 + 1 for i in range(n)] for j, n in enumerate(lengths)]
        _assert_several_runs_equal(_several_run(fast, prompts, rows), _several_run(chunked, prompts, rows), 1e-4)


@pytest.mark.parametrize("overlap_decode", [False, True])
def test_engine_mixed_steps_on_padded_steps_equal_unpadded_ones(cpu_several, overlap_decode):
    """LLMEngine's mixed steps (requests arriving while others decode, prompts of 3-40 tokens, 64-token steps) on
    the padded steps of several sequences emit the greedy tokens of the same engine on unpadded steps; with
    ``overlap_decode`` the decode rows' tokens reach the padded steps from the device."""
    from compiled_engine.engine import LLMEngine
    from compiled_engine.sampling_params import SamplingParams

    padded, plain, graphs = cpu_several
    prompts = [[(13 * i + j) % 50 + 1 for i in range(n)] for j, n in enumerate([3, 40, 9, 17])]
    outputs = {}
    for name, rt in [("padded", padded), ("unpadded", plain)]:
        engine = LLMEngine(rt, max_num_batched_tokens=64, overlap_decode=overlap_decode)
        graphs.replays.clear()
        for i, prompt in enumerate(prompts):  # one arrival every 3 steps
            engine.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=8 + 2 * i, ignore_eos=True))
            for _ in range(3):
                for out in engine.step():
                    if out.finished:
                        outputs[name, out.request_id] = out.outputs[0].token_ids
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[name, out.request_id] = out.outputs[0].token_ids
        if name == "padded":  # the mixed steps replayed, their decode rows in lanes
            assert any(key[2] == LANES for key in graphs.replays), graphs.replays
    for i in range(len(prompts)):
        assert outputs["padded", str(i)] == outputs["unpadded", str(i)], i
        assert len(outputs["padded", str(i)]) == 8 + 2 * i


def test_sequence_buckets_grow_two_fold_to_the_limit():
    from graphs import sequence_buckets

    assert sequence_buckets(1) == (1,)
    assert sequence_buckets(2) == (1, 2)
    assert sequence_buckets(5) == (1, 2, 4, 5)
    assert sequence_buckets(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert sequence_buckets(100) == (1, 2, 4, 8, 16, 32, 64, 100)
    with pytest.raises(ValueError):
        sequence_buckets(0)


def test_keys_hold_a_token_a_sequence_and_pick_the_smallest_graph():
    """Every sequence bucket at every token bucket of at least that many tokens; a step takes the smallest key that
    holds its tokens and its sequences."""
    graphs = PrefillGraphs(torch.nn.Identity(), (16, 32, 64), max_blocks_per_seq=4, block_size=8, device="cpu",
                           max_sequences=20)
    assert graphs.sequence_buckets == (1, 2, 4, 8, 16, 20)
    assert graphs.keys == ((16, 1, 0), (16, 2, 0), (16, 4, 0), (16, 8, 0), (16, 16, 0),
                           (32, 1, 0), (32, 2, 0), (32, 4, 0), (32, 8, 0), (32, 16, 0), (32, 20, 0),
                           (64, 1, 0), (64, 2, 0), (64, 4, 0), (64, 8, 0), (64, 16, 0), (64, 20, 0))
    assert graphs.bucket(1) == (16, 1, 0) and graphs.bucket(17) == (32, 1, 0) and graphs.bucket(65) is None
    assert graphs.bucket(3, 2) == (16, 2, 0) and graphs.bucket(3, 3) == (16, 4, 0)
    assert graphs.bucket(17, 5) == (32, 8, 0) and graphs.bucket(17, 9) == (32, 16, 0)
    assert graphs.bucket(17, 17) == (32, 20, 0) and graphs.bucket(33, 17) == (64, 20, 0)
    assert graphs.bucket(10, 21) is None and graphs.bucket(64, 16) == (64, 16, 0)
    assert graphs.bucket(20, 3, decode_rows=2) == (32, 4, 0)  # no decode lanes: the decode rows count as sequences
    # A padding sequence holds at most a sequence's blocks (32 tokens here): 17 tokens in a bucket of 64 would need 47
    sparse = PrefillGraphs(torch.nn.Identity(), (16, 64), max_blocks_per_seq=4, block_size=8, device="cpu")
    assert sparse.bucket(16) == (16, 1, 0) and sparse.bucket(17) is None and sparse.bucket(40) == (64, 1, 0)


def test_an_eager_steps_decode_rows_fill_whole_lanes_of_four(qwen3_5_text_tied_path):
    """An eager step of 1-3 decode rows and a prompt packs its decode rows, then one-token padding lanes up to a
    multiple of 4 on the null slot, then the prompt: the prompt part's int32 state slots start on a 16-byte boundary
    (Triton compiles a kernel variant per pointer alignment), and its offsets start at its first token."""
    from ops.library import NULL_SLOT

    rt = _runtime(qwen3_5_text_tied_path, "cpu")
    for d in range(1, 4):  # max_num_seqs 4: the prompt is the 4th
        rows = [rt.add_sequence([3, 5, 7]) for _ in range(d)]
        for seq in rows:
            rt.prefill([seq])
            seq.token_ids.append(9)
        prompt = rt.add_sequence([2] * 11)
        step = rt.build_step([*rows, prompt], [1] * d + [11], is_prefill=True, decode_rows=d)
        lanes = 4
        assert step.decode_rows == lanes and step.input_ids.shape == (lanes + 11,)
        assert step.state_slots.tolist() == [s.state_slot for s in rows] + [NULL_SLOT] * (lanes - d) + [
            prompt.state_slot]
        assert step.state_slots[lanes:].data_ptr() % 16 == 0
        assert step.prompt_cu_seqlens.tolist() == [0, 11] and step.cu_seqlens_long.tolist() == [0, 11]
        for seq in [*rows, prompt]:
            rt.release(seq)


def test_decode_rows_past_the_lanes_take_the_chunked_path(qwen3_5_text_tied_path):
    """A prefill step computes its leading one-token sequences in decode lanes where there are 1..mixed_decode_lanes
    of them (here 2), eager as captured; with more, all take the chunked path (no lanes)."""
    rt = _runtime(qwen3_5_text_tied_path, "cpu", mixed_decode_lanes=2)
    seen, execute = [], rt.executor.execute
    rt.executor.execute = lambda step, *args, **kwargs: seen.append(step.decode_rows) or execute(step, *args, **kwargs)
    for d in (1, 2, 3):
        rows = [rt.add_sequence([3, 5, 7]) for _ in range(d)]
        for seq in rows:
            rt.prefill([seq])
            seq.token_ids.append(9)
        prompt = rt.add_sequence([2] * 6)
        seen.clear()
        rt.prefill([*rows, prompt])
        assert seen == [4 if d <= 2 else 0], (d, seen)  # lanes padded to a multiple of four
        for seq in [*rows, prompt]:
            rt.release(seq)


def test_mixed_keys_hold_decode_lanes_before_a_prompt_part_of_up_to_four_sequences():
    """With decode lanes, each token bucket gets a mixed key for the prompt-part sequence buckets of up to 4 (the
    key's tokens and sequences count its prompt part; the lanes come first). A step whose 1..lanes leading one-token
    sequences are decode rows takes the smallest mixed key holding the rest; more decode rows, or a prompt part of
    more than 4 sequences, take a key without lanes, every sequence in its prompt part."""
    graphs = PrefillGraphs(torch.nn.Identity(), (16, 32), max_blocks_per_seq=4, block_size=8, device="cpu",
                           max_sequences=8, decode_lanes=3)
    assert graphs.keys == ((16, 1, 0), (16, 2, 0), (16, 4, 0), (16, 8, 0), (32, 1, 0), (32, 2, 0), (32, 4, 0),
                           (32, 8, 0), (16, 1, 3), (16, 2, 3), (16, 4, 3), (32, 1, 3), (32, 2, 3), (32, 4, 3))
    assert graphs.bucket(20, 2, decode_rows=1) == (32, 1, 3)  # 19 tokens of one prompt after the decode row
    assert graphs.bucket(18, 4, decode_rows=3) == (16, 1, 3)  # 15 tokens of one prompt after 3 decode rows
    assert graphs.bucket(3, 3, decode_rows=3) == (16, 1, 3)  # decode rows alone: an empty prompt part
    assert graphs.bucket(12, 5, decode_rows=2) == (16, 4, 3)
    assert graphs.bucket(12, 4, decode_rows=4) == (16, 4, 0)  # more decode rows than lanes
    assert graphs.bucket(12, 7, decode_rows=2) == (16, 8, 0)  # a prompt part of 5 sequences
    assert graphs.bucket(31, 2, decode_rows=1) == (32, 1, 3) and graphs.bucket(34, 2, decode_rows=1) is None
    assert graphs.buckets[-1] + 3 == graphs.input_ids.shape[0]  # the largest mixed step's tokens fit the buffers
    with pytest.raises(ValueError, match="drafter"):
        PrefillGraphs(torch.nn.Identity(), (16,), 4, 8, "cpu", drafter=lambda *a: None, decode_lanes=2)


# ---------------------------------------------------------------------------- speculative decoding's prompt steps
K = 3  # drafts


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory) -> str:
    return ensure_tiny_model(str(tmp_path_factory.mktemp("tiny") / "model"))  # the tiny default carries mtp.*


def _drafting_run(rt: Runtime, prompt: list[int], chunks: list[int]):
    """``prompt`` in ``chunks`` through speculative decoding's prompt steps, each chunk's drafts (after the last one:
    the prompt's next token, its argmax) and the MTP layer's KV at the prompt's positions: (each chunk's logits, the
    drafts, that KV, the linear layers' states after the prompt)."""
    seq = rt.add_sequence(prompt)
    logits, drafts = [], []
    with torch.inference_mode():
        for n in chunks:
            spec = rt.prefill_for_drafts([seq], [n])
            logits.append(spec.logits)
            drafts.append(rt.draft_after_prefill(spec, spec.logits.argmax(dim=-1)))
    attention = rt.model.mtp.attention
    rows = torch.tensor([seq.block_table[p // 8] * 8 + p % 8 for p in range(len(prompt))])
    kv = [cache.view(-1, *cache.shape[2:])[rows].clone() for cache in (attention.k_cache, attention.v_cache)]
    states = _states(rt, seq.state_slot)
    rt.release(seq)
    return logits, drafts, kv, states


def _assert_drafting_runs_equal(got, want) -> None:
    assert [d.tolist() for d in got[1]] == [d.tolist() for d in want[1]]  # the drafts
    # Within 5e-3 of each tensor's largest value: on a GPU, fp32 matmuls of other row counts round apart in their
    # last bits, and the Triton dots that follow (FLA's chunked delta rule, the attention) round their inputs to TF32
    # (on an H100: logits 1.7e-3 apart at values up to ~7, one MTP key 5.0e-3 at up to ~3.2); a wrong row or state
    # is off by the values' own size
    for got_list, want_list in zip(got[:1] + got[2:], want[:1] + want[2:]):  # logits, KV, states
        for g, w in zip(got_list, want_list):
            torch.testing.assert_close(g, w, atol=5e-3 * float(w.abs().max()), rtol=1e-3)


def _drafting_replays(graphs: PrefillGraphs, chunks: list[int]) -> list[int]:
    """The replays of ``chunks`` run through ``_drafting_run``: each chunk's bucket that has one, and after the last
    chunk (the one that drafts) its drafts' (negative)."""
    return [r for i, n in enumerate(chunks) if graphs.bucket(n) is not None
            for r in (graphs.bucket(n), ("drafts", graphs.bucket(n)))[: 2 if i == len(chunks) - 1 else 1]]


@pytest.fixture(scope="module")
def cpu_drafting_pair(mtp_path):
    return _padded_pair(mtp_path, max_sequences=4, speculative_config={"method": "mtp", "num_speculative_tokens": K,
                                                                       "scripted_drafts": True})


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_padded_drafting_prompt_steps_equal_unpadded_ones(cpu_drafting_pair, data):
    """Speculative decoding's prompt steps of 1-90 tokens, in one chunk or two: a chunk of at most 64 tokens runs
    padded to its bucket and, where it completes the prompt, drafts from the drafts' graph; the logits, the K drafts,
    the MTP layer's KV at every prompt position and the linear states equal an unpadded runtime's, which runs
    everything eagerly."""
    padded, plain, graphs = cpu_drafting_pair
    length, chunks = _draw_chunks(data)
    prompt = [(11 * i + 5) % 200 + 1 for i in range(length)]
    graphs.replays.clear()
    got = _drafting_run(padded, prompt, chunks)
    want = _drafting_run(plain, prompt, chunks)
    assert graphs.replays == _drafting_replays(graphs, chunks)
    assert [tuple(d.shape) for d in got[1]] == [(0, K)] * (len(chunks) - 1) + [(1, K)]
    _assert_drafting_runs_equal(got, want)


def _several_drafting_run(rt: Runtime, prompts: list[list[int]], counts: list[int]):
    """One speculative prompt step of ``counts[i]`` tokens of each prompt's sequence, then the drafts after those it
    completes: (the step's logits, the drafts, the MTP layer's KV at the computed positions, each sequence's linear
    states)."""
    seqs = [rt.add_sequence(p) for p in prompts]
    with torch.inference_mode():
        spec = rt.prefill_for_drafts(seqs, counts)
        drafts = rt.draft_after_prefill(spec, spec.logits.argmax(dim=-1))
    attention = rt.model.mtp.attention
    rows = torch.tensor([s.block_table[p // 8] * 8 + p % 8 for s, n in zip(seqs, counts) for p in range(n)])
    kv = [cache.view(-1, *cache.shape[2:])[rows].clone() for cache in (attention.k_cache, attention.v_cache)]
    states = [t for s in seqs for t in _states(rt, s.state_slot)]
    for seq in seqs:
        rt.release(seq)
    return [spec.logits], [drafts], kv, states


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_padded_drafting_steps_of_several_sequences_equal_unpadded_ones(cpu_drafting_pair, data):
    """Speculative prompt steps of 2-4 sequences of 1-16 tokens, each completing its prompt or computing a first
    chunk of it: the step replays its key (2 or 4 sequences) and, where one or more prompts complete, the key's drafts
    graph, whose rows past theirs draft into the padding; the logits, the drafts of the completed prompts (in order),
    the MTP layer's KV at every computed position and the linear states equal an unpadded runtime's."""
    padded, plain, graphs = cpu_drafting_pair
    n = data.draw(st.integers(2, 4), label="sequences")
    lengths = data.draw(st.lists(st.integers(1, 16), min_size=n, max_size=n), label="prompt lengths")
    counts = [data.draw(st.integers(1, length), label="tokens this step") for length in lengths]
    prompts = [[(11 * i + 7 * j) % 200 + 1 for i in range(length)] for j, length in enumerate(lengths)]
    graphs.replays.clear()
    got = _several_drafting_run(padded, prompts, counts)
    want = _several_drafting_run(plain, prompts, counts)
    key = graphs.bucket(sum(counts), n)
    completed = sum(c == length for c, length in zip(counts, lengths))
    assert key[1] == {2: 2, 3: 4, 4: 4}[n] and graphs.replays == [key] + ([("drafts", key)] if completed else [])
    assert got[1][0].shape == (completed, K)
    _assert_drafting_runs_equal(got, want)


def test_drafts_after_another_prompt_step_replayed_in_between(cpu_drafting_pair):
    """Two prompts' steps, then each one's drafts: the drafts' graph takes the first step's fields and hidden states
    back into its buffers, and both drafts equal those of prompts run one at a time."""
    padded, plain, graphs = cpu_drafting_pair
    prompts = [[(3 * i + 1) % 200 + 1 for i in range(20)], [(7 * i + 2) % 200 + 1 for i in range(40)]]
    want = [_drafting_run(plain, p, [len(p)])[1][0] for p in prompts]
    seqs = [padded.add_sequence(p) for p in prompts]
    graphs.replays.clear()
    with torch.inference_mode():
        specs = [padded.prefill_for_drafts([seq]) for seq in seqs]
        got = [padded.draft_after_prefill(s, s.logits.argmax(dim=-1)) for s in specs]
    keys = [graphs.bucket(len(p), 1) for p in prompts]
    assert keys[0] != keys[1] and graphs.replays == keys + [("drafts", key) for key in keys]
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    for seq in seqs:
        padded.release(seq)


def test_padded_drafting_prompt_steps_read_the_draft_script(cpu_drafting_pair):
    """A scripted sequence's drafts after its prompt (speculative_config ``scripted_drafts``: bench spec's forced
    acceptance) come from the drafts' graph as the script has them, where the script covers them, and as the
    unpadded runtime drafts them (the MTP layer's) where it does not."""
    padded, plain, graphs = cpu_drafting_pair
    prompt = [(13 * i + 4) % 200 + 1 for i in range(30)]
    script = [-1] * 32 + [7, -1, 9]  # the drafts for positions 32 and 34 (the prompt's next token is position 30)
    drafts = []
    for rt in (padded, plain):
        seq = rt.add_sequence(prompt)
        rt.script_drafts(seq, script)
        with torch.inference_mode():
            spec = rt.prefill_for_drafts([seq])
            drafts.append(rt.draft_after_prefill(spec, spec.logits.argmax(dim=-1))[0].tolist())
        rt.script_drafts(seq, [])
        rt.release(seq)
    assert drafts[0] == drafts[1] and drafts[0][1] == 7 and graphs.replays[-1] == ("drafts", (32, 1, 0))


def test_engine_on_padded_drafting_prompt_steps_equals_non_speculative(cpu_drafting_pair, mtp_path):
    """LLMEngine with MTP on the padded prompt steps (prompts of 3-80 tokens: one alone in its step, several in one,
    one past the buckets) emits the greedy tokens of a non-speculative runtime, its prompt steps replayed their keys'
    drafts, and every draft it made equals the same engine's on unpadded steps."""
    from compiled_engine.engine import LLMEngine
    from compiled_engine.sampling_params import SamplingParams

    padded, plain, graphs = cpu_drafting_pair
    prompts = [[(17 * i + j) % 200 + 1 for i in range(n)] for j, n in enumerate([3, 20, 40, 64, 80])]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs, drafts = {}, {"padded": [], "unpadded": []}

    def recorder(seen: list):  # a draft_override that keeps each request's drafts as they come
        def record(request_id, token_ids, proposed):
            seen.append((request_id, len(token_ids), list(proposed)))
            return proposed
        return record

    for name, rt in [("padded", padded), ("unpadded", plain), ("non-speculative", _runtime(mtp_path, "cpu"))]:
        # A step of at most 64 tokens: prompts one or two a step
        engine = LLMEngine(rt, max_num_batched_tokens=64,
                           draft_override=recorder(drafts[name]) if name in drafts else None)
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, params)
        graphs.replays.clear()
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[name, out.request_id] = out.outputs[0].token_ids
        if name == "padded":
            assert any(r[0] == "drafts" for r in graphs.replays), graphs.replays
    for i in range(len(prompts)):
        assert outputs["padded", str(i)] == outputs["unpadded", str(i)] == outputs["non-speculative", str(i)], i
    assert drafts["padded"] == drafts["unpadded"] and len(drafts["padded"]) > len(prompts)


def test_prefill_buckets_stop_at_every_limit():
    """Powers of two from 16 to LARGE_BUCKET_STEP, then every LARGE_BUCKET_STEP tokens; none past the capture limit,
    the step budget or twice max_model_len."""
    from graphs.prefill_graph import LARGE_BUCKET_STEP

    step = LARGE_BUCKET_STEP
    short = tuple(2**i for i in range(4, 30) if 2**i <= step)
    assert prefill_buckets(8192, 16384, 9216) == short + tuple(range(2 * step, 8192 + 1, step))
    assert prefill_buckets(8192, 16384, 3 * step + 5) == short + tuple(range(2 * step, 6 * step + 1, step))
    assert prefill_buckets(3 * step + 5, 16384, 9216) == short + (2 * step, 3 * step)
    assert prefill_buckets(8192, step - 1, 9216) == short[:-1]
    assert prefill_buckets(8192, 100, 9216) == (16, 32, 64)
    assert prefill_buckets(8192, 16384, 40) == (16, 32, 64)
    assert prefill_buckets(8192, 16384, 15) == (16,)
    assert prefill_buckets(8192, 16384, 7) == ()
    assert prefill_buckets(0, 16384, 9216) == ()


def _record_replays(graphs: PrefillGraphs) -> list:
    """The keys ``graphs`` replays from now on, in order (a drafts graph's as ``("drafts", key)``): a step it does not
    cover runs eagerly without a word, so a test of the capture must see its replays."""
    replays = []
    replay, replay_draft = graphs._replay, graphs._replay_draft
    graphs._replay = lambda key: replays.append(key) or replay(key)
    graphs._replay_draft = lambda key: replays.append(("drafts", key)) or replay_draft(key)
    return replays


@pytest.mark.gpu
def test_captured_prompt_steps_equal_eager_ones_on_gpu(qwen3_5_text_tied_path, monkeypatch):
    """The real capture: prompts of 1-70 tokens (bucket edges, a second chunk continuing a first) replayed from the
    captured graphs give the eager runtime's logits, states and greedy continuation. The eager runtime takes the
    chunked delta rule too (as the graphs do: ``graphed``), so that only the capture and the padding are compared
    (both forms against the fp32 reference: tests/test_kernels_cuda.py)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from ops.triton import delta_rule_kernels

    monkeypatch.setattr(delta_rule_kernels, "RECURRENT_PREFILL_MAX_TOKENS", 0)
    # No decode lanes on either side: a one-token prompt takes the chunked path in both
    captured, plain = (_runtime(qwen3_5_text_tied_path, "cuda", mixed_decode_lanes=0) for _ in range(2))
    live = captured.add_sequence([3, 1, 4, 1, 5, 9, 2, 6])  # a sequence the capture must leave as it is
    captured.prefill([live])
    before = _states(captured, live.state_slot)
    graphs = captured.executor.compile_prefill(BUCKETS)
    assert graphs is not None and tuple(graphs._graphs) == tuple((b, 1, 0) for b in BUCKETS[::-1])
    for got, want in zip(_states(captured, live.state_slot), before):
        assert torch.equal(got, want)
    captured.release(live)
    replays = _record_replays(graphs)
    for length, chunks in [(1, [1]), (15, [15]), (16, [16]), (17, [17]), (64, [64]), (70, [6, 64]), (90, [30, 60])]:
        prompt = [(5 * i + 2) % 50 + 1 for i in range(length)]
        replays.clear()
        got_logits, got_states, got_tokens = _run(captured, prompt, chunks, 6)
        assert replays == [graphs.bucket(n) for n in chunks], (length, chunks)  # every chunk replayed a graph
        want_logits, want_states, want_tokens = _run(plain, prompt, chunks, 6)
        for got, want in zip(got_logits, want_logits):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        for got, want in zip(got_states, want_states):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert got_tokens == want_tokens, (length, chunks)


@pytest.mark.gpu
def test_captured_chunked_prompt_steps_equal_eager_ones_on_gpu(qwen3_5_text_tied_path):
    """Captured steps run FLA's chunked delta rule (``graphed``) with the chunk table padded by skip rows to the
    bucket's length: prompts ending inside a chunk, on a chunk edge, filling the bucket (the padding empty), and a
    second chunk continuing a first, against the eager runtime (which takes the recurrent form up to
    RECURRENT_PREFILL_MAX_TOKENS and the chunked one past it)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    buckets = (1024, 2048)
    captured, plain = (_runtime(qwen3_5_text_tied_path, "cuda", 4096) for _ in range(2))
    graphs = captured.executor.compile_prefill(buckets)
    assert graphs is not None and tuple(graphs._graphs) == tuple((b, 1, 0) for b in buckets[::-1])
    cases = [(600, [600]), (1024, [1024]), (1088, [1088]), (1500, [1500]), (2048, [2048]), (2000, [700, 1300])]
    replays = _record_replays(graphs)
    for length, chunks in cases:
        replays.clear()
        prompt = [(5 * i + 2) % 50 + 1 for i in range(length)]
        got_logits, got_states, got_tokens = _run(captured, prompt, chunks, 4)
        assert replays == [graphs.bucket(n) for n in chunks], (length, chunks)
        want_logits, want_states, want_tokens = _run(plain, prompt, chunks, 4)
        for got, want in zip(got_logits, want_logits):
            torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)  # matmuls of other row counts round apart
        for got, want in zip(got_states, want_states):
            torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
        assert got_tokens == want_tokens, (length, chunks)


@pytest.mark.gpu
def test_captured_steps_of_several_sequences_equal_eager_ones_on_gpu(qwen3_5_text_tied_path, monkeypatch):
    """The real capture of steps of several sequences: prompts together and mixed steps (decode rows whose token
    comes from the device), 1-4 sequences, replay their key (up to 2 leading decode rows in a mixed key's decode
    lanes) and give the logits, states and greedy continuation of the eager runtime of the same decode lanes (the
    same ops: its decode rows, up to 2, through the decode op, more on the chunked path; the chunked delta rule too,
    as the graphs). That the two paths compute the same: the CPU tests against the chunked path (exact references),
    the GPU kernels' tests against the references."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from ops.triton import delta_rule_kernels

    monkeypatch.setattr(delta_rule_kernels, "RECURRENT_PREFILL_MAX_TOKENS", 0)
    captured, plain = (_runtime(qwen3_5_text_tied_path, "cuda", mixed_decode_lanes=2) for _ in range(2))
    graphs = captured.executor.compile_prefill(BUCKETS, 4, decode_lanes=2)
    assert graphs is not None and set(graphs._graphs) == {(b, s, lanes) for b in BUCKETS for s in (1, 2, 4)
                                                          for lanes in (0, 2)}
    replays = _record_replays(graphs)
    # (prompt lengths, decode rows) and the key: (tokens, sequences) of the prompt part, then the decode lanes
    cases = [([5, 9], [False, False], (16, 2, 0)), ([12, 30, 1], [False, True, True], (16, 4, 0)),
             ([16] * 4, [True] * 4, (16, 4, 0)), ([3, 40, 7, 2], [True, False, False, True], (64, 4, 2)),
             ([60, 4], [False, False], (64, 2, 0)), ([20, 20, 20], [True] * 3, (16, 4, 0)),
             ([2, 2, 9], [True, True, False], (16, 1, 2)), ([5, 5], [True, True], (16, 1, 2)),
             ([1, 6], [False, False], (16, 1, 2)), ([4, 30, 20], [True, False, False], (64, 2, 2))]
    for lengths, decode_rows, key in cases:
        prompts = [[(5 * i + 3 * j) % 50 + 1 for i in range(n)] for j, n in enumerate(lengths)]
        replays.clear()
        got = _several_run(captured, prompts, decode_rows)
        assert replays[-1] == key, (lengths, decode_rows, replays)
        want = _several_run(plain, prompts, decode_rows)
        _assert_several_runs_equal(got, want, 5e-3)


@pytest.mark.gpu
def test_captured_drafting_prompt_steps_equal_eager_ones_on_gpu(mtp_path, monkeypatch):
    """The real capture of speculative decoding's prompt steps and their drafts: prompts of 1-90 tokens (bucket
    edges, a second chunk continuing a first) give the eager runtime's logits, drafts, MTP KV and states; every
    chunk of at most 64 tokens replays its bucket's prompt graph, and a completing one its drafts' graph. The eager
    runtime takes the chunked delta rule too, as the graphs do (as in
    test_captured_prompt_steps_equal_eager_ones_on_gpu)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from ops.triton import delta_rule_kernels

    monkeypatch.setattr(delta_rule_kernels, "RECURRENT_PREFILL_MAX_TOKENS", 0)
    config = {"method": "mtp", "num_speculative_tokens": K}
    captured, plain = (_runtime(mtp_path, "cuda", speculative_config=config) for _ in range(2))
    graphs = captured.executor.compile_prefill(BUCKETS)
    assert graphs is not None and tuple(graphs._draft_graphs) == tuple((b, 1, 0) for b in BUCKETS[::-1])
    replays = _record_replays(graphs)
    for length, chunks in [(1, [1]), (15, [15]), (16, [16]), (17, [17]), (64, [64]), (70, [6, 64]), (90, [30, 60])]:
        replays.clear()
        prompt = [(5 * i + 2) % 200 + 1 for i in range(length)]
        got = _drafting_run(captured, prompt, chunks)
        want = _drafting_run(plain, prompt, chunks)
        assert replays == _drafting_replays(graphs, chunks)
        _assert_drafting_runs_equal(got, want)


@pytest.mark.gpu
def test_captured_drafting_steps_of_several_sequences_equal_eager_ones_on_gpu(mtp_path, monkeypatch):
    """The real capture of speculative prompt steps of several sequences with their drafts: steps of 2-4 sequences,
    some completing their prompts and some not, replay their key's prompt graph and drafts graph and give the eager
    runtime's logits, drafts, MTP KV and states."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from ops.triton import delta_rule_kernels

    monkeypatch.setattr(delta_rule_kernels, "RECURRENT_PREFILL_MAX_TOKENS", 0)
    config = {"method": "mtp", "num_speculative_tokens": K}
    captured, plain = (_runtime(mtp_path, "cuda", speculative_config=config) for _ in range(2))
    graphs = captured.executor.compile_prefill(BUCKETS, max_sequences=4)
    assert graphs is not None and (BUCKETS[0], 4, 0) in graphs._draft_graphs
    replays = _record_replays(graphs)
    # (prompt lengths, tokens this step): all complete; one of three a first chunk; none completes; a 4th drafts last
    for lengths, counts in [([5, 9], [5, 9]), ([12, 3, 20], [12, 2, 20]), ([8, 8], [4, 7]), ([1, 30, 2, 16],
                                                                                             [1, 10, 2, 16])]:
        replays.clear()
        prompts = [[(5 * i + 3 * j) % 200 + 1 for i in range(n)] for j, n in enumerate(lengths)]
        got = _several_drafting_run(captured, prompts, counts)
        want = _several_drafting_run(plain, prompts, counts)
        key = graphs.bucket(sum(counts), len(counts))
        completed = sum(c == n for c, n in zip(counts, lengths))
        assert replays == [key] + ([("drafts", key)] if completed else []), (lengths, counts)
        _assert_drafting_runs_equal(got, want)

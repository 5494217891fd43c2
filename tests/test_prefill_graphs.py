"""Captured prompt steps (graphs/prefill_graph.py): a prompt step of one sequence, padded to its bucket by a
padding sequence on the null slot and block and replayed, computes what the unpadded eager step computes.

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
        self.replays: list[int] = []

    def capture(self) -> None:
        self._graphs = dict.fromkeys(self.buckets)

    def _replay(self, bucket: int) -> torch.Tensor:
        self.replays.append(bucket)
        return self._forward(self._step(bucket))

    def _replay_draft(self, bucket: int) -> torch.Tensor:
        self.replays.append(-bucket)  # negative: the bucket's drafts
        return self._draft(self._step(bucket))


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


def _padded_pair(path, **knobs) -> tuple[Runtime, Runtime, EagerPrefillGraphs]:
    """Two CPU runtimes on ``path``: the first's prompt steps of one sequence run padded on EagerPrefillGraphs (with
    the executor's drafter under speculative decoding), the second's unpadded."""
    padded, plain = _runtime(path, "cpu", **knobs), _runtime(path, "cpu", **knobs)
    graphs = EagerPrefillGraphs(padded.model, BUCKETS, max_blocks_per_seq=16, block_size=8, device="cpu",
                                drafter=padded.executor.prompt_drafter())
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
            for r in (graphs.bucket(n), -graphs.bucket(n))[: 2 if i == len(chunks) - 1 else 1]]


@pytest.fixture(scope="module")
def cpu_drafting_pair(mtp_path):
    return _padded_pair(mtp_path, speculative_config={"method": "mtp", "num_speculative_tokens": K,
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


def test_drafts_after_another_prompt_step_replayed_in_between(cpu_drafting_pair):
    """Two prompts' steps, then each one's drafts: the drafts' graph takes the first step's fields and hidden states
    back into its buffers, and both drafts equal those of prompts run one at a time."""
    padded, plain, graphs = cpu_drafting_pair
    prompts = [[(3 * i + 1) % 200 + 1 for i in range(20)], [(7 * i + 2) % 200 + 1 for i in range(40)]]
    want = [_drafting_run(plain, p, [len(p)])[1][0] for p in prompts]
    seqs = [padded.add_sequence(p) for p in prompts]
    with torch.inference_mode():
        specs = [padded.prefill_for_drafts([seq]) for seq in seqs]
        got = [padded.draft_after_prefill(s, s.logits.argmax(dim=-1)) for s in specs]
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
    assert drafts[0] == drafts[1] and drafts[0][1] == 7 and graphs.replays[-1] == -32


def test_engine_on_padded_drafting_prompt_steps_equals_non_speculative(cpu_drafting_pair, mtp_path):
    """LLMEngine with MTP on the padded prompt steps (prompts of 3-80 tokens: one alone in its step, several in one,
    one past the buckets) emits the greedy tokens of a non-speculative runtime, its prompt steps of one sequence
    replayed their buckets' drafts, and every draft it made equals the same engine's on unpadded steps."""
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
            assert any(r < 0 for r in graphs.replays), graphs.replays
    for i in range(len(prompts)):
        assert outputs["padded", str(i)] == outputs["unpadded", str(i)] == outputs["non-speculative", str(i)], i
    assert drafts["padded"] == drafts["unpadded"] and len(drafts["padded"]) > len(prompts)


def test_prefill_buckets_stop_at_every_limit():
    """Powers of two from 16 to LARGE_BUCKET_STEP, then every LARGE_BUCKET_STEP tokens; none past the capture limit,
    the step budget or max_model_len."""
    from graphs.prefill_graph import LARGE_BUCKET_STEP

    step = LARGE_BUCKET_STEP
    short = tuple(2**i for i in range(4, 30) if 2**i <= step)
    assert prefill_buckets(8192, 16384, 9216) == short + tuple(range(2 * step, 8192 + 1, step))
    assert prefill_buckets(8192, 16384, 3 * step + 5) == short + (2 * step, 3 * step)
    assert prefill_buckets(3 * step + 5, 16384, 9216) == short + (2 * step, 3 * step)
    assert prefill_buckets(8192, step - 1, 9216) == short[:-1]
    assert prefill_buckets(8192, 100, 9216) == (16, 32, 64)
    assert prefill_buckets(8192, 16384, 40) == (16, 32)
    assert prefill_buckets(8192, 16384, 15) == ()
    assert prefill_buckets(0, 16384, 9216) == ()


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
    captured, plain = _runtime(qwen3_5_text_tied_path, "cuda"), _runtime(qwen3_5_text_tied_path, "cuda")
    live = captured.add_sequence([3, 1, 4, 1, 5, 9, 2, 6])  # a sequence the capture must leave as it is
    captured.prefill([live])
    before = _states(captured, live.state_slot)
    graphs = captured.executor.compile_prefill(BUCKETS)
    assert graphs is not None and tuple(graphs._graphs) == BUCKETS[::-1]
    for got, want in zip(_states(captured, live.state_slot), before):
        assert torch.equal(got, want)
    captured.release(live)
    for length, chunks in [(1, [1]), (15, [15]), (16, [16]), (17, [17]), (64, [64]), (70, [6, 64]), (90, [30, 60])]:
        prompt = [(5 * i + 2) % 50 + 1 for i in range(length)]
        got_logits, got_states, got_tokens = _run(captured, prompt, chunks, 6)
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
    assert graphs is not None and tuple(graphs._graphs) == buckets[::-1]
    cases = [(600, [600]), (1024, [1024]), (1088, [1088]), (1500, [1500]), (2048, [2048]), (2000, [700, 1300])]
    for length, chunks in cases:
        replays = []
        replay = graphs._replay
        graphs._replay = lambda bucket: replays.append(bucket) or replay(bucket)
        prompt = [(5 * i + 2) % 50 + 1 for i in range(length)]
        try:
            got_logits, got_states, got_tokens = _run(captured, prompt, chunks, 4)
        finally:
            graphs._replay = replay
        assert replays == [graphs.bucket(n) for n in chunks], (length, chunks)
        want_logits, want_states, want_tokens = _run(plain, prompt, chunks, 4)
        for got, want in zip(got_logits, want_logits):
            torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)  # matmuls of other row counts round apart
        for got, want in zip(got_states, want_states):
            torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
        assert got_tokens == want_tokens, (length, chunks)


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
    assert graphs is not None and tuple(graphs._draft_graphs) == BUCKETS[::-1]
    replays = []
    replay, replay_draft = graphs._replay, graphs._replay_draft
    graphs._replay = lambda bucket: replays.append(bucket) or replay(bucket)
    graphs._replay_draft = lambda bucket: replays.append(-bucket) or replay_draft(bucket)
    for length, chunks in [(1, [1]), (15, [15]), (16, [16]), (17, [17]), (64, [64]), (70, [6, 64]), (90, [30, 60])]:
        replays.clear()
        prompt = [(5 * i + 2) % 200 + 1 for i in range(length)]
        got = _drafting_run(captured, prompt, chunks)
        want = _drafting_run(plain, prompt, chunks)
        assert replays == _drafting_replays(graphs, chunks)
        _assert_drafting_runs_equal(got, want)

"""Public entry points reject bad configuration and bad input with a ValueError that names the field, and a rejected
request leaves the engine serving the others with unchanged output.

* knobs (LLM and Runtime.from_pretrained): block_size (power of two), num_kv_blocks, max_num_seqs,
  max_num_batched_tokens, max_model_len, gpu_memory_utilization, state_dtype, and wrong types (a float or string
  for an int, a string for a bool); numpy ints are ints; dtype: only float32/bfloat16/float16 (by name or object);
  the memory plan fails clearly when one max_model_len sequence cannot fit in the KV blocks;
* requests: empty / over-long prompt, token id out of range or not an integer (numpy and 0-d torch ints are ids,
  bools are not), every SamplingParams field out of its range or of the wrong type, stop token ids out of the
  vocabulary, duplicate request id, unknown id for abort; a temperature below 1e-5 is greedy;
* LLM.generate and LLM.chat: vLLM's prompt forms (TokensPrompt dicts, one prompt as an array) work; prompts, params,
  messages, chat_template_kwargs and devices of the wrong form are named, params changed after construction too;
* a stream with every kind of bad call in the middle still finishes the good requests with HF's greedy tokens
  (and seeded sampled ones with their solo tokens), and leaves no block or slot behind.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_engine import Runtime, SamplingParams
from compiled_engine.config import RuntimeConfig
from compiled_engine.runtime import resolve_device, resolve_dtype
from tests import hf_models
from tests.test_engine import GREEDY, MODEL, VOCAB, assert_clean, drain, hf_greedy, make_llm, prompt


@pytest.fixture(scope="module")
def model_path(build_hf_model):
    return build_hf_model(MODEL)


@pytest.fixture(scope="module")
def llm(model_path):
    return make_llm(model_path, max_model_len=64, max_num_seqs=4, block_size=8, max_num_batched_tokens=32)


@pytest.fixture
def engine(llm):
    assert_clean(llm.engine)
    yield llm.engine
    assert_clean(llm.engine)


# --------------------------------------------------------------------------------------------------------------
# Knobs
# --------------------------------------------------------------------------------------------------------------

BAD_KNOBS = [
    (dict(block_size=3), "block_size"),
    (dict(block_size=12), "block_size"),
    (dict(block_size=0), "block_size"),
    (dict(block_size=-4), "block_size"),
    (dict(num_kv_blocks=1), "num_kv_blocks"),
    (dict(num_kv_blocks=0), "num_kv_blocks"),
    (dict(num_kv_blocks=-3), "num_kv_blocks"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_seqs=-1), "max_num_seqs"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(max_model_len=0), "max_model_len"),
    (dict(max_model_len=-8), "max_model_len"),
    (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=-0.2), "gpu_memory_utilization"),
    (dict(state_dtype=torch.float16), "state_dtype"),
    # wrong types: vLLM takes no float or string for an int option, and no string for a bool
    (dict(max_num_seqs="4"), "max_num_seqs"),
    (dict(max_num_seqs=2.5), "max_num_seqs"),
    (dict(max_num_seqs=True), "max_num_seqs"),
    (dict(num_kv_blocks=100.5), "num_kv_blocks"),
    (dict(block_size=16.0), "block_size"),
    (dict(max_model_len="64"), "max_model_len"),
    (dict(max_num_batched_tokens="8"), "max_num_batched_tokens"),
    (dict(gpu_memory_utilization="0.5"), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=float("nan")), "gpu_memory_utilization"),
    (dict(enable_prefix_caching="false"), "enable_prefix_caching"),
    (dict(enable_prefix_caching=1), "enable_prefix_caching"),
    (dict(state_dtype="float32"), "state_dtype"),
    (dict(attention_backend=None), "attention_backend"),
    (dict(max_prefill_capture_tokens=-1), "max_prefill_capture_tokens"),
    (dict(max_prefill_capture_tokens=512.0), "max_prefill_capture_tokens"),
    (dict(max_prefill_capture_seqs=0), "max_prefill_capture_seqs"),
    (dict(max_prefill_capture_seqs=4.0), "max_prefill_capture_seqs"),
    (dict(mixed_decode_lanes=-1), "mixed_decode_lanes"),
    (dict(mixed_decode_lanes=16.0), "mixed_decode_lanes"),
]


KNOB_IDS = ["{}={}".format(*next(iter(knobs.items()))) for knobs, _ in BAD_KNOBS]


@pytest.mark.parametrize("knobs,field", BAD_KNOBS, ids=KNOB_IDS)
def test_bad_knob_names_the_field(model_path, knobs, field):
    with pytest.raises(ValueError, match=field):
        make_llm(model_path, **knobs)


@pytest.mark.parametrize("knobs,field", [BAD_KNOBS[0], BAD_KNOBS[4], BAD_KNOBS[7], BAD_KNOBS[10], BAD_KNOBS[13]])
def test_bad_knob_names_the_field_in_the_runtime_api(model_path, knobs, field):
    with pytest.raises(ValueError, match=field):
        Runtime.from_pretrained(str(model_path), device="cpu", dtype="float32", **knobs)


@pytest.mark.parametrize("knobs,field", BAD_KNOBS, ids=KNOB_IDS)
def test_bad_knob_is_named_by_runtime_config_validate(knobs, field):
    with pytest.raises(ValueError, match=field):
        RuntimeConfig(**knobs).validate()


def test_numpy_ints_are_int_knobs():
    """Any numbers.Integral is an int option (numpy's ints from a config sweep); validate stores a Python int."""
    config = RuntimeConfig(max_num_seqs=np.int64(4), block_size=np.int32(8), num_kv_blocks=np.uint16(40))
    config.validate()
    assert (config.max_num_seqs, config.block_size, config.num_kv_blocks) == (4, 8, 40)
    assert all(type(v) is int for v in (config.max_num_seqs, config.block_size, config.num_kv_blocks))


@pytest.mark.parametrize("dtype", [torch.int8, torch.float64, torch.bool, "int8", "fp32", "torch.float32", 16, 3.0])
def test_unsupported_dtype_is_named(model_path, dtype):
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype(dtype, torch.device("cpu"))
    with pytest.raises(ValueError, match="dtype"):  # the public entry point, before anything is loaded
        Runtime.from_pretrained(str(model_path), device="cpu", dtype=dtype)


def test_supported_dtypes_by_name_object_and_alias():
    cpu = torch.device("cpu")
    expected = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "half": torch.float16, "float": torch.float32, "auto": torch.float32, None: torch.float32,
                torch.bfloat16: torch.bfloat16, torch.float16: torch.float16, torch.float32: torch.float32}
    assert {d: resolve_dtype(d, cpu) for d in expected} == expected


def test_memory_plan_fails_clearly_when_one_sequence_cannot_fit(model_path):
    # 128 tokens in blocks of 16 need 8 blocks; 8 blocks minus the reserved null block leave 7.
    with pytest.raises(ValueError, match=r"max_model_len=128.*8 KV blocks.*7 fit.*num_kv_blocks"):
        make_llm(model_path, max_model_len=128, block_size=16, num_kv_blocks=8)
    with pytest.raises(ValueError, match="max_model_len"):
        make_llm(model_path, max_model_len=4096, block_size=4, num_kv_blocks=100)
    llm = make_llm(model_path, max_model_len=128, block_size=16, num_kv_blocks=9)  # exactly one fits: it runs
    out = llm.generate(prompt(120, 40), SamplingParams(max_tokens=20, **GREEDY), use_tqdm=False)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 8  # capped by max_model_len
    assert_clean(llm.engine)


# --------------------------------------------------------------------------------------------------------------
# Bad requests
# --------------------------------------------------------------------------------------------------------------

BAD_PARAMS = [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
    (dict(top_p=-0.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=1.5), "min_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=-3), "max_tokens"),
    (dict(min_tokens=-1), "min_tokens"),
    (dict(max_tokens=4, min_tokens=5), "min_tokens"),
    (dict(seed=2**64), "seed"),
    (dict(seed=-(2**63) - 1), "seed"),
    # wrong types and non-finite values
    (dict(temperature="0.5"), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(temperature=float("inf"), min_tokens=2, max_tokens=4), "temperature"),  # it used to give id 0 every time
    (dict(temperature=None), "temperature"),
    (dict(top_p="1"), "top_p"),
    (dict(min_p=float("nan")), "min_p"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_k="3"), "top_k"),
    (dict(max_tokens=2.0), "max_tokens"),
    (dict(max_tokens=True), "max_tokens"),
    (dict(min_tokens="1"), "min_tokens"),
    (dict(seed=1.5), "seed"),
    (dict(ignore_eos="no"), "ignore_eos"),
    (dict(stop_token_ids=5), "stop_token_ids"),
    (dict(stop_token_ids="7"), "stop_token_ids"),
    (dict(stop_token_ids=[-1]), "stop_token_ids"),
    (dict(stop_token_ids=["7"]), "stop_token_ids"),
    (dict(stop_token_ids=[3, 4.0]), "stop_token_ids"),
    (dict(stop_token_ids=[True]), "stop_token_ids"),
    (dict(stop_token_ids=[torch.tensor([3])]), "stop_token_ids"),
    (dict(n=0), "n"),
    (dict(prompt_logprobs=21), "prompt_logprobs"),
    (dict(include_stop_str_in_output="yes"), "include_stop_str_in_output"),
    (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
    (dict(truncate_prompt_tokens=2.0), "truncate_prompt_tokens"),
    (dict(skip_special_tokens=0), "skip_special_tokens"),
    (dict(prompt_logprobs=-1), "prompt_logprobs"),
    (dict(n=True), "n"),
]


@pytest.mark.parametrize("fields,field", BAD_PARAMS, ids=[f"{f}" for f, _ in BAD_PARAMS])
def test_bad_sampling_params_name_the_field(fields, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**fields)


def test_integer_scalars_of_any_kind_are_ids():
    """numpy and 0-d torch integers are ids, stored as Python ints; the temperature-0 re-check stays greedy."""
    params = SamplingParams(stop_token_ids=(np.int64(3), torch.tensor(4), np.uint8(5)), top_k=np.int32(7),
                            max_tokens=np.int64(9), seed=np.int64(-2))
    assert params.stop_token_ids == [3, 4, 5] and all(type(t) is int for t in params.stop_token_ids)
    assert (params.top_k, params.max_tokens, params.seed) == (7, 9, -2)
    assert all(type(v) is int for v in (params.top_k, params.max_tokens, params.seed))


@pytest.mark.parametrize("temperature", [1e-30, 1e-38, 5e-324, 9.9e-6])
def test_a_temperature_below_the_sampling_eps_is_greedy(temperature):
    """vLLM's rule: temperature < 1e-5 is greedy. It is stored as 0 so the sampler never scales by 1 / 1e-38."""
    params = SamplingParams(temperature=temperature)
    assert params.greedy and params.temperature == 0.0
    assert not SamplingParams(temperature=1e-5).greedy  # the boundary itself samples, as in vLLM


def test_validate_rechecks_params_changed_after_construction():
    """SamplingParams.validate() is the re-validation entry point for params mutated after construction."""
    params = SamplingParams()
    for field, value in (("temperature", "hot"), ("temperature", float("inf")), ("stop_token_ids", 5),
                         ("max_tokens", 0), ("top_p", 2.0)):
        params = SamplingParams()
        setattr(params, field, value)
        with pytest.raises(ValueError, match=field):
            params.validate()
    params.top_p = 0.5
    params.temperature, params.stop_token_ids = 1e-30, [np.int64(3)]
    params.validate()
    assert params.greedy and params.temperature == 0.0 and params.stop_token_ids == [3]
    params.validate()  # idempotent
    assert params.stop_token_ids == [3]


BAD_REQUESTS = [
    ([], None, "prompt is empty"),
    (prompt(65), None, "max_model_len"),  # max_model_len is 64
    ([1, VOCAB], None, "token id"),
    ([-1, 2], None, "token id"),
    ([1, 2.0], None, "token id"),
    ([1, 2], SamplingParams(stop_token_ids=[VOCAB]), "stop_token_ids"),
    ([1, True], None, "token id"),
    ([1, np.bool_(True)], None, "token id"),
    ([1, torch.tensor(2.0)], None, "token id"),
    ([1, np.int64(VOCAB)], None, "token id"),
    ([1, 2], {"temperature": 0}, "sampling params"),
]


@pytest.mark.parametrize("tokens,params,match", BAD_REQUESTS, ids=[m for _, _, m in BAD_REQUESTS])
def test_bad_request_names_the_field_and_queues_nothing(engine, tokens, params, match):
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", tokens, params)
    assert not engine.requests and not engine.scheduler.waiting


def test_duplicate_and_unknown_request_ids(engine):
    engine.add_request("x", [1, 2, 3], SamplingParams(max_tokens=2, **GREEDY))
    with pytest.raises(ValueError, match="request id 'x'"):
        engine.add_request("x", [4, 5], SamplingParams(max_tokens=2, **GREEDY))
    with pytest.raises(ValueError, match="request id 'y'"):
        engine.abort_request("y")
    assert list(engine.requests) == ["x"]
    drain(engine)
    with pytest.raises(ValueError, match="request id 'x'"):  # finished: gone
        engine.abort_request("x")
    engine.add_request("x", [4, 5], SamplingParams(max_tokens=2, **GREEDY))  # the id is free again
    drain(engine)


def test_engine_keeps_serving_after_bad_calls_mid_stream(engine, llm, load_hf_model):
    good = {f"g{i}": prompt(n, 41) for i, n in enumerate((40, 7, 23, 1))}
    seeded = SamplingParams(temperature=1.0, top_k=20, seed=9, max_tokens=10)
    engine.add_request("g0", good["g0"], SamplingParams(max_tokens=20, **GREEDY))
    engine.add_request("g1", good["g1"], seeded)
    engine.step()  # g0: first chunk (32-token budget), g1 waits for the next prefill
    engine.step()
    assert set(engine.requests) == {"g0", "g1"}
    queued_before = {rid: list(r.seq.token_ids) for rid, r in engine.requests.items()}
    early = {}

    def step():  # the engine keeps stepping between the bad calls
        for out in engine.step():
            if out.finished:
                early[out.request_id] = out

    for tokens, params, match in [(good["g2"], "g0", "request id 'g0'")] + BAD_REQUESTS:
        rid = params if isinstance(params, str) else "bad"
        with pytest.raises(ValueError, match=match):
            engine.add_request(rid, tokens, None if isinstance(params, str) else params)
        step()
    for fields, field in BAD_PARAMS:
        bad = SamplingParams()  # valid when built; made bad after, so that the engine's own check must catch it
        for name, value in fields.items():
            setattr(bad, name, value)
        with pytest.raises(ValueError, match=field):
            engine.add_request("bad", good["g2"], bad)
        step()
    with pytest.raises(ValueError, match="request id"):
        engine.abort_request("bad")
    assert set(engine.requests) <= set(queued_before) and "bad" not in engine.requests
    engine.add_request("g2", good["g2"], SamplingParams(max_tokens=10, **GREEDY))
    engine.add_request("g3", good["g3"], SamplingParams(max_tokens=5, **GREEDY))
    finals = {**early, **drain(engine)}
    assert finals["g0"].token_ids == hf_greedy(load_hf_model, good["g0"], 20)
    assert finals["g2"].token_ids == hf_greedy(load_hf_model, good["g2"], 10)
    assert finals["g3"].token_ids == hf_greedy(load_hf_model, good["g3"], 5)
    solo = llm.generate([good["g1"]], seeded, use_tqdm=False)[0]
    assert finals["g1"].token_ids == solo.token_ids and len(solo.token_ids) == 10


# --------------------------------------------------------------------------------------------------------------
# LLM.generate
# --------------------------------------------------------------------------------------------------------------


def test_generate_rejects_bad_input_before_queueing(llm, load_hf_model):
    engine = llm.engine
    params = SamplingParams(max_tokens=3, **GREEDY)
    for prompts, match in (
        ([[1, 2, 3], [], [4, 5]], "prompt is empty"),
        ([[1, 2, 3], [4, VOCAB]], "token id"),
        ([[1, 2], prompt(65)], "max_model_len"),
        (["text"], "tokenizer"),  # this folder has no tokenizer
        ([[1, 2], 7], "prompt"),
        ([], "no prompts"),
    ):
        with pytest.raises(ValueError, match=match):
            llm.generate(prompts, params, use_tqdm=False)
        assert_clean(engine)
    with pytest.raises(ValueError, match="sampling params"):
        llm.generate([[1, 2], [3, 4]], [params], use_tqdm=False)
    assert_clean(engine)
    outs = llm.generate([[1, 2], [3, 4]], params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [hf_greedy(load_hf_model, p, 3) for p in ([1, 2], [3, 4])]


def test_generate_takes_vllms_prompt_forms(llm, load_hf_model):
    """vLLM's prompt forms give the plain token list's output (HF's greedy tokens): a TokensPrompt dict, alone and in
    a list, one prompt as a numpy array, a tensor or a list of numpy ints (not a batch of one-token prompts), and
    prompts and params as any iterables."""
    ids = prompt(9, 3)
    expected = hf_greedy(load_hf_model, ids, 3)
    params = SamplingParams(max_tokens=3, **GREEDY)
    for prompts in ({"prompt_token_ids": ids}, np.array(ids), torch.tensor(ids), [np.int64(t) for t in ids]):
        assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == [expected], type(prompts)
    outs = llm.generate([{"prompt_token_ids": ids}, ids], params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [expected, expected]
    outs = llm.generate(iter([ids, {"prompt_token_ids": ids}]), iter([params, params]), use_tqdm=False)  # iterables
    assert [o.token_ids for o in outs] == [expected, expected]


def test_generate_names_bad_prompts_and_params_and_queues_nothing(llm, load_hf_model):
    """Prompts and sampling params of the wrong form, and params made invalid after construction, raise ValueError
    naming what is wrong before anything is queued; the caller's params are left as they were; the LLM serves on."""
    params = SamplingParams(max_tokens=3, **GREEDY)
    zero_n = SamplingParams(max_tokens=3, **GREEDY)
    zero_n.n = 0
    text_seed = SamplingParams(max_tokens=3, **GREEDY)
    text_seed.seed = "x"
    for prompts, sampling, match in (
        (5, params, "prompts must be a string, a list of token ids"),
        (None, params, "got NoneType"),
        (b"hi", params, "got bytes"),
        ([1, "a"], params, "prompt 0 must be .* got int .one prompt's token ids must all be ints"),
        ({"prompt_ids": [1, 2]}, params, r"prompt 0: a prompt dict takes one key.*\['prompt_ids'\]"),
        ({"prompt": "x", "prompt_token_ids": [1]}, params, "takes one key"),
        ([[1, 2]], {"temperature": 0}, "sampling_params must be a SamplingParams or a list of them, got dict"),
        ([[1, 2]], [None], "got NoneType"),
        ([[1, 2]], 5, "got int"),
        ([[1, 2]], zero_n, "SamplingParams.n"),
        ([[1, 2]], text_seed, "SamplingParams.seed"),
    ):
        with pytest.raises(ValueError, match=match):
            llm.generate(prompts, sampling, use_tqdm=False)
        assert_clean(llm.engine)
    assert zero_n.n == 0 and text_seed.seed == "x"  # checked copies, not the caller's objects
    outs = llm.generate([[1, 2]], params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [hf_greedy(load_hf_model, [1, 2], 3)]


@pytest.mark.parametrize("device", ["tpu", "meta", 5, "cuda:x"])
def test_a_device_other_than_cpu_or_cuda_is_named(device):
    with pytest.raises(ValueError, match=r"device must be 'cpu', 'cuda' or 'cuda:N', got"):
        resolve_device(device)


def test_chat_names_bad_messages_and_template_kwargs(tmp_path, monkeypatch):
    """LLM.chat on the embedded model (its byte tokenizer has a chat template): a conversation that is not a list,
    and chat_template_kwargs that are not a dict, raise ValueError naming them; a good call's prompt is the
    template's rendering (HF's apply_chat_template), generated as generate does."""
    from compiled_engine import LLM
    from compiled_engine.tiny_model import ensure_tiny_model

    monkeypatch.setenv("COMPILED_ENGINE_CACHE", str(tmp_path))
    chat_llm = LLM(ensure_tiny_model(), device="cpu", max_model_len=128)
    messages = [{"role": "user", "content": "hi"}]
    params = SamplingParams(max_tokens=3, **GREEDY)
    for call, match in ((lambda: chat_llm.chat(None, params), "messages must be a conversation"),
                        (lambda: chat_llm.chat(messages, params, chat_template_kwargs=5),
                         "chat_template_kwargs must be a dict, got int")):
        with pytest.raises(ValueError, match=match):
            call()
    tokenizer = chat_llm.tokenizer
    ids = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                           add_special_tokens=False)
    assert ([o.token_ids for o in chat_llm.chat(messages, params, use_tqdm=False)]
            == [o.token_ids for o in chat_llm.generate([ids], params, use_tqdm=False)])


def test_integer_ids_of_any_kind_give_the_int_prompt_tokens(llm, load_hf_model):
    """Prompt ids that are numpy ints or 0-d torch ints are the same prompt as their Python ints: HF's greedy
    tokens of the int prompt (they used to be rejected as "out of range"). LLM.generate takes lists of them; the
    engine (Runtime.validate_prompt) also takes a numpy array or a 1-d tensor, whose items are such scalars."""
    ids = prompt(11, 5)
    params = SamplingParams(max_tokens=4, **GREEDY)
    outs = llm.generate([[np.int64(t) for t in ids], [torch.tensor(t) for t in ids]], params, use_tqdm=False)
    assert all(o.token_ids == hf_greedy(load_hf_model, ids, 4) for o in outs)
    engine = llm.engine
    for i, tokens in enumerate((np.array(ids, dtype=np.int32), torch.tensor(ids))):
        engine.add_request(f"array{i}", tokens, params)
    assert all(type(t) is int for r in engine.requests.values() for t in r.seq.token_ids)
    finals = drain(engine)
    assert all(finals[f"array{i}"].token_ids == hf_greedy(load_hf_model, ids, 4) for i in range(2))
    assert_clean(engine)


@pytest.fixture(scope="module")
def twin_vocab_path(model_path, tmp_path_factory):
    """The test model with the second half of its vocabulary a copy of the first (embedding and lm_head rows):
    every logit has an exactly equal twin, so each step's maximum is a tie. Greedy takes its first index (torch.
    argmax's rule, HF's greedy); a draw, even at a tiny temperature, takes either twin. Twins embed alike, so either
    choice continues the sequence in the same way."""
    folder = tmp_path_factory.mktemp("twin_vocab")
    for file in Path(model_path).iterdir():
        if file.is_file():
            shutil.copy(file, folder / file.name)
    tensors = load_file(folder / "model.safetensors")
    half = VOCAB // 2
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        tensors[name][half:] = tensors[name][:half].clone()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_tiny_temperature_is_greedy_beside_a_sampled_row(twin_vocab_path):
    """temperature 1e-30 / 1e-38 is greedy (vLLM's 1e-5 rule) even in a step that samples another row: HF's greedy
    tokens, i.e. always the first twin of the tied maximum. A draw at that temperature (what the sampler would do if
    the rule were gone) picks either twin, and a naive softmax(logits / T) gives NaN and token 0."""
    half = VOCAB // 2
    ids = prompt(13, 6)
    expected = hf_models.hf_greedy(hf_models.load_hf(twin_vocab_path), ids, 8)
    assert all(t < half for t in expected), expected  # the oracle's ties are exact: argmax takes the first twin
    llm = make_llm(twin_vocab_path, max_model_len=64, max_num_seqs=4, block_size=8)
    engine = llm.engine
    for i, temperature in enumerate((1e-30, 1e-38)):
        engine.add_request(f"tiny{i}", ids, SamplingParams(temperature=temperature, seed=i, max_tokens=8,
                                                           ignore_eos=True))
    engine.add_request("hot", prompt(9, 7), SamplingParams(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True))
    finals = drain(engine)
    assert finals["tiny0"].token_ids == expected and finals["tiny1"].token_ids == expected
    assert_clean(engine)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_interrupted_generate_leaves_nothing_queued(model_path, load_hf_model, monkeypatch, overlap):
    """Ctrl-C (or a failed step) in the middle of generate(): the exception reaches the caller, the call's requests
    are aborted (no block or slot held), and the next generate() returns HF's greedy tokens for
    its own prompts."""
    llm = make_llm(model_path, max_model_len=64, max_num_seqs=4, block_size=8, max_num_batched_tokens=32,
                   overlap_decode=overlap)
    engine = llm.engine
    step, calls = engine.step, []

    def interrupted_step():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return step()

    monkeypatch.setattr(engine, "step", interrupted_step)
    params = SamplingParams(max_tokens=6, **GREEDY)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([prompt(20, 1), prompt(9, 2)], params, use_tqdm=False)
    assert_clean(engine)
    outs = llm.generate([[5, 6, 7], prompt(9, 2)], params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [hf_greedy(load_hf_model, p, 6) for p in ([5, 6, 7], prompt(9, 2))]


def test_generate_with_bad_stop_token_ids_queues_nothing(model_path, load_hf_model):
    """A generate whose second request is bad queues neither (no request, no queued sequence, no held block or
    slot), and the engine then serves the next generate as HF's greedy run."""
    llm = make_llm(model_path, max_model_len=64)
    good = SamplingParams(max_tokens=2, **GREEDY)
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate([[1, 2, 3], [4, 5]], [good, SamplingParams(stop_token_ids=[VOCAB])], use_tqdm=False)
    assert_clean(llm.engine)
    out = llm.generate([[7, 8, 9]], SamplingParams(max_tokens=5, **GREEDY), use_tqdm=False)
    assert out[0].token_ids == hf_greedy(load_hf_model, [7, 8, 9], 5)

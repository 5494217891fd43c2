"""The command line: the embedded default model end to end, and clean errors on bad input."""

from __future__ import annotations

import pytest

from compiled_engine import LLM, SamplingParams
from compiled_engine.__main__ import main
from compiled_engine.tiny_model import ensure_tiny_model


def test_generate_with_the_embedded_default_model(tmp_path, monkeypatch, capsys):
    """Oracle: LLM.generate on the same model with the SamplingParams the flags name (greedy, then seeded top-k and
    top-p sampling); each printed output is that request's text, token count and finish reason, in prompt order."""
    monkeypatch.setenv("COMPILED_ENGINE_CACHE", str(tmp_path))
    prompts = ["Hello", "abc"]
    cases = [([], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)),
             (["--temperature", "1.5", "--top-k", "3", "--seed", "7"],
              SamplingParams(temperature=1.5, top_k=3, seed=7, max_tokens=5, ignore_eos=True)),
             (["--temperature", "1.5", "--top-p", "0.2", "--seed", "7"],
              SamplingParams(temperature=1.5, top_p=0.2, seed=7, max_tokens=5, ignore_eos=True))]
    printed = []
    for flags, _ in cases:
        args = ["generate", "--prompt", prompts[0], "--prompt", prompts[1], "--max-tokens", "5", "--ignore-eos"]
        assert main(args + flags) == 0
        out = capsys.readouterr().out
        assert "tokens/s" in out
        printed.append([line for line in out.splitlines() if line.startswith(("prompt:", "output:"))])
    llm = LLM(ensure_tiny_model(), device="cpu")
    for lines, (_, params) in zip(printed, cases):
        expected = []
        for prompt, o in zip(prompts, llm.generate(prompts, params, use_tqdm=False)):
            expected += [f"prompt: {prompt!r}",
                         f"output: {o.text!r}  ({len(o.token_ids)} tokens, finish_reason={o.finish_reason})"]
        assert lines == expected
    assert len({tuple(lines) for lines in printed}) == 3  # the sampling flags reached the engine


def test_generate_with_speculative_decoding_prints_the_same_outputs(tmp_path, monkeypatch, capsys):
    """--speculative-config (MTP drafts of the embedded model): greedy outputs equal the plain command's; a value
    that is not a JSON object is refused by argparse, a bad key by the runtime, each with a message."""
    monkeypatch.setenv("COMPILED_ENGINE_CACHE", str(tmp_path))
    args = ["generate", "--prompt", "Hello", "--prompt", "abc", "--max-tokens", "12", "--ignore-eos"]
    assert main(args) == 0
    plain = [line for line in capsys.readouterr().out.splitlines() if line.startswith("output:")]
    assert main(args + ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}']) == 0
    speculative = [line for line in capsys.readouterr().out.splitlines() if line.startswith("output:")]
    assert speculative == plain and len(plain) == 2
    with pytest.raises(SystemExit):
        main(args + ["--speculative-config", "mtp"])
    assert "not JSON" in capsys.readouterr().err
    assert main(args + ["--speculative-config", '{"method": "mtp", "k": 2}']) == 2
    assert "unknown key" in capsys.readouterr().err


def test_bad_input_is_an_error_message_not_a_traceback(tmp_path, monkeypatch, capsys, qwen3_5_text_untied_path):
    monkeypatch.setenv("COMPILED_ENGINE_CACHE", str(tmp_path))
    assert main(["generate", "--prompt", "Hello", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err
    assert main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    # a checkpoint folder without a tokenizer cannot take text prompts
    assert main(["generate", "--model", str(qwen3_5_text_untied_path), "--prompt", "x"]) == 2
    assert "no tokenizer" in capsys.readouterr().err


def test_serve_without_the_server_packages_names_the_extra(monkeypatch):
    """A base install has no FastAPI: `serve` says which package is missing and which extra brings it."""
    import sys

    import pytest

    monkeypatch.setitem(sys.modules, "fastapi", None)  # "import fastapi" now raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "compiled_engine.server", raising=False)  # as if never imported
    monkeypatch.delattr(sys.modules["compiled_engine"], "server", raising=False)
    with pytest.raises(SystemExit, match=r"fastapi is missing.*\.\[serve\]"):
        main(["serve", "--port", "0"])

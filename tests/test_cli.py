"""The command line: the embedded default model end to end, and clean errors on bad input."""

from __future__ import annotations

import pytest

from compiled_engine.__main__ import main


def test_generate_with_the_embedded_default_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COMPILED_ENGINE_CACHE", str(tmp_path))
    assert main(["generate", "--prompt", "Hello", "--prompt", "abc", "--max-tokens", "5", "--ignore-eos"]) == 0
    out = capsys.readouterr().out
    assert out.count("(5 tokens, finish_reason=length)") == 2
    assert "tokens/s" in out
    # deterministic: the tiny model is built from a fixed seed, greedy decoding
    assert main(["generate", "--prompt", "Hello", "--max-tokens", "5", "--ignore-eos"]) == 0
    first_output = out.splitlines()[1]
    assert capsys.readouterr().out.splitlines()[1] == first_output


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

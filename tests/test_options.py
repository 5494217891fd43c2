"""ops/options.py: the CE_* variables parsed by KernelOptions.from_env, and the process-wide current options."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ops import options
from ops.options import KernelOptions, current_options, set_options, use_options

VARIABLES = ("CE_PDL", "CE_L2_PREFETCH", "CE_SKINNY_GEMM", "CE_CUDA_GRAPHS")


def test_defaults_without_variables():
    assert KernelOptions.from_env({}) == KernelOptions()
    assert KernelOptions() == KernelOptions(pdl=True, l2_prefetch=True, skinny_gemm=True, cuda_graphs="runner")
    # set but empty: as if unset
    assert KernelOptions.from_env({name: "" for name in VARIABLES}) == KernelOptions()


@pytest.mark.parametrize("variable, field, value, want", [
    ("CE_PDL", "pdl", "0", False),
    ("CE_PDL", "pdl", "1", True),
    ("CE_PDL", "pdl", " Off ", False),
    ("CE_L2_PREFETCH", "l2_prefetch", "0", False),
    ("CE_L2_PREFETCH", "l2_prefetch", "whole", True),
    ("CE_L2_PREFETCH", "l2_prefetch", "1", True),
    ("CE_SKINNY_GEMM", "skinny_gemm", "0", False),
    ("CE_SKINNY_GEMM", "skinny_gemm", "true", True),
    ("CE_CUDA_GRAPHS", "cuda_graphs", "trees", "trees"),
    ("CE_CUDA_GRAPHS", "cuda_graphs", "runner", "runner"),
])
def test_from_env_parses_each_variable(variable, field, value, want):
    got = KernelOptions.from_env({variable: value})
    assert getattr(got, field) == want
    assert got == dataclasses.replace(KernelOptions(), **{field: want})  # the other fields keep their defaults


@pytest.mark.parametrize("variable, value", [
    ("CE_PDL", "2"),
    ("CE_L2_PREFETCH", "whole:5"),  # a removed policy (bench/NOTES.md, "Removed alternatives")
    ("CE_L2_PREFETCH", "tile"),
    ("CE_SKINNY_GEMM", "cublas"),
    ("CE_CUDA_GRAPHS", "none"),
])
def test_from_env_rejects_a_bad_value_naming_the_variable(variable, value):
    with pytest.raises(ValueError, match=f"{variable} must be one of .*got {value!r}"):
        KernelOptions.from_env({variable: value})


def test_from_env_reads_os_environ(monkeypatch):
    monkeypatch.setenv("CE_PDL", "0")
    monkeypatch.setenv("CE_CUDA_GRAPHS", "trees")
    assert KernelOptions.from_env() == KernelOptions(pdl=False, cuda_graphs="trees")


def test_fields_are_checked():
    with pytest.raises(ValueError, match="cuda_graphs"):
        KernelOptions(cuda_graphs="tree")
    with pytest.raises(TypeError, match="pdl"):
        KernelOptions(pdl="0")
    with pytest.raises(dataclasses.FrozenInstanceError):
        KernelOptions().pdl = False


@pytest.fixture
def fresh_options(monkeypatch):
    """The module's current value unset (as in a new process) for the test, and restored after it."""
    monkeypatch.setattr(options, "_current", None)


def test_current_options_read_the_environment_once(fresh_options, monkeypatch):
    monkeypatch.setenv("CE_SKINNY_GEMM", "0")
    first = current_options()
    assert first == KernelOptions(skinny_gemm=False)
    monkeypatch.setenv("CE_SKINNY_GEMM", "1")  # too late: read once
    assert current_options() is first


def test_set_options_and_use_options_change_and_restore(fresh_options, monkeypatch):
    monkeypatch.delenv("CE_PDL", raising=False)
    start = current_options()
    assert start.pdl
    chosen = KernelOptions(pdl=False, cuda_graphs="trees")
    assert set_options(chosen) is start  # returns what it replaced
    assert current_options() is chosen
    assert set_options(start) is chosen
    assert current_options() is start

    with use_options(l2_prefetch=False) as inside:  # the current options with one field changed
        assert current_options() is inside
        assert inside == dataclasses.replace(start, l2_prefetch=False)
        with use_options(chosen, skinny_gemm=False):  # nested, from a whole object
            assert current_options() == KernelOptions(pdl=False, skinny_gemm=False, cuda_graphs="trees")
        assert current_options() is inside
    assert current_options() is start

    with pytest.raises(RuntimeError):  # restored on an exception too
        with use_options(pdl=False):
            raise RuntimeError
    assert current_options() is start
    with pytest.raises(TypeError):
        set_options({"pdl": False})
    with pytest.raises(TypeError):  # not a field
        with use_options(merge_in_kernel=True):
            pass
    assert current_options() is start


def test_options_reach_the_ops(fresh_options, monkeypatch):
    """The switches the library reads go through the current options: the skinny GEMM's dispatch, and the launch
    flags where the hardware would allow them (PDL and the bulk L2 prefetch made to look supported, a CUDA tensor
    stood in for: on a CPU tensor both are off whatever the options say)."""
    import types

    from ops import linear
    from ops.triton import l2_prefetch, pdl

    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    weight = torch.zeros(4, 8, dtype=torch.bfloat16)
    assert linear._skinny(x, weight)
    with use_options(skinny_gemm=False):
        assert not linear._skinny(x, weight)
    assert pdl.pdl_flags(x) == {"USE_PDL": False}
    monkeypatch.setattr(pdl, "pdl_supported", lambda: True)
    monkeypatch.setattr(l2_prefetch, "bulk_prefetch_supported", lambda: True)
    cuda_tensor = types.SimpleNamespace(is_cuda=True)
    assert pdl.pdl_flags(cuda_tensor) == {"USE_PDL": True, "launch_pdl": True}
    assert l2_prefetch.l2_prefetch_enabled()
    with use_options(pdl=False, l2_prefetch=False):
        assert pdl.pdl_flags(cuda_tensor) == {"USE_PDL": False}
        assert not l2_prefetch.l2_prefetch_enabled()


def test_nothing_else_reads_the_variables():
    """The library reads the CE_* kernel switches only through KernelOptions.from_env."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    read = re.compile(r"(environ|getenv)[^\n]*\b(" + "|".join(VARIABLES) + r")\b")
    readers = [f"{path.relative_to(root)}:{n}" for package in ("ops", "graphs", "compiled_engine", "bench")
               for path in sorted((root / package).rglob("*.py"))
               for n, line in enumerate(path.read_text().splitlines(), 1) if read.search(line)]
    assert readers == [], readers

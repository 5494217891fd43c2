"""Shared pytest setup: import path, FLA hiding, hypothesis profiles, GPU skipping, tiny HF model folders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # same as PYTHONPATH=. from the repository root
    sys.path.insert(0, str(ROOT))

# FLA's chunked prefill kernels autotune over up to 25 configs each on first use, which made the GPU suite spend
# about two of its five minutes compiling configs it then threw away. The tests check values, not speed, so they
# pin one config per kernel (tests/fla_configs, FLA's own config-file format, read in its "default" mode; set
# before FLA is imported). Kernels without a file there still autotune. Outside the tests the runtime reads the
# configs recorded for its GPU model, where there are some (ops/triton/fla_configs.py), else FLA autotunes.
os.environ.setdefault("FLA_CACHE_MODE", "default")
os.environ.setdefault("FLA_CONFIG_DIR", str(ROOT / "tests" / "fla_configs"))

# Imported first, before any test module: hides FLA from transformers on CPU (see tests/hf_models.py).
from tests import background, hf_models  # noqa: E402

# The test tensors and models are tiny: intra-op threads only add overhead, and on a busy CPU (other processes
# running) OpenMP's spinning threads make tests 5-10x slower (test_hf_oracle.py: 12 s at 1 thread, 145 s at 2 on a
# loaded 2-core machine). One thread unless OMP_NUM_THREADS says otherwise.
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)

# --------------------------------------------------------------------------------------------------------------
# Hypothesis: `ci` (derandomised, no deadline, few examples) when CI is set, `dev` otherwise.
# HYPOTHESIS_PROFILE overrides the choice (e.g. HYPOTHESIS_PROFILE=thorough for a long local run).
# --------------------------------------------------------------------------------------------------------------

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=20,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=25,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    deadline=None,
    max_examples=500,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


# --------------------------------------------------------------------------------------------------------------
# Markers
# --------------------------------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "quick: with gpu, one small reference check of every CUDA kernel")
    config.addinivalue_line("markers", "slow: long-running test")
    config.addinivalue_line("markers", "background_child(argv, interpret=True): the test asks tests/background.py for "
                            "child argv (TRITON_INTERPRET=1 unless interpret=False)")
    config.addinivalue_line("markers", "in_background: the test runs alone in a pytest child started in the background "
                            "(tests/background.py); here it passes where the child passed")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Starts the selected tests' children (Triton checks, ``in_background`` tests) on a background thread
    (tests/background.py), in the order the tests will ask for them. Not on pytest-xdist workers (each would run
    every child) nor for --collect-only."""
    if session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    children = []
    for item in session.items:
        marker = item.get_closest_marker("background_child")
        if marker is not None and "gpu" not in item.keywords:
            children.append((tuple(marker.args[0]), marker.kwargs.get("interpret", True)))
        elif _runs_in_background(item) and "gpu" not in item.keywords:
            children.append((tuple(background.pytest_argv(item.nodeid)), False))
    background.start(children)


def _runs_in_background(item: pytest.Item) -> bool:
    return item.get_closest_marker("in_background") is not None and not background.IN_CHILD


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """An ``in_background`` test: its pytest child's outcome instead of its body (tests/background.py)."""
    if not _runs_in_background(pyfuncitem):
        return None
    proc = background.run_child(background.pytest_argv(pyfuncitem.nodeid), interpret=False)
    assert proc.returncode == 0, f"the test failed in its pytest child:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    lines = proc.stdout.strip().splitlines()
    summary = lines[-1] if lines else ""
    if " passed" not in summary:
        reasons = [line for line in lines if line.startswith("SKIPPED")]  # the child's -rs lines
        pytest.skip(f"not passed in its pytest child: {summary}" + "".join(f"\n{r}" for r in reasons))
    return True


def pytest_sessionfinish(session: pytest.Session) -> None:
    background.stop()


def pytest_terminal_summary(terminalreporter) -> None:
    """Each background child's seconds and when the background thread went idle (tests/background.py)."""
    for line in background.summary():
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests whose child runs in the background (a Triton child, an in_background test's pytest child:
    # tests/background.py) go last, so that the rest of the suite runs meanwhile; the order is otherwise kept.
    items.sort(key=lambda item: item.get_closest_marker("background_child") is not None or _runs_in_background(item))
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# --------------------------------------------------------------------------------------------------------------
# Tiny HF models, built once per session (see tests/hf_models.py for shapes and weight draws)
# --------------------------------------------------------------------------------------------------------------

HF_VARIANTS = tuple(hf_models.BUILDERS)  # qwen3_5_text_tied, qwen3_5_text_untied, qwen3_5_conditional, qwen3_next_dense
MOE_VARIANTS = tuple(hf_models.MOE_BUILDERS)  # qwen3_next_moe, qwen3_5_moe_text, qwen3_5_moe_conditional


@pytest.fixture(scope="session")
def build_hf_model(tmp_path_factory: pytest.TempPathFactory):
    """``build_hf_model(name) -> Path``: the saved folder of one variant, built on first use, then cached."""
    cache: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in cache:
            builder = hf_models.BUILDERS.get(name) or hf_models.MOE_BUILDERS[name]
            cache[name] = builder(tmp_path_factory.mktemp(name))
        return cache[name]

    return build


@pytest.fixture(scope="session")
def qwen3_5_text_tied_path(build_hf_model) -> Path:
    return build_hf_model("qwen3_5_text_tied")


@pytest.fixture(scope="session")
def qwen3_5_text_untied_path(build_hf_model) -> Path:
    return build_hf_model("qwen3_5_text_untied")


@pytest.fixture(scope="session")
def qwen3_5_conditional_path(build_hf_model) -> Path:
    return build_hf_model("qwen3_5_conditional")


@pytest.fixture(scope="session")
def load_hf_model(build_hf_model):
    """``load_hf_model(name)``: the HF oracle model of a variant (float32, eval), loaded once per session.

    Shared between tests: do not modify it (use ``hf_models.load_hf(path)`` for a private copy).
    """
    cache: dict[str, torch.nn.Module] = {}

    def load(name: str):
        if name not in cache:
            cache[name] = hf_models.load_hf(build_hf_model(name))
        return cache[name]

    return load

"""FLA's recorded kernel configs (ops/triton/fla_configs.py, ops/triton/fla_kernel_configs/): read through FLA's own
config cache, FLA's functions are the oracle. The files are what FLA's loader accepts, each entry under the hash FLA
looks it up by; ``use_tuned_configs`` points FLA at them only where the user left FLA's variables alone (this session
has them set: tests/conftest.py pins the tests' own configs, so the tests here unset them or run a child without);
and a fresh process that calls it before importing FLA gets the recorded config from FLA's own lookup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ops.triton import fla_configs

pytest.importorskip("fla")
REPO = Path(__file__).resolve().parents[1]
FILES = sorted(fla_configs.CONFIG_ROOT.glob("*/*.json"))


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "a--b  c!", "***", ""])
def test_folder_names_are_flas(name):
    from fla.ops.utils.cache import sanitize_gpu_name

    assert fla_configs.gpu_folder_name(name) == sanitize_gpu_name(name)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_files_are_what_flas_loader_reads(path):
    """Each file parses with FLA's own loader; each entry sits under the hash FLA computes for its key, and FLA's
    exact lookup returns it; the kernel is one of FLA's cached autotuners (bench/fla_configs.py walks the same)."""
    import fla.modules.norm.l2norm  # noqa: F401  (the kernels' modules, so that the walk below finds them)
    import fla.ops.gated_delta_rule.chunk  # noqa: F401
    from fla.ops.utils.cache import AutotuneKey, KernelConfigFile

    from bench.fla_configs import _cached_autotuner

    data = json.loads(path.read_text())
    parsed = KernelConfigFile.from_dict(path, data)
    assert parsed is not None and parsed.kernel_name == path.stem and parsed.autotune_entries
    for key_hash, entry in parsed.autotune_entries.items():
        key = AutotuneKey(tuple(entry["autotune_key"]))
        assert AutotuneKey.key_hash(key.autotune_key) == key_hash
        assert parsed.lookup_exact(key) is entry
        assert {"kwargs", "num_warps", "num_stages", "num_ctas"} <= entry["config"].keys()
    names = {t.kernel_name for m in list(sys.modules.values()) if m is not None and m.__name__.startswith("fla.")
             for t in map(_cached_autotuner, vars(m).values()) if t is not None}
    assert path.stem in names


def test_use_tuned_configs_only_where_the_user_left_fla_alone(monkeypatch):
    folder = FILES[0].parent
    use = fla_configs.use_tuned_configs.__wrapped__  # uncached
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: folder.name.replace("_", " "))
    monkeypatch.delitem(sys.modules, "fla.ops.utils.cache", raising=False)
    for var in ("FLA_CACHE_MODE", "FLA_CONFIG_DIR"):
        monkeypatch.delenv(var, raising=False)
    assert use(torch.device("cpu")) is None and "FLA_CACHE_MODE" not in os.environ
    assert use(torch.device("cuda", 0)) == folder
    assert os.environ["FLA_CACHE_MODE"] == "strict" and os.environ["FLA_CONFIG_DIR"] == str(folder)
    monkeypatch.setenv("FLA_CACHE_MODE", "disabled")  # the user's own setting
    monkeypatch.delenv("FLA_CONFIG_DIR")
    assert use(torch.device("cuda", 0)) is None and "FLA_CONFIG_DIR" not in os.environ
    monkeypatch.delenv("FLA_CACHE_MODE")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Other GPU")
    assert use(torch.device("cuda", 0)) is None and "FLA_CACHE_MODE" not in os.environ
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: folder.name.replace("_", " "))
    monkeypatch.setitem(sys.modules, "fla.ops.utils.cache", object())  # FLA imported first: its mode is fixed
    assert use(torch.device("cuda", 0)) is None and "FLA_CACHE_MODE" not in os.environ


CHILD = """
import sys, torch
sys.path.insert(0, {repo!r})
torch.cuda.get_device_name = lambda device=None: {gpu!r}
from ops.triton.fla_configs import use_tuned_configs
print(use_tuned_configs(torch.device("cuda", 0)))
from fla.ops.utils import cache
from fla.ops.utils.cache import AutotuneKey, load_cached_config
print(cache.FLA_CACHE_MODE.value)
for key in {keys!r}:
    print(load_cached_config({kernel!r}, AutotuneKey(tuple(key))))
print(load_cached_config({kernel!r}, AutotuneKey((12345, "no such key"))))
"""


def test_a_fresh_process_gets_the_recorded_config_from_flas_lookup():
    """Before FLA's first import, ``use_tuned_configs`` sets what FLA reads: FLA's own ``load_cached_config`` then
    returns each recorded key's config, and None for a key not recorded (FLA autotunes that one)."""
    path = max(FILES, key=lambda p: len(json.loads(p.read_text())["autotune_entries"]))  # l2norm's two keys
    entries = list(json.loads(path.read_text())["autotune_entries"].values())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLA_")}
    code = CHILD.format(repo=str(REPO), gpu=path.parent.name.replace("_", " "), kernel=path.stem,
                        keys=[e["autotune_key"] for e in entries])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()[-(len(entries) + 3):]
    assert lines[0] == str(path.parent) and lines[1] == "strict", out.stdout
    assert lines[2:-1] == [str(e["config"]) for e in entries]
    assert lines[-1] == "None"

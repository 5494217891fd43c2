"""FLA's recorded kernel configs (ops/triton/fla_configs.py, ops/triton/fla_kernel_configs/): read through FLA's own
config cache, FLA's functions are the oracle.

FLA is imported only in a child process, one per GPU folder: this session hides FLA from transformers (tests/
hf_models.py, bench/common.py) and must not hold a real ``fla`` module, and FLA reads ``FLA_CACHE_MODE`` once, when
first imported. The child strips FLA's variables (tests/conftest.py pins the tests' own configs), calls
``use_tuned_configs`` for that GPU model, then imports FLA and checks that each file is what FLA's loader reads (each
entry under the hash FLA computes for its key, the kernel one of FLA's cached autotuners) and that FLA's own lookup
returns each recorded config, and None for a key not recorded. In this process: ``use_tuned_configs`` points FLA at a
folder only where the user left FLA's variables alone."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ops.triton import fla_configs

REPO = Path(__file__).resolve().parents[1]
FOLDERS = sorted(p for p in fla_configs.CONFIG_ROOT.iterdir() if p.is_dir())
NAMES = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "a--b  c!", "***", ""]

CHILD = """
import json, sys, torch
from pathlib import Path
sys.path.insert(0, {repo!r})
torch.cuda.get_device_name = lambda device=None: {gpu!r}
from ops.triton.fla_configs import gpu_folder_name, use_tuned_configs
results = {{"folder": str(use_tuned_configs(torch.device("cuda", 0)))}}
import fla.modules.norm.l2norm, fla.ops.gated_delta_rule.chunk  # the kernels' modules, for the walk below
from fla.ops.utils import cache
from fla.ops.utils.cache import AutotuneKey, KernelConfigFile, load_cached_config, sanitize_gpu_name
from bench.fla_configs import _cached_autotuner
results["mode"] = cache.FLA_CACHE_MODE.value
results["names"] = [[gpu_folder_name(n), sanitize_gpu_name(n)] for n in {names!r}]
tuners = {{t.kernel_name for m in list(sys.modules.values()) if m is not None and m.__name__.startswith("fla.")
          for t in map(_cached_autotuner, vars(m).values()) if t is not None}}
files = {{}}
for path in sorted(Path(results["folder"]).glob("*.json")):
    data = json.loads(path.read_text())
    parsed = KernelConfigFile.from_dict(path, data)
    entries = []
    for key_hash, entry in data["autotune_entries"].items():
        key = AutotuneKey(tuple(entry["autotune_key"]))
        entries.append({{"hash_is_flas": AutotuneKey.key_hash(key.autotune_key) == key_hash,
                        "exact": parsed.lookup_exact(key) == entry,
                        "lookup": load_cached_config(path.stem, key), "recorded": entry["config"]}})
    files[path.stem] = {{"parsed": parsed is not None and parsed.kernel_name == path.stem,
                        "a_cached_autotuner": path.stem in tuners, "entries": entries,
                        "unknown_key": load_cached_config(path.stem, AutotuneKey((12345, "no such key")))}}
results["files"] = files
print(json.dumps(results))
"""


@pytest.fixture(scope="module", params=FOLDERS, ids=lambda p: p.name)
def child(request) -> tuple[Path, dict]:
    if importlib.util.find_spec("fla") is None:
        pytest.skip("fla is not installed")
    folder = request.param
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLA_")}
    code = CHILD.format(repo=str(REPO), gpu=folder.name.replace("_", " "), names=NAMES)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return folder, json.loads(out.stdout.strip().splitlines()[-1])


def test_there_is_a_folder_of_configs():
    assert FOLDERS, f"no recorded configs under {fla_configs.CONFIG_ROOT}"


def test_folder_names_are_flas(child):
    _, results = child
    assert [ours for ours, _ in results["names"]] == [flas for _, flas in results["names"]]


def test_fla_reads_the_folder_in_strict_mode(child):
    folder, results = child
    assert results["folder"] == str(folder) and results["mode"] == "strict"


def test_every_file_is_what_flas_loader_reads_and_looks_up(child):
    folder, results = child
    assert sorted(results["files"]) == sorted(p.stem for p in folder.glob("*.json"))
    for kernel, file in results["files"].items():
        assert file["parsed"] and file["a_cached_autotuner"] and file["entries"], kernel
        for entry in file["entries"]:
            assert entry["hash_is_flas"] and entry["exact"], (kernel, entry)
            assert entry["lookup"] == entry["recorded"], (kernel, entry)  # FLA's own lookup
        assert file["unknown_key"] is None, kernel  # a key not recorded: FLA autotunes it


def test_use_tuned_configs_only_where_the_user_left_fla_alone(monkeypatch):
    folder = FOLDERS[0]
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

"""FLA's prefill kernels' configs, tuned once per GPU model and read through FLA's own config cache.

FLA autotunes its chunked delta rule's, l2norm's and cumsum's kernels on each new key: on an empty Triton cache every
candidate config compiles and is timed one after another, about 45 s of a cold engine start-up on an H100
(bench/NOTES.md, "Runs 231-236"). FLA can read each kernel's chosen config per key from
``$FLA_CONFIG_DIR/{kernel_name}.json`` instead (``FLA_CACHE_MODE``; "strict": recorded keys only, any other key is
autotuned as before). ``fla_kernel_configs/<GPU>/`` holds what bench/fla_configs.py recorded on that GPU model;
``use_tuned_configs`` points FLA there before our first FLA import. Where the user set either variable, or FLA was
imported first (it reads the mode once, at import), or this GPU has no folder, FLA autotunes as it always did.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path

import torch

CONFIG_ROOT = Path(__file__).with_name("fla_kernel_configs")


def gpu_folder_name(device_name: str) -> str:
    """The folder of a GPU model, spelled as FLA spells its own config folders (``sanitize_gpu_name``)."""
    return re.sub(r"[^0-9A-Za-z]+", "_", device_name).strip("_") or "unknown_gpu"


@functools.lru_cache(maxsize=None)
def use_tuned_configs(device: torch.device) -> Path | None:
    """Point FLA at ``device``'s recorded configs (sets ``FLA_CACHE_MODE=strict`` and ``FLA_CONFIG_DIR``); the
    folder, or None where FLA is left to autotune. Call before importing FLA's kernels."""
    if device.type != "cuda" or "FLA_CACHE_MODE" in os.environ or "FLA_CONFIG_DIR" in os.environ:
        return None
    if "fla.ops.utils.cache" in sys.modules:  # imported already, with the mode it read then
        return None
    folder = CONFIG_ROOT / gpu_folder_name(torch.cuda.get_device_name(device))
    if not folder.is_dir():
        return None
    os.environ["FLA_CACHE_MODE"] = "strict"
    os.environ["FLA_CONFIG_DIR"] = str(folder)
    return folder

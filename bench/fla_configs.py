"""Record FLA's autotuned kernel configs on this GPU into FLA's own config-cache format, for ops/triton/fla_configs.py.

FLA's prefill kernels (the chunked delta rule's, l2norm's, the cumsum's) are ``fla_cache_autotune`` kernels: on an
empty cache each autotuning key compiles and times every candidate config one after another, ~45 s of a cold
engine start-up on an H100 (bench/NOTES.md, "Runs 231-236"). FLA can instead read each kernel's best config per key
from ``$FLA_CONFIG_DIR/{kernel_name}.json`` (``FLA_CACHE_MODE=strict``: exact keys only, autotuning for any other).
This builds a runtime (``compile=False``: the memory plan's start-up steps meet the prefill shapes serving meets,
with FLA's config cache off so that every key is tuned), then writes what each of FLA's cached autotuners chose:

    python3 bench/fla_configs.py --model qwen3.5-0.8b --max-num-seqs 64 --max-model-len 9216 \
        --out ops/triton/fla_kernel_configs/

into ``OUT/<GPU name as FLA spells it>/``. CUDA only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cached_autotuner(obj):
    """The FLA cached autotuner ``obj`` is or wraps (``triton.heuristics`` over ``fla_cache_autotune``), or None."""
    from fla.ops.utils.cache import CachedAutotuner

    for _ in range(4):
        if isinstance(obj, CachedAutotuner):
            return obj
        obj = getattr(obj, "fn", None)
    return None


def tuned_configs() -> dict[str, dict]:
    """{kernel name: FLA's config file} for every FLA cached autotuner in the process that has tuned a key."""
    import triton
    from fla.ops.utils.cache import AutotuneKey

    files: dict[str, dict] = {}
    seen = set()
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.") or module is None:
            continue
        for tuner in map(_cached_autotuner, vars(module).values()):
            if tuner is None or id(tuner) in seen or not tuner.cache:
                continue
            seen.add(id(tuner))
            entries = files.setdefault(tuner.kernel_name, {"kernel_name": tuner.kernel_name,
                                                           "triton_version": triton.__version__,
                                                           "autotune_entries": {}})["autotune_entries"]
            for key, config in tuner.cache.items():
                entries[AutotuneKey.key_hash(list(key))] = {
                    "autotune_key": AutotuneKey.normalize_autotune_key(list(key)),
                    "config": {"kwargs": dict(config.kwargs), "num_warps": config.num_warps,
                               "num_stages": config.num_stages, "num_ctas": config.num_ctas,
                               "maxnreg": config.maxnreg},
                }
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3.5-0.8b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=9216)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ["FLA_CACHE_MODE"] = "disabled"  # tune every key (FLA reads it when first imported)
    import torch

    from bench.common import Context, Options
    from compiled_engine.runtime import Runtime
    from ops.triton.fla_configs import gpu_folder_name

    path = Context(Options(model=args.model, device="cuda", dtype=args.dtype)).model.path
    start = time.perf_counter()
    Runtime.from_pretrained(path, device="cuda", dtype=args.dtype, compile=False, max_num_seqs=args.max_num_seqs,
                            max_model_len=args.max_model_len)
    torch.cuda.synchronize()
    files = tuned_configs()
    folder = args.out / gpu_folder_name(torch.cuda.get_device_name())
    folder.mkdir(parents=True, exist_ok=True)
    for kernel, data in sorted(files.items()):
        (folder / f"{kernel}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"{kernel}: {len(data['autotune_entries'])} keys", flush=True)
    print(f"runtime built in {time.perf_counter() - start:.1f} s; {len(files)} kernels written to {folder}")


if __name__ == "__main__":
    main()

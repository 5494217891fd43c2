"""tests/interpreter.py's ``install()``: under it, Triton's interpreter computes what it computed before (a kernel whose
loop calls ``@triton.jit`` helpers, against NumPy in float64), walks the language modules once a launch however many
helper calls the launch makes (without it: once more a call), leaves ``triton.language`` as it found it, and maps every
Triton type to the NumPy dtype the interpreter's own ``_get_np_dtype`` gives."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from tests import background

REPO = Path(__file__).resolve().parents[1]
CHILD_ARGV = [sys.executable, __file__, "--child"]


def _child(kernel) -> dict:
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter

    from tests import interpreter

    walks = [0]
    walk = getattr(triton_interpreter, "_patch_builtin", None)
    if walk is None:  # another Triton's interpreter: nothing to count
        return {"installed": False}

    def counted_walk(*args, **kwargs):
        walks[0] += 1
        return walk(*args, **kwargs)

    triton_interpreter._patch_builtin = counted_walk
    x = torch.linspace(-3, 3, 100, dtype=torch.float32)

    def launch(steps):
        walks[0] = 0
        out = torch.empty_like(x)
        kernel[(2,)](x, out, 100, STEPS=steps, BLOCK=64)
        want = sum(np.log1p(np.exp(x.double().numpy() * i * 0.25)) for i in range(steps))
        return walks[0], float(np.abs(out.double().numpy() - want).max())

    def np_dtypes():  # scalars, blocks of them, pointers and blocks of pointers
        scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
                   tl.bfloat16, tl.float32, tl.float64, tl.float8e4nv]
        types = [*scalars, *(tl.block_type(t, [4, 8]) for t in scalars), tl.pointer_type(tl.float32),
                 tl.block_type(tl.pointer_type(tl.bfloat16), [16])]
        return [str(triton_interpreter._get_np_dtype(t)) for t in types * 2]  # twice: the cache's hits too

    load = tl.load
    before = {steps: launch(steps) for steps in (2, 6)}
    dtypes = np_dtypes()
    installed = interpreter.install()
    after = {steps: launch(steps) for steps in (2, 6)}
    return {"installed": installed, "before": before, "after": after, "restored": tl.load is load,
            "dtypes": [dtypes, np_dtypes()]}


@pytest.mark.background_child(CHILD_ARGV)
def test_install_keeps_the_results_and_walks_once_a_launch():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    result = background.child_json(CHILD_ARGV)
    if not result["installed"]:  # the children then run the interpreter as it is: slower, the same checks
        pytest.skip("tests/interpreter.py does not match this Triton's interpreter")
    for steps in ("2", "6"):
        for side in ("before", "after"):
            assert result[side][steps][1] < 1e-5, (side, steps, result)  # float32 against float64
    (walks_2, _), (walks_6, _) = result["before"]["2"], result["before"]["6"]
    assert walks_6 > walks_2, result  # without install(): the walks grow with the helper calls
    assert result["after"]["2"][0] == result["after"]["6"][0] < walks_2, result
    assert result["restored"]
    before, after = result["dtypes"]
    assert after == before, result["dtypes"]


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1")
    sys.path.insert(0, str(REPO))
    import triton
    import triton.language as tl

    # Module-level, as the interpreter needs: a helper is found in its caller's globals.
    @triton.jit
    def _softplus(x):
        return tl.log(1.0 + tl.exp(x))

    @triton.jit
    def _step(acc, x, i):
        return acc + _softplus(x * i)

    @triton.jit
    def _kernel(x_ptr, out_ptr, N, STEPS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(STEPS):
            acc = _step(acc, x, i * 0.25)
        tl.store(out_ptr + offs, acc, mask=offs < N)

    print(json.dumps(_child(_kernel)))

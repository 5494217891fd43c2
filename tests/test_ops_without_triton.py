"""``import ops`` works without triton: the ops register their CPU references for CUDA too. (The import direction
inside ops, kernel modules below op modules, is tests/test_architecture.py's.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_ops_without_triton():
    """With triton unimportable, ``import ops`` loads no kernel module and the ops still run (their references)."""
    code = "\n".join([
        "import sys",
        "sys.modules['triton'] = None  # import triton raises ImportError; find_spec says absent",
        "import torch, ops",
        "from ops.triton import HAVE_TRITON",
        "assert not HAVE_TRITON",
        "kernels = [m for m in sys.modules if m.startswith('ops.triton.')]",
        "assert not kernels, kernels",
        "x = torch.randn(3, 8)",
        "torch.testing.assert_close(torch.ops.ce.silu_mul(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:])",
        "torch.testing.assert_close(torch.ops.ce.linear(x, torch.ones(2, 8)), x @ torch.ones(8, 2))",
        "print('ok')",
    ])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


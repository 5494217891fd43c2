"""ops/ imports one way (ops/triton/__init__.py): op modules import kernel modules, kernel modules import only other
kernel modules and the leaf modules below both; and ``import ops`` works without triton (CPU references for CUDA)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEAVES = {"ops.layouts", "ops.options", "ops.library"}  # import nothing from ops


def _ops_imports(path: Path) -> set[str]:
    """The ops modules ``path`` imports, at any depth of its code (``from ops import x`` counts as ``ops.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "ops"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "ops":
            if node.module in ("ops", "ops.triton"):
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
            else:
                found.add(node.module)
    return found


def test_kernel_modules_import_only_downward():
    wrong = {}
    for path in sorted((ROOT / "ops" / "triton").glob("*.py")):
        bad = {m for m in _ops_imports(path) if not (m.startswith("ops.triton.") or m in LEAVES)}
        if bad:
            wrong[path.name] = sorted(bad)
    assert wrong == {}, f"kernel modules importing op modules: {wrong}"


def test_leaf_modules_import_nothing_from_ops():
    for leaf in sorted(LEAVES):
        path = ROOT / (leaf.replace(".", "/") + ".py")
        assert _ops_imports(path) == set(), f"{leaf} imports {_ops_imports(path)}"


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
        "torch.testing.assert_close(torch.ops.ce.silu_mul(x), ops.activation.silu_mul_reference(x))",
        "torch.testing.assert_close(torch.ops.ce.linear(x, torch.ones(2, 8)), x @ torch.ones(8, 2))",
        "print('ok')",
    ])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


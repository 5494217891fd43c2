"""The import graph of the project's own packages: no cycle, and every import points down the layers of
docs/ARCHITECTURE.md ("Layers"). Read from the source with ast, function-local imports included, so an import
moved into a function to dodge a cycle still counts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ops", "graphs", "compiled_engine", "bench")

# Bottom first. A module may import its own layer and the layers below it. A module is in the layer of the
# longest prefix that names it; a module no layer names fails the test (place it when you add it).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("op library", ("ops.library", "ops.options", "ops.layouts", "ops.step")),
    ("kernels", ("ops.triton",)),
    ("ops", ("ops",)),
    ("graph capture", ("graphs",)),
    ("model and caches", tuple(f"compiled_engine.{m}" for m in (
        "config", "distributed", "layers", "moe", "attention", "gated_deltanet", "mtp", "model", "loader",
        "tiny_model", "step", "sequence", "block_tables", "cache", "prefix_cache", "sampling_params", "speculative",
    ))),
    ("step executor", tuple(f"compiled_engine.{m}" for m in (
        "memory_plan", "executor", "cache_manager", "tp_workers", "runtime",
    ))),
    ("engine", tuple(f"compiled_engine.{m}" for m in (
        "scheduler", "outputs", "detokenizer", "request", "structured_output", "sampler", "rejection_sampler", "chat",
        "drafting_rule", "engine",
    ))),
    ("entry points", tuple(f"compiled_engine.{m}" for m in ("llm", "async_llm", "server", "__main__"))
     + ("compiled_engine",)),
    ("bench", ("bench",)),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "results" not in path.relative_to(REPO).parts:
                modules[module_name(path)] = path
    return modules


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules ``path`` imports, anywhere in it: ``from a import b`` names ``a.b`` when that is a
    module, else ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import ops.triton.x` of a module: itself; of a name: its module
                target = target.rpartition(".")[0]
            if target and target.split(".")[0] in PACKAGES:
                found.add(target)
    return found - {name}


def layer_of(module: str) -> int | None:
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = source_modules()
    known = set(modules)
    return {name: imports_of(path, name, known) for name, path in modules.items()}


def test_every_module_has_a_layer(graph):
    assert [m for m in graph if layer_of(m) is None] == []


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module from a layer above its own."""
    return [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Depth-first search; a back edge is a cycle. Package __init__ modules count as the modules they are."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    cycles = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return cycles


def test_imports_point_down_the_layers(graph):
    assert upward_imports(graph) == []


def test_no_import_cycles(graph):
    assert import_cycles(graph) == []


def test_the_checker_sees_function_local_and_relative_imports(tmp_path):
    """The oracle of the tests above: a hand-made tree with an upward import hidden in a function and a cycle
    through a relative import, read and judged by the same functions."""
    files = {
        "ops/__init__.py": "",
        "ops/a.py": "def f():\n    from compiled_engine.runtime import Runtime\n",
        "ops/b.py": "from . import c\n",
        "ops/c.py": "import ops.b\n",
        "compiled_engine/__init__.py": "",
        "compiled_engine/runtime.py": "from ops import a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    known = {"ops", "ops.a", "ops.b", "ops.c", "compiled_engine", "compiled_engine.runtime"}
    modules = {"ops.a": "ops/a.py", "ops.b": "ops/b.py", "ops.c": "ops/c.py",
               "compiled_engine.runtime": "compiled_engine/runtime.py"}
    tree = {name: imports_of(tmp_path / path, name, known) for name, path in modules.items()}
    assert tree == {"ops.a": {"compiled_engine.runtime"}, "ops.b": {"ops.c"}, "ops.c": {"ops.b"},
                    "compiled_engine.runtime": {"ops.a"}}
    assert upward_imports(tree) == ["ops.a (ops) imports compiled_engine.runtime (step executor)"]
    assert import_cycles(tree) == ["compiled_engine.runtime -> ops.a -> compiled_engine.runtime",
                                   "ops.b -> ops.c -> ops.b"]

"""relattn's imports point down: no module imports, directly or through others, one that
imports it back, counting imports inside functions (which hide a cycle from Python itself)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import relattn

PACKAGE = Path(relattn.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import …`` inside ``module``."""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_graph() -> dict[str, set[str]]:
    """Module -> the relattn modules it imports anywhere in its body (functions included)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (
                    _resolve(name, is_package, node.level, node.module)
                    if node.level
                    else node.module or ""
                )
                # ``from . import core`` imports the module relattn.core, not the package.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first repeated last), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_walk_sees_imports_inside_functions():
    graph = import_graph()
    # relattn.backends imports each library's module lazily, inside a function.
    assert "relattn.backends._torch" in graph["relattn.backends"]
    assert "relattn.core" in graph["relattn.attention"]


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"a2"}, "a2": set(), "b": {"b"}}, ["b", "b"]),
    ],
)
def test_find_cycle(graph, expected):
    assert find_cycle(graph) == expected


def test_backends_import_nothing_above_them():
    """``relattn.backends`` holds what the array API lacks: it imports no algorithm."""
    graph = import_graph()
    for name, edges in graph.items():
        if name.startswith("relattn.backends"):
            above = {e for e in edges if not e.startswith("relattn.backends")}
            assert above <= {"relattn._namespace"}, (name, above)


def test_the_base_install_imports_no_framework():
    """``import relattn`` (and its framework-neutral layer core, and the transformers adapter
    module itself) imports none of the model frameworks: each is imported by the module that
    wraps it, when used."""
    import subprocess
    import sys

    check = (
        "import sys, relattn, relattn.layers, relattn.huggingface\n"
        "frameworks = {'torch', 'jax', 'flax', 'equinox', 'keras', 'transformers', 'cupy'}\n"
        "loaded = sorted(frameworks & set(sys.modules))\n"
        "assert not loaded, f'import relattn imported {loaded}'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr

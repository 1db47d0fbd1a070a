"""The package's import graph has no cycles (issue 13): modules import each other in one direction."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def import_graph() -> dict[str, set[str]]:
    """Module -> the accord modules it imports, at module level or inside functions."""
    mods = {}
    for p in (ROOT / "accord").rglob("*.py"):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    graph = {}
    for name, p in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("accord"):
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                         for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("accord")}
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    graph = import_graph()
    assert "accord.trainer" in graph and graph["accord.trainer"], "the graph was not read"
    found = cycles(graph)
    assert not found, f"import cycles: {found}; move the shared code into a module both can import"


def test_a_cycle_is_detected():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("first,then", [
    ("accord.distributed.ray_backend", "accord.trainer"),   # the cycles before issue 13, in both orders
    ("accord.trainer", "accord.distributed.ray_backend"),
    ("accord.generation.vllm_backend", "accord.policies"),
    ("accord.policies", "accord.generation.vllm_backend"),
    ("accord.rollout.base", "accord.build"),
    ("accord.evaluate", "accord.trainer"),
])
@pytest.mark.slow
def test_modules_import_in_either_order(first, then):
    code = f"import {first}, {then}"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]

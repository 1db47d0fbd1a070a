"""The package's import graph has no cycles (issue 13), and no module imports one of a higher layer (LAYERS,
issue 26): modules import each other in one direction."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The layers of the package, lowest first: a module may import its own layer and the layers below it, never one
# above. A module's layer is that of its longest matching prefix (the prefix itself or anything under it: so
# ``accord.policies`` is the package with every module in it). docs/layout.md
# describes them; the package root ``accord`` (lazy re-exports) counts as the top layer.
LAYERS: list[tuple[str, list[str]]] = [
    ("leaves", ["accord.seeding", "accord.stopping", "accord.allocator", "accord.metric_names", "accord.stats",
                "accord.data", "accord.sandbox", "accord.rollout.sample"]),   # the Sample record: generation and policies fill it, rollouts make it
    ("models", ["accord.models"]),                       # config reads the model specs (loading, tiny)
    ("config", ["accord.config", "accord.devices"]),
    ("parts", ["accord.algorithms", "accord.envs", "accord.tracking", "accord.audit"]),
    ("generation", ["accord.generation"]),
    ("policies", ["accord.policies"]),
    ("rollout", ["accord.rollout"]),
    ("scale-out", ["accord.critics", "accord.distributed"]),
    ("run", ["accord.build", "accord.trainer_steps", "accord.checkpoint", "accord.pipelines", "accord.callbacks"]),
    ("loop", ["accord.trainer", "accord.evaluate"]),
    ("commands", ["accord.compare", "accord.crossplay", "accord.sft", "accord.plan", "accord.export",
                  "accord.report"]),
    ("cli", ["accord.cli"]),
]
# (importer, imported) pairs allowed to go up a layer, each with why
UPWARD: set[tuple[str, str]] = set()


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

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:   # the limit is the process's: tests after this one (a recursion guard's) see the default
        sys.setrecursionlimit(limit)
    return out


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The index in ``layers`` of the module's longest matching prefix; the package root is the top layer."""
    if module == "accord":
        return len(layers) - 1
    best = None
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (i, p)
    return None if best is None else best[0]


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Each import of a module of a higher layer, as 'importer (layer) -> imported (layer)'."""
    found = []
    for m in sorted(graph):
        for d in sorted(graph[m]):
            lm, ld = layer_of(m, layers), layer_of(d, layers)
            if lm is not None and ld is not None and ld > lm:
                found.append(f"{m} ({layers[lm][0]}) -> {d} ({layers[ld][0]})")
    return found


def test_every_module_has_a_layer():
    graph = import_graph()
    missing = [m for m in sorted(graph) if layer_of(m) is None]
    assert not missing, f"modules in no layer: {missing}; add their prefix to LAYERS"
    unused = [p for _, prefixes in LAYERS for p in prefixes
              if not any(m == p or m.startswith(p + ".") for m in graph)]
    assert not unused, f"prefixes of LAYERS that match no module: {unused}"


def test_no_module_imports_a_higher_layer():
    graph = import_graph()
    allowed = {f"{m} ({LAYERS[layer_of(m)][0]}) -> {d} ({LAYERS[layer_of(d)][0]})" for m, d in UPWARD
               if m in graph and d in graph}
    found = upward_imports(graph)
    assert not [f for f in found if f not in allowed], (
        f"imports up a layer: {[f for f in found if f not in allowed]}; move the shared code down (or the module "
        "up) rather than adding to UPWARD")
    stale = sorted(allowed - set(found)) + sorted(f"{m} -> {d}" for m, d in UPWARD if m not in graph or d not in graph)
    assert not stale, f"UPWARD lists imports the package no longer makes: {stale}; remove them"


def test_an_upward_import_is_detected():
    layers = [("low", ["x.a", "x.b.leaf"]), ("high", ["x.b"])]
    graph = {"x.a": {"x.b.leaf"}, "x.b.leaf": {"x.a"}, "x.b": {"x.a"}, "x.a.sub": {"x.b.mod"}, "x.b.mod": set()}
    assert layer_of("x.b.leaf", layers) == 0 and layer_of("x.b.mod", layers) == 1 and layer_of("y", layers) is None
    assert upward_imports(graph, layers) == ["x.a.sub (low) -> x.b.mod (high)"]


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

"""No import circles in the product packages: a circle makes import order matter and hides which part
depends on which. Counted from the source with ``ast``, so an import under ``if TYPE_CHECKING:`` and
one inside a function (a lazy import is still a circle) count as much as a top-level one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("baton", "engine", "router", "kv_transfer", "prefill_worker", "decode_worker")

KNOWN: set[frozenset[str]] = set()  # a circle someone is removing may be named here, with why


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[_module_name(path)] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: dict[str, Path]) -> set[str]:
    """The product modules one import statement names (``from a import b`` names ``a.b`` where that
    is a module, else ``a``)."""
    if isinstance(node, ast.Import):
        targets = {alias.name for alias in node.names}
    else:
        base = node.module or ""
        if node.level:
            parent = module.split(".") if is_package else module.split(".")[:-1]
            parent = parent[: len(parent) - (node.level - 1)]
            base = ".".join(parent + ([base] if base else []))
        targets = {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    out = set()
    for target in targets:
        while target and target not in known:  # `import a.b.c` of a name inside a module
            target = target.rpartition(".")[0]
        if target and target != module:
            out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(node, module, path.name == "__init__.py", known)
        graph[module] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): each holds a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # iterative: a deep import chain must not hit the recursion limit
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == node:
                        break
                if len(component) > 1:
                    components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def path_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest circle through the component's first module (breadth first)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in parents:
                    parents[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(component)


def test_the_cycle_finder_finds_a_circle_and_its_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert circles(graph) == [{"a", "b", "c"}]
    assert path_in(graph, {"a", "b", "c"}) == ["a", "b", "c", "a"]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_type_checking_and_functions_count():
    known = {"p": ROOT, "p.x": ROOT, "p.y": ROOT}
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.y import Y\ndef f():\n    from . import x\n"
    )
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= _imported(node, "p.z", False, known)
    assert names == {"p.y", "p.x"}


def test_the_product_packages_have_no_import_circle():
    graph = import_graph()
    found = [c for c in circles(graph) if frozenset(c) not in KNOWN]
    assert not found, "import circles:\n" + "\n".join(
        " -> ".join(path_in(graph, c)) + (f"  (all of {sorted(c)} are in circles)" if len(c) > 2 else "") for c in found
    )

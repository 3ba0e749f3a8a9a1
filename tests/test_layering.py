"""Layering: no import cycle among mklscale's modules.

Read from the source with ``ast``, so every import statement counts: module level, inside functions
and methods, under ``if TYPE_CHECKING``. A cycle hidden in a function-local import still ties the
modules together (neither can be understood, tested or moved without the other). An import of a
package's submodule (``from mklscale.bank import _compute``) is an edge to the submodule, not to
the package; importing a submodule implicitly runs its package's ``__init__``, which is not
counted. Imports made by name at run time (``importlib.import_module``) are not seen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mklscale

PACKAGE = Path(mklscale.__file__).parent

#: Cycles still allowed, each as the set of its modules: none.
ALLOWED_CYCLES: list[frozenset] = []


def _modules() -> dict[str, tuple[Path, bool]]:
    """{dotted name: (file, is a package __init__)} of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _imported(name: str, is_pkg: bool, node: ast.Import | ast.ImportFrom, modules) -> set[str]:
    """The mklscale modules one import statement of module ``name`` imports."""
    if isinstance(node, ast.Import):
        targets = {alias.name for alias in node.names}
    else:
        base = node.module or ""
        if node.level:  # relative: from the package holding this module, level - 1 packages up
            package = name.split(".") if is_pkg else name.split(".")[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        targets = {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {t for t in targets if t in modules and t != name}


def import_graph() -> dict[str, set[str]]:
    """{module: the mklscale modules it imports anywhere in its source}."""
    modules = _modules()
    graph = {}
    for name, (path, is_pkg) in modules.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= _imported(name, is_pkg, node, modules)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_walker_sees_function_local_and_relative_imports():
    graph = import_graph()
    assert "mklscale.bank.store" in graph["mklscale.engine.core"]  # inside Engine.__init__
    assert "mklscale.bank._compute" in graph["mklscale.bank.spec"]  # a submodule, not the package
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_no_import_cycles():
    graph = import_graph()
    bad = [c for c in cycles(graph) if c not in ALLOWED_CYCLES]
    lines = [" <-> ".join(sorted(c)) + "  (" + "; ".join(f"{m} imports {sorted(graph[m] & c)}" for m in sorted(c)) + ")"
             for c in bad]
    assert not bad, "import cycles among mklscale modules (move the shared code or the entry point a layer up):\n" + \
        "\n".join(lines)

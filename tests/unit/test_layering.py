"""The layering the design promises, checked from the source: `cosmictui.ops` draws nothing
(no Textual), `relay` knows nothing of `cosmictui`, and neither package has an import cycle.

Imports are read with `ast`, so a lazy import inside a function counts (it is still a
dependency, and a cycle through it breaks as soon as someone hoists it); imports under
`if TYPE_CHECKING:` do not (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports(package: str) -> dict[str, set[str]]:
    """Every module of `package` -> the absolute names it imports (modules, or module.attribute)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        name = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skip = _type_checking_nodes(tree)
        names: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                names.add(module)
                names.update(f"{module}.{a.name}" for a in node.names)
        found[name] = names
    return found


def dependency_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports. `from pkg import sub` depends on `pkg.sub`
    only (the package itself is already importing when its submodule runs)."""
    raw = imports(package)
    graph: dict[str, set[str]] = {}
    for module, names in raw.items():
        deps = {n for n in names if n in raw and n != module}
        # `from . import mmsg`: the parent package is named only as the holder of a submodule
        for n in list(deps):
            members = {m for m in names if m.startswith(n + ".") and m.count(".") == n.count(".") + 1}
            if members and members <= set(raw):
                deps.discard(n)
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _offenders(package: str, forbidden: str) -> list[str]:
    return sorted(
        f"{module} imports {name}"
        for module, names in imports(package).items()
        for name in names
        if name == forbidden or name.startswith(forbidden + ".")
    )


def test_ops_imports_no_textual() -> None:
    assert _offenders("cosmictui/ops", "textual") == []


def test_relay_imports_no_cosmictui() -> None:
    assert _offenders("relay", "cosmictui") == []


def test_cosmictui_has_no_import_cycle() -> None:
    assert cycles(dependency_graph("cosmictui")) == []


def test_relay_has_no_import_cycle() -> None:
    assert cycles(dependency_graph("relay")) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The checker itself: a two-module cycle and a self-contained chain."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


#: The foundations of cosmictui.ops: every use case may import them; they import no use case.
FOUNDATIONS = {
    "cosmictui.ops",
    "cosmictui.ops.config",
    "cosmictui.ops.runner",
    "cosmictui.ops.progress",
    "cosmictui.ops.relayproc",
    "cosmictui.ops.wording",
    "cosmictui.ops.vocabulary",
}


def _cosmictui_imports(package: str) -> dict[str, set[str]]:
    """Module -> the cosmictui modules it imports (a `from m import name` counts as m)."""
    graph = dependency_graph("cosmictui")
    return {m: deps for m, deps in graph.items() if m == package or m.startswith(package + ".")}


def test_ops_foundations_import_no_use_case() -> None:
    """config needed the job status sets from jobs/model.py (a use case): they are in vocabulary now."""
    offenders = sorted(
        f"{m} imports {d}"
        for m, deps in _cosmictui_imports("cosmictui.ops").items()
        if m in FOUNDATIONS
        for d in deps
        if d.startswith("cosmictui.ops.") and d not in FOUNDATIONS
    )
    assert offenders == []


def test_ops_imports_no_screen_widget_or_cli() -> None:
    offenders = [
        f"{m} imports {d}"
        for m, deps in _cosmictui_imports("cosmictui.ops").items()
        for d in deps
        if d.split(".")[1:2] in (["screens"], ["widgets"], ["cli"], ["app"], ["monitor_app"])
    ]
    assert offenders == []


def test_widgets_import_no_screen() -> None:
    offenders = [
        f"{m} imports {d}"
        for m, deps in _cosmictui_imports("cosmictui.widgets").items()
        for d in deps
        if d.startswith("cosmictui.screens") or d in ("cosmictui.app", "cosmictui.monitor_app")
    ]
    assert offenders == []


def test_one_stats_fetcher() -> None:
    """/stats is read by metrics.client alone (checks had a urllib fetcher of its own beside it)."""
    users = sorted(
        module
        for module, names in imports("cosmictui/ops").items()
        if "urllib.request" in names or any(n.startswith("urllib.request.") for n in names)
    )
    assert users == []


def test_the_rules_see_a_breach() -> None:
    """The checks themselves: a foundation importing a use case is found."""
    graph = {"cosmictui.ops.config": {"cosmictui.ops.jobs.model"}}
    assert [d for m, deps in graph.items() if m in FOUNDATIONS for d in deps if d not in FOUNDATIONS] == [
        "cosmictui.ops.jobs.model"
    ]

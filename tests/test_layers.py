"""The layers follow the data, and nothing imports against them.

    orchlib (foundation: errors, registry)  <-  envs  <-  recipes  <-  orchestrator, analysis  <-  the CLI modules

A module may import from its own layer or a lower one; `orchestrator` never imports `analysis`, and `analysis`
reaches the orchestrator only through its one published module (`orchestrator.api`: the state of a sweep's
cells). The CLI modules (`*.cli`, `*_cli`) sit on top. Every import counts, those inside functions and under
`TYPE_CHECKING` included (read from the AST, not by running anything). And no module imports itself back: the
import graph between files, and between packages, has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"orchlib": 0, "envs": 1, "recipes": 2, "orchestrator": 3, "analysis": 3}
TOP = 4  # the CLI modules
PUBLISHED = {"analysis": {"orchestrator.api"}}  # one-way edges between packages of the same layer


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for package in LAYERS for path in sorted((ROOT / package).rglob("*.py"))}


def is_cli(module: str) -> bool:
    return module.endswith((".cli", "_cli"))


def layer(module: str) -> int:
    return TOP if is_cli(module) else LAYERS[module.split(".")[0]]


def resolve(name: str) -> str | None:
    """The project module an imported name lives in (the longest prefix that is a module), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """The project modules `module` imports, anywhere in its body."""
    path = MODULES[module]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(filter(None, (resolve(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if node.module else package
            for alias in node.names:
                target = resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in MODULES else resolve(base)
                if target:
                    found.add(target)
    found.discard(module)
    return found


GRAPH = {module: imports(module) for module in MODULES}


def upward(module: str, target: str) -> bool:
    if is_cli(module):
        return False
    if layer(target) > layer(module):
        return True
    source_package, target_package = module.split(".")[0], target.split(".")[0]
    if source_package != target_package and layer(target) == layer(module):
        return target not in PUBLISHED.get(source_package, set())
    return False


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_package_module_is_seen() -> None:
    assert len(MODULES) > 100 and "recipes.config.schema" in MODULES and "orchestrator.cli" in MODULES


def test_no_module_imports_from_a_layer_above_it() -> None:
    violations = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() for target in targets
                        if upward(module, target))
    assert violations == []


def test_no_import_cycle_between_files() -> None:
    assert cycles(GRAPH) == []


def test_no_import_cycle_between_packages() -> None:
    """Between the top-level packages; the CLI modules count as one package of their own (the top layer)."""

    def package(module: str) -> str:
        return "cli" if is_cli(module) else module.split(".")[0]

    graph: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        graph.setdefault(package(module), set()).update(package(t) for t in targets if package(t) != package(module))
    assert cycles(graph) == []


def test_the_checker_sees_upward_imports_inside_functions(tmp_path: Path) -> None:
    """The check itself can fail: an import inside a function body, against the layers, is found."""
    source = "def f():\n    from orchestrator.store import Store\n    return Store\n"
    tree = ast.parse(source)
    names = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert [resolve(name) for name in names] == ["orchestrator.store"]
    assert upward("recipes.config.schema", "orchestrator.store") and upward("analysis.report", "orchestrator.store")
    assert not upward("analysis.report", "orchestrator.api") and not upward("orchestrator.cli", "analysis.cli")
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]

"""The layers follow the data, and nothing imports against them.

    orchlib (foundation: errors, registry)  <-  envs  <-  recipes  <-  orchestrator, analysis  <-  the CLI modules

A module may import from its own layer or a lower one, never from another package of its own layer:
`orchestrator` and `analysis` never import each other (the CLI modules read the store through the orchestrator and
hand analysis plain records). The CLI modules (`*.cli`, `*_cli`) sit on top. Every import counts, those inside
functions and under `TYPE_CHECKING` included (read from the AST, not by running anything). And no module imports
itself back: the import graph between files, and between packages, has no cycle. No exception is allowed.

Inside `recipes/` and `analysis/` the same holds between their rooms (`ROOMS`, in order; each package's `__init__.py`
says what each room holds), without exception: a check that belongs to a backend is registered by the backend's room
(a registry's late edge). A room is a subpackage or, for a room of one module (`analysis/paper.py`), that module; a
module at the package's top outside the rooms is its CLI or one of `SHARED` (imported by every room, importing none).

A module named in a string is imported all the same, only later: a registry's `lazy={"name": "module:attr"}`, an
entry point in pyproject.toml (veRL's `verl.plugins`, vLLM's `vllm.general_plugins`), a class path handed to
another library. Every such string must name a module and attribute that exist; it counts as an import of the
module that holds it, except that a registry may name its entries above it (`LATE_EDGES`, each listed) as long as
the entry never imports the registry's module back (the edge goes one way).
"""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"orchlib": 0, "envs": 1, "recipes": 2, "orchestrator": 3, "analysis": 3}
TOP = 4  # the CLI modules
PACKAGES_RE = re.compile(r"^(?:orchlib|envs|recipes|orchestrator|analysis)(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?$")

# The rooms of recipes/ and analysis/, lowest first: a module imports from its own room and the rooms before it.
ROOMS = {
    "recipes": ["runtime", "policy", "stats", "diagnostics", "config", "run", "step", "torch_trainer", "verl", "trained"],
    "analysis": ["stores", "paper", "stats", "reports"],
}
# Modules at a roomed package's top that are no room: shared by every room, below them all (they import no room).
SHARED = {"recipes": set(), "analysis": {"names"}}
# Registries naming entries above them (imported on first lookup): registry module -> the modules it may name.
LATE_EDGES = {
    "recipes.config.backends": {"recipes.torch_trainer.backend", "recipes.verl.backend", "recipes.verl.patches"},
}


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


@functools.cache
def syntax(module: str) -> ast.Module:
    """`module`'s parsed source (parsed once: the checks below walk every module several times)."""
    path = MODULES[module]
    return ast.parse(path.read_text(), str(path))


def imports(module: str) -> set[str]:
    """The project modules `module` imports, anywhere in its body."""
    path = MODULES[module]
    found = set()
    for node in ast.walk(syntax(module)):
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


@functools.cache
def named_in_strings(module: str) -> frozenset[str]:
    """The dotted names (`package.module`, `package.module.attr`, `package.module:attr`) in `module`'s string
    constants, docstrings excepted."""
    tree = syntax(module)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return frozenset(node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                     and isinstance(node.value, str) and id(node) not in docstrings and PACKAGES_RE.match(node.value))


def entry_points() -> set[str]:
    """The objects pyproject.toml's entry points name (`module` or `module:attr`)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {target for group in project.get("entry-points", {}).values() for target in group.values()}


def target_of(name: str) -> tuple[str | None, str | None]:
    """(module, attribute or None) a dotted name points at; module None when nothing of that name exists."""
    if ":" in name:
        module, attribute = name.split(":")
        return (module, attribute) if module in MODULES else (None, None)
    module = resolve(name)
    if module is None:
        return None, None
    rest = name[len(module) + 1:]
    return module, rest or None


def defines(module: str, attribute: str) -> bool:
    """Whether `module` binds `attribute` at its top level (def, class, assignment or import)."""
    tree = syntax(module)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attribute:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        if any(isinstance(target, ast.Name) and target.id == attribute for target in targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (alias.asname or alias.name.split(".")[0]) == attribute for alias in node.names):
            return True
    return False


GRAPH = {module: imports(module) for module in MODULES}
STRING_EDGES = {module: {target_of(name)[0] or name for name in named_in_strings(module)} - {module}
                for module in MODULES}
# The `module:attr` form: an object to import later (a registry's entry, an entry point), not a process to start.
LAZY_EDGES = {module: {target_of(name)[0] for name in named_in_strings(module) if ":" in name} - {module, None}
              for module in MODULES}


def reachable(start: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def room(module: str) -> int | None:
    """The index of `module`'s room in its package's `ROOMS` (None outside recipes/ and analysis/; -1 for the package
    itself and its `SHARED` modules, len for CLIs)."""
    parts = module.split(".")
    if parts[0] not in ROOMS:
        return None
    rooms = ROOMS[parts[0]]
    if is_cli(module):
        return len(rooms)
    return rooms.index(parts[1]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in rooms) else -1


def against_rooms(module: str, target: str) -> bool:
    """Whether `module` importing `target` goes against the order of the rooms of recipes/ or of analysis/."""
    source_room, target_room = room(module), room(target)
    if source_room is None or target_room is None or module.split(".")[0] != target.split(".")[0]:
        return False
    return target_room > source_room


def upward(module: str, target: str) -> bool:
    if is_cli(module):
        return False
    if layer(target) > layer(module):
        return True
    source_package, target_package = module.split(".")[0], target.split(".")[0]
    return source_package != target_package and layer(target) == layer(module)


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


def test_configs_are_resolved_in_the_config_room_only() -> None:
    """Settings become a `TrainConfig` in one place (`recipes.config.resolve`, issue #47): no module outside recipes/
    (the orchestrator, analysis, the CLIs) imports the Hydra-composition helpers of `recipes.config.compose`, whose
    walk the config room keeps to itself."""
    violations = sorted(module for module, targets in GRAPH.items()
                        if "recipes.config.compose" in targets and (not module.startswith("recipes.") or is_cli(module)))
    assert violations == []
    assert "recipes.config.compose" in GRAPH["recipes.config.resolve"]  # the check can see such an import


def test_rooms_import_only_from_rooms_before_them() -> None:
    """recipes/ and analysis/: every module lives in a room of `ROOMS` (or is the package's CLI or a `SHARED` module),
    and no room imports a later one."""
    for package, rooms in ROOMS.items():
        subpackages = {module.split(".")[1] for module in MODULES if module.count(".") >= 2
                       and module.startswith(f"{package}.")}
        top = {module.split(".")[1] for module in MODULES if module.count(".") == 1 and module.startswith(f"{package}.")
               and not is_cli(module)}
        assert subpackages | (top & set(rooms)) == set(rooms), \
            f"a room of {package}/ is missing from ROOMS (or ROOMS names one that does not exist)"
        assert top - set(rooms) <= SHARED[package], f"a module at {package}/'s top outside its rooms: put it in a room"
    violations = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() for target in targets
                        if against_rooms(module, target))
    assert violations == []


def test_every_module_named_in_a_string_exists() -> None:
    """After a move, a string naming the old place fails here, not at run time on a GPU node."""
    missing = []
    for module in MODULES:
        for name in named_in_strings(module):
            target, attribute = target_of(name)
            if target is None or (attribute and "." not in attribute and not defines(target, attribute)):
                missing.append(f"{module}: {name!r}")
    for name in entry_points():
        target, attribute = target_of(name)
        if target is None or (attribute and not defines(target, attribute)):
            missing.append(f"pyproject.toml entry point: {name!r}")
    assert missing == []


def test_modules_named_in_strings_follow_the_layers_and_rooms() -> None:
    """A string-named module counts as an import, except a registry's declared late edges (`LATE_EDGES`)."""
    violations = sorted(f"{module} -> {target}" for module, targets in STRING_EDGES.items() for target in targets
                        if target in MODULES and target not in LATE_EDGES.get(module, set())
                        and (upward(module, target) or against_rooms(module, target)))
    assert violations == []
    declared = {(module, target) for module, targets in LATE_EDGES.items() for target in targets}
    assert declared <= {(module, target) for module, targets in STRING_EDGES.items() for target in targets}, \
        "LATE_EDGES lists an edge no registry names any more"


def test_the_entries_a_registry_names_never_import_it_back() -> None:
    """The edge from a lazy registry to its entries goes one way: the registry names `module:attr` and the entry
    does not import the registry to register itself. Nor does it reach the registry through other imports, unless
    the edge is a declared late edge (a backend is validated by the config that lists the backends)."""
    back = sorted(f"{target} -> {module}" for module, targets in LAZY_EDGES.items() for target in targets
                  if module in reachable(target, GRAPH) and target not in LATE_EDGES.get(module, set()))
    assert back == []
    direct = sorted(f"{target} -> {module}" for module, targets in LAZY_EDGES.items() for target in targets
                    if module in GRAPH[target])
    assert direct == []


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
    assert upward("recipes.config.schema", "orchestrator.store") and upward("analysis.reports.report", "orchestrator.store")
    assert upward("analysis.reports.report", "orchestrator.api") and upward("orchestrator.paper_check", "analysis.paper")
    assert not upward("analysis.cli", "orchestrator.paper_check") and not upward("orchestrator.cli", "analysis.cli")
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_the_checker_sees_a_planted_violation_of_the_rooms_and_of_a_string_edge() -> None:
    """The room order and the string edges can fail: a statistic importing the config, a hook naming the torch
    trainer in a string, a string naming a module that does not exist, are all caught."""
    assert against_rooms("recipes.stats.filtering", "recipes.config.schema")
    assert not against_rooms("recipes.config.schema", "recipes.stats.filtering")
    assert against_rooms("recipes.config.schema", "recipes.verl.patches")  # once an exception: none is allowed
    assert against_rooms("recipes.config.schema", "recipes.verl.config_map")
    assert against_rooms("recipes.runtime.stop", "recipes.policy.chat") and not against_rooms("recipes.train_cli",
                                                                                            "recipes.verl.backend")
    source = 'REG = Registry("x", lazy={"a": "recipes.torch_trainer.backend:run", "b": "recipes.gone:thing"})\n'
    names = {node.value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and PACKAGES_RE.match(node.value)}
    assert names == {"recipes.torch_trainer.backend:run", "recipes.gone:thing"}
    assert target_of("recipes.gone:thing") == (None, None)
    assert target_of("recipes.torch_trainer.backend:run") == ("recipes.torch_trainer.backend", "run")
    assert defines("recipes.torch_trainer.backend", "run") and not defines("recipes.torch_trainer.backend", "nope")
    assert against_rooms("recipes.diagnostics.registry", "recipes.torch_trainer.backend")  # unless in LATE_EDGES


def test_the_checker_sees_a_planted_violation_of_the_rooms_of_analysis() -> None:
    """analysis/'s rooms can fail: a store reader running a statistic, the paper map importing the judge, a
    statistic importing a report; names is below every room; rooms of different packages are not compared."""
    assert against_rooms("analysis.stores.rollout_artifacts", "analysis.stats.predictor")
    assert against_rooms("analysis.paper", "analysis.stats.verdicts")
    assert against_rooms("analysis.stats.science", "analysis.reports.figures")
    assert against_rooms("analysis.names", "analysis.stores.mlflow_store")
    assert not against_rooms("analysis.stats.verdicts", "analysis.paper")
    assert not against_rooms("analysis.stores.mlflow_client", "analysis.names")
    assert not against_rooms("analysis.cli", "analysis.reports.report")
    assert not against_rooms("analysis.stats.summary", "recipes.trained.evaluate")  # another package: the layers decide

"""orch's modules and its tests' helpers resolve to this checkout, whatever the install puts beside them.

Two of orch's dependencies ship top-level folders with generic names into site-packages: veRL 0.9.1 a regular
package `tests` (with `__init__.py`) and `scripts`, TransferQueue 0.1.11 (veRL's V1 trainer) `tests/`, `scripts/`,
`recipe/` and `tutorial/` without `__init__.py`. orch's `tests/` has no `__init__.py` either, so outside pytest
`import tests` finds veRL's package (a regular package beats a namespace portion anywhere on `sys.path`); under
pytest's `--import-mode=importlib` the `tests` module is made from this checkout's folder (the rootdir), and the
suite's `from tests.orchestrator.conftest import ...` resolve here. TransferQueue's files land in veRL's `tests/` and
`scripts/` folders without replacing any of veRL's. What would shadow orch is a distribution shipping a top-level
folder named as one of orch's packages: a namespace portion in site-packages is found by Python's path finder
before setuptools' editable finder (appended to `sys.meta_path`) is asked, so `recipes/` in site-packages would hide
an editable orch's `recipes` (TransferQueue's is `recipe`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _orch_packages() -> list[str]:
    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return [pattern.rstrip("*") for pattern in found["include"]]


def _inside(path: str | None, folder: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(folder)


def test_orch_packages_resolve_to_this_checkout() -> None:
    packages = _orch_packages()
    assert {"orchlib", "envs", "recipes", "orchestrator", "analysis"} <= set(packages)
    for name in packages:
        spec = importlib.util.find_spec(name)
        assert spec is not None, name
        where = spec.origin if spec.origin not in (None, "namespace") else next(iter(spec.submodule_search_locations))
        assert _inside(where, REPO / name), f"{name} resolves to {where}, not {REPO / name}"


def test_the_suites_helpers_resolve_to_this_checkout() -> None:
    for name in ("tests.orchestrator.conftest", "tests.stops", "tests.setup_wait"):
        module = importlib.import_module(name)
        assert _inside(module.__file__, REPO / "tests"), f"{name} is {module.__file__}"
    assert all(_inside(path, REPO / "tests") for path in sys.modules["tests"].__path__), sys.modules["tests"].__path__


def test_no_installed_distribution_ships_a_top_level_name_of_orch() -> None:
    packages = set(_orch_packages())
    clashes = []
    for dist in importlib.metadata.distributions():
        if dist.metadata["Name"] == "orch":
            continue
        tops = {Path(str(file)).parts[0] for file in dist.files or () if len(Path(str(file)).parts) > 1}
        clashes += [f"{dist.metadata['Name']} ships {top}/" for top in sorted(tops & packages)]
    assert not clashes, clashes


def test_transferqueue_ships_no_file_of_another_distribution() -> None:
    """TransferQueue's `tests/` and `scripts/` land in the folders veRL's packages occupy: no file of either may be
    the other's (pip would overwrite it, and uninstalling one would delete the other's)."""
    try:
        transferqueue = importlib.metadata.distribution("transferqueue")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("transferqueue is not installed: a core dependency (pyproject.toml); run bash scripts/setup.sh")
    assert transferqueue.version == "0.1.11"
    own = {str(file) for file in transferqueue.files or ()}
    assert {"tests", "scripts"} <= {Path(file).parts[0] for file in own}  # what this test is about is still shipped
    for dist in importlib.metadata.distributions():
        if dist.metadata["Name"].lower() in ("transferqueue", "orch"):
            continue
        shared = own & {str(file) for file in dist.files or ()}
        assert not shared, f"{dist.metadata['Name']} and transferqueue both ship {sorted(shared)[:3]}"

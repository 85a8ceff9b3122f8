"""The suite's two tiers. Every test runs in CI except those marked `full`: whole-pipeline rehearsals that take
tens of minutes on CI's 2 cores and whose every part has its own faster test in CI. They run with
`bash scripts/test.sh --full` (or `ORCH_FULL_SUITE=1`); tests/README.md lists them and what each costs."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", default=False,
                     help="also run the tests marked `full` (tests/README.md lists them and their cost)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--full") or os.environ.get("ORCH_FULL_SUITE") == "1":
        return
    skip = pytest.mark.skip(reason="full tier: run with `bash scripts/test.sh --full` (tests/README.md)")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)

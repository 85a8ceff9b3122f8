"""The suite's two tiers. Every test runs in CI except those marked `full`: whole-pipeline rehearsals that take
tens of minutes on CI's 2 cores and whose every part has its own faster test in CI. They run with
`bash scripts/test.sh --full` (or `ORCH_FULL_SUITE=1`); tests/README.md lists them and what each costs."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", default=False,
                     help="also run the tests marked `full` (tests/README.md lists them and their cost)")


# Run in parallel (`pytest -n 2`; `ORCH_TEST_WORKERS=2 bash scripts/test.sh`, opt-in), whatever `--dist` says, the
# tests of a group run one after another in one worker: what shares a resource that two tests cannot share, or an
# expensive fixture (tests/README.md). Every other test is a unit of its own. (xdist's `xdist_group` mark does not
# take under pytest 9.2, whose node ids it can no longer suffix: the scheduler below groups by file instead.)
GROUPS = {
    # the single-node SLURM (2 CPUs: some tests need both at once) and the Ray/veRL/vLLM stacks (GBs each)
    "cluster": ("orchestrator/test_sweep_e2e.py", "orchestrator/test_sweep_slurm.py",
                "orchestrator/test_sweep_slurm_verl.py", "orchestrator/test_sweep_injection.py",
                "recipes/verl/test_verl_training.py", "recipes/verl/test_verl_parts.py", "recipes/verl/test_vllm_cpu.py",
                "recipes/verl/test_verl_v1_faults.py",
                "test_gpu_stack.py"),
    # test_deepcoder asserts no sandbox process is left anywhere on the machine
    "deepcoder": ("envs/test_deepcoder.py", "recipes/torch_trainer/test_train_deepcoder.py"),
    # module fixtures of tens of seconds, built once
    "controls": ("recipes/diagnostics/test_controls.py",),  # the control arms, one shared prefix and warm start
    "fidelity": ("analysis/test_fidelity.py",),
    "golden": ("orchestrator/test_golden_digests.py",),
    "report": ("analysis/reports/test_report.py",),
}
_GROUP_OF = {f"tests/{path}": group for group, paths in GROUPS.items() for path in paths}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduler with `GROUPS` as the scopes (a test outside them is its own scope)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _GROUP_OF.get(nodeid.split("::", 1)[0], nodeid)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--full") or os.environ.get("ORCH_FULL_SUITE") == "1":
        return
    skip = pytest.mark.skip(reason="full tier: run with `bash scripts/test.sh --full` (tests/README.md)")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)

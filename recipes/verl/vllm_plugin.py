"""vLLM's plugin entry point (`vllm.general_plugins` in pyproject.toml): vLLM calls `register()` in each of its
processes (the engine and its workers), where orch's one write into vLLM's CPU build is installed
(`recipes.verl.patches` P6). Nothing happens on a GPU build of vLLM."""

from __future__ import annotations


def register() -> None:
    from recipes.verl.patches import install_vllm_cpu

    install_vllm_cpu()

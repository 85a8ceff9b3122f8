"""orch's veRL plug-in: what every process of a veRL run needs from orch, loaded through the `verl.plugins` entry
point (declared in pyproject.toml: `import verl` loads it in the driver, the TaskRunner, the FSDP workers, the
rollout server, the agent-loop and reward workers).

It registers, through veRL's public registries:

1. the CPU platform (`PlatformRegistry.register("cpu")`, recipes.verl.platform), selected with VERL_PLATFORM=cpu;
2. veRL's own FSDP engines for device "cpu" (`EngineRegistry.register(..., device="cpu")`); they are registered
   for cuda and npu only, and FSDP1 refuses CPU parameters, so CPU runs use `strategy=fsdp2`;
3. the "hf" rollout replica (`RolloutReplicaRegistry.register("hf", ...)`, recipes.verl.hf_rollout): Hugging Face
   `generate()` for tiny models on CPU (vLLM stays the rollout engine on GPUs);
4. the `orch_env` agent loop (veRL's `@register`, recipes.verl.agent_loop): every orch environment, multi-turn;

and applies the few private writes that have no public extension point, all in `recipes.verl.patches` (guarded by
a veRL version check). Importing this module is cheap and imports no veRL module: it runs inside `import verl`;
each registration waits until the module it needs is imported.
"""

from __future__ import annotations

from recipes.verl.imports import after_import

_REGISTERED = False


def _register_platform(_module: object) -> None:
    from recipes.verl.platform import register_cpu_platform

    register_cpu_platform()


def _register_engines(module: object) -> None:
    from verl.workers.engine.base import EngineRegistry

    for model_type, name in (("language_model", "FSDPEngineWithLMHead"), ("value_model", "FSDPEngineWithValueHead")):
        if "cpu" not in EngineRegistry._engines.get(model_type, {}).get("fsdp2", {}):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(
                getattr(module, name))


def _register_replica(_module: object) -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def load() -> type:
        from recipes.verl.hf_rollout import HFReplica

        return HFReplica

    RolloutReplicaRegistry.register("hf", load)


def _register_agent_loop(_module: object) -> None:
    import recipes.verl.agent_loop  # noqa: F401  (its @register fills veRL's agent-loop registry)


def register() -> None:
    """Install every registration (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    from recipes.verl import patches

    after_import("verl.plugin.platform.platform_manager", _register_platform)
    after_import("verl.workers.engine.fsdp.transformer_impl", _register_engines)
    after_import("verl.workers.rollout.replica", _register_replica)
    after_import("verl.experimental.agent_loop.agent_loop", _register_agent_loop)
    patches.install()


register()

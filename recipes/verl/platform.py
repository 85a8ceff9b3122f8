"""A CPU platform for veRL's platform layer (verl/plugin/platform): device 'cpu', backend gloo, Ray resource 'GPU'.

Workers are still scheduled on Ray's "GPU" resource (veRL's resource pools are GPU bundles), so Ray is started with
*logical* GPUs (`ray_init.num_gpus`); the platform reports that resource name but computes on the CPU.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Any

import torch


class _CPUDeviceModule(types.ModuleType):
    """Stands in for `torch.cuda` (veRL calls get_torch_device().empty_cache(), .synchronize(), .mem_get_info() ...)."""

    def __init__(self):
        super().__init__("orch_cpu_device")

    # device management
    def is_available(self) -> bool:
        return True

    def current_device(self):
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, _device) -> None:
        return None

    def synchronize(self, _device=None) -> None:
        return None

    # memory
    def empty_cache(self) -> None:
        return None

    def ipc_collect(self) -> None:
        return None

    def mem_get_info(self, _device=None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    def memory_allocated(self, _device=None) -> int:
        return 0

    def memory_reserved(self, _device=None) -> int:
        return 0

    def max_memory_allocated(self, _device=None) -> int:
        return 0

    def max_memory_reserved(self, _device=None) -> int:
        return 0

    def reset_peak_memory_stats(self, _device=None) -> None:
        return None

    def set_per_process_memory_fraction(self, *_args, **_kwargs) -> None:
        return None

    def get_device_name(self, _device=None) -> str:
        return "cpu"

    # rng
    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self, _device=None):
        return torch.get_rng_state()

    def set_rng_state(self, state, _device=None) -> None:
        torch.set_rng_state(state)

    def __getattr__(self, name: str) -> Any:  # Stream, stream, current_stream, Event, ... from torch.cpu
        return getattr(torch.cpu, name)


CPU_DEVICE_MODULE = _CPUDeviceModule()


def register_cpu_platform() -> None:
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    if PlatformRegistry.get("cpu") is not None:
        return

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self):
            return CPU_DEVICE_MODULE

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check=False) -> bool:
            return False  # never auto-detected: select explicitly with VERL_PLATFORM=cpu

        def current_device(self):
            # veRL does `tensor.to(get_device_id())`; an int would mean cuda:<int>
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"  # logical GPUs from ray.init(num_gpus=N)

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

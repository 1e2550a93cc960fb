"""Which NVML to use: pynvml (nvidia-ml-py), or a module with the same functions named by `CHAMBER_NVML_MODULE`
(the tests' fake, for dry runs of the agent and the device check on machines without GPUs)."""

import contextlib
import importlib
from typing import Any


def load_nvml(module: str = "") -> Any:
    """The NVML module: `module` (`package.module` or `package.module:attribute`) when given, else pynvml."""
    if not module:
        import pynvml

        return pynvml
    name, _, attribute = module.partition(":")
    loaded = importlib.import_module(name)
    return getattr(loaded, attribute) if attribute else loaded


def count_gpus(module: str = "") -> int:
    """How many GPUs NVML finds here; 0 when it cannot start (no driver, no library, no GPU)."""
    try:
        nvml = load_nvml(module)
        nvml.nvmlInit()
    except Exception:  # any failure to load or start NVML means: no usable GPUs here
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    except Exception:
        return 0
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()

"""The node agent's NVML source: every GPU of this node read through pynvml (nvidia-ml-py).

All NVML calls go through `NvmlReader`, which takes the pynvml module (or a fake with the same functions) as
an argument: that module is the one narrow seam tests replace.
"""

from chamber.collector.nvml.load import count_gpus, load_nvml
from chamber.collector.nvml.reader import NvmlReader, NvmlSource
from chamber.collector.nvml.xid import XidWatcher

__all__ = ["NvmlReader", "NvmlSource", "XidWatcher", "count_gpus", "load_nvml"]

"""A fake of pynvml's module surface for the node agent's tests: same function names, same error classes.

Each device is a dict of readings; a reading that is missing makes the call raise NVMLError NOT_SUPPORTED, as
the real library does on GPUs without the capability.
"""

import queue
import time
from dataclasses import dataclass
from typing import Any

import pynvml


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Mem:
    total: int
    used: int
    free: int


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int | None


@dataclass
class _Value:
    uiVal: int


@dataclass
class _Field:
    nvmlReturn: int
    value: _Value


@dataclass
class _Event:
    device: Any
    eventData: int
    eventType: int


H100 = {
    "name": "NVIDIA H100 80GB HBM3",
    "util": (87, 40),
    "mem": (80 * 1024**3, 60 * 1024**3),
    "temp": 61,
    "power_mw": 512_000,
    "limit_mw": 700_000,
    "clock_events": 0,
    "ecc": {(1, 0): 0, (0, 0): 3, (1, 1): 0, (0, 1): 12},  # (type, counter): uncorrected=1/corrected=0, volatile=0
    "remap": (2, 0, False, False),
    "retired": {0: [], 1: []},
    "retired_pending": 0,
    "nvlink": {link: {0: 1, 1: 0, 2: 2} for link in range(18)},
    "pcie_replay": 4,
    "procs": [(4242, 50 * 1024**3)],
    "recovery_action": 0,
}

V100_NO_REMAP_NO_NVLINK = {k: v for k, v in H100.items() if k not in ("remap", "nvlink")} | {"name": "Tesla V100"}

MIG_INSTANCE = {"name": "NVIDIA H100 MIG 1g.10gb", "mem": (10 * 1024**3, 1 * 1024**3), "util": None}


class FakeNvml:
    NVMLError = pynvml.NVMLError

    def __init__(self, devices: list[dict[str, Any]]) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        self.devices = devices
        self.handles = [object() for _ in devices]
        self.events: queue.Queue[_Event] = queue.Queue()
        self.initialized = False

    def _dev(self, h: Any) -> dict[str, Any]:
        return self.devices[self.handles.index(h)]

    def _get(self, h: Any, key: str) -> Any:
        value = self._dev(h).get(key)
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlInit(self) -> None:
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return self.handles[i]

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return f"GPU-fake-{self.handles.index(h)}"

    def nvmlDeviceGetName(self, h: Any) -> str:
        return str(self._get(h, "name"))

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> _Util:
        gpu, mem = self._get(h, "util")
        return _Util(gpu, mem)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> _Mem:
        total, used = self._get(h, "mem")
        return _Mem(total, used, total - used)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return int(self._get(h, "temp"))

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return int(self._get(h, "power_mw"))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        return int(self._get(h, "limit_mw"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return int(self._get(h, "clock_events"))

    def nvmlDeviceGetTotalEccErrors(self, h: Any, kind: int, counter: int) -> int:
        return int(self._get(h, "ecc")[(kind, counter)])

    def nvmlDeviceGetRetiredPages(self, h: Any, cause: int) -> list[int]:
        return list(self._get(h, "retired")[cause])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        return int(self._get(h, "retired_pending"))

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, bool, bool]:
        a, b, c, d = self._get(h, "remap")
        return (a, b, c, d)

    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        links = self._get(h, "nvlink")
        if link not in links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h: Any, link: int, counter: int) -> int:
        return int(self._get(h, "nvlink")[link][counter])

    def nvmlDeviceGetPcieReplayCounter(self, h: Any) -> int:
        return int(self._get(h, "pcie_replay"))

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[_Proc]:
        return [_Proc(pid, mem) for pid, mem in self._get(h, "procs")]

    def nvmlDeviceGetFieldValues(self, h: Any, fields: list[int]) -> list[Any]:
        action = self._get(h, "recovery_action")
        return [_Field(pynvml.NVML_SUCCESS, _Value(action)) for _ in fields]

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, event_set: object) -> None:
        pass

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> _Event:
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass

    def inject_xid(self, index: int, xid: int) -> float:
        self.events.put(_Event(self.handles[index], xid, pynvml.nvmlEventTypeXidCriticalError))
        return time.monotonic()

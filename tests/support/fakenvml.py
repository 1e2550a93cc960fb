"""A fake of pynvml's module surface for the node agent's tests: same function names, same error classes.

Each device is a dict of readings; a reading that is missing makes the call raise NVMLError NOT_SUPPORTED, as
the real library does on GPUs without the capability. A device with `mig` is a GPU in MIG mode whose instances
(dicts with `name`, `gi`, `mem` ...) are listed under it; one with `gpm` offers GPM metrics (percent values by
metric id), computed between two samples of the same device as NVML does. A device's `nvlink_down` lists its links
that are down. `lose(i)` makes GPU `i` fall off the bus (every call on it and its MIG instances raises
GPU_IS_LOST, as on a real node); `fail(i, error)` makes them raise any other NVML error, `recover(i)` undoes both.

`TWO_H100` is a ready node (`CHAMBER_NVML_MODULE=tests.support.fakenvml:TWO_H100`) for dry runs of the agent and
of `deploy/device-check.sh` on a machine without GPUs.
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
    gpuInstanceId: int = 0xFFFFFFFF


@dataclass
class _GpmSupport:
    isSupportedDevice: int


@dataclass
class _GpmSample:
    device: Any = None
    taken_at: float = 0.0
    freed: bool = False


@dataclass
class _GpmMetric:
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0


class _GpmMetricsGet:
    """Shaped like pynvml's c_nvmlGpmMetricsGet_t."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_GpmMetric() for _ in range(pynvml.NVML_GPM_METRIC_MAX)]


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
    "mig_mode": 0,
    "gpm": {
        pynvml.NVML_GPM_METRIC_SM_UTIL: 62.0,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 35.5,
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 71.25,
    },
}

V100_NO_REMAP_NO_NVLINK = {k: v for k, v in H100.items() if k not in ("remap", "nvlink", "gpm", "mig_mode")} | {
    "name": "Tesla V100"
}

MIG_INSTANCE = {"name": "NVIDIA H100 MIG 1g.10gb", "mem": (10 * 1024**3, 1 * 1024**3), "util": None}

H100_IDLE = H100 | {"power_mw": 60_000, "procs": []}
"""Busy counters but at idle power (under 10% of 700 W): its usage is 0."""

H100_MIG = H100 | {
    "mig_mode": 1,
    "procs": [],
    "mig": [
        {"name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "gi": 1, "mem": (40 * 1024**3, 2 * 1024**3), "procs": [],
         "gpm": {pynvml.NVML_GPM_METRIC_SM_UTIL: 40.0}},
        {"name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "gi": 9, "mem": (10 * 1024**3, 0), "procs": []},
    ],
}  # fmt: skip


class FakeNvml:
    NVMLError = pynvml.NVMLError

    c_nvmlGpmMetricsGet_t = _GpmMetricsGet

    def __init__(self, devices: list[dict[str, Any]]) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        self.devices = devices
        self.handles = [object() for _ in devices]
        self.mig_handles = [[object() for _ in d.get("mig", [])] for d in devices]
        self._by_handle: dict[int, tuple[dict[str, Any], str, int]] = {}
        """id(handle) -> (readings, UUID, index of the physical GPU)."""
        for i, (h, d) in enumerate(zip(self.handles, devices, strict=True)):
            self._by_handle[id(h)] = (d, f"GPU-fake-{i}", i)
            for k, (mh, md) in enumerate(zip(self.mig_handles[i], d.get("mig", []), strict=True)):
                self._by_handle[id(mh)] = (md, f"MIG-fake-{i}-{k}", i)
        self.failing: dict[int, int] = {}
        """Physical GPU index -> the NVML error every call on that GPU raises (see `lose`, `fail`)."""
        self.events: queue.Queue[_Event] = queue.Queue()
        self.initialized = False
        self.gpm_samples: list[_GpmSample] = []

    def lose(self, index: int) -> None:
        """GPU `index` falls off the bus: NVML answers GPU_IS_LOST to everything about it."""
        self.fail(index, pynvml.NVML_ERROR_GPU_IS_LOST)

    def fail(self, index: int, error: int) -> None:
        self.failing[index] = error

    def recover(self, index: int) -> None:
        self.failing.pop(index, None)

    def _entry(self, h: Any) -> tuple[dict[str, Any], str, int]:
        entry = self._by_handle[id(h)]
        error = self.failing.get(entry[2])
        if error is not None:
            raise pynvml.NVMLError(error)
        return entry

    def _dev(self, h: Any) -> dict[str, Any]:
        return self._entry(h)[0]

    def _get(self, h: Any, key: str) -> Any:
        value = self._dev(h).get(key)
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlInit(self) -> None:
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return "560.35.03 (fake)"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return self.handles[i]

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._entry(h)[1]

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
        return int(link not in self._dev(h).get("nvlink_down", ()))

    def nvmlDeviceGetNvLinkErrorCounter(self, h: Any, link: int, counter: int) -> int:
        return int(self._get(h, "nvlink")[link][counter])

    def nvmlDeviceGetPcieReplayCounter(self, h: Any) -> int:
        return int(self._get(h, "pcie_replay"))

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[_Proc]:
        return [_Proc(pid, mem) for pid, mem in self._get(h, "procs")]

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        mode = int(self._get(h, "mig_mode"))
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        self._get(h, "mig_mode")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, index: int) -> Any:
        self._entry(h)
        instances = self.mig_handles[self.handles.index(h)]
        if index >= len(instances):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return instances[index]

    def nvmlDeviceGetGpuInstanceId(self, h: Any) -> int:
        return int(self._get(h, "gi"))

    def nvmlGpmQueryDeviceSupport(self, h: Any) -> _GpmSupport:
        return _GpmSupport(int("gpm" in self._dev(h)))

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        sample = _GpmSample()
        self.gpm_samples.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: _GpmSample) -> None:
        sample.freed = True

    def nvmlGpmSampleGet(self, h: Any, sample: _GpmSample) -> _GpmSample:
        self._get(h, "gpm")
        sample.device, sample.taken_at = h, time.monotonic()
        return sample

    def nvmlGpmMigSampleGet(self, h: Any, gpu_instance: int, sample: _GpmSample) -> _GpmSample:
        index = self.handles.index(h)
        for mh, md in zip(self.mig_handles[index], self.devices[index].get("mig", []), strict=True):
            if md["gi"] == gpu_instance:
                self._get(mh, "gpm")
                sample.device, sample.taken_at = mh, time.monotonic()
                return sample
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpmMetricsGet(self, request: _GpmMetricsGet) -> _GpmMetricsGet:
        one, two = request.sample1, request.sample2
        valid = request.version == pynvml.NVML_GPM_METRICS_GET_VERSION and one is not two
        if not valid or one.freed or two.freed or one.device is not two.device or one.device is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        values = self._get(one.device, "gpm")
        for metric in request.metrics[: request.numMetrics]:
            if metric.metricId in values:
                metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, float(values[metric.metricId])
            else:
                metric.nvmlReturn, metric.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
        return request

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

    def inject_xid(self, index: int, xid: int, gpu_instance: int = 0xFFFFFFFF) -> float:
        self.events.put(_Event(self.handles[index], xid, pynvml.nvmlEventTypeXidCriticalError, gpu_instance))
        return time.monotonic()


TWO_H100 = FakeNvml([H100 | {"procs": []}, H100 | {"procs": []}])
"""A node of two H100s with nothing on them, as a module for `CHAMBER_NVML_MODULE`."""

"""Reading one GPU's health and activity with NVML; a call the GPU or driver does not support leaves its field
absent instead of failing the sample (older GPUs lack row remapping, MIG instances lack most counters)."""

from collections.abc import Callable, Mapping
from functools import partial
from types import ModuleType
from typing import Any, TypeVar

from chamber.common.contracts import (
    GpuDevice,
    GpuProcess,
    GpuSample,
    Node,
    NodeInventory,
    NodeTelemetry,
    Pool,
    TopologyLabels,
)
from chamber.common.log import get_logger

log = get_logger(__name__)

T = TypeVar("T")
MIB = 1024 * 1024


class NvmlReader:
    def __init__(self, nvml: ModuleType | Any) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.unsupported: set[str] = set()

    def close(self) -> None:
        self.nvml.nvmlShutdown()

    def _try(self, what: str, call: Callable[[], T]) -> T | None:
        """The call's result, or None when NVML says the GPU cannot answer it (logged once per kind)."""
        if what in self.unsupported:
            return None
        try:
            return call()
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self.nvml.NVML_ERROR_NOT_SUPPORTED:
                self.unsupported.add(what)
            else:
                log.warning("nvml.read_failed", field=what, error=str(exc))
            return None

    def devices(self) -> list[GpuDevice]:
        n = self.nvml
        out = []
        for i, h in enumerate(self.handles):
            mem = self._try("memory", partial(n.nvmlDeviceGetMemoryInfo, h))
            out.append(
                GpuDevice(
                    index=i,
                    uuid=_text(n.nvmlDeviceGetUUID(h)),
                    model=_text(n.nvmlDeviceGetName(h)),
                    memory_mb=int(mem.total / MIB) if mem is not None else 0,
                )
            )
        return out

    def sample(self, index: int) -> GpuSample:
        n = self.nvml
        h = self.handles[index]
        util = self._try("utilization", lambda: n.nvmlDeviceGetUtilizationRates(h))
        mem = self._try("memory", lambda: n.nvmlDeviceGetMemoryInfo(h))
        power = self._try("power", lambda: n.nvmlDeviceGetPowerUsage(h))
        limit = self._try("power_limit", lambda: n.nvmlDeviceGetEnforcedPowerLimit(h))
        remap = self._try("remapped_rows", lambda: n.nvmlDeviceGetRemappedRows(h))
        dbe_pages = self._try(
            "retired_pages",
            lambda: n.nvmlDeviceGetRetiredPages(h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        )
        sbe_pages = self._try(
            "retired_pages",
            lambda: n.nvmlDeviceGetRetiredPages(h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        )
        procs = self._try("processes", lambda: n.nvmlDeviceGetComputeRunningProcesses(h))
        pending_pages = self._try("retired_pages", lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(h))
        temp_sensor = n.NVML_TEMPERATURE_GPU
        return GpuSample(
            index=index,
            uuid=_text(n.nvmlDeviceGetUUID(h)),
            gpu_util=None if util is None else float(util.gpu),
            mem_util=None if util is None else float(util.memory),
            mem_used_mb=None if mem is None else mem.used / MIB,
            mem_total_mb=None if mem is None else mem.total / MIB,
            temperature_c=_float(self._try("temperature", lambda: n.nvmlDeviceGetTemperature(h, temp_sensor))),
            power_w=None if power is None else power / 1000,
            power_limit_w=None if limit is None else limit / 1000,
            clock_event_reasons=self._try("clock_events", lambda: self._clock_events(h)),
            ecc_dbe_volatile=self._ecc(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
            ecc_sbe_volatile=self._ecc(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            ecc_dbe_aggregate=self._ecc(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC),
            ecc_sbe_aggregate=self._ecc(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC),
            retired_pages_dbe=None if dbe_pages is None else len(dbe_pages),
            retired_pages_sbe=None if sbe_pages is None else len(sbe_pages),
            retired_pages_pending=_bool(pending_pages),
            remapped_rows_correctable=None if remap is None else int(remap[0]),
            remapped_rows_uncorrectable=None if remap is None else int(remap[1]),
            remapped_rows_pending=None if remap is None else bool(remap[2]),
            remapped_rows_failure=None if remap is None else bool(remap[3]),
            nvlink_replay_errors=self._nvlink(h, n.NVML_NVLINK_ERROR_DL_REPLAY),
            nvlink_recovery_errors=self._nvlink(h, n.NVML_NVLINK_ERROR_DL_RECOVERY),
            nvlink_crc_errors=self._nvlink(h, n.NVML_NVLINK_ERROR_DL_CRC_FLIT),
            pcie_replay_count=self._try("pcie_replay", lambda: int(n.nvmlDeviceGetPcieReplayCounter(h))),
            recovery_action=self._try("recovery_action", lambda: self._recovery_action(h)),
            processes=None
            if procs is None
            else [
                GpuProcess(pid=p.pid, used_memory_mb=None if p.usedGpuMemory is None else p.usedGpuMemory / MIB)
                for p in procs
            ],
        )  # fmt: skip

    def _recovery_action(self, h: Any) -> int:
        """NVML's recommended recovery (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset)."""
        n = self.nvml
        (value,) = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        if value.nvmlReturn != n.NVML_SUCCESS:
            raise n.NVMLError(value.nvmlReturn)
        return int(value.value.uiVal)

    def _clock_events(self, h: Any) -> int:
        n = self.nvml
        getter = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return int(getter(h))

    def _ecc(self, h: Any, kind: int, counter: int) -> int | None:
        return self._try(f"ecc-{kind}-{counter}", lambda: int(self.nvml.nvmlDeviceGetTotalEccErrors(h, kind, counter)))

    def _nvlink(self, h: Any, counter: int) -> int | None:
        """Summed over the GPU's active links; None when the GPU has no NVLink."""
        n = self.nvml
        if "nvlink" in self.unsupported:
            return None
        total = 0
        active = 0
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                if not n.nvmlDeviceGetNvLinkState(h, link):
                    continue
                total += int(n.nvmlDeviceGetNvLinkErrorCounter(h, link, counter))
                active += 1
            except n.NVMLError:
                continue
        if not active:
            self.unsupported.add("nvlink")
            return None
        return total


class NvmlSource:
    """The TelemetrySource of a node agent: this node's GPUs, read with NVML."""

    def __init__(self, reader: NvmlReader, node: str, pool: Pool, topology: TopologyLabels, interval_s: float) -> None:
        self.reader = reader
        self.node = Node(name=node, pool=pool.name, gpus=reader.devices(), topology=topology)
        self.pool = pool
        self.interval_s = interval_s

    def inventory(self, now: float) -> list[NodeInventory]:
        return [NodeInventory(node=self.node, pool=self.pool, observed_at=now)]

    def sample(self, now: float, allocation: Mapping[str, str]) -> list[NodeTelemetry]:
        gpus = [self.reader.sample(i) for i in range(len(self.reader.handles))]
        return [
            NodeTelemetry(node=self.node.name, sampled_at=now, interval_s=self.interval_s, gpus=gpus, source="nvml")
        ]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _float(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def _bool(value: object) -> bool | None:
    return None if value is None else bool(value)

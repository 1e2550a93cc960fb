"""Reading one GPU's health and activity with NVML; a call the GPU or driver does not support leaves its field
absent instead of failing the sample (older GPUs lack row remapping and GPM, MIG instances lack most counters).

The devices are what a job can be given: every GPU, except that a GPU in MIG mode is replaced by its MIG
instances, each listed as its own device with its profile. Health counters (ECC, row remapping, NVLink, PCIe,
power, temperature) belong to the physical GPU and are read from it for each of its instances.

Activity comes from NVML's GPU Performance Monitoring (GPM, Hopper and newer): each sample takes a GPM snapshot
and NVML computes SM, tensor and DRAM activity between it and the previous one.

A GPU NVML cannot read at all (fallen off the bus: GPU_IS_LOST) is left out of the node's batch, not allowed to
stop the agent: fewer GPUs than the node's inventory is what health's gpu-count-drop rule looks for.
"""

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any, TypeVar

import msgspec

from chamber.collector.core.assignments import Attribution
from chamber.collector.core.usage import usage_percent
from chamber.common.contracts import (
    GpuDevice,
    GpuProcess,
    GpuSample,
    GpuXidEvent,
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
MIG_PROFILE = re.compile(r"MIG\s+(\S+)$")


@dataclass
class Device:
    """One schedulable device: a whole GPU, or a MIG instance with its parent GPU and GPU-instance id."""

    handle: Any
    physical: int
    """Index of the physical GPU (the whole GPU's own index when not MIG)."""
    parent: Any = None
    gpu_instance: int | None = None
    gpm_sample: Any = None


class NvmlReader:
    def __init__(self, nvml: ModuleType | Any) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        self.unreadable: list[int] = []
        """NVML indices of the GPUs that could not be read at start (see `_readable`): left out of everything."""
        self.physical: list[Any | None] = [self._readable(i) for i in range(nvml.nvmlDeviceGetCount())]
        """Per NVML index, its handle (None: unreadable, its place kept so that no other GPU takes its index)."""
        self.unsupported: set[tuple[int, str]] = set()
        self._links: dict[int, list[int]] = {}
        """Device index -> its physical GPU's NVLink links, learnt at the first read NVML answered for all links."""
        self._link_counts: dict[tuple[int, int, int], int] = {}
        """(device, link, counter) -> the link's error counter as last read (what a link that is down counts)."""
        self.entries = self._enumerate()
        self.handles = [e.handle for e in self.entries]
        self._gpm = [h is not None and self._gpm_supported(h) for h in self.physical]
        for i in range(len(self.entries)):
            self._gpm_snapshot(i)  # the first interval starts now

    def _readable(self, index: int) -> Any | None:
        """GPU `index`'s handle, if NVML can tell what it is (its UUID, name and MIG mode). A GPU that fell off the
        bus before the agent started answers nothing: it is left out, logged, and counted (`unreadable`), so the
        node is still served with the GPUs it has, and health sees one missing, instead of an agent that dies at
        every start and takes the node's jobs with it. It keeps its index (a placeholder device): the other GPUs
        keep theirs, which the ledger's claims, the replicas' records and health's history are keyed by (a GPU
        that was split into MIG instances holds one index then: how many it had cannot be read)."""
        n = self.nvml
        try:
            handle = n.nvmlDeviceGetHandleByIndex(index)
            n.nvmlDeviceGetUUID(handle)
            n.nvmlDeviceGetName(handle)
            try:
                n.nvmlDeviceGetMigMode(handle)
            except n.NVMLError as exc:
                if _code(exc) != n.NVML_ERROR_NOT_SUPPORTED:
                    raise
        except n.NVMLError as exc:
            log.error("nvml.gpu_unreadable", device=index, error=str(exc))
            self.unreadable.append(index)
            return None
        return handle

    def close(self) -> None:
        n = self.nvml
        for entry in self.entries:
            if entry.gpm_sample is not None:
                self._try(-1, "gpm_free", partial(n.nvmlGpmSampleFree, entry.gpm_sample))
        n.nvmlShutdown()

    def _enumerate(self) -> list[Device]:
        n = self.nvml
        out: list[Device] = []
        for i, h in enumerate(self.physical):
            if h is None:
                out.append(Device(None, i))  # unreadable: keeps its index, read never
                continue
            mode = self._try(i, "mig_mode", partial(n.nvmlDeviceGetMigMode, h))
            if not mode or mode[0] != n.NVML_DEVICE_MIG_ENABLE:
                out.append(Device(h, i))
                continue
            for k in range(int(n.nvmlDeviceGetMaxMigDeviceCount(h))):
                try:
                    mig = n.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                except n.NVMLError:
                    continue  # an empty slot
                out.append(Device(mig, i, parent=h, gpu_instance=int(n.nvmlDeviceGetGpuInstanceId(mig))))
        return out

    def _try(self, index: int, what: str, call: Callable[[], T]) -> T | None:
        """The call's result, or None when NVML says this device cannot answer it (remembered per device).

        GPU_IS_LOST is raised, not swallowed: nothing else can be read from that GPU, so its whole sample fails
        at once instead of logging every field of it."""
        if (index, what) in self.unsupported:
            return None
        try:
            return call()
        except self.nvml.NVMLError as exc:
            if _code(exc) == self.nvml.NVML_ERROR_GPU_IS_LOST:
                raise
            if _code(exc) in (self.nvml.NVML_ERROR_NOT_SUPPORTED, _not_found(self.nvml)):
                self.unsupported.add((index, what))
            else:
                log.warning("nvml.read_failed", field=what, device=index, error=str(exc))
            return None

    @property
    def present(self) -> list[int]:
        """The device indices that can be read (every one but the placeholders of unreadable GPUs)."""
        return [i for i, e in enumerate(self.entries) if e.handle is not None]

    def devices(self) -> list[GpuDevice]:
        n = self.nvml
        out = []
        for i in self.present:
            e = self.entries[i]
            mem = self._try(i, "memory", partial(n.nvmlDeviceGetMemoryInfo, e.handle))
            name = _text(n.nvmlDeviceGetName(e.handle))
            out.append(
                GpuDevice(
                    index=i,
                    uuid=_text(n.nvmlDeviceGetUUID(e.handle)),
                    model=name,
                    memory_mb=int(mem.total / MIB) if mem is not None else 0,
                    mig_profile="" if e.parent is None else self._mig_profile(i, e, name),
                    parent_uuid="" if e.parent is None else _text(n.nvmlDeviceGetUUID(e.parent)),
                )
            )
        return out

    def _mig_profile(self, i: int, e: Device, name: str) -> str:
        """`1g.10gb` ...: from the instance's name as NVML gives it, else from its slices and memory."""
        match = MIG_PROFILE.search(name)
        if match:
            return match.group(1)
        attrs = self._try(i, "attributes", partial(self.nvml.nvmlDeviceGetAttributes, e.handle))
        if attrs is None:
            return "mig"
        return f"{attrs.gpuInstanceSliceCount}g.{round(attrs.memorySizeMB / 1024)}gb"

    def xid_targets(self, physical: int, gpu_instance: int | None) -> list[int]:
        """The devices an XID on physical GPU `physical` concerns: the one MIG instance it names, else all of it."""
        on_gpu = [i for i, e in enumerate(self.entries) if e.physical == physical]
        exact = [i for i in on_gpu if gpu_instance is not None and self.entries[i].gpu_instance == gpu_instance]
        return exact or on_gpu

    # ---- GPM ----------------------------------------------------------------------------------------------------

    def _gpm_supported(self, h: Any) -> bool:
        n = self.nvml
        try:
            return bool(n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except (n.NVMLError, AttributeError):
            return False

    def _gpm_snapshot(self, i: int) -> tuple[Any, Any] | None:
        """Take a new GPM snapshot of device `i`; returns (previous, new), or None where GPM is unsupported."""
        n, e = self.nvml, self.entries[i]
        if not self._gpm[e.physical] or (i, "gpm") in self.unsupported:
            return None
        sample = self._try(i, "gpm", n.nvmlGpmSampleAlloc)
        if sample is None:
            return None
        if e.parent is None:
            taken = self._try(i, "gpm", partial(n.nvmlGpmSampleGet, e.handle, sample))
        else:
            taken = self._try(i, "gpm", partial(n.nvmlGpmMigSampleGet, e.parent, e.gpu_instance, sample))
        if taken is None:
            self._try(i, "gpm_free", partial(n.nvmlGpmSampleFree, sample))
            return None
        previous, e.gpm_sample = e.gpm_sample, sample
        return previous, sample

    def _gpm_activity(self, i: int) -> tuple[float | None, float | None, float | None]:
        """(SM, tensor, DRAM) activity as 0-1 ratios over the interval since the last sample of device `i`."""
        n = self.nvml
        pair = self._gpm_snapshot(i)
        if pair is None or pair[0] is None:
            return None, None, None
        previous, current = pair
        wanted = (n.NVML_GPM_METRIC_SM_UTIL, n.NVML_GPM_METRIC_ANY_TENSOR_UTIL, n.NVML_GPM_METRIC_DRAM_BW_UTIL)
        request = n.c_nvmlGpmMetricsGet_t()
        request.version = n.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1 = previous
        request.sample2 = current
        for k, metric in enumerate(wanted):
            request.metrics[k].metricId = metric
        got = self._try(i, "gpm", partial(n.nvmlGpmMetricsGet, request))
        self._try(i, "gpm_free", partial(n.nvmlGpmSampleFree, previous))
        if got is None:
            return None, None, None
        values = [
            _ratio(got.metrics[k].value) if got.metrics[k].nvmlReturn == n.NVML_SUCCESS else None
            for k in range(len(wanted))
        ]
        return values[0], values[1], values[2]

    # ---- a sample ---------------------------------------------------------------------------------------------

    def sample(self, index: int) -> GpuSample:
        n = self.nvml
        e = self.entries[index]
        h = e.handle
        g = e.parent if e.parent is not None else h  # the physical GPU: health, power, temperature
        t = partial(self._try, index)
        util = t("utilization", lambda: n.nvmlDeviceGetUtilizationRates(h))
        mem = t("memory", lambda: n.nvmlDeviceGetMemoryInfo(h))
        power = t("power", lambda: n.nvmlDeviceGetPowerUsage(g))
        limit = t("power_limit", lambda: n.nvmlDeviceGetEnforcedPowerLimit(g))
        remap = t("remapped_rows", lambda: n.nvmlDeviceGetRemappedRows(g))
        dbe_pages = t(
            "retired_pages",
            lambda: n.nvmlDeviceGetRetiredPages(g, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        )
        sbe_pages = t(
            "retired_pages",
            lambda: n.nvmlDeviceGetRetiredPages(g, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        )
        procs = t("processes", lambda: n.nvmlDeviceGetComputeRunningProcesses(h))
        # Its own key (found by review: shared with the counts above, a device that cannot tell pending retirement
        # lost its retired-page counts from its second sample on).
        pending_pages = t("retired_pages_pending", lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(g))
        sm, tensor, dram = self._gpm_activity(index)
        power_w = None if power is None else power / 1000
        limit_w = None if limit is None else limit / 1000
        temp_sensor = n.NVML_TEMPERATURE_GPU
        links = self._nvlinks_up(index, g)
        return GpuSample(
            index=index,
            uuid=_text(n.nvmlDeviceGetUUID(h)),
            gpu_util=None if util is None else float(util.gpu),
            mem_util=None if util is None else float(util.memory),
            mem_used_mb=None if mem is None else mem.used / MIB,
            mem_total_mb=None if mem is None else mem.total / MIB,
            temperature_c=_float(t("temperature", lambda: n.nvmlDeviceGetTemperature(g, temp_sensor))),
            power_w=power_w,
            power_limit_w=limit_w,
            sm_activity=sm,
            tensor_activity=tensor,
            dram_activity=dram,
            usage=usage_percent(sm, tensor, dram, power_w, limit_w),
            clock_event_reasons=t("clock_events", lambda: self._clock_events(g)),
            ecc_dbe_volatile=self._ecc(index, g, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
            ecc_sbe_volatile=self._ecc(index, g, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            ecc_dbe_aggregate=self._ecc(index, g, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC),
            ecc_sbe_aggregate=self._ecc(index, g, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC),
            retired_pages_dbe=None if dbe_pages is None else len(dbe_pages),
            retired_pages_sbe=None if sbe_pages is None else len(sbe_pages),
            retired_pages_pending=_bool(pending_pages),
            remapped_rows_correctable=None if remap is None else int(remap[0]),
            remapped_rows_uncorrectable=None if remap is None else int(remap[1]),
            remapped_rows_pending=None if remap is None else bool(remap[2]),
            remapped_rows_failure=None if remap is None else bool(remap[3]),
            nvlink_replay_errors=self._nvlink(index, g, links, n.NVML_NVLINK_ERROR_DL_REPLAY),
            nvlink_recovery_errors=self._nvlink(index, g, links, n.NVML_NVLINK_ERROR_DL_RECOVERY),
            nvlink_crc_errors=self._nvlink(index, g, links, n.NVML_NVLINK_ERROR_DL_CRC_FLIT),
            pcie_replay_count=t("pcie_replay", lambda: int(n.nvmlDeviceGetPcieReplayCounter(g))),
            recovery_action=t("recovery_action", lambda: self._recovery_action(g)),
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

    def _ecc(self, index: int, h: Any, kind: int, counter: int) -> int | None:
        return self._try(
            index, f"ecc-{kind}-{counter}", lambda: int(self.nvml.nvmlDeviceGetTotalEccErrors(h, kind, counter))
        )

    # ---- NVLink -------------------------------------------------------------------------------------------------

    def _nvlinks_up(self, index: int, h: Any) -> list[int] | None:
        """The GPU's links that are up now; None when there is nothing to read from this time.

        Which links the GPU has is learnt once, from the first read NVML answers for every link: a link it does not
        support is not there (an A100 has 12 of the 18, a PCIe GPU none), and a GPU with none is not asked again.
        Any other failure (NVML_ERROR_UNKNOWN during a reset), or every link down, costs this sample only: giving
        up for good would hide the NVLink error rates of a GPU that recovers until the agent restarts."""
        n = self.nvml
        if (index, "nvlink") in self.unsupported:
            return None
        known = self._links.get(index)
        present: list[int] = []
        up: list[int] = []
        for link in range(n.NVML_NVLINK_MAX_LINKS) if known is None else known:
            try:
                state = n.nvmlDeviceGetNvLinkState(h, link)
            except n.NVMLError as exc:
                if known is None and _code(exc) in _no_such_link(n):
                    continue
                if _code(exc) == n.NVML_ERROR_GPU_IS_LOST:
                    raise
                log.warning("nvml.read_failed", field="nvlink", device=index, link=link, error=str(exc))
                return None
            present.append(link)
            if state:
                up.append(link)
        if known is None:
            self._links[index] = present
            if not present:
                self.unsupported.add((index, "nvlink"))
        return up or None

    def _nvlink(self, index: int, h: Any, links: list[int] | None, counter: int) -> int | None:
        """Summed over every link the GPU has: those up as read now, those down as last read (a link's counter
        only grows). None unless every link that is up answered, since a sum with a link missing would look like
        the counter falling, then jumping by that link's whole count (found by review: summed over the links up
        only, a link going down and back made a false burst of errors)."""
        if links is None:
            return None
        n = self.nvml
        total = 0
        for link in links:
            value = self._try(index, f"nvlink-{counter}", partial(n.nvmlDeviceGetNvLinkErrorCounter, h, link, counter))
            if value is None:
                return None
            self._link_counts[(index, link, counter)] = int(value)
        for link in self._links.get(index, links):
            total += self._link_counts.get((index, link, counter), 0)
        return total


Owner = Callable[[int, int], str]
"""(pid, device index) -> the job whose replica on that device the process belongs to; empty: none."""


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
"""Linux's random ID of the current boot: the same for the node's whole uptime, a new one after every reboot."""


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """This node's boot ID; empty where it cannot be read (not Linux)."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""


class NvmlSource:
    """The TelemetrySource of a node agent: this node's GPUs, read with NVML.

    With an `owner` (the node's job runner), each GPU process is attributed to its job, and the processes that no
    job placed on that GPU owns are counted (`unallocated_processes`): work the ledger does not know about.

    With `assigned` (on Kubernetes: the kubelet's device assignments joined with Chamber's pods, see
    `chamber.collector.core.assignments`), each GPU names the job and pod the kubelet gave it to, its processes
    belong to that job (when no runner says otherwise), and the batch carries where the kubelet and the ledger
    disagree."""

    def __init__(
        self,
        reader: NvmlReader,
        node: str,
        pool: Pool,
        topology: TopologyLabels,
        interval_s: float,
        *,
        owner: Owner | None = None,
        assigned: Callable[[], Attribution | None] | None = None,
        boot_id: str | None = None,
    ) -> None:
        self.reader = reader
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        """This node's boot (health: a new one is a reboot, which clears faults only a reset clears)."""
        self.node = Node(name=node, pool=pool.name, gpus=reader.devices(), topology=topology,
                         unreadable_gpus=len(reader.unreadable))  # fmt: skip
        self.pool = pool
        self.interval_s = interval_s
        self.owner = owner
        self.assigned = assigned
        self._unallocated: dict[int, int] = {}
        self._failing: dict[int, int | None] = {}
        """Device index -> the NVML error its last sample failed with, so a failing GPU is logged once."""

    def xid_event(self, index: int, xid: int, at: float) -> GpuXidEvent:
        """An XID on device `index`, with that GPU's UUID (found by its index: an unreadable GPU leaves a gap)."""
        uuid = next((g.uuid for g in self.node.gpus if g.index == index), "")
        return GpuXidEvent(node=self.node.name, gpu_index=index, uuid=uuid, xid=xid, observed_at=at)

    def inventory(self, now: float) -> list[NodeInventory]:
        return [NodeInventory(node=self.node, pool=self.pool, observed_at=now)]

    def sample(self, now: float, allocation: Mapping[str, str]) -> list[NodeTelemetry]:
        attribution = self.assigned() if self.assigned is not None else None
        read = (self._read(i) for i in self.reader.present)
        gpus = [self._attributed(sample, attribution) for sample in read if sample is not None]
        mismatches = list(attribution.mismatches) if attribution is not None else []
        return [
            NodeTelemetry(
                node=self.node.name,
                sampled_at=now,
                interval_s=self.interval_s,
                gpus=gpus,
                source="nvml",
                assignment_mismatches=mismatches,
                boot_id=self.boot_id,
            )
        ]

    def _read(self, index: int) -> GpuSample | None:
        """Device `index`'s sample; None when NVML fails on it. A GPU that fell off the bus (GPU_IS_LOST), or any
        other NVML error on one GPU, must cost the batch that GPU only: an exception here would end the agent and
        the job runners in its process. Health then sees fewer GPUs than the node has (gpu-count-drop)."""
        try:
            sample = self.reader.sample(index)
        except self.reader.nvml.NVMLError as exc:
            self._failed(index, exc)
            return None
        if index in self._failing:
            del self._failing[index]
            log.warning("nvml.gpu_back", node=self.node.name, gpu=index)
        return sample

    def _failed(self, index: int, exc: Exception) -> None:
        """Log a GPU's failure when it starts (or changes), not at every interval it lasts."""
        code = _code(exc)
        if index in self._failing and self._failing[index] == code:
            return
        self._failing[index] = code
        lost = code == self.reader.nvml.NVML_ERROR_GPU_IS_LOST
        uuid = next((g.uuid for g in self.node.gpus if g.index == index), "")
        event = "nvml.gpu_lost" if lost else "nvml.sample_failed"
        log.error(event, node=self.node.name, gpu=index, uuid=uuid, error=str(exc))

    def _attributed(self, sample: GpuSample, attribution: Attribution | None = None) -> GpuSample:
        if attribution is not None:
            job = attribution.job_of.get(sample.uuid, "")
            sample = msgspec.structs.replace(sample, job_id=job, pod=attribution.pod_of.get(sample.uuid, ""))
            if self.owner is None and sample.processes is not None:  # the kubelet says whose the device is
                return self._counted(sample, [msgspec.structs.replace(p, job_id=job) for p in sample.processes])
        if self.owner is None or sample.processes is None:
            return sample
        owner = self.owner
        processes = [
            GpuProcess(pid=p.pid, used_memory_mb=p.used_memory_mb, job_id=owner(p.pid, sample.index))
            for p in sample.processes
        ]
        return self._counted(sample, processes)

    def _counted(self, sample: GpuSample, processes: list[GpuProcess]) -> GpuSample:
        unallocated = sum(1 for p in processes if not p.job_id)
        if unallocated and self._unallocated.get(sample.index) != unallocated:
            rogue = [p.pid for p in processes if not p.job_id]
            log.warning("nvml.unallocated_processes", node=self.node.name, gpu=sample.index, pids=rogue)
        self._unallocated[sample.index] = unallocated
        return msgspec.structs.replace(sample, processes=processes, unallocated_processes=unallocated)


def _code(exc: Exception) -> int | None:
    """The NVML return code an NVMLError carries."""
    value = getattr(exc, "value", None)
    return None if value is None else int(value)


def _no_such_link(nvml: Any) -> tuple[int, ...]:
    """What NVML answers for a link number the GPU does not have (or for any link of a GPU without NVLink)."""
    n = nvml
    return (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_INVALID_ARGUMENT, n.NVML_ERROR_NOT_FOUND, _not_found(n))


def _not_found(nvml: Any) -> int:
    return int(getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", -1))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ratio(percent: float) -> float | None:
    """A GPM percentage as a 0-1 ratio. Two snapshots taken moments apart (a GPU read twice in a row) give NaN on a
    real H200: no figure rather than one that poisons every mean it enters; rounding past 0-100 is clamped."""
    if not math.isfinite(percent):
        return None
    return min(max(percent / 100, 0.0), 1.0)


def _float(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def _bool(value: object) -> bool | None:
    return None if value is None else bool(value)

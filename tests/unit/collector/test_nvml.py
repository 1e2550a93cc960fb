"""The node agent's NVML reading, against a fake at the pynvml boundary."""

import asyncio
import ctypes
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from structlog.testing import capture_logs

from chamber.collector.nvml import NvmlReader, NvmlSource, XidWatcher
from chamber.collector.nvml.reader import read_boot_id
from chamber.common.contracts import Pool, TopologyLabels
from tests.support.fakenvml import H100, H100_IDLE, H100_MIG, MIG_INSTANCE, V100_NO_REMAP_NO_NVLINK, FakeNvml


def test_an_h100_is_read_completely_and_in_our_units() -> None:
    reader = NvmlReader(FakeNvml([H100]))
    s = reader.sample(0)
    assert (s.gpu_util, s.mem_util) == (87.0, 40.0)
    assert s.mem_total_mb == 80 * 1024
    assert s.mem_used_mb == 60 * 1024
    assert (s.power_w, s.power_limit_w) == (512.0, 700.0)
    assert s.temperature_c == 61.0
    assert (s.ecc_dbe_volatile, s.ecc_sbe_volatile, s.ecc_sbe_aggregate) == (0, 3, 12)
    assert (s.remapped_rows_correctable, s.remapped_rows_pending, s.remapped_rows_failure) == (2, False, False)
    assert s.nvlink_replay_errors == 18
    assert s.nvlink_crc_errors == 36
    assert s.pcie_replay_count == 4
    assert s.processes is not None
    assert s.processes[0].pid == 4242
    assert s.clock_event_reasons == 0
    assert s.recovery_action == 0


def test_capabilities_a_gpu_lacks_are_absent_not_zero() -> None:
    reader = NvmlReader(FakeNvml([V100_NO_REMAP_NO_NVLINK, MIG_INSTANCE]))
    old = reader.sample(0)
    assert old.remapped_rows_pending is None
    assert old.nvlink_replay_errors is None
    assert old.gpu_util == 87.0
    mig = reader.sample(1)
    assert mig.gpu_util is None
    assert mig.power_w is None
    assert mig.mem_total_mb == 10 * 1024


def test_the_node_agent_reports_its_node() -> None:
    reader = NvmlReader(FakeNvml([H100, H100]))
    pool = Pool(name="h100", gpu_model="H100")
    source = NvmlSource(reader, "gpu-node-7", pool, TopologyLabels(rack="r1"), interval_s=5.0)
    (inv,) = source.inventory(1.0)
    assert inv.node.name == "gpu-node-7"
    assert [g.uuid for g in inv.node.gpus] == ["GPU-fake-0", "GPU-fake-1"]
    (batch,) = source.sample(2.0, {})
    assert batch.source == "nvml"
    assert len(batch.gpus) == 2
    assert batch.boot_id == read_boot_id() != "", "the node's boot, so health can tell a reboot (a reset) happened"


def test_the_boot_id_is_the_kernels(tmp_path: Path) -> None:
    path = tmp_path / "boot_id"
    path.write_text("6f1c5d2e-1b7a-4c1e-9d55-0e6b7e3f9a10\n")
    assert read_boot_id(str(path)) == "6f1c5d2e-1b7a-4c1e-9d55-0e6b7e3f9a10"
    assert read_boot_id(str(tmp_path / "absent")) == "", "not Linux: no evidence of reboots, not an error"


@pytest.mark.timeout(10)
async def test_xids_are_pushed_at_once() -> None:
    fake = FakeNvml([H100, H100])
    reader = NvmlReader(fake)
    seen: list[tuple[int, int, float]] = []
    watcher = XidWatcher(fake, reader.handles, lambda i, x: seen.append((i, x, time.monotonic())), wait_ms=50)
    assert watcher.start(asyncio.get_running_loop())
    sent = fake.inject_xid(1, 79)
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    watcher.stop()
    assert seen[0][:2] == (1, 79)
    assert seen[0][2] - sent < 0.5


def test_gpm_activity_is_read_between_two_snapshots_and_usage_is_the_busiest_unit() -> None:
    fake = FakeNvml([H100])
    reader = NvmlReader(fake)
    s = reader.sample(0)
    assert (s.sm_activity, s.tensor_activity, s.dram_activity) == (0.62, 0.355, 0.7125)
    assert s.usage == 71.25, "100 x max(SM, tensor, DRAM): this GPU is bound by memory bandwidth"
    reader.sample(0)
    reader.close()
    assert all(sample.freed for sample in fake.gpm_samples), "every GPM snapshot is freed"


@pytest.mark.parametrize(
    ("sm", "tensor", "dram", "expected"),
    [
        # seen on a real H200: two GPM snapshots taken moments apart give NaN for DRAM bandwidth
        (0.0, 0.0, float("nan"), (0.0, 0.0, None)),
        (float("inf"), 10.0, 5.0, (None, 0.1, 0.05)),
        (100.4, -0.2, 50.0, (1.0, 0.0, 0.5)),  # rounding past the ends is clamped
    ],
)
def test_gpm_figures_that_are_not_percentages_are_dropped_or_clamped(
    sm: float, tensor: float, dram: float, expected: tuple[float | None, ...]
) -> None:
    gpm = {
        pynvml.NVML_GPM_METRIC_SM_UTIL: sm,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: tensor,
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: dram,
    }
    s = NvmlReader(FakeNvml([H100 | {"gpm": gpm}])).sample(0)
    assert (s.sm_activity, s.tensor_activity, s.dram_activity) == expected
    assert s.usage is not None
    assert 0.0 <= s.usage <= 100.0, "usage is a percentage, never NaN"


def test_a_gpu_at_idle_power_has_zero_usage_whatever_its_counters_say() -> None:
    s = NvmlReader(FakeNvml([H100_IDLE])).sample(0)
    assert s.sm_activity == 0.62
    assert s.usage == 0.0


def test_gpus_without_gpm_have_no_activity_fields() -> None:
    s = NvmlReader(FakeNvml([V100_NO_REMAP_NO_NVLINK])).sample(0)
    assert (s.sm_activity, s.tensor_activity, s.dram_activity, s.usage) == (None, None, None, None)
    assert s.gpu_util == 87.0


def test_mig_instances_are_listed_as_their_own_devices_with_their_profile() -> None:
    reader = NvmlReader(FakeNvml([H100, H100_MIG]))
    devices = reader.devices()
    assert [(d.index, d.uuid, d.mig_profile, d.parent_uuid) for d in devices] == [
        (0, "GPU-fake-0", "", ""),
        (1, "MIG-fake-1-0", "3g.40gb", "GPU-fake-1"),
        (2, "MIG-fake-1-1", "1g.10gb", "GPU-fake-1"),
    ]
    assert devices[1].memory_mb == 40 * 1024
    big, small = reader.sample(1), reader.sample(2)
    assert big.sm_activity == 0.4, "GPM of the instance, sampled through its parent and GPU-instance id"
    assert big.usage == 40.0
    assert small.sm_activity is None, "an instance without GPM counters has none, its sibling's are not borrowed"
    assert big.ecc_sbe_volatile == 3, "health counters are the physical GPU's"
    assert big.power_w == 512.0


def test_an_xid_on_a_mig_gpu_concerns_the_instance_it_names_else_all_of_them() -> None:
    reader = NvmlReader(FakeNvml([H100, H100_MIG]))
    assert reader.xid_targets(1, 9) == [2]
    assert reader.xid_targets(1, None) == [1, 2]
    assert reader.xid_targets(0, None) == [0]


def test_processes_that_no_job_on_the_gpu_owns_are_counted() -> None:
    fake = FakeNvml([H100 | {"procs": [(100, 1024**3), (200, None)]}, H100 | {"procs": []}])
    owners = {(100, 0): "j-train"}
    source = NvmlSource(
        NvmlReader(fake), "n", Pool(name="p", gpu_model="H100"), TopologyLabels(), interval_s=1.0,
        owner=lambda pid, gpu: owners.get((pid, gpu), ""),
    )  # fmt: skip
    (batch,) = source.sample(1.0, {})
    first, second = batch.gpus
    assert first.processes is not None
    assert [(p.pid, p.job_id) for p in first.processes] == [(100, "j-train"), (200, "")]
    assert first.unallocated_processes == 1
    assert second.unallocated_processes == 0
    without_runner = NvmlSource(NvmlReader(fake), "n", Pool(name="p", gpu_model="H100"), TopologyLabels(), 1.0)
    assert without_runner.sample(1.0, {})[0].gpus[0].unallocated_processes is None, "unknown, not zero"


@pytest.mark.timeout(10)
async def test_an_xid_on_a_mig_instance_is_pushed_for_that_instance() -> None:
    fake = FakeNvml([H100, H100_MIG])
    assert await xids_seen(fake, 1, 48, gpu_instance=1) == [(1, 48)]


async def xids_seen(fake: FakeNvml, gpu: int, xid: int, gpu_instance: int = 0xFFFFFFFF) -> list[tuple[int, int]]:
    """Inject an XID on physical GPU `gpu` and return what a watcher over the reader's GPUs pushed for it."""
    reader = NvmlReader(fake)
    seen: list[tuple[int, int]] = []
    watcher = XidWatcher(fake, reader.physical, lambda i, x: seen.append((i, x)), wait_ms=50,
                         resolve=reader.xid_targets)  # fmt: skip
    assert watcher.start(asyncio.get_running_loop())
    fake.inject_xid(gpu, xid, gpu_instance=gpu_instance)
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    watcher.stop()
    return seen


def _real_pynvml_devices(n: int) -> tuple[list[Any], list[Any]]:
    """`n` device handles as libnvidia-ml gives them: pynvml ctypes pointers to opaque device structures."""
    opaque = [pynvml.struct_c_nvmlDevice_t() for _ in range(n)]
    handles = [ctypes.cast(ctypes.c_void_p(ctypes.addressof(o)), pynvml.c_nvmlDevice_t) for o in opaque]
    return opaque, handles


@pytest.mark.timeout(10)
async def test_an_xid_from_real_pynvml_is_filed_under_its_gpu() -> None:
    fake = FakeNvml([])
    opaque, handles = _real_pynvml_devices(8)
    seen: list[tuple[int, int]] = []
    watcher = XidWatcher(fake, handles, lambda i, x: seen.append((i, x)), wait_ms=50)
    assert watcher.start(asyncio.get_running_loop())
    event = pynvml.c_nvmlEventData_t()  # the event NVML fills: a new pointer to the same device, not our handle
    event.device = ctypes.cast(ctypes.c_void_p(ctypes.addressof(opaque[3])), pynvml.c_nvmlDevice_t)
    event.eventData, event.gpuInstanceId = 79, 0xFFFFFFFF
    assert event.device != handles[3], "ctypes pointers compare by identity, not by address"
    fake.events.put(event)
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    watcher.stop()
    assert seen == [(3, 79)]


def _node(fake: FakeNvml) -> NvmlSource:
    return NvmlSource(NvmlReader(fake), "n", Pool(name="p", gpu_model="H100"), TopologyLabels(), interval_s=1.0)


def test_a_gpu_lost_while_the_agent_runs_is_left_out_and_the_others_are_reported() -> None:
    fake = FakeNvml([H100 | {"procs": []} for _ in range(4)])
    source = _node(fake)
    fake.lose(2)
    with capture_logs() as logs:
        batches = [source.sample(float(t), {})[0] for t in range(3)]
    assert [[g.uuid for g in b.gpus] for b in batches] == [["GPU-fake-0", "GPU-fake-1", "GPU-fake-3"]] * 3
    assert len(source.inventory(3.0)[0].node.gpus) == 4, "fewer GPUs than the node has: health's gpu-count-drop"
    assert [(e["event"], e["gpu"]) for e in logs] == [("nvml.gpu_lost", 2)], "logged once, not every interval"
    fake.recover(2)
    assert len(source.sample(4.0, {})[0].gpus) == 4


@pytest.mark.parametrize("error", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN])
def test_a_gpu_lost_before_the_agent_starts_is_left_out_and_the_node_is_served(error: int) -> None:
    """It used to raise out of the reader's constructor: the agent died at every start, and with it the job
    runners of the node's healthy GPUs."""
    fake = FakeNvml([H100 | {"procs": []} for _ in range(4)])
    fake.fail(1, error)
    with capture_logs() as logs:
        source = _node(fake)
    (inv,) = source.inventory(0.0)
    assert [g.uuid for g in inv.node.gpus] == ["GPU-fake-0", "GPU-fake-2", "GPU-fake-3"]
    assert [g.index for g in inv.node.gpus] == [0, 2, 3], (
        "every other GPU keeps its index: the ledger's claims, the replicas' records and health's history are keyed "
        "by it (they named GPU 3 with index 2 when indices were positions among the readable GPUs)"
    )
    assert inv.node.unreadable_gpus == 1, "health counts it as missing (gpu-count-drop)"
    assert [(e["event"], e["device"]) for e in logs if e["log_level"] == "error"] == [("nvml.gpu_unreadable", 1)]
    (batch,) = source.sample(1.0, {})
    assert [g.uuid for g in batch.gpus] == ["GPU-fake-0", "GPU-fake-2", "GPU-fake-3"]
    assert [g.index for g in batch.gpus] == [0, 2, 3]
    assert [(e.gpu_index, e.uuid) for e in (source.xid_event(i, 79, 1.0) for i in (2, 3))] == [
        (2, "GPU-fake-2"), (3, "GPU-fake-3"),
    ], "an XID carries its own GPU's UUID"  # fmt: skip


@pytest.mark.timeout(10)
async def test_an_xid_after_an_unreadable_gpu_names_the_gpu_by_its_own_index() -> None:
    fake = FakeNvml([H100 | {"procs": []} for _ in range(3)])
    fake.fail(0, pynvml.NVML_ERROR_GPU_IS_LOST)  # not registered for events: the watcher still starts
    assert await xids_seen(fake, 2, 79) == [(2, 79)]


def test_an_unexpected_nvml_error_costs_one_gpu_its_sample_not_the_agent() -> None:
    fake = FakeNvml([H100 | {"procs": []}, H100_MIG])
    source = _node(fake)
    fake.fail(1, pynvml.NVML_ERROR_UNKNOWN)
    (batch,) = source.sample(1.0, {})
    assert [g.uuid for g in batch.gpus] == ["GPU-fake-0"], "both MIG instances of the failing GPU are left out"
    fake.recover(1)
    assert len(source.sample(2.0, {})[0].gpus) == 3


def test_a_transient_nvlink_failure_costs_one_sample_not_nvlink_monitoring() -> None:
    dev = H100 | {"procs": []}
    fake = FakeNvml([dev])
    reader = NvmlReader(fake)
    assert reader.sample(0).nvlink_replay_errors == 18
    state = fake.nvmlDeviceGetNvLinkState

    def resetting(h: Any, link: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    fake.nvmlDeviceGetNvLinkState = resetting  # type: ignore[method-assign]
    assert reader.sample(0).nvlink_replay_errors is None
    fake.nvmlDeviceGetNvLinkState = state  # type: ignore[method-assign]
    dev["nvlink_down"] = set(range(18))
    assert reader.sample(0).nvlink_replay_errors is None, "every link down: nothing to sum this time"
    dev["nvlink_down"] = {17}
    # A link that is down counts as last read (its counter only grows): the sum neither falls now nor jumps back
    # when the link returns (found by review: summed over the links up, a flapping link made false bursts).
    assert reader.sample(0).nvlink_replay_errors == 18
    assert reader.sample(0).nvlink_crc_errors == 36
    dev["nvlink_down"] = set()
    assert reader.sample(0).nvlink_replay_errors == 18


def test_a_gpu_without_nvlink_is_not_asked_again() -> None:
    fake = FakeNvml([V100_NO_REMAP_NO_NVLINK, H100 | {"nvlink": {k: {0: 1, 1: 0, 2: 2} for k in range(12)}}])
    reader = NvmlReader(fake)
    assert reader.sample(0).nvlink_replay_errors is None
    assert reader.sample(1).nvlink_replay_errors == 12, "links past the GPU's last are not NVLink failures"
    asked: list[int] = []
    state = fake.nvmlDeviceGetNvLinkState

    def counted(h: Any, link: int) -> int:
        asked.append(link)
        return state(h, link)

    fake.nvmlDeviceGetNvLinkState = counted  # type: ignore[method-assign]
    assert reader.sample(0).nvlink_replay_errors is None
    assert asked == []


async def test_a_gpu_that_refuses_xid_events_leaves_the_others_watched() -> None:
    """Found by review: the GPUs were registered in one try, so the first that refused (NOT_SUPPORTED, or lost
    after the reader started) turned XID events off for the whole node: an XID 79 on another GPU went unseen."""

    class Refusing(FakeNvml):
        def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: Any) -> None:
            if handle is self.handles[1]:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            super().nvmlDeviceRegisterEvents(handle, types, event_set)

    fake = Refusing([H100, H100, H100])
    reader = NvmlReader(fake)
    seen: list[tuple[int, int]] = []
    watcher = XidWatcher(fake, reader.physical, lambda i, x: seen.append((i, x)), wait_ms=50)
    assert watcher.start(asyncio.get_running_loop())
    try:
        fake.inject_xid(0, 79)
        for _ in range(50):
            if seen:
                break
            await asyncio.sleep(0.02)
        assert seen == [(0, 79)]
    finally:
        watcher.stop()


async def test_a_failing_event_wait_does_not_spin() -> None:
    """Found by review: a wait that fails at once (GPU_IS_LOST, a GPU fallen off the bus) was tried again at once:
    27,823 waits and as many warnings in half a second, a core pegged. It is logged once and waited out."""

    class Lost(FakeNvml):
        waits = 0

        def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
            Lost.waits += 1
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    fake = Lost([H100])
    reader = NvmlReader(fake)
    with capture_logs() as logs:
        watcher = XidWatcher(fake, reader.physical, lambda i, x: None, wait_ms=500)
        assert watcher.start(asyncio.get_running_loop())
        await asyncio.sleep(0.5)
        watcher.stop()
    assert Lost.waits <= 5
    assert sum(1 for entry in logs if entry["event"] == "nvml.xid_wait_failed") == 1


def test_a_gpu_that_cannot_tell_pending_retirement_keeps_its_retired_page_counts() -> None:
    """Found by review: the pending status shared its 'unsupported' key with the retired-page counts, so a device
    that answered NOT_SUPPORTED for it lost its counts from its second sample on."""

    class NoPending(FakeNvml):
        def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    reader = NvmlReader(NoPending([H100 | {"procs": [], "retired": {0: [1, 2], 1: [7]}}]))
    for _ in range(2):
        s = reader.sample(0)
        assert (s.retired_pages_dbe, s.retired_pages_sbe, s.retired_pages_pending) == (1, 2, None)

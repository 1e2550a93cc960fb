"""The node agent's NVML reading, against a fake at the pynvml boundary."""

import asyncio
import time

import pytest

from chamber.collector.nvml import NvmlReader, NvmlSource, XidWatcher
from chamber.common.contracts import Pool, TopologyLabels
from tests.support.fakenvml import H100, MIG_INSTANCE, V100_NO_REMAP_NO_NVLINK, FakeNvml


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

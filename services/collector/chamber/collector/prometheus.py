"""`/metrics` in dcgm-exporter's names and labels, so existing GPU dashboards work, plus Chamber's fleet gauges."""

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from chamber.collector.core.metrics import FleetMetrics
from chamber.common.codec import DecodeError, Decoder
from chamber.common.contracts import FleetSnapshot, GpuSample, NodeTelemetry, NodeTelemetryColumns, as_telemetry

MIB = 1.0

# (DCGM field, help, how to read it from a sample)
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
DCGM_FIELDS: list[tuple[str, str, Callable[[GpuSample], float | None]]] = [
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda s: s.gpu_util),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda s: s.mem_util),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda s: s.mem_used_mb),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        lambda s: None if s.mem_total_mb is None or s.mem_used_mb is None else s.mem_total_mb - s.mem_used_mb,
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda s: s.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda s: s.power_w),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", lambda s: s.power_limit_w),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Clock throttle reasons bitmask.", lambda s: s.clock_event_reasons),
    (XID_FIELD, "Value of the last XID error encountered.", lambda s: s.xids[-1] if s.xids else None),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Volatile double-bit ECC errors.", lambda s: s.ecc_dbe_volatile),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Volatile single-bit ECC errors.", lambda s: s.ecc_sbe_volatile),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Aggregate double-bit ECC errors.", lambda s: s.ecc_dbe_aggregate),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Aggregate single-bit ECC errors.", lambda s: s.ecc_sbe_aggregate),
    ("DCGM_FI_DEV_RETIRED_DBE", "Pages retired for double-bit errors.", lambda s: s.retired_pages_dbe),
    ("DCGM_FI_DEV_RETIRED_SBE", "Pages retired for single-bit errors.", lambda s: s.retired_pages_sbe),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Row remapping failed.", lambda s: _flag(s.remapped_rows_failure)),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "Row remapping pending.", lambda s: _flag(s.remapped_rows_pending)),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Rows remapped for uncorrectable errors.",
     lambda s: s.remapped_rows_uncorrectable),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVLink replay errors.", lambda s: s.nvlink_replay_errors),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "NVLink recovery errors.", lambda s: s.nvlink_recovery_errors),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVLink CRC flit errors.", lambda s: s.nvlink_crc_errors),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "PCIe replays.", lambda s: s.pcie_replay_count),
    ("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least one warp.", lambda s: s.sm_activity),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipe is active.", lambda s: s.tensor_activity),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the memory interface is active.", lambda s: s.dram_activity),
    ("chamber_gpu_usage", "100 x max(SM, tensor, DRAM activity); 0 under 10% of the power limit.", lambda s: s.usage),
    ("chamber_gpu_unallocated_processes", "Processes on the GPU that no job placed on it owns.",
     lambda s: s.unallocated_processes),
]  # fmt: skip

LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "namespace", "pod", "chamber_job"]
"""dcgm-exporter's labels (with `namespace` and `pod` from the kubelet's PodResources, as it sets them) and the
Chamber job whose pod holds the GPU; the last three are empty where the agent does not read PodResources."""

FLEET_GAUGES: list[tuple[str, str]] = [
    ("gpus_total", "GPUs in the inventory."),
    ("gpus_reporting", "GPUs whose last sample is younger than 3 telemetry intervals."),
    ("gpus_healthy", "GPUs reporting and schedulable."),
    ("gpus_allocated", "Healthy GPUs held by a job."),
    ("gpus_activity_unknown", "Healthy GPUs held by a job whose source tells no activity (never counted idle)."),
    ("utilization", "Mean activity over healthy GPUs whose activity is known (0-1)."),
    ("allocation_ratio", "Allocated over healthy GPUs (0-1)."),
    ("idle_ratio", "Unallocated plus allocated-but-idle over healthy GPUs (0-1)."),
    ("efficiency_score", "Useful GPU time over healthy GPU time, where activity is known (0-100)."),
    ("idle_cost_per_hour", "What idle healthy GPUs cost per hour."),
    ("spend_per_hour", "What allocated GPUs cost per hour."),
    ("queue_depth", "Jobs waiting."),
]


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


_batch = Decoder(NodeTelemetryColumns | NodeTelemetry)


class ChamberCollector(Collector):
    """Reads the aggregator's state at scrape time: each node's latest batch is decoded in full only here."""

    def __init__(
        self, metrics: FleetMetrics, models: Callable[[str, int], str], latest: Callable[[], FleetSnapshot | None]
    ):
        self.metrics = metrics
        self.models = models
        self.latest = latest

    def _batches(self) -> Iterator[NodeTelemetry]:
        """Each node's latest batch, of the nodes still reporting as of the latest fleet snapshot."""
        snap = self.latest()
        for kept in self.metrics.fresh_batches(snap.at if snap is not None else None):
            if isinstance(kept, NodeTelemetry):
                yield kept
            elif isinstance(kept, bytes):
                try:
                    batch = as_telemetry(_batch.decode(kept))
                except DecodeError:
                    continue
                if isinstance(batch, NodeTelemetry):
                    yield batch

    def collect(self) -> Iterator[GaugeMetricFamily]:
        samples = [(batch.node, s) for batch in self._batches() for s in batch.gpus]
        last_xid = self.metrics.last_xid
        for name, help_text, read in DCGM_FIELDS:
            family = GaugeMetricFamily(name, help_text, labels=LABELS)
            for node, s in samples:
                value = read(s)
                if value is None and name == XID_FIELD:
                    value = last_xid.get((node, s.index))  # (an NVML agent reports XIDs as events, not samples)
                if value is None:
                    continue
                namespace, _, pod = s.pod.partition("/")
                family.add_metric([str(s.index), s.uuid, f"nvidia{s.index}", self.models(node, s.index), node,
                                   namespace, pod, s.job_id], float(value))  # fmt: skip
            yield family
        disagree = "Disagreements between the kubelet's device assignments and the ledger on the node."
        mismatches = GaugeMetricFamily("chamber_gpu_assignment_mismatches", disagree, labels=["Hostname"])
        for batch in self._batches():
            if batch.source == "nvml":
                mismatches.add_metric([batch.node], float(len(batch.assignment_mismatches)))
        yield mismatches
        snap = self.latest()
        if snap is None:
            return
        for field, help_text in FLEET_GAUGES:
            yield GaugeMetricFamily(f"chamber_fleet_{field}", help_text, value=float(getattr(snap, field)))
        for labels_name, mapping, metric in (
            ("team", snap.queue_by_team, "chamber_queue_depth_by_team"),
            ("priority", snap.queue_by_priority, "chamber_queue_depth_by_priority"),
            ("pool", snap.spend_per_hour_by_pool, "chamber_spend_per_hour_by_pool"),
            ("pool", snap.idle_spend_per_hour_by_pool, "chamber_idle_spend_per_hour_by_pool"),
            ("cloud", snap.spend_per_hour_by_cloud, "chamber_spend_per_hour_by_cloud"),
            ("team", snap.allocated_idle_gpu_hours_by_team, "chamber_allocated_idle_gpu_hours_by_team"),
        ):
            family = GaugeMetricFamily(metric, metric.replace("_", " "), labels=[labels_name])
            for key, value in mapping.items():
                family.add_metric([key], float(value))
            yield family

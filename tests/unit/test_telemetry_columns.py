"""`NodeTelemetryColumns`, the wire form of a node's batch: it carries every `GpuSample` field, converts both
ways without loss, and an inconsistent one fails to decode (full and lean view alike) instead of reaching a
consumer."""

import typing

import msgspec
import pytest

from chamber.collector.loadgen import nvml_batch
from chamber.common.codec import DecodeError, Decoder, encode
from chamber.common.contracts import (
    GpuProcess,
    GpuSample,
    GpuXidEvent,
    NodeColumnsActivityView,
    NodeTelemetry,
    NodeTelemetryColumns,
    TelemetryActivityView,
    TelemetryWire,
    as_telemetry,
    from_columns,
    to_columns,
)

wire = Decoder(TelemetryWire)
lean = Decoder(TelemetryActivityView)


def test_every_sample_field_has_a_column_of_its_type() -> None:
    samples = typing.get_type_hints(GpuSample)
    columns = typing.get_type_hints(NodeTelemetryColumns)
    for name, type_ in samples.items():
        assert columns[name] == list[type_], name  # type: ignore[valid-type]


def test_every_batch_field_travels() -> None:
    batch = set(NodeTelemetry.__struct_fields__) - {"gpus"}
    assert batch <= set(NodeTelemetryColumns.__struct_fields__)


@pytest.mark.parametrize(
    "batch",
    [
        nvml_batch("node-000001", 1_700_000_000.25),
        NodeTelemetry(node="n", sampled_at=1.0, interval_s=5.0, gpus=[]),
        NodeTelemetry(node="n", sampled_at=1.0, interval_s=5.0, gpus=[GpuSample(index=3, uuid="GPU-3")], v=1),
        NodeTelemetry(
            node="n",
            sampled_at=2.0,
            interval_s=1.0,
            source="nvml",
            gpus=[
                GpuSample(index=0, uuid="a", xids=[79, 48], usage=12.5, retired_pages_pending=False, pod="ns/p"),
                GpuSample(index=7, uuid="b", processes=[GpuProcess(pid=1, job_id="j")], ecc_dbe_volatile=0, job_id="j"),
            ],
            assignment_mismatches=["GPU 7: the kubelet gave it to ns/p, the ledger to j"],
            boot_id="6f1c5d2e-1b7a-4c1e-9d55-0e6b7e3f9a10",
        ),
    ],
    ids=["nvml-h100", "no-gpus", "nothing-measured", "sparse-capabilities"],
)
def test_columns_round_trip(batch: NodeTelemetry) -> None:
    columns = to_columns(batch)
    assert from_columns(columns) == batch
    assert as_telemetry(wire.decode(encode(columns))) == batch


def test_a_field_no_gpu_has_stays_off_the_wire() -> None:
    columns = to_columns(NodeTelemetry(node="n", sampled_at=1.0, interval_s=1.0, gpus=[
        GpuSample(index=0, uuid="a", gpu_util=0.0), GpuSample(index=1, uuid="b", gpu_util=None),
    ]))  # fmt: skip
    assert columns.gpu_util == [0.0, None], "a zero is a reading, kept"
    assert (columns.usage, columns.xids, columns.processes) == ([], [], [])
    assert b'"usage":[]' in encode(columns)


def test_gpus_rebuilt_from_absent_columns_do_not_share_lists() -> None:
    gpus = [GpuSample(index=i, uuid=str(i)) for i in (0, 1)]
    batch = NodeTelemetry(node="n", sampled_at=1.0, interval_s=1.0, gpus=gpus)
    a, b = from_columns(to_columns(batch)).gpus
    assert a.xids == b.xids == []
    assert a.xids is not b.xids


def test_the_wire_form_is_much_smaller_than_rows() -> None:
    batch = nvml_batch("node-000001", 1_700_000_000.25)
    assert len(encode(to_columns(batch))) < len(encode(batch)) / 2.5


def test_rows_from_an_older_publisher_still_decode() -> None:
    batch = nvml_batch("node-000001", 1.0)
    assert as_telemetry(wire.decode(encode(batch))) == batch
    xid = GpuXidEvent(node="n", gpu_index=1, uuid="u", xid=79, observed_at=1.0)
    assert as_telemetry(wire.decode(encode(xid))) == xid


def test_the_lean_view_reads_the_activity_columns() -> None:
    batch = nvml_batch("node-000001", 5.0)
    view = lean.decode(encode(to_columns(batch)))
    assert isinstance(view, NodeColumnsActivityView)
    assert (view.node, view.sampled_at, view.interval_s) == (batch.node, 5.0, 1.0)
    assert view.index == [s.index for s in batch.gpus]
    assert view.gpu_util == [s.gpu_util for s in batch.gpus]
    assert view.power_w == [s.power_w for s in batch.gpus]
    assert (view.usage, view.sm_activity) == ([], []), "absent on every GPU"


def _doc(**change: object) -> bytes:
    doc = msgspec.to_builtins(to_columns(nvml_batch("node-000001", 5.0)))
    doc.update(change)
    return msgspec.json.encode(doc)


@pytest.mark.parametrize(
    "raw",
    [
        _doc(gpu_util=[1.0, 2.0]),
        _doc(uuid=["only-one"]),
        _doc(index=[0, 1]),
        _doc(power_w="many"),
        _doc(gpu_util=[None, "x", 1, 1, 1, 1, 1, 1]),
        _doc(sampled_at=None),
        b'{"kind":"NodeTelemetryColumns","node":"n"}',
        b'{"kind":"NodeTelemetryColumns","node":"n","sampled_at":1,"interval_s":1,"index":[0],"uuid":[]}',
    ],
    ids=["short-column", "short-uuids", "short-index", "not-a-list", "not-numbers", "no-time", "no-fields", "no-uuid"],
)
def test_inconsistent_columns_are_refused(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        wire.decode(raw)


@pytest.mark.parametrize(
    "raw",
    [
        _doc(gpu_util=[1.0, 2.0]),
        _doc(index=[0, 1]),
        _doc(index=[-1, 1, 2, 3, 4, 5, 6, 7]),
        _doc(index=[0, 1, 2, 3, 4, 5, 6, 10**9]),
        _doc(power_limit_w="x"),
    ],
    ids=["short-column", "short-index", "negative-index", "huge-index", "not-a-list"],
)
def test_the_lean_view_refuses_what_the_full_form_refuses_and_bad_indices(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        lean.decode(raw)

"""Every decoder a consumer uses either returns its contract or raises DecodeError, whatever the bytes.

A consumer dead-letters a message that raises DecodeError and goes on; any other exception would be a handler
failure, redelivered ten times and then lost, or a crashed watcher. So the claim is exact: the contract or
DecodeError, never anything else, for valid messages broken in one place, arbitrary JSON, and arbitrary bytes.
"""

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chamber.common.codec import DecodeError, Decoder
from chamber.common.contracts import (
    Decision,
    FaultInjection,
    FleetSnapshot,
    GpuHealthVerdict,
    HealthCommand,
    JobEvent,
    JobRecord,
    JobStateChanged,
    JobSubmitted,
    NodeInventory,
    NodeTelemetry,
    QuotaConfig,
    QuotaState,
    RollupPoint,
    TelemetryActivityView,
    TelemetryEvent,
    TelemetryWire,
    to_columns,
)
from tests.fuzz.strategies import broken, contract_documents, json_values, nested, to_json

CONSUMED: dict[str, Any] = {
    "JobEvent (scheduler)": JobEvent,
    "TelemetryEvent (health, collector)": TelemetryEvent,
    "HealthCommand (health)": HealthCommand,
    "GpuHealthVerdict (health, gateway)": GpuHealthVerdict,
    "JobStateChanged (process executor, timelines)": JobStateChanged,
    "Decision (audit, chaos checker)": Decision,
    "NodeInventory (every service)": NodeInventory,
    "QuotaState (scheduler, gateway)": QuotaState,
    "QuotaConfig (quota KV)": QuotaConfig,
    "JobRecord (jobs KV)": JobRecord,
    "FaultInjection (collector)": FaultInjection,
    "JobSubmitted (gateway)": JobSubmitted,
    "FleetSnapshot (gateway)": FleetSnapshot,
    "RollupPoint (gateway)": RollupPoint,
}
TYPES = pytest.mark.parametrize("type_", list(CONSUMED.values()), ids=list(CONSUMED))


def decodes_or_refuses(type_: Any, data: bytes) -> Any:
    """The decoded value (checked to be the contract) or None when refused with DecodeError."""
    refusal: str | None = None
    try:
        value = Decoder(type_).decode(data)
    except DecodeError as exc:
        refusal = str(exc)
    if refusal is not None:
        assert refusal, "a refusal says why"
        return None
    members = getattr(type_, "__args__", (type_,))
    assert isinstance(value, members)
    return value


@TYPES
@given(data=st.data())
def test_a_valid_message_decodes(type_: Any, data: st.DataObject) -> None:
    doc = data.draw(contract_documents(type_))
    assert decodes_or_refuses(type_, to_json(doc)) is not None, doc


@TYPES
@given(data=st.data())
def test_a_message_broken_in_one_place_decodes_or_is_refused(type_: Any, data: st.DataObject) -> None:
    decodes_or_refuses(type_, to_json(data.draw(broken(contract_documents(type_)))))


@TYPES
@given(doc=json_values)
def test_any_json_decodes_or_is_refused(type_: Any, doc: Any) -> None:
    decodes_or_refuses(type_, to_json(doc))


@TYPES
@given(data=st.data())
def test_any_bytes_are_refused_or_decode(type_: Any, data: st.DataObject) -> None:
    valid = to_json(data.draw(contract_documents(type_)))
    raw = data.draw(
        st.binary(max_size=200)
        | st.integers(0, len(valid)).map(lambda n: valid[:n])
        | st.tuples(st.integers(0, max(0, len(valid) - 1)), st.integers(0, 255)).map(
            lambda c: valid[: c[0]] + bytes([c[1]]) + valid[c[0] + 1 :]
        )
    )
    decodes_or_refuses(type_, raw)


@TYPES
@pytest.mark.parametrize("depth", [100, 1_000, 100_000])
def test_deep_nesting_decodes_or_is_refused(type_: Any, depth: int) -> None:
    """1,000 levels crash a recursive decoder written by hand; msgspec's must refuse (or skip an unknown field)."""
    decodes_or_refuses(type_, nested(b"1", depth))
    decodes_or_refuses(type_, b'{"kind":' * depth + b"1" + b"}" * depth)


COLUMNS = pytest.mark.parametrize(
    "type_", [TelemetryWire, TelemetryActivityView], ids=["TelemetryWire (health)", "TelemetryActivityView (collector)"]
)


def columns_documents() -> st.SearchStrategy[Any]:
    """Valid `NodeTelemetryColumns` documents: random valid batches in their wire form (random lists of the type
    alone would almost never have consistent lengths)."""
    full = Decoder(NodeTelemetry)
    return contract_documents(NodeTelemetry).map(lambda doc: msgspec.to_builtins(to_columns(full.decode(to_json(doc)))))


@given(data=st.data())
def test_a_valid_columns_message_decodes(data: st.DataObject) -> None:
    assert decodes_or_refuses(TelemetryWire, to_json(data.draw(columns_documents()))) is not None


@COLUMNS
@given(data=st.data())
def test_a_columns_message_broken_in_one_place_decodes_or_is_refused(type_: Any, data: st.DataObject) -> None:
    decodes_or_refuses(type_, to_json(data.draw(broken(columns_documents()))))


@COLUMNS
@given(data=st.data())
def test_columns_bytes_mangled_are_refused_or_decode(type_: Any, data: st.DataObject) -> None:
    valid = to_json(data.draw(columns_documents()))
    cut = data.draw(st.integers(0, len(valid)))
    decodes_or_refuses(type_, valid[:cut])
    decodes_or_refuses(type_, valid[:cut] + bytes([data.draw(st.integers(0, 255))]) + valid[cut + 1 :])

"""The API's shapes cannot drift from the contracts they carry: the submit body is a JobSpec, its priority enum is
the priority classes, the fault kinds are the simulated fleet's, and the gRPC messages have the views' fields."""

import typing

import msgspec
import pytest

from chamber.common.contracts import FaultInjection, JobSpec
from chamber.common.priorities import DEFAULT_CLASSES
from chamber.gateway.core.requests import FaultKind, Priority, SubmitJobRequest
from chamber.gateway.core.views import FleetView, JobView, NodeView
from chamber.gateway.rpc import chamber_pb2 as pb


def fields(struct: type[msgspec.Struct]) -> set[str]:
    return set(struct.__struct_fields__)


def proto_fields(message: typing.Any) -> set[str]:
    return set(message.DESCRIPTOR.fields_by_name)


def test_the_submit_body_is_a_job_spec() -> None:
    assert issubclass(SubmitJobRequest, JobSpec)
    assert fields(SubmitJobRequest) == fields(JobSpec)
    body = msgspec.convert({"name": "a", "team": "t", "gpus_per_replica": 2, "topology": {"level": "rack"}},
                           SubmitJobRequest)  # fmt: skip
    assert type(body.to_spec()) is JobSpec


def test_priorities_and_fault_kinds_are_the_contracts_own() -> None:
    assert list(typing.get_args(Priority)) == list(DEFAULT_CLASSES)
    injection = FaultInjection.__annotations__["fault"]
    assert set(typing.get_args(FaultKind)) == set(typing.get_args(injection))


def test_grpc_messages_carry_the_same_fields_as_the_http_views() -> None:
    assert proto_fields(pb.SubmitJobRequest) == fields(JobSpec) | {"idempotency_key"}
    assert proto_fields(pb.Job) == fields(JobView)
    assert proto_fields(pb.FleetSummary) == fields(FleetView)
    assert proto_fields(pb.Node) == fields(NodeView)


def test_a_request_fingerprint_ignores_the_order_of_mappings_only() -> None:
    """An idempotent retry whose `env` keys come in another order (a gRPC client's map fields may) is the same
    request; a different value is not. A spec whose keys came sorted keeps the fingerprint it had before."""
    import hashlib

    from chamber.gateway.jobs import request_fingerprint

    def spec(env: dict[str, str]) -> JobSpec:
        return JobSpec(name="a", team="t", gpus_per_replica=1, command=["/bin/true"], env=env)

    assert request_fingerprint(spec({"A": "1", "B": "2"})) == request_fingerprint(spec({"B": "2", "A": "1"}))
    assert request_fingerprint(spec({"A": "1", "B": "2"})) != request_fingerprint(spec({"A": "1", "B": "3"}))
    sorted_spec = spec({"A": "1", "B": "2"})
    every_field = msgspec.json.encode(msgspec.structs.asdict(sorted_spec))  # (a dict keeps the fields' order)
    assert request_fingerprint(sorted_spec) == hashlib.sha256(every_field).hexdigest()


def test_a_request_fingerprint_is_the_one_older_gateways_bound_keys_to() -> None:
    """Fingerprints computed before specs left their defaults out of their encoding (a key lasts a day, and a
    retry may reach a gateway of another version): the same spec must give the same fingerprint."""
    from chamber.common.contracts import Topology
    from chamber.gateway.jobs import request_fingerprint

    with_env = JobSpec(name="a", team="t", gpus_per_replica=1, command=["/bin/true"], env={"B": "2", "A": "1"})
    gang = JobSpec(name="train", team="ml", gpus_per_replica=8, replicas=2, duration_s=30.0,
                   topology=Topology(level="rack"))  # fmt: skip
    assert request_fingerprint(with_env) == "dca3f5d845f6a35bde15be2f95dc218d981bf74598d38ed1f478f81e2c9caf88"
    assert request_fingerprint(gang) == "1735ceb82b09c0b6486d21f130465afc453280b4463a6be125d55d43430c429d"


def test_a_job_spec_names_no_infinite_or_absurd_time() -> None:
    """msgspec takes infinity for a `ge=0` float and writes it as null, which no decoder reads back: every time in
    a spec is bounded (ten years), whichever door the job came in by."""
    for field in ("max_runtime_s", "min_runtime_s", "checkpoint_grace_s", "checkpoint_interval_s"):
        for value in (float("inf"), 1e300):
            with pytest.raises(msgspec.ValidationError, match=field):
                msgspec.convert({"name": "j", "team": "t", "gpus_per_replica": 1, field: value}, JobSpec)
        spec = msgspec.convert({"name": "j", "team": "t", "gpus_per_replica": 1, field: 86400.0}, JobSpec)
        assert msgspec.json.decode(msgspec.json.encode(spec), type=JobSpec) == spec

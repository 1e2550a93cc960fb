"""Contracts evolve without breaking old messages: a field added after version 1 must have a default.

schema_v1.json records every contract's fields at version 1 (name -> required). A field that is required now
must have been required then; a field that existed then must still exist. To add a contract or a field, add it
with a default and record it in the manifest (a new contract may start with required fields).
"""

import json
from pathlib import Path

import msgspec
import pytest

from chamber.common.codec import Decoder, encode
from chamber.common.contracts import SCHEMA_VERSION, Event, JobEvent, JobSpec, JobSubmitted
from tests.contracts.schema import contract_types, fields_of

MANIFEST = json.loads((Path(__file__).parent / "schema_v1.json").read_text())["contracts"]
TYPES = contract_types()


@pytest.mark.parametrize("name", sorted(TYPES))
def test_fields_added_later_have_defaults(name: str) -> None:
    assert name in MANIFEST, f"{name} is new: record it in tests/contracts/schema_v1.json"
    now = fields_of(TYPES[name])
    then = MANIFEST[name]
    removed = set(then) - set(now)
    assert not removed, f"{name} lost fields {removed}: old messages would not decode"
    newly_required = {f for f, required in now.items() if required and not then.get(f, False)}
    assert not newly_required, f"{name}: fields {newly_required} were added without a default"


def test_every_event_is_tagged_and_versioned() -> None:
    for name, cls in TYPES.items():
        if issubclass(cls, Event):
            info = msgspec.inspect.type_info(cls)
            assert isinstance(info, msgspec.inspect.StructType)
            assert info.tag_field == "kind"
            assert info.tag == name
            v = next(f for f in msgspec.structs.fields(cls) if f.name == "v")
            assert v.default == SCHEMA_VERSION


def test_an_old_message_without_later_fields_still_decodes() -> None:
    old = (
        b'{"kind":"JobSubmitted","v":1,"job_id":"j1","submitted_at":1.0,'
        b'"spec":{"name":"a","team":"t","gpus_per_replica":1}}'
    )
    event = Decoder(JobEvent).decode(old)
    assert isinstance(event, JobSubmitted)
    assert event.spec.replicas == 1


def test_a_newer_message_with_unknown_fields_still_decodes() -> None:
    newer = (
        b'{"kind":"JobSubmitted","v":2,"job_id":"j1","submitted_at":1.0,"future":true,'
        b'"spec":{"name":"a","team":"t","gpus_per_replica":1,"future_field":[1]}}'
    )
    assert isinstance(Decoder(JobEvent).decode(newer), JobSubmitted)


def test_round_trip() -> None:
    event = JobSubmitted(job_id="j1", spec=JobSpec(name="a", team="t", gpus_per_replica=2), submitted_at=3.0)
    assert Decoder(JobEvent).decode(encode(event)) == event

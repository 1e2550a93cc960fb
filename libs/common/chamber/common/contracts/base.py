"""Base classes for contracts: frozen, keyword-only, tolerant of unknown fields (forward compatible)."""

from typing import ClassVar

import msgspec

SCHEMA_VERSION = 1


class Contract(msgspec.Struct, frozen=True, kw_only=True):
    """A value carried inside events. Unknown fields are ignored so newer producers do not break older consumers."""


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag=True):
    """A top-level message on the bus. Subclasses get a `kind` tag equal to their class name."""

    v: int = SCHEMA_VERSION

    subject_key: ClassVar[str] = ""

"""Helpers to inspect the contracts: every Struct in chamber.common.contracts with its fields."""

import inspect

import msgspec

from chamber.common import contracts


def contract_types() -> dict[str, type[msgspec.Struct]]:
    found: dict[str, type[msgspec.Struct]] = {}
    for module in [contracts, *(m for _, m in inspect.getmembers(contracts, inspect.ismodule))]:
        for name, obj in inspect.getmembers(module, inspect.isclass):
            is_contract = issubclass(obj, msgspec.Struct) and obj.__module__.startswith("chamber.common.contracts")
            if is_contract and obj.__name__ not in ("Contract", "Event"):
                found[name] = obj  # type: ignore[assignment]  # narrowed by issubclass above
    return found


def fields_of(cls: type[msgspec.Struct]) -> dict[str, bool]:
    """field name -> required (no default)."""
    return {f.name: f.required for f in msgspec.structs.fields(cls)}

"""Every number a quota file may hold is one the stored configuration can hold: JSON has no inf or nan, so a
configuration holding one would be stored as null and never decode again (the quota service could not start and
the team and pool API would answer 503 for good). Such a file is refused, naming the field."""

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from chamber.common.codec import Decoder, encode
from chamber.common.contracts import QuotaConfig
from chamber.common.quota import ConfigError, validate
from chamber.common.quotastore import load_yaml

BASE: dict[str, Any] = {
    "pools": [{"name": "p", "gpu_model": "H100", "capacity": 8}],
    "orgs": [{"name": "o"}],
    "teams": [{"name": "t", "org": "o", "quotas": [{"pool": "p", "nominal": 4}],
               "budget": {"gpu_hours": 10.0, "money": 10.0}}],
}  # fmt: skip
"""A document with one of everything, so that every float field has a place to be set."""


def float_fields(info: msgspec.inspect.Type, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """The paths (into BASE) of every float field of the contract, found from its type: a float field added
    later is tested too."""
    if isinstance(info, msgspec.inspect.FloatType):
        yield path
    elif isinstance(info, msgspec.inspect.StructType):
        for f in info.fields:
            yield from float_fields(f.type, (*path, f.encode_name))
    elif isinstance(info, msgspec.inspect.ListType):
        yield from float_fields(info.item_type, (*path, 0))
    elif isinstance(info, msgspec.inspect.UnionType):
        for member in info.types:
            yield from float_fields(member, path)


FIELDS = sorted(set(float_fields(msgspec.inspect.type_info(QuotaConfig))), key=str)


def with_value(path: tuple[str | int, ...], value: float) -> dict[str, Any]:
    doc: Any = msgspec.json.decode(msgspec.json.encode(BASE))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return dict(doc)


def test_every_float_field_is_found() -> None:
    names = {".".join(str(k) for k in p) for p in FIELDS}
    assert {"usage_half_life_s", "pools.0.cost_per_gpu_hour", "teams.0.weight", "teams.0.budget.gpu_hours",
            "teams.0.budget.money"} <= names  # fmt: skip


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e308, 2.5])
@pytest.mark.parametrize("path", FIELDS, ids=[".".join(map(str, p)) for p in FIELDS])
def test_a_quota_file_is_refused_or_round_trips(tmp_path: Path, path: tuple[str | int, ...], value: float) -> None:
    file = tmp_path / "quota.yaml"
    file.write_text(yaml.safe_dump(with_value(path, value)))
    loaded: list[QuotaConfig] = []
    refusal = ""
    try:
        loaded.append(load_yaml(file))
    except ConfigError as exc:
        refusal = str(exc)
    if refusal:
        assert str(path[-1]) in refusal, "the refusal names the field"
        assert value != 2.5, "a plain number is accepted"
        return
    refusal = ""
    try:
        validate(loaded[0])
    except ConfigError as exc:  # finite, but too large to compute with (a price, a budget)
        refusal = str(exc)
    if refusal:
        assert str(path[-1]) in refusal, "the refusal names the field"
        assert value != 2.5, "a plain number is accepted"
    assert Decoder(QuotaConfig).decode(encode(loaded[0])) == loaded[0]


def test_validate_refuses_what_bypassed_the_loader() -> None:
    """A configuration built in code (or by a PATCH merge) is checked again before it is applied."""
    config = msgspec.structs.replace(QuotaConfig(), usage_half_life_s=math.inf)
    with pytest.raises(ConfigError, match=r"usage_half_life_s: inf is not a finite number"):
        validate(config)


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (("pools", 0, "cost_per_gpu_hour"), 1e308, "cost_per_gpu_hour 1e+308 is above 1e+06"),
        (("teams", 0, "budget", "gpu_hours"), 5e-324, "budget gpu_hours 4.94066e-324 is outside"),
        (("teams", 0, "budget", "money"), 1e300, "budget money 1e+300 is outside"),
        # Found by review: water-filling lost weights ~1e12 apart (a lighter team got more, the shares more than
        # the capacity); a half-life of 1e-310 s made the decay rate infinite.
        (("teams", 0, "weight"), 1e-15, "weight 1e-15 is below 0.001"),
        (("usage_half_life_s",), 1e-310, "usage_half_life_s 1e-310 is below 1 s"),
    ],
    ids=["price-overflowing", "budget-subnormal", "budget-huge", "weight-tiny", "half-life-tiny"],
)
def test_numbers_that_make_costs_or_budget_shares_infinite_are_refused_in_a_new_configuration(
    path: tuple[str | int, ...], value: float, words: str
) -> None:
    """Finite, but a cost (GPU-hours x price) or a budget share (spent / budget) computed from them is not, and a
    quota state holding inf no longer decodes anywhere. A new configuration with one is refused; one stored before
    this bound still decodes (the contract itself does not bound them, so an upgrade does not lose it)."""
    config = msgspec.convert(with_value(path, value), QuotaConfig)
    with pytest.raises(ConfigError, match=re.escape(words)):
        validate(config)
    assert Decoder(QuotaConfig).decode(encode(config)) == config

"""Settings from the environment: the scheduler's order policy and age limit reach its decision core, and a
mistyped value is refused at start-up with the variable named."""

import pytest

from chamber.common.settings import Settings, SettingsError


def test_the_scheduler_order_and_age_limit_come_from_the_environment() -> None:
    s = Settings.from_env({"CHAMBER_SCHEDULER_ORDER": "las", "CHAMBER_SCHEDULER_MAX_WAIT_S": "0"})
    assert (s.scheduler_order, s.scheduler_max_wait_s) == ("las", 0.0)
    assert Settings.from_env({}).scheduler_order == "spf"


@pytest.mark.parametrize(("value", "expected"), [("false", False), ("0", False), ("true", True)])
def test_consolidation_can_be_turned_off(value: str, expected: bool) -> None:
    assert Settings.from_env({"CHAMBER_SCHEDULER_CONSOLIDATE": value}).scheduler_consolidate is expected
    assert Settings.from_env({}).scheduler_consolidate is True
    settings = Settings.from_env({"CHAMBER_SCHEDULER_CONSOLIDATE": value})
    assert Settings.from_env(settings.to_env()).scheduler_consolidate is expected, "a child process gets it too"


@pytest.mark.parametrize(("value", "expected"), [("false", False), ("true", True)])
def test_reclaim_past_a_guarantee_can_be_turned_off(value: str, expected: bool) -> None:
    settings = Settings.from_env({"CHAMBER_SCHEDULER_RECLAIM_PAST_GUARANTEE": value})
    assert settings.scheduler_reclaim_past_guarantee is expected
    assert Settings.from_env({}).scheduler_reclaim_past_guarantee is True
    assert Settings.from_env(settings.to_env()).scheduler_reclaim_past_guarantee is expected


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CHAMBER_SCHEDULER_ORDER", "shortest"),
        ("CHAMBER_SCHEDULER_MAX_WAIT_S", "-1"),
        ("CHAMBER_SCHEDULER_CONSOLIDATE", "maybe"),
    ],
)
def test_a_bad_scheduler_setting_is_refused_naming_it(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})

"""`chamber up` runs jobs as processes on a machine whose NVML finds GPUs; elsewhere the simulated fleet stays."""

import pytest

from chamber.cli.gpus import local_defaults
from chamber.collector.nvml import count_gpus


@pytest.mark.parametrize(
    ("env", "gpus", "expected"),
    [
        ({}, 8, {"CHAMBER_COLLECTOR_ROLE": "local", "CHAMBER_EXECUTOR": "process"}),
        ({}, 0, {}),
        ({"CHAMBER_EXECUTOR": "process"}, 0, {}),
        ({"CHAMBER_EXECUTOR": "simulated"}, 8, {}),
        ({"CHAMBER_COLLECTOR_ROLE": "all"}, 8, {}),
        ({"CHAMBER_EXECUTOR": "kubernetes"}, 8, {"CHAMBER_COLLECTOR_ROLE": "local", "CHAMBER_EXECUTOR": "kubernetes"}),
    ],
    ids=["gpus-here", "no-gpus", "process-on-the-simulated-fleet", "simulation-asked", "role-chosen", "executor-kept"],
)
def test_defaults_for_this_machine(env: dict[str, str], gpus: int, expected: dict[str, str]) -> None:
    assert local_defaults(env, count=lambda module: gpus) == expected


def test_gpus_are_counted_through_the_configured_nvml() -> None:
    assert count_gpus("tests.support.fakenvml:TWO_H100") == 2
    assert count_gpus("no.such.module") == 0

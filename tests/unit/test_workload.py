"""What a job must say for the configured executor to run it (the gateway's 400s and the process executor's
refusals come from this one rule)."""

from typing import Any

import msgspec
import pytest

from chamber.common.contracts import JobSpec
from chamber.common.workload import workload_problem

BASE: dict[str, Any] = {"name": "j", "team": "t", "gpus_per_replica": 1}
RUN = {**BASE, "command": ["python", "train.py"]}
JOB_REF = {"api_version": "batch/v1", "kind": "Job", "namespace": "ml", "name": "train"}
"""The Kubernetes Job a job stands for (set by the intake, never by API clients)."""


@pytest.mark.parametrize(
    ("executor", "spec", "problem"),
    [
        ("process", RUN, None),
        ("process", {**RUN, "env": {"LR": "0.1"}, "working_dir": "/data/run"}, None),
        ("process", BASE | {"duration_s": 5}, "command: required"),
        ("process", {**RUN, "duration_s": 5}, "duration_s: only for simulated jobs"),
        ("process", {**RUN, "command": ["", "x"]}, "command: the program (command[0]) is empty"),
        ("process", {**RUN, "command": ["a\0b"]}, "NUL"),
        ("process", {**RUN, "env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env.CUDA_VISIBLE_DEVICES: set by Chamber"),
        ("process", {**RUN, "env": {"CHAMBER_JOB_ID": "x"}}, "env.CHAMBER_JOB_ID"),
        ("process", {**RUN, "env": {"MASTER_PORT": "1"}}, "env.MASTER_PORT"),
        ("process", {**RUN, "env": {"X": "a\0"}}, "env.X: the value contains a NUL"),
        ("process", {**RUN, "working_dir": "relative/dir"}, "working_dir: must be an absolute path"),
        ("process", {**RUN, "image": "pytorch:2"}, "image: the process executor"),
        ("process", BASE | {"env": {"A": "1"}}, "env and working_dir need a command"),
        ("simulated", BASE | {"duration_s": 5}, None),
        ("simulated", BASE, None),
        ("simulated", RUN, "CHAMBER_EXECUTOR=process"),
        ("simulated", BASE | {"env": {"A": "1"}}, "env and working_dir need a command"),
        ("kubernetes", BASE | {"workload": JOB_REF}, None),
        ("kubernetes", BASE, "create a batch/v1 Job"),  # an API submit: nothing in Kubernetes stands for it
    ],
    ids=lambda v: v.split(":")[0].replace(" ", "-") if isinstance(v, str) else "ok" if v is None else "",
)
def test_workload_rules(executor: str, spec: dict[str, Any], problem: str | None) -> None:
    found = workload_problem(msgspec.convert(spec, JobSpec), executor)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


@pytest.mark.parametrize(
    "spec",
    [{**RUN, "command": []}, {**RUN, "working_dir": ""}],
    ids=["empty-argv", "empty-working-dir"],
)
def test_malformed_workloads_do_not_decode(spec: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(spec, JobSpec)


@pytest.mark.parametrize("name", ["1BAD", "BAD-NAME", "A B", "É"])
def test_a_bad_variable_name_is_named(name: str) -> None:
    found = workload_problem(msgspec.convert({**RUN, "env": {name: "x"}}, JobSpec), "process")
    assert found is not None
    assert found.startswith(f"env.{name}: not a variable name")

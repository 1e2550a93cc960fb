"""The files people write (scenarios and traces, quota configurations, health rules) load or are refused with
the loader's own error, whose message names the file; never another exception, never a silently dropped key.

Inputs: contract-shaped documents broken in one place (dumped as YAML), arbitrary YAML documents, arbitrary
text and bytes, and `--set key=value` overrides for scenarios.
"""

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from chamber.common.contracts import GpuSample, NodeTelemetry, QuotaConfig
from chamber.common.quota import ConfigError, validate
from chamber.common.quotastore import load_yaml
from chamber.health.core.engine import HealthEngine
from chamber.health.core.rules import Rule, RuleError
from chamber.health.service import load_rules
from chamber.sim.scenario import Scenario, ScenarioError, TraceJob, load, read_trace
from tests.fuzz.strategies import broken, contract_documents, json_values

TEXT = st.text(max_size=300)
BYTES = st.binary(max_size=300)


def files(shaped: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """File contents: the shape as YAML, broken in one place, any YAML document, any text, any bytes."""
    as_yaml = st.one_of(shaped, broken(shaped), json_values).map(lambda d: yaml.safe_dump(d).encode())
    return st.one_of(as_yaml, as_yaml, TEXT.map(str.encode), BYTES)


def refusal(error: type[Exception], load: Callable[[], object]) -> str | None:
    """The message of the loader's own error, or None when it loaded; any other exception fails the test."""
    message: str | None = None
    try:
        load()
    except error as exc:
        message = str(exc)
    assert message is None or message, "a refusal says why"
    return message


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loaders")


def written(scratch: Path, content: bytes, name: str = "file.yaml") -> Path:
    path = scratch / name
    path.write_bytes(content)
    return path


QUOTA_FILES = files(contract_documents(QuotaConfig))


@given(content=QUOTA_FILES)
def test_a_quota_file_loads_and_validates_or_says_what_is_wrong(scratch: Path, content: bytes) -> None:
    path = written(scratch, content)
    message = refusal(ConfigError, lambda: validate(load_yaml(path)))
    if message is not None and "quota file" in message:
        assert str(path) in message


RULE_FILES = files(st.lists(contract_documents(Rule), max_size=3))
SAMPLE = NodeTelemetry(node="n1", sampled_at=10.0, interval_s=1.0, gpus=[GpuSample(index=0, uuid="u", xids=[79])])


@given(content=RULE_FILES)
def test_a_health_rules_file_loads_and_works_or_says_what_is_wrong(scratch: Path, content: bytes) -> None:
    path = written(scratch, content)
    rules: list[tuple[Rule, ...]] = []
    message = refusal(RuleError, lambda: rules.append(load_rules(str(path))))
    if message is not None:
        assert str(path) in message
        return
    engine = HealthEngine(rules[0])
    engine.set_inventory("n1", 2, 0.0)
    engine.observe(SAMPLE, 10.0)
    engine.tick(100.0)


TRACE_HEADER = "job_id,submit_time_s,duration_s,num_gpus,user_or_team,priority,preemptible\n"
CELL = st.one_of(
    st.integers(-5, 10**6).map(str), st.floats().map(str), st.sampled_from(["", "train", "true", "x", '"', "\0"]),
    st.text(max_size=6),
)  # fmt: skip
TRACES = st.one_of(
    st.lists(st.lists(CELL, min_size=5, max_size=8).map(",".join), max_size=5).map(
        lambda rows: (TRACE_HEADER + "\n".join(rows)).encode()
    ),
    TEXT.map(str.encode),
    BYTES,
)
OVERRIDES = st.lists(
    st.tuples(
        st.sampled_from(["name", "fleet.pools", "workload.trace", "faults.seed", "workload.defaults.priority", "x.y"]),
        st.one_of(st.text(max_size=10), json_values.map(lambda v: yaml.safe_dump(v).strip())),
        st.booleans(),
    ).map(lambda t: f"{t[0]}={t[1]}" if t[2] else t[0]),
    max_size=2,
)


@given(content=files(contract_documents(Scenario)), trace=TRACES, overrides=OVERRIDES)
def test_a_scenario_and_its_trace_load_or_say_what_is_wrong(
    scratch: Path, content: bytes, trace: bytes, overrides: list[str]
) -> None:
    path = written(scratch, content, "scenario.yaml")
    (path.parent / "trace.csv").write_bytes(trace)
    jobs: list[TraceJob] = []

    def load_all() -> None:
        scenario, base = load(path, overrides)
        jobs.extend(read_trace(_with_trace(scenario, "trace.csv"), base))

    if refusal(ScenarioError, load_all) is not None:
        return
    for job in jobs:
        assert job.gpus >= 1
        assert job.duration_s >= 0.0  # kept as given (sub-second too), never negative
        assert math.isfinite(job.duration_s)


def _with_trace(scenario: Scenario, trace: str) -> Scenario:
    return msgspec.structs.replace(scenario, workload=msgspec.structs.replace(scenario.workload, trace=trace))


QUOTA_OK = "pools: [{name: default, gpu_model: H100}]\norgs: [{name: acme}]\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"\x80", "cannot read quota file", id="not UTF-8"),
        pytest.param(b"pool: []", "unknown field $.pool", id="mistyped top-level key"),
        pytest.param(
            (QUOTA_OK + "teams: [{name: a, org: acme, quotas: [{pool: default, nomial: 8}]}]").encode(),
            "unknown field $.teams[0].quotas[0].nomial",
            id="mistyped nested key",
        ),
        pytest.param((QUOTA_OK + "teams: [{name: a, org: acme, weight: '2'}]").encode(), "Expected `float`", id="str"),
    ],
)
def test_quota_files_found_by_fuzzing(scratch: Path, content: bytes, expected: str) -> None:
    path = written(scratch, content)
    with pytest.raises(ConfigError, match="quota file") as caught:
        load_yaml(path)
    assert expected in str(caught.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"-", "expected a mapping of rule fields, got NoneType", id="empty list item"),
        pytest.param(b"- [xid]", "got list", id="a list, not a mapping"),
        pytest.param(b"- {name: t, signal: xid, severity: fatal, treshold: 5}", "unknown field $.treshold", id="typo"),
        pytest.param(b"- {name: t, signal: xid, severity: fatal, xids: 5}", "Expected `array`", id="xids not a list"),
        pytest.param(b"- {name: t, signal: xid, severity: fatal, count: 0}", "count must be at least 1", id="count"),
        pytest.param(b"\xff\xfe", "cannot read health rules", id="not UTF-8"),
    ],
)
def test_health_rule_files_found_by_fuzzing(scratch: Path, content: bytes, expected: str) -> None:
    path = written(scratch, content)
    with pytest.raises(RuleError) as caught:
        load_rules(str(path))
    assert str(path) in str(caught.value)
    assert expected in str(caught.value)


SCENARIO = b"name: s\nfleet: {pools: [{name: p, nodes: 1}]}\nworkload: {trace: trace.csv}\n"
HEADER = b"job_id,submit_time_s,duration_s,num_gpus,user_or_team,priority\n"


@pytest.mark.parametrize(
    ("content", "overrides", "trace", "expected"),
    [
        pytest.param(b"", ["name=x"], b"", "has no mapping at 'name'", id="--set on an empty file"),
        pytest.param(SCENARIO, ["name.first=x"], b"", "has no mapping at 'name.first'", id="--set through a str"),
        pytest.param(SCENARIO, ["name=[x"], b"", "the value is not YAML", id="--set value not YAML"),
        pytest.param(b"\x80", [], b"", "cannot read scenario", id="scenario not UTF-8"),
        pytest.param(SCENARIO, [], HEADER + b"1,0", "line 2", id="short row"),
        pytest.param(SCENARIO, [], HEADER + b"1,0,10,0,t,train", "num_gpus must be at least 1", id="0 GPUs"),
        pytest.param(SCENARIO, [], HEADER + b"1,0,10,1,t,urgent", "unknown priority 'urgent'", id="priority"),
        pytest.param(SCENARIO, [], HEADER + b"1,nan,10,1,t,", "must be finite", id="NaN submit time"),
        pytest.param(SCENARIO, [], HEADER + b'1,0,10,1,"' + b"t" * 200_000, "field larger", id="huge field"),
        pytest.param(SCENARIO, [], b"\xff" + HEADER, "cannot read trace", id="trace not UTF-8"),
    ],
)
def test_scenarios_and_traces_found_by_fuzzing(
    scratch: Path, content: bytes, overrides: list[str], trace: bytes, expected: str
) -> None:
    path = written(scratch, content, "scenario.yaml")
    (scratch / "trace.csv").write_bytes(trace)
    with pytest.raises(ScenarioError) as caught:
        read_trace(*load(path, overrides))
    assert expected in str(caught.value)

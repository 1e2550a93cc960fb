"""Schemathesis over `/openapi.json` against the real gateway process (with a simulated fleet and the scheduler):
every operation with schema-valid (positive) and schema-violating (negative) input, then stateful runs that follow
the OpenAPI links (submit a job, read it, its timeline, cancel it; a link is followed when the random submit was
accepted, which most random gang shapes are not on the test's 32-GPU fleet). Claims: no response is a 5xx; every
status is one the OpenAPI documents, with the documented content type and shape; every 4xx is a problem+json that says
what is wrong. `CHAMBER_FUZZ_EXAMPLES` raises the number of cases per operation and mode (default 6)."""

import collections
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from chamber.cli.infra import free_port
from chamber.common.settings import Settings
from tests.support.processes import ServiceProcesses

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

EXAMPLES = int(os.environ.get("CHAMBER_FUZZ_EXAMPLES", "6"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
SKIP = {"/v1/stream"}
"""An endless event stream: covered by its own test."""


def problem_explained(response: Any) -> str | None:
    """A 4xx must be problem+json with a title, its status and a non-empty detail."""
    if not 400 <= response.status_code < 500:
        return None
    content_type = response.headers.get("content-type") or ""
    if isinstance(content_type, list):  # schemathesis keeps every value of a header
        content_type = content_type[0]
    if not content_type.startswith("application/problem+json"):
        return f"{response.status_code} without problem+json"
    body = response.json()
    if body.get("status") != response.status_code or not body.get("title") or not body.get("detail"):
        return f"{response.status_code} not explained: {body}"
    return None


@pytest.fixture
def api(settings: Settings, cleanup: None, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    live = msgspec.structs.replace(settings, http_port=port)
    procs = ServiceProcesses(live, tmp_path)
    for name in ("collector", "scheduler", "gateway"):
        procs.start(name)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    auth = {"authorization": f"Bearer {settings.admin_token}"}
    while True:
        try:
            if httpx.get(f"{url}/v1/fleet", headers=auth, timeout=2).json().get("gpus_total"):
                break
        except (httpx.HTTPError, ValueError):
            pass
        assert time.monotonic() < deadline, procs.logs()
        time.sleep(0.1)
    try:
        yield url
    finally:
        procs.stop_all()
        logs = procs.logs()
        assert "http.unexpected" not in logs, logs


def test_no_input_makes_the_api_fail_or_stray_from_its_schema(api: str, settings: Settings) -> None:
    schema = schemathesis.openapi.from_url(f"{api}/openapi.json")
    headers = {"authorization": f"Bearer {settings.admin_token}"}
    statuses: collections.Counter[int] = collections.Counter()
    failures: dict[str, set[str]] = collections.defaultdict(set)
    operations = [r.ok() for r in schema.get_all_operations()]  # type: ignore[union-attr]  # Err raises here
    assert len(operations) >= 30

    def exercise(op: Any, mode: GenerationMode) -> None:
        where = f"{op.method.upper()} {op.path} ({mode.value})"

        @given(case=op.as_strategy(generation_mode=mode))
        @hsettings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            response = case.call(base_url=api, headers=headers, timeout=10)
            statuses[response.status_code] += 1
            try:
                case.validate_response(response, checks=CHECKS)
            except AssertionError as exc:
                failures[where].add(str(exc)[:500])
            why = problem_explained(response)
            if why:
                failures[where].add(why)

        run()

    for op in operations:
        if op.path not in SKIP:
            exercise(op, GenerationMode.POSITIVE)
            exercise(op, GenerationMode.NEGATIVE)
    cases = sum(statuses.values())
    print(f"fuzz: {cases} cases, statuses {sorted(statuses.items())}")
    assert not [s for s in statuses if s >= 500], statuses
    assert not failures, "\n".join(f"{k}: {sorted(v)[:2]}" for k, v in failures.items())
    assert cases >= len(operations) * EXAMPLES, "every operation was exercised"


def test_stateful_runs_follow_the_links_without_a_5xx(api: str, settings: Settings) -> None:
    schema = schemathesis.openapi.from_url(f"{api}/openapi.json")
    headers = {"authorization": f"Bearer {settings.admin_token}"}
    calls: collections.Counter[int] = collections.Counter()
    base = schema.as_state_machine()

    class Machine(base):  # type: ignore[misc, valid-type]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"base_url": api, "headers": headers, "timeout": 10}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            calls[response.status_code] += 1
            case.validate_response(response, checks=CHECKS)
            why = problem_explained(response)
            assert why is None, why

    Machine.run(settings=hsettings(max_examples=max(EXAMPLES, 5), stateful_step_count=6, deadline=None,
                                   database=None, suppress_health_check=list(HealthCheck)))  # fmt: skip
    print(f"stateful: {sum(calls.values())} calls, statuses {sorted(calls.items())}")
    assert sum(calls.values()) > 0
    assert not [s for s in calls if s >= 500], calls

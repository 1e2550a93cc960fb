"""Where `GET /v1/jobs/{id}/logs` says a job's output is when no node agent ran it (only the agents keep output)."""

import msgspec

from chamber.common.contracts import WorkloadRef
from chamber.gateway.logs_api import _elsewhere
from tests.support.builders import make_job


def test_a_job_run_in_kubernetes_is_pointed_at_its_pods_logs() -> None:
    record = make_job("train").build()
    ref = WorkloadRef(api_version="batch/v1", kind="Job", namespace="ml-team", name="train")
    record = msgspec.structs.replace(record, spec=msgspec.structs.replace(record.spec, workload=ref))
    where = _elsewhere("kubernetes", record)
    assert where is not None
    assert f"kubectl logs -n ml-team -l chamber.io/job-id={record.id} --prefix --tail=-1" in where


def test_a_simulated_job_has_none_and_an_agents_job_is_the_agents() -> None:
    record = make_job("sim").build()
    assert "runs no process" in (_elsewhere("simulated", record) or "")
    assert _elsewhere("process", record) is None

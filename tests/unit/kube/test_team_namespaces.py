"""A team's workloads come only from the namespaces its quota configuration lists (`TeamConfig.namespaces`).
Without the check, anyone allowed to create a Job in a namespace Chamber watches could label it with any team and
spend that team's quota (Kueue ties each namespace to its queues through LocalQueues for the same reason)."""

import base64
import json
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from chamber.common.contracts import QuotaConfig, TeamConfig
from chamber.gateway.kube_intake import Admission, Intake, TeamNamespaces
from tests.support.kube import gpu_job

CONFIG = QuotaConfig(teams=[
    TeamConfig(name="nlp", org="research", namespaces=["nlp", "nlp-dev"]),
    TeamConfig(name="vision", org="research"),
])  # fmt: skip


def review(job: dict[str, Any], namespace: str) -> dict[str, Any]:
    job["metadata"]["namespace"] = namespace
    return {"request": {"uid": "u1", "operation": "CREATE", "object": job}}


def teams(config: QuotaConfig = CONFIG) -> TeamNamespaces:
    known = TeamNamespaces()
    known.update(config)
    return known


@pytest.mark.parametrize(
    ("team", "namespace", "refused"),
    [
        ("nlp", "nlp", ""),
        ("nlp", "nlp-dev", ""),
        ("nlp", "default", "team nlp takes workloads only from namespaces nlp, nlp-dev, not default"),
        ("vision", "anywhere", ""),  # lists no namespaces: any
        ("unconfigured", "anywhere", ""),  # no configuration at all: any
    ],
)
async def test_the_validating_webhook_refuses_a_team_from_a_namespace_it_does_not_list(
    team: str, namespace: str, refused: str
) -> None:
    admission = Admission(teams=teams())
    response = (await admission.review(review(gpu_job("j", team=team), namespace), mutating=False))["response"]
    assert response["allowed"] is not bool(refused)
    if refused:
        assert response["status"] == {"code": 400, "reason": "BadRequest", "message": f"chamber: {refused}"}
    mutated = (await admission.review(review(gpu_job("j", team=team), namespace), mutating=True))["response"]
    assert json.loads(base64.b64decode(mutated["patch"])), "the mutating webhook suspends it either way"


@pytest.mark.parametrize(
    ("priority", "refused"),
    [
        ("research", ""),
        ("inference", "team 'interns' may not use priority 'inference'; its classes: research, best-effort"),
    ],
)
async def test_the_validating_webhook_and_the_watcher_refuse_a_priority_class_the_team_may_not_use(
    priority: str, refused: str
) -> None:
    """A team limited to some priority classes (`TeamConfig.priorities`) cannot be given another by labelling a Job,
    as it cannot through the API."""
    limited = QuotaConfig(teams=[TeamConfig(name="interns", org="r", priorities=["research", "best-effort"])])
    admission = Admission(teams=teams(limited))
    job = gpu_job("j", team="interns", priority=priority)
    response = (await admission.review(review(job, "default"), mutating=False))["response"]
    assert response["allowed"] is not bool(refused)
    if refused:
        assert response["status"]["message"] == f"chamber: {refused}"
    bus = SimpleNamespace(names=SimpleNamespace(job_submit=lambda job_id: f"submit.{job_id}"))
    ctx = SimpleNamespace(clock=SimpleNamespace(now=lambda: 100.0))
    intake = Intake(ctx, bus, client=None, store=None, teams=teams(limited))  # type: ignore[arg-type]
    job["metadata"] |= {"namespace": "default", "uid": "u1"}
    await intake.on_job("ADDED", job)
    assert list(intake.waiting) == ([] if refused else ["k8s-u1"])


async def test_the_list_follows_the_quota_configuration() -> None:
    known = teams()
    admission = Admission(teams=known)
    job = review(gpu_job("j", team="vision"), "default")
    assert (await admission.review(job, mutating=False))["response"]["allowed"] is True
    known.update(msgspec.structs.replace(CONFIG, teams=[TeamConfig(name="vision", org="r", namespaces=["cv"])]))
    assert (await admission.review(job, mutating=False))["response"]["allowed"] is False
    known.update(QuotaConfig())
    assert (await admission.review(job, mutating=False))["response"]["allowed"] is True


async def test_the_watcher_does_not_take_a_job_the_webhook_would_refuse() -> None:
    """A Job made while the webhooks were off (or before the list changed) is checked again when it is seen."""
    bus = SimpleNamespace(names=SimpleNamespace(job_submit=lambda job_id: f"submit.{job_id}"))
    ctx = SimpleNamespace(clock=SimpleNamespace(now=lambda: 100.0))
    intake = Intake(ctx, bus, client=None, store=None, teams=teams())  # type: ignore[arg-type]
    for uid, namespace in (("u-default", "default"), ("u-nlp", "nlp")):
        job = gpu_job("j", team="nlp")
        job["metadata"] |= {"namespace": namespace, "uid": uid, "labels": job["metadata"]["labels"]}
        await intake.on_job("ADDED", job)
    assert list(intake.waiting) == ["k8s-u-nlp"], "only the Job in its team's namespace is to be submitted"

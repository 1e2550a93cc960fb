"""A TrainJob's training runtime is read apart from the Kubernetes intake's watch: the read retries with sleeps
when the API errors, and a deleted Job's cancel must not wait behind it."""

import asyncio
from types import SimpleNamespace
from typing import Any
from unittest.mock import AsyncMock

from chamber.common.contracts import QuotaConfig, TeamConfig
from chamber.common.kube.errors import KubeUnavailable
from chamber.gateway.kube_intake import Intake, TeamNamespaces
from tests.support.kube import training_runtime, trainjob


def watcher_only() -> Intake:
    """An intake with only what its watch handler needs: team nlp's namespace is nlp."""
    teams = TeamNamespaces()
    teams.update(QuotaConfig(teams=[TeamConfig(name="nlp", org="research", namespaces=["nlp"])]))
    bus = SimpleNamespace(names=SimpleNamespace(job_submit=lambda job_id: f"submit.{job_id}"))
    ctx = SimpleNamespace(clock=SimpleNamespace(now=lambda: 100.0))
    return Intake(ctx, bus, client=None, store=None, teams=teams)  # type: ignore[arg-type]


async def test_a_trainjobs_runtime_is_read_apart_from_the_watch() -> None:
    """The events after a TrainJob are not held up by its runtime read, its submit queues once the runtime is
    read, and a TrainJob deleted meanwhile ends the read and never queues (its cancel goes out at once)."""
    intake = watcher_only()
    intake._cancel = AsyncMock()  # type: ignore[method-assign]
    release = asyncio.Event()
    reads: list[str] = []

    async def slow_runtime(tj: dict[str, Any]) -> dict[str, Any]:
        reads.append(tj["metadata"]["name"])
        await release.wait()
        return training_runtime()

    intake.runtimes = slow_runtime
    kept, deleted = trainjob("kept"), trainjob("deleted")
    for tj, uid in ((kept, "u-kept"), (deleted, "u-deleted")):
        tj["metadata"] |= {"namespace": "nlp", "uid": uid}
        await asyncio.wait_for(intake.on_job("ADDED", tj), 1.0)  # returns while the runtime is being read
    assert reads == ["kept", "deleted"]
    assert not intake.waiting
    await asyncio.wait_for(intake.on_job("DELETED", deleted), 1.0)
    intake._cancel.assert_awaited_once_with("k8s-u-deleted")
    release.set()
    for _ in range(100):
        if intake.waiting:
            break
        await asyncio.sleep(0.01)
    assert list(intake.waiting) == ["k8s-u-kept"], "the kept TrainJob queues; the deleted one never does"
    await asyncio.sleep(0.05)
    assert list(intake.waiting) == ["k8s-u-kept"]


class _FlakyRuntime:
    """A runtime read that fails its first three calls (the API unavailable: one whole read), then answers."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, tj: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= 3:
            raise KubeUnavailable("GET clustertrainingruntimes/torch-chamber: connection refused")
        return training_runtime()


def _nlp_trainjob() -> dict[str, Any]:
    tj = trainjob("t")
    tj["metadata"] |= {"namespace": "nlp", "uid": "u-t", "resourceVersion": "1"}
    return tj


async def test_a_trainjob_changed_during_a_failing_runtime_read_is_read_again() -> None:
    """The API errs for a whole read (its three tries); the TrainJob's status changed meanwhile (the trainer updates
    it right after creation). That event is not lost: the read is made again, and the submit queues (found by
    review: the event was dropped, and a suspended TrainJob may see no other for a long time)."""
    intake = watcher_only()
    runtime = intake.runtimes = _FlakyRuntime()
    tj = _nlp_trainjob()
    await intake.on_job("ADDED", tj)
    await asyncio.sleep(0.1)  # the first try failed; the read pauses before its second
    modified = dict(tj, metadata=dict(tj["metadata"], resourceVersion="2"), status={"conditions": []})
    await intake.on_job("MODIFIED", modified)
    for _ in range(300):
        if intake.waiting:
            break
        await asyncio.sleep(0.01)
    assert list(intake.waiting) == ["k8s-u-t"], f"runtime read {runtime.calls} times"


async def test_a_trainjob_whose_runtime_could_not_be_read_is_read_again() -> None:
    """Found by review: after its three tries failed (the API briefly unavailable), nothing read the runtime again,
    and a suspended TrainJob that changes no more was never taken. It is read again after a back-off, until it is
    taken (or its Job is gone)."""
    intake = watcher_only()
    runtime = intake.runtimes = _FlakyRuntime()
    await intake.on_job("ADDED", _nlp_trainjob())
    for _ in range(80):  # the three tries take 1.5 s, the first back-off 2 s
        if intake.waiting:
            break
        await asyncio.sleep(0.1)
    assert list(intake.waiting) == ["k8s-u-t"]
    assert runtime.calls == 4

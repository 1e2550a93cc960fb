"""Jobs through the API on a live simulated fleet: impossible jobs refused at submit, strict types, idempotent
submits, the timeline (including who preempted whom), the live stream, and input that used to crash the API."""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from litestar.testing import AsyncTestClient

from chamber.cli.infra import free_port
from chamber.collector import service as collector
from chamber.common.settings import Settings
from chamber.gateway import service as gateway_service
from chamber.quota import service as quota
from chamber.scheduler import service as scheduler
from tests.support.gateway import bearer, gateway_client
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration

JOB = {"name": "a", "team": "ml", "gpus_per_replica": 8, "replicas": 1, "priority": "train", "duration_s": 30}
QUOTA = """
pools: [{name: default, gpu_model: H100}, {name: spare, gpu_model: A100, capacity: 0}]
orgs: [{name: acme}]
teams:
  - {name: ml, org: acme, quotas: [{pool: default, nominal: 16}]}
  - {name: vision, org: acme, quotas: [{pool: default, nominal: 8}], priorities: [train, research, best-effort]}
"""


@pytest.fixture
async def client(settings: Settings, cleanup: None) -> AsyncIterator[AsyncTestClient[Any]]:
    async with gateway_client(settings) as c:
        yield c


async def _inventory(client: AsyncTestClient[Any]) -> None:
    async def ready() -> bool:
        return bool((await client.get("/v1/fleet")).json()["gpus_total"])

    await eventually(ready, what="inventory reaches the gateway")


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        ({"pool": "nowhere"}, "unknown-pool", "unknown pool 'nowhere'"),
        ({"pool": "spare"}, "empty-pool", "pool 'spare' has no GPUs"),
        ({"gpu_model": "B200"}, "unknown-gpu-model", "no node has GPU model 'B200'"),
        ({"replicas": 1024, "gpus_per_replica": 8}, "gang-too-large", "1024 replicas x 8 GPUs never fit"),
        ({"gpus_per_replica": 16}, "replica-too-large", "exceeds the largest node (8 GPUs)"),
        ({"replicas": 3, "topology": {"level": "node"}}, "topology-too-small", "never fit in one node"),
        ({"team": "robots"}, "unknown-team", "team 'robots' has no quota"),
        (
            {"team": "vision", "priority": "inference"},
            "priority-not-allowed",
            "team 'vision' may not use priority 'inference'; its classes: train, research, best-effort",
        ),
    ],
    ids=[
        "unknown-pool",
        "empty-pool",
        "unknown-gpu-model",
        "gang-1024x8",
        "replica-too-large",
        "topology",
        "unknown-team",
        "priority-not-allowed",
    ],
)
async def test_jobs_that_can_never_run_are_refused_at_submit(
    client: AsyncTestClient[Any], settings: Settings, tmp_path: Path, change: dict[str, Any], *, code: str, words: str
) -> None:
    (tmp_path / "quota.yaml").write_text(QUOTA)
    with_quota = msgspec.structs.replace(settings, quota_file=str(tmp_path / "quota.yaml"))
    async with running(with_quota, ("collector", collector.main), ("quota", quota.main)):
        await _inventory(client)

        async def quotas_known() -> bool:
            return len((await client.get("/v1/teams")).json()) == 2

        await eventually(quotas_known, what="quota configuration")
        await asyncio.sleep(0.2)  # the gateway follows the quota KV
        resp = await client.post("/v1/jobs", json={**JOB, **change})
        assert resp.status_code == 422, resp.text
        problem = resp.json()
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert problem["code"] == code
        assert words in problem["detail"]
        assert (await client.get("/v1/jobs")).json() == [], "nothing written"
        assert (await client.post("/v1/jobs", json=JOB)).status_code == 201, "a feasible job is accepted"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/jobs", {**JOB, "gpus_per_replica": "4"}),
        ("POST", "/v1/jobs", {**JOB, "duration_s": True}),
        ("PUT", "/v1/teams/ml", {"org": "acme", "quotas": [{"pool": "default", "nominal": "8"}]}),
        ("PUT", "/v1/teams/ml", {"org": "acme", "quotas": [{"pool": "default", "nominal": 8, "extra": 1}]}),
        ("PUT", "/v1/teams/BadName", {"org": "acme"}),
        ("PUT", "/v1/pools/Bad%20Pool", {"gpu_model": "H100"}),
        ("PATCH", "/v1/pools/default", {"capacity": "8"}),
        ("POST", "/v1/sim/faults", {"node": "node-0000", "fault": "gremlins"}),
        ("POST", "/v1/sim/faults", {"node": "node-0000", "fault": "dbe", "gpu": 8}),
        ("POST", "/v1/sim/faults", {"node": "node-0000", "fault": "dbe", "gpu": -1}),
        ("POST", "/v1/sim/faults", {"node": "node-0000", "fault": "dbe"}),
        ("POST", "/v1/sim/faults", {"node": "node-0000", "fault": "xid", "gpu": 1}),
        ("POST", "/v1/sim/faults", {"node": "node-0000", "fault": "dbe", "gpu": 1, "when": "now"}),
        ("POST", "/v1/nodes/node-0000/cordon", {"gpu": "1"}),
        ("POST", "/v1/tokens", {"name": "x", "role": "root"}),
        ("PUT", "/v1/teams/ml%0A", {"org": "acme"}),
        ("PUT", "/v1/pools/p9%0A", {"gpu_model": "H100"}),
        ("POST", "/v1/jobs", {**JOB, "team": "ml\n"}),
        ("PUT", "/v1/teams/ml", {"org": "acme", "quotas": [{"pool": "default", "nominal": 3_000_000_000}]}),
        ("PUT", "/v1/pools/p9", {"gpu_model": "H100", "cost_per_gpu_hour": float("inf")}),
        ("PUT", "/v1/pools/p9", {"gpu_model": "H100", "cost_per_gpu_hour": 1e308}),
        ("PATCH", "/v1/pools/default", {"cost_per_gpu_hour": 1e308}),
        ("PUT", "/v1/teams/ml", {"org": "acme", "budget": {"gpu_hours": 5e-324, "mode": "block-all"}}),
        ("PATCH", "/v1/teams/ml", {"budget": {"money": 1e300}}),
    ],
    ids=[
        "gpus-as-string",
        "duration-as-bool",
        "nominal-as-string",
        "quota-unknown-field",
        "team-bad-name",
        "pool-bad-name",
        "capacity-as-string",
        "unknown-fault",
        "gpu-out-of-range",
        "negative-gpu",
        "gpu-fault-without-gpu",
        "xid-without-number",
        "fault-unknown-field",
        "cordon-gpu-as-string",
        "unknown-role",
        "team-name-newline",
        "pool-name-newline",
        "job-team-newline",
        "nominal-beyond-int32",
        "cost-infinite",
        "cost-overflowing",
        "cost-overflowing-patch",
        "budget-subnormal",
        "budget-huge",
    ],
)
async def test_bad_input_is_a_clear_400_and_changes_nothing(
    client: AsyncTestClient[Any], settings: Settings, method: str, path: str, body: Any
) -> None:
    async with running(settings, ("collector", collector.main)):
        await _inventory(client)
        before = (await client.get("/v1/audit")).json()
        resp = await client.request(
            method, path, content=json.dumps(body), headers={"content-type": "application/json"}
        )
        assert resp.status_code == 400, resp.text
        problem = resp.json()
        assert problem["status"] == 400
        assert problem["detail"]
        assert (await client.get("/v1/jobs")).json() == []
        assert (await client.get("/v1/teams")).json() == []
        after = (await client.get("/v1/audit")).json()
        assert after[0]["outcome"] == "rejected"
        assert len(after) == len(before) + 1


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/jobs/%3E", 404),
        ("DELETE", "/v1/jobs/%3E", 404),
        ("GET", "/v1/jobs/%2A", 404),
        ("GET", "/v1/jobs/j%C3%A9t%C3%A9", 404),
        ("DELETE", "/v1/jobs/%E2%9C%93", 404),
        ("GET", "/v1/jobs/a.b", 404),
        ("GET", "/v1/jobs/%3E/events", 404),
        ("GET", "/v1/nodes/%3E", 404),
        ("GET", "/v1/teams/%3E", 404),
        ("DELETE", "/v1/teams/BadName", 400),
        ("GET", "/v1/jobs?limit=0", 400),
        ("GET", "/v1/jobs?state=sleeping", 400),
        ("GET", "/v1/fleet/history?window=99999999d", 400),
    ],
)
async def test_odd_paths_are_4xx_never_500(client: AsyncTestClient[Any], method: str, path: str, status: int) -> None:
    resp = await client.request(method, path)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")


async def test_a_refused_parameter_is_named_as_the_client_sent_it(client: AsyncTestClient[Any]) -> None:
    """Found by review: the problem named `ParamType.QUERY job_state` (the handler's argument) for `?state=`."""
    problem = (await client.get("/v1/jobs?state=sleeping&limit=0")).json()
    assert {e["field"] for e in problem["errors"]} == {"state", "limit"}, problem
    assert "query parameter state: " in problem["detail"]
    assert "ParamType" not in problem["detail"]


async def test_deep_or_huge_bodies_are_refused(client: AsyncTestClient[Any]) -> None:
    deep = b'{"name": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    for path in ("/v1/jobs", "/v1/sim/faults", "/v1/teams/ml", "/v1/tokens"):
        method = "PUT" if "teams" in path else "POST"
        resp = await client.request(method, path, content=deep, headers={"content-type": "application/json"})
        assert resp.status_code == 400, (path, resp.text)
    deeper = b"[" * 100_000 + b"]" * 100_000
    assert (await client.post("/v1/jobs", content=deeper)).status_code == 400
    huge = json.dumps({**JOB, "name": "x" * 2_000_000}).encode()
    resp = await client.post("/v1/jobs", content=huge, headers={"content-type": "application/json"})
    assert resp.status_code == 413, resp.text
    assert resp.json()["code"] == "body-too-large"
    # Under the body limit, but a spec this large would not fit the job's record (NATS carries 1 MiB at most):
    # refused at once, not acknowledged and then never run.
    wide = {**JOB, "duration_s": None, "command": ["/bin/true", *["x" * 60_000] * 5]}
    resp = await client.post("/v1/jobs", json=wide)
    assert resp.status_code == 413, resp.text
    assert resp.json()["code"] == "job-too-large"
    assert (await client.get("/v1/jobs")).json() == [], "nothing written"
    assert (await client.post("/v1/jobs", content=b"\xff\xfe")).status_code == 400
    assert (await client.post("/v1/jobs")).status_code == 400, "no body"


async def test_an_idempotency_key_makes_a_retry_return_the_same_job(client: AsyncTestClient[Any]) -> None:
    key = {"Idempotency-Key": "retry-me-1"}
    first = await client.post("/v1/jobs", json=JOB, headers=key)
    second = await client.post("/v1/jobs", json=JOB, headers=key)
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] == second.json()["id"]
    assert second.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    other = await client.post("/v1/jobs", json={**JOB, "gpus_per_replica": 4}, headers=key)
    assert other.status_code == 409
    assert other.json()["code"] == "idempotency-key-reused"
    viewer = (await client.post("/v1/tokens", json={"name": "v", "role": "member", "teams": ["ml"]})).json()
    theirs = await client.post("/v1/jobs", json=JOB, headers={**key, **bearer(viewer["token"])})
    assert theirs.json()["id"] != first.json()["id"], "keys are per token"
    assert (await client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "has space"})).status_code == 400
    jobs = await client.get("/v1/jobs")
    assert jobs.status_code == 200


async def test_a_retry_gets_its_job_even_if_it_could_no_longer_be_accepted(
    client: AsyncTestClient[Any], settings: Settings
) -> None:
    """Accepted while the fleet was unknown, the same request with the same key gets the same job after the fleet
    says it can never run: a client that retries a submit whose answer it lost must not be told it failed (it
    would submit again under a new key), while a new request is refused."""
    gang = {**JOB, "replicas": 1024}
    key = {"Idempotency-Key": "before-the-fleet-was-known"}
    first = await client.post("/v1/jobs", json=gang, headers=key)
    assert first.status_code == 201, first.text
    async with running(settings, ("collector", collector.main)):
        await _inventory(client)
        assert (await client.post("/v1/jobs", json=gang)).status_code == 422, "a new request is refused"
        retry = await client.post("/v1/jobs", json=gang, headers=key)
        assert retry.status_code == 201, retry.text
        assert retry.json()["id"] == first.json()["id"]
        assert retry.headers["idempotent-replayed"] == "true"
        fresh = await client.post("/v1/jobs", json=gang, headers={"Idempotency-Key": "after"})
        assert fresh.status_code == 422, "a new key is a new request"


async def test_a_retry_gets_its_job_even_after_the_executor_changed(client: AsyncTestClient[Any]) -> None:
    """The same for the executor's rules: a job accepted by a simulated Chamber is its retry's answer after the
    Chamber moved to Kubernetes (which takes no API submits), while a new request is refused."""
    key = {"Idempotency-Key": "before-the-move-to-kubernetes"}
    first = await client.post("/v1/jobs", json=JOB, headers=key)
    assert first.status_code == 201, first.text
    ctx = client.app.state.gateway.ctx
    ctx.settings = msgspec.structs.replace(ctx.settings, executor="kubernetes")
    retry = await client.post("/v1/jobs", json=JOB, headers=key)
    assert retry.status_code == 201, retry.text
    assert retry.json()["id"] == first.json()["id"]
    fresh = await client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": "after-the-move"})
    assert fresh.status_code == 400, fresh.text
    assert fresh.json()["code"] == "bad-workload"


async def test_the_timeline_tells_who_preempted_whom(client: AsyncTestClient[Any], settings: Settings) -> None:
    async with running(settings, ("collector", collector.main), ("scheduler", scheduler.main)):
        await _inventory(client)
        low = (await client.post("/v1/jobs", json={**JOB, "name": "low", "priority": "best-effort", "replicas": 4,
                                                     "duration_s": 3, "team": "vision"})).json()  # fmt: skip

        async def state(job_id: str) -> str:
            return str((await client.get(f"/v1/jobs/{job_id}")).json()["state"])

        async def is_(job_id: str, want: str) -> bool:
            return await state(job_id) == want

        await eventually(lambda: is_(low["id"], "running"), what="the low-priority gang runs")
        high = (await client.post("/v1/jobs", json={**JOB, "name": "high", "duration_s": 0.5})).json()
        await eventually(lambda: is_(high["id"], "succeeded"), within=15, what="the urgent job ran")
        await eventually(lambda: is_(low["id"], "succeeded"), within=20, what="the preempted gang resumed, finished")
        timeline = (await client.get(f"/v1/jobs/{low['id']}/events")).json()
        kinds = [e["kind"] for e in timeline["events"]]
        assert kinds[:3] == ["submitted", "placed", "started"], kinds
        assert {"preempting", "preempted", "resumed"} <= set(kinds), kinds
        assert kinds[-1] == "succeeded"
        preempting = next(e for e in timeline["events"] if e["kind"] == "preempting")
        assert preempting["by"] == high["id"]
        placed = next(e for e in timeline["events"] if e["kind"] == "placed")
        assert len(placed["gpus"]) == 32
        assert placed["detail"]
        assert [e["at"] for e in timeline["events"]] == sorted(e["at"] for e in timeline["events"])
        mine = (await client.get(f"/v1/jobs/{high['id']}/events")).json()["events"]
        assert next(e["kind"] for e in mine) == "submitted"
        assert mine[-1]["kind"] == "succeeded"


async def test_the_live_stream_sends_job_changes_to_those_who_may_see_them(
    client: AsyncTestClient[Any], settings: Settings
) -> None:
    """Over a real server (the test client buffers whole responses, so it cannot show a stream)."""
    port = free_port()
    live = msgspec.structs.replace(settings, http_port=port)
    vision = (await client.post("/v1/tokens", json={"name": "v", "role": "member", "teams": ["vision"]})).json()
    received: dict[str, list[tuple[str, Any]]] = {"admin": [], "vision": []}

    async def listen(http: httpx.AsyncClient, who: str, token: str) -> None:
        async with http.stream("GET", "/v1/stream?topics=job,fleet", headers=bearer(token)) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            event = ""
            async for line in resp.aiter_lines():
                if line.startswith("event:"):
                    event = line.split(":", 1)[1].strip()
                elif line.startswith("data:"):
                    received[who].append((event, json.loads(line.split(":", 1)[1])))

    services = (("collector", collector.main), ("scheduler", scheduler.main), ("gateway", gateway_service.main))
    async with running(live, *services), httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        await _inventory(client)

        async def serving() -> bool:
            try:
                return (await http.get("/healthz")).status_code == 200
            except httpx.HTTPError:
                return False

        await eventually(serving, what="the gateway serves")
        tasks = [asyncio.create_task(listen(http, "admin", settings.admin_token)),
                 asyncio.create_task(listen(http, "vision", vision["token"]))]  # fmt: skip
        await eventually(lambda: len(received["admin"]) and len(received["vision"]), what="both subscribed")
        job = (await client.post("/v1/jobs", json={**JOB, "duration_s": 0.3})).json()

        def saw(who: str, state: str) -> bool:
            return any(e == "job" and d["id"] == job["id"] and d["state"] == state for e, d in received[who])

        await eventually(lambda: saw("admin", "succeeded"), within=10, what="the job's changes streamed")
        await eventually(lambda: any(e == "fleet" for e, _ in received["admin"]), what="fleet totals streamed")
        assert received["vision"][0][0] == "hello"
        assert not any(e == "job" for e, _ in received["vision"]), "another team's job is not streamed to a member"
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_put_replaces_patch_changes_delete_removes(client: AsyncTestClient[Any], settings: Settings) -> None:
    async with running(settings, ("quota", quota.main)):
        assert (await client.put("/v1/pools/gpus", json={"gpu_model": "H100", "capacity": 64})).status_code == 200
        await _org(settings)
        body = {"org": "acme", "weight": 3, "quotas": [{"pool": "gpus", "nominal": 8}]}
        assert (await client.put("/v1/teams/ml", json=body)).status_code == 200
        patched = await client.patch("/v1/teams/ml", json={"weight": 2})
        assert patched.status_code == 200, patched.text
        config = patched.json()["config"]
        assert (config["weight"], config["quotas"][0]["nominal"]) == (2, 8), "PATCH keeps what it does not name"
        fenced = await client.patch("/v1/teams/ml", json={"namespaces": ["ml", "ml-dev"]})
        assert fenced.json()["config"]["namespaces"] == ["ml", "ml-dev"], "namespaces are set through the API"
        assert (await client.patch("/v1/teams/ml", json={"weight": 3})).json()["config"]["namespaces"] == [
            "ml", "ml-dev"
        ], "and a PATCH that does not name them keeps them"  # fmt: skip
        kept = await client.put("/v1/teams/ml", json={**body, "namespaces": ["ml"]})
        assert kept.json()["config"]["namespaces"] == ["ml"]
        assert (await client.patch("/v1/teams/ml", json={"namespaces": ["ML"]})).status_code == 400
        replaced = (await client.put("/v1/teams/ml", json={"org": "acme"})).json()["config"]
        assert (replaced["weight"], replaced["quotas"]) == (1, []), "PUT replaces the whole team"
        assert replaced["namespaces"] == [], "its namespaces too"
        assert (await client.patch("/v1/teams/nobody", json={"weight": 2})).status_code == 404
        assert (await client.patch("/v1/pools/gpus", json={"cost_per_gpu_hour": 3.5})).json()["config"][
            "cost_per_gpu_hour"
        ] == 3.5
        await client.patch("/v1/teams/ml", json={"quotas": [{"pool": "gpus", "nominal": 8}]})
        in_use = await client.delete("/v1/pools/gpus")
        assert in_use.status_code == 409
        assert "ml" in in_use.json()["detail"]
        assert (await client.delete("/v1/teams/ml")).status_code == 204
        assert (await client.get("/v1/teams/ml")).status_code == 404
        assert (await client.delete("/v1/pools/gpus")).status_code == 204
        assert (await client.delete("/v1/pools/gpus")).status_code == 404


async def _org(settings: Settings) -> None:
    from chamber.common.bus import Bus
    from chamber.common.contracts import OrgConfig
    from chamber.common.quotastore import QuotaStore
    from chamber.common.subjects import Names

    bus = await Bus.connect(settings.nats_url, Names(settings.namespace), "test")
    store = await QuotaStore.open(bus)
    config, revision = await store.get()
    await store.put(msgspec.structs.replace(config, orgs=[OrgConfig(name="acme")]), revision)
    await bus.close()

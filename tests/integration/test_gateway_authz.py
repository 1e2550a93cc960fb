"""The authorization matrix: every /v1 endpoint called by every kind of caller (no token, viewer, member of the
job's team, member of another team, operator, admin), checked against the role grants in
chamber.gateway.core.authz. A denied call gets 401 (no token) or 403 before anything is read or written; an
allowed one never does. The table must name every /v1 route the app serves, so a new route cannot skip it."""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from chamber.common.settings import Settings
from chamber.gateway.core.authz import GRANTS, Permission, Role
from tests.support.gateway import bearer, gateway_client

pytestmark = pytest.mark.integration

JOB = {"name": "m", "team": "ml", "gpus_per_replica": 1, "duration_s": 60}


@dataclass(frozen=True)
class Endpoint:
    method: str
    template: str
    permission: Permission
    path: str
    body: Any = None
    team_scoped: bool = False
    """Acts on team `ml`'s job: members of other teams are refused too."""


def endpoints(job_id: str) -> list[Endpoint]:
    p = Permission
    return [
        Endpoint("GET", "/v1/jobs", p.JOBS_READ, "/v1/jobs?team=ml", team_scoped=True),
        Endpoint("POST", "/v1/jobs", p.JOBS_WRITE, "/v1/jobs", JOB, team_scoped=True),
        Endpoint("GET", "/v1/jobs/{job_id}", p.JOBS_READ, f"/v1/jobs/{job_id}", team_scoped=True),
        Endpoint("GET", "/v1/jobs/{job_id}/events", p.JOBS_READ, f"/v1/jobs/{job_id}/events", team_scoped=True),
        Endpoint("GET", "/v1/jobs/{job_id}/logs", p.JOBS_READ, f"/v1/jobs/{job_id}/logs", team_scoped=True),
        Endpoint("DELETE", "/v1/jobs/{job_id}", p.JOBS_WRITE, f"/v1/jobs/{job_id}", team_scoped=True),
        Endpoint("GET", "/v1/nodes", p.READ, "/v1/nodes"),
        Endpoint("GET", "/v1/nodes/{name}", p.READ, "/v1/nodes/node-0000"),
        Endpoint("GET", "/v1/gpus/{uuid}", p.READ, "/v1/gpus/GPU-x"),
        Endpoint("POST", "/v1/nodes/{name}/cordon", p.NODES_OPERATE, "/v1/nodes/node-0000/cordon", {}),
        Endpoint("POST", "/v1/nodes/{name}/release", p.NODES_OPERATE, "/v1/nodes/node-0000/release", {}),
        Endpoint("POST", "/v1/sim/faults", p.NODES_OPERATE, "/v1/sim/faults", {"node": "node-0000", "fault": "clear"}),
        Endpoint("GET", "/v1/fleet", p.READ, "/v1/fleet"),
        Endpoint("GET", "/v1/fleet/gpus", p.READ, "/v1/fleet/gpus"),
        Endpoint("GET", "/v1/fleet/history", p.READ, "/v1/fleet/history"),
        Endpoint("GET", "/v1/teams", p.READ, "/v1/teams"),
        Endpoint("GET", "/v1/teams/{name}", p.READ, "/v1/teams/ml"),
        Endpoint("PUT", "/v1/teams/{name}", p.QUOTA_WRITE, "/v1/teams/ml", {"org": "nowhere"}),
        Endpoint("PATCH", "/v1/teams/{name}", p.QUOTA_WRITE, "/v1/teams/ml", {"weight": 2}),
        Endpoint("DELETE", "/v1/teams/{name}", p.QUOTA_WRITE, "/v1/teams/nobody"),
        Endpoint("GET", "/v1/pools", p.READ, "/v1/pools"),
        Endpoint("GET", "/v1/pools/{name}", p.READ, "/v1/pools/gpus"),
        Endpoint("PUT", "/v1/pools/{name}", p.QUOTA_WRITE, "/v1/pools/gpus", {"gpu_model": "H100", "capacity": 8}),
        Endpoint("PATCH", "/v1/pools/{name}", p.QUOTA_WRITE, "/v1/pools/gpus", {"cost_per_gpu_hour": 3.0}),
        Endpoint("DELETE", "/v1/pools/{name}", p.QUOTA_WRITE, "/v1/pools/nothing"),
        Endpoint("GET", "/v1/orgs", p.READ, "/v1/orgs"),
        Endpoint("GET", "/v1/me", p.READ, "/v1/me"),
        Endpoint("GET", "/v1/tokens", p.TOKENS_MANAGE, "/v1/tokens"),
        Endpoint("POST", "/v1/tokens", p.TOKENS_MANAGE, "/v1/tokens", {"name": "x", "role": "viewer"}),
        Endpoint("DELETE", "/v1/tokens/{token_id}", p.TOKENS_MANAGE, "/v1/tokens/nope"),
        Endpoint("GET", "/v1/audit", p.AUDIT_READ, "/v1/audit?limit=5"),
        # topics=bogus: an allowed caller gets 400 at once instead of an endless stream
        Endpoint("GET", "/v1/stream", p.READ, "/v1/stream?topics=bogus"),
    ]


@dataclass(frozen=True)
class Caller:
    label: str
    role: Role | None
    teams: tuple[str, ...] = ()


CALLERS = [
    Caller("anonymous", None),
    Caller("viewer", Role.VIEWER),
    Caller("member-ml", Role.MEMBER, ("ml",)),
    Caller("member-other", Role.MEMBER, ("vision",)),
    Caller("operator", Role.OPERATOR),
    Caller("admin", Role.ADMIN),
]


@pytest.fixture
async def admin(settings: Settings, cleanup: None) -> AsyncIterator[AsyncTestClient[Any]]:
    async with gateway_client(settings) as c:
        yield c


def expected(caller: Caller, ep: Endpoint) -> str:
    if caller.role is None:
        return "401"
    if ep.permission not in GRANTS[caller.role]:
        return "403"
    if ep.team_scoped and caller.role == Role.MEMBER and "ml" not in caller.teams:
        return "403"
    return "allowed"


async def test_every_endpoint_with_every_role(admin: AsyncTestClient[Any]) -> None:
    tokens: dict[str, str | None] = {"anonymous": None}
    for caller in CALLERS[1:]:
        assert caller.role is not None
        made = await admin.post("/v1/tokens", json={"name": caller.label, "role": caller.role.value,
                                                     "teams": list(caller.teams)})  # fmt: skip
        assert made.status_code == 201, made.text
        tokens[caller.label] = made.json()["token"]
    job = await admin.post("/v1/jobs", json=JOB)
    assert job.status_code == 201, job.text
    table = endpoints(job.json()["id"])

    paths = admin.app.openapi_schema.paths or {}
    methods = ("GET", "POST", "PUT", "PATCH", "DELETE")
    served = {(m, p) for p, item in paths.items() if p.startswith("/v1") for m in methods if getattr(item, m.lower())}
    assert {(e.method, e.template) for e in table} == served, "the matrix must cover exactly the routes served"

    wrong = []
    for ep in table:
        for caller in CALLERS:
            token = tokens[caller.label]
            headers = bearer(token) if token else {"authorization": ""}
            resp = await admin.request(ep.method, ep.path, json=ep.body, headers=headers)
            want = expected(caller, ep)
            got = resp.status_code
            ok = got in (401, 403) and str(got) == want if want != "allowed" else got not in (401, 403, 500)
            if not ok:
                wrong.append(f"{ep.method} {ep.path} as {caller.label}: got {got}, want {want}: {resp.text[:200]}")
            if got in (401, 403):
                assert resp.headers["content-type"].startswith("application/problem+json")
    assert len(table) * len(CALLERS) == 32 * 6
    assert not wrong, "\n".join(wrong)


async def test_a_bad_or_revoked_token_is_refused(admin: AsyncTestClient[Any]) -> None:
    made = (await admin.post("/v1/tokens", json={"name": "ci", "role": "viewer"})).json()
    assert (await admin.get("/v1/fleet", headers=bearer(made["token"]))).status_code == 200
    assert (await admin.get("/v1/fleet", headers=bearer(made["token"] + "x"))).status_code == 401
    assert (await admin.get("/v1/fleet", headers={"authorization": "Basic abc"})).status_code == 401
    assert (await admin.delete(f"/v1/tokens/{made['id']}")).status_code == 204
    refused = await admin.get("/v1/fleet", headers=bearer(made["token"]))
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Bearer")
    assert refused.json()["detail"] == "unknown or revoked token"
    listed = (await admin.get("/v1/tokens")).json()
    assert made["id"] not in {t["id"] for t in listed}
    assert all("token" not in t and "secret_sha256" not in t for t in listed), "secrets are never listed"


async def test_members_see_and_touch_only_their_teams_jobs(admin: AsyncTestClient[Any]) -> None:
    ml = (await admin.post("/v1/tokens", json={"name": "a", "role": "member", "teams": ["ml"]})).json()["token"]
    mine = (await admin.post("/v1/jobs", json=JOB, headers=bearer(ml))).json()
    theirs = (await admin.post("/v1/jobs", json={**JOB, "team": "vision"})).json()
    listed = (await admin.get("/v1/jobs", headers=bearer(ml))).json()
    assert {j["team"] for j in listed} <= {"ml"}
    assert (await admin.get(f"/v1/jobs/{theirs['id']}", headers=bearer(ml))).status_code == 403
    assert (await admin.delete(f"/v1/jobs/{theirs['id']}", headers=bearer(ml))).status_code == 403
    assert (await admin.get("/v1/jobs?team=vision", headers=bearer(ml))).status_code == 403
    refused = await admin.post("/v1/jobs", json={**JOB, "team": "vision"}, headers=bearer(ml))
    assert refused.status_code == 403
    assert "not of 'vision'" in refused.json()["detail"]
    assert (await admin.delete(f"/v1/jobs/{mine['id']}", headers=bearer(ml))).status_code == 202
    member_tokens = await admin.post("/v1/tokens", json={"name": "b", "role": "member"})
    assert member_tokens.status_code == 400, "a member without a team is refused"

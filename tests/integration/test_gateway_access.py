"""Tokens at first start (bootstrap), the audit trail of mutating calls, and the access log."""

import contextlib
import os
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest

from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.gateway.state import GatewayState
from chamber.gateway.tokens import BOOTSTRAP_ID, FILE_HEADER, read_token_file
from tests.support.gateway import bearer, gateway_client

pytestmark = pytest.mark.integration

JOB = {"name": "a", "team": "ml", "gpus_per_replica": 1}


@contextlib.asynccontextmanager
async def started(settings: Settings) -> Any:
    gw = GatewayState(make_context(settings, "gateway"))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


async def test_the_first_start_mints_one_admin_token_and_announces_it(
    settings: Settings, cleanup: None, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = msgspec.structs.replace(settings, admin_token="")
    async with started(bare) as gw:
        token = gw.announced_token
        assert token is not None
        assert token.startswith("chm_")
        principal = gw.tokens.authenticate(token)
        assert principal is not None
        assert principal.role == "admin"
        stored = gw.tokens.get(BOOTSTRAP_ID)
        assert stored is not None
        assert token not in msgspec.json.encode(stored).decode(), "only the hash is stored"
    assert token in capsys.readouterr().err, "printed once"
    async with started(bare) as gw:
        assert gw.announced_token is None, "not minted (nor printed) again"
        assert gw.tokens.authenticate(token) is not None


async def test_a_development_token_file_is_written_once_and_then_used(
    settings: Settings, cleanup: None, tmp_path: Path
) -> None:
    path = tmp_path / ".chamber" / "dev-admin-token"
    dev = msgspec.structs.replace(settings, admin_token="", admin_token_file=str(path))
    async with started(dev) as gw:
        token = gw.announced_token
        assert token is not None
    assert path.read_text().startswith(FILE_HEADER), "clearly labelled"
    assert read_token_file(str(path)) == token
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    async with started(dev) as gw:
        assert gw.announced_token is None
        assert gw.tokens.authenticate(token) is not None


async def test_admin_token_from_the_environment_replaces_the_bootstrap_one(settings: Settings, cleanup: None) -> None:
    async with started(msgspec.structs.replace(settings, admin_token="first")) as gw:
        assert gw.tokens.authenticate("first") is not None
    async with started(msgspec.structs.replace(settings, admin_token="second")) as gw:
        assert gw.tokens.authenticate("second") is not None
        assert gw.tokens.authenticate("first") is None


async def test_the_last_admin_token_cannot_be_revoked(settings: Settings, cleanup: None) -> None:
    """Found by review: the last admin revoked every admin token, its own included, and nobody could manage tokens,
    teams or pools until the gateway restarted."""
    from chamber.gateway.core.authz import Role
    from chamber.gateway.tokens import LastAdmin

    async with started(msgspec.structs.replace(settings, admin_token="first")) as gw:
        with pytest.raises(LastAdmin):
            await gw.tokens.revoke(BOOTSTRAP_ID)
        assert gw.tokens.authenticate("first") is not None
        record, token = await gw.tokens.create(name="second admin", role=Role.ADMIN, teams=(), created_by="t", now=0.0)
        assert await gw.tokens.revoke(BOOTSTRAP_ID), "another admin is left"
        with pytest.raises(LastAdmin):
            await gw.tokens.revoke(record.id)
        assert gw.tokens.authenticate(token) is not None


async def test_a_revoked_bootstrap_token_is_not_brought_back_at_the_next_start(
    settings: Settings, cleanup: None
) -> None:
    """Found by review: an admin who revoked a leaked bootstrap token (given in the environment or a file) got it
    back, with full rights, at the next restart. A new one given is taken."""
    from chamber.gateway.core.authz import Role

    async with started(msgspec.structs.replace(settings, admin_token="leaked")) as gw:
        await gw.tokens.create(name="other admin", role=Role.ADMIN, teams=(), created_by="t", now=0.0)
        assert await gw.tokens.revoke(BOOTSTRAP_ID)
    async with started(msgspec.structs.replace(settings, admin_token="leaked")) as gw:
        assert gw.tokens.authenticate("leaked") is None
    async with started(msgspec.structs.replace(settings, admin_token="rotated")) as gw:
        assert gw.tokens.authenticate("rotated") is not None


async def test_a_token_minted_to_expire_is_refused_from_then_on_and_no_longer_counts_as_an_admin(
    settings: Settings, cleanup: None
) -> None:
    """Tokens lasted until revoked: a leaked one handed to a contractor or a CI job stayed good for ever."""
    from litestar.testing import AsyncTestClient

    from chamber.common.clock import FakeClock
    from chamber.gateway.api import create_app
    from chamber.gateway.tokens import LastAdmin

    clock = FakeClock()
    gw = GatewayState(make_context(settings, "gateway", clock))
    async with AsyncTestClient(app=create_app(gw)) as client:
        client.headers.update(bearer(settings.admin_token))
        made = await client.post("/v1/tokens", json={"name": "ci", "role": "member", "teams": ["ml"],
                                                     "expires_in_s": 3600})  # fmt: skip
        assert made.status_code == 201, made.text
        token, token_id = made.json()["token"], made.json()["id"]
        assert made.json()["expires_at"] == clock.now() + 3600
        listed = {t["id"]: t for t in (await client.get("/v1/tokens")).json()}
        assert listed[token_id]["expires_at"] == clock.now() + 3600
        assert listed[BOOTSTRAP_ID]["expires_at"] is None
        assert (await client.get("/v1/me", headers=bearer(token))).status_code == 200
        clock.advance(3600)
        refused = await client.get("/v1/me", headers=bearer(token))
        assert refused.status_code == 401
        assert f"token {token_id} expired at " in refused.json()["detail"]
        unknown = await client.get("/v1/me", headers=bearer("chm_never-made"))
        assert unknown.json()["detail"] == "unknown or revoked token"
        for bad in (0, -5, 10 * 366 * 86400, "soon"):
            answer = await client.post("/v1/tokens", json={"name": "x", "role": "viewer", "expires_in_s": bad})
            assert answer.status_code == 400, bad
        brief = await client.post("/v1/tokens", json={"name": "temp admin", "role": "admin", "expires_in_s": 60})
        clock.advance(61)
        with pytest.raises(LastAdmin):
            await gw.tokens.revoke(BOOTSTRAP_ID)  # the other admin token has expired: it would leave none usable
        assert gw.tokens.get(brief.json()["id"]) is not None, "listed until revoked"


def test_a_token_file_is_private_even_where_it_was_not(tmp_path: Path) -> None:
    """Found by review: the 0600 mode applied only to a file the gateway created; one there before kept its mode."""
    from chamber.gateway.tokens import write_token_file

    path = tmp_path / "dev-admin-token"
    path.write_text("")
    path.chmod(0o644)
    write_token_file(str(path), "chm_x")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


async def test_every_mutating_call_is_audited_with_who_what_and_the_result(
    settings: Settings, cleanup: None, capsys: pytest.CaptureFixture[str]
) -> None:
    async with gateway_client(settings) as admin:
        viewer = (await admin.post("/v1/tokens", json={"name": "eve", "role": "viewer"})).json()
        ok = await admin.post("/v1/jobs", json=JOB)
        assert ok.status_code == 201
        assert (await admin.post("/v1/jobs", json={**JOB, "gpus_per_replica": "4"})).status_code == 400
        assert (await admin.post("/v1/jobs", json=JOB, headers=bearer(viewer["token"]))).status_code == 403
        assert (await admin.delete("/v1/jobs/j1", headers={"authorization": ""})).status_code == 401
        assert (await admin.get("/v1/fleet")).status_code == 200, "reads are not audited"
        records = (await admin.get("/v1/audit")).json()
        got = [(r["actor"], r["action"], r["status"], r["outcome"]) for r in records]
        assert got == [
            ("anonymous", "DELETE /v1/jobs/{job_id}", 401, "denied"),
            (viewer["id"], "POST /v1/jobs", 403, "denied"),
            ("admin", "POST /v1/jobs", 400, "rejected"),
            ("admin", "POST /v1/jobs", 201, "ok"),
            ("admin", "POST /v1/tokens", 201, "ok"),
        ]
        assert records[3]["detail"] == f"job {ok.json()['id']}"
        assert "gpus_per_replica" in records[2]["detail"]
        assert records[1]["actor_name"] == "eve"
        assert records[1]["role"] == "viewer"
        assert records[0]["target"] == "/v1/jobs/j1"
        assert all(r["at"] > 0 and r["request_id"] for r in records)
        denied = (await admin.get("/v1/audit", params={"outcome": "denied", "limit": 1})).json()
        assert [r["status"] for r in denied] == [401]
        mine = (await admin.get("/v1/audit", params={"actor": viewer["id"]})).json()
        assert [r["status"] for r in mine] == [403]
        assert (await admin.get("/v1/audit", headers=bearer(viewer["token"]))).status_code == 403
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if " http " in line]
    assert any("method=POST" in line and "path=/v1/jobs" in line and "status=201" in line for line in lines)
    assert any("path=/v1/fleet" in line and "status=200" in line for line in lines), "reads are logged too"

"""Names and GPU counts the API takes are checked whole: a name ending in a newline is not a name (Python's `$`
matches before a final newline), and no GPU count is larger than the gRPC API can carry (int32)."""

import msgspec
import pytest

from chamber.common.contracts import JobSpec, Node, OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.contracts.quota import MAX_GPUS
from chamber.common.quota import ConfigError, validate
from chamber.gateway.core.requests import PoolBody, SubmitJobRequest, TeamBody, TokenRequest
from chamber.gateway.errors import BadRequest, NotFound
from chamber.gateway.jobs import IDEMPOTENCY_KEY, check_job_id
from chamber.gateway.quota_api import check_name

ODD = ["ml\n", "ml\r\n", "\nml", "ml\n\n", "m l", ""]


@pytest.mark.parametrize("name", ODD, ids=repr)
def test_path_names_and_job_ids_are_checked_whole(name: str) -> None:
    with pytest.raises(BadRequest):
        check_name("team", name)
    with pytest.raises(NotFound):
        check_job_id(name)
    assert IDEMPOTENCY_KEY.fullmatch(name) is None


@pytest.mark.parametrize("name", ODD, ids=repr)
@pytest.mark.parametrize(
    ("contract", "shape"),
    [
        (TeamConfig, lambda n: {"name": n, "org": "o"}),
        (TeamConfig, lambda n: {"name": "t", "org": n}),
        (PoolConfig, lambda n: {"name": n, "gpu_model": "H100"}),
        (TeamQuota, lambda n: {"pool": n}),
        (JobSpec, lambda n: {"name": "j", "team": n, "gpus_per_replica": 1}),
        (JobSpec, lambda n: {"name": n, "team": "t", "gpus_per_replica": 1}),
        (SubmitJobRequest, lambda n: {"name": "j", "team": n, "gpus_per_replica": 1}),
        (TeamBody, lambda n: {"org": n}),
        (Node, lambda n: {"name": n, "pool": "p", "gpus": []}),
    ],
    ids=["team", "org", "pool", "quota-pool", "job-team", "job-name", "submit-team", "body-org", "node"],
)
def test_contract_names_refuse_what_is_not_a_name(contract: type, shape: object, name: str) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(shape(name), contract)  # type: ignore[operator]


@pytest.mark.parametrize("name", ["ci\n", "ci bot\n", "\nci"], ids=repr)
def test_token_names_end_where_they_end(name: str) -> None:
    """Token names may hold spaces (`ci bot`), never a line break."""
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"name": name, "role": "viewer"}, TokenRequest)


def test_good_names_still_pass() -> None:
    check_name("team", "ml-2")
    check_job_id("j018f2a_x-1")
    assert IDEMPOTENCY_KEY.fullmatch("retry-7@x!")
    assert msgspec.convert({"name": "ml-2", "org": "acme"}, TeamConfig).name == "ml-2"
    assert msgspec.convert({"name": "a.b_c-1", "team": "t", "gpus_per_replica": 1}, JobSpec).name == "a.b_c-1"


@pytest.mark.parametrize(
    ("contract", "shape"),
    [
        (TeamBody, lambda n: {"org": "o", "quotas": [{"pool": "p", "nominal": n}]}),
        (TeamBody, lambda n: {"org": "o", "quotas": [{"pool": "p", "borrowing_limit": n}]}),
        (TeamBody, lambda n: {"org": "o", "quotas": [{"pool": "p", "lending_limit": n}]}),
        (PoolBody, lambda n: {"gpu_model": "H100", "capacity": n}),
    ],
    ids=["nominal", "borrowing-limit", "lending-limit", "capacity"],
)
def test_gpu_counts_fit_the_grpc_int32(contract: type, shape: object) -> None:
    msgspec.convert(shape(MAX_GPUS), contract)  # type: ignore[operator]
    for n in (MAX_GPUS + 1, 3_000_000_000, 2**64 - 1):
        with pytest.raises(msgspec.ValidationError, match="<= 2147483647"):
            msgspec.convert(shape(n), contract)  # type: ignore[operator]


def test_guarantees_in_a_pool_of_unknown_capacity_cannot_add_up_past_int32() -> None:
    """Without a capacity nothing bounds the sum of guarantees; a team's published `nominal` is its sum over
    pools, which the gRPC API carries as an int32 (Teams.List answered INTERNAL)."""
    pools = [PoolConfig(name=p, gpu_model="H100") for p in ("p", "q")]
    big = MAX_GPUS // 2 + 1
    one_team = TeamConfig(name="a", org="o", quotas=[TeamQuota(pool=p.name, nominal=big) for p in pools])
    with pytest.raises(ConfigError, match="team a: guarantees add up to"):
        validate(QuotaConfig(pools=pools, orgs=[OrgConfig(name="o")], teams=[one_team]))
    two_teams = [TeamConfig(name=t, org="o", quotas=[TeamQuota(pool="p", nominal=big)]) for t in ("a", "b")]
    with pytest.raises(ConfigError, match="pool p: guarantees add up to"):
        validate(QuotaConfig(pools=pools, orgs=[OrgConfig(name="o")], teams=two_teams))

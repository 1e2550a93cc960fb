"""The slot ledger on a real Redis: atomic gang claims, idempotence, cordons, readiness and rebuild."""

import contextlib
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from chamber.common.contracts import Cordon
from chamber.common.ledger import Claim, Ledger, LedgerConflict, LedgerFenced, LedgerNotReady
from chamber.common.settings import Settings
from chamber.common.subjects import Names

pytestmark = pytest.mark.integration


@pytest.fixture
async def ledger(settings: Settings, cleanup: None) -> AsyncIterator[Ledger]:
    led = Ledger.from_url(settings.redis_url, Names(settings.namespace).redis_prefix())
    await led.rebuild([])
    yield led
    await led.close()


async def test_a_gang_claims_all_or_nothing(ledger: Ledger) -> None:
    await ledger.claim("a", 1, ["n1/0", "n1/1"])
    with pytest.raises(LedgerConflict) as err:
        await ledger.claim("b", 1, ["n1/2", "n1/1", "n1/3"])
    assert err.value.code == "TAKEN"
    snap = await ledger.snapshot()
    assert snap.owners == {"n1/0": "a/1", "n1/1": "a/1"}, "b claimed nothing"


async def test_claims_are_idempotent_per_job_and_attempt(ledger: Ledger) -> None:
    v1 = await ledger.claim("a", 1, ["n1/0"])
    assert await ledger.claim("a", 1, ["n1/0"]) == v1
    with pytest.raises(LedgerConflict) as err:
        await ledger.claim("a", 2, ["n1/1"])
    assert err.value.code == "JOB_HOLDS_OTHER_CLAIM"


async def test_release_is_idempotent_and_only_for_the_right_attempt(ledger: Ledger) -> None:
    await ledger.claim("a", 1, ["n1/0"])
    assert not await ledger.release("a", 2)
    assert await ledger.release("a", 1)
    assert not await ledger.release("a", 1)
    assert (await ledger.snapshot()).owners == {}
    await ledger.claim("a", 2, ["n1/0"])


async def test_cordoned_gpus_cannot_be_claimed(ledger: Ledger) -> None:
    await ledger.cordon(["n1/0"], Cordon(severity="fatal", reason="health: DBE"))
    with pytest.raises(LedgerConflict) as err:
        await ledger.claim("a", 1, ["n1/0"])
    assert err.value.code == "UNSCHEDULABLE"
    await ledger.uncordon(["n1/0"])
    await ledger.claim("a", 1, ["n1/0"])


async def test_a_claim_restored_for_a_job_already_on_its_gpus_ignores_cordons_not_owners(ledger: Ledger) -> None:
    """A restore re-records where a job is (its claim was lost): a cordon placed since does not refuse it (the
    cordon's rules stop the job), another job's claim still does."""
    await ledger.cordon(["n1/0"], Cordon(severity="fatal", reason="health: DBE"))
    await ledger.claim("b", 1, ["n1/1"])
    first, second = await ledger.claim_many([Claim("a", 1, ("n1/0",)), Claim("c", 1, ("n1/1", "n1/2"))], restore=True)
    assert (first.code, second.code) == ("OK", "TAKEN")
    assert (await ledger.snapshot()).owners == {"n1/0": "a/1", "n1/1": "b/1"}


async def test_every_change_bumps_the_version(ledger: Ledger) -> None:
    v0 = (await ledger.snapshot()).version
    v1 = await ledger.claim("a", 1, ["n1/0"])
    await ledger.release("a", 1)
    v2 = (await ledger.snapshot()).version
    assert v0 < v1 < v2


async def test_an_emptied_ledger_refuses_claims_until_rebuilt(ledger: Ledger) -> None:
    await ledger.claim("a", 1, ["n1/0"])
    await ledger.redis.delete(ledger.k_owner, ledger.k_claims, ledger.k_ready, ledger.k_version)
    with pytest.raises(LedgerNotReady):
        await ledger.claim("b", 1, ["n1/0"])
    await ledger.rebuild([Claim("a", 1, ("n1/0",))])
    with pytest.raises(LedgerConflict):
        await ledger.claim("b", 1, ["n1/0"])


async def test_rebuild_refuses_a_double_booking(ledger: Ledger) -> None:
    with pytest.raises(LedgerConflict):
        await ledger.rebuild([Claim("a", 1, ("n1/0",)), Claim("b", 1, ("n1/0",))])


async def test_scripts_survive_a_script_flush(ledger: Ledger) -> None:
    await ledger.redis.script_flush()
    await ledger.claim("a", 1, ["n1/0"])
    await ledger.redis.script_flush()
    assert await ledger.release("a", 1)


ops = st.lists(
    st.tuples(
        st.sampled_from(["claim", "release", "release_and_claim"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.integers(1, 2),
        st.lists(st.sampled_from([f"n1/{i}" for i in range(6)]), min_size=1, max_size=4, unique=True),
    ),
    max_size=25,
)


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops)
async def test_no_slot_is_ever_held_by_two_jobs(
    ledger: Ledger, sequence: list[tuple[str, str, int, list[str]]]
) -> None:
    await ledger.rebuild([])
    for op, job, attempt, slots in sequence:
        if op == "claim":
            with contextlib.suppress(LedgerConflict):
                await ledger.claim(job, attempt, slots)
        elif op == "release":
            await ledger.release(job, attempt)
        else:  # release this attempt and, in the same call, claim the slots for the next job
            other = chr(ord("a") + (ord(job) - ord("a") + 1) % 4)
            await ledger.release_and_claim([(job, attempt)], [Claim(other, attempt, tuple(slots))])
        snap = await ledger.snapshot()
        held: dict[str, str] = {}
        for claim in snap.claims.values():
            for slot in claim.slots:
                assert slot not in held, f"{slot} held by {held[slot]} and {claim.job_id}"
                held[slot] = claim.job_id
                assert snap.owners[slot] == f"{claim.job_id}/{claim.attempt}"
        assert set(held) == set(snap.owners), "owners and claims agree: every gang is whole"


async def test_a_batch_claims_each_gang_whole_in_order(ledger: Ledger) -> None:
    from chamber.common.ledger import Claim

    results = await ledger.claim_many(
        [Claim("a", 1, ("n1/0", "n1/1")), Claim("b", 1, ("n1/1", "n1/2")), Claim("c", 1, ("n1/2", "n1/3"))]
    )
    assert [r.code for r in results] == ["OK", "TAKEN", "OK"], "b sees a's claim and takes nothing"
    assert (await ledger.snapshot()).owners == {"n1/0": "a/1", "n1/1": "a/1", "n1/2": "c/1", "n1/3": "c/1"}
    assert await ledger.release_many([("a", 1), ("b", 1), ("c", 2)]) == [True, False, False]


async def test_a_pass_releases_and_claims_in_one_call(ledger: Ledger) -> None:
    """The GPUs an ended job frees are claimed by a new one in the same call, and the call is one command to Redis
    (as a redis-py transaction of two scripts it was two round trips and five commands)."""
    await ledger.claim_many([Claim("a", 1, ("n1/0", "n1/1")), Claim("b", 1, ("n1/2",))])

    async def commands() -> int:  # those a client sends (commandstats also counts the ones a script calls)
        stats = await ledger.redis.info("commandstats")
        sent = ("evalsha", "eval", "multi", "exec", "script|exists", "script|load")
        return sum(int(stats.get(f"cmdstat_{name}", {"calls": 0})["calls"]) for name in sent)

    before = await commands()
    results = await ledger.release_and_claim(
        [("a", 1), ("x", 1)], [Claim("c", 1, ("n1/0", "n1/1")), Claim("d", 1, ("n1/2",)), Claim("e", 1, ("n1/3",))]
    )
    assert await commands() - before == 1, "one EVALSHA, nothing around it"
    assert [r.code for r in results] == ["OK", "TAKEN", "OK"], "c gets a's GPUs; b still holds n1/2"
    assert results[1].detail == "n1/2 by b/1"
    assert (await ledger.snapshot()).owners == {"n1/0": "c/1", "n1/1": "c/1", "n1/2": "b/1", "n1/3": "e/1"}


async def test_a_ledger_that_lost_everything_refuses_a_release_and_claim_whole(ledger: Ledger) -> None:
    await ledger.claim("a", 1, ["n1/0"])
    await ledger.redis.delete(ledger.k_owner, ledger.k_claims, ledger.k_ready, ledger.k_version)
    with pytest.raises(LedgerNotReady):
        await ledger.release_and_claim([("a", 1)], [Claim("b", 1, ("n1/0",))])
    assert await ledger.release_many([("a", 1)]) == [False], "a release alone is not refused: nothing is held"


async def test_a_paused_old_leader_is_fenced_out(ledger: Ledger, settings: Settings) -> None:
    """Leader A (token 5) is paused past its lease; B takes over (token 9) and claims. A wakes up: its claim, its
    release and its rebuild are all refused, and B's claim stands."""
    old = ledger
    old.token = 5
    await old.claim("a", 1, ["n1/0"])
    new = Ledger.from_url(settings.redis_url, Names(settings.namespace).redis_prefix())
    new.token = 9
    try:
        await new.claim("b", 1, ["n1/1"])
        with pytest.raises(LedgerFenced):
            await old.claim("c", 1, ["n1/2"])
        with pytest.raises(LedgerFenced):
            await old.release("b", 1)
        with pytest.raises(LedgerFenced):
            await old.rebuild([])
        assert (await new.snapshot()).owners == {"n1/0": "a/1", "n1/1": "b/1"}
        await new.release("a", 1)
    finally:
        await new.close()

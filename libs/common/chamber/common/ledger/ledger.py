"""The ledger adapter over redis-py asyncio.

Layout (all keys share the namespace's hash tag, e.g. `{chamber}:ledger:owner`):
- `owner`  hash slot -> "job/attempt": who holds each GPU slot (`node/index`)
- `claims` hash job -> "attempt|slot,slot,...": each job's one live claim
- `cordon` hash slot -> a `Cordon` (JSON: severity, reason): slots that must not be claimed
- `version` counter bumped by every change
- `ready` marker: present once the ledger was built. Redis may lose everything on restart; a claim against a
  ledger without the marker is refused (`LedgerNotReady`) until the owner rebuilds it from the durable log,
  so an empty ledger can never be mistaken for a free fleet.
- `fence` the fencing token of the newest scheduler leader that wrote: claims, releases and rebuilds carry the
  writer's token and are refused (`LedgerFenced`) when a newer leader's token is there, so a scheduler that was
  paused past its lease cannot claim after another took over.

Claims, releases and rebuilds are Lua scripts (atomic; all or nothing per job; idempotent per job and attempt),
and take many jobs per round trip. Releases and claims are one script (`write.lua`), so a pass that releases and
claims makes one call: as two scripts in a redis-py transaction it made two round trips (the pipeline first asks
`SCRIPT EXISTS`) and five commands. redis-py's `Script` re-loads a script when Redis answers NOSCRIPT (after a
restart or SCRIPT FLUSH).
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

import msgspec
import redis.asyncio as aioredis
import redis.exceptions

from chamber.common.contracts import Cordon
from chamber.common.ledger.errors import LedgerConflict, LedgerFenced, LedgerNotReady, LedgerUnavailable
from chamber.common.log import get_logger

log = get_logger(__name__)

_cordon_decoder = msgspec.json.Decoder(Cordon)
_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
"""Redis did not answer: whether a write was applied is unknown (`LedgerUnavailable`)."""


def _script(name: str) -> str:
    return files("chamber.common.ledger").joinpath(name).read_text()


@dataclass(frozen=True, slots=True)
class Claim:
    job_id: str
    attempt: int
    slots: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimResult:
    claim: Claim
    code: str
    """OK, ALREADY (this very claim was made before), TAKEN, UNSCHEDULABLE or JOB_HOLDS_OTHER_CLAIM."""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.code in ("OK", "ALREADY")


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    ready: bool
    version: int
    owners: dict[str, str]
    """slot -> "job/attempt"."""
    cordons: dict[str, Cordon]
    claims: dict[str, Claim]

    @property
    def cordoned(self) -> dict[str, str]:
        """slot -> the cordon in words (`fatal: ...`, `degraded: ...`)."""
        return {slot: c.describe() for slot, c in self.cordons.items()}


class Ledger:
    def __init__(self, client: "aioredis.Redis", prefix: str) -> None:
        self.redis = client
        base = f"{prefix}:ledger"
        self.k_owner = f"{base}:owner"
        self.k_claims = f"{base}:claims"
        self.k_cordon = f"{base}:cordon"
        self.k_version = f"{base}:version"
        self.k_ready = f"{base}:ready"
        self.k_fence = f"{base}:fence"
        self.token = 0
        """This writer's fencing token (a scheduler leader sets its lease's); 0 when nobody leads (tools, tests)."""
        self._write = client.register_script(_script("write.lua"))
        self._rebuild = client.register_script(_script("rebuild.lua"))

    @classmethod
    def from_url(cls, url: str, prefix: str) -> "Ledger":
        client = aioredis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5, health_check_interval=10)
        return cls(client, prefix)

    async def close(self) -> None:
        await self.redis.aclose()

    async def claim_many(self, claims: Sequence[Claim], *, restore: bool = False) -> list[ClaimResult]:
        """Claim each job's slots or none of them, in order, in one round trip. Replaying a claim is a no-op.
        `restore`: the jobs are already on these GPUs (their claims were lost): a cordon does not refuse them."""
        return (await self._claim_many(claims, restore=restore))[1]

    async def _claim_many(self, claims: Sequence[Claim], *, restore: bool = False) -> tuple[int, list[ClaimResult]]:
        if not claims:
            return 0, []
        return await self._release_and_claim((), claims, "restore" if restore else "place")

    async def _release_and_claim(
        self, releases: Sequence[tuple[str, int]], claims: Sequence[Claim], mode: str
    ) -> tuple[int, list[ClaimResult]]:
        """(the ledger's version after, each claim's result); the releases' results are not read."""
        args: list[str] = [str(self.token), mode, str(len(releases))]
        for job_id, attempt in releases:
            args += [job_id, str(attempt)]
        for c in claims:
            if not c.slots:
                raise ValueError(f"a claim needs at least one slot ({c.job_id})")
            args += [c.job_id, str(c.attempt), str(len(c.slots)), *c.slots]
        result = await self._run(self._write, self._keys(), args)
        self._check(result)
        at = 1 + len(releases)
        results = [ClaimResult(c, str(result[at + 2 * i]), str(result[at + 1 + 2 * i])) for i, c in enumerate(claims)]
        return int(result[0]), results

    def _keys(self) -> list[str]:
        return [self.k_owner, self.k_claims, self.k_cordon, self.k_version, self.k_ready, self.k_fence]

    async def claim(self, job_id: str, attempt: int, slots: Iterable[str]) -> int:
        """Claim all `slots` for (job, attempt) or none. Returns the ledger version. Replaying a claim is a no-op."""
        version, (result,) = await self._claim_many([Claim(job_id, attempt, tuple(slots))])
        if not result.ok:
            raise LedgerConflict(result.code, result.detail)
        return version

    async def release_many(self, attempts: Sequence[tuple[str, int]]) -> list[bool]:
        """Release the claims of (job, attempt) pairs; False for those not held (already released or never)."""
        if not attempts:
            return []
        return await self._release(attempts)

    async def _release(self, attempts: Sequence[tuple[str, int]]) -> list[bool]:
        args = [str(self.token), "release", str(len(attempts))]
        for job_id, attempt in attempts:
            args += [job_id, str(attempt)]
        result = await self._run(self._write, self._keys(), args)
        self._check(result)
        return [str(code) == "OK" for code in result[1:]]

    async def confirm(self) -> None:
        """Does this writer still hold the fence over a ledger that is whole? The write script with nothing to
        write: one small round trip. Raises `LedgerFenced` when a newer leader's token is there, `LedgerNotReady`
        when the ledger lost everything (the fence with it, so the fence alone would prove nothing)."""
        self._check(await self._run(self._write, self._keys(), [str(self.token), "place", "0"]))

    async def take_fence(self) -> None:
        """Put this writer's token in the fence now, before it claims or releases anything: a new leader does this
        first, so that a paused old leader is refused at once, not only after the new one happens to write.
        Raises `LedgerFenced` when a newer leader's token is there already."""
        await self._release(())

    async def release_and_claim(
        self, releases: Sequence[tuple[str, int]], claims: Sequence[Claim]
    ) -> list[ClaimResult]:
        """Release ended attempts, then claim new ones, in one round trip and one atomic step: what a scheduling
        pass does after its events freed GPUs and its decisions reused them. A ledger that lost everything refuses
        the whole call (`LedgerNotReady`; the rebuild that follows leaves the ended attempts out)."""
        if not claims:
            await self.release_many(releases)
            return []
        return (await self._release_and_claim(releases, claims, "place"))[1]

    async def release(self, job_id: str, attempt: int) -> bool:
        """Release the claim of (job, attempt); False when it was not held (already released or never claimed)."""
        (released,) = await self.release_many([(job_id, attempt)])
        return released

    async def cordon(self, slots: Iterable[str], cordon: Cordon) -> None:
        """Mark slots unschedulable. Jobs already on them keep their claim until the scheduler moves them."""
        value = msgspec.json.encode(cordon).decode()
        mapping: dict[Any, Any] = dict.fromkeys(slots, value)
        if not mapping:
            return
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(self.k_cordon, mapping=mapping)
                pipe.incr(self.k_version)
                await pipe.execute()
        except _UNREACHABLE as exc:
            raise LedgerUnavailable(str(exc)) from exc

    async def uncordon(self, slots: Iterable[str]) -> None:
        slot_list = list(slots)
        if not slot_list:
            return
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hdel(self.k_cordon, *slot_list)
                pipe.incr(self.k_version)
                await pipe.execute()
        except _UNREACHABLE as exc:
            raise LedgerUnavailable(str(exc)) from exc

    async def cordons(self) -> dict[str, Cordon]:
        """Every cordon (one round trip; what the scheduler re-reads when health announces a verdict)."""
        try:
            raw: dict[str, str] = await self.redis.hgetall(self.k_cordon)  # type: ignore[assignment]
        except _UNREACHABLE as exc:
            raise LedgerUnavailable(str(exc)) from exc
        return _decode_cordons(raw)

    async def is_ready(self) -> bool:
        try:
            return bool(await self.redis.exists(self.k_ready))
        except _UNREACHABLE as exc:
            raise LedgerUnavailable(str(exc)) from exc

    async def rebuild(self, claims: Iterable[Claim]) -> int:
        """Replace every claim with `claims` (derived from the durable job log) and mark the ledger ready.

        Cordons are kept: they belong to the health service, which re-asserts them from its own log.
        """
        args = [str(self.token)]
        for c in claims:
            args += [c.job_id, str(c.attempt), ",".join(c.slots)]
        keys = [self.k_owner, self.k_claims, self.k_version, self.k_ready, self.k_fence]
        result = await self._run(self._rebuild, keys, args)
        self._check(result)
        if str(result[0]) == "TAKEN":
            raise LedgerConflict("TAKEN", str(result[1]))
        return int(result[1])

    async def snapshot(self) -> LedgerSnapshot:
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.exists(self.k_ready)
                pipe.get(self.k_version)
                pipe.hgetall(self.k_owner)
                pipe.hgetall(self.k_cordon)
                pipe.hgetall(self.k_claims)
                ready, version, owners, cordoned, raw_claims = await pipe.execute()
        except _UNREACHABLE as exc:
            raise LedgerUnavailable(str(exc)) from exc
        claims = {}
        for job, value in raw_claims.items():
            attempt, _, slots = value.partition("|")
            claims[job] = Claim(job, int(attempt), tuple(slots.split(",")))
        return LedgerSnapshot(bool(ready), int(version or 0), owners, _decode_cordons(cordoned), claims)

    def _check(self, result: list[Any]) -> None:
        code = str(result[0])
        if code == "NOT_READY":
            raise LedgerNotReady("ledger is empty and must be rebuilt")
        if code == "FENCED":
            raise LedgerFenced(f"a newer leader (token {result[1]}) holds the ledger; this writer has {self.token}")

    async def _run(self, script: Any, keys: list[str], args: list[str]) -> list[Any]:
        try:
            result: list[Any] = await script(keys=keys, args=args)
        except _UNREACHABLE as exc:
            raise LedgerUnavailable(str(exc)) from exc
        return result


def _decode_cordons(raw: dict[str, str]) -> dict[str, Cordon]:
    out: dict[str, Cordon] = {}
    for slot, value in raw.items():
        try:
            out[slot] = _cordon_decoder.decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            # Written by something else (an old version, a hand edit): still unschedulable, drained with grace.
            log.warning("ledger.undecodable_cordon", slot=slot, value=value[:200])
            out[slot] = Cordon(severity="degraded", reason=value)
    return out

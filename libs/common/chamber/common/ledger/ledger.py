"""The ledger adapter over redis-py asyncio.

Layout (all keys share the namespace's hash tag, e.g. `{chamber}:ledger:owner`):
- `owner`  hash slot -> "job/attempt": who holds each GPU slot (`node/index`)
- `claims` hash job -> "attempt|slot,slot,...": each job's one live claim
- `cordon` hash slot -> reason: slots that must not be claimed (health quarantine, operator cordon)
- `version` counter bumped by every change
- `ready` marker: present once the ledger was built. Redis may lose everything on restart; a claim against a
  ledger without the marker is refused (`LedgerNotReady`) until the owner rebuilds it from the durable log,
  so an empty ledger can never be mistaken for a free fleet.

Claims and releases are Lua scripts (atomic, all or nothing, idempotent per job and attempt). redis-py's
`Script` re-loads a script when Redis answers NOSCRIPT (after a restart or SCRIPT FLUSH).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from chamber.common.ledger.errors import LedgerConflict, LedgerNotReady, LedgerUnavailable


def _script(name: str) -> str:
    return files("chamber.common.ledger").joinpath(name).read_text()


@dataclass(frozen=True, slots=True)
class Claim:
    job_id: str
    attempt: int
    slots: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    ready: bool
    version: int
    owners: dict[str, str]
    """slot -> "job/attempt"."""
    cordoned: dict[str, str]
    """slot -> reason."""
    claims: dict[str, Claim]


class Ledger:
    def __init__(self, client: "aioredis.Redis", prefix: str) -> None:
        self.redis = client
        base = f"{prefix}:ledger"
        self.k_owner = f"{base}:owner"
        self.k_claims = f"{base}:claims"
        self.k_cordon = f"{base}:cordon"
        self.k_version = f"{base}:version"
        self.k_ready = f"{base}:ready"
        self._claim = client.register_script(_script("claim.lua"))
        self._release = client.register_script(_script("release.lua"))

    @classmethod
    def from_url(cls, url: str, prefix: str) -> "Ledger":
        client = aioredis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5, health_check_interval=10)
        return cls(client, prefix)

    async def close(self) -> None:
        await self.redis.aclose()

    async def claim(self, job_id: str, attempt: int, slots: Iterable[str]) -> int:
        """Claim all `slots` for (job, attempt) or none. Returns the ledger version. Replaying a claim is a no-op."""
        slot_list = list(slots)
        if not slot_list:
            raise ValueError("a claim needs at least one slot")
        result = await self._run(
            self._claim,
            [self.k_owner, self.k_claims, self.k_cordon, self.k_version, self.k_ready],
            [job_id, str(attempt), *slot_list],
        )
        code, detail = str(result[0]), str(result[1])
        if code in ("OK", "ALREADY"):
            return int(detail)
        if code == "NOT_READY":
            raise LedgerNotReady("ledger is empty and must be rebuilt")
        raise LedgerConflict(code, detail)

    async def release(self, job_id: str, attempt: int) -> bool:
        """Release the claim of (job, attempt); False when it was not held (already released or never claimed)."""
        result = await self._run(self._release, [self.k_owner, self.k_claims, self.k_version], [job_id, str(attempt)])
        return str(result[0]) == "OK"

    async def cordon(self, slots: Iterable[str], reason: str) -> None:
        """Mark slots unschedulable. Jobs already on them keep their claim until the scheduler moves them."""
        mapping: dict[Any, Any] = dict.fromkeys(slots, reason)
        if not mapping:
            return
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(self.k_cordon, mapping=mapping)
                pipe.incr(self.k_version)
                await pipe.execute()
        except redis.exceptions.ConnectionError as exc:
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
        except redis.exceptions.ConnectionError as exc:
            raise LedgerUnavailable(str(exc)) from exc

    async def is_ready(self) -> bool:
        try:
            return bool(await self.redis.exists(self.k_ready))
        except redis.exceptions.ConnectionError as exc:
            raise LedgerUnavailable(str(exc)) from exc

    async def rebuild(self, claims: Iterable[Claim]) -> int:
        """Replace every claim with `claims` (derived from the durable job log) and mark the ledger ready.

        Cordons are kept: they belong to the health service, which re-asserts them from its own log.
        """
        owner: dict[Any, Any] = {}
        claim_map: dict[Any, Any] = {}
        for c in claims:
            claim_map[c.job_id] = f"{c.attempt}|{','.join(c.slots)}"
            for slot in c.slots:
                if slot in owner:
                    raise LedgerConflict("TAKEN", f"{slot} claimed by {owner[slot]} and {c.job_id}/{c.attempt}")
                owner[slot] = f"{c.job_id}/{c.attempt}"
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(self.k_owner, self.k_claims)
                if owner:
                    pipe.hset(self.k_owner, mapping=owner)
                    pipe.hset(self.k_claims, mapping=claim_map)
                pipe.set(self.k_ready, "1")
                pipe.incr(self.k_version)
                result = await pipe.execute()
        except redis.exceptions.ConnectionError as exc:
            raise LedgerUnavailable(str(exc)) from exc
        return int(result[-1])

    async def snapshot(self) -> LedgerSnapshot:
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.exists(self.k_ready)
                pipe.get(self.k_version)
                pipe.hgetall(self.k_owner)
                pipe.hgetall(self.k_cordon)
                pipe.hgetall(self.k_claims)
                ready, version, owners, cordoned, raw_claims = await pipe.execute()
        except redis.exceptions.ConnectionError as exc:
            raise LedgerUnavailable(str(exc)) from exc
        claims = {}
        for job, value in raw_claims.items():
            attempt, _, slots = value.partition("|")
            claims[job] = Claim(job, int(attempt), tuple(slots.split(",")))
        return LedgerSnapshot(bool(ready), int(version or 0), owners, cordoned, claims)

    async def cordons(self) -> dict[str, str]:
        """slot -> reason, without reading the claims (what a reader of cordons alone needs, at any fleet size)."""
        try:
            result = await self.redis.hgetall(self.k_cordon)
        except redis.exceptions.ConnectionError as exc:
            raise LedgerUnavailable(str(exc)) from exc
        return {str(k): str(v) for k, v in result.items()}

    async def _run(self, script: Any, keys: list[str], args: list[str]) -> list[Any]:
        try:
            result: list[Any] = await script(keys=keys, args=args)
        except redis.exceptions.ConnectionError as exc:
            raise LedgerUnavailable(str(exc)) from exc
        return result

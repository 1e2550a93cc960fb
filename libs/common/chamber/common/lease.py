"""Leader election for services that must act alone (the scheduler): a lease in a JetStream KV bucket.

The lease is one key in a bucket whose entries expire after `ttl_s` (the bucket's max age). A candidate creates
the key (refused while someone holds it); the holder renews it with compare-and-set on its revision every
`ttl_s / 4`; a holder that stops renewing (crashed, paused, cut off) loses it when the entry expires, and a
standby's next attempt succeeds. A clean shutdown deletes the key so a standby takes over at once, and so does a
candidate on the same host as a holder whose process is gone (a crashed leader restarted by `chamber up`).

The revision at which a holder acquired the lease is its **fencing token**. KV revisions are stream sequence
numbers: they only grow, survive NATS restarts (file storage) and are never reused, so a newer leader always has
a larger token. The ledger checks the token inside its Lua scripts, so a leader that was paused past its lease
cannot change the ledger after another has taken over, even before it notices it lost the lease.
"""

import asyncio
import contextlib
import math
import os
import socket
import time

import nats.errors
import nats.js.errors
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from chamber.common.bus import Bus
from chamber.common.bus.errors import BusError
from chamber.common.log import get_logger
from chamber.common.pids import pid_alive
from chamber.common.subjects import LEASES_BUCKET

log = get_logger(__name__)


class LeaseLost(RuntimeError):
    """The lease expired or was taken over: the holder must stop acting."""


def identity(service: str) -> str:
    return f"{service}@{socket.gethostname()}:{os.getpid()}"


class Lease:
    def __init__(self, kv: KeyValue, name: str, holder: str, ttl_s: float) -> None:
        self.kv = kv
        self.name = name
        self.holder = holder
        self.ttl_s = ttl_s
        self.token = 0
        """The fencing token: the revision at which this holder acquired the lease (0 while not holding)."""
        self._revision = 0
        self._confirmed_at = -math.inf
        """`time.monotonic()` when the newest acquisition or renewal that succeeded was asked for."""
        self._renewing = asyncio.Lock()
        """One renewal at a time: the keeper and a holder confirming its lead would otherwise both update from the
        same revision, and the loser would take itself for deposed."""

    @classmethod
    async def open(cls, bus: Bus, name: str, holder: str, ttl_s: float) -> "Lease":
        bucket = bus.names.bucket(LEASES_BUCKET)
        try:
            kv = await bus.js.key_value(bucket)
            await bus.scale_bucket(bucket)
        except nats.js.errors.BucketNotFoundError:
            config = KeyValueConfig(bucket=bucket, history=1, ttl=ttl_s, storage=StorageType.FILE,
                                    replicas=bus.replicas)  # fmt: skip
            try:
                kv = await bus.js.create_key_value(config)
            except nats.js.errors.BadRequestError:
                kv = await bus.js.key_value(bucket)
        except nats.errors.Error as exc:
            raise BusError(f"cannot open the leases bucket: {exc}") from exc
        return cls(kv, name, holder, ttl_s)

    @property
    def held(self) -> bool:
        return self.token > 0

    def fresh(self, within_s: float) -> bool:
        """Held, and confirmed less than `within_s` ago by this process's monotonic clock, which runs on while the
        process is paused: a holder frozen past its lease finds itself stale, and must prove its lead again."""
        return self.held and time.monotonic() - self._confirmed_at < within_s

    async def try_acquire(self) -> bool:
        asked = time.monotonic()
        try:
            self._revision = await self.kv.create(self.name, self.holder.encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            if not await self._holder_died_here():
                return False
            try:
                self._revision = await self.kv.create(self.name, self.holder.encode())
            except nats.js.errors.KeyWrongLastSequenceError:
                return False
        except nats.errors.Error as exc:
            log.warning("lease.acquire_failed", lease=self.name, error=str(exc))
            return False
        self.token = self._revision
        self._confirmed_at = asked
        log.info("lease.acquired", lease=self.name, holder=self.holder, token=self.token)
        return True

    async def _holder_died_here(self) -> bool:
        """The holder was a process on this host that no longer exists (it crashed and was restarted here, as
        `chamber up` does): take its lease back now rather than after it expires. Anything else (another host, a
        live process, a pid reused by another process) waits for the expiry, the safe direction."""
        try:
            entry = await self.kv.get(self.name)
        except (nats.js.errors.KeyNotFoundError, nats.errors.Error):
            return False
        holder = (entry.value or b"").decode(errors="replace")
        _, _, place = holder.rpartition("@")
        host, _, pid = place.rpartition(":")
        if host != socket.gethostname() or not pid.isdigit() or pid_alive(int(pid)):
            return False
        try:
            await self.kv.delete(self.name, last=entry.revision)
        except nats.errors.Error:
            return False
        log.warning("lease.taken_from_dead_holder", lease=self.name, holder=holder)
        return True

    async def acquire(self, stop: asyncio.Event, poll_s: float = 0.25) -> bool:
        """Wait until this holder has the lease (True) or `stop` is set (False)."""
        waiting_logged = False
        while not stop.is_set():
            if await self.try_acquire():
                return True
            if not waiting_logged:
                log.info("lease.standby", lease=self.name, holder=self.holder)
                waiting_logged = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)
        return False

    async def renew(self) -> None:
        """Extend the lease; raises `LeaseLost` when it is no longer ours."""
        async with self._renewing:
            if not self.held:
                raise LeaseLost(f"lease {self.name} is not held")
            asked = time.monotonic()
            try:
                self._revision = await self.kv.update(self.name, self.holder.encode(), last=self._revision)
            except nats.js.errors.KeyWrongLastSequenceError as exc:
                self.token = 0
                raise LeaseLost(f"lease {self.name} was taken over or expired") from exc
            self._confirmed_at = asked

    async def keep(self, lost: asyncio.Event) -> None:
        """Renew until cancelled; set `lost` and return when the lease is gone. A renewal that cannot reach NATS
        is retried until the lease would have expired."""
        interval = self.ttl_s / 4
        loop = asyncio.get_running_loop()
        last_ok = loop.time()
        while True:
            await asyncio.sleep(interval)
            try:
                await self.renew()
                last_ok = loop.time()
            except LeaseLost as exc:
                log.error("lease.lost", lease=self.name, error=str(exc))
                lost.set()
                return
            except (nats.errors.Error, TimeoutError) as exc:
                if loop.time() - last_ok >= self.ttl_s:
                    log.error("lease.expired", lease=self.name, error=str(exc))
                    self.token = 0
                    lost.set()
                    return
                log.warning("lease.renew_failed", lease=self.name, error=str(exc))

    async def release(self) -> None:
        """Give the lease up at once (clean shutdown), so a standby need not wait for it to expire."""
        if not self.held:
            return
        self.token = 0
        with contextlib.suppress(nats.errors.Error):
            await self.kv.delete(self.name, last=self._revision)

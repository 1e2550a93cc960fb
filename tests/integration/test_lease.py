"""The scheduler's lease on a real JetStream KV: one holder at a time, growing fencing tokens, expiry, and a dead
local holder's lease taken back at once."""

import asyncio
import os
import socket
import sys

import pytest

from chamber.common.bus import Bus
from chamber.common.lease import Lease, LeaseLost

pytestmark = pytest.mark.integration


async def test_one_holder_at_a_time_and_a_newer_holder_has_a_larger_token(bus: Bus) -> None:
    first = await Lease.open(bus, "scheduler", "a@elsewhere:1", ttl_s=2)
    second = await Lease.open(bus, "scheduler", "b@elsewhere:2", ttl_s=2)
    assert await first.try_acquire()
    token = first.token
    assert not await second.try_acquire(), "held by another"
    await first.renew()
    paused = await Lease.open(bus, "scheduler", "a@elsewhere:1", ttl_s=2)
    paused._revision = first._revision  # what the first holder believes, if it were paused now
    await first.release()
    assert await second.try_acquire(), "a clean release hands it over at once"
    assert second.token > token
    with pytest.raises(LeaseLost):
        await paused.renew()


async def test_a_lease_nobody_renews_expires(bus: Bus) -> None:
    gone = await Lease.open(bus, "scheduler", "a@elsewhere:1", ttl_s=1)
    standby = await Lease.open(bus, "scheduler", "b@elsewhere:2", ttl_s=1)
    assert await gone.try_acquire()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.wait_for(standby.acquire(stop, poll_s=0.1), timeout=10)
    assert loop.time() - started < 4, "taken over within about the lease"
    assert standby.token > gone.token


async def test_a_dead_holder_on_this_host_is_replaced_at_once_a_live_one_is_not(bus: Bus) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()
    dead_pid = proc.pid
    host = socket.gethostname()
    crashed = await Lease.open(bus, "scheduler", f"scheduler@{host}:{dead_pid}", ttl_s=30)
    assert await crashed.try_acquire()
    restarted = await Lease.open(bus, "scheduler", f"scheduler@{host}:{os.getpid()}", ttl_s=30)
    assert await restarted.try_acquire(), "its holder's process is gone: no need to wait 30 s"
    assert restarted.token > crashed.token
    other = await Lease.open(bus, "scheduler", f"scheduler@{host}:{dead_pid}", ttl_s=30)
    assert not await other.try_acquire(), "the holder (this process) is alive"

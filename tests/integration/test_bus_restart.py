"""The bus across a NATS restart, on an embedded nats-server of the test's own (it is SIGKILLed and started again
on the same port with the same store, as the chaos run does)."""

from pathlib import Path

import pytest

from chamber.cli.infra import embedded_nats
from chamber.common.bus import Bus, Consumer
from chamber.common.bus.puller import Puller
from chamber.common.codec import Decoder, encode
from chamber.common.contracts import (
    JobCancelRequested,
    JobEvent,
    JobRecord,
    Node,
    NodeInventory,
    Pool,
    PoolConfig,
    QuotaConfig,
)
from chamber.common.jobstore import JobStore
from chamber.common.quotastore import QuotaStore
from chamber.common.subjects import JOBS, Names
from chamber.gateway.core.authz import Role
from chamber.gateway.tokens import TokenStore
from tests.support.builders import make_job
from tests.support.services import eventually

pytestmark = pytest.mark.integration


async def test_after_a_nats_restart_the_replay_covers_what_a_crashed_consumer_received(tmp_path: Path) -> None:
    """A consumer's first `add_consumer` answer after the server reloaded it is the state at load time: after a
    restart it said "delivered up to N" while much more had been delivered since. A consumer that took that as
    the end of its replay missed the messages a SIGKILLed instance had received (they came 30 s later, at the
    ack wait). The replay must cover them."""
    server = embedded_nats(tmp_path)
    server.start()
    try:
        bus = await Bus.connect(server.url, Names("restart"), "test")
        await bus.ensure_streams()
        stream = bus.names.stream(JOBS)
        replayed: list[str] = []

        async def one(event: JobCancelRequested) -> None:
            pass

        async def again(events: list[JobCancelRequested]) -> None:
            replayed.extend(e.job_id for e in events)

        def consumer() -> Consumer[JobCancelRequested]:
            return bus.consumer(
                stream=JOBS, durable="d", filter_subjects=[bus.names.subject("jobs.>")], decoder=Decoder(JobEvent),
                handler=one, recheck_handler=again, batch=64,
            )  # fmt: skip

        async def publish(*jobs: str) -> None:
            for job in jobs:
                await bus.js.publish(bus.names.job_cancel(job), encode(JobCancelRequested(job_id=job, requested_at=1)))

        first = consumer()
        await first.start()
        await publish(*[f"before-{i}" for i in range(5)])
        await eventually(lambda: first.processed == 5, what="handled and acked before the restart")
        await first.stop()

        server.kill()
        server.start()

        async def jetstream_back() -> bool:
            try:
                await bus.js.stream_info(stream)
            except Exception:
                return False
            return True

        await eventually(jetstream_back, within=20, what="JetStream answers again after the restart")

        await publish(*[f"after-{i}" for i in range(5)])
        crashed = Puller(bus.nc, stream, "d", batch=64)
        await crashed.start()
        got: list[object] = []
        while len(got) < 5:
            got += await crashed.fetch(timeout_s=2.0)
        await crashed.stop()  # received after the restart, never acked: the instance died

        second = consumer()
        await second.start()
        assert sorted(replayed) == [f"after-{i}" for i in range(5)]
        await second.stop()
        await bus.close()
    finally:
        server.stop()


async def test_follows_and_watches_hear_the_writes_made_after_a_nats_restart_at_once(tmp_path: Path) -> None:
    """A NATS restart loses every ordered consumer (they are kept in memory); nats-py recreates one only once two
    idle heartbeats in a row are missed. With the default heartbeat (5 s) a job-record follow and a state watch
    heard nothing of the writes made after the restart for another ~15 s (measured): the gateway served stale
    jobs, a standby scheduler's view stood still, the scheduler placed on a stale inventory. With a 1 s heartbeat
    (`ORDERED_HEARTBEAT_S`) they are recreated while JetStream comes back: each write made once the restarted
    server takes writes is heard within a few seconds (bounded here well under the old ~15 s)."""
    server = embedded_nats(tmp_path)
    server.start()
    try:
        bus = await Bus.connect(server.url, Names("follow"), "test")
        await bus.ensure_streams()
        store = await JobStore.open(bus)
        records: list[str] = []
        entries: list[str] = []
        nodes: list[str] = []

        def on_record(record: JobRecord) -> None:
            records.append(record.id)

        def on_node(inventory: NodeInventory) -> None:
            nodes.append(inventory.node.name)

        stop_follow = await store.follow(on_record)
        _, last = await store.snapshot()
        stop_entries = await store.follow_entries(lambda job_id, _record, _seq: entries.append(job_id), after=last)
        await bus.watch_latest(bus.names.subject("inventory.>"), Decoder(NodeInventory), on_node)

        async def inventory(node: str) -> None:
            pool = Pool(name="default", gpu_model="H100")
            inv = NodeInventory(node=Node(name=node, pool="default", gpus=[]), pool=pool, observed_at=1.0)
            await bus.js.publish(bus.names.inventory(node), encode(inv))

        await store.create(make_job("before").build())
        await inventory("before")
        await eventually(lambda: "before" in records and "before" in entries and "before" in nodes, what="heard")

        server.kill()
        server.start()

        async def written() -> bool:
            try:
                await store.create(make_job("after").build())
                await inventory("after")
            except Exception:
                return False
            return True

        await eventually(written, within=30, what="the restarted server takes writes")
        await eventually(
            lambda: "after" in records and "after" in entries and "after" in nodes,
            within=8, what="the follows and the watch hear the writes made after the restart",
        )  # fmt: skip
        await stop_follow()
        await stop_entries()
        await bus.close()
    finally:
        server.stop()


async def test_a_token_revoked_and_a_quota_change_made_after_a_nats_restart_are_heard_at_once(tmp_path: Path) -> None:
    """The token and quota-configuration follows had nats-py's KV watcher, whose ordered consumer keeps the 5 s
    heartbeat: after a NATS restart a gateway kept accepting a token another gateway revoked for ~15 s, and the
    scheduler kept the old quotas as long. Now they follow with `ORDERED_HEARTBEAT_S` (`follow_kv`), as every
    other ordered consumer: both are heard within a few seconds of the restarted server taking the writes."""
    server = embedded_nats(tmp_path)
    server.start()
    try:
        bus = await Bus.connect(server.url, Names("kvfollow"), "test")
        await bus.ensure_streams()
        serving, other = await TokenStore.open(bus), await TokenStore.open(bus)
        await serving.start()
        await other.start()
        record, token = await other.create(name="ci", role=Role.MEMBER, teams=("a",), created_by="t", now=1.0)
        await eventually(lambda: serving.authenticate(token) is not None, what="the new token is known")
        quota = await QuotaStore.open(bus)
        seen: list[QuotaConfig] = []
        stop_quota = await quota.follow(seen.append)
        await quota.put(QuotaConfig(pools=[PoolConfig(name="before", gpu_model="H100")]), 0)
        await eventually(lambda: bool(seen) and seen[-1].pools[0].name == "before", what="the configuration")

        server.kill()
        server.start()

        async def written() -> bool:
            try:
                await other.revoke(record.id)
                _, revision = await quota.get()
                await quota.put(QuotaConfig(pools=[PoolConfig(name="after", gpu_model="H100")]), revision)
            except Exception:
                return False
            return True

        await eventually(written, within=30, what="the restarted server takes writes")
        await eventually(
            lambda: serving.authenticate(token) is None and seen[-1].pools[0].name == "after",
            within=8, what="the revocation and the new configuration are heard",
        )  # fmt: skip
        await stop_quota()
        await serving.stop()
        await other.stop()
        await bus.close()
    finally:
        server.stop()

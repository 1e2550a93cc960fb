"""Removing everything a namespace owns: its streams, KV buckets and Redis keys (tests and benchmarks)."""

import contextlib

import nats
import nats.errors
import redis.asyncio as aioredis

from chamber.common.subjects import JOBS_BUCKET, LEASES_BUCKET, QUOTA_BUCKET, STREAMS, Names


async def delete_namespace(nats_url: str, redis_url: str, namespace: str) -> None:
    names = Names(namespace)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for spec in STREAMS:
        with contextlib.suppress(nats.errors.Error):
            await js.delete_stream(names.stream(spec))
    for bucket in (JOBS_BUCKET, QUOTA_BUCKET, LEASES_BUCKET):
        with contextlib.suppress(nats.errors.Error):
            await js.delete_key_value(names.bucket(bucket))
    await nc.close()
    client = aioredis.Redis.from_url(redis_url)
    keys = [k async for k in client.scan_iter(match=f"{names.redis_prefix()}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()

"""Follow a resource: list, then watch from the list's resource version, and list again when the watch expires.

This is the reflector every Kubernetes controller runs (client-go's `Reflector`): the list gives the full state
and a resource version; the watch streams changes after it; the last version seen (from an event or a
`BOOKMARK`) is where a broken or timed-out watch resumes; a `410 Gone` (the server no longer has history that
old) forces a new list, and the differences between the cache and that list are delivered as events, objects
deleted meanwhile included, so the handler never misses a deletion.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from chamber.common.kube.client import KubeClient, Obj, Resource, WatchStream
from chamber.common.kube.errors import KubeError, KubeGone
from chamber.common.log import get_logger

log = get_logger(__name__)

Handler = Callable[[str, Obj], Awaitable[None]]
"""Called with `ADDED`, `MODIFIED` or `DELETED` and the object, in order, one at a time."""


def uid_of(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def version_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Reflector:
    def __init__(
        self, client: KubeClient, resource: Resource, handler: Handler, *, namespace: str | None = None,
        labels: str | None = None, fields: str | None = None, timeout_s: int = 300,
        on_synced: Callable[[dict[str, Obj]], Awaitable[None]] | None = None, name: str = "",
    ) -> None:  # fmt: skip
        self.client = client
        self.resource = resource
        self.handler = handler
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.timeout_s = timeout_s
        self.on_synced = on_synced
        self.name = name or resource.plural
        self.objects: dict[str, Obj] = {}
        """The cache: uid -> the last version of each object."""
        self.resource_version = ""
        self.lists = 0
        """How many times it listed (1 + relists after 410 Gone)."""
        self.synced = asyncio.Event()
        self._stream: WatchStream | None = None

    async def run(self, stop: asyncio.Event) -> None:
        need_list = True
        backoff = 0.2
        stopper = asyncio.create_task(self._close_on(stop))
        try:
            while not stop.is_set():
                try:
                    if need_list:
                        await self._list()
                        need_list = False
                    need_list = await self._watch(stop)
                    backoff = 0.2
                except KubeGone:
                    log.info("kube.watch_expired", resource=self.name, resource_version=self.resource_version)
                    need_list = True
                except KubeError as exc:
                    if stop.is_set():
                        break
                    log.warning("kube.watch_failed", resource=self.name, error=str(exc), retry_s=backoff)
                    await _sleep_or_stop(stop, backoff)
                    backoff = min(backoff * 2, 10.0)
                except Exception:  # never let a reflector end: its resource would silently no longer be followed
                    if stop.is_set():
                        break
                    log.exception("kube.reflector_failed", resource=self.name, retry_s=backoff)
                    need_list = True  # from a fresh list, which also runs `on_synced` again
                    await _sleep_or_stop(stop, backoff)
                    backoff = min(backoff * 2, 10.0)
        finally:
            stopper.cancel()
            if self._stream is not None:
                self._stream.close()

    async def _close_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        if self._stream is not None:
            self._stream.close()

    async def _list(self) -> None:
        items, rv = await self.client.list(self.resource, self.namespace, labels=self.labels, fields=self.fields)
        self.lists += 1
        fresh = {uid_of(o): o for o in items}
        for uid, obj in list(self.objects.items()):
            if uid not in fresh:
                del self.objects[uid]
                await self._deliver("DELETED", obj)
        for uid, obj in fresh.items():
            known = self.objects.get(uid)
            self.objects[uid] = obj
            if known is None:
                await self._deliver("ADDED", obj)
            elif version_of(known) != version_of(obj):
                await self._deliver("MODIFIED", obj)
        self.resource_version = rv
        self.synced.set()
        if self.on_synced is not None:
            await self.on_synced(dict(self.objects))

    async def _watch(self, stop: asyncio.Event) -> bool:
        """One watch request, to its end. Returns True when the cache must be listed again."""
        stream = await self.client.open_watch(
            self.resource, self.namespace, resource_version=self.resource_version, labels=self.labels,
            fields=self.fields, timeout_s=self.timeout_s,
        )  # fmt: skip
        self._stream = stream
        if stop.is_set():
            stream.close()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Obj | None] = asyncio.Queue()

        def hand_over(event: Obj) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        async def drain() -> None:
            try:
                await self.client.iterate(stream, hand_over)
            finally:
                queue.put_nowait(None)

        draining = asyncio.create_task(drain())
        try:
            while (event := await queue.get()) is not None:
                if await self._on_event(event):
                    stream.close()
                    return True
            await draining
        finally:
            self._stream = None
            if not draining.done():
                stream.close()
                with contextlib.suppress(Exception):
                    await draining
        return False

    async def _on_event(self, event: Obj) -> bool:
        kind = event.get("type")
        obj: Any = event.get("object") or {}
        if kind == "BOOKMARK":
            self.resource_version = version_of(obj) or self.resource_version
            return False
        if kind == "ERROR":
            if obj.get("code") == 410:
                log.info("kube.watch_expired", resource=self.name, resource_version=self.resource_version)
                return True
            raise KubeError(f"watch error: {obj.get('message', obj)}", status=int(obj.get("code") or 0))
        if kind not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj, dict):
            return False
        obj = dict(obj, apiVersion=self.resource.api_version, kind=self.resource.kind)
        self.resource_version = version_of(obj) or self.resource_version
        uid = uid_of(obj)
        if kind == "DELETED":
            self.objects.pop(uid, None)
        else:
            self.objects[uid] = obj
        await self._deliver(kind, obj)
        return False

    async def _deliver(self, kind: str, obj: Obj) -> None:
        try:
            await self.handler(kind, obj)
        except Exception:
            log.exception(
                "kube.handler_failed", resource=self.name, change=kind, name=obj.get("metadata", {}).get("name")
            )


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)

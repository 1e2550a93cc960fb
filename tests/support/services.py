"""Run service shells inside the test's event loop (for tests that need no process boundary)."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from chamber.common.runtime import ServiceMain, make_context
from chamber.common.settings import Settings


@contextlib.asynccontextmanager
async def running(settings: Settings, *services: tuple[str, ServiceMain]) -> AsyncIterator[None]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(main(make_context(settings, name), stop), name=name) for name, main in services]
    try:
        await asyncio.sleep(0.3)
        for task in tasks:
            if task.done():
                task.result()
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def eventually(predicate: Callable[[], object], within: float = 10.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met within {within} s")
        await asyncio.sleep(0.05)

"""XID errors as they happen: a thread blocks on NVML's event set and hands each XID to the event loop at once.

Polling would report a fatal XID up to a whole interval late; the event set wakes within milliseconds.
"""

import asyncio
import contextlib
import ctypes
import threading
from collections.abc import Callable, Hashable
from typing import Any

from chamber.common.log import get_logger

log = get_logger(__name__)

WAIT_BACKOFF_MAX_S = 5.0
"""The longest pause after a failed event wait before the next."""

NO_INSTANCE = 0xFFFFFFFF
"""NVML's GPU-instance id in an event that is not about one MIG instance."""


class XidWatcher:
    def __init__(
        self,
        nvml: Any,
        handles: list[Any],
        on_xid: Callable[[int, int], None],
        *,
        wait_ms: int = 500,
        resolve: Callable[[int, int | None], list[int]] | None = None,
    ) -> None:
        """`on_xid(gpu_index, xid)` is called in the event loop's thread. `handles` are the physical GPUs;
        `resolve(physical index, GPU-instance id or None)` gives the device indices an XID concerns (MIG
        instances), by default the physical index itself."""
        self.nvml = nvml
        self.handles = handles
        self.on_xid = on_xid
        self.wait_ms = wait_ms
        self.resolve = resolve or (lambda physical, instance: [physical])
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._index: dict[Hashable, int] = {}
        self._set: Any = None

    def start(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Register every GPU for critical XID events; False when this driver offers no events."""
        n = self.nvml
        try:
            self._set = n.nvmlEventSetCreate()
        except n.NVMLError as exc:
            log.warning("nvml.xid_events_unavailable", error=str(exc))
            return False
        for i, h in enumerate(self.handles):
            if h is None:
                continue  # an unreadable GPU (see `NvmlReader.physical`)
            try:  # each GPU on its own (found by review: one GPU that refused turned XIDs off for the node)
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, self._set)
            except n.NVMLError as exc:
                log.warning("nvml.xid_events_unavailable", gpu=i, error=str(exc))
                continue
            self._index[device_key(h)] = i
        if not self._index:
            with contextlib.suppress(n.NVMLError):
                n.nvmlEventSetFree(self._set)
            self._set = None
            return False
        self._thread = threading.Thread(target=self._run, args=(loop,), name="nvml-xid", daemon=True)
        self._thread.start()
        return True

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        n = self.nvml
        failures = 0
        while not self._stop.is_set():
            try:
                data = n.nvmlEventSetWait_v2(self._set, self.wait_ms)
            except n.NVMLError as exc:
                if getattr(exc, "value", None) == n.NVML_ERROR_TIMEOUT:
                    failures = 0
                    continue
                # A wait that fails at once (a GPU fallen off the bus: GPU_IS_LOST) must not spin: found by review,
                # 27,823 waits and warnings in half a second, a core pegged. Logged once, then waited out.
                if failures == 0:
                    log.warning("nvml.xid_wait_failed", error=str(exc))
                failures += 1
                self._stop.wait(min(WAIT_BACKOFF_MAX_S, 0.1 * 2 ** min(failures, 8)))
                continue
            failures = 0
            physical = self._gpu_index(data.device)
            instance = getattr(data, "gpuInstanceId", None)
            instance = None if instance is None or instance >= NO_INSTANCE else int(instance)
            for index in self.resolve(physical, instance) if physical >= 0 else [-1]:
                loop.call_soon_threadsafe(self.on_xid, index, int(data.eventData))

    def _gpu_index(self, device: Any) -> int:
        """The physical GPU an event's device is, by the device it points to; -1 when it is none of ours."""
        return self._index.get(device_key(device), -1)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._set is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlEventSetFree(self._set)


def device_key(handle: Any) -> Hashable:
    """What identifies a device handle. pynvml handles are ctypes pointers, and each event carries a new pointer
    object to the same device; ctypes pointers compare by identity, so the address they hold is the key. Anything
    else (the tests' fake NVML hands out plain objects) is its own key."""
    if isinstance(handle, ctypes._Pointer | ctypes.c_void_p):
        address = ctypes.cast(handle, ctypes.c_void_p).value
        if address is not None:
            return ("address", address)
    key: Hashable = handle
    return key

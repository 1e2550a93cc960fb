"""Pre-encoded answers for the hot reads (`GET /v1/jobs`, `GET /v1/fleet`), kept while the state they came from is
unchanged: a repeated read costs a dict lookup and a write of bytes, not a walk over the jobs and an encode."""

from collections.abc import Hashable

MAX_ENTRIES = 512


class ResponseCache:
    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[Hashable, bytes]] = {}

    def get(self, key: Hashable, version: Hashable) -> bytes | None:
        found = self._entries.get(key)
        return found[1] if found is not None and found[0] == version else None

    def put(self, key: Hashable, version: Hashable, data: bytes) -> bytes:
        if len(self._entries) >= MAX_ENTRIES and key not in self._entries:
            self._entries.clear()
        self._entries[key] = (version, data)
        return data

"""A replica's output, bounded and rotated: segment files named by the byte offset they start at.

The writer (the shim, standard library only) appends to the newest segment and starts a new one when it is full,
deleting the oldest beyond `SEGMENTS`; so at most `max_bytes` are kept and a reader's offsets stay valid across
rotations: bytes before the oldest segment are gone, later ones are where they were.
"""

import io
import os
from pathlib import Path

SEGMENTS = 4
SUFFIX = ".log"


def _segments(directory: Path) -> list[tuple[int, Path]]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        stem = name.removesuffix(SUFFIX)
        if name.endswith(SUFFIX) and stem.isdigit():
            found.append((int(stem), directory / name))
    return sorted(found)


class LogWriter:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = max(1024, max_bytes // SEGMENTS)
        directory.mkdir(parents=True, exist_ok=True)
        existing = _segments(directory)
        if existing:
            start, path = existing[-1]
            self.offset = start + path.stat().st_size
        else:
            self.offset = 0
        self._start = existing[-1][0] if existing else 0
        self._file = self._open(self._start)

    def _open(self, start: int) -> io.FileIO:
        """Unbuffered: `offset` counts what reached the file, also when a write fails (a full disk)."""
        return open(self.directory / f"{start:020d}{SUFFIX}", "ab", buffering=0)

    def write(self, data: bytes) -> None:
        """All of `data`, else OSError (e.g. ENOSPC) with `offset` at the end of what was written."""
        view = memoryview(data)
        while view:
            room = self.segment_bytes - (self.offset - self._start)
            if room <= 0:
                self._rotate()
                continue
            written = self._file.write(view[:room]) or 0
            self.offset += written
            view = view[written:]

    def _rotate(self) -> None:
        kept = _segments(self.directory)
        for _, old in kept[: max(0, len(kept) - (SEGMENTS - 1))]:  # room for the new one, first: the disk may be full
            old.unlink(missing_ok=True)
        new = self._open(self.offset)  # when it fails, the full segment stays the current one
        self._file.close()
        self._file, self._start = new, self.offset

    def close(self) -> None:
        self._file.close()


def read_log(directory: Path, offset: int, limit: int) -> tuple[bytes, int, int]:
    """Up to `limit` bytes from `offset`: (data, where data starts, the offset after it). A reader behind the
    oldest kept segment starts at the oldest kept byte; one at or past the end gets nothing."""
    for _ in range(3):  # a segment may be rotated away between listing and reading: list again
        segments = _segments(directory)
        if not segments:
            return b"", offset, offset
        start = max(offset, segments[0][0])
        out = bytearray()
        position = start
        try:
            for seg_start, path in segments:
                size = path.stat().st_size
                if seg_start + size <= position:
                    continue
                if seg_start > position:
                    break
                with open(path, "rb") as f:
                    f.seek(position - seg_start)
                    chunk = f.read(limit - len(out))
                out += chunk
                position += len(chunk)
                if len(out) >= limit:
                    break
        except FileNotFoundError:
            continue
        return bytes(out), start, position
    return b"", offset, offset

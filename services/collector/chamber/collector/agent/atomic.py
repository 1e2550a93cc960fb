"""Replacing a small file so that a reader, or a node back from a power cut, finds the old content or the new,
never half of it and never an empty file: the agent's replica state and the shim's records go through here. Small
on purpose: the shim imports it before it starts the command."""

import contextlib
import os
from pathlib import Path


def write_atomically(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write a temporary file beside `path` (mode 0600), fsync it unless not `durable`, then rename it over `path`
    (and fsync the directory, so the rename is on disk too)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

"""What Chamber's benchmarks use to load the real services from the same machine: a minimal keep-alive HTTP/1.1
client on asyncio streams (run it on `chamber.common.runtime.loop_factory`: uvloop), and each process's CPU time.

The load generator runs on the cores the services run on (users' clients would not): a general-purpose client
(aiohttp) spent ~0.33 ms of CPU per submit in `chamber bench e2e`, a seventh of the machine at 1,000 submits/s,
taken from the system it measures. This client sends prepared bytes and reads one response by its
Content-Length: what any client must do, no more.
"""

import asyncio
import os
from pathlib import Path


class Conn:
    """One keep-alive HTTP/1.1 connection: send a request, read one response (status and body)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int, host: str = "127.0.0.1") -> "Conn":
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def call(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        at = lower.find(b"content-length:")
        length = int(head[at + 15 : head.index(b"\r\n", at)]) if at >= 0 else 0
        body = await self.reader.readexactly(length) if length else b""
        return status, body

    def close(self) -> None:
        self.writer.close()


def request(method: str, path: str, token: str, body: bytes = b"") -> bytes:
    """The bytes of one request with a bearer token (and a JSON body, if any)."""
    head = f"{method} {path} HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {token}\r\n"
    if body:
        head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def cpu_s(pid: int) -> float | None:
    """User+system CPU seconds of a process (Linux /proc); None elsewhere or once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float | None:
    """The most memory a process has held resident so far, in MiB (Linux /proc `VmHWM`); None elsewhere or once
    it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def listener_pid(port: int) -> int | None:
    """The process listening on 127.0.0.1/0.0.0.0:`port` (Linux /proc; None where it cannot be seen): the NATS or
    Redis server the benchmark runs against, whose CPU counts as the system's too."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    return int(proc.name)
        except OSError:
            continue
    return None

"""A replica's output: bounded, rotated, and read by offsets that stay valid across rotations."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.collector.agent.logfiles import SEGMENTS, LogWriter, read_log


@settings(max_examples=60, deadline=None)
@given(
    chunks=st.lists(st.binary(min_size=0, max_size=3000), max_size=30),
    offset=st.integers(0, 100_000),
    limit=st.integers(1, 10_000),
)
def test_reads_return_exactly_the_kept_bytes_from_an_offset(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[bytes], offset: int, limit: int
) -> None:
    directory = tmp_path_factory.mktemp("log")
    writer = LogWriter(directory, max_bytes=4096)
    for chunk in chunks:
        writer.write(chunk)
    writer.close()
    everything = b"".join(chunks)
    kept = sum(p.stat().st_size for p in directory.iterdir())
    assert kept <= 4096, "bounded"
    oldest = len(everything) - kept
    data, start, end = read_log(directory, offset, limit)
    assert start == max(offset, oldest), "only rotated-away bytes are skipped"
    assert data == everything[start : start + limit]
    assert end == start + len(data)


def test_output_is_bounded_and_the_newest_is_kept(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, max_bytes=4096)
    lines = [f"line {i:05d}\n".encode() for i in range(5000)]
    for line in lines:
        writer.write(line)
    writer.close()
    everything = b"".join(lines)
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 4096
    assert len(list(tmp_path.iterdir())) <= SEGMENTS
    data, start, end = read_log(tmp_path, 0, 1 << 20)
    assert start > 0, "the oldest output was rotated away"
    assert end == len(everything)
    assert data == everything[start:]
    assert data.endswith(b"line 04999\n")


def test_a_reopened_writer_appends(tmp_path: Path) -> None:
    first = LogWriter(tmp_path, max_bytes=1 << 20)
    first.write(b"before\n")
    first.close()
    second = LogWriter(tmp_path, max_bytes=1 << 20)
    second.write(b"after\n")
    second.close()
    assert read_log(tmp_path, 0, 100) == (b"before\nafter\n", 0, 13)
    assert read_log(tmp_path, 7, 100) == (b"after\n", 7, 13)

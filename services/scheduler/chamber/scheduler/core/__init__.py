"""The scheduler's pure core: snapshots in, decisions out. No I/O, no clock reads, no asyncio."""

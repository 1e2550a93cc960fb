"""Every GPU the aggregator knows gets a slot: a small integer that indexes flat columns of numbers.

At 100,000 GPUs a dict of objects per GPU is too slow to scan four times a second; flat columns are scanned by
numpy in milliseconds. Columns are `array.array`s (a write from Python is a plain store) that numpy reads without
copying when a snapshot is taken. A node's GPUs are found through the node's name (one dict lookup per telemetry
batch, not per GPU); a slot's `node/index` name is kept for joins with the ledger and job placements.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

NONE = -1


@dataclass
class Columns:
    """Per-slot and per-node columns, grown together."""

    activity: array[float] = field(default_factory=lambda: array("d"))
    """0..1, from the GPU's latest sample."""
    seen_at: array[float] = field(default_factory=lambda: array("d"))
    """When the GPU's latest sample was taken (-inf: never)."""
    node: array[int] = field(default_factory=lambda: array("i"))
    in_inventory: array[int] = field(default_factory=lambda: array("b"))
    pool: array[int] = field(default_factory=lambda: array("i"))
    job: array[int] = field(default_factory=lambda: array("i"))
    """The job holding the GPU (an id from `Interned`), or NONE."""
    team: array[int] = field(default_factory=lambda: array("i"))
    cordoned: array[int] = field(default_factory=lambda: array("b"))
    node_interval: array[float] = field(default_factory=lambda: array("d"))
    """Per node: the telemetry interval it reports with (0: not reporting yet)."""


class Interned:
    """Names to small integers and back; ids of released names are reused, so the tables stay as big as the
    set of names in use, not as big as history."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []
        self._free: list[int] = []

    def id(self, name: str) -> int:
        found = self.ids.get(name)
        if found is not None:
            return found
        if self._free:
            new = self._free.pop()
            self.names[new] = name
        else:
            new = len(self.names)
            self.names.append(name)
        self.ids[name] = new
        return new

    def release(self, name: str) -> None:
        found = self.ids.pop(name, None)
        if found is not None:
            self.names[found] = ""
            self._free.append(found)

    def __len__(self) -> int:
        return len(self.names)


class SlotTable:
    def __init__(self) -> None:
        self.cols = Columns()
        self.nodes = Interned()
        self.node_slots: list[list[int]] = []
        """Per node id: slot per GPU index (NONE for an index never seen)."""
        self.keys: list[str] = []
        """Per slot: `node/index`."""
        self.by_key: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.keys)

    def node_id(self, node: str) -> int:
        nid = self.nodes.id(node)
        if nid == len(self.node_slots):
            self.node_slots.append([])
            self.cols.node_interval.append(0.0)
        return nid

    def slots_of(self, node: str) -> list[int]:
        return self.node_slots[self.node_id(node)]

    def slot(self, node: str, index: int) -> int:
        """The slot of GPU `index` of `node`, created when new."""
        nid = self.node_id(node)
        slots = self.node_slots[nid]
        if index < len(slots) and slots[index] != NONE:
            return slots[index]
        while len(slots) <= index:
            slots.append(NONE)
        new = len(self.keys)
        slots[index] = new
        key = f"{node}/{index}"
        self.keys.append(key)
        self.by_key[key] = new
        c = self.cols
        c.activity.append(0.0)
        c.seen_at.append(float("-inf"))
        c.node.append(nid)
        c.in_inventory.append(0)
        c.pool.append(NONE)
        c.job.append(NONE)
        c.team.append(NONE)
        c.cordoned.append(0)
        return new

    def slot_of_key(self, key: str) -> int:
        found = self.by_key.get(key)
        if found is not None:
            return found
        node, _, index = key.rpartition("/")
        if not node or not index.isdigit():
            return NONE
        return self.slot(node, int(index))


def floats(column: array[float]) -> npt.NDArray[np.float64]:
    """A numpy view of a column (no copy); valid until the column grows."""
    return np.frombuffer(column, dtype=np.float64) if len(column) else np.zeros(0)


def ints(column: array[int]) -> npt.NDArray[np.int32]:
    return np.frombuffer(column, dtype=np.int32) if len(column) else np.zeros(0, dtype=np.int32)


def flags(column: array[int]) -> npt.NDArray[np.bool_]:
    return np.frombuffer(column, dtype=np.bool_) if len(column) else np.zeros(0, dtype=np.bool_)

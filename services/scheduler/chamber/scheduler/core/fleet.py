"""A view of the fleet for one scheduling cycle: which GPU slots exist, and which are free and schedulable."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from chamber.common.contracts import Node


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    pool: str
    gpu_model: str
    rack: str
    zone: str
    gpu_indices: tuple[int, ...]
    free: tuple[int, ...]
    """Indices of GPUs that are schedulable and not claimed, ascending."""


def build_fleet(nodes: Iterable[Node], owners: Mapping[str, str], cordoned: Mapping[str, str]) -> list[NodeView]:
    """Join inventory with the ledger. Nodes are returned in name order so placement is deterministic."""
    views = []
    for node in sorted(nodes, key=lambda n: n.name):
        indices = tuple(sorted(g.index for g in node.gpus))
        free = tuple(i for i in indices if f"{node.name}/{i}" not in owners and f"{node.name}/{i}" not in cordoned)
        model = node.gpus[0].model if node.gpus else ""
        views.append(NodeView(node.name, node.pool, model, node.topology.rack, node.topology.zone, indices, free))
    return views

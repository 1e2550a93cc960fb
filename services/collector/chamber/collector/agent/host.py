"""Where runners come from: one for this node's real GPUs (the node agent), or one per simulated node (so the
simulated fleet runs real processes on this machine, each simulated GPU standing for a real one)."""

import os
import socket
from pathlib import Path

from chamber.collector.agent.runner import RunnerConfig
from chamber.collector.agent.server import AgentServer
from chamber.common.bus import Bus
from chamber.common.contracts import Node
from chamber.common.runtime import Context


def state_root(ctx: Context) -> Path:
    """`CHAMBER_AGENT_STATE_DIR`, else the XDG state directory; per namespace below it."""
    configured = ctx.settings.agent_state_dir
    if configured:
        base = Path(configured)
    else:
        xdg = os.environ.get("XDG_STATE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".local" / "state") / "chamber"
    return base / ctx.settings.namespace


def runner_config(ctx: Context, node: Node, address: str) -> RunnerConfig:
    s = ctx.settings
    root = state_root(ctx)
    checkpoints = Path(s.checkpoint_dir) if s.checkpoint_dir else root / "checkpoints"
    return RunnerConfig(
        node=node.name, gpus=list(node.gpus), root=root / "agent" / node.name, checkpoint_root=checkpoints,
        address=address, heartbeat_s=s.agent_heartbeat_s, timeout_s=s.agent_timeout_s,
        log_max_bytes=s.agent_log_max_bytes, retention_s=s.agent_retention_s,
    )  # fmt: skip


async def start_runners(ctx: Context, bus: Bus, nodes: list[Node], *, local: bool) -> list[AgentServer]:
    """Runners for `nodes`; `local`: simulated nodes on this machine (reached at 127.0.0.1)."""
    address = "127.0.0.1" if local else (ctx.settings.agent_address or socket.gethostname())
    runners = [AgentServer(bus, ctx.clock, runner_config(ctx, node, address)) for node in nodes]
    for runner in runners:
        await runner.start()
    return runners

"""The executor seam: how placed jobs are actually run, chosen by `CHAMBER_EXECUTOR`.

`simulated` pretends (the demo fleet); `process` has node agents start real processes; `kubernetes` unsuspends
Jobs and binds their pods to the nodes the ledger reserved. Every executor reports back only through the bus.
"""

from collections.abc import Callable

from chamber.common.bus import Bus
from chamber.common.runtime import Context
from chamber.scheduler.executor.base import Executor
from chamber.scheduler.executor.process import ProcessExecutor
from chamber.scheduler.executor.simulated import SimulatedExecutor


class ExecutorUnavailable(RuntimeError):
    """The configured executor cannot run here (not built yet, or its runtime is missing)."""


def make_executor(ctx: Context, bus: Bus, lead_fresh: Callable[[], bool] | None = None) -> Executor:
    """`lead_fresh`: whether this scheduler's lease was confirmed lately (an executor that stops work on its own
    judgement asks it first)."""
    kind = ctx.settings.executor
    if kind == "simulated":
        return SimulatedExecutor(bus, ctx.clock)
    if kind == "process":
        return ProcessExecutor(bus, ctx.clock, ctx.settings, lead_fresh=lead_fresh)
    if kind == "kubernetes":
        from chamber.common.kube.client import KubeClient
        from chamber.scheduler.executor.kubernetes import KubernetesExecutor

        if not ctx.settings.kube_api:
            raise ExecutorUnavailable(
                "CHAMBER_EXECUTOR=kubernetes needs CHAMBER_KUBE_API (in-cluster, kubeconfig or a URL)"
            )
        client = KubeClient.connect(ctx.settings.kube_api)
        return KubernetesExecutor(
            bus, ctx.clock, client, start_timeout_s=ctx.settings.kube_start_timeout_s, lead_fresh=lead_fresh
        )
    raise ExecutorUnavailable(f"CHAMBER_EXECUTOR={kind} is not available in this build")


__all__ = ["Executor", "ExecutorUnavailable", "ProcessExecutor", "SimulatedExecutor", "make_executor"]

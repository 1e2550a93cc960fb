"""The executor seam: how placed jobs are actually run. Simulated now; Kubernetes (suspended Jobs) next."""

from chamber.scheduler.executor.base import Executor
from chamber.scheduler.executor.simulated import SimulatedExecutor

__all__ = ["Executor", "SimulatedExecutor"]

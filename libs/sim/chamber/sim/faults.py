"""Fault models. `llama3`: the unexpected interruptions of Llama 3 405B's pre-training (Meta, "The Llama 3 Herd of
Models", 2024): 419 on 16,384 H100 GPUs over 54 days, by cause, scaled by `rate_multiplier`."""

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

LLAMA3_GPUS = 16_384
LLAMA3_SECONDS = 54 * 86_400


@dataclass(frozen=True, slots=True)
class FaultCause:
    name: str
    count: int
    scope: str
    """`gpu`: one GPU is bad; `node`: the host is; `job`: only the job failed (software), the hardware is fine."""
    repair_s: float
    silent: bool = False
    """Health checks do not see it (silent data corruption): it behaves as if health were off."""


LLAMA3: tuple[FaultCause, ...] = (
    FaultCause("faulty-gpu", 148, "gpu", 3 * 86_400),
    FaultCause("gpu-hbm3", 72, "gpu", 3 * 86_400),
    FaultCause("software-bug", 54, "job", 0),
    FaultCause("network", 35, "node", 4 * 3600),
    FaultCause("host-maintenance", 32, "node", 4 * 3600),
    FaultCause("gpu-sram", 19, "gpu", 3 * 86_400),
    FaultCause("gpu-gsp", 17, "gpu", 3600),
    FaultCause("nic", 7, "node", 4 * 3600),
    FaultCause("nccl-watchdog", 7, "job", 0),
    FaultCause("silent-data-corruption", 6, "gpu", 86_400, silent=True),
    FaultCause("thermal", 6, "gpu", 2 * 3600),
    FaultCause("host-other", 16, "node", 4 * 3600),
)


@dataclass(frozen=True, slots=True)
class Fault:
    at: float
    cause: FaultCause
    gpu_number: int
    """Index into the fleet's GPU list (the simulator maps it to a node and GPU)."""


def llama3_faults(gpus: int, horizon_s: float, multiplier: float, seed: int) -> Iterator[Fault]:
    """Poisson arrivals over the fleet at Llama 3's rate per GPU-second, causes in Llama 3's proportions."""
    total = sum(c.count for c in LLAMA3)
    rate = total / (LLAMA3_GPUS * LLAMA3_SECONDS) * gpus * multiplier
    if rate <= 0:
        return
    rng = random.Random(seed)
    weights = [c.count for c in LLAMA3]
    t = 0.0
    while True:
        t += -math.log(1.0 - rng.random()) / rate
        if t >= horizon_s:
            return
        yield Fault(t, rng.choices(LLAMA3, weights)[0], rng.randrange(gpus))

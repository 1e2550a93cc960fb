"""How much of a job's work survives a stop: the one rule the state machine, the victim costs and the simulator
all use, so preemption cost and accounting cannot disagree."""


def saved_work(ran_s: float, interval_s: float | None, graceful: bool) -> float:
    """Of `ran_s` seconds run, what is checkpointed: up to the last periodic checkpoint, or all of it when the
    job checkpoints on request (no interval) and was given its grace period."""
    if interval_s:
        return ran_s - ran_s % interval_s
    return ran_s if graceful else 0.0

"""Runtime predictions learned from history, as Helios (SC'21) learns them: a job will likely run about as long as
the recent finished jobs most like it (same team and name, then same team and size, then the team, then anyone).

Users' own estimates (`max_runtime_s`) are mostly large overestimates and often missing; a team's recent history
is a far better guide for ordering the queue (shortest predicted first) and for backfill. A prediction is only
ever made from jobs that have finished: never from the job's own true duration, which nobody knows in advance.

Pure and bounded: a few recent durations per key (the median resists the heavy tail of training runs), and at
most `max_keys` name keys (least recently updated dropped first), so memory does not grow with history.
"""

from collections import OrderedDict, deque
from dataclasses import dataclass

HistoryKey = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PredictorConfig:
    window: int = 32
    """Recent finished jobs kept per key."""
    min_samples: tuple[int, int, int, int, int] = (1, 2, 3, 3, 5)
    """Samples a key needs before it predicts: (team+name+size, team+name, team+size, team, everyone)."""
    max_keys: int = 20_000


def _median(values: deque[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class RuntimePredictor:
    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.config = config or PredictorConfig()
        self._history: OrderedDict[HistoryKey, deque[float]] = OrderedDict()
        self.observed = 0

    @staticmethod
    def keys(team: str, name: str, gpus: int) -> tuple[HistoryKey, ...]:
        """Most specific first."""
        size = str(gpus)
        return (("n", team, name, size), ("n", team, name), ("t", team, size), ("t", team), ("*",))

    def observe(self, team: str, name: str, gpus: int, run_s: float) -> None:
        """A job finished after running `run_s` seconds in all."""
        if run_s < 0:
            return
        self.observed += 1
        history, window = self._history, self.config.window
        for key in self.keys(team, name, gpus):
            samples = history.get(key)
            if samples is None:
                samples = history[key] = deque(maxlen=window)
            else:
                history.move_to_end(key)
            samples.append(run_s)
        while len(history) > self.config.max_keys:
            history.popitem(last=False)

    def predict(self, team: str, name: str, gpus: int) -> float | None:
        """The predicted total runtime in seconds, or None while nothing like it has finished."""
        history = self._history
        for key, need in zip(self.keys(team, name, gpus), self.config.min_samples, strict=True):
            samples = history.get(key)
            if samples is not None and len(samples) >= need:
                return _median(samples)
        return None

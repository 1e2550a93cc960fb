"""Runtime predictions: learned only from finished jobs, most specific history first, bounded memory; and the
controller feeds them from what finishes (live and at start-up), never from a job's own duration."""

from chamber.common.contracts import JobFinished, JobStarted, JobState, JobSubmitted
from chamber.scheduler.core.controller import Controller
from chamber.scheduler.core.decisions import Place
from chamber.scheduler.core.estimates import PredictorConfig, RuntimePredictor
from chamber.scheduler.core.state import SchedulerConfig
from tests.support.builders import make_job, make_node


def test_nothing_is_predicted_before_anything_like_it_finished() -> None:
    assert RuntimePredictor().predict("a", "train", 8) is None


def test_the_most_specific_history_with_enough_samples_wins() -> None:
    p = RuntimePredictor(PredictorConfig(min_samples=(1, 2, 3, 3, 5)))
    for run_s in (100.0, 200.0, 300.0):
        p.observe("a", "eval", 1, run_s)
    p.observe("a", "train", 8, 50_000.0)
    assert p.predict("a", "train", 8) == 50_000.0  # its own name and size, one sample suffices
    assert p.predict("a", "eval", 1) == 200.0  # the median of its three
    assert p.predict("a", "new-name", 1) == 200.0  # the team's 1-GPU jobs (three samples)
    assert p.predict("a", "new-name", 4) == 250.0  # the team's jobs of any size: median of 100, 200, 300, 50000


def test_the_team_fallback_is_the_median_of_all_its_recent_jobs() -> None:
    p = RuntimePredictor(PredictorConfig(min_samples=(1, 2, 3, 3, 5)))
    for run_s in (100.0, 200.0, 300.0, 50_000.0):
        p.observe("a", f"job{run_s}", 1 if run_s < 1000 else 8, run_s)
    assert p.predict("a", "other", 4) == 250.0
    assert p.predict("b", "other", 4) is None  # four samples in all: the fleet-wide key needs five


def test_history_is_bounded_per_key_and_in_keys() -> None:
    p = RuntimePredictor(PredictorConfig(window=4, max_keys=50))
    for i in range(1000):
        p.observe(f"team{i % 7}", f"name{i}", 1, float(i))
    assert len(p._history) <= 50
    assert all(len(samples) <= 4 for samples in p._history.values())
    assert p.predict("team0", "name994", 1) == 994.0  # recent names kept


def _controller() -> Controller:
    control = Controller(SchedulerConfig(order="spf"))
    control.load([make_node("n0").gpus(1).build()], [], {}, {})
    return control


def test_the_controller_learns_from_finished_jobs_only_and_the_queue_uses_it() -> None:
    control = _controller()
    spec = make_job("x").named("eval").spec()
    control.apply(JobSubmitted(job_id="j1", spec=spec, submitted_at=0.0), 0.0)
    assert control.state.queue.jobs["j1"].predicted_s is None  # nothing has finished: no guess
    (place,) = [d for d in control.decide(0.0) if isinstance(d, Place)]
    control.commit(place, 0.0)
    control.apply(JobStarted(job_id="j1", attempt=place.attempt, started_at=0.0), 0.0)
    assert control.state.predictor.observed == 0
    control.apply(JobFinished(job_id="j1", attempt=place.attempt, finished_at=420.0, started_at=0.0), 420.0)
    assert control.state.predictor.observed == 1
    control.apply(JobSubmitted(job_id="j2", spec=spec, submitted_at=500.0), 500.0)
    assert control.state.queue.jobs["j2"].predicted_s == 420.0


def test_a_restarted_controller_relearns_from_the_stored_finished_records() -> None:
    done = make_job("old").named("eval").build()
    done = done.__class__(**{**{f: getattr(done, f) for f in done.__struct_fields__}, "state": JobState.SUCCEEDED,
                             "run_s": 900.0, "finished_at": 1000.0})  # fmt: skip
    waiting = make_job("new").named("eval").at(2000.0).build()
    control = Controller(SchedulerConfig(order="spf"))
    control.load([make_node("n0").gpus(1).build()], [done, waiting], {}, {})
    control.load([make_node("n0").gpus(1).build()], [done, waiting], {}, {})  # a reload learns nothing twice
    assert control.state.predictor.observed == 1
    assert "old" not in control.records
    assert control.state.queue.jobs["new"].predicted_s == 900.0

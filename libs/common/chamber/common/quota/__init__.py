"""The pure quota arithmetic, shared by the scheduler (admission, reclaim, queue order) and the quota service
(fair shares, accounting, budgets). No I/O: configuration and usage in, answers out.

Semantics follow Kueue's cohorts and KAI-Scheduler's deserved/over-quota rules:
- a team is guaranteed `nominal` GPUs per pool; idle nominal is lent to its cohort (up to `lending_limit`);
- usage above nominal is borrowed (up to `borrowing_limit`) from the cohort's idle lendable quota and from the
  pool's unassigned capacity; only preemptible jobs may borrow, so borrowed capacity can always be reclaimed;
- a team within its nominal reclaims borrowed capacity (preempting borrowers, with their checkpoint grace);
- the surplus is shared by weight, adjusted by recent usage (decayed with a half-life), by water-filling.
"""

from chamber.common.quota.admission import Admission, QuotaUsage, admit, admits, borrowed_jobs, may_reclaim
from chamber.common.quota.book import ConfigError, QuotaBook, non_finite, validate
from chamber.common.quota.fairshare import decay, fair_shares, standings

__all__ = [
    "Admission",
    "ConfigError",
    "QuotaBook",
    "QuotaUsage",
    "admit",
    "admits",
    "borrowed_jobs",
    "decay",
    "fair_shares",
    "may_reclaim",
    "non_finite",
    "standings",
    "validate",
]

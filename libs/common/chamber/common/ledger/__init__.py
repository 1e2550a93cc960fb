"""The live GPU slot ledger in Redis: the only place that says which job holds which GPU."""

from chamber.common.ledger.errors import LedgerConflict, LedgerError, LedgerNotReady, LedgerUnavailable
from chamber.common.ledger.ledger import Claim, Ledger, LedgerSnapshot

__all__ = [
    "Claim",
    "Ledger",
    "LedgerConflict",
    "LedgerError",
    "LedgerNotReady",
    "LedgerSnapshot",
    "LedgerUnavailable",
]

"""The live GPU slot ledger in Redis: the only place that says which job holds which GPU."""

from chamber.common.ledger.errors import (
    LedgerConflict,
    LedgerError,
    LedgerFenced,
    LedgerNotReady,
    LedgerUnavailable,
)
from chamber.common.ledger.ledger import Claim, ClaimResult, Ledger, LedgerSnapshot

__all__ = [
    "Claim",
    "ClaimResult",
    "Ledger",
    "LedgerConflict",
    "LedgerError",
    "LedgerFenced",
    "LedgerNotReady",
    "LedgerSnapshot",
    "LedgerUnavailable",
]

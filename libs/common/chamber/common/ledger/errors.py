"""Ledger errors, wrapping redis-py's so callers never depend on the client library."""


class LedgerError(RuntimeError):
    """Anything that went wrong with the ledger."""


class LedgerUnavailable(LedgerError):
    """Redis could not be reached."""


class LedgerNotReady(LedgerError):
    """The ledger is empty (Redis restarted or was flushed) and must be rebuilt from the event log first."""


class LedgerConflict(LedgerError):
    """A claim was refused: a slot is taken or unschedulable, or the job holds another attempt."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class LedgerFenced(LedgerError):
    """A newer scheduler leader holds the fence: this one lost its lease and must not change the ledger."""

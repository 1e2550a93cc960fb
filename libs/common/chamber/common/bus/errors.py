"""Our own error hierarchy, so the services never catch nats-py's exceptions (which may change under us)."""


class BusError(RuntimeError):
    """Anything that went wrong talking to NATS."""


class BusUnavailable(BusError):
    """NATS could not be reached (after retries)."""


class PublishError(BusError):
    """JetStream did not acknowledge a publish; the message may not be stored."""


class WrongLastSequence(PublishError):
    """A compare-and-set publish was refused: the subject changed since the revision the writer had."""

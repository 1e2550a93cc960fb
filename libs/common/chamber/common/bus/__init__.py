"""The message bus adapter over nats-py: the only place that talks to NATS."""

from chamber.common.bus.client import ORDERED_HEARTBEAT_S, Bus
from chamber.common.bus.consumer import Consumer
from chamber.common.bus.errors import BusError, BusUnavailable, PublishError, WrongLastSequence
from chamber.common.bus.reading import messages_left, read_stream

__all__ = [
    "ORDERED_HEARTBEAT_S",
    "Bus",
    "BusError",
    "BusUnavailable",
    "Consumer",
    "PublishError",
    "WrongLastSequence",
    "messages_left",
    "read_stream",
]

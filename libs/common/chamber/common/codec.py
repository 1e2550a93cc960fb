"""Encoding and decoding of bus messages. Decoding never raises anything but `DecodeError`."""

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


class DecodeError(ValueError):
    """A message is not valid JSON or does not match the expected contract."""


def encode(value: msgspec.Struct) -> bytes:
    return _encoder.encode(value)


class Decoder:
    """A reusable decoder for one contract type (a Struct or a tagged union of Structs)."""

    def __init__(self, type_: Any) -> None:
        self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(type_)
        self.type = type_

    def decode(self, data: bytes) -> Any:
        try:
            return self._decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DecodeError(str(exc)) from exc
        except (UnicodeDecodeError, OverflowError, RecursionError) as exc:
            raise DecodeError(f"undecodable message: {exc}") from exc

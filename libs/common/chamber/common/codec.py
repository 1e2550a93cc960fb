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


def unknown_fields(raw: object, type_: Any, path: str = "$") -> list[str]:
    """The keys of a plain document (parsed YAML or JSON) that `type_` has no field for, as `$.a[0].b` paths.

    Contracts ignore unknown fields so that newer producers do not break older consumers; a file a person wrote
    is different: a mistyped key (`nomial: 8`, `treshold: 5`) would silently be dropped and its default used.
    Loaders of such files call this and refuse the file.
    """
    return _unknown(raw, msgspec.inspect.type_info(type_), path)


def _unknown(raw: object, info: msgspec.inspect.Type, path: str) -> list[str]:
    if isinstance(info, msgspec.inspect.StructType | msgspec.inspect.DataclassType) and isinstance(raw, dict):
        fields = {f.encode_name: f for f in info.fields}
        tag = getattr(info, "tag_field", None)
        out: list[str] = []
        for key, value in raw.items():
            field = fields.get(key) if isinstance(key, str) else None
            if field is not None:
                out += _unknown(value, field.type, f"{path}.{key}")
            elif key != tag:
                out.append(f"{path}.{key}")
        return out
    if isinstance(info, msgspec.inspect.UnionType):
        for member in info.types:
            if not isinstance(member, msgspec.inspect.NoneType):
                found = _unknown(raw, member, path)
                if found:
                    return found
        return []
    if isinstance(info, msgspec.inspect.ListType | msgspec.inspect.VarTupleType) and isinstance(raw, list):
        return [u for i, item in enumerate(raw) for u in _unknown(item, info.item_type, f"{path}[{i}]")]
    if isinstance(info, msgspec.inspect.DictType) and isinstance(raw, dict):
        return [u for key, value in raw.items() for u in _unknown(value, info.value_type, f"{path}.{key}")]
    return []

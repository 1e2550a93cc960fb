"""The quota configuration's durable home: one key in a JetStream KV bucket, changed with compare-and-set.

The quota service bootstraps it from a YAML file when the bucket is empty; admins change it through the gateway;
the scheduler and the quota service follow it. A change is validated before it is written, so a bad one is
rejected with its reasons and the old configuration keeps working.
"""

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import yaml
from nats.js.kv import KeyValue

from chamber.common.bus.client import Bus
from chamber.common.bus.errors import BusError
from chamber.common.bus.kv_follow import KvEntry, follow_kv
from chamber.common.codec import DecodeError, Decoder, encode, unknown_fields
from chamber.common.contracts import QuotaConfig
from chamber.common.log import get_logger
from chamber.common.quota import ConfigError, non_finite
from chamber.common.subjects import QUOTA_BUCKET

log = get_logger(__name__)


CONFIG_KEY = "config"
_decoder = Decoder(QuotaConfig)


class StaleConfig(BusError):
    """The configuration changed since it was read; read it again and retry."""


def load_yaml(path: str | Path) -> QuotaConfig:
    """A configuration from YAML, with a clear error for a malformed file, a key that means nothing, or a number
    JSON cannot store (`.inf`, `.nan`: the stored configuration would hold null and never decode again)."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise ConfigError(f"cannot read quota file {path}: {exc}") from exc
    unknown = unknown_fields(raw, QuotaConfig)
    if unknown:
        raise ConfigError(f"quota file {path}: unknown field{'s' * (len(unknown) > 1)} {', '.join(unknown)}")
    try:
        config = msgspec.convert(raw, QuotaConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"quota file {path}: {exc}") from exc
    bad = non_finite(config)
    if bad:
        raise ConfigError(
            f"quota file {path}: " + "; ".join(f"{where}: {v} is not a finite number" for where, v in bad)
        )
    return config


class QuotaStore:
    def __init__(self, kv: KeyValue, bus: Bus) -> None:
        self.kv = kv
        self.bus = bus

    @classmethod
    async def open(cls, bus: Bus) -> "QuotaStore":
        return cls(await bus.key_value(QUOTA_BUCKET), bus)

    async def get(self) -> tuple[QuotaConfig, int]:
        """The configuration and its revision (revision 0: none stored yet, an empty configuration)."""
        try:
            entry = await self.kv.get(CONFIG_KEY)
        except nats.js.errors.KeyNotFoundError:
            return QuotaConfig(), 0
        except nats.errors.Error as exc:
            raise BusError(f"cannot read the quota configuration: {exc}") from exc
        if entry.value is None:
            return QuotaConfig(), 0
        try:
            return _decoder.decode(entry.value), entry.revision or 0
        except DecodeError as exc:
            raise BusError(f"stored quota configuration is unreadable: {exc}") from exc

    async def put(self, config: QuotaConfig, revision: int) -> int:
        """Write `config` if the stored one is still at `revision` (0: none stored)."""
        try:
            if revision == 0:
                return await self.kv.create(CONFIG_KEY, encode(config))
            return await self.kv.update(CONFIG_KEY, encode(config), last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise StaleConfig("the quota configuration changed meanwhile") from exc
        except nats.errors.Error as exc:
            raise BusError(f"cannot write the quota configuration: {exc}") from exc

    async def follow(self, on_config: Callable[[QuotaConfig], Awaitable[None] | None]) -> Callable[[], Any]:
        """Call `on_config` with the current configuration and every later one (`follow_kv`: heard at once after a
        NATS restart too)."""

        async def on_entry(entry: KvEntry) -> None:
            if entry.value is None:
                return
            try:
                config = _decoder.decode(entry.value)
            except DecodeError:
                log.error("quota.config_undecodable")
                return
            result = on_config(config)
            if result is not None:
                await result

        follow = await follow_kv(self.bus.js, self.bus.names.bucket(QUOTA_BUCKET), CONFIG_KEY, on_entry)
        return follow.stop
